use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::profiles::v1development::{
    Function, KeyValueAndUnit, Line, Link, Location, Profile, ProfilesDictionary, ResourceProfiles,
    Sample as OSample, ScopeProfiles, Stack, ValueType,
};
use opentelemetry_proto::tonic::resource::v1::Resource;

use super::*;

/// A dictionary builder: index 0 of every table is the zero value, as the spec requires.
struct Dict {
    d: ProfilesDictionary,
}

impl Dict {
    fn new() -> Self {
        Self {
            d: ProfilesDictionary {
                string_table: vec![String::new()],
                function_table: vec![Function::default()],
                location_table: vec![Location::default()],
                mapping_table: vec![Default::default()],
                stack_table: vec![Stack::default()],
                link_table: vec![Link {
                    trace_id: vec![0; 16],
                    span_id: vec![0; 8],
                }],
                attribute_table: vec![KeyValueAndUnit::default()],
            },
        }
    }

    fn s(&mut self, s: &str) -> i32 {
        if let Some(i) = self.d.string_table.iter().position(|x| x == s) {
            return i as i32;
        }
        self.d.string_table.push(s.into());
        self.d.string_table.len() as i32 - 1
    }

    /// A stack of function names, root first; returns its stack index.
    fn stack(&mut self, root_first: &[&str]) -> i32 {
        let mut locs = Vec::new();
        for name in root_first.iter().rev() {
            let name = self.s(name);
            self.d.function_table.push(Function {
                name_strindex: name,
                ..Default::default()
            });
            let f = self.d.function_table.len() as i32 - 1;
            self.d.location_table.push(Location {
                lines: vec![Line {
                    function_index: f,
                    line: 1,
                    column: 0,
                }],
                ..Default::default()
            });
            locs.push(self.d.location_table.len() as i32 - 1);
        }
        self.d.stack_table.push(Stack {
            location_indices: locs,
        });
        self.d.stack_table.len() as i32 - 1
    }

    fn attr(&mut self, key: &str, value: &str) -> i32 {
        let key_strindex = self.s(key);
        self.d.attribute_table.push(KeyValueAndUnit {
            key_strindex,
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(value.into())),
            }),
            unit_strindex: 0,
        });
        self.d.attribute_table.len() as i32 - 1
    }

    fn link(&mut self, trace: [u8; 16], span: [u8; 8]) -> i32 {
        self.d.link_table.push(Link {
            trace_id: trace.to_vec(),
            span_id: span.to_vec(),
        });
        self.d.link_table.len() as i32 - 1
    }

    fn vt(&mut self, t: &str, u: &str) -> ValueType {
        ValueType {
            type_strindex: self.s(t),
            unit_strindex: self.s(u),
        }
    }
}

fn request(
    dict: Dict,
    resource: Vec<KeyValue>,
    profiles: Vec<Profile>,
) -> ExportProfilesServiceRequest {
    ExportProfilesServiceRequest {
        resource_profiles: vec![ResourceProfiles {
            resource: Some(Resource {
                attributes: resource,
                ..Default::default()
            }),
            scope_profiles: vec![ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: "test".into(),
                    attributes: vec![KeyValue {
                        key: "scope.attr".into(),
                        value: Some(AnyValue {
                            value: Some(any_value::Value::StringValue("s".into())),
                        }),
                        key_strindex: 0,
                    }],
                    ..Default::default()
                }),
                profiles,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
        dictionary: Some(dict.d),
    }
}

const NOW: i64 = 1_700_000_000_000_000_000;

#[test]
fn cpu_samples_with_timestamps_links_and_reference_attributes() {
    let mut d = Dict::new();
    let work = d.stack(&["main", "work"]);
    let idle = d.stack(&["main", "idle"]);
    let thread = d.attr("thread.name", "worker-1");
    let label = d.attr("process.context.label.endpoint", "/pay");
    let link = d.link([7; 16], [1, 0, 0, 0, 0, 0, 0, 0]);
    let sample_type = d.vt("samples", "count");
    let period_type = d.vt("cpu", "nanoseconds");
    // The resource names its service by string-table reference, key and value.
    let key = d.s("service.name");
    let value = d.s("checkout");
    let resource = vec![KeyValue {
        key: String::new(),
        key_strindex: key,
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValueStrindex(value)),
        }),
    }];
    let profile = Profile {
        sample_type: Some(sample_type),
        period_type: Some(period_type),
        period: 50_000_000,
        time_unix_nano: NOW as u64,
        samples: vec![
            OSample {
                stack_index: work,
                attribute_indices: vec![thread, label],
                link_index: link,
                values: vec![],
                timestamps_unix_nano: vec![NOW as u64 + 1, NOW as u64 + 2, NOW as u64 + 3],
            },
            OSample {
                stack_index: idle,
                values: vec![2],
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let out = convert(
        &request(d, resource, vec![profile]),
        0,
        &NormalizeLimits::default(),
    )
    .unwrap();
    assert!(out.rejected.is_empty());
    let series = &out.profile.series;
    assert_eq!(series.len(), 2, "the endpoint label splits series");
    let linked = series
        .iter()
        .find(|s| s.labels.get("process.context.label.endpoint").is_some())
        .unwrap();
    assert_eq!(
        linked.profile_type.id(),
        "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
    );
    assert_eq!(linked.labels.get("service_name"), Some("checkout"));
    assert_eq!(linked.labels.get("scope.attr"), Some("s"));
    assert_eq!(
        linked.labels.get("thread.name"),
        None,
        "thread.name stays per sample"
    );
    assert_eq!(linked.samples.len(), 3, "one row per timestamp");
    for s in &linked.samples {
        assert_eq!(
            s.value, 50_000_000,
            "a timestamp counts one sample of one period"
        );
        assert_eq!(s.span_id, 1);
        assert_eq!(s.trace_id, Some([7; 16]));
        assert_eq!(
            s.labels,
            vec![("thread.name".to_string(), "worker-1".to_string())]
        );
    }
    assert_eq!(linked.samples[2].timestamp_nanos, NOW + 3);
    let other = series
        .iter()
        .find(|s| s.labels.get("process.context.label.endpoint").is_none())
        .unwrap();
    assert_eq!(other.total(), 100_000_000);
    assert_eq!(
        other.samples[0].timestamp_nanos, 0,
        "no timestamps: the profile's time"
    );
    assert_eq!(other.time_nanos, NOW);
    let names: Vec<&str> = out
        .profile
        .symbols
        .frame_names(&linked.samples[0].stack)
        .collect();
    assert_eq!(names, ["work", "main"]);
}

#[test]
fn service_name_falls_back_to_the_executable() {
    let mut d = Dict::new();
    let stack = d.stack(&["a"]);
    let svc = d.attr("service.name", "per-sample");
    let sample_type = d.vt("off_cpu", "nanoseconds");
    let profile = |attrs: Vec<i32>| Profile {
        sample_type: Some(sample_type),
        samples: vec![OSample {
            stack_index: stack,
            attribute_indices: attrs,
            values: vec![5],
            ..Default::default()
        }],
        ..Default::default()
    };
    let exe = vec![KeyValue {
        key: "process.executable.name".into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue("nginx".into())),
        }),
        key_strindex: 0,
    }];
    let out = convert(
        &request(d, exe, vec![profile(vec![]), profile(vec![svc])]),
        NOW,
        &NormalizeLimits::default(),
    )
    .unwrap();
    let services: Vec<_> = out
        .profile
        .series
        .iter()
        .map(|s| s.labels.get("service_name").unwrap().to_owned())
        .collect();
    assert_eq!(services, ["unknown_service:nginx", "per-sample"]);
    assert_eq!(
        out.profile.series[0].profile_type.id(),
        "off_cpu:off_cpu:nanoseconds::"
    );
    assert_eq!(out.profile.series[0].time_nanos, NOW, "missing time is now");
}

#[test]
fn bad_indices_refuse_the_request_saying_which() {
    let mut d = Dict::new();
    let stack = d.stack(&["a"]);
    let st = d.vt("samples", "count");
    let mut req = request(
        d,
        vec![],
        vec![Profile {
            sample_type: Some(st),
            samples: vec![OSample {
                stack_index: stack,
                values: vec![1],
                ..Default::default()
            }],
            ..Default::default()
        }],
    );
    let ok = req.clone();
    req.resource_profiles[0].scope_profiles[0].profiles[0].samples[0].stack_index = 99;
    let err = convert(&req, NOW, &NormalizeLimits::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("samples[0].stack_index is 99"), "{err}");

    let mut req = ok.clone();
    req.dictionary.as_mut().unwrap().location_table[1].lines[0].function_index = 42;
    let err = convert(&req, NOW, &NormalizeLimits::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("location_table[1].lines[0].function_index is 42"),
        "{err}"
    );

    // A proto 1.9 sample read as 1.10: its values land in attribute_indices.
    let mut req = ok.clone();
    req.resource_profiles[0].scope_profiles[0].profiles[0].samples[0].attribute_indices =
        vec![100, 200];
    let err = convert(&req, NOW, &NormalizeLimits::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("proto 1.9"), "{err}");

    let mut req = ok;
    req.dictionary = None;
    assert!(convert(&req, NOW, &NormalizeLimits::default()).is_err());
}

#[test]
fn nested_attribute_values_are_bounded_and_read_without_recursion() {
    use opentelemetry_proto::tonic::common::v1::ArrayValue;
    let nested = |levels: usize| {
        let mut v = AnyValue {
            value: Some(any_value::Value::StringValue("x".into())),
        };
        for _ in 0..levels {
            v = AnyValue {
                value: Some(any_value::Value::ArrayValue(ArrayValue { values: vec![v] })),
            };
        }
        v
    };
    let mut d = Dict::new();
    let stack = d.stack(&["a"]);
    let st = d.vt("samples", "count");
    let profile = Profile {
        sample_type: Some(st),
        samples: vec![OSample {
            stack_index: stack,
            values: vec![1],
            ..Default::default()
        }],
        ..Default::default()
    };
    let attrs = |levels| {
        vec![KeyValue {
            key: "service.name".into(),
            value: Some(nested(levels)),
            key_strindex: 0,
        }]
    };
    // Within the limit: a one-element array is its element, however deep.
    let req = request(
        Dict { d: d.d.clone() },
        attrs(MAX_VALUE_DEPTH),
        vec![profile.clone()],
    );
    let c = convert(&req, NOW, &NormalizeLimits::default()).unwrap();
    assert_eq!(c.profile.series[0].labels.get("service_name"), Some("x"));
    let req = request(d, attrs(MAX_VALUE_DEPTH + 1), vec![profile]);
    let err = convert(&req, NOW, &NormalizeLimits::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("nest deeper than 16"), "{err}");
}

#[test]
fn profile_problems_are_partial_success() {
    let mut d = Dict::new();
    let stack = d.stack(&["a"]);
    let st = d.vt("samples", "count");
    let good = Profile {
        sample_type: Some(st),
        samples: vec![OSample {
            stack_index: stack,
            values: vec![3],
            ..Default::default()
        }],
        ..Default::default()
    };
    let no_type = Profile {
        sample_type: None,
        ..good.clone()
    };
    let empty_sample = Profile {
        samples: vec![OSample {
            stack_index: stack,
            ..Default::default()
        }],
        ..good.clone()
    };
    let out = convert(
        &request(d, vec![], vec![good, no_type, empty_sample]),
        NOW,
        &NormalizeLimits::default(),
    )
    .unwrap();
    assert_eq!(out.profiles, 3);
    assert_eq!(out.rejected.len(), 2, "{:?}", out.rejected);
    assert!(out.rejected[0].contains("profiles[1]: the profile has no sample_type"));
    assert!(out.rejected[1].contains("neither values nor timestamps"));
    assert_eq!(out.profile.series.len(), 1);
    assert_eq!(out.profile.series[0].total(), 3);
}
