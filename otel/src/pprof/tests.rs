use crate::Error;
use kiln_proto::google::v1 as pb;
use prost::Message;
use prost::bytes::Bytes;
use prost::encoding::WireType;

use std::io::Write;

use proptest::prelude::*;

use super::*;

fn arb_profile() -> impl Strategy<Value = pb::Profile> {
    (
        prop::collection::vec("[a-z]{0,8}", 1..10),
        prop::collection::vec(
            (
                prop::collection::vec(1u64..20, 0..8),
                prop::collection::vec(-5i64..1000, 1..3),
            ),
            0..20,
        ),
        any::<i64>(),
    )
        .prop_map(|(mut strings, samples, time)| {
            strings.insert(0, String::new());
            pb::Profile {
                string_table: strings,
                sample: samples
                    .into_iter()
                    .map(|(location_id, value)| pb::Sample {
                        location_id,
                        value,
                        label: vec![],
                    })
                    .collect(),
                time_nanos: time,
                ..Default::default()
            }
        })
}

proptest! {
    /// Whatever the profile, plain or gzip, it decodes back to itself.
    #[test]
    fn decode_round_trip(p in arb_profile(), gzip in any::<bool>()) {
        let mut bytes = encode(&p);
        if gzip {
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            enc.write_all(&bytes).unwrap();
            bytes = enc.finish().unwrap();
        }
        let (decoded, size) = decode_sized(bytes.into(), 1 << 20).unwrap();
        prop_assert_eq!(size, encode(&p).len());
        prop_assert_eq!(decoded.encode_to_vec(), encode(&p));
        for (s, want) in decoded.sample.iter().zip(&p.sample) {
            prop_assert_eq!(s.location_ids().collect::<Vec<_>>(), want.location_id.clone());
            prop_assert_eq!(s.location_count(), want.location_id.len());
        }
    }

    /// A body walked once ([`check`]) decodes as [`decode_sized`] does,
    /// plain, or still gzip (gzip inside gzip); a prefix of it decodes or errs the same way,
    /// and a limit its bytes or its decoded estimate pass refuses it both ways.
    #[test]
    fn checked_decodes_as_decode_sized(
        p in arb_profile(),
        gzip in any::<bool>(),
        cut in 0usize..400,
        limit in prop_oneof![Just(1usize << 20), 1usize..256],
    ) {
        let mut bytes = encode(&p);
        if gzip {
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            enc.write_all(&bytes).unwrap();
            bytes = enc.finish().unwrap();
        }
        for body in [&bytes[..], &bytes[..cut.min(bytes.len())]] {
            let body = Bytes::copy_from_slice(body);
            let want = decode_sized(body.clone(), limit);
            // What the walk refuses never reaches decode_checked (the caller answers it).
            let Ok(checked) = check(body) else {
                prop_assert!(want.is_err());
                continue;
            };
            match (want, decode_checked(checked, limit)) {
                (Ok((w, wn)), Ok((g, gn))) => {
                    prop_assert_eq!(wn, gn);
                    prop_assert_eq!(w.encode_to_vec(), g.encode_to_vec());
                }
                // The same refusal: too large, decoding too large, or not a profile.
                (Err(w), Err(g)) => prop_assert_eq!(
                    std::mem::discriminant(&w),
                    std::mem::discriminant(&g),
                    "decode_sized: {}; checked: {}", w, g
                ),
                (w, g) => prop_assert!(false, "decode_sized {:?}, checked {:?}", w.is_ok(), g.is_ok()),
            }
        }
    }

    /// Any prefix of a profile either decodes or fails with an error; it never panics.
    #[test]
    fn truncation_never_panics(p in arb_profile(), cut in 0usize..200) {
        let bytes = encode(&p);
        let cut = cut.min(bytes.len());
        let _ = decode(&bytes[..cut], 1 << 20);
    }
}

/// A .NET profile as the profiler writes it: functions of id 0, one per location, in step.
fn broken_dotnet() -> pb::Profile {
    let strings = [
        "",
        "cpu",
        "nanoseconds",
        "alloc-samples",
        "count",
        "Main",
        "Work",
    ];
    pb::Profile {
        string_table: strings.map(String::from).to_vec(),
        sample_type: vec![
            pb::ValueType { r#type: 1, unit: 2 },
            pb::ValueType { r#type: 3, unit: 4 },
        ],
        sample: vec![pb::Sample {
            location_id: vec![8, 7],
            value: vec![10, 1],
            label: vec![],
        }],
        location: [7, 8]
            .map(|id| pb::Location {
                id,
                line: vec![pb::Line {
                    function_id: id,
                    line: 0,
                }],
                ..Default::default()
            })
            .to_vec(),
        function: [5, 6]
            .map(|name| pb::Function {
                id: 0,
                name,
                ..Default::default()
            })
            .to_vec(),
        ..Default::default()
    }
}

/// Decoding reserves each table once, within the estimate the request's budget covers; with
/// no room in it the tables grow as decoding fills them, to the same profile.
#[test]
fn tables_are_reserved_within_the_estimate() {
    let mut p = pb::Profile {
        string_table: vec![String::new(), "cpu".into(), "nanoseconds".into()],
        sample_type: vec![pb::ValueType { r#type: 1, unit: 2 }],
        ..Default::default()
    };
    for id in 1..=40u64 {
        p.string_table.push(format!("f{id}"));
        p.function.push(pb::Function {
            id,
            name: p.string_table.len() as i64 - 1,
            ..Default::default()
        });
        p.location.push(pb::Location {
            id,
            line: vec![pb::Line {
                function_id: id,
                line: 0,
            }],
            ..Default::default()
        });
        p.sample.push(pb::Sample {
            location_id: vec![id, 1],
            value: vec![id as i64],
            label: vec![],
        });
    }
    let bytes = Bytes::from(p.encode_to_vec());
    let estimate = check_estimate(&bytes).unwrap();
    let reserved = decode_presized(bytes.clone(), estimate, None).unwrap();
    assert_eq!(reserved.sample.capacity(), 40);
    assert_eq!(reserved.location.capacity(), 40);
    assert_eq!(reserved.function.capacity(), 40);
    assert_eq!(reserved.string_table.capacity(), 43);
    // The walk's counts are the count pass's, and reserve the same.
    let checked = check(bytes.clone()).unwrap();
    assert_eq!(
        checked.top_level_counts(),
        top_level_counts(&bytes).as_ref()
    );
    let walked = decode_presized(bytes.clone(), estimate, checked.top_level_counts()).unwrap();
    assert_eq!(walked.sample.capacity(), 40);
    assert_eq!(walked.string_table.capacity(), 43);
    let grown = decode_presized(bytes, 0, None).unwrap();
    assert_ne!(
        grown.sample.capacity(),
        40,
        "no room in the estimate: grown, not reserved"
    );
    assert_eq!(grown, reserved);
    assert_eq!(grown, Profile::from(&p));
    // Fields of the tables' numbers that are not length-delimited reserve nothing: decoding
    // refuses the first.
    let mut bogus = Vec::new();
    for _ in 0..1000 {
        bogus.extend([0x10, 0x00]); // field 2 (samples) as a varint
    }
    assert_eq!(top_level_counts(&bogus).map(|c| c[2]), Some(0));
    assert!(decode(&bogus, 1 << 20).is_err());
}

#[test]
fn dotnet_function_ids_and_sample_types_are_repaired() {
    let meta = crate::IngestMeta::default();
    let limits = crate::NormalizeLimits::default();
    let mut p = Profile::from(&broken_dotnet());
    let err = crate::normalize::normalize_pprof(&p, &meta, &limits).unwrap_err();
    assert!(err.to_string().contains("function id 7"), "{err}");
    assert!(repair_dotnet(&mut p));
    let n = crate::normalize::normalize_pprof(&p, &meta, &limits).unwrap();
    let types: Vec<String> = n.series.iter().map(|s| s.profile_type.id()).collect();
    assert_eq!(
        types,
        [
            "process_cpu:cpu:nanoseconds::",
            "process_cpu:alloc_samples:count::"
        ]
    );
    let stack = &n.series[0].samples[0].stack;
    assert_eq!(
        n.symbols.frame_names(stack).collect::<Vec<_>>(),
        ["Work", "Main"]
    );
    assert_eq!(p.function.iter().map(|f| f.id).collect::<Vec<_>>(), [7, 8]);
    assert_eq!(p.string_table[3], "alloc_samples");
    // A profile whose functions have ids is left as it is.
    let mut fine = broken_dotnet();
    fine.function[0].id = 7;
    fine.function[1].id = 8;
    let mut p = Profile::from(&fine);
    assert!(!repair_dotnet(&mut p));
    // As is one whose functions and locations are not in step.
    let mut uneven = broken_dotnet();
    uneven.function.pop();
    let mut p = Profile::from(&uneven);
    assert!(!repair_dotnet(&mut p));
    assert!(p.function.iter().all(|f| f.id == 0));
}

#[test]
fn empty_and_truncated_are_errors() {
    assert!(matches!(decode(b"", 1024), Err(Error::Invalid(_))));
    let mut p = pb::Profile {
        string_table: vec!["".into(), "cpu".into(), "nanoseconds".into()],
        ..Default::default()
    };
    p.sample_type
        .push(kiln_proto::google::v1::ValueType { r#type: 1, unit: 2 });
    let bytes = encode(&p);
    assert_eq!(decode(&bytes, 1024).unwrap(), Profile::from(&p));
    let err = decode(&bytes[..bytes.len() - 3], 1024).unwrap_err();
    assert!(matches!(err, Error::Protobuf(_)), "{err}");
}

/// Location ids sent unpacked (one varint field each, as proto2 writers do) read the same as
/// packed ones; a packed run that ends inside a varint is an error.
#[test]
fn unpacked_and_malformed_location_ids() {
    let mut sample = Vec::new();
    for id in [3u64, 300, 1 << 40] {
        prost::encoding::encode_key(1, WireType::Varint, &mut sample);
        prost::encoding::encode_varint(id, &mut sample);
    }
    let mut profile = Vec::new();
    prost::encoding::encode_key(2, WireType::LengthDelimited, &mut profile);
    prost::encoding::encode_varint(sample.len() as u64, &mut profile);
    profile.extend_from_slice(&sample);
    let p = Profile::decode(&*profile).unwrap();
    assert_eq!(
        p.sample[0].location_ids().collect::<Vec<_>>(),
        [3, 300, 1 << 40]
    );

    // Field 1, packed, two bytes long, holding one whole varint and half of another.
    let bad = [0x0a, 0x02, 0x05, 0x80];
    let mut profile = vec![0x12, bad.len() as u8];
    profile.extend_from_slice(&bad);
    assert!(Profile::decode(&*profile).is_err());
}
