//! pprof → [`NormalizedProfile`], following Pyroscope's rules so totals match:
//!
//! - one series per sample type, profile type id `name:type:unit:period_type:period_unit`;
//! - `__name__` from the request, else derived from the sample types; `service_name` from the
//!   request, else `unknown_service`;
//! - per-sample string labels become series labels, except `span_id`/`profile_id` and `trace_id`,
//!   which stay per sample; numeric labels are dropped;
//! - samples with a negative value are dropped, zero values are skipped, duplicate stacks (same
//!   span and trace) are summed;
//! - `time_nanos` of 0 or in 1970 is replaced by the request's time;
//! - stacks deeper than the limit are truncated, keeping the root side.
//!
//! The rules the OTLP, JFR, speedscope and text formats share with pprof (the sample limit,
//! truncation, naming of unsymbolized frames, merging) are in [`kernel`]; [`IngestMeta`] and
//! [`NormalizeLimits`] serve them all.

pub mod kernel;

use std::collections::HashMap;

use prost::bytes::Bytes;

use kernel::{FastMap, SampleKey, SeriesBuilder, UnsymbolizedFunctions};

use crate::ids::{parse_span_id, parse_trace_id};
use crate::labels::{LabelLimits, validate_series_labels};
use crate::model::{
    Function, LABEL_NAME, LABEL_SERVICE_NAME, Labels, Line, Lines, Location, Mapping,
    NormalizedProfile, ProfileType, Series, SharedStrings, Symbols, UNKNOWN_SERVICE,
};
use crate::pprof;
use crate::{Error, Result};

/// Per-sample labels that carry a span id (`profile_id` is otel-profiling-go's name for it).
pub const SPAN_ID_LABELS: [&str; 2] = ["span_id", "profile_id"];
/// Per-sample label that carries a trace id.
pub const TRACE_ID_LABEL: &str = "trace_id";

/// One year of nanoseconds: a `time_nanos` below it is taken for a bogus 1970 time.
const NANOS_1971: i64 = 365 * 24 * 3600 * 1_000_000_000;

/// What the request says about the profile besides its bytes.
#[derive(Debug, Clone, Default)]
pub struct IngestMeta {
    /// Series labels from the request (`name{…}` or push labels); may hold `__name__` and `service_name`.
    pub labels: Labels,
    /// The request's time (`from`, or now), used when the profile has none.
    pub time_nanos: i64,
    /// The request's window length, used when the profile has none.
    pub duration_nanos: i64,
    /// Sample type display names from `sample_type_config`, used to derive `__name__`.
    pub display_names: HashMap<String, String>,
}

/// Limits applied while normalizing.
#[derive(Debug, Clone, Copy)]
pub struct NormalizeLimits {
    /// Deeper stacks are truncated, keeping the root side; 0 disables.
    pub max_stack_depth: usize,
    /// More samples than this in one profile is refused; 0 disables.
    pub max_samples: usize,
    /// More distinct per-sample label names than this in one profile is refused (each becomes a
    /// column of the block it lands in).
    pub max_sample_label_names: usize,
    pub labels: LabelLimits,
}

impl Default for NormalizeLimits {
    fn default() -> Self {
        Self {
            max_stack_depth: 1000,
            max_samples: 0,
            max_sample_label_names: 64,
            labels: LabelLimits::default(),
        }
    }
}

/// Pyroscope's default sample type display names, used when a request sends no
/// `sample_type_config`.
pub const DEFAULT_DISPLAY_NAMES: [(&str, &str); 4] = [
    ("samples", "cpu"),
    ("goroutine", "goroutines"),
    ("contentions", "mutex_count"),
    ("delay", "mutex_duration"),
];

/// Derives `__name__` from sample types as Pyroscope's `/ingest` does. `display_names` is the
/// request's `sample_type_config`; empty means Pyroscope's defaults.
pub fn metric_name(sample_types: &[&str], display_names: &HashMap<String, String>) -> String {
    if sample_types.contains(&"wall") {
        return "wall".into();
    }
    let display = |st: &str| -> String {
        let mapped = if display_names.is_empty() {
            DEFAULT_DISPLAY_NAMES
                .iter()
                .find(|(k, _)| *k == st)
                .map(|(_, v)| (*v).to_owned())
        } else {
            display_names.get(st).cloned()
        };
        mapped.unwrap_or_else(|| st.to_owned())
    };
    let mut last = String::new();
    for st in sample_types {
        let st = display(st);
        if st.contains("cpu") {
            return "process_cpu".into();
        }
        if st.contains("alloc_") || st.contains("inuse_") || st == "space" || st == "objects" {
            return "memory".into();
        }
        if st.contains("mutex_") {
            return "mutex".into();
        }
        if st.contains("block_") {
            return "block".into();
        }
        if st.contains("goroutine") {
            return "goroutines".into();
        }
        last = st;
    }
    last
}

/// A pprof string table as decoded: slices of the request body, each checked to be UTF-8 the
/// first time something refers to it (a string nothing refers to is never read), and kept as
/// checked: a label's name and value are read for every sample that carries them.
struct Strings<'a> {
    table: &'a [Bytes],
    checked: Vec<std::cell::OnceCell<Option<&'a str>>>,
}

impl<'a> Strings<'a> {
    fn new(table: &'a [Bytes]) -> Self {
        Self {
            table,
            checked: vec![std::cell::OnceCell::new(); table.len()],
        }
    }

    #[inline]
    fn get(&self, index: i64, what: &str) -> Result<&'a str> {
        match usize::try_from(index)
            .ok()
            .and_then(|i| self.checked.get(i))
            .and_then(std::cell::OnceCell::get)
        {
            Some(Some(s)) => Ok(s),
            _ => self.check(index, what),
        }
    }

    /// [`Self::get`] of a string not read before, or refused.
    #[cold]
    fn check(&self, index: i64, what: &str) -> Result<&'a str> {
        let i = usize::try_from(index)
            .ok()
            .filter(|&i| i < self.table.len())
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "{what} refers to string {index}, but the string table has {} entries",
                    self.table.len()
                ))
            })?;
        self.checked[i]
            .get_or_init(|| std::str::from_utf8(&self.table[i]).ok())
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "{what} refers to string {index}, which is not UTF-8"
                ))
            })
    }
}

/// Normalizes a decoded pprof profile.
pub fn normalize_pprof(
    profile: &pprof::Profile,
    meta: &IngestMeta,
    limits: &NormalizeLimits,
) -> Result<NormalizedProfile> {
    let strings = Strings::new(&profile.string_table);
    if profile.string_table.first().is_some_and(|s| !s.is_empty()) {
        return Err(Error::Invalid(
            "the first string of the string table must be empty".into(),
        ));
    }
    if profile.sample_type.is_empty() {
        return Err(Error::Invalid("the profile has no sample type".into()));
    }
    kernel::check_sample_count(profile.sample.len(), limits)?;
    let mut sample_types = Vec::with_capacity(profile.sample_type.len());
    for vt in &profile.sample_type {
        let ty = strings.get(vt.r#type, "a sample type")?;
        let unit = strings.get(vt.unit, "a sample unit")?;
        if ty.is_empty() {
            return Err(Error::Invalid("a sample type has an empty name".into()));
        }
        sample_types.push((ty, unit));
    }
    let (period_type, period_unit) = match &profile.period_type {
        Some(vt) => (
            strings.get(vt.r#type, "the period type")?,
            strings.get(vt.unit, "the period unit")?,
        ),
        None => ("", ""),
    };

    let (symbols, location_index) = resolve_symbols(profile, &strings)?;

    let name = match meta.labels.get(LABEL_NAME) {
        Some(n) => n.to_owned(),
        None => metric_name(
            &sample_types.iter().map(|(t, _)| *t).collect::<Vec<_>>(),
            &meta.display_names,
        ),
    };
    let time_nanos = if profile.time_nanos < NANOS_1971 {
        meta.time_nanos
    } else {
        profile.time_nanos
    };
    let duration_nanos = if profile.duration_nanos > 0 {
        profile.duration_nanos
    } else {
        meta.duration_nanos
    };

    // Series by their series-promoted labels, borrowed from the string table.
    let n_types = sample_types.len();
    let mut builder: SeriesBuilder<Vec<(&str, &str)>> =
        SeriesBuilder::with_capacity(n_types, profile.sample.len());
    // Buffers reused from sample to sample.
    let mut stack = Vec::new();
    let mut labels: Vec<(&str, &str)> = Vec::new();
    // Span or trace ids that do not parse stay with the sample as labels rather than be lost.
    let mut per_sample: Vec<(String, String)> = Vec::new();
    for (i, sample) in profile.sample.iter().enumerate() {
        if sample.value.len() != n_types {
            return Err(Error::Invalid(format!(
                "sample {i} has {} values for {n_types} sample types",
                sample.value.len()
            )));
        }
        // Truncated first, so a sample costs what it stores, not what it was sent with.
        kernel::fill_stack(
            &mut stack,
            sample.location_ids(),
            limits.max_stack_depth,
            |id| {
                location_index.get(id).ok_or_else(|| {
                    Error::Invalid(format!(
                        "sample {i} refers to location id {id}, which the profile does not define"
                    ))
                })
            },
        )?;
        let mut span_id = 0u64;
        let mut trace_id = None;
        labels.clear();
        per_sample.clear();
        for label in &sample.label {
            let key = strings.get(label.key, "a sample label key")?;
            if label.str == 0 {
                continue; // numeric label, or an empty value: not a series label
            }
            let value = strings.get(label.str, "a sample label value")?;
            if SPAN_ID_LABELS.contains(&key) {
                span_id = parse_span_id(value);
                if span_id == 0 {
                    per_sample.push((key.to_owned(), value.to_owned()));
                }
            } else if key == TRACE_ID_LABEL {
                trace_id = parse_trace_id(value);
                if trace_id.is_none() {
                    per_sample.push((key.to_owned(), value.to_owned()));
                }
            } else if !key.is_empty() {
                labels.push((key, value));
            }
        }
        if sample.value.iter().any(|v| *v < 0) || sample.value.iter().all(|v| *v == 0) {
            continue;
        }
        labels.sort();
        labels.dedup_by(|a, b| a.0 == b.0);
        per_sample.sort();
        let series = builder.series(labels.as_slice());
        let key = builder.hash(SampleKey {
            stack: &stack,
            span_id,
            trace_id,
            timestamp_nanos: 0,
            labels: &per_sample,
        });
        for (t, &value) in sample.value.iter().enumerate() {
            builder.add(series, t, &key, value, i)?;
        }
    }
    let groups = builder.finish();

    let distinct: std::collections::HashSet<&str> = groups
        .iter()
        .flat_map(|(labels, _)| labels.iter().map(|(k, _)| *k))
        .collect();
    if distinct.len() > limits.max_sample_label_names {
        return Err(Error::Invalid(format!(
            "the samples carry {} distinct label names, more than the limit of {}",
            distinct.len(),
            limits.max_sample_label_names
        )));
    }
    let mut series = Vec::new();
    for (group_labels, per_type) in groups {
        let mut labels = meta.labels.clone();
        for (k, v) in group_labels {
            labels.set(k.to_owned(), v.to_owned());
        }
        labels.set(LABEL_NAME.to_owned(), name.clone());
        labels.set_default(LABEL_SERVICE_NAME, UNKNOWN_SERVICE);
        validate_series_labels(&labels, &limits.labels)?;
        for (t, samples) in per_type.into_iter().enumerate() {
            if samples.is_empty() {
                continue;
            }
            let (sample_type, sample_unit) = sample_types[t];
            series.push(Series {
                labels: labels.clone(),
                profile_type: ProfileType {
                    name: name.clone(),
                    sample_type: sample_type.to_owned(),
                    sample_unit: sample_unit.to_owned(),
                    period_type: period_type.to_owned(),
                    period_unit: period_unit.to_owned(),
                },
                time_nanos,
                duration_nanos,
                samples,
            });
        }
    }
    Ok(NormalizedProfile { symbols, series })
}

/// A pprof table's positions by id. Go and most SDKs number a table's entries 1, 2, 3, ... in
/// order, and then an id is its position plus one, found without hashing; other ids go through a
/// map, where a later entry of the same id wins.
enum IdIndex {
    /// Ids `1..=n` in order.
    Dense(usize),
    Sparse(FastMap<u64, u32>),
}

impl IdIndex {
    fn new(ids: impl ExactSizeIterator<Item = u64> + Clone) -> Self {
        if ids.clone().enumerate().all(|(i, id)| id == i as u64 + 1) {
            return Self::Dense(ids.len());
        }
        let mut map = FastMap::with_capacity(ids.len());
        for (i, id) in ids.enumerate() {
            map.insert(id, i as u32);
        }
        Self::Sparse(map)
    }

    /// The position of the entry of `id`.
    fn get(&self, id: u64) -> Option<u32> {
        match self {
            Self::Dense(n) => (id >= 1 && id <= *n as u64).then(|| (id - 1) as u32),
            Self::Sparse(map) => map.get(&id).copied(),
        }
    }
}

fn resolve_symbols(profile: &pprof::Profile, strings: &Strings<'_>) -> Result<(Symbols, IdIndex)> {
    let mut symbols = Symbols {
        functions: Vec::with_capacity(profile.function.len()),
        locations: Vec::with_capacity(profile.location.len()),
        mappings: Vec::with_capacity(profile.mapping.len()),
    };
    let mapping_index = IdIndex::new(profile.mapping.iter().map(|m| m.id));
    for m in &profile.mapping {
        symbols.mappings.push(Mapping {
            memory_start: m.memory_start,
            memory_limit: m.memory_limit,
            file_offset: m.file_offset,
            filename: strings.get(m.filename, "a mapping file name")?.to_owned(),
            build_id: strings.get(m.build_id, "a mapping build id")?.to_owned(),
            has_functions: m.has_functions,
        });
    }
    let function_index = IdIndex::new(profile.function.iter().map(|f| f.id));
    let mut shared = SharedStrings::new(strings.table);
    // Checked to be UTF-8 once, when `shared` makes it; only a string it refuses is looked at
    // again, for the error.
    let mut string =
        |index: i64, what: &str| match usize::try_from(index).ok().and_then(|i| shared.get(i)) {
            Some(s) => Ok(s),
            None => Err(strings.get(index, what).err().unwrap_or_else(|| {
                Error::Invalid(format!(
                    "{what} refers to string {index}, which is not usable"
                ))
            })),
        };
    for f in &profile.function {
        symbols.functions.push(Function {
            name: string(f.name, "a function name")?,
            system_name: string(f.system_name, "a function system name")?,
            filename: string(f.filename, "a function file name")?,
            start_line: f.start_line,
        });
    }
    let location_index = IdIndex::new(profile.location.iter().map(|l| l.id));
    let mut unsymbolized = UnsymbolizedFunctions::default();
    for loc in &profile.location {
        let mapping = match loc.mapping_id {
            0 => None,
            id => Some(mapping_index.get(id).ok_or_else(|| {
                Error::Invalid(format!(
                    "location {} refers to mapping id {id}, which the profile does not define",
                    loc.id
                ))
            })?),
        };
        let mut lines = Lines::with_capacity(loc.line.len().max(1));
        for line in &loc.line {
            let function = function_index.get(line.function_id).ok_or_else(|| {
                Error::Invalid(format!(
                    "location {} refers to function id {}, which the profile does not define",
                    loc.id, line.function_id
                ))
            })?;
            lines.push(Line {
                function,
                line: line.line,
            });
        }
        if lines.is_empty() {
            lines.push(unsymbolized.line(&mut symbols, mapping, loc.address));
        }
        symbols.locations.push(Location {
            mapping,
            address: loc.address,
            lines,
            frame_type: String::new(),
        });
    }
    Ok((symbols, location_index))
}

#[cfg(test)]
mod tests;
