use std::borrow::Cow;

use prost::Message;

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::profiles::v1development as pb;

use super::*;

/// A 1.9 `Sample`, as the Collector's pdata v0.140–v0.147 writes it.
#[derive(Clone, PartialEq, prost::Message)]
struct Sample19 {
    #[prost(int32, tag = "1")]
    stack_index: i32,
    #[prost(int64, repeated, tag = "2")]
    values: Vec<i64>,
    #[prost(int32, repeated, tag = "3")]
    attribute_indices: Vec<i32>,
    #[prost(int32, tag = "4")]
    link_index: i32,
    #[prost(fixed64, repeated, tag = "5")]
    timestamps_unix_nano: Vec<u64>,
}

/// A 1.8 `Profile` (its samples as 1.9's).
#[derive(Clone, PartialEq, prost::Message)]
struct Profile18 {
    #[prost(message, repeated, tag = "2")]
    samples: Vec<Sample19>,
    #[prost(fixed64, tag = "3")]
    time_unix_nano: u64,
    #[prost(int64, tag = "6")]
    period: i64,
    #[prost(int32, repeated, tag = "7")]
    comment_strindices: Vec<i32>,
    #[prost(bytes = "vec", tag = "8")]
    profile_id: Vec<u8>,
    #[prost(uint32, tag = "9")]
    dropped_attributes_count: u32,
    #[prost(int32, repeated, tag = "12")]
    attribute_indices: Vec<i32>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Profile19 {
    #[prost(message, repeated, tag = "2")]
    samples: Vec<Sample19>,
    #[prost(fixed64, tag = "3")]
    time_unix_nano: u64,
    #[prost(int64, tag = "6")]
    period: i64,
    #[prost(bytes = "vec", tag = "7")]
    profile_id: Vec<u8>,
    #[prost(uint32, tag = "8")]
    dropped_attributes_count: u32,
    #[prost(int32, repeated, tag = "11")]
    attribute_indices: Vec<i32>,
}

/// Wraps encoded profiles in a request: resource 1 → scope 2 → profiles 2.
fn request(profiles: &[Vec<u8>]) -> Vec<u8> {
    let mut scope = Vec::new();
    for p in profiles {
        prost::encoding::bytes::encode(2, p, &mut scope);
    }
    let mut resource = Vec::new();
    prost::encoding::bytes::encode(2, &scope, &mut resource);
    let mut body = Vec::new();
    prost::encoding::bytes::encode(1, &resource, &mut body);
    body
}

fn samples() -> Vec<Sample19> {
    vec![
        Sample19 {
            stack_index: 1,
            values: vec![2, 3],
            attribute_indices: vec![],
            link_index: 0,
            timestamps_unix_nano: vec![],
        },
        Sample19 {
            stack_index: 2,
            values: vec![70],
            attribute_indices: vec![1, 4],
            link_index: 5,
            timestamps_unix_nano: vec![1_700_000_000_000_000_000],
        },
    ]
}

fn read(body: &[u8]) -> (Layout, ExportProfilesServiceRequest) {
    let (layout, current) = to_current(body).unwrap();
    let req = kiln_proto::wire::decode(&current[..]).unwrap();
    (layout, req)
}

fn check_samples(req: &ExportProfilesServiceRequest) {
    let got = &req.resource_profiles[0].scope_profiles[0].profiles[0].samples;
    assert_eq!(got.len(), 2);
    assert_eq!((got[0].stack_index, &got[0].values), (1, &vec![2, 3]));
    assert!(got[0].attribute_indices.is_empty());
    assert_eq!(got[1].values, [70]);
    assert_eq!(got[1].attribute_indices, [1, 4]);
    assert_eq!(got[1].link_index, 5);
    assert_eq!(got[1].timestamps_unix_nano, [1_700_000_000_000_000_000]);
}

#[test]
fn a_1_9_body_is_read_as_it_was_meant() {
    let p = Profile19 {
        samples: samples(),
        time_unix_nano: 1,
        period: 10,
        profile_id: vec![7; 16],
        dropped_attributes_count: 2,
        attribute_indices: vec![3],
    };
    let (layout, req) = read(&request(&[p.encode_to_vec()]));
    assert_eq!(layout, Layout::V1_9);
    check_samples(&req);
    let profile = &req.resource_profiles[0].scope_profiles[0].profiles[0];
    assert_eq!(profile.profile_id, vec![7; 16]);
    assert_eq!(profile.dropped_attributes_count, 2);
    assert_eq!(profile.attribute_indices, [3]);
}

#[test]
fn a_1_8_body_is_read_as_it_was_meant() {
    let p = Profile18 {
        samples: samples(),
        time_unix_nano: 1,
        period: 10,
        comment_strindices: vec![9, 9],
        profile_id: vec![7; 16],
        dropped_attributes_count: 2,
        attribute_indices: vec![3],
    };
    let (layout, req) = read(&request(&[p.encode_to_vec()]));
    assert_eq!(layout, Layout::V1_8);
    check_samples(&req);
    let profile = &req.resource_profiles[0].scope_profiles[0].profiles[0];
    assert_eq!(profile.profile_id, vec![7; 16]);
    assert_eq!(profile.dropped_attributes_count, 2);
    assert_eq!(profile.attribute_indices, [3]);
    assert_eq!(profile.period, 10);
}

#[test]
fn a_1_10_body_is_left_as_it_is() {
    let p = pb::Profile {
        samples: vec![
            pb::Sample {
                stack_index: 1,
                values: vec![2, 3],
                ..Default::default()
            },
            pb::Sample {
                stack_index: 2,
                attribute_indices: vec![1],
                link_index: 1,
                timestamps_unix_nano: vec![5],
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let body = request(&[p.encode_to_vec()]);
    let (layout, current) = to_current(&body).unwrap();
    assert_eq!(layout, Layout::V1_10);
    assert!(matches!(current, Cow::Borrowed(_)));
    // Nothing decisive (a timestamps-only sample) is 1.10 too.
    let p = pb::Profile {
        samples: vec![pb::Sample {
            stack_index: 1,
            timestamps_unix_nano: vec![5],
            ..Default::default()
        }],
        ..Default::default()
    };
    assert_eq!(
        to_current(&request(&[p.encode_to_vec()])).unwrap().0,
        Layout::V1_10
    );
}

#[test]
fn mixed_layouts_and_garbage() {
    let old = Profile19 {
        samples: samples(),
        ..Default::default()
    };
    let new = pb::Profile {
        samples: vec![pb::Sample {
            stack_index: 1,
            values: vec![2],
            ..Default::default()
        }],
        ..Default::default()
    };
    let body = request(&[old.encode_to_vec(), new.encode_to_vec()]);
    let err = to_current(&body).unwrap_err();
    assert!(err.to_string().contains("mixes layouts"), "{err}");
    // Not protobuf: passed through for the decoder to report.
    let junk = b"\xff\xff\xff not protobuf";
    let (layout, out) = to_current(junk).unwrap();
    assert_eq!((layout, &out[..]), (Layout::V1_10, &junk[..]));
}
