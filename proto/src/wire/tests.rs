use proptest::prelude::*;
use prost::Message;

use super::*;
use crate::google::v1 as pb;

/// A field 1 start-group tag, `n` times, each closed when `closed`.
fn nested_groups(n: usize, closed: bool) -> Vec<u8> {
    let mut out = vec![0x0b; n]; // field 1, wire type 3
    if closed {
        out.extend(std::iter::repeat_n(0x0c, n)); // field 1, wire type 4
    }
    out
}

/// Field 1 messages nested `n` deep around `inner`.
fn nested_messages(n: usize, inner: &[u8]) -> Vec<u8> {
    let mut out = inner.to_vec();
    for _ in 0..n {
        let mut outer = vec![0x0a];
        prost::encoding::encode_varint(out.len() as u64, &mut outer);
        outer.extend_from_slice(&out);
        out = outer;
    }
    out
}

#[test]
fn groups_deeper_than_the_limit_are_refused() {
    assert!(check_depth(&nested_groups(MAX_DEPTH, true), MAX_DEPTH).is_ok());
    for (n, closed) in [(MAX_DEPTH + 1, true), (100_000, true), (100_000, false)] {
        let err = check_depth(&nested_groups(n, closed), MAX_DEPTH).unwrap_err();
        assert!(
            matches!(err, WireError::TooDeep { max: MAX_DEPTH }),
            "{n}: {err}"
        );
    }
}

#[test]
fn messages_deeper_than_the_limit_are_refused() {
    let leaf = [0x08, 0x01]; // field 1 = 1
    assert!(check_depth(&nested_messages(MAX_DEPTH, &leaf), MAX_DEPTH).is_ok());
    assert!(check_depth(&nested_messages(MAX_DEPTH + 1, &leaf), MAX_DEPTH).is_err());
    assert!(check_depth(&nested_messages(5_000, &leaf), MAX_DEPTH).is_err());
    // Groups inside messages count as one nesting.
    let mixed = nested_messages(MAX_DEPTH - 2, &nested_groups(3, true));
    assert!(check_depth(&mixed, MAX_DEPTH).is_err());
}

#[test]
fn bytes_that_are_not_protobuf_do_not_count() {
    // A string whose content is not valid protobuf, inside messages at the limit.
    let text = b"hello world \xff\xff";
    let mut field = vec![0x12];
    prost::encoding::encode_varint(text.len() as u64, &mut field);
    field.extend_from_slice(text);
    assert!(check_depth(&nested_messages(MAX_DEPTH - 1, &field), MAX_DEPTH).is_ok());
    // An empty field is depth 0 whatever it is.
    assert!(check_depth(&nested_messages(MAX_DEPTH, &[0x12, 0x00]), MAX_DEPTH).is_ok());
}

#[test]
fn real_messages_pass_and_decode() {
    let profile = pb::Profile {
        sample_type: vec![pb::ValueType { r#type: 1, unit: 2 }],
        sample: (0..100)
            .map(|i| pb::Sample {
                location_id: vec![1, 2, i],
                value: vec![i as i64 * 1_000_003],
                label: vec![pb::Label {
                    key: 3,
                    str: 4,
                    ..Default::default()
                }],
            })
            .collect(),
        string_table: ["", "cpu", "nanoseconds", "span_id", "\n\u{1}x"]
            .map(String::from)
            .to_vec(),
        ..Default::default()
    };
    let bytes = profile.encode_to_vec();
    assert!(check_depth(&bytes, MAX_DEPTH).is_ok());
    let back: pb::Profile = decode(bytes.as_slice()).unwrap();
    assert_eq!(back, profile);
}

#[test]
fn decode_refuses_deep_input_before_prost_sees_it() {
    // Groups after a valid profile's fields: prost would skip them, one recursion a level.
    let mut bytes = pb::Profile::default().encode_to_vec();
    bytes.extend(nested_groups(10_000, true));
    let err = decode::<pb::Profile, _>(bytes.as_slice()).unwrap_err();
    assert!(err.to_string().contains("deeper than 32"), "{err}");
}

#[test]
fn malformed_input_is_left_to_prost() {
    // Not protobuf at the top level: the check lets it through and prost reports it.
    for bad in [
        &[0xff_u8; 11][..],
        &[0x0a, 0x7f][..],
        &[0x00][..],
        &[0x0c][..],
    ] {
        assert!(check_depth(bad, MAX_DEPTH).is_ok());
        assert!(decode::<pb::Profile, _>(bad).is_err());
    }
}

/// Empty messages cost a decoder a struct each: the estimate counts them, and decode_within
/// refuses them before prost allocates; a real profile's estimate stays near its size.
#[test]
fn decoded_estimates_count_fields_empty_ones_too() {
    let empties: Vec<u8> = [0x0a, 0x00].repeat(1000);
    assert_eq!(
        decoded_estimate(&empties, MAX_DEPTH).unwrap(),
        2000 + 1000 * FIELD_COST
    );
    let err = decode_within::<pb::Profile, _>(empties.as_slice(), 10_000).unwrap_err();
    assert!(
        matches!(
            err,
            WireError::TooLarge {
                estimate: 34_000,
                max: 10_000
            }
        ),
        "{err}"
    );
    assert!(decode_within::<pb::Profile, _>(empties.as_slice(), 34_000).is_ok());
    // A profile of samples with packed ids and values: three fields a sample.
    let p = pb::Profile {
        sample: (0..100)
            .map(|i| pb::Sample {
                location_id: (1..=20).collect(),
                value: vec![i],
                label: vec![],
            })
            .collect(),
        ..Default::default()
    };
    let bytes = p.encode_to_vec();
    let estimate = decoded_estimate(&bytes, MAX_DEPTH).unwrap();
    // At least the 300 fields; a packed run that happens to parse as a message counts more.
    assert!(estimate >= bytes.len() + 300 * FIELD_COST, "{estimate}");
    assert!(
        estimate < 5 * bytes.len(),
        "{estimate} for {} bytes",
        bytes.len()
    );
}

proptest! {
    /// Any bytes: the check ends (it reads each byte once) and never panics; what it accepts
    /// prost decodes without recursing past the limit.
    #[test]
    fn any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = check_depth(&bytes, 4);
        let _ = decode::<pb::Profile, _>(bytes.as_slice());
    }

    /// The walk reads a varint as prost does: the same value and length, and the same refusal
    /// of one longer than ten bytes or past 64 bits; never past `end`.
    #[test]
    fn varints_read_as_prost_reads_them(
        bytes in proptest::collection::vec(
            prop_oneof![0x80u8..=0xff, 0u8..0x80, Just(0xffu8), Just(0x01u8), Just(0x02u8)],
            0..14,
        ),
        start in 0usize..3,
        cut in 0usize..3,
    ) {
        let start = start.min(bytes.len());
        let end = bytes.len().saturating_sub(cut).max(start);
        let mut prost_buf = &bytes[start..end];
        let expected = prost::encoding::decode_varint(&mut prost_buf)
            .ok()
            .map(|v| (v, end - prost_buf.len()));
        prop_assert_eq!(read_varint(&bytes, start, end), expected);
    }

    /// Deep nesting hidden after valid fields is found.
    #[test]
    fn depth_is_found_anywhere(prefix in 0usize..20, depth in 0usize..80) {
        let mut bytes = Vec::new();
        for i in 0..prefix {
            bytes.extend([0x08, i as u8 & 0x7f]);
        }
        bytes.extend(nested_messages(depth, &[0x08, 0x01]));
        prop_assert_eq!(check_depth(&bytes, MAX_DEPTH).is_ok(), depth <= MAX_DEPTH);
    }
}

#[test]
fn checked_bytes_keep_their_walk_estimate_and_decode_to_the_message() {
    let profile = pb::Profile {
        string_table: vec![String::new(), "main".into()],
        sample: vec![pb::Sample {
            location_id: vec![1, 2, 3],
            value: vec![7],
            label: vec![],
        }],
        ..Default::default()
    };
    let bytes = bytes::Bytes::from(profile.encode_to_vec());
    let checked = check(bytes.clone()).unwrap();
    assert_eq!(
        checked.estimate(),
        decoded_estimate(&bytes, MAX_DEPTH).unwrap()
    );
    assert_eq!(checked.bytes(), &bytes);
    assert_eq!(checked.decode::<pb::Profile>().unwrap(), profile);
    // What the walk refuses is never a `Checked`.
    let deep = bytes::Bytes::from(nested_messages(MAX_DEPTH + 1, &[0x08, 0x01]));
    assert!(matches!(check(deep), Err(WireError::TooDeep { .. })));
}
