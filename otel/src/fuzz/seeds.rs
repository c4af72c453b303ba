//! Valid inputs for each fuzz entry to mutate: small ones built here (so the run needs nothing
//! outside the repository) and, when a corpus directory is given, the real profiles in it.

use std::path::Path;

use kiln_proto::google::v1 as pb;
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::profiles::v1development::{
    Function, KeyValueAndUnit, Line, Link, Location, Mapping, Profile, ProfilesDictionary,
    ResourceProfiles, Sample, ScopeProfiles, Stack, ValueType,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;

use crate::parca::testing::{self as parca, TestFrame, TestSample, TestType};

/// The seeds of a fuzz entry (a name of [`super::ENTRIES`]); the corpus's files of that format
/// are added when `corpus` is `../shared/corpus` or a copy of it.
pub fn seeds(entry: &str, corpus: Option<&Path>) -> Vec<Vec<u8>> {
    let mut out = match entry {
        "pprof" => vec![pprof(), crate::pprof::encode(&pprof_message())],
        "otlp_protobuf" => vec![otlp().encode_to_vec()],
        "otlp_json" => vec![OTLP_JSON.as_bytes().to_vec()],
        "jfr" => Vec::new(),
        "speedscope" => vec![SPEEDSCOPE_SAMPLED.into(), SPEEDSCOPE_EVENTED.into()],
        "folded" => vec![b"main;work;pay 3\nmain;idle 1\nmain;work 2\n".to_vec()],
        "parca_arrow" => parca_arrow(),
        "push" => vec![push()],
        "parca_raw" => vec![parca_raw_of(pprof())],
        "record" => vec![
            record_of_pprof(pprof()),
            record_of(crate::record::RecordBody::Otlp {
                body: otlp().encode_to_vec().into(),
                json: false,
                now_nanos: 1_700_000_000_000_000_000,
            }),
            record_of(crate::record::RecordBody::Otlp {
                body: OTLP_JSON.as_bytes().to_vec().into(),
                json: true,
                now_nanos: 1_700_000_000_000_000_000,
            }),
        ],
        other => panic!("no fuzz entry {other}"),
    };
    if let Some(dir) = corpus {
        let (sub, keep): (&str, fn(&str) -> bool) = match entry {
            "pprof" | "push" | "parca_raw" | "record" => ("pprof", |_| true),
            "otlp_protobuf" => ("otlp", |n| n.ends_with(".bin")),
            "otlp_json" => ("otlp", |n| n.ends_with(".json")),
            "jfr" => ("jfr", |n| n.ends_with(".jfr.gz")),
            "speedscope" => ("speedscope", |_| true),
            _ => ("", |_| false),
        };
        let mut files: Vec<_> = std::fs::read_dir(dir.join(sub))
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.is_file() && keep(&p.file_name().unwrap_or_default().to_string_lossy()))
            .collect();
        files.sort();
        for f in files {
            let Ok(data) = std::fs::read(&f) else {
                continue;
            };
            out.push(match entry {
                "push" => push_of(data),
                "parca_raw" => parca_raw_of(data),
                "record" => record_of_pprof(data),
                _ => data,
            });
        }
    }
    out
}

fn pprof_message() -> pb::Profile {
    let strings = [
        "",
        "cpu",
        "nanoseconds",
        "main",
        "work",
        "/bin/app",
        "abc123",
        "span_id",
        "thread",
        "worker",
        "bytes",
    ];
    pb::Profile {
        string_table: strings.map(String::from).to_vec(),
        sample_type: vec![pb::ValueType { r#type: 1, unit: 2 }],
        period_type: Some(pb::ValueType { r#type: 1, unit: 2 }),
        period: 10_000_000,
        mapping: vec![pb::Mapping {
            id: 1,
            memory_start: 0x400000,
            memory_limit: 0x500000,
            filename: 5,
            build_id: 6,
            ..Default::default()
        }],
        function: vec![
            pb::Function {
                id: 1,
                name: 3,
                ..Default::default()
            },
            pb::Function {
                id: 2,
                name: 4,
                ..Default::default()
            },
        ],
        location: vec![
            pb::Location {
                id: 1,
                mapping_id: 1,
                address: 0x401000,
                line: vec![pb::Line {
                    function_id: 1,
                    line: 10,
                }],
                ..Default::default()
            },
            pb::Location {
                id: 2,
                mapping_id: 1,
                address: 0x402000,
                line: vec![pb::Line {
                    function_id: 2,
                    line: 20,
                }],
                ..Default::default()
            },
            pb::Location {
                id: 3,
                mapping_id: 1,
                address: 0x403000,
                ..Default::default()
            },
        ],
        sample: vec![
            pb::Sample {
                location_id: vec![2, 1],
                value: vec![30_000_000],
                label: vec![
                    pb::Label {
                        key: 7,
                        str: 6,
                        ..Default::default()
                    },
                    pb::Label {
                        key: 8,
                        str: 9,
                        ..Default::default()
                    },
                ],
            },
            pb::Sample {
                location_id: vec![3, 1],
                value: vec![10_000_000],
                label: vec![pb::Label {
                    key: 10,
                    num: 512,
                    num_unit: 10,
                    ..Default::default()
                }],
            },
        ],
        time_nanos: 1_700_000_000_000_000_000,
        duration_nanos: 10_000_000_000,
        ..Default::default()
    }
}

/// A small pprof, plain.
fn pprof() -> Vec<u8> {
    pprof_message().encode_to_vec()
}

fn push_of(pprof: Vec<u8>) -> Vec<u8> {
    use kiln_proto::push::v1 as p;
    use kiln_proto::types::v1 as t;
    p::PushRequest {
        series: vec![p::RawProfileSeries {
            labels: vec![
                t::LabelPair {
                    name: "service_name".into(),
                    value: "fuzz".into(),
                },
                t::LabelPair {
                    name: "__name__".into(),
                    value: "process_cpu".into(),
                },
            ],
            samples: vec![p::RawSample {
                raw_profile: pprof.into(),
                id: "0d0d0d0d-0000-4000-8000-000000000000".into(),
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

fn parca_raw_of(pprof: Vec<u8>) -> Vec<u8> {
    use kiln_proto::parca::profilestore::v1alpha1 as p;
    p::WriteRawRequest {
        series: vec![p::RawProfileSeries {
            labels: Some(p::LabelSet {
                labels: vec![
                    p::Label {
                        name: "__name__".into(),
                        value: "parca_agent_cpu".into(),
                    },
                    p::Label {
                        name: "comm".into(),
                        value: "fuzz".into(),
                    },
                ],
            }),
            samples: vec![p::RawSample {
                raw_profile: pprof.into(),
                ..Default::default()
            }],
        }],
        ..Default::default()
    }
    .encode_to_vec()
}

fn push() -> Vec<u8> {
    push_of(pprof())
}

/// An OTLP 1.10 request: two samples, a link, attributes, a mapping with a build id.
pub fn otlp() -> ExportProfilesServiceRequest {
    let strings = [
        "",
        "samples",
        "count",
        "cpu",
        "nanoseconds",
        "main",
        "work",
        "thread.name",
        "process.executable.build_id.gnu",
        "/bin/app",
    ];
    let attr = |key: i32, value: &str| KeyValueAndUnit {
        key_strindex: key,
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
        unit_strindex: 0,
    };
    let dictionary = ProfilesDictionary {
        string_table: strings.map(String::from).to_vec(),
        mapping_table: vec![
            Mapping::default(),
            Mapping {
                memory_start: 0x1000,
                memory_limit: 0x9000,
                filename_strindex: 9,
                attribute_indices: vec![2],
                ..Default::default()
            },
        ],
        function_table: vec![
            Function::default(),
            Function {
                name_strindex: 5,
                ..Default::default()
            },
            Function {
                name_strindex: 6,
                ..Default::default()
            },
        ],
        location_table: vec![
            Location::default(),
            Location {
                lines: vec![Line {
                    function_index: 1,
                    line: 3,
                    column: 0,
                }],
                ..Default::default()
            },
            Location {
                lines: vec![Line {
                    function_index: 2,
                    line: 7,
                    column: 0,
                }],
                ..Default::default()
            },
            Location {
                mapping_index: 1,
                address: 0x1234,
                ..Default::default()
            },
        ],
        stack_table: vec![
            Stack::default(),
            Stack {
                location_indices: vec![2, 1],
            },
            Stack {
                location_indices: vec![3, 1],
            },
        ],
        link_table: vec![
            Link {
                trace_id: vec![0; 16],
                span_id: vec![0; 8],
            },
            Link {
                trace_id: vec![7; 16],
                span_id: vec![1, 2, 3, 4, 5, 6, 7, 8],
            },
        ],
        attribute_table: vec![
            KeyValueAndUnit::default(),
            attr(7, "worker-1"),
            attr(8, "0123456789abcdef"),
        ],
    };
    let profile = Profile {
        sample_type: Some(ValueType {
            type_strindex: 1,
            unit_strindex: 2,
        }),
        period_type: Some(ValueType {
            type_strindex: 3,
            unit_strindex: 4,
        }),
        period: 50_000_000,
        time_unix_nano: 1_700_000_000_000_000_000,
        duration_nano: 10_000_000_000,
        samples: vec![
            Sample {
                stack_index: 1,
                attribute_indices: vec![1],
                link_index: 1,
                values: vec![3],
                ..Default::default()
            },
            Sample {
                stack_index: 2,
                values: vec![2],
                timestamps_unix_nano: vec![1_700_000_000_000_000_001],
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    ExportProfilesServiceRequest {
        resource_profiles: vec![ResourceProfiles {
            resource: Some(Resource {
                attributes: vec![KeyValue {
                    key: "service.name".into(),
                    value: Some(AnyValue {
                        value: Some(any_value::Value::StringValue("fuzz".into())),
                    }),
                    key_strindex: 0,
                }],
                ..Default::default()
            }),
            scope_profiles: vec![ScopeProfiles {
                profiles: vec![profile],
                ..Default::default()
            }],
            schema_url: String::new(),
        }],
        dictionary: Some(dictionary),
    }
}

const OTLP_JSON: &str = r#"{
  "resourceProfiles": [{
    "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "fuzz"}},
      {"key": "deep", "value": {"arrayValue": {"values": [{"kvlistValue": {"values": [
        {"key": "k", "value": {"intValue": "7"}}]}}]}}}]},
    "scopeProfiles": [{"profiles": [{
      "sampleType": {"typeStrindex": 1, "unitStrindex": 2},
      "periodType": {"typeStrindex": 3, "unitStrindex": 4},
      "period": "50000000",
      "timeUnixNano": "1700000000000000000",
      "samples": [{"stackIndex": 1, "values": ["3"], "linkIndex": 1},
                  {"stackIndex": 1, "timestampsUnixNano": ["1700000000000000001"]}]
    }]}]
  }],
  "dictionary": {
    "stringTable": ["", "samples", "count", "cpu", "nanoseconds", "main", "work"],
    "functionTable": [{}, {"nameStrindex": 5}, {"nameStrindex": 6}],
    "locationTable": [{}, {"lines": [{"functionIndex": 1}]}, {"lines": [{"functionIndex": 2}]}],
    "stackTable": [{}, {"locationIndices": [2, 1]}],
    "linkTable": [{"traceId": "", "spanId": ""},
                  {"traceId": "07070707070707070707070707070707", "spanId": "0102030405060708"}],
    "attributeTable": [{}],
    "mappingTable": [{}]
  }
}"#;

const SPEEDSCOPE_SAMPLED: &str = r#"{"$schema": "https://www.speedscope.app/file-format-schema.json",
  "shared": {"frames": [{"name": "main"}, {"name": "work", "file": "w.rs", "line": 3}]},
  "profiles": [{"type": "sampled", "name": "cpu", "unit": "milliseconds", "startValue": 0,
    "endValue": 30, "samples": [[0, 1], [0], [0, 1]], "weights": [10, 5, 15]}]}"#;

const SPEEDSCOPE_EVENTED: &str = r#"{"$schema": "https://www.speedscope.app/file-format-schema.json",
  "shared": {"frames": [{"name": "main"}, {"name": "work"}]},
  "profiles": [{"type": "evented", "name": "wall", "unit": "nanoseconds", "startValue": 0,
    "endValue": 14, "events": [{"type": "O", "frame": 0, "at": 0}, {"type": "O", "frame": 1, "at": 2},
      {"type": "C", "frame": 1, "at": 9}, {"type": "C", "frame": 0, "at": 14}]}]}"#;

/// A v1 locations record with its sample record, and a v2 sample record, as IPC streams.
fn parca_arrow() -> Vec<Vec<u8>> {
    let stack = vec![
        TestFrame::function("work"),
        TestFrame::Native {
            address: 0x1234,
            mapping: "/bin/app".into(),
        },
        TestFrame::function("main"),
    ];
    let samples = vec![TestSample {
        labels: vec![("thread".into(), "worker".into())],
        stack: stack.clone(),
        value: 3,
        timestamp: 1_700_000_000_000_000_000,
    }];
    let ty = TestType::default();
    vec![
        parca::ipc(&parca::v1_locations_record(&[stack]), false),
        parca::ipc(&parca::v1_sample_record(&samples, &ty), false),
        parca::ipc(&parca::v2_sample_record(&samples, &ty), true),
    ]
}

/// A write-ahead log record of `body`, with the default limits.
fn record_of(body: crate::record::RecordBody) -> Vec<u8> {
    crate::record::Record {
        limits: crate::normalize::NormalizeLimits::default(),
        max_decompressed_bytes: 16 << 20,
        body,
    }
    .encode("tenant")
}

/// A write-ahead log record of one pprof upload with labels and display names.
fn record_of_pprof(data: Vec<u8>) -> Vec<u8> {
    let mut meta = crate::normalize::IngestMeta {
        time_nanos: 1_700_000_000_000_000_000,
        duration_nanos: 10_000_000_000,
        ..Default::default()
    };
    meta.labels.set("service_name".into(), "fuzz".into());
    meta.display_names.insert("samples".into(), "cpu".into());
    record_of(crate::record::RecordBody::Pprof(vec![
        crate::record::PprofPart {
            meta,
            dotnet: false,
            body: data.into(),
        },
    ]))
}
