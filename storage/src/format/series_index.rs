//! An inverted index of one block's series (ADR 0017): for each label name (and the synthetic
//! `__profile_type__`), its distinct values, sorted, each with the ascending ids of the series
//! that carry it, and the set of series that carry the name at all. Selectors become sets of
//! series ids ([`SeriesIndex::select`]) by judging each distinct value once rather than each
//! series' labels, and label names and values are read from the sets rather than from every
//! series. Built once per block, when the metastore entry is first decoded, and kept with it.

use std::collections::BTreeMap;

use fixedbitset::FixedBitSet;

use crate::format::series_labels::SeriesMeta;
use crate::selector::{MatchOp, Matcher, Selector};

#[cfg(test)]
mod tests;

/// The label name that matches a series' profile type id.
pub const PROFILE_TYPE_LABEL: &str = kiln_otel::model::LABEL_PROFILE_TYPE;

/// One label name's values and the series of each.
#[derive(Debug)]
struct Postings {
    /// Distinct values, sorted.
    values: Vec<Box<str>>,
    /// `series[offsets[v]..offsets[v + 1]]` carry `values[v]`, ascending.
    offsets: Vec<u32>,
    series: Vec<u32>,
    /// Series that carry the name.
    present: FixedBitSet,
}

impl Postings {
    fn build(len: usize, mut pairs: Vec<(&str, u32)>) -> Self {
        pairs.sort_unstable();
        let mut values: Vec<Box<str>> = Vec::new();
        let mut offsets = Vec::new();
        let mut series = Vec::with_capacity(pairs.len());
        let mut present = FixedBitSet::with_capacity(len);
        for (value, id) in pairs {
            if values.last().is_none_or(|v| &**v != value) {
                values.push(value.into());
                offsets.push(series.len() as u32);
            }
            series.push(id);
            present.insert(id as usize);
        }
        offsets.push(series.len() as u32);
        Self {
            values,
            offsets,
            series,
            present,
        }
    }

    fn group(&self, v: usize) -> &[u32] {
        &self.series[self.offsets[v] as usize..self.offsets[v + 1] as usize]
    }

    /// Series whose value of this name (`""` when absent) the matcher accepts.
    fn matching(&self, m: &Matcher, len: usize) -> FixedBitSet {
        let mut out = FixedBitSet::with_capacity(len);
        match m.op {
            // One value: a binary search, not a judgment of each.
            MatchOp::Equal if !m.value.is_empty() => {
                if let Ok(v) = self
                    .values
                    .binary_search_by(|x| (**x).cmp(m.value.as_str()))
                {
                    out.extend(self.group(v).iter().map(|&s| s as usize));
                }
                return out;
            }
            _ => {
                for (v, value) in self.values.iter().enumerate() {
                    if m.matches(value) {
                        out.extend(self.group(v).iter().map(|&s| s as usize));
                    }
                }
            }
        }
        if m.matches("") {
            let mut absent = self.present.clone();
            absent.toggle_range(..);
            out.union_with(&absent);
        }
        out
    }
}

/// The index of one block's series.
#[derive(Debug)]
pub struct SeriesIndex {
    len: usize,
    names: BTreeMap<Box<str>, Postings>,
    min_time: Vec<i64>,
    max_time: Vec<i64>,
    /// The earliest and latest sample of any series.
    earliest: i64,
    latest: i64,
}

impl SeriesIndex {
    /// Indexes `series` (a block's, in its order).
    pub fn build(series: &[SeriesMeta]) -> Self {
        let len = series.len();
        let mut pairs: BTreeMap<&str, Vec<(&str, u32)>> = BTreeMap::new();
        for (i, s) in series.iter().enumerate() {
            for (k, v) in s.labels.iter() {
                pairs.entry(k).or_default().push((v, i as u32));
            }
            pairs
                .entry(PROFILE_TYPE_LABEL)
                .or_default()
                .push((&s.profile_type, i as u32));
        }
        Self {
            len,
            names: pairs
                .into_iter()
                .map(|(k, v)| (k.into(), Postings::build(len, v)))
                .collect(),
            min_time: series.iter().map(|s| s.min_time_nanos).collect(),
            max_time: series.iter().map(|s| s.max_time_nanos).collect(),
            earliest: series
                .iter()
                .map(|s| s.min_time_nanos)
                .min()
                .unwrap_or(i64::MAX),
            latest: series
                .iter()
                .map(|s| s.max_time_nanos)
                .max()
                .unwrap_or(i64::MIN),
        }
    }

    /// Series in the index.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it indexes no series.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Series with samples in `[start, end)`.
    pub fn in_range(&self, start_nanos: i64, end_nanos: i64) -> FixedBitSet {
        let mut out = FixedBitSet::with_capacity(self.len);
        if self.earliest >= start_nanos && self.latest < end_nanos {
            out.insert_range(..);
            return out;
        }
        for i in 0..self.len {
            if self.min_time[i] < end_nanos && self.max_time[i] >= start_nanos {
                out.insert(i);
            }
        }
        out
    }

    /// Series a matcher accepts.
    pub fn matching(&self, m: &Matcher) -> FixedBitSet {
        match self.names.get(m.name.as_str()) {
            Some(p) => p.matching(m, self.len),
            None => {
                let mut out = FixedBitSet::with_capacity(self.len);
                if m.matches("") {
                    out.insert_range(..);
                }
                out
            }
        }
    }

    /// Series every matcher of `selector` accepts.
    pub fn selector(&self, selector: &Selector) -> FixedBitSet {
        // Equalities first: they are the narrowest and cost a binary search.
        let mut matchers: Vec<&Matcher> = selector.matchers.iter().collect();
        matchers.sort_by_key(|m| m.op != MatchOp::Equal || m.value.is_empty());
        let mut out: Option<FixedBitSet> = None;
        for m in matchers {
            let set = self.matching(m);
            match &mut out {
                None => out = Some(set),
                Some(o) => o.intersect_with(&set),
            }
            if out.as_ref().is_some_and(|o| o.is_clear()) {
                break;
            }
        }
        out.unwrap_or_else(|| {
            let mut all = FixedBitSet::with_capacity(self.len);
            all.insert_range(..);
            all
        })
    }

    /// Series in `[start, end)` that any of `selectors` accepts (every series in range when
    /// there is none).
    pub fn select(&self, selectors: &[Selector], start_nanos: i64, end_nanos: i64) -> FixedBitSet {
        let mut out = self.in_range(start_nanos, end_nanos);
        if out.is_clear() || selectors.is_empty() {
            return out;
        }
        let mut any = FixedBitSet::with_capacity(self.len);
        for s in selectors {
            any.union_with(&self.selector(s));
        }
        out.intersect_with(&any);
        out
    }

    /// Label names (with `__profile_type__`) that a series of `set` carries.
    pub fn names_in<'a>(&'a self, set: &'a FixedBitSet) -> impl Iterator<Item = &'a str> + 'a {
        self.names
            .iter()
            .filter(move |(_, p)| !p.present.is_disjoint(set))
            .map(|(k, _)| &**k)
    }

    /// Series whose label `name` is `value`.
    pub fn with_value(&self, name: &str, value: &str) -> FixedBitSet {
        let mut out = FixedBitSet::with_capacity(self.len);
        if let Some(p) = self.names.get(name)
            && let Ok(v) = p.values.binary_search_by(|x| (**x).cmp(value))
        {
            out.extend(p.group(v).iter().map(|&s| s as usize));
        }
        out
    }

    /// Values of label `name` that a series of `set` carries, sorted.
    pub fn values_in<'a>(
        &'a self,
        name: &str,
        set: &'a FixedBitSet,
    ) -> impl Iterator<Item = &'a str> + 'a {
        let p = self.names.get(name);
        let whole = p.is_some_and(|p| p.present.is_subset(set));
        p.into_iter().flat_map(move |p| {
            p.values
                .iter()
                .enumerate()
                .filter(move |(v, _)| {
                    whole || p.group(*v).iter().any(|&s| set.contains(s as usize))
                })
                .map(|(_, value)| &**value)
        })
    }
}
