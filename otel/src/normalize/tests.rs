use kiln_proto::google::v1 as pprof;
use std::collections::HashMap;

use proptest::prelude::*;
use prost::Message;

use super::*;
use crate::model::Sample;

/// [`super::normalize_pprof`] of a profile built with the generated types.
fn normalize_pprof(
    p: &pprof::Profile,
    meta: &IngestMeta,
    limits: &NormalizeLimits,
) -> Result<NormalizedProfile> {
    super::normalize_pprof(&p.into(), meta, limits)
}

/// Builds pprof profiles for tests: functions become one location each.
struct Builder {
    p: pprof::Profile,
}

impl Builder {
    fn new(types: &[(&str, &str)]) -> Self {
        let mut b = Self {
            p: pprof::Profile {
                string_table: vec![String::new()],
                ..Default::default()
            },
        };
        for (t, u) in types {
            let vt = pprof::ValueType {
                r#type: b.s(t),
                unit: b.s(u),
            };
            b.p.sample_type.push(vt);
        }
        b
    }

    fn s(&mut self, s: &str) -> i64 {
        if let Some(i) = self.p.string_table.iter().position(|x| x == s) {
            return i as i64;
        }
        self.p.string_table.push(s.to_owned());
        self.p.string_table.len() as i64 - 1
    }

    fn loc(&mut self, name: &str) -> u64 {
        let name_idx = self.s(name);
        if let Some(f) = self.p.function.iter().find(|f| f.name == name_idx) {
            return f.id;
        }
        let id = self.p.function.len() as u64 + 1;
        self.p.function.push(pprof::Function {
            id,
            name: name_idx,
            ..Default::default()
        });
        self.p.location.push(pprof::Location {
            id,
            line: vec![pprof::Line {
                function_id: id,
                line: 1,
            }],
            ..Default::default()
        });
        id
    }

    /// `stack` is root first, as people write it.
    fn sample(mut self, stack: &[&str], values: &[i64], labels: &[(&str, &str)]) -> Self {
        let location_id = stack.iter().rev().map(|f| self.loc(f)).collect();
        let label = labels
            .iter()
            .map(|(k, v)| pprof::Label {
                key: self.s(k),
                str: self.s(v),
                ..Default::default()
            })
            .collect();
        self.p.sample.push(pprof::Sample {
            location_id,
            value: values.to_vec(),
            label,
        });
        self
    }
}

fn meta() -> IngestMeta {
    IngestMeta {
        labels: Labels::from_pairs([("service_name", "svc")]),
        time_nanos: 1_700_000_000_000_000_000,
        ..Default::default()
    }
}

fn names(p: &NormalizedProfile, s: &Sample) -> Vec<String> {
    let mut v: Vec<String> = p.symbols.frame_names(&s.stack).map(str::to_owned).collect();
    v.reverse();
    v
}

/// A function's name and system name, and the file names of a profile's functions, are one
/// string each, shared, when the profile's string table has them once.
#[test]
fn functions_share_the_strings_of_the_table() {
    let mut p = Builder::new(&[("cpu", "nanoseconds")])
        .sample(&["main", "a", "b"], &[1], &[])
        .p;
    let file = p.string_table.len() as i64;
    p.string_table.push("main.go".into());
    for f in &mut p.function {
        f.system_name = f.name;
        f.filename = file;
    }
    let n = normalize_pprof(&p, &meta(), &NormalizeLimits::default()).unwrap();
    let f = &n.symbols.functions;
    assert_eq!(f.len(), 3);
    for x in f {
        assert_eq!(x.name.as_ptr(), x.system_name.as_ptr());
        assert_eq!(x.filename.as_ptr(), f[0].filename.as_ptr());
        assert_eq!(&*x.filename, "main.go");
    }
    let names: Vec<&str> = f.iter().map(|x| &*x.name).collect();
    assert_eq!(names, ["b", "a", "main"]);
}

/// The decoded profile's strings are slices of the body it was decoded from: a function's name
/// points into the body, no copy made.
#[test]
fn function_names_are_slices_of_the_body() {
    let p = Builder::new(&[("cpu", "nanoseconds")])
        .sample(&["main", "work"], &[1], &[])
        .p;
    let body = prost::bytes::Bytes::from(p.encode_to_vec());
    let checked = crate::pprof::check(body.clone()).unwrap();
    let (decoded, _) = crate::pprof::decode_checked(checked, 1 << 20).unwrap();
    let n = super::normalize_pprof(&decoded, &meta(), &NormalizeLimits::default()).unwrap();
    let range = body.as_ptr_range();
    for f in &n.symbols.functions {
        assert!(range.contains(&f.name.as_ptr()), "{:?} is a copy", f.name);
    }
    assert_eq!(n.symbols.functions.len(), 2);
}

/// A string of the table that is not UTF-8 is refused where something refers to it (a function,
/// a label), with the reason; one nothing refers to is never read.
#[test]
fn strings_that_are_not_utf8_are_refused_where_used() {
    let p = Builder::new(&[("cpu", "nanoseconds")])
        .sample(&["main", "work"], &[1], &[("pod", "a")])
        .p;
    let bad = p.string_table.len() as i64;
    // The table's last string, appended as a field 6 after the rest: bytes no UTF-8 allows.
    let with_bad = |p: &pprof::Profile| {
        let mut body = p.encode_to_vec();
        body.extend_from_slice(&[0x32, 3, 0xff, 0xfe, b'x']);
        let checked = crate::pprof::check(prost::bytes::Bytes::from(body)).unwrap();
        let (decoded, _) = crate::pprof::decode_checked(checked, 1 << 20).unwrap();
        super::normalize_pprof(&decoded, &meta(), &NormalizeLimits::default())
    };
    let n = with_bad(&p).unwrap();
    assert_eq!(n.series[0].samples.len(), 1);

    let mut by_function = p.clone();
    by_function.function[1].name = bad;
    let err = with_bad(&by_function).unwrap_err().to_string();
    assert!(
        err.contains("a function name refers to string") && err.contains("not UTF-8"),
        "{err}"
    );

    let mut by_label = p.clone();
    by_label.sample[0].label[0].str = bad;
    let err = with_bad(&by_label).unwrap_err().to_string();
    assert!(
        err.contains("a sample label value refers to string") && err.contains("not UTF-8"),
        "{err}"
    );
}

#[test]
fn one_series_per_sample_type_with_derived_name() {
    let p = Builder::new(&[("samples", "count"), ("cpu", "nanoseconds")])
        .sample(&["main", "work"], &[2, 20], &[])
        .sample(&["main", "idle"], &[1, 10], &[])
        .p;
    let n = normalize_pprof(&p, &meta(), &NormalizeLimits::default()).unwrap();
    assert_eq!(n.series.len(), 2);
    let ids: Vec<String> = n.series.iter().map(|s| s.profile_type.id()).collect();
    assert_eq!(
        ids,
        [
            "process_cpu:samples:count::",
            "process_cpu:cpu:nanoseconds::"
        ]
    );
    assert_eq!(n.series[0].total(), 3);
    assert_eq!(n.series[1].total(), 30);
    assert_eq!(n.series[0].labels.get("__name__"), Some("process_cpu"));
    assert_eq!(n.series[0].labels.get("service_name"), Some("svc"));
    assert_eq!(names(&n, &n.series[1].samples[0]), ["main", "work"]);
    assert_eq!(n.series[0].time_nanos, 1_700_000_000_000_000_000);
}

#[test]
fn drops_negative_and_zero_and_merges_duplicates() {
    let p = Builder::new(&[("alloc_space", "bytes"), ("inuse_space", "bytes")])
        .sample(&["a", "b"], &[5, 0], &[])
        .sample(&["a", "b"], &[7, 1], &[])
        .sample(&["a", "c"], &[-1, 4], &[])
        .sample(&["a", "d"], &[0, 0], &[])
        .p;
    let n = normalize_pprof(&p, &IngestMeta::default(), &NormalizeLimits::default()).unwrap();
    assert_eq!(n.series.len(), 2);
    assert_eq!(n.series[0].samples.len(), 1, "duplicates are merged");
    assert_eq!(n.series[0].total(), 12);
    assert_eq!(
        n.series[1].total(),
        1,
        "the negative sample is dropped whole"
    );
    assert_eq!(n.series[0].labels.get("__name__"), Some("memory"));
    assert_eq!(
        n.series[0].labels.get("service_name"),
        Some("unknown_service")
    );
}

#[test]
fn span_and_trace_ids_stay_per_sample() {
    let p = Builder::new(&[("cpu", "nanoseconds")])
        .sample(
            &["a"],
            &[1],
            &[("span_id", "0100000000000000"), ("span_name", "GET")],
        )
        .sample(
            &["a"],
            &[2],
            &[("profile_id", "0200000000000000"), ("span_name", "GET")],
        )
        .sample(
            &["a"],
            &[4],
            &[
                ("span_id", "0100000000000000"),
                ("trace_id", "000102030405060708090a0b0c0d0e0f"),
                ("span_name", "GET"),
            ],
        )
        .p;
    let n = normalize_pprof(&p, &meta(), &NormalizeLimits::default()).unwrap();
    assert_eq!(n.series.len(), 1);
    let s = &n.series[0];
    assert_eq!(
        s.labels.get("span_name"),
        Some("GET"),
        "span_name stays a label"
    );
    assert_eq!(
        s.labels.get("span_id"),
        None,
        "span ids are never series labels"
    );
    assert_eq!(s.labels.get("profile_id"), None);
    assert_eq!(
        s.samples.len(),
        3,
        "samples of different spans are not merged"
    );
    assert_eq!(s.samples[0].span_id, 1);
    assert_eq!(s.samples[1].span_id, 2);
    assert_eq!(s.samples[2].trace_id.unwrap()[15], 15);
}

#[test]
fn unparseable_span_ids_stay_with_their_samples() {
    let p = Builder::new(&[("cpu", "nanoseconds")])
        .sample(&["a"], &[1], &[("span_id", "239")])
        .sample(&["a"], &[2], &[])
        .p;
    let n = normalize_pprof(&p, &meta(), &NormalizeLimits::default()).unwrap();
    let s = &n.series[0];
    assert_eq!(s.labels.get("span_id"), None);
    assert_eq!(
        s.samples.len(),
        2,
        "not merged with the sample without a span"
    );
    assert_eq!(s.samples[0].span_id, 0);
    assert_eq!(
        s.samples[0].labels,
        vec![("span_id".to_string(), "239".to_string())]
    );
}

#[test]
fn sample_labels_split_series() {
    let p = Builder::new(&[("cpu", "nanoseconds")])
        .sample(&["a"], &[1], &[("controller", "slow")])
        .sample(&["b"], &[2], &[("controller", "fast")])
        .sample(&["c"], &[3], &[])
        .p;
    let n = normalize_pprof(&p, &meta(), &NormalizeLimits::default()).unwrap();
    let mut got: Vec<(Option<&str>, i64)> = n
        .series
        .iter()
        .map(|s| (s.labels.get("controller"), s.total()))
        .collect();
    got.sort();
    assert_eq!(got, [(None, 3), (Some("fast"), 2), (Some("slow"), 1)]);
}

#[test]
fn deep_stacks_keep_the_root_side() {
    let frames: Vec<String> = (0..10).map(|i| format!("f{i}")).collect();
    let refs: Vec<&str> = frames.iter().map(String::as_str).collect();
    let p = Builder::new(&[("cpu", "nanoseconds")])
        .sample(&refs, &[1], &[])
        .p;
    let limits = NormalizeLimits {
        max_stack_depth: 4,
        ..Default::default()
    };
    let n = normalize_pprof(&p, &meta(), &limits).unwrap();
    assert_eq!(names(&n, &n.series[0].samples[0]), ["f0", "f1", "f2", "f3"]);
}

#[test]
fn invalid_references_are_refused_with_reasons() {
    let mut p = Builder::new(&[("cpu", "nanoseconds")])
        .sample(&["a"], &[1], &[])
        .p;
    p.sample[0].location_id.push(99);
    let err = normalize_pprof(&p, &meta(), &NormalizeLimits::default()).unwrap_err();
    assert!(err.to_string().contains("location id 99"), "{err}");

    let mut p = Builder::new(&[("cpu", "nanoseconds")])
        .sample(&["a"], &[1], &[])
        .p;
    p.function[0].name = 1000;
    let err = normalize_pprof(&p, &meta(), &NormalizeLimits::default()).unwrap_err();
    assert!(err.to_string().contains("string 1000"), "{err}");

    let mut p = Builder::new(&[("cpu", "nanoseconds")])
        .sample(&["a"], &[1, 2], &[])
        .p;
    p.sample_type.truncate(1);
    let err = normalize_pprof(&p, &meta(), &NormalizeLimits::default()).unwrap_err();
    assert!(
        err.to_string().contains("2 values for 1 sample types"),
        "{err}"
    );

    let p = Builder::new(&[]).p;
    assert!(normalize_pprof(&p, &meta(), &NormalizeLimits::default()).is_err());
}

#[test]
fn bogus_times_are_replaced() {
    let mut p = Builder::new(&[("cpu", "nanoseconds")])
        .sample(&["a"], &[1], &[])
        .p;
    p.time_nanos = 1_600_000_000_000_000; // microseconds, as old py-spy sent
    let n = normalize_pprof(&p, &meta(), &NormalizeLimits::default()).unwrap();
    assert_eq!(n.series[0].time_nanos, meta().time_nanos);
    p.time_nanos = 1_650_000_000_000_000_000;
    let n = normalize_pprof(&p, &meta(), &NormalizeLimits::default()).unwrap();
    assert_eq!(n.series[0].time_nanos, 1_650_000_000_000_000_000);
}

#[test]
fn names_from_default_display_names() {
    let none = HashMap::new();
    assert_eq!(
        metric_name(&["samples"], &none),
        "process_cpu",
        "py-spy pprof"
    );
    assert_eq!(metric_name(&["contentions", "delay"], &none), "mutex");
    assert_eq!(metric_name(&["goroutine"], &none), "goroutines");
    assert_eq!(metric_name(&["samples", "wall"], &none), "wall");
    let config = HashMap::from([("contentions".to_string(), "block_count".to_string())]);
    assert_eq!(metric_name(&["contentions"], &config), "block");
}

proptest! {
    /// Ids are names, not positions: a profile whose functions and locations are numbered
    /// 1, 2, 3, ... in order (the common case, looked up by position) normalizes to what the same
    /// profile with the ids spread out and the tables in another order (looked up by map) does.
    #[test]
    fn ids_in_any_order_normalize_alike(
        samples in prop::collection::vec((prop::collection::vec(0usize..8, 1..6), 1i64..100), 1..30),
        scale in 2u64..1000,
        rotate in 0usize..8,
    ) {
        let fns = ["a", "b", "c", "d", "e", "f", "g", "h"];
        let mut b = Builder::new(&[("cpu", "nanoseconds")]);
        for (stack, v) in &samples {
            let stack: Vec<&str> = stack.iter().map(|i| fns[*i]).collect();
            b = b.sample(&stack, &[*v], &[]);
        }
        let dense = b.p;
        let mut sparse = dense.clone();
        for f in &mut sparse.function {
            f.id *= scale;
        }
        for l in &mut sparse.location {
            l.id *= scale;
            for line in &mut l.line {
                line.function_id *= scale;
            }
        }
        for s in &mut sparse.sample {
            for id in &mut s.location_id {
                *id *= scale;
            }
        }
        let r = rotate % sparse.location.len().max(1);
        sparse.location.rotate_left(r);
        sparse.function.rotate_left(r);
        let limits = NormalizeLimits::default();
        let a = normalize_pprof(&dense, &meta(), &limits).unwrap();
        let b = normalize_pprof(&sparse, &meta(), &limits).unwrap();
        let stacks = |n: &NormalizedProfile| {
            n.series
                .iter()
                .flat_map(|s| s.samples.iter().map(|x| (names(n, x), x.value)))
                .collect::<Vec<_>>()
        };
        prop_assert_eq!(stacks(&a), stacks(&b));
        // A location refers to an id the profile does not define: refused either way.
        let mut broken = sparse.clone();
        broken.sample[0].location_id[0] = scale * 100 + 1;
        prop_assert!(normalize_pprof(&broken, &meta(), &limits).is_err());
        let mut broken = dense.clone();
        broken.sample[0].location_id[0] = dense.location.len() as u64 + 1;
        prop_assert!(normalize_pprof(&broken, &meta(), &limits).is_err());
        broken.sample[0].location_id[0] = 0;
        prop_assert!(normalize_pprof(&broken, &meta(), &limits).is_err());
    }

    /// Totals per sample type survive normalization exactly (non-negative input).
    #[test]
    fn totals_are_preserved(samples in prop::collection::vec(
        (prop::collection::vec(0usize..6, 0..6), 0i64..1000, 0i64..1000, prop::option::of(0u8..3)), 0..60)
    ) {
        let fns = ["a", "b", "c", "d", "e", "f"];
        let mut b = Builder::new(&[("alloc_objects", "count"), ("alloc_space", "bytes")]);
        let (mut t0, mut t1) = (0i64, 0i64);
        for (stack, v0, v1, label) in &samples {
            let stack: Vec<&str> = stack.iter().map(|i| fns[*i]).collect();
            let label_value = label.map(|l| l.to_string());
            let labels: Vec<(&str, &str)> = label_value.iter().map(|v| ("l", v.as_str())).collect();
            b = b.sample(&stack, &[*v0, *v1], &labels);
            t0 += v0;
            t1 += v1;
        }
        let n = normalize_pprof(&b.p, &meta(), &NormalizeLimits::default()).unwrap();
        let total = |ty: &str| n.series.iter().filter(|s| s.profile_type.sample_type == ty).map(Series::total).sum::<i64>();
        prop_assert_eq!(total("alloc_objects"), t0);
        prop_assert_eq!(total("alloc_space"), t1);
        for s in &n.series {
            prop_assert!(s.samples.iter().all(|x| x.value > 0));
        }
    }
}
