//! Text profiles: `folded` (`a;b;c 123` per line, Brendan Gregg's collapsed format, what py-spy
//! `--format raw` writes) and `lines` (one stack per line, each counted once), plus the
//! Pyroscope rule that turns the application name's last `.` segment into the profile type.

use std::convert::Infallible;

use crate::labels::{AppName, validate_series_labels};
use crate::model::{
    Function, LABEL_NAME, LABEL_SERVICE_NAME, Line, Lines, Location, NormalizedProfile,
    ProfileType, Series, Symbols,
};
use crate::normalize::kernel::{self, FastMap, SampleKey, SeriesBuilder};
use crate::normalize::{IngestMeta, NormalizeLimits};
use crate::{Error, Result};

/// A stack with root first, and its value.
pub type TextStack<'a> = (Vec<&'a str>, i64);

/// Parses folded text: each non-empty line is `frame;frame;... value`, split at the last space.
pub fn parse_folded(body: &str) -> Result<Vec<TextStack<'_>>> {
    let mut out = Vec::new();
    for (i, line) in body.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        let err = |reason: String| Error::Text {
            format: "folded",
            line: i + 1,
            reason,
        };
        let Some((stack, value)) = line.rsplit_once(' ') else {
            return Err(err("expected `stack value`".into()));
        };
        let value: i64 = value
            .trim()
            .parse()
            .map_err(|_| err(format!("{value:?} is not an integer")))?;
        if value < 0 {
            return Err(err("negative value".into()));
        }
        // An empty stack is real (py-spy writes one for samples it could not unwind): its value
        // is kept, as the root's own.
        let frames: Vec<&str> = stack.split(';').filter(|f| !f.is_empty()).collect();
        out.push((frames, value));
    }
    Ok(out)
}

/// Parses `lines` text: every non-empty line is a stack (`a;b;c`) counted once.
pub fn parse_lines(body: &str) -> Vec<TextStack<'_>> {
    body.lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| !l.trim().is_empty())
        .map(|l| (l.split(';').filter(|f| !f.is_empty()).collect(), 1))
        .collect()
}

/// The profile type of a text profile, from the last `.` segment of the application name, and the
/// factor its values are scaled by (CPU and wall samples become nanoseconds at `sample_rate` Hz).
pub fn text_profile_type(app: &str, sample_rate: u32) -> Result<(String, ProfileType, i64)> {
    let (service, suffix) = match app.rsplit_once('.') {
        Some((service, suffix)) => (service, suffix),
        None => (app, "cpu"),
    };
    let pt = |name: &str, ty: &str, unit: &str| ProfileType {
        name: name.into(),
        sample_type: ty.into(),
        sample_unit: unit.into(),
        ..Default::default()
    };
    let mut ty = match suffix {
        "cpu" | "itimer" => pt("process_cpu", "samples", "count"),
        "wall" | "seconds" | "nanoseconds" | "microseconds" | "milliseconds" => {
            pt("wall", "samples", "count")
        }
        "inuse_objects" | "alloc_objects" => pt("memory", suffix, "count"),
        "inuse_space" | "alloc_space" => pt("memory", suffix, "bytes"),
        "goroutines" => pt("goroutine", "goroutines", "count"),
        "mutex_count" => pt("mutex", "contentions", "count"),
        "mutex_duration" => pt("mutex", "delay", "nanoseconds"),
        "block_count" | "lock_count" => pt("block", "contentions", "count"),
        "block_duration" | "lock_duration" => pt("block", "delay", "nanoseconds"),
        "alloc_in_new_tlab_objects" | "alloc_outside_tlab_objects" | "live" => {
            pt("memory", suffix, "count")
        }
        "alloc_in_new_tlab_bytes" | "alloc_outside_tlab_bytes" => pt("memory", suffix, "bytes"),
        "exceptions" => pt("exceptions", "samples", "count"),
        "bytes" => pt("memory", "samples", "bytes"),
        other => {
            return Err(Error::Labels(format!(
                "unknown profile type {other:?} in application name {app:?}: \
                 the last '.' segment names the profile type (cpu, wall, alloc_space, ...)"
            )));
        }
    };
    let mut scale = 1;
    if sample_rate > 0 && (ty.name == "process_cpu" || ty.name == "wall") {
        scale = 1_000_000_000 / i64::from(sample_rate);
        ty.sample_type = if ty.name == "wall" { "wall" } else { "cpu" }.into();
        ty.sample_unit = "nanoseconds".into();
        ty.period_type = "cpu".into();
        ty.period_unit = "nanoseconds".into();
    }
    Ok((service.to_owned(), ty, scale))
}

/// Builds a normalized profile from text stacks.
pub fn from_text_stacks(
    stacks: &[TextStack<'_>],
    name: &AppName,
    sample_rate: u32,
    meta: &IngestMeta,
    limits: &NormalizeLimits,
) -> Result<NormalizedProfile> {
    kernel::check_sample_count(stacks.len(), limits)?;
    let (service, profile_type, scale) = text_profile_type(&name.app, sample_rate)?;
    let mut labels = meta.labels.clone();
    for (k, v) in name.labels.iter() {
        labels.set(k.to_owned(), v.to_owned());
    }
    if labels.get(LABEL_SERVICE_NAME).is_some() {
        labels.set_default("app_name", &service);
    } else {
        labels.set(LABEL_SERVICE_NAME.into(), service);
    }
    labels.set(LABEL_NAME.into(), profile_type.name.clone());
    validate_series_labels(&labels, &limits.labels)?;

    let mut symbols = Symbols::default();
    // One function and one location per distinct frame name.
    let mut index: FastMap<&str, u32> = FastMap::default();
    let mut builder: SeriesBuilder<()> = SeriesBuilder::new(1);
    let series = builder.series(&());
    let mut stack = Vec::new();
    for (i, (frames, value)) in stacks.iter().enumerate() {
        if *value == 0 {
            continue;
        }
        let Ok(()) = kernel::fill_stack(
            &mut stack,
            frames.iter().rev(),
            limits.max_stack_depth,
            |f: &&str| {
                Ok::<_, Infallible>(*index.entry(*f).or_insert_with(|| {
                    let i = symbols.functions.len() as u32;
                    symbols.functions.push(Function {
                        name: (*f).into(),
                        ..Default::default()
                    });
                    symbols.locations.push(Location {
                        lines: Lines::from([Line {
                            function: i,
                            line: 0,
                        }]),
                        ..Default::default()
                    });
                    i
                }))
            },
        );
        let value = value.checked_mul(scale).ok_or_else(|| Error::Text {
            format: "folded",
            line: 0,
            reason: format!("value {value} overflows when scaled to nanoseconds"),
        })?;
        let key = builder.hash(SampleKey {
            stack: &stack,
            ..Default::default()
        });
        builder.add(series, 0, &key, value, i)?;
    }
    let samples = builder
        .finish()
        .into_iter()
        .flat_map(|(_, per_type)| per_type)
        .next()
        .unwrap_or_default();
    let series = if samples.is_empty() {
        Vec::new()
    } else {
        vec![Series {
            labels,
            profile_type,
            time_nanos: meta.time_nanos,
            duration_nanos: meta.duration_nanos,
            samples,
        }]
    };
    Ok(NormalizedProfile { symbols, series })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::labels::parse_app_name;

    #[test]
    fn parses_py_spy_raw_lines() {
        let body = "<module> (busy.py:17);busy_a (busy.py:7);fib (busy.py:3);fib (busy.py:3) 27\n\
                    <module> (busy.py:17);busy_b (busy.py:11) 3\n\n";
        let stacks = parse_folded(body).unwrap();
        assert_eq!(stacks.len(), 2);
        assert_eq!(stacks[0].0[1], "busy_a (busy.py:7)");
        assert_eq!(stacks[0].1, 27);
    }

    #[test]
    fn refuses_bad_lines() {
        assert!(parse_folded("a;b;c").is_err());
        assert!(parse_folded("a;b;c x").is_err());
        assert!(parse_folded("a;b;c -1").is_err());
        let err = parse_folded("a 1\nb x").unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
        let empty = parse_folded("a 1\n 3\n").unwrap();
        assert_eq!(empty[1], (vec![], 3), "an empty stack keeps its value");
    }

    #[test]
    fn cpu_values_become_nanoseconds() {
        let stacks = parse_folded("main;work 3\nmain;work 2\nmain 1").unwrap();
        let name = parse_app_name("myapp.cpu{env=prod}").unwrap();
        let meta = IngestMeta::default();
        let p = from_text_stacks(&stacks, &name, 100, &meta, &NormalizeLimits::default()).unwrap();
        let s = &p.series[0];
        assert_eq!(
            s.profile_type.id(),
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
        );
        assert_eq!(s.total(), 6 * 10_000_000);
        assert_eq!(s.samples.len(), 2, "duplicate stacks are merged");
        assert_eq!(s.labels.get("service_name"), Some("myapp"));
        assert_eq!(s.labels.get("env"), Some("prod"));
    }

    #[test]
    fn profile_type_from_suffix() {
        assert_eq!(
            text_profile_type("app", 0).unwrap().1.id(),
            "process_cpu:samples:count::"
        );
        assert_eq!(
            text_profile_type("a.b.alloc_space", 100).unwrap().1.id(),
            "memory:alloc_space:bytes::"
        );
        assert_eq!(text_profile_type("a.b.alloc_space", 100).unwrap().0, "a.b");
        assert!(text_profile_type("my.app", 100).is_err());
    }

    #[test]
    fn lines_count_once_each() {
        let stacks = parse_lines("a;b\na;b\na;c\n");
        let name = parse_app_name("svc.alloc_objects").unwrap();
        let p = from_text_stacks(
            &stacks,
            &name,
            100,
            &IngestMeta::default(),
            &NormalizeLimits::default(),
        )
        .unwrap();
        assert_eq!(p.series[0].total(), 3);
    }

    proptest! {
        #[test]
        fn folded_round_trip(stacks in prop::collection::vec(
            (prop::collection::vec("[a-z]{1,4}", 1..5), 1i64..1_000_000), 0..30)
        ) {
            let text: String = stacks.iter().map(|(f, v)| format!("{} {v}\n", f.join(";"))).collect();
            let parsed = parse_folded(&text).unwrap();
            prop_assert_eq!(parsed.len(), stacks.len());
            for ((frames, v), (pf, pv)) in stacks.iter().zip(&parsed) {
                prop_assert_eq!(v, pv);
                prop_assert_eq!(frames.iter().map(String::as_str).collect::<Vec<_>>(), pf.clone());
            }
        }
    }
}
