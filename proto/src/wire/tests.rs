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

/// A pprof profile with a label, inlined lines, a mapping and strings.
fn small_pprof() -> pb::Profile {
    pb::Profile {
        sample_type: vec![pb::ValueType { r#type: 1, unit: 2 }],
        sample: vec![
            pb::Sample {
                location_id: vec![1, 2],
                value: vec![7],
                label: vec![pb::Label {
                    key: 3,
                    str: 4,
                    ..Default::default()
                }],
            },
            pb::Sample {
                location_id: vec![2],
                value: vec![300],
                label: vec![],
            },
        ],
        mapping: vec![pb::Mapping {
            id: 1,
            memory_start: 0x1000,
            filename: 5,
            ..Default::default()
        }],
        location: vec![
            pb::Location {
                id: 1,
                mapping_id: 1,
                address: 0x1010,
                line: vec![
                    pb::Line {
                        function_id: 1,
                        line: 10,
                    },
                    pb::Line {
                        function_id: 2,
                        line: 20,
                    },
                ],
                is_folded: false,
            },
            pb::Location {
                id: 2,
                line: vec![pb::Line {
                    function_id: 2,
                    line: 3,
                }],
                ..Default::default()
            },
        ],
        function: vec![
            pb::Function {
                id: 1,
                name: 6,
                system_name: 6,
                filename: 7,
                start_line: 1,
            },
            pb::Function {
                id: 2,
                name: 8,
                ..Default::default()
            },
        ],
        string_table: [
            "",
            "cpu",
            "nanoseconds",
            "thread",
            "main",
            "/bin/app",
            "main.work",
            "main.go",
            "runtime.main",
        ]
        .map(String::from)
        .to_vec(),
        period_type: Some(pb::ValueType { r#type: 1, unit: 2 }),
        period: 10_000_000,
        comment: vec![1, 2],
        ..Default::default()
    }
}

#[test]
fn the_pprof_walk_counts_the_fields_decoding_allocates_for() {
    let bytes = bytes::Bytes::from(small_pprof().encode_to_vec());
    let checked = check_with_schema(bytes.clone(), &PPROF_PROFILE).unwrap();
    // Top level: 1 sample type, 2 samples, 1 mapping, 2 locations, 2 functions, 9 strings
    // (the empty one is a field too), the period type and the packed comments: 19.
    // Samples: ids, values and a label, then ids and values: 5. Locations: 3 lines.
    let fields = 19 + 5 + 3;
    assert_eq!(checked.estimate(), bytes.len() + fields * FIELD_COST);
    assert!(checked.estimate() <= check(bytes.clone()).unwrap().estimate());
    assert_eq!(checked.decode::<pb::Profile>().unwrap(), small_pprof());
}

/// `bytes` with `insert` spliced in at `at`, then every length prefix of the messages around
/// it left as it was (so the insertion lands inside whatever field holds `at`, or straddles
/// its end).
fn splice(bytes: &[u8], at: usize, insert: &[u8]) -> Vec<u8> {
    let mut out = bytes[..at].to_vec();
    out.extend_from_slice(insert);
    out.extend_from_slice(&bytes[at..]);
    out
}

#[test]
fn the_pprof_walk_finds_groups_wherever_prost_would_enter_them() {
    let plain = small_pprof().encode_to_vec();
    // Deep groups as an unknown field inside each kind of message, as prost's skip_field
    // enters them: a function, a label, a line, a mapping, a value type, the top level.
    let deep = nested_groups(MAX_DEPTH + 1, true);
    let unknown = |mut m: Vec<u8>| {
        m.extend([0x7b]); // field 15, start group
        m.extend(&deep);
        m.extend([0x7c]); // field 15, end group
        m
    };
    let function = pb::Function {
        id: 1,
        ..Default::default()
    }
    .encode_to_vec();
    let in_function = {
        let mut body = plain.clone();
        let inner = unknown(function);
        body.push(0x2a); // field 5, length-delimited
        prost::encoding::encode_varint(inner.len() as u64, &mut body);
        body.extend(inner);
        body
    };
    let in_label = {
        let label = unknown(pb::Label::default().encode_to_vec());
        let mut sample = vec![0x1a];
        prost::encoding::encode_varint(label.len() as u64, &mut sample);
        sample.extend(label);
        let mut body = plain.clone();
        body.push(0x12); // field 2
        prost::encoding::encode_varint(sample.len() as u64, &mut body);
        body.extend(sample);
        body
    };
    let in_line = {
        let line = unknown(Vec::new());
        let mut location = vec![0x22];
        prost::encoding::encode_varint(line.len() as u64, &mut location);
        location.extend(line);
        let mut body = plain.clone();
        body.push(0x22); // field 4
        prost::encoding::encode_varint(location.len() as u64, &mut body);
        body.extend(location);
        body
    };
    let top = unknown(plain.clone());
    for (name, body) in [
        ("function", in_function),
        ("label", in_label),
        ("line", in_line),
        ("top level", top),
    ] {
        let err = check_with_schema(body.clone().into(), &PPROF_PROFILE).unwrap_err();
        assert!(matches!(err, WireError::TooDeep { .. }), "{name}: {err}");
    }
    // A group left open at the end of a function: prost reads on into the bytes after the
    // function for its end, and enters the groups it finds there.
    let mut open = plain.clone();
    let function = [0x08, 0x01, 0x7b]; // id 1, then field 15 start group
    open.push(0x2a);
    open.push(function.len() as u8);
    open.extend(function);
    open.extend(nested_groups(MAX_DEPTH + 1, true));
    let err = check_with_schema(open.into(), &PPROF_PROFILE).unwrap_err();
    assert!(matches!(err, WireError::TooDeep { .. }), "{err}");
}

#[test]
fn the_pprof_walk_does_not_read_strings_as_messages() {
    // A string that is valid UTF-8 and also messages nested past the limit: prost keeps it as
    // a string, so the schema's walk lets it through where the schema-less one cannot tell.
    let deep = nested_messages(MAX_DEPTH + 5, &[0x08, 0x01]);
    assert!(std::str::from_utf8(&deep).is_ok());
    let mut profile = small_pprof();
    profile
        .string_table
        .push(String::from_utf8(deep.clone()).unwrap());
    let bytes = bytes::Bytes::from(profile.encode_to_vec());
    assert!(matches!(
        check(bytes.clone()),
        Err(WireError::TooDeep { .. })
    ));
    let checked = check_with_schema(bytes, &PPROF_PROFILE).unwrap();
    assert_eq!(checked.decode::<pb::Profile>().unwrap(), profile);
}

proptest! {
    /// Against prost itself (its own limit of 100 is kept: `prost_keeps_its_recursion_limit`):
    /// whatever groups are spliced in wherever in a profile, what prost's recursion limit stops,
    /// the schema's walk refuses first. And the schema's walk refuses nothing the schema-less
    /// walk accepts, with an estimate no larger.
    #[test]
    fn the_pprof_walk_refuses_what_prost_would_recurse_into(
        at in any::<prop::sample::Index>(),
        depth in prop_oneof![0usize..40, 95usize..130],
        closed in any::<bool>(),
        number in 1u8..16,
    ) {
        let plain = small_pprof().encode_to_vec();
        let at = at.index(plain.len() + 1);
        let mut groups = vec![(number << 3) | 3; depth];
        if closed {
            groups.extend(std::iter::repeat_n((number << 3) | 4, depth));
        }
        let body = splice(&plain, at, &groups);
        let by_schema = check_with_schema(body.clone().into(), &PPROF_PROFILE);
        let prost = pb::Profile::decode(body.as_slice());
        if let Err(e) = &prost
            && e.to_string().contains("recursion limit")
        {
            prop_assert!(by_schema.is_err(), "prost: {e}");
        }
        if let Ok(walked) = check(body.clone().into()) {
            let by_schema = by_schema.expect("refused only what the schema-less walk refuses");
            prop_assert!(by_schema.estimate() <= walked.estimate());
        }
    }

    /// Any bytes: the schema's walk ends and never panics, and agrees with the schema-less one
    /// as above.
    #[test]
    fn the_pprof_walk_of_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let by_schema = check_with_schema(bytes.clone().into(), &PPROF_PROFILE);
        if let Ok(walked) = check(bytes.into()) {
            prop_assert!(by_schema.unwrap().estimate() <= walked.estimate());
        }
    }
}
