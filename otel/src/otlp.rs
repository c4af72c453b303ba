//! OTLP profiles (`opentelemetry.proto.profiles.v1development`, proto 1.10) → [`NormalizedProfile`].
//!
//! The request-wide dictionary is resolved once; every index anywhere in the request is
//! bounds-checked first, and one bad index refuses the whole request, saying which. Profile-level
//! problems (no sample type, a sample with neither values nor timestamps) refuse only that profile
//! and are reported as partial success.
//!
//! Mapping, as Pyroscope does it where it has a rule:
//! - `service_name`: the sample's `service.name`, else the resource's, else
//!   `unknown_service:<process.executable.name>`, else `unknown_service`;
//! - series labels: resource and scope attributes (string, int, bool, double values), then sample
//!   attributes, within the label limits (attributes past them are dropped, not fatal);
//! - `thread.id`, `thread.name`, `cpu.logical_number` stay per sample;
//! - `samples/count` with period `cpu/nanoseconds` becomes `process_cpu:cpu:nanoseconds:cpu:nanoseconds`
//!   (values × period); `off_cpu/nanoseconds` is `off_cpu`; other profiles are named after the
//!   period type, else the sample type;
//! - an empty `values` with timestamps counts one per timestamp; samples keep their timestamps;
//! - `link_index` gives the span id (8 bytes, little-endian u64) and trace id per sample;
//! - location attribute `profile.frame.type` and mapping build ids are kept.
//!
//! As for pprof (the rules are [`crate::normalize::kernel`]'s): samples with the same stack, span,
//! trace, timestamp and per-sample labels are summed; stacks deeper than the limit keep the root
//! side; a location without symbols is named after its mapping's file and address
//! (`libc.so.6 0x1f2a`, `unknown` with neither).

use std::convert::Infallible;

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::profiles::v1development::{self as otlp, ProfilesDictionary};

use crate::labels::LabelLimits;
use crate::model::{
    Function, LABEL_NAME, LABEL_SERVICE_NAME, Labels, Line, Lines, Location, Mapping,
    NormalizedProfile, ProfileType, Series, SharedStrings, Symbols, UNKNOWN_SERVICE,
};
use crate::normalize::NormalizeLimits;
use crate::normalize::kernel::{self, SampleKey, SeriesBuilder, UnsymbolizedFunctions};
use crate::{Error, Result};

/// Sample attributes kept per sample instead of becoming series labels.
pub const PER_SAMPLE_ATTRIBUTES: [&str; 3] = ["thread.id", "thread.name", "cpu.logical_number"];

/// Hint added to index errors: a proto 1.9 sender's samples decode with shifted fields.
const V19_HINT: &str = "this is what an OTLP profiles payload of proto 1.9 (Collector < 0.148) \
     looks like when read as proto 1.10 (Sample fields were renumbered in 1.10), where its wire \
     types did not tell its layout; upgrade the sender";

/// Default profile duration when a profile names none (Pyroscope's).
const DEFAULT_DURATION_NANOS: i64 = 10_000_000_000;

/// The result of converting one export request.
#[derive(Debug, Default)]
pub struct Converted {
    /// All accepted profiles' series, sharing the request's symbols.
    pub profile: NormalizedProfile,
    /// Number of profiles in the request.
    pub profiles: usize,
    /// Profiles refused, and why (partial success).
    pub rejected: Vec<String>,
}

/// Converts an export request. `now_nanos` stands in for missing profile times.
pub fn convert(
    req: &ExportProfilesServiceRequest,
    now_nanos: i64,
    limits: &NormalizeLimits,
) -> Result<Converted> {
    let mut out = Converted::default();
    if req.resource_profiles.is_empty() {
        return Ok(out);
    }
    let Some(dict) = &req.dictionary else {
        return Err(Error::Invalid(
            "the request has profiles but no dictionary".into(),
        ));
    };
    check_dictionary(dict)?;
    out.profile.symbols = symbols(dict)?;
    let strings = &dict.string_table;

    for (r, rp) in req.resource_profiles.iter().enumerate() {
        let resource_attrs = match &rp.resource {
            Some(res) => key_values(
                &res.attributes,
                strings,
                &format!("resource_profiles[{r}].resource"),
            )?,
            None => Vec::new(),
        };
        for (s, sp) in rp.scope_profiles.iter().enumerate() {
            let scope_attrs = match &sp.scope {
                Some(scope) => key_values(
                    &scope.attributes,
                    strings,
                    &format!("resource_profiles[{r}].scope_profiles[{s}].scope"),
                )?,
                None => Vec::new(),
            };
            for (p, profile) in sp.profiles.iter().enumerate() {
                let at = format!("resource_profiles[{r}].scope_profiles[{s}].profiles[{p}]");
                out.profiles += 1;
                check_profile_indices(profile, dict, &at)?;
                match convert_profile(
                    profile,
                    dict,
                    &resource_attrs,
                    &scope_attrs,
                    now_nanos,
                    limits,
                ) {
                    Ok(series) => out.profile.series.extend(series),
                    // The reason alone: the rejection says which profile is invalid.
                    Err(Error::Invalid(reason)) => out.rejected.push(format!("{at}: {reason}")),
                    Err(e) => out.rejected.push(format!("{at}: {e}")),
                }
            }
        }
    }
    Ok(out)
}

fn bad_index(what: &str, index: i64, table: &str, len: usize) -> Error {
    Error::Invalid(format!(
        "{what} is {index}, out of range: dictionary.{table} has {len} entries"
    ))
}

fn check(index: i32, len: usize, what: impl FnOnce() -> String, table: &str) -> Result<usize> {
    usize::try_from(index)
        .ok()
        .filter(|i| *i < len)
        .ok_or_else(|| bad_index(&what(), i64::from(index), table, len))
}

fn check_dictionary(d: &ProfilesDictionary) -> Result<()> {
    let n_str = d.string_table.len();
    if d.string_table.first().is_some_and(|s| !s.is_empty()) {
        return Err(Error::Invalid(
            "dictionary.string_table[0] must be the empty string".into(),
        ));
    }
    let s = |i: i32, what: &dyn Fn() -> String| check(i, n_str.max(1), what, "string_table");
    for (i, f) in d.function_table.iter().enumerate() {
        s(f.name_strindex, &|| {
            format!("dictionary.function_table[{i}].name_strindex")
        })?;
        s(f.system_name_strindex, &|| {
            format!("dictionary.function_table[{i}].system_name_strindex")
        })?;
        s(f.filename_strindex, &|| {
            format!("dictionary.function_table[{i}].filename_strindex")
        })?;
    }
    for (i, m) in d.mapping_table.iter().enumerate() {
        s(m.filename_strindex, &|| {
            format!("dictionary.mapping_table[{i}].filename_strindex")
        })?;
        for (j, a) in m.attribute_indices.iter().enumerate() {
            check(
                *a,
                d.attribute_table.len(),
                || format!("dictionary.mapping_table[{i}].attribute_indices[{j}]"),
                "attribute_table",
            )?;
        }
    }
    for (i, l) in d.location_table.iter().enumerate() {
        check(
            l.mapping_index,
            d.mapping_table.len().max(1),
            || format!("dictionary.location_table[{i}].mapping_index"),
            "mapping_table",
        )?;
        for (j, line) in l.lines.iter().enumerate() {
            check(
                line.function_index,
                d.function_table.len(),
                || format!("dictionary.location_table[{i}].lines[{j}].function_index"),
                "function_table",
            )?;
        }
        for (j, a) in l.attribute_indices.iter().enumerate() {
            check(
                *a,
                d.attribute_table.len(),
                || format!("dictionary.location_table[{i}].attribute_indices[{j}]"),
                "attribute_table",
            )?;
        }
    }
    for (i, st) in d.stack_table.iter().enumerate() {
        for (j, l) in st.location_indices.iter().enumerate() {
            check(
                *l,
                d.location_table.len(),
                || format!("dictionary.stack_table[{i}].location_indices[{j}]"),
                "location_table",
            )?;
        }
    }
    for (i, a) in d.attribute_table.iter().enumerate() {
        s(a.key_strindex, &|| {
            format!("dictionary.attribute_table[{i}].key_strindex")
        })?;
        s(a.unit_strindex, &|| {
            format!("dictionary.attribute_table[{i}].unit_strindex")
        })?;
        if let Some(v) = &a.value {
            check_any_value(v, n_str, &format!("dictionary.attribute_table[{i}].value"))?;
        }
    }
    for (i, l) in d.link_table.iter().enumerate() {
        if !(l.trace_id.is_empty() || l.trace_id.len() == 16)
            || !(l.span_id.is_empty() || l.span_id.len() == 8)
        {
            return Err(Error::Invalid(format!(
                "dictionary.link_table[{i}] must hold a 16-byte trace id and an 8-byte span id"
            )));
        }
    }
    Ok(())
}

/// Deepest attribute value Kiln reads: arrays and key-value lists inside each other (OTLP/JSON
/// and protobuf alike; real agents send flat values).
pub(crate) const MAX_VALUE_DEPTH: usize = 16;

/// Checks a value's string references, without recursion, and its depth.
fn check_any_value(v: &AnyValue, n_str: usize, at: &str) -> Result<()> {
    let mut todo = vec![(v, at.to_owned(), 0usize)];
    while let Some((v, at, depth)) = todo.pop() {
        if depth > MAX_VALUE_DEPTH {
            return Err(Error::Invalid(format!(
                "{at}: attribute values nest deeper than {MAX_VALUE_DEPTH} levels"
            )));
        }
        match &v.value {
            Some(any_value::Value::StringValueStrindex(i)) => {
                check(
                    *i,
                    n_str.max(1),
                    || format!("{at}.string_value_strindex"),
                    "string_table",
                )?;
            }
            Some(any_value::Value::ArrayValue(a)) => {
                for (j, x) in a.values.iter().enumerate() {
                    todo.push((x, format!("{at}.array_value[{j}]"), depth + 1));
                }
            }
            Some(any_value::Value::KvlistValue(kv)) => {
                for (j, x) in kv.values.iter().enumerate() {
                    if let Some(v) = &x.value {
                        todo.push((v, format!("{at}.kvlist_value[{j}]"), depth + 1));
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn check_profile_indices(p: &otlp::Profile, d: &ProfilesDictionary, at: &str) -> Result<()> {
    let n_str = d.string_table.len().max(1);
    for (vt, name) in [
        (&p.sample_type, "sample_type"),
        (&p.period_type, "period_type"),
    ] {
        if let Some(vt) = vt {
            check(
                vt.type_strindex,
                n_str,
                || format!("{at}.{name}.type_strindex"),
                "string_table",
            )?;
            check(
                vt.unit_strindex,
                n_str,
                || format!("{at}.{name}.unit_strindex"),
                "string_table",
            )?;
        }
    }
    for (j, a) in p.attribute_indices.iter().enumerate() {
        check(
            *a,
            d.attribute_table.len(),
            || format!("{at}.attribute_indices[{j}]"),
            "attribute_table",
        )?;
    }
    for (k, s) in p.samples.iter().enumerate() {
        check(
            s.stack_index,
            d.stack_table.len(),
            || format!("{at}.samples[{k}].stack_index"),
            "stack_table",
        )?;
        check(
            s.link_index,
            d.link_table.len().max(1),
            || format!("{at}.samples[{k}].link_index"),
            "link_table",
        )?;
        for (j, a) in s.attribute_indices.iter().enumerate() {
            check(
                *a,
                d.attribute_table.len(),
                || format!("{at}.samples[{k}].attribute_indices[{j}]"),
                "attribute_table",
            )
            .map_err(|e| Error::Invalid(format!("{e}; {V19_HINT}")))?;
        }
        if !s.values.is_empty()
            && !s.timestamps_unix_nano.is_empty()
            && s.values.len() != s.timestamps_unix_nano.len()
        {
            return Err(Error::Invalid(format!(
                "{at}.samples[{k}] has {} values and {} timestamps; {V19_HINT}",
                s.values.len(),
                s.timestamps_unix_nano.len()
            )));
        }
    }
    Ok(())
}

/// An attribute value as a label value; `None` for types that do not make labels.
fn label_value(mut v: &AnyValue, strings: &[String]) -> Option<String> {
    // A one-element array is its element (without recursion: arrays may nest).
    loop {
        return match v.value.as_ref()? {
            any_value::Value::StringValue(s) => Some(s.clone()),
            any_value::Value::StringValueStrindex(i) => strings.get(*i as usize).cloned(),
            any_value::Value::IntValue(i) => Some(i.to_string()),
            any_value::Value::BoolValue(b) => Some(b.to_string()),
            any_value::Value::DoubleValue(d) => Some(d.to_string()),
            any_value::Value::ArrayValue(a) if a.values.len() == 1 => {
                v = &a.values[0];
                continue;
            }
            _ => None,
        };
    }
}

/// Resolves resource or scope attributes (`key` or `key_strindex`, value or value reference).
fn key_values(kvs: &[KeyValue], strings: &[String], at: &str) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for (i, kv) in kvs.iter().enumerate() {
        let key = if !kv.key.is_empty() {
            kv.key.clone()
        } else {
            let k = check(
                kv.key_strindex,
                strings.len().max(1),
                || format!("{at}.attributes[{i}].key_strindex"),
                "string_table",
            )?;
            strings.get(k).cloned().unwrap_or_default()
        };
        if let Some(v) = &kv.value {
            check_any_value(v, strings.len(), &format!("{at}.attributes[{i}].value"))?;
        }
        if key.is_empty() || out.iter().any(|(k, _)| *k == key) {
            continue; // first wins
        }
        if let Some(value) = kv.value.as_ref().and_then(|v| label_value(v, strings)) {
            out.push((key, value));
        }
    }
    Ok(out)
}

fn attribute(d: &ProfilesDictionary, index: i32) -> Option<(&str, Option<String>)> {
    let a = d.attribute_table.get(index as usize)?;
    let key = d.string_table.get(a.key_strindex as usize)?;
    Some((
        key,
        a.value
            .as_ref()
            .and_then(|v| label_value(v, &d.string_table)),
    ))
}

fn symbols(d: &ProfilesDictionary) -> Result<Symbols> {
    let s = |i: i32| d.string_table.get(i as usize).cloned().unwrap_or_default();
    let mut out = Symbols::default();
    for m in &d.mapping_table {
        let mut build_id = String::new();
        for key in [
            "process.executable.build_id.gnu",
            "process.executable.build_id.go",
            "process.executable.build_id.htlhash",
        ] {
            if build_id.is_empty() {
                build_id = m
                    .attribute_indices
                    .iter()
                    .filter_map(|a| attribute(d, *a))
                    .find(|(k, _)| *k == key)
                    .and_then(|(_, v)| v)
                    .unwrap_or_default();
            }
        }
        out.mappings.push(Mapping {
            memory_start: m.memory_start,
            memory_limit: m.memory_limit,
            file_offset: m.file_offset,
            filename: s(m.filename_strindex),
            build_id,
            has_functions: false,
        });
    }
    let mut shared = SharedStrings::new(&d.string_table);
    let mut string = |i: i32| {
        usize::try_from(i)
            .ok()
            .and_then(|i| shared.get(i))
            .unwrap_or_default()
    };
    for f in &d.function_table {
        out.functions.push(Function {
            name: string(f.name_strindex),
            system_name: string(f.system_name_strindex),
            filename: string(f.filename_strindex),
            start_line: f.start_line,
        });
    }
    let mut unsymbolized = UnsymbolizedFunctions::default();
    for l in &d.location_table {
        let mapping = (l.mapping_index > 0).then_some(l.mapping_index as u32);
        let frame_type = l
            .attribute_indices
            .iter()
            .filter_map(|a| attribute(d, *a))
            .find(|(k, _)| *k == "profile.frame.type")
            .and_then(|(_, v)| v)
            .unwrap_or_default();
        let mut lines: Lines = l
            .lines
            .iter()
            .map(|x| Line {
                function: x.function_index as u32,
                line: x.line,
            })
            .collect();
        if lines.is_empty() {
            // Unsymbolized (native frames from the eBPF profiler): named as pprof names them.
            lines.push(unsymbolized.line(&mut out, mapping, l.address));
        }
        if let Some(m) = mapping.and_then(|m| out.mappings.get_mut(m as usize)) {
            m.has_functions |= !l.lines.is_empty();
        }
        out.locations.push(Location {
            mapping,
            address: l.address,
            lines,
            frame_type,
        });
    }
    Ok(out)
}

fn convert_profile(
    p: &otlp::Profile,
    d: &ProfilesDictionary,
    resource_attrs: &[(String, String)],
    scope_attrs: &[(String, String)],
    now_nanos: i64,
    limits: &NormalizeLimits,
) -> Result<Vec<Series>> {
    let s = |i: i32| {
        d.string_table
            .get(i as usize)
            .map(String::as_str)
            .unwrap_or("")
    };
    let Some(st) = &p.sample_type else {
        return Err(Error::Invalid("the profile has no sample_type".into()));
    };
    kernel::check_sample_count(p.samples.len(), limits)?;
    let (sample_type, sample_unit) = (s(st.type_strindex), s(st.unit_strindex));
    if sample_type.is_empty() {
        return Err(Error::Invalid(
            "the profile's sample type has no name".into(),
        ));
    }
    let (period_type, period_unit) = p
        .period_type
        .as_ref()
        .map(|v| (s(v.type_strindex), s(v.unit_strindex)))
        .unwrap_or(("", ""));
    let pt = |name: &str, ty: &str, unit: &str, pty: &str, punit: &str| ProfileType {
        name: name.into(),
        sample_type: ty.into(),
        sample_unit: unit.into(),
        period_type: pty.into(),
        period_unit: punit.into(),
    };
    let (profile_type, scale) = match (sample_type, sample_unit, period_type, period_unit) {
        ("samples", "count", "cpu", "nanoseconds") => (
            pt("process_cpu", "cpu", "nanoseconds", "cpu", "nanoseconds"),
            p.period.max(1),
        ),
        ("off_cpu", "nanoseconds", _, _) => (
            pt(
                "off_cpu",
                "off_cpu",
                "nanoseconds",
                period_type,
                period_unit,
            ),
            1,
        ),
        _ => {
            let name = if period_type.is_empty() {
                sample_type
            } else {
                period_type
            };
            (
                pt(name, sample_type, sample_unit, period_type, period_unit),
                1,
            )
        }
    };
    let time_nanos = match i64::try_from(p.time_unix_nano) {
        Ok(t) if t > 0 => t,
        _ => now_nanos,
    };
    let duration_nanos = match i64::try_from(p.duration_nano) {
        Ok(d) if d > 0 => d,
        _ => DEFAULT_DURATION_NANOS,
    };
    let resource_service = resource_attrs
        .iter()
        .find(|(k, v)| k == "service.name" && !v.is_empty())
        .map(|(_, v)| v.clone());
    let exe = resource_attrs
        .iter()
        .find(|(k, _)| k == "process.executable.name")
        .map(|(_, v)| v.as_str());
    let default_service = resource_service.unwrap_or_else(|| match exe {
        Some(exe) => format!("{UNKNOWN_SERVICE}:{exe}"),
        None => UNKNOWN_SERVICE.to_owned(),
    });
    let max_value = limits.labels.max_label_value_length;
    if default_service.len() > max_value {
        return Err(Error::Invalid(format!(
            "the service name is longer than {max_value} bytes"
        )));
    }

    // Series key: (service, sorted series-promoted sample attributes).
    let mut builder: SeriesBuilder<(String, Vec<(String, String)>)> = SeriesBuilder::new(1);
    // Buffers reused from sample to sample.
    let mut stack = Vec::new();
    let mut points: Vec<(i64, i64)> = Vec::new();
    for (k, sample) in p.samples.iter().enumerate() {
        if sample.values.is_empty() && sample.timestamps_unix_nano.is_empty() {
            return Err(Error::Invalid(format!(
                "samples[{k}] has neither values nor timestamps"
            )));
        }
        let mut service = None;
        let mut series_attrs = Vec::new();
        let mut per_sample = Vec::new();
        for a in &sample.attribute_indices {
            let Some((key, Some(value))) = attribute(d, *a) else {
                continue;
            };
            if key == "service.name" {
                // An empty name is no name; an over-long one is refused with the profile.
                if value.len() > max_value {
                    return Err(Error::Invalid(format!(
                        "samples[{k}]: service.name is longer than {max_value} bytes"
                    )));
                }
                if !value.is_empty() {
                    service = Some(value);
                }
            } else if PER_SAMPLE_ATTRIBUTES.contains(&key) {
                // Per-sample labels past the length limit are dropped, like other attributes.
                if value.len() <= max_value {
                    per_sample.push((key.to_owned(), value));
                }
            } else {
                series_attrs.push((key.to_owned(), value));
            }
        }
        series_attrs.sort();
        series_attrs.dedup_by(|a, b| a.0 == b.0);
        per_sample.sort();
        per_sample.dedup_by(|a, b| a.0 == b.0);
        let Ok(()) = kernel::fill_stack(
            &mut stack,
            d.stack_table[sample.stack_index as usize]
                .location_indices
                .iter(),
            limits.max_stack_depth,
            |l| Ok::<_, Infallible>(*l as u32),
        );
        let (span_id, trace_id) = match d.link_table.get(sample.link_index as usize) {
            Some(l) if sample.link_index > 0 => {
                let span = <[u8; 8]>::try_from(l.span_id.as_slice())
                    .map(u64::from_le_bytes)
                    .unwrap_or(0);
                let trace = <[u8; 16]>::try_from(l.trace_id.as_slice())
                    .ok()
                    .filter(|t| *t != [0; 16]);
                (span, trace)
            }
            _ => (0, None),
        };
        // (timestamp, value) pairs: one aggregated value, one value per timestamp, or a count.
        points.clear();
        if sample.timestamps_unix_nano.is_empty() {
            let v = sample
                .values
                .iter()
                .try_fold(0i64, |a, v| a.checked_add(*v))
                .ok_or_else(|| Error::Invalid(format!("samples[{k}] values overflow 64 bits")))?;
            points.push((0, v));
        } else {
            for (i, t) in sample.timestamps_unix_nano.iter().enumerate() {
                let t = i64::try_from(*t).map_err(|_| {
                    Error::Invalid(format!("samples[{k}] timestamp {t} is out of range"))
                })?;
                points.push((t, sample.values.get(i).copied().unwrap_or(1)));
            }
        }
        let series = builder.series(&(
            service.unwrap_or_else(|| default_service.clone()),
            series_attrs,
        ));
        for &(t, v) in &points {
            if v < 0 {
                return Err(Error::Invalid(format!("samples[{k}] has a negative value")));
            }
            let v = v.checked_mul(scale).ok_or_else(|| {
                Error::Invalid(format!("samples[{k}] value × period overflows 64 bits"))
            })?;
            let key = builder.hash(SampleKey {
                stack: &stack,
                span_id,
                trace_id,
                timestamp_nanos: t,
                labels: &per_sample,
            });
            builder.add(series, 0, &key, v, k)?;
        }
    }
    let mut out = Vec::new();
    for ((service, sample_attrs), per_type) in builder.finish() {
        let Some(samples) = per_type.into_iter().next().filter(|s| !s.is_empty()) else {
            continue;
        };
        let labels = series_labels(
            &profile_type.name,
            &service,
            resource_attrs,
            scope_attrs,
            &sample_attrs,
            &limits.labels,
        );
        out.push(Series {
            labels,
            profile_type: profile_type.clone(),
            time_nanos,
            duration_nanos,
            samples,
        });
    }
    Ok(out)
}

/// `__name__`, `service_name`, then resource, scope and sample attributes as long as they fit
/// the label limits (later ones win on equal names; what does not fit is dropped).
fn series_labels(
    name: &str,
    service: &str,
    resource: &[(String, String)],
    scope: &[(String, String)],
    sample: &[(String, String)],
    limits: &LabelLimits,
) -> Labels {
    let mut labels = Labels::default();
    labels.set(LABEL_NAME.into(), name.into());
    labels.set(LABEL_SERVICE_NAME.into(), service.into());
    let fits = |k: &str, v: &str| {
        k.len() <= limits.max_label_name_length
            && v.len() <= limits.max_label_value_length
            && crate::labels::validate_label_name(k).is_ok()
    };
    for (k, v) in sample.iter().chain(scope).chain(resource) {
        if k == "service.name" || labels.get(k).is_some() || !fits(k, v) {
            continue;
        }
        if labels.len() >= limits.max_label_names_per_series {
            break;
        }
        labels.set(k.clone(), v.clone());
    }
    labels
}

pub mod layout;

#[cfg(test)]
mod tests;
