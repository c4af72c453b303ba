//! An inverted index of one block's series (ADR 0017): for each label name (and the synthetic
//! `__profile_type__`), its distinct values, sorted, each with the ascending ids of the series
//! that carry it, and the set of series that carry the name at all. Selectors become sets of
//! series ids ([`SeriesIndex::select`]) by judging each distinct value once rather than each
//! series' labels, and label names and values are read from the sets rather than from every
//! series. Built once per block, when the metastore entry is first decoded, and kept with it.

use std::collections::BTreeMap;

use fixedbitset::FixedBitSet;

use crate::format::meta::SeriesMeta;
use crate::selector::{MatchOp, Matcher, Selector};

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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::selector::parse_selector;

    fn series(labels: &[(&str, &str)], ptype: &str, t: (i64, i64)) -> SeriesMeta {
        SeriesMeta {
            labels: labels.iter().copied().collect(),
            profile_type: ptype.into(),
            min_time_nanos: t.0,
            max_time_nanos: t.1,
            first_row: 0,
            rows: 1,
        }
    }

    /// The naive answer: each series' labels judged by the selector.
    fn naive(all: &[SeriesMeta], selectors: &[Selector], start: i64, end: i64) -> Vec<usize> {
        all.iter()
            .enumerate()
            .filter(|(_, s)| {
                s.overlaps(start, end)
                    && (selectors.is_empty()
                        || selectors.iter().any(|sel| {
                            sel.matches(|n| {
                                if n == PROFILE_TYPE_LABEL {
                                    Some(&*s.profile_type)
                                } else {
                                    s.label(n)
                                }
                            })
                        }))
            })
            .map(|(i, _)| i)
            .collect()
    }

    #[test]
    fn selects_as_the_labels_do() {
        let all = vec![
            series(&[("service_name", "a"), ("pod", "1")], "cpu", (0, 10)),
            series(&[("service_name", "a"), ("pod", "2")], "mem", (5, 20)),
            series(&[("service_name", "b")], "cpu", (30, 40)),
        ];
        let idx = SeriesIndex::build(&all);
        for (sel, want) in [
            (r#"{service_name="a"}"#, vec![0, 1]),
            (r#"{pod=""}"#, vec![2]),
            (r#"{pod!=""}"#, vec![0, 1]),
            (r#"{pod=~"1|3"}"#, vec![0]),
            (r#"{pod!~"1"}"#, vec![1, 2]),
            (r#"{__profile_type__="cpu", service_name="a"}"#, vec![0]),
            (r#"{missing="x"}"#, vec![]),
            (r#"{missing=""}"#, vec![0, 1, 2]),
            ("{}", vec![0, 1, 2]),
        ] {
            let s = vec![parse_selector(sel).unwrap()];
            let got: Vec<usize> = idx.select(&s, i64::MIN, i64::MAX).ones().collect();
            assert_eq!(got, want, "{sel}");
        }
        let range: Vec<usize> = idx.select(&[], 15, 31).ones().collect();
        assert_eq!(range, [1, 2]);
        let set = idx.select(&[parse_selector(r#"{service_name="b"}"#).unwrap()], 0, 100);
        assert_eq!(
            idx.names_in(&set).collect::<Vec<_>>(),
            [PROFILE_TYPE_LABEL, "service_name"]
        );
        let set = idx.select(&[], 0, 100);
        assert_eq!(idx.values_in("pod", &set).collect::<Vec<_>>(), ["1", "2"]);
        let set = idx.select(&[], 11, 100);
        assert_eq!(idx.values_in("pod", &set).collect::<Vec<_>>(), ["2"]);
        assert_eq!(idx.values_in("nope", &set).count(), 0);
    }

    fn arb_series() -> impl Strategy<Value = Vec<SeriesMeta>> {
        let labels = proptest::collection::vec(
            (prop::sample::select(vec!["a", "b", "c"]), "[xyz]{0,2}"),
            0..4,
        );
        proptest::collection::vec((labels, prop::bool::ANY, 0i64..50, 0i64..50), 0..40).prop_map(
            |v| {
                v.into_iter()
                    .map(|(labels, cpu, t0, len)| {
                        let mut labels: Vec<(String, String)> = labels
                            .into_iter()
                            .filter(|(_, v)| !v.is_empty())
                            .map(|(k, v)| (k.to_owned(), v))
                            .collect();
                        labels.sort();
                        labels.dedup_by(|a, b| a.0 == b.0);
                        SeriesMeta {
                            labels: labels.into_iter().collect(),
                            profile_type: if cpu { "cpu" } else { "mem" }.into(),
                            min_time_nanos: t0,
                            max_time_nanos: t0 + len,
                            first_row: 0,
                            rows: 1,
                        }
                    })
                    .collect()
            },
        )
    }

    fn arb_selector() -> impl Strategy<Value = Selector> {
        let m = (
            prop::sample::select(vec!["a", "b", "c", "__profile_type__", "d"]),
            prop::sample::select(vec![
                MatchOp::Equal,
                MatchOp::NotEqual,
                MatchOp::Regex,
                MatchOp::NotRegex,
            ]),
            prop::sample::select(vec!["", "x", "y", "xy", "x.*", "cpu", ".+"]),
        )
            .prop_map(|(n, op, v)| Matcher::new(n, op, v).unwrap());
        proptest::collection::vec(m, 0..3).prop_map(|matchers| Selector { matchers })
    }

    proptest! {
        /// The index selects, and names the labels and values of, exactly what judging each
        /// series' labels does.
        #[test]
        fn agrees_with_the_naive_model(
            all in arb_series(),
            selectors in proptest::collection::vec(arb_selector(), 0..3),
            start in 0i64..60,
            width in 0i64..60,
        ) {
            let idx = SeriesIndex::build(&all);
            let end = start + width;
            let want = naive(&all, &selectors, start, end);
            let set = idx.select(&selectors, start, end);
            prop_assert_eq!(set.ones().collect::<Vec<_>>(), want.clone());
            let mut names = std::collections::BTreeSet::new();
            let mut values = std::collections::BTreeSet::new();
            for &i in &want {
                names.insert(PROFILE_TYPE_LABEL.to_owned());
                for (k, v) in all[i].labels.iter() {
                    names.insert(k.to_owned());
                    if k == "a" {
                        values.insert(v.to_owned());
                    }
                }
            }
            prop_assert_eq!(idx.names_in(&set).map(str::to_owned).collect::<std::collections::BTreeSet<_>>(), names);
            prop_assert_eq!(idx.values_in("a", &set).map(str::to_owned).collect::<std::collections::BTreeSet<_>>(), values);
        }
    }
}
