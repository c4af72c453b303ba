use crate::format::series_labels::SeriesMeta;
use crate::selector::{MatchOp, Matcher, Selector};

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
    proptest::collection::vec((labels, prop::bool::ANY, 0i64..50, 0i64..50), 0..40).prop_map(|v| {
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
    })
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
