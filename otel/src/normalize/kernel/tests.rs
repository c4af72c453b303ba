use std::convert::Infallible;

use kiln_proto::google::v1 as pb;
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::profiles::v1development as otlp;

use super::*;
use crate::labels::parse_app_name;
use crate::model::{Mapping, NormalizedProfile};
use crate::normalize::{IngestMeta, normalize_pprof};

#[test]
fn fill_stack_keeps_the_root_side_and_skips_what_it_drops() {
    let leaf_first = [5u64, 4, 3, 2, 1];
    let mut stack = vec![99];
    let mut resolved = Vec::new();
    let Ok(()) = fill_stack(&mut stack, leaf_first.iter(), 2, |&id| {
        resolved.push(id);
        Ok::<_, Infallible>(id as u32 * 10)
    });
    assert_eq!(stack, [20, 10]);
    assert_eq!(resolved, [2, 1], "dropped leaf frames are never resolved");
    let Ok(()) = fill_stack(&mut stack, leaf_first.iter(), 0, |&id| {
        Ok::<_, Infallible>(id as u32)
    });
    assert_eq!(stack, [5, 4, 3, 2, 1], "0 is no limit");
    let err = fill_stack(&mut stack, leaf_first.iter(), 10, |&id| {
        if id == 3 { Err(id) } else { Ok(id as u32) }
    });
    assert_eq!(err, Err(3));
}

#[test]
fn sample_count_limit() {
    let limits = NormalizeLimits {
        max_samples: 2,
        ..Default::default()
    };
    assert!(check_sample_count(2, &limits).is_ok());
    let err = check_sample_count(3, &limits).unwrap_err();
    assert!(
        err.to_string()
            .contains("the profile has 3 samples, more than the limit of 2"),
        "{err}"
    );
    assert!(check_sample_count(1 << 40, &NormalizeLimits::default()).is_ok());
}

#[test]
fn unsymbolized_names() {
    assert_eq!(unsymbolized_name(None, 0), "unknown");
    assert_eq!(unsymbolized_name(Some(""), 0), "unknown");
    assert_eq!(unsymbolized_name(None, 0x1f2a), "0x1f2a");
    assert_eq!(
        unsymbolized_name(Some("/usr/lib/libc.so.6"), 0),
        "libc.so.6"
    );
    assert_eq!(
        unsymbolized_name(Some("/usr/lib/libc.so.6"), 0x1f2a),
        "libc.so.6 0x1f2a"
    );
    assert_eq!(unsymbolized_name(Some("/usr/lib/"), 0x10), "0x10");
}

#[test]
fn unsymbolized_functions_are_made_once_per_name() {
    let mut symbols = Symbols::default();
    symbols.mappings.push(Mapping {
        filename: "/bin/app".into(),
        ..Default::default()
    });
    let mut u = UnsymbolizedFunctions::default();
    let a = u.line(&mut symbols, Some(0), 0x10);
    let b = u.line(&mut symbols, None, 0);
    let c = u.line(&mut symbols, Some(0), 0x10);
    assert_eq!(a, c);
    assert_ne!(a.function, b.function);
    assert_eq!(symbols.functions.len(), 2);
    assert_eq!(&*symbols.functions[a.function as usize].name, "app 0x10");
    assert_eq!(&*symbols.functions[b.function as usize].name, "unknown");
}

#[test]
fn series_builder_merges_equal_keys_only() {
    let mut b: SeriesBuilder<String> = SeriesBuilder::new(2);
    let x = b.series("x");
    let y = b.series("y");
    assert_eq!(b.series("x"), x);
    let labels = vec![("thread.id".to_string(), "7".to_string())];
    let base = SampleKey {
        stack: &[1, 2],
        ..Default::default()
    };
    let keys = [
        base,
        SampleKey { span_id: 1, ..base },
        SampleKey {
            trace_id: Some([1; 16]),
            ..base
        },
        SampleKey {
            timestamp_nanos: 5,
            ..base
        },
        SampleKey {
            labels: &labels,
            ..base
        },
        SampleKey {
            stack: &[1, 3],
            ..base
        },
    ];
    for (i, key) in keys.iter().enumerate() {
        let key = b.hash(*key);
        b.add(x, 0, &key, 3, i).unwrap();
        b.add(x, 0, &key, 4, i).unwrap();
        b.add(x, 0, &key, 0, i).unwrap();
    }
    let key = b.hash(base);
    b.add(y, 1, &key, 5, 0).unwrap();
    b.add(y, 1, &key, i64::MAX - 5, 0).unwrap();
    let err = b.add(y, 1, &key, 1, 9).unwrap_err();
    assert!(
        err.to_string()
            .contains("sample 9: merged values overflow 64 bits"),
        "{err}"
    );

    let out = b.finish();
    let names: Vec<&str> = out.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["x", "y"], "series in the order first seen");
    let (x_types, y_types) = (&out[0].1, &out[1].1);
    assert_eq!(
        x_types[0].len(),
        keys.len(),
        "keys that differ are not merged"
    );
    assert!(
        x_types[0].iter().all(|s| s.value == 7),
        "equal keys are summed"
    );
    for (s, key) in x_types[0].iter().zip(&keys) {
        assert_eq!(SampleKey::from(s), *key);
    }
    assert!(x_types[1].is_empty());
    assert!(y_types[0].is_empty());
    assert_eq!(y_types[1].len(), 1);
    assert_eq!(y_types[1][0].value, i64::MAX);
}

/// A pprof profile of `(mapping id, address, function name)` locations (mapping ids count from 1;
/// 0 is none) and one sample per stack (indices into `locations`, leaf first), of one
/// `cpu/nanoseconds` value.
fn pprof_profile(
    mapping_files: &[&str],
    locations: &[(u64, u64, Option<&str>)],
    stacks: &[(&[usize], i64)],
) -> crate::pprof::Profile {
    let mut p = pb::Profile {
        string_table: vec![String::new(), "cpu".into(), "nanoseconds".into()],
        sample_type: vec![pb::ValueType { r#type: 1, unit: 2 }],
        ..Default::default()
    };
    let s = |p: &mut pb::Profile, x: &str| {
        p.string_table.push(x.into());
        p.string_table.len() as i64 - 1
    };
    for (i, f) in mapping_files.iter().enumerate() {
        let filename = s(&mut p, f);
        p.mapping.push(pb::Mapping {
            id: i as u64 + 1,
            filename,
            ..Default::default()
        });
    }
    for (i, (mapping, address, function)) in locations.iter().enumerate() {
        let id = i as u64 + 1;
        let line = match function {
            Some(name) => {
                let name = s(&mut p, name);
                p.function.push(pb::Function {
                    id,
                    name,
                    ..Default::default()
                });
                vec![pb::Line {
                    function_id: id,
                    line: 1,
                }]
            }
            None => vec![],
        };
        p.location.push(pb::Location {
            id,
            mapping_id: *mapping,
            address: *address,
            line,
            ..Default::default()
        });
    }
    for (stack, value) in stacks {
        p.sample.push(pb::Sample {
            location_id: stack.iter().map(|l| *l as u64 + 1).collect(),
            value: vec![*value],
            label: vec![],
        });
    }
    (&p).into()
}

/// The same profile as OTLP: one stack per sample (so equal stacks have different stack
/// indices), `off_cpu/nanoseconds` values (not scaled).
fn otlp_request(
    mapping_files: &[&str],
    locations: &[(u64, u64, Option<&str>)],
    stacks: &[(&[usize], i64)],
) -> ExportProfilesServiceRequest {
    let mut d = otlp::ProfilesDictionary {
        string_table: vec![String::new(), "off_cpu".into(), "nanoseconds".into()],
        mapping_table: vec![Default::default()],
        location_table: vec![Default::default()],
        function_table: vec![Default::default()],
        stack_table: vec![Default::default()],
        link_table: vec![Default::default()],
        attribute_table: vec![Default::default()],
    };
    let s = |d: &mut otlp::ProfilesDictionary, x: &str| {
        d.string_table.push(x.into());
        d.string_table.len() as i32 - 1
    };
    for f in mapping_files {
        let filename_strindex = s(&mut d, f);
        d.mapping_table.push(otlp::Mapping {
            filename_strindex,
            ..Default::default()
        });
    }
    for (mapping, address, function) in locations {
        let lines = match function {
            Some(name) => {
                let name_strindex = s(&mut d, name);
                d.function_table.push(otlp::Function {
                    name_strindex,
                    ..Default::default()
                });
                vec![otlp::Line {
                    function_index: d.function_table.len() as i32 - 1,
                    line: 1,
                    column: 0,
                }]
            }
            None => vec![],
        };
        d.location_table.push(otlp::Location {
            mapping_index: *mapping as i32,
            address: *address,
            lines,
            ..Default::default()
        });
    }
    let mut samples = Vec::new();
    for (stack, value) in stacks {
        d.stack_table.push(otlp::Stack {
            location_indices: stack.iter().map(|l| *l as i32 + 1).collect(),
        });
        samples.push(otlp::Sample {
            stack_index: d.stack_table.len() as i32 - 1,
            values: vec![*value],
            ..Default::default()
        });
    }
    let profile = otlp::Profile {
        sample_type: Some(otlp::ValueType {
            type_strindex: 1,
            unit_strindex: 2,
        }),
        samples,
        ..Default::default()
    };
    ExportProfilesServiceRequest {
        resource_profiles: vec![otlp::ResourceProfiles {
            scope_profiles: vec![otlp::ScopeProfiles {
                profiles: vec![profile],
                ..Default::default()
            }],
            ..Default::default()
        }],
        dictionary: Some(d),
    }
}

fn from_otlp(req: &ExportProfilesServiceRequest, limits: &NormalizeLimits) -> NormalizedProfile {
    let out = crate::otlp::convert(req, 1, limits).unwrap();
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    out.profile
}

/// Frame names of every sample of the only series, leaf first, with the sample's value.
fn samples(p: &NormalizedProfile) -> Vec<(Vec<&str>, i64)> {
    assert_eq!(p.series.len(), 1);
    p.series[0]
        .samples
        .iter()
        .map(|s| (p.symbols.frame_names(&s.stack).collect(), s.value))
        .collect()
}

#[test]
fn pprof_and_otlp_name_unsymbolized_frames_alike() {
    let files = ["/usr/lib/x86_64-linux-gnu/libc.so.6"];
    // (mapping, address, function): mapping 0 is none.
    let locations = [
        (0, 0, None),
        (1, 0x1f2a, None),
        (0, 0x1f2a, None),
        (1, 0, None),
        (0, 0, Some("main")),
    ];
    let stacks: [(&[usize], i64); 1] = [(&[0, 1, 2, 3, 4], 1)];
    let limits = NormalizeLimits::default();
    let pprof = normalize_pprof(
        &pprof_profile(&files, &locations, &stacks),
        &IngestMeta::default(),
        &limits,
    )
    .unwrap();
    let otlp = from_otlp(&otlp_request(&files, &locations, &stacks), &limits);
    let expected = vec![(
        vec!["unknown", "libc.so.6 0x1f2a", "0x1f2a", "libc.so.6", "main"],
        1,
    )];
    assert_eq!(samples(&pprof), expected);
    assert_eq!(samples(&otlp), expected);
}

#[test]
fn every_format_truncates_and_merges_alike() {
    // f0 is the root; stacks are leaf first. The two deep stacks differ only past the limit.
    let names: Vec<String> = (0..8).map(|i| format!("f{i}")).collect();
    let locations: Vec<(u64, u64, Option<&str>)> =
        names.iter().map(|n| (0, 0, Some(n.as_str()))).collect();
    let stacks: [(&[usize], i64); 4] = [
        (&[7, 3, 2, 1, 0], 2),
        (&[6, 3, 2, 1, 0], 3),
        (&[1, 0], 4),
        (&[1, 0], 5),
    ];
    let limits = NormalizeLimits {
        max_stack_depth: 3,
        ..Default::default()
    };
    let expected = vec![(vec!["f2", "f1", "f0"], 5), (vec!["f1", "f0"], 9)];

    let pprof = normalize_pprof(
        &pprof_profile(&[], &locations, &stacks),
        &IngestMeta::default(),
        &limits,
    )
    .unwrap();
    assert_eq!(samples(&pprof), expected, "pprof");

    let otlp = from_otlp(&otlp_request(&[], &locations, &stacks), &limits);
    assert_eq!(samples(&otlp), expected, "OTLP");

    let text: Vec<(Vec<&str>, i64)> = stacks
        .iter()
        .map(|(s, v)| (s.iter().rev().map(|l| names[*l].as_str()).collect(), *v))
        .collect();
    let app = parse_app_name("svc.alloc_objects").unwrap();
    let folded =
        crate::folded::from_text_stacks(&text, &app, 0, &IngestMeta::default(), &limits).unwrap();
    assert_eq!(samples(&folded), expected, "folded");
}
