use kiln_proto::google::v1 as pb;
use std::collections::HashMap;

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

/// A profile of root-first stacks, one location and function per frame name (the
/// `inlined` name shares its caller's location, innermost first).
fn profile(stacks: &[(Vec<&str>, i64)]) -> pb::Profile {
    let mut p = pb::Profile {
        string_table: vec!["".into(), "cpu".into(), "nanoseconds".into()],
        sample_type: vec![pb::ValueType { r#type: 1, unit: 2 }],
        ..Default::default()
    };
    let mut functions: HashMap<String, u64> = HashMap::new();
    for (stack, value) in stacks {
        let mut ids = Vec::new();
        for name in stack {
            let f = *functions.entry((*name).to_owned()).or_insert_with(|| {
                p.string_table.push((*name).to_owned());
                let id = p.function.len() as u64 + 1;
                p.function.push(pb::Function {
                    id,
                    name: p.string_table.len() as i64 - 1,
                    ..Default::default()
                });
                p.location.push(pb::Location {
                    id,
                    line: vec![pb::Line {
                        function_id: id,
                        line: 1,
                    }],
                    ..Default::default()
                });
                id
            });
            ids.push(f);
        }
        ids.reverse();
        p.sample.push(pb::Sample {
            location_id: ids,
            value: vec![*value],
            label: Vec::new(),
        });
    }
    p
}

/// Root-first function names of every sample, with the values of alike stacks added.
fn stacks(p: &pb::Profile) -> BTreeMap<Vec<String>, i64> {
    let mut out = BTreeMap::new();
    for s in &p.sample {
        let mut names: Vec<String> = Vec::new();
        for id in &s.location_id {
            let l = p.location.iter().find(|l| l.id == *id).expect("a location");
            for line in &l.line {
                let f = p
                    .function
                    .iter()
                    .find(|f| f.id == line.function_id)
                    .expect("a function");
                names.push(p.string_table[f.name as usize].clone());
            }
        }
        names.reverse();
        *out.entry(names).or_insert(0) += s.value[0];
    }
    out
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn cuts_below_the_threshold_and_keeps_values() {
    let mut p = profile(&[
        (vec!["main", "big", "leaf"], 100),
        (vec!["main", "small1", "x"], 1),
        (vec!["main", "small2"], 2),
        (vec!["gc"], 1),
    ]);
    let before = p.clone();
    truncate(&mut p, 0);
    assert_eq!(p, before, "no budget: untouched");
    truncate(&mut p, 1000);
    assert_eq!(p, before, "a budget above the tree's size: untouched");

    // main 103, big 100, leaf 100: the third largest is 100.
    truncate(&mut p, 3);
    let got = stacks(&p);
    assert_eq!(got[&names(&["main", "big", "leaf"])], 100);
    assert_eq!(got[&names(&["main", "other"])], 3, "small1, x and small2");
    assert_eq!(got[&names(&["other"])], 1, "gc, whose root is cut");
    assert_eq!(got.len(), 3);
    let mut fns: Vec<&str> = p
        .function
        .iter()
        .map(|f| p.string_table[f.name as usize].as_str())
        .collect();
    fns.sort_unstable();
    assert_eq!(fns, ["big", "leaf", "main", "other"]);
    // Unused strings are gone, ids are dense.
    assert_eq!(p.string_table.len(), 3 + 4);
    assert_eq!(
        p.location.iter().map(|l| l.id).collect::<Vec<_>>(),
        (1..=p.location.len() as u64).collect::<Vec<_>>()
    );
    assert_eq!(p.string_table[p.sample_type[0].r#type as usize], "cpu");
}

#[test]
fn a_location_is_never_split() {
    // `a` has `inl` inlined into it: one location, lines innermost first.
    let mut p = profile(&[(vec!["main", "a"], 10), (vec!["main", "b"], 1)]);
    p.string_table.push("inl".into());
    p.function.push(pb::Function {
        id: 9,
        name: p.string_table.len() as i64 - 1,
        ..Default::default()
    });
    let a = p.location.iter_mut().find(|l| l.id == 2).unwrap();
    a.line.insert(
        0,
        pb::Line {
            function_id: 9,
            line: 3,
        },
    );
    truncate(&mut p, 2);
    let got = stacks(&p);
    assert_eq!(got[&names(&["main", "a", "inl"])], 10);
    assert_eq!(got[&names(&["main", "other"])], 1);
}

proptest! {
    /// Truncation keeps every value, and what it keeps of each stack is a root-side part of
    /// it, made only of call-tree nodes at or above the threshold, then `other`.
    #[test]
    fn keeps_values_and_the_heaviest_nodes(
        input in prop::collection::vec(
            (prop::collection::vec(prop::sample::select(vec!["a", "b", "c", "d", "e"]), 1..6), 1i64..1000),
            1..40),
        budget in 1usize..12,
    ) {
        let input: Vec<(Vec<&str>, i64)> = input;
        let mut p = profile(&input);
        let mut all: BTreeMap<Vec<String>, i64> = BTreeMap::new();
        let mut totals: BTreeMap<Vec<String>, i64> = BTreeMap::new();
        for (s, v) in &input {
            *all.entry(names(s)).or_default() += v;
            for depth in 1..=s.len() {
                *totals.entry(names(&s[..depth])).or_default() += v;
            }
        }
        truncate(&mut p, budget);
        let got = stacks(&p);
        prop_assert_eq!(got.values().sum::<i64>(), all.values().sum::<i64>());
        let mut sorted: Vec<i64> = totals.values().copied().collect();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let min = if sorted.len() <= budget { 0 } else { sorted[budget - 1] };
        for stack in got.keys() {
            let named = match stack.last() {
                Some(last) if last == TRUNCATED_NAME => &stack[..stack.len() - 1],
                _ => &stack[..],
            };
            for depth in 1..=named.len() {
                prop_assert!(totals[&named[..depth]] >= min, "{:?} is under {}", named, min);
            }
            prop_assert!(all.keys().any(|k| k.starts_with(named)));
        }
        for s in &p.sample {
            for id in &s.location_id {
                prop_assert!(*id >= 1 && *id as usize <= p.location.len());
            }
        }
    }
}

/// A profile of one stack (`main` calling `leaf`, root last) and its value; `extra` names a
/// string the other profile lacks, so the two string tables differ.
fn one_stack(extra: &str, value: i64) -> pb::Profile {
    let strings = ["", extra, "cpu", "nanoseconds", "main", "leaf"];
    pb::Profile {
        string_table: strings.iter().map(|s| s.to_string()).collect(),
        sample_type: vec![pb::ValueType { r#type: 2, unit: 3 }],
        function: vec![
            pb::Function {
                id: 7,
                name: 4,
                ..Default::default()
            },
            pb::Function {
                id: 9,
                name: 5,
                ..Default::default()
            },
        ],
        location: vec![
            pb::Location {
                id: 1,
                line: vec![pb::Line {
                    function_id: 9,
                    line: 0,
                }],
                ..Default::default()
            },
            pb::Location {
                id: 2,
                line: vec![pb::Line {
                    function_id: 7,
                    line: 0,
                }],
                ..Default::default()
            },
        ],
        sample: vec![pb::Sample {
            location_id: vec![1, 2],
            value: vec![value],
            label: vec![],
        }],
        time_nanos: 1_000,
        duration_nanos: 10,
        ..Default::default()
    }
}

#[test]
fn profiles_merge_by_content() {
    let merged = merge(vec![one_stack("x", 3), one_stack("y", 4)]);
    assert_eq!(merged.function.len(), 2);
    assert_eq!(merged.location.len(), 2);
    assert_eq!(merged.sample.len(), 1);
    assert_eq!(merged.sample[0].value, vec![7]);
    let name = |loc: u64| {
        let l = merged.location.iter().find(|l| l.id == loc).unwrap();
        let f = merged
            .function
            .iter()
            .find(|f| f.id == l.line[0].function_id)
            .unwrap();
        merged.string_table[f.name as usize].clone()
    };
    let stack: Vec<String> = merged.sample[0]
        .location_id
        .iter()
        .map(|&l| name(l))
        .collect();
    assert_eq!(stack, ["leaf", "main"]);
    assert_eq!(
        merged.string_table[merged.sample_type[0].r#type as usize],
        "cpu"
    );
    assert_eq!((merged.time_nanos, merged.duration_nanos), (1_000, 10));
}
