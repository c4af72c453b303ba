//! pprof decoding: bounded decompression, then protobuf.
//!
//! Ingest decodes into [`Profile`], the generated [`pb::Profile`] with one difference: a sample's
//! location ids stay the packed varints they arrived as (one to three bytes each) instead of
//! becoming a `Vec<u64>` (eight bytes each), and normalization reads them in place. A profile of
//! 16,000 samples with 2,000-deep stacks, 62 MB on the wire, decoded to 256 MB of location ids
//! alone before; now its samples take about what they took on the wire.

use kiln_proto::google::v1 as pb;
use prost::Message;
use prost::bytes::{Buf, BufMut, Bytes};
use prost::encoding::{DecodeContext, WireType};

use crate::compress::maybe_inflate;
use crate::{Error, Result};

#[cfg(test)]
mod tests;

/// A pprof profile as ingest reads it (field for field [`pb::Profile`], samples kept packed).
#[derive(Clone, PartialEq, Message)]
pub struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<pb::ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<pb::Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<pb::Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<pb::Function>,
    /// Slices of the decoded buffer when that is a [`Bytes`] (no copy), checked to be UTF-8
    /// where they are read (the generated message's are `String`s).
    #[prost(bytes = "bytes", repeated, tag = "6")]
    pub string_table: Vec<Bytes>,
    #[prost(int64, tag = "7")]
    pub drop_frames: i64,
    #[prost(int64, tag = "8")]
    pub keep_frames: i64,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<pb::ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

impl From<&pb::Profile> for Profile {
    /// The same profile, through its encoding (for tests and profiles built in process).
    fn from(p: &pb::Profile) -> Self {
        Self::decode(&*p.encode_to_vec()).expect("an encoded profile decodes")
    }
}

/// A pprof sample whose location ids stay packed varints, leaf first.
#[derive(Clone, PartialEq, Default, Debug)]
pub struct Sample {
    /// The location ids as packed varints (checked when decoded): the first packed run, a slice
    /// of the decoded buffer when that is a [`Bytes`] (no copy), ...
    shared_ids: Bytes,
    /// ... then any further runs and unpacked ids, copied.
    owned_ids: Vec<u8>,
    /// How many ids the two hold.
    ids: usize,
    pub value: Vec<i64>,
    pub label: Vec<pb::Label>,
}

impl Sample {
    /// A sample of these location ids (leaf first), values and labels.
    pub fn new(location_id: &[u64], value: Vec<i64>, label: Vec<pb::Label>) -> Self {
        let mut owned_ids = Vec::new();
        for &id in location_id {
            prost::encoding::encode_varint(id, &mut owned_ids);
        }
        Self {
            shared_ids: Bytes::new(),
            owned_ids,
            ids: location_id.len(),
            value,
            label,
        }
    }

    /// The number of location ids.
    pub fn location_count(&self) -> usize {
        self.ids
    }

    /// The location ids, leaf first.
    pub fn location_ids(&self) -> impl ExactSizeIterator<Item = u64> + '_ {
        LocationIds {
            shared: &self.shared_ids,
            owned: &self.owned_ids,
            left: self.ids,
        }
    }

    fn packed_len(&self) -> usize {
        self.shared_ids.len() + self.owned_ids.len()
    }
}

struct LocationIds<'a> {
    shared: &'a [u8],
    owned: &'a [u8],
    left: usize,
}

impl Iterator for LocationIds<'_> {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        // Checked when the sample was decoded: every varint is whole.
        if self.shared.is_empty() {
            prost::encoding::decode_varint(&mut self.owned).ok()
        } else {
            prost::encoding::decode_varint(&mut self.shared).ok()
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for LocationIds<'_> {}

impl Message for Sample {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if self.packed_len() > 0 {
            prost::encoding::encode_key(1, WireType::LengthDelimited, buf);
            prost::encoding::encode_varint(self.packed_len() as u64, buf);
            buf.put_slice(&self.shared_ids);
            buf.put_slice(&self.owned_ids);
        }
        prost::encoding::int64::encode_packed(2, &self.value, buf);
        prost::encoding::message::encode_repeated(3, &self.label, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> std::result::Result<(), prost::DecodeError> {
        match tag {
            1 if wire_type == WireType::LengthDelimited => {
                // A packed run (the usual form): kept as it is, once its varints are checked.
                let mut run = Bytes::new();
                prost::encoding::bytes::merge(wire_type, &mut run, buf, ctx)?;
                let mut check = &run[..];
                while !check.is_empty() {
                    prost::encoding::decode_varint(&mut check)?;
                    self.ids += 1;
                }
                if self.packed_len() == 0 {
                    self.shared_ids = run;
                } else {
                    self.owned_ids.extend_from_slice(&run);
                }
                Ok(())
            }
            1 => {
                let mut id = 0;
                prost::encoding::uint64::merge(wire_type, &mut id, buf, ctx)?;
                prost::encoding::encode_varint(id, &mut self.owned_ids);
                self.ids += 1;
                Ok(())
            }
            2 => prost::encoding::int64::merge_repeated(wire_type, &mut self.value, buf, ctx),
            3 => prost::encoding::message::merge_repeated(wire_type, &mut self.label, buf, ctx),
            _ => prost::encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let ids = match self.packed_len() {
            0 => 0,
            len => {
                prost::encoding::key_len(1) + prost::encoding::encoded_len_varint(len as u64) + len
            }
        };
        ids + prost::encoding::int64::encoded_len_packed(2, &self.value)
            + prost::encoding::message::encoded_len_repeated(3, &self.label)
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

/// Decodes a pprof profile, gzip-compressed or plain, refusing to inflate past `max_bytes`.
pub fn decode(data: &[u8], max_bytes: usize) -> Result<Profile> {
    decode_sized(Bytes::copy_from_slice(data), max_bytes).map(|(p, _)| p)
}

/// Like [`decode`], also returning the decompressed size. The samples' location ids are slices
/// of the (decompressed) buffer, which lives as long as the profile does.
pub fn decode_sized(data: Bytes, max_bytes: usize) -> Result<(Profile, usize)> {
    if data.is_empty() {
        return Err(Error::Invalid("the profile is empty".into()));
    }
    let raw = match maybe_inflate(&data, max_bytes)? {
        std::borrow::Cow::Borrowed(_) => data,
        std::borrow::Cow::Owned(inflated) => {
            drop(data);
            Bytes::from(inflated)
        }
    };
    let size = raw.len();
    let max_decoded = decoded_limit(max_bytes);
    let estimate = check_estimate(&raw)?;
    if estimate > max_decoded {
        return Err(Error::DecodesTooLarge {
            estimate,
            max: max_decoded,
            factor: DECODED_FACTOR,
        });
    }
    Ok((decode_presized(raw, estimate, None)?, size))
}

/// What decoding the plain pprof `raw` may allocate, by the walk that knows pprof's schema
/// ([`kiln_proto::wire::check_with_schema`]); refuses what nests too deep.
fn check_estimate(raw: &[u8]) -> Result<usize> {
    kiln_proto::wire::decoded_estimate_with_schema(raw, &kiln_proto::wire::PPROF_PROFILE)
        .map_err(|e| Error::Protobuf(e.to_string()))
}

/// [`kiln_proto::wire::check_with_schema`] of a plain pprof body: its walk, kept for
/// [`decode_checked`].
pub fn check(
    raw: Bytes,
) -> std::result::Result<kiln_proto::wire::Checked, kiln_proto::wire::WireError> {
    kiln_proto::wire::check_with_schema(raw, &kiln_proto::wire::PPROF_PROFILE)
}

/// Decodes a profile whose tables are sized first: one pass over the top-level fields (their
/// keys and lengths, not their contents) counts the samples, locations, functions, mappings and
/// strings, so decoding reserves each table once instead of growing it by doubling.
///
/// The reservations together stay within `estimate`, the decoded size the request's memory
/// budget already covers ([`check`]): a body of many fields that
/// do not decode (decoding stops at the first) reserves no more than that, and a table past it
/// grows as decoding fills it, as before.
///
/// `counts`: the top level's counts when the walk made them already
/// ([`kiln_proto::wire::Checked::top_level_counts`]); counted here otherwise.
fn decode_presized(raw: Bytes, estimate: usize, counts: Option<&[usize; 16]>) -> Result<Profile> {
    fn reserve<T>(table: &mut Vec<T>, count: usize, budget: &mut usize) {
        let n = count.min(*budget / std::mem::size_of::<T>().max(1));
        *budget -= n * std::mem::size_of::<T>();
        table.reserve_exact(n);
    }
    let mut profile = Profile::default();
    if let Some(counts) = counts.copied().or_else(|| top_level_counts(&raw)) {
        let mut budget = estimate;
        reserve(&mut profile.sample_type, counts[1], &mut budget);
        reserve(&mut profile.sample, counts[2], &mut budget);
        reserve(&mut profile.mapping, counts[3], &mut budget);
        reserve(&mut profile.location, counts[4], &mut budget);
        reserve(&mut profile.function, counts[5], &mut budget);
        reserve(&mut profile.string_table, counts[6], &mut budget);
    }
    profile
        .merge(raw)
        .map_err(|e| Error::Protobuf(e.to_string()))?;
    Ok(profile)
}

/// How many length-delimited fields (messages and strings) of each number below 16 the
/// message's top level holds; `None` when its keys and lengths do not read (decoding reports
/// why).
fn top_level_counts(mut buf: &[u8]) -> Option<[usize; 16]> {
    let mut counts = [0usize; 16];
    while !buf.is_empty() {
        let (number, wire_type) = prost::encoding::decode_key(&mut buf).ok()?;
        if wire_type == WireType::LengthDelimited
            && let Some(c) = counts.get_mut(number as usize)
        {
            *c += 1;
        }
        let skip = match wire_type {
            WireType::Varint => {
                prost::encoding::decode_varint(&mut buf).ok()?;
                0
            }
            WireType::SixtyFourBit => 8,
            WireType::ThirtyTwoBit => 4,
            WireType::LengthDelimited => {
                usize::try_from(prost::encoding::decode_varint(&mut buf).ok()?).ok()?
            }
            WireType::StartGroup | WireType::EndGroup => return None,
        };
        buf = buf.get(skip..)?;
    }
    Some(counts)
}

/// [`decode_sized`] of a body whose shape has been walked already ([`check`]):
/// a plain one is held to the same limits from the walk's estimate and decoded without walking
/// it again; one that is still gzip (gzip inside gzip) goes through [`decode_sized`], whose
/// walk is of the inflated bytes.
pub fn decode_checked(
    checked: kiln_proto::wire::Checked,
    max_bytes: usize,
) -> Result<(Profile, usize)> {
    let size = checked.bytes().len();
    if size == 0 || crate::compress::is_compressed(checked.bytes()) {
        return decode_sized(checked.bytes().clone(), max_bytes);
    }
    // The limits decode_sized holds a plain body to, from the walk already made.
    if size > max_bytes {
        return Err(Error::TooLarge { limit: max_bytes });
    }
    let max_decoded = decoded_limit(max_bytes);
    if checked.estimate() > max_decoded {
        return Err(Error::DecodesTooLarge {
            estimate: checked.estimate(),
            max: max_decoded,
            factor: DECODED_FACTOR,
        });
    }
    Ok((
        decode_presized(
            checked.bytes().clone(),
            checked.estimate(),
            checked.top_level_counts(),
        )?,
        size,
    ))
}

/// How many times a request's `max_decompressed_bytes` its protobuf may hold once decoded
/// ([`check`]): real profiles decode to 1–4× their bytes, a body
/// of empty messages to 18×.
pub const DECODED_FACTOR: usize = 8;

/// The decoded bytes a request of `max_decompressed_bytes` may hold.
pub fn decoded_limit(max_decompressed_bytes: usize) -> usize {
    max_decompressed_bytes.saturating_mul(DECODED_FACTOR)
}

/// The spy name (`/ingest?spyName=`) of the .NET profiler, whose profiles [`repair_dotnet`] fixes.
pub const DOTNET_SPY: &str = "dotnetspy";

/// Repairs a profile of the .NET profiler (`spyName=dotnetspy`) as Pyroscope does for that spy:
///
/// - its functions all have id 0, so its locations name function ids the profile does not
///   define; when every function's id is 0 and there are as many functions as locations, the
///   i-th function takes the i-th location's id (the profiler writes them in step);
/// - its sample types may be dash-named (`alloc-samples`): dashes become underscores.
///
/// Returns whether the function ids were rewritten.
pub fn repair_dotnet(profile: &mut Profile) -> bool {
    for vt in &profile.sample_type {
        if let Some(name) = usize::try_from(vt.r#type)
            .ok()
            .and_then(|i| profile.string_table.get_mut(i))
        {
            let repaired = std::str::from_utf8(name)
                .ok()
                .filter(|s| s.contains('-'))
                .map(|s| s.replace('-', "_"));
            if let Some(repaired) = repaired {
                *name = Bytes::from(repaired);
            }
        }
    }
    let broken = !profile.function.is_empty()
        && profile.function.iter().all(|f| f.id == 0)
        && profile.function.len() == profile.location.len();
    if broken {
        for (function, location) in profile.function.iter_mut().zip(&profile.location) {
            function.id = location.id;
        }
    }
    broken
}

/// Encodes a profile as plain protobuf.
pub fn encode(profile: &pb::Profile) -> Vec<u8> {
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
                .and_then(|s| std::str::from_utf8(s).ok())
                .unwrap_or_default();
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
                .location_ids()
                .flat_map(|id| locations.get(&id).cloned().unwrap_or_default())
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
