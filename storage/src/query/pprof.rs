//! Merges stacks of several blocks into one pprof profile (`SelectMergeProfile`).

use std::collections::HashMap;

use kiln_otel::model::ProfileType;
use kiln_proto::google::v1 as pb;

use super::StackValue;
use crate::format::block::decode_sample_labels;
use crate::format::symbols::SymbolTable;
use crate::query::frame_filter::FrameFilter;

#[cfg(test)]
mod tests;

/// Builds a pprof profile, deduplicating functions, mappings and locations by content.
pub struct PprofBuilder {
    profile: pb::Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<(i64, i64, i64, i64), u64>,
    mappings: HashMap<(u64, u64, u64, i64, i64), u64>,
    locations: HashMap<(u64, u64, Vec<(u64, i64)>), u64>,
    samples: HashMap<(Vec<u64>, Option<String>), i64>,
    /// Only stacks starting with these functions (root first), when not empty.
    call_site: Vec<String>,
    /// Only stacks this filter keeps, when set.
    frame_filter: Option<std::sync::Arc<FrameFilter>>,
}

impl PprofBuilder {
    /// A builder of no sample type yet, its string table holding "" alone.
    fn empty() -> Self {
        let mut b = Self {
            profile: pb::Profile::default(),
            strings: HashMap::new(),
            functions: HashMap::new(),
            mappings: HashMap::new(),
            locations: HashMap::new(),
            samples: HashMap::new(),
            call_site: Vec::new(),
            frame_filter: None,
        };
        b.string("");
        b
    }

    /// An empty profile of one sample type.
    pub fn new(profile_type: &ProfileType) -> Self {
        let mut b = Self::empty();
        let sample_type = pb::ValueType {
            r#type: b.string(&profile_type.sample_type),
            unit: b.string(&profile_type.sample_unit),
        };
        b.profile.sample_type.push(sample_type);
        if !profile_type.period_type.is_empty() {
            b.profile.period_type = Some(pb::ValueType {
                r#type: b.string(&profile_type.period_type),
                unit: b.string(&profile_type.period_unit),
            });
        }
        b
    }

    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.profile.string_table.len() as i64;
        self.profile.string_table.push(s.to_owned());
        self.strings.insert(s.to_owned(), i);
        i
    }

    /// Adds one block's stack values.
    /// Keeps only the stacks that start with these functions, root first (Pyroscope's
    /// `stack_trace_selector.call_site`).
    pub fn with_call_site(mut self, call_site: Vec<String>) -> Self {
        self.call_site = call_site;
        self
    }

    /// Keeps only the stacks `filter` keeps (Pyroscope's `stack_trace_selector.frame_filter`).
    pub fn with_frame_filter(mut self, filter: Option<std::sync::Arc<FrameFilter>>) -> Self {
        self.frame_filter = filter;
        self
    }

    /// Whether a stack (locations leaf first, each location's lines innermost first) starts
    /// with the call site.
    fn at_call_site(&self, symbols: &SymbolTable, stack: &[u32]) -> bool {
        let s = &symbols.symbols;
        let mut root_first = stack.iter().rev().flat_map(|&loc| {
            s.locations[loc as usize]
                .line_functions
                .iter()
                .rev()
                .map(|&f| symbols.string(s.functions[f as usize].name))
        });
        self.call_site
            .iter()
            .all(|want| root_first.next() == Some(want.as_str()))
    }

    pub fn add_block(&mut self, symbols: &SymbolTable, values: &[StackValue]) {
        let mut location_ids: Vec<Option<u64>> = vec![None; symbols.symbols.locations.len()];
        let mut memo: Vec<Option<(u64, bool)>> = match &self.frame_filter {
            Some(_) => vec![None; symbols.symbols.functions.len()],
            None => Vec::new(),
        };
        let mut stack = Vec::new();
        for StackValue {
            stack: stack_id,
            labels,
            value,
        } in values
        {
            let (stack_id, value) = (*stack_id, *value);
            symbols.stack_locations(stack_id, &mut stack);
            if !self.call_site.is_empty() && !self.at_call_site(symbols, &stack) {
                continue;
            }
            if let Some(f) = &self.frame_filter
                && !f.keeps_stack(symbols, &stack, &mut memo)
            {
                continue;
            }
            let ids: Vec<u64> = stack
                .iter()
                .map(|&loc| match location_ids[loc as usize] {
                    Some(id) => id,
                    None => {
                        let id = self.location(symbols, loc);
                        location_ids[loc as usize] = Some(id);
                        id
                    }
                })
                .collect();
            let slot = self.samples.entry((ids, labels.clone())).or_insert(0);
            *slot = slot.saturating_add(value);
        }
    }

    fn location(&mut self, symbols: &SymbolTable, loc: u32) -> u64 {
        let l = &symbols.symbols.locations[loc as usize];
        let mapping_id = match l.mapping {
            0 => 0,
            m => {
                let m = &symbols.symbols.mappings[m as usize - 1];
                let key = (
                    m.memory_start,
                    m.memory_limit,
                    m.file_offset,
                    self.string(symbols.string(m.filename)),
                    self.string(symbols.string(m.build_id)),
                );
                self.mapping_id(key, m.has_functions)
            }
        };
        let mut lines = Vec::with_capacity(l.line_functions.len());
        for (&f, &line) in l.line_functions.iter().zip(&l.line_numbers) {
            let f = &symbols.symbols.functions[f as usize];
            let key = (
                self.string(symbols.string(f.name)),
                self.string(symbols.string(f.system_name)),
                self.string(symbols.string(f.filename)),
                f.start_line,
            );
            lines.push((self.function_id(key), line));
        }
        self.location_id((mapping_id, l.address, lines), false)
    }

    /// The id of a mapping by content (start, limit, offset, file name, build id as strings).
    fn mapping_id(&mut self, key: (u64, u64, u64, i64, i64), has_functions: bool) -> u64 {
        let next = self.profile.mapping.len() as u64 + 1;
        let id = *self.mappings.entry(key).or_insert(next);
        if id == next {
            self.profile.mapping.push(pb::Mapping {
                id,
                memory_start: key.0,
                memory_limit: key.1,
                file_offset: key.2,
                filename: key.3,
                build_id: key.4,
                has_functions,
                ..Default::default()
            });
        }
        id
    }

    /// The id of a function by content (name, system name, file name, start line).
    fn function_id(&mut self, key: (i64, i64, i64, i64)) -> u64 {
        let next = self.profile.function.len() as u64 + 1;
        let id = *self.functions.entry(key).or_insert(next);
        if id == next {
            self.profile.function.push(pb::Function {
                id,
                name: key.0,
                system_name: key.1,
                filename: key.2,
                start_line: key.3,
            });
        }
        id
    }

    /// The id of a location by content (mapping, address, lines as function ids).
    fn location_id(&mut self, key: (u64, u64, Vec<(u64, i64)>), is_folded: bool) -> u64 {
        let next = self.profile.location.len() as u64 + 1;
        let id = *self.locations.entry(key.clone()).or_insert(next);
        if id == next {
            self.profile.location.push(pb::Location {
                id,
                mapping_id: key.0,
                address: key.1,
                line: key
                    .2
                    .iter()
                    .map(|&(function_id, line)| pb::Line { function_id, line })
                    .collect(),
                is_folded,
            });
        }
        id
    }

    /// The finished profile, covering `[start, end)`.
    pub fn finish(mut self, start_nanos: i64, end_nanos: i64) -> pb::Profile {
        let mut samples: Vec<((Vec<u64>, Option<String>), i64)> =
            std::mem::take(&mut self.samples).into_iter().collect();
        samples.sort();
        let mut out = Vec::with_capacity(samples.len());
        for ((location_id, labels), v) in samples {
            let label = labels
                .as_deref()
                .map(decode_sample_labels)
                .unwrap_or_default()
                .into_iter()
                .map(|(k, s)| pb::Label {
                    key: self.string(&k),
                    str: self.string(&s),
                    ..Default::default()
                })
                .collect();
            out.push(pb::Sample {
                location_id,
                value: vec![v],
                label,
            });
        }
        self.profile.sample = out;
        // An all-time query has no meaningful start: report 0 rather than i64::MIN.
        let start = start_nanos.max(0);
        self.profile.time_nanos = start;
        self.profile.duration_nanos = if end_nanos == i64::MAX {
            0
        } else {
            end_nanos.saturating_sub(start)
        };
        self.profile
    }
}

/// Name of the function that stands for what [`truncate`] cut.
pub const TRUNCATED_NAME: &str = "other";

/// Cuts a profile down to its `max_nodes` heaviest call-tree nodes, as Pyroscope answers
/// `SelectMergeProfile` with `max_nodes`: the samples' stacks, as functions (inlined frames
/// expanded), make a call tree; a node whose total is below the `max_nodes`-th largest total is
/// cut (the threshold of the flame graph's `max_nodes`), and each stack loses its frames below
/// its deepest node that is kept, a location standing for a function [`TRUNCATED_NAME`] taking
/// their place as the leaf. A stack whose root is cut becomes that location alone. Values are
/// kept, samples that became alike merged, and locations, functions, mappings and strings that
/// no sample uses any more dropped. `max_nodes` 0, or a tree of no more nodes, leaves the
/// profile as it is. Unlike Pyroscope (`truncateLocations`), the leaf-most cut function is cut
/// too, so what is left is the kept call tree; a location whose inlined frames straddle the
/// threshold is kept whole.
pub fn truncate(profile: &mut pb::Profile, max_nodes: usize) {
    if max_nodes == 0 {
        return;
    }
    let location_index: HashMap<u64, usize> = profile
        .location
        .iter()
        .enumerate()
        .map(|(i, l)| (l.id, i))
        .collect();
    let lines = |id: &u64| -> &[pb::Line] {
        location_index
            .get(id)
            .map_or(&[][..], |&i| &profile.location[i].line)
    };
    // The call tree of functions: node 0 is the root; (parent, function id) -> node.
    let mut parent: Vec<usize> = vec![0];
    let mut total: Vec<i64> = vec![0];
    let mut child: HashMap<(usize, u64), usize> = HashMap::new();
    // Per sample: its functions root first, as tree nodes.
    let mut paths: Vec<Vec<usize>> = Vec::with_capacity(profile.sample.len());
    for s in &profile.sample {
        let value = s.value.first().copied().unwrap_or(0);
        let mut node = 0;
        let mut path = Vec::new();
        for id in s.location_id.iter().rev() {
            for line in lines(id).iter().rev() {
                let next = parent.len();
                node = *child.entry((node, line.function_id)).or_insert(next);
                if node == next {
                    parent.push(path.last().copied().unwrap_or(0));
                    total.push(0);
                }
                total[node] = total[node].saturating_add(value);
                path.push(node);
            }
        }
        paths.push(path);
    }
    let min_value = super::tree::cutoff(total[1..].to_vec(), max_nodes);
    if min_value == 0 {
        return;
    }

    // The cut stacks, merged: (location ids, labels) -> values. `u64::MAX` marks the cut.
    const CUT: u64 = u64::MAX;
    let mut merged: HashMap<(Vec<u64>, Vec<(i64, i64, i64, i64)>), Vec<i64>> = HashMap::new();
    let mut any_cut = false;
    for (s, path) in profile.sample.iter().zip(&paths) {
        let kept = path.iter().take_while(|&&n| total[n] >= min_value).count();
        let stack: Vec<u64> = if kept == path.len() {
            s.location_id.clone()
        } else {
            any_cut = true;
            // Root-side locations until they hold the kept functions, then the mark.
            let mut covered = 0;
            let mut root_side = Vec::new();
            for id in s.location_id.iter().rev() {
                if covered >= kept {
                    break;
                }
                covered += lines(id).len();
                root_side.push(*id);
            }
            root_side.push(CUT);
            root_side.reverse();
            root_side
        };
        let labels = s
            .label
            .iter()
            .map(|l| (l.key, l.str, l.num, l.num_unit))
            .collect();
        let slot = merged
            .entry((stack, labels))
            .or_insert_with(|| vec![0; s.value.len()]);
        for (acc, v) in slot.iter_mut().zip(&s.value) {
            *acc = acc.saturating_add(*v);
        }
    }
    if !any_cut {
        return;
    }
    let cut_location = profile.location.iter().map(|l| l.id).max().unwrap_or(0) + 1;
    let mut samples: Vec<_> = merged.into_iter().collect();
    samples.sort();
    profile.sample = samples
        .into_iter()
        .map(|((stack, labels), value)| pb::Sample {
            location_id: stack
                .into_iter()
                .map(|id| if id == CUT { cut_location } else { id })
                .collect(),
            value,
            label: labels
                .into_iter()
                .map(|(key, value, num, num_unit)| pb::Label {
                    key,
                    str: value,
                    num,
                    num_unit,
                })
                .collect(),
        })
        .collect();
    let name = match profile
        .string_table
        .iter()
        .position(|s| s == TRUNCATED_NAME)
    {
        Some(i) => i as i64,
        None => {
            profile.string_table.push(TRUNCATED_NAME.to_owned());
            profile.string_table.len() as i64 - 1
        }
    };
    let function_id = profile.function.iter().map(|f| f.id).max().unwrap_or(0) + 1;
    profile.function.push(pb::Function {
        id: function_id,
        name,
        system_name: name,
        ..Default::default()
    });
    profile.location.push(pb::Location {
        id: cut_location,
        line: vec![pb::Line {
            function_id,
            line: 0,
        }],
        ..Default::default()
    });
    drop_unused(profile);
}

/// Drops the locations no sample uses, then the functions, mappings and strings nothing uses,
/// and renumbers what is left (ids from 1, in their order).
fn drop_unused(profile: &mut pb::Profile) {
    use std::collections::HashSet;
    let used: HashSet<u64> = profile
        .sample
        .iter()
        .flat_map(|s| s.location_id.iter().copied())
        .collect();
    profile.location.retain(|l| used.contains(&l.id));
    /// Numbers ids from 1 in their order: old id -> new.
    fn renumber<'a>(ids: impl Iterator<Item = &'a mut u64>) -> HashMap<u64, u64> {
        ids.enumerate()
            .map(|(i, id)| {
                let old = *id;
                *id = i as u64 + 1;
                (old, *id)
            })
            .collect()
    }
    let locations = renumber(profile.location.iter_mut().map(|l| &mut l.id));
    for s in &mut profile.sample {
        for id in &mut s.location_id {
            *id = locations[id];
        }
    }
    let functions_used: HashSet<u64> = profile
        .location
        .iter()
        .flat_map(|l| l.line.iter().map(|x| x.function_id))
        .collect();
    let mappings_used: HashSet<u64> = profile.location.iter().map(|l| l.mapping_id).collect();
    profile.function.retain(|f| functions_used.contains(&f.id));
    profile.mapping.retain(|m| mappings_used.contains(&m.id));
    let functions = renumber(profile.function.iter_mut().map(|f| &mut f.id));
    let mappings = renumber(profile.mapping.iter_mut().map(|m| &mut m.id));
    for l in &mut profile.location {
        l.mapping_id = mappings.get(&l.mapping_id).copied().unwrap_or(0);
        for line in &mut l.line {
            line.function_id = functions.get(&line.function_id).copied().unwrap_or(0);
        }
    }

    // Strings: every reference, then the table without the unused ones.
    let mut refs: Vec<&mut i64> = Vec::new();
    for vt in profile
        .sample_type
        .iter_mut()
        .chain(profile.period_type.iter_mut())
    {
        refs.push(&mut vt.r#type);
        refs.push(&mut vt.unit);
    }
    for s in &mut profile.sample {
        for l in &mut s.label {
            refs.extend([&mut l.key, &mut l.str, &mut l.num_unit]);
        }
    }
    for m in &mut profile.mapping {
        refs.extend([&mut m.filename, &mut m.build_id]);
    }
    for f in &mut profile.function {
        refs.extend([&mut f.name, &mut f.system_name, &mut f.filename]);
    }
    refs.extend(profile.comment.iter_mut());
    refs.extend([
        &mut profile.drop_frames,
        &mut profile.keep_frames,
        &mut profile.default_sample_type,
    ]);
    let mut keep = vec![false; profile.string_table.len()];
    if let Some(first) = keep.first_mut() {
        *first = true;
    }
    for r in &refs {
        if let Some(k) = usize::try_from(**r).ok().and_then(|i| keep.get_mut(i)) {
            *k = true;
        }
    }
    let mut new_index = vec![0i64; keep.len()];
    let mut next = 0i64;
    for (i, k) in keep.iter().enumerate() {
        if *k {
            new_index[i] = next;
            next += 1;
        }
    }
    for r in refs {
        if let Some(&n) = usize::try_from(*r).ok().and_then(|i| new_index.get(i)) {
            *r = n;
        }
    }
    let mut i = 0;
    profile.string_table.retain(|_| {
        i += 1;
        keep[i - 1]
    });
}

/// Profiles of one profile type merged into one (a read across tenants): strings, mappings,
/// functions and locations deduplicated by content, samples of equal stacks and labels summed.
/// It covers the union of their time ranges.
pub fn merge(profiles: Vec<pb::Profile>) -> pb::Profile {
    let mut profiles = profiles.into_iter();
    let Some(first) = profiles.next() else {
        return pb::Profile::default();
    };
    let mut m = Merger::new(&first);
    m.add(&first);
    for p in profiles {
        m.add(&p);
    }
    m.finish()
}

/// Sample labels by content: (key, string value, number, unit), strings as the merged ids.
type LabelKey = Vec<(i64, i64, i64, i64)>;

/// The state of [`merge`]: a builder's tables by content, and the samples by stack and labels.
struct Merger {
    b: PprofBuilder,
    samples: HashMap<(Vec<u64>, LabelKey), usize>,
    end_nanos: i64,
}

impl Merger {
    /// Sample and period types from `first`.
    fn new(first: &pb::Profile) -> Self {
        let mut b = PprofBuilder::empty();
        let s = |i: i64| {
            first
                .string_table
                .get(i as usize)
                .map_or("", String::as_str)
        };
        let mut value_type = |v: &pb::ValueType| pb::ValueType {
            r#type: b.string(s(v.r#type)),
            unit: b.string(s(v.unit)),
        };
        let sample_type = first.sample_type.iter().map(&mut value_type).collect();
        let period_type = first.period_type.as_ref().map(&mut value_type);
        b.profile.sample_type = sample_type;
        b.profile.period_type = period_type;
        b.profile.period = first.period;
        b.profile.time_nanos = first.time_nanos;
        Self {
            b,
            samples: HashMap::new(),
            end_nanos: i64::MIN,
        }
    }

    fn add(&mut self, p: &pb::Profile) {
        let b = &mut self.b;
        let s = |i: i64| p.string_table.get(i as usize).map_or("", String::as_str);
        b.profile.time_nanos = b.profile.time_nanos.min(p.time_nanos);
        if p.duration_nanos > 0 {
            self.end_nanos = self
                .end_nanos
                .max(p.time_nanos.saturating_add(p.duration_nanos));
        }
        let mut mapping_ids: HashMap<u64, u64> = HashMap::new();
        for mp in &p.mapping {
            let key = (
                mp.memory_start,
                mp.memory_limit,
                mp.file_offset,
                b.string(s(mp.filename)),
                b.string(s(mp.build_id)),
            );
            mapping_ids.insert(mp.id, b.mapping_id(key, mp.has_functions));
        }
        let mut function_ids: HashMap<u64, u64> = HashMap::new();
        for f in &p.function {
            let key = (
                b.string(s(f.name)),
                b.string(s(f.system_name)),
                b.string(s(f.filename)),
                f.start_line,
            );
            function_ids.insert(f.id, b.function_id(key));
        }
        let mut location_ids: HashMap<u64, u64> = HashMap::new();
        for l in &p.location {
            let mapping_id = mapping_ids.get(&l.mapping_id).copied().unwrap_or(0);
            let lines: Vec<(u64, i64)> = l
                .line
                .iter()
                .map(|ln| {
                    let f = function_ids.get(&ln.function_id).copied().unwrap_or(0);
                    (f, ln.line)
                })
                .collect();
            let id = b.location_id((mapping_id, l.address, lines), l.is_folded);
            location_ids.insert(l.id, id);
        }
        for sample in &p.sample {
            let ids: Vec<u64> = sample
                .location_id
                .iter()
                .map(|id| location_ids.get(id).copied().unwrap_or(0))
                .collect();
            let labels: LabelKey = sample
                .label
                .iter()
                .map(|l| {
                    let (key, str, unit) = (b.string(s(l.key)), b.string(s(l.str)), l.num_unit);
                    (key, str, l.num, b.string(s(unit)))
                })
                .collect();
            let samples = &mut b.profile.sample;
            match self.samples.get(&(ids.clone(), labels.clone())) {
                Some(&i) => {
                    for (v, add) in samples[i].value.iter_mut().zip(&sample.value) {
                        *v = v.saturating_add(*add);
                    }
                }
                None => {
                    self.samples
                        .insert((ids.clone(), labels.clone()), samples.len());
                    samples.push(pb::Sample {
                        location_id: ids,
                        value: sample.value.clone(),
                        label: labels
                            .into_iter()
                            .map(|(key, str, num, num_unit)| pb::Label {
                                key,
                                str,
                                num,
                                num_unit,
                            })
                            .collect(),
                    });
                }
            }
        }
    }

    fn finish(self) -> pb::Profile {
        let mut out = self.b.profile;
        if self.end_nanos > out.time_nanos {
            out.duration_nanos = self.end_nanos - out.time_nanos;
        }
        out
    }
}
