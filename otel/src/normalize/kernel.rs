//! The rules every format's normalization shares, each written once. pprof
//! ([`super::normalize_pprof`]), OTLP ([`crate::otlp`]), JFR ([`crate::jfr`]), speedscope
//! ([`crate::speedscope`]) and text stacks ([`crate::folded`]) all go through them:
//!
//! - [`check_sample_count`]: a profile with more samples than `max_samples` is refused;
//! - [`fill_stack`]: a stack deeper than `max_stack_depth` keeps its root side; the leaf frames it
//!   drops are never resolved, so a sample costs what it stores;
//! - [`unsymbolized_name`] and [`UnsymbolizedFunctions`]: a location without symbols is named after
//!   its mapping's file and its address, one synthetic function per name;
//! - [`SeriesBuilder`]: samples grouped by series and sample type; samples with the same stack,
//!   span id, trace id, timestamp and per-sample labels are summed (a sum past 64 bits refuses the
//!   profile), zero values add nothing.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

use hashbrown::{DefaultHashBuilder, HashTable};

use super::NormalizeLimits;
use crate::model::{Function, Line, Sample, Symbols};
use crate::{Error, Result};

/// Maps of one request's data: hashbrown's default (foldhash) hasher, much cheaper than SipHash
/// on the ingest path.
pub type FastMap<K, V> = hashbrown::HashMap<K, V>;

/// Refuses a profile of `samples` samples when that is more than `limits.max_samples` (0: no limit).
pub fn check_sample_count(samples: usize, limits: &NormalizeLimits) -> Result<()> {
    if limits.max_samples > 0 && samples > limits.max_samples {
        return Err(Error::Invalid(format!(
            "the profile has {samples} samples, more than the limit of {}",
            limits.max_samples
        )));
    }
    Ok(())
}

/// Replaces `stack` with the frames of `leaf_first` (leaf first, as every format lists them)
/// resolved by `resolve`, keeping at most `max_stack_depth` frames (0: no limit) of the root side.
/// The frames dropped are skipped before they are resolved; `stack` is a buffer reused from sample
/// to sample.
pub fn fill_stack<I, E>(
    stack: &mut Vec<u32>,
    leaf_first: I,
    max_stack_depth: usize,
    mut resolve: impl FnMut(I::Item) -> std::result::Result<u32, E>,
) -> std::result::Result<(), E>
where
    I: ExactSizeIterator,
{
    let depth = leaf_first.len();
    let keep = match max_stack_depth {
        0 => depth,
        max => depth.min(max),
    };
    stack.clear();
    stack.reserve(keep);
    for frame in leaf_first.skip(depth - keep) {
        stack.push(resolve(frame)?);
    }
    Ok(())
}

/// The frame name of a location without symbols: the base name of its mapping's file and its
/// address (`libc.so.6 0x1f2a`), the file alone at address 0, the address alone without a file,
/// `unknown` with neither (what Pyroscope shows).
pub fn unsymbolized_name(mapping_file: Option<&str>, address: u64) -> String {
    let file = mapping_file
        .map(|f| f.rsplit('/').next().unwrap_or_default())
        .filter(|f| !f.is_empty());
    match (file, address) {
        (Some(file), 0) => file.to_owned(),
        (Some(file), a) => format!("{file} 0x{a:x}"),
        (None, 0) => "unknown".to_owned(),
        (None, a) => format!("0x{a:x}"),
    }
}

/// The synthetic functions of a profile's unsymbolized locations, one per name.
#[derive(Debug, Default)]
pub struct UnsymbolizedFunctions {
    by_name: FastMap<String, u32>,
}

impl UnsymbolizedFunctions {
    /// The line of a location without symbols at `address` in `mapping` (an index into
    /// `symbols.mappings`): a function named by [`unsymbolized_name`], added to
    /// `symbols.functions` the first time its name is seen.
    pub fn line(&mut self, symbols: &mut Symbols, mapping: Option<u32>, address: u64) -> Line {
        let file = mapping
            .and_then(|m| symbols.mappings.get(m as usize))
            .map(|m| m.filename.as_str());
        let name = unsymbolized_name(file, address);
        let function = match self.by_name.get(&name) {
            Some(&f) => f,
            None => {
                let f = symbols.functions.len() as u32;
                symbols.functions.push(Function {
                    name: name.as_str().into(),
                    ..Default::default()
                });
                self.by_name.insert(name, f);
                f
            }
        };
        Line { function, line: 0 }
    }
}

/// The most sample types [`SeriesBuilder::with_capacity`] reserves samples for (Go's heap
/// profile has four).
pub const RESERVED_SAMPLE_TYPES: usize = 4;

/// The most samples per sample type [`SeriesBuilder::with_capacity`] reserves: a profile whose
/// many samples merge into a few (one stack sent over and over) reserves at most this many
/// (under 4 MB over four sample types), not its sample count.
pub const RESERVED_SAMPLES: usize = 8192;

/// What makes two samples of a series one: equal keys are summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SampleKey<'a> {
    /// Location indices, leaf first.
    pub stack: &'a [u32],
    pub span_id: u64,
    pub trace_id: Option<[u8; 16]>,
    pub timestamp_nanos: i64,
    /// Per-sample labels, sorted by name.
    pub labels: &'a [(String, String)],
}

impl<'a> From<&'a Sample> for SampleKey<'a> {
    fn from(s: &'a Sample) -> Self {
        Self {
            stack: &s.stack,
            span_id: s.span_id,
            trace_id: s.trace_id,
            timestamp_nanos: s.timestamp_nanos,
            labels: &s.labels,
        }
    }
}

/// A [`SampleKey`] hashed once, for every sample type it adds a value to.
#[derive(Debug, Clone, Copy)]
pub struct HashedKey<'a> {
    key: SampleKey<'a>,
    hash: u64,
}

/// One sample type's samples of one series, and the index that finds a key's sample.
#[derive(Debug, Default)]
struct Samples {
    samples: Vec<Sample>,
    /// Indices into `samples`, by the hash of their [`SampleKey`].
    index: HashTable<usize>,
}

/// A profile's samples grouped by series key `K` and sample type, duplicates merged.
///
/// The samples own their stacks and labels; a key only borrows them, so a sample whose key is
/// already there costs one hash and one comparison, no allocation.
#[derive(Debug)]
pub struct SeriesBuilder<K> {
    sample_types: usize,
    hasher: DefaultHashBuilder,
    series_of: FastMap<K, usize>,
    /// Per series (in the order first seen), per sample type.
    series: Vec<Vec<Samples>>,
    /// Samples the first series reserves room for, per sample type.
    first_capacity: usize,
}

impl<K: Hash + Eq> SeriesBuilder<K> {
    /// A builder for a profile of `sample_types` sample types.
    pub fn new(sample_types: usize) -> Self {
        Self::with_capacity(sample_types, 0)
    }

    /// A builder whose first series reserves room for `samples` samples of each sample type:
    /// most profiles are one series, whose samples then never regrow. A profile of many series
    /// reserves this once, not once per series, one of more than [`RESERVED_SAMPLE_TYPES`]
    /// sample types not at all (its samples may mostly be zeros), and none more than
    /// [`RESERVED_SAMPLES`].
    pub fn with_capacity(sample_types: usize, samples: usize) -> Self {
        Self {
            sample_types,
            hasher: DefaultHashBuilder::default(),
            series_of: FastMap::default(),
            series: Vec::new(),
            first_capacity: if sample_types <= RESERVED_SAMPLE_TYPES {
                samples.min(RESERVED_SAMPLES)
            } else {
                0
            },
        }
    }

    /// The series of `key`, added when new (`key` is made owned only then).
    pub fn series<Q>(&mut self, key: &Q) -> usize
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if let Some(&s) = self.series_of.get(key) {
            return s;
        }
        let s = self.series.len();
        self.series_of.insert(key.to_owned(), s);
        let capacity = std::mem::take(&mut self.first_capacity);
        self.series.push(
            (0..self.sample_types)
                .map(|_| Samples {
                    samples: Vec::with_capacity(capacity),
                    index: HashTable::with_capacity(capacity),
                })
                .collect(),
        );
        s
    }

    /// Hashes `key` for this builder's [`Self::add`].
    pub fn hash<'a>(&self, key: SampleKey<'a>) -> HashedKey<'a> {
        HashedKey {
            hash: self.hasher.hash_one(key),
            key,
        }
    }

    /// Adds `value` to the sample of `key` in `series` and `sample_type`, making the sample when
    /// it is new; a value of 0 adds nothing (negative values are each format's to drop or refuse
    /// first). `sample` is the input sample's index, for the error when the sum overflows.
    pub fn add(
        &mut self,
        series: usize,
        sample_type: usize,
        key: &HashedKey<'_>,
        value: i64,
        sample: usize,
    ) -> Result<()> {
        if value == 0 {
            return Ok(());
        }
        let Samples { samples, index } = &mut self.series[series][sample_type];
        let found = index.find(key.hash, |&i| SampleKey::from(&samples[i]) == key.key);
        match found {
            Some(&i) => {
                let merged = &mut samples[i].value;
                *merged = merged.checked_add(value).ok_or_else(|| {
                    Error::Invalid(format!("sample {sample}: merged values overflow 64 bits"))
                })?;
            }
            None => {
                let hasher = &self.hasher;
                index.insert_unique(key.hash, samples.len(), |&i| {
                    hasher.hash_one(SampleKey::from(&samples[i]))
                });
                let k = key.key;
                samples.push(Sample {
                    stack: k.stack.to_vec(),
                    value,
                    span_id: k.span_id,
                    trace_id: k.trace_id,
                    timestamp_nanos: k.timestamp_nanos,
                    labels: k.labels.to_vec(),
                });
            }
        }
        Ok(())
    }

    /// The series keys in the order first seen, each with its samples per sample type (empty for
    /// a sample type the series has no value of).
    pub fn finish(self) -> Vec<(K, Vec<Vec<Sample>>)> {
        let mut keys: Vec<(K, usize)> = self.series_of.into_iter().collect();
        keys.sort_unstable_by_key(|(_, s)| *s);
        keys.into_iter()
            .zip(self.series)
            .map(|((key, _), types)| (key, types.into_iter().map(|t| t.samples).collect()))
            .collect()
    }
}

#[cfg(test)]
mod tests;
