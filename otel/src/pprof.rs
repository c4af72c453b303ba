//! pprof decoding: bounded decompression, then protobuf.

use kiln_proto::google::v1::Profile;
use prost::Message;

use crate::compress::maybe_gunzip;
use crate::{Error, Result};

/// Decodes a pprof profile, gzip-compressed or plain, refusing to inflate past `max_bytes`.
pub fn decode(data: &[u8], max_bytes: usize) -> Result<Profile> {
    decode_sized(data, max_bytes).map(|(p, _)| p)
}

/// Like [`decode`], also returning the decompressed size.
pub fn decode_sized(data: &[u8], max_bytes: usize) -> Result<(Profile, usize)> {
    if data.is_empty() {
        return Err(Error::Invalid("the profile is empty".into()));
    }
    let raw = maybe_gunzip(data, max_bytes)?;
    let profile = Profile::decode(&*raw).map_err(|e| Error::Protobuf(e.to_string()))?;
    Ok((profile, raw.len()))
}

/// Encodes a profile as plain protobuf.
pub fn encode(profile: &Profile) -> Vec<u8> {
    profile.encode_to_vec()
}

/// The distinct stacks of a profile as root-first function names (inlined frames expanded,
/// unnamed frames left out), sorted.
pub fn root_first_stacks(p: &Profile) -> Vec<Vec<String>> {
    use std::collections::HashMap;
    let names: HashMap<u64, &str> = p
        .function
        .iter()
        .map(|f| {
            let name = p
                .string_table
                .get(f.name as usize)
                .map_or("", String::as_str);
            (f.id, name)
        })
        .collect();
    let locations: HashMap<u64, Vec<&str>> = p
        .location
        .iter()
        .map(|l| {
            let frames = l
                .line
                .iter()
                .map(|x| names.get(&x.function_id).copied().unwrap_or(""))
                .collect();
            (l.id, frames)
        })
        .collect();
    let mut stacks: Vec<Vec<String>> = p
        .sample
        .iter()
        .map(|s| {
            let mut frames: Vec<String> = s
                .location_id
                .iter()
                .flat_map(|id| locations.get(id).cloned().unwrap_or_default())
                .filter(|n| !n.is_empty())
                .map(str::to_owned)
                .collect();
            frames.reverse();
            frames
        })
        .filter(|f| !f.is_empty())
        .collect();
    stacks.sort();
    stacks.dedup();
    stacks
}

/// Stacks of every pprof file in `dir` (sorted by name), one pool per file that decodes and
/// holds at least `min_stacks` distinct stacks: the real stacks benchmarks build workloads from.
pub fn stack_pools(dir: &std::path::Path, min_stacks: usize) -> Vec<Vec<Vec<String>>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
        .iter()
        .filter_map(|f| decode(&std::fs::read(f).ok()?, 256 << 20).ok())
        .map(|p| root_first_stacks(&p))
        .filter(|pool| pool.len() >= min_stacks)
        .collect()
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use kiln_proto::google::v1 as pb;
    use proptest::prelude::*;

    use super::*;

    fn arb_profile() -> impl Strategy<Value = Profile> {
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
                Profile {
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
            let (decoded, size) = decode_sized(&bytes, 1 << 20).unwrap();
            prop_assert_eq!(size, encode(&p).len());
            prop_assert_eq!(decoded, p);
        }

        /// Any prefix of a profile either decodes or fails with an error; it never panics.
        #[test]
        fn truncation_never_panics(p in arb_profile(), cut in 0usize..200) {
            let bytes = encode(&p);
            let cut = cut.min(bytes.len());
            let _ = decode(&bytes[..cut], 1 << 20);
        }
    }

    #[test]
    fn empty_and_truncated_are_errors() {
        assert!(matches!(decode(b"", 1024), Err(Error::Invalid(_))));
        let mut p = Profile {
            string_table: vec!["".into(), "cpu".into(), "nanoseconds".into()],
            ..Default::default()
        };
        p.sample_type
            .push(kiln_proto::google::v1::ValueType { r#type: 1, unit: 2 });
        let bytes = encode(&p);
        assert_eq!(decode(&bytes, 1024).unwrap(), p);
        let err = decode(&bytes[..bytes.len() - 3], 1024).unwrap_err();
        assert!(matches!(err, Error::Protobuf(_)), "{err}");
    }
}
