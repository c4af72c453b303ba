//! Merges stacks of several blocks into one pprof profile (`SelectMergeProfile`).

use std::collections::HashMap;

use kiln_otel::model::ProfileType;
use kiln_proto::google::v1 as pb;

use super::StackValue;
use crate::block::decode_sample_labels;
use crate::symbols::SymbolTable;

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
}

impl PprofBuilder {
    /// An empty profile of one sample type.
    pub fn new(profile_type: &ProfileType) -> Self {
        let mut b = Self {
            profile: pb::Profile::default(),
            strings: HashMap::new(),
            functions: HashMap::new(),
            mappings: HashMap::new(),
            locations: HashMap::new(),
            samples: HashMap::new(),
            call_site: Vec::new(),
        };
        b.string("");
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
                        has_functions: m.has_functions,
                        ..Default::default()
                    });
                }
                id
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
            lines.push((id, line));
        }
        let key = (mapping_id, l.address, lines);
        let next = self.profile.location.len() as u64 + 1;
        let id = *self.locations.entry(key.clone()).or_insert(next);
        if id == next {
            self.profile.location.push(pb::Location {
                id,
                mapping_id,
                address: key.1,
                line: key
                    .2
                    .iter()
                    .map(|&(function_id, line)| pb::Line { function_id, line })
                    .collect(),
                is_folded: false,
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
