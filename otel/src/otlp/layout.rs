//! OTLP profiles bodies in the layouts before proto 1.10, recognised and read.
//!
//! The `v1development` messages were renumbered twice without a new package name, so a body
//! does not say its version; decoded as 1.10 an older body is misread (a 1.9 sample's values
//! become attribute indices) or refused with a confusing error. What changed:
//!
//! | message | 1.8 | 1.9 | 1.10 (what Kiln's types are) |
//! |---|---|---|---|
//! | `Sample` | 2 values, 3 attribute_indices, 4 link_index | as 1.8 | 2 attribute_indices, 3 link_index, 4 values |
//! | `Profile` | 7 comment_strindices, 8 profile_id, 9 dropped_attributes_count, 10 original_payload_format, 11 original_payload, 12 attribute_indices | 7 profile_id … 11 attribute_indices | as 1.9 |
//!
//! Everything else (the dictionary, resources, scopes, stacks, locations, functions, mappings,
//! links) is the same in all three. Senders: OpenTelemetry Collector v0.136–v0.139 write 1.8,
//! v0.140–v0.147 write 1.9, v0.148 and later 1.10.
//!
//! [`to_current`] walks the body without a schema down to profiles and samples (never into the
//! dictionary) and decides from wire types only a layout can have: `Profile` field 8
//! length-delimited or 9 a varint (or any field 12) is 1.8; `Sample` field 3 length-delimited
//! or 4 a varint is 1.8/1.9, field 3 a varint or 4 length-delimited is 1.10; a sample with field
//! 2 but neither 4 (1.10's values) nor 5 (timestamps) is old too, since every layout requires
//! values or timestamps. A body with nothing decisive is 1.10. An older body is then rewritten
//! to 1.10: every field number involved is below 16, so each is one tag byte, changed in place
//! in a copy (no length changes); 1.8's `comment_strindices` becomes field 15, which 1.10 does
//! not have and prost skips. A body that mixes layouts is refused.

use std::borrow::Cow;

use kiln_proto::wire::{WireKind, fields};

use crate::{Error, Result};

/// The layout of an OTLP profiles protobuf body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// opentelemetry-proto 1.8 (Collector v0.136–v0.139).
    V1_8,
    /// opentelemetry-proto 1.9 (Collector v0.140–v0.147).
    V1_9,
    /// opentelemetry-proto 1.10 and later: what Kiln decodes.
    V1_10,
}

impl Layout {
    pub fn name(self) -> &'static str {
        match self {
            Self::V1_8 => "1.8",
            Self::V1_9 => "1.9",
            Self::V1_10 => "1.10",
        }
    }
}

/// What the walk saw.
#[derive(Debug, Default)]
struct Evidence {
    profile_1_8: bool,
    profile_1_9_on: bool,
    sample_old: bool,
    sample_1_10: bool,
    /// Where the tags to rewrite are: (position, field number, wire type bits).
    profile_tags: Vec<(usize, u32, u8)>,
    sample_tags: Vec<(usize, u32, u8)>,
}

fn wire_bits(kind: WireKind) -> u8 {
    match kind {
        WireKind::Varint => 0,
        WireKind::Fixed64 => 1,
        WireKind::Len => 2,
        WireKind::StartGroup => 3,
        WireKind::EndGroup => 4,
        WireKind::Fixed32 => 5,
    }
}

/// The fields of `buf[range]` numbered `number` and length-delimited: their contents' ranges in
/// `buf`.
fn children(
    buf: &[u8],
    range: std::ops::Range<usize>,
    number: u32,
) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    let base = range.start;
    fields(&buf[range])
        .filter(move |f| f.number == number && f.kind == WireKind::Len)
        .map(move |f| base + f.value.start..base + f.value.end)
}

fn walk(body: &[u8]) -> Evidence {
    let mut ev = Evidence::default();
    // Request (or ProfilesData) 1 → ResourceProfiles 2 → ScopeProfiles 2 → Profile.
    for resource in children(body, 0..body.len(), 1) {
        for scope in children(body, resource, 2) {
            for profile in children(body, scope, 2) {
                let base = profile.start;
                for f in fields(&body[profile.clone()]) {
                    let at = base + f.tag_at;
                    if f.tag_len == 1 && (7..=12).contains(&f.number) {
                        ev.profile_tags.push((at, f.number, wire_bits(f.kind)));
                    }
                    match (f.number, f.kind) {
                        (8, WireKind::Len) | (9, WireKind::Varint) | (12, _) => {
                            ev.profile_1_8 = true
                        }
                        (8, WireKind::Varint) | (9, WireKind::Len) => ev.profile_1_9_on = true,
                        (2, WireKind::Len) => {
                            sample(body, base + f.value.start..base + f.value.end, &mut ev)
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    ev
}

fn sample(body: &[u8], range: std::ops::Range<usize>, ev: &mut Evidence) {
    let base = range.start;
    let (mut has2, mut has4, mut has5) = (false, false, false);
    for f in fields(&body[range]) {
        if f.tag_len == 1 && (2..=4).contains(&f.number) {
            ev.sample_tags
                .push((base + f.tag_at, f.number, wire_bits(f.kind)));
        }
        match (f.number, f.kind) {
            (2, _) => has2 = true,
            (3, WireKind::Len) | (4, WireKind::Varint) => ev.sample_old = true,
            (3, WireKind::Varint) | (4, WireKind::Len) => ev.sample_1_10 = true,
            _ => {}
        }
        has4 |= f.number == 4;
        has5 |= f.number == 5;
    }
    if has2 && !has4 && !has5 {
        ev.sample_old = true;
    }
}

/// The body in the 1.10 layout (itself when it is one), and the layout it came in; a body
/// mixing layouts is refused. Malformed protobuf passes through for the decoder to report.
pub fn to_current(body: &[u8]) -> Result<(Layout, Cow<'_, [u8]>)> {
    let ev = walk(body);
    let mixed = |what: &str| {
        Err(Error::Invalid(format!(
            "this OTLP profiles protobuf mixes layouts ({what}); send one version's messages \
             (Kiln reads opentelemetry-proto 1.8, 1.9 and 1.10)"
        )))
    };
    let layout = if ev.profile_1_8 {
        if ev.profile_1_9_on || ev.sample_1_10 {
            return mixed("a 1.8 profile beside 1.9 or 1.10 messages");
        }
        Layout::V1_8
    } else if ev.sample_old {
        if ev.sample_1_10 {
            return mixed("samples of 1.8/1.9 beside samples of 1.10");
        }
        Layout::V1_9
    } else {
        return Ok((Layout::V1_10, Cow::Borrowed(body)));
    };
    let mut out = body.to_vec();
    for &(at, number, wire) in &ev.sample_tags {
        let to = match number {
            2 => 4, // values
            3 => 2, // attribute_indices
            _ => 3, // link_index
        };
        out[at] = ((to << 3) as u8) | wire;
    }
    if layout == Layout::V1_8 {
        for &(at, number, wire) in &ev.profile_tags {
            // comment_strindices (7) has no place in 1.10: field 15, skipped.
            let to = if number == 7 { 15 } else { number - 1 };
            out[at] = ((to << 3) as u8) | wire;
        }
    }
    Ok((layout, Cow::Owned(out)))
}

#[cfg(test)]
mod tests {
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
}
