use crate::query::frame_filter::FrameFilter;
use kiln_proto::flamegraph::{self};
use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

fn tree(stacks: &[(&[&str], i64)]) -> FlameTree {
    let mut t = FlameTree::default();
    for (s, v) in stacks {
        t.add_stack(s.iter().copied(), *v);
    }
    t
}

/// Child lists read before the tree grows are made again after it grew, in insertion order.
#[test]
fn child_lists_follow_a_growing_tree() {
    let mut t = tree(&[(&["main", "a"], 1)]);
    let main = t.find_child(0, t.find_name("main").unwrap()).unwrap();
    let names = |t: &FlameTree, n: u32| -> Vec<String> {
        t.children(n)
            .iter()
            .map(|&c| t.name_str(t.node_name(c)).to_owned())
            .collect()
    };
    assert_eq!(names(&t, main), ["a"]);
    t.add_stack(["main", "b"], 2);
    t.add_stack(["other", "c"], 3);
    assert_eq!(names(&t, main), ["a", "b"]);
    assert_eq!(names(&t, 0), ["main", "other"]);
    let mut merged = FlameTree::default();
    assert!(merged.children(0).is_empty());
    merged.merge(&t);
    assert_eq!(names(&merged, 0), ["main", "other"]);
    assert_eq!(merged.stacks(), t.stacks());
}

#[test]
fn focus_keeps_the_stacks_through_a_call_site() {
    let t = tree(&[
        (&["main", "a", "x"], 5),
        (&["main", "a"], 2),
        (&["main", "b"], 3),
        (&["main"], 1),
    ]);
    let f = t.clone().focus(&["main", "a"]);
    assert_eq!(f.total(), 7);
    let stacks = f.stacks();
    assert_eq!(stacks.len(), 2);
    assert_eq!(
        stacks[&vec!["main".to_owned(), "a".to_owned(), "x".to_owned()]],
        5
    );
    assert_eq!(stacks[&vec!["main".to_owned(), "a".to_owned()]], 2);
    assert_eq!(t.clone().focus(&["main", "zzz"]).total(), 0);
    assert_eq!(t.clone().focus(&[]).stacks(), t.stacks());
}

proptest! {
    /// A call site selects exactly the stacks that start with it, and the refinements of
    /// a level's nodes add up to the whole graph (what progressive flame graphs rely on).
    #[test]
    fn call_site_refinements_add_up(stacks in prop::collection::vec(
        (prop::collection::vec(0u8..4, 1..6), 1i64..100), 1..60)
    ) {
        let mut t = FlameTree::default();
        for (frames, v) in &stacks {
            let names: Vec<String> = frames.iter().map(|f| format!("f{f}")).collect();
            t.add_stack(names.iter().map(String::as_str), *v);
        }
        let all = t.stacks();
        let mut sum: BTreeMap<Vec<String>, i64> = BTreeMap::new();
        for child in (0u8..4).map(|f| format!("f{f}")) {
            for (k, v) in t.clone().focus(&[child.as_str()]).stacks() {
                *sum.entry(k).or_default() += v;
            }
        }
        prop_assert_eq!(&sum, &all);
        for path in all.keys() {
            for depth in 1..=path.len() {
                let site: Vec<&str> = path[..depth].iter().map(String::as_str).collect();
                let focused = t.clone().focus(&site).stacks();
                let expected: BTreeMap<Vec<String>, i64> = all
                    .iter()
                    .filter(|(k, _)| k.starts_with(&path[..depth]))
                    .map(|(k, v)| (k.clone(), *v))
                    .collect();
                prop_assert_eq!(&focused, &expected);
                prop_assert_eq!(t.clone().focus(&site).total(), expected.values().sum::<i64>());
            }
        }
    }
}

#[test]
fn encodes_like_pyroscope() {
    let t = tree(&[(&["main", "a"], 3), (&["main", "b"], 5), (&["main"], 2)]);
    let fg = t.to_flamegraph(8192);
    assert_eq!(fg.names, ["total", "main", "a", "b"]);
    assert_eq!(fg.total, 10);
    assert_eq!(fg.max_self, 5);
    assert_eq!(fg.levels[0].values, [0, 10, 0, 0]);
    assert_eq!(fg.levels[1].values, [0, 10, 2, 1]);
    // main's self (2) comes first, then a at x=2, b right after it (delta 0).
    assert_eq!(fg.levels[2].values, [2, 3, 3, 2, 0, 5, 5, 3]);
}

#[test]
fn max_nodes_folds_small_nodes_into_other() {
    let t = tree(&[
        (&["main", "big"], 100),
        (&["main", "small1"], 1),
        (&["main", "small2"], 2),
    ]);
    let fg = t.to_flamegraph(2);
    let stacks = flamegraph_stacks(&fg).unwrap();
    assert_eq!(
        stacks.get(&vec!["main".to_string(), "big".to_string()]),
        Some(&100)
    );
    assert_eq!(
        stacks.get(&vec!["main".to_string(), "other".to_string()]),
        Some(&3)
    );
    assert_eq!(fg.total, 103);
}

fn read_uvarint(b: &[u8], at: &mut usize) -> u64 {
    let (mut v, mut shift) = (0u64, 0);
    loop {
        let byte = b[*at];
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return v;
        }
        shift += 7;
    }
}

/// Reads Pyroscope's tree bytes back: root-first stacks (without the nameless root) with
/// their self values, and the number of nodes below the root.
fn read_tree(b: &[u8]) -> (BTreeMap<Vec<String>, i64>, usize) {
    let mut stacks = BTreeMap::new();
    let mut nodes = 0;
    let mut at = 0;
    // (path of a node, how many of its children are still to come)
    let mut open: Vec<(Vec<String>, u64)> = vec![(Vec::new(), u64::from(!b.is_empty()))];
    let mut root = true;
    while let Some((path, left)) = open.last_mut() {
        if *left == 0 {
            open.pop();
            continue;
        }
        *left -= 1;
        let mut path = path.clone();
        let len = read_uvarint(b, &mut at) as usize;
        let name = std::str::from_utf8(&b[at..at + len]).unwrap().to_owned();
        at += len;
        let self_value = read_uvarint(b, &mut at) as i64;
        let children = read_uvarint(b, &mut at);
        if root {
            assert!(name.is_empty());
            root = false;
        } else {
            path.push(name);
            nodes += 1;
        }
        if self_value != 0 {
            *stacks.entry(path.clone()).or_insert(0) += self_value;
        }
        open.push((path, children));
    }
    assert_eq!(at, b.len(), "trailing bytes");
    (stacks, nodes)
}

#[test]
fn tree_bytes_are_pyroscopes() {
    let t = tree(&[(&["main", "a"], 3), (&["main", "b"], 5), (&["main"], 2)]);
    let mut want = vec![0u8, 0, 1];
    want.extend([4]);
    want.extend(b"main");
    want.extend([2, 2]);
    // Children come last name first.
    want.extend([1, b'b', 5, 0, 1, b'a', 3, 0]);
    assert_eq!(t.to_tree_bytes(8192), want);
    assert!(FlameTree::default().to_tree_bytes(10).is_empty());
}

#[test]
fn tree_bytes_fold_small_nodes_into_other() {
    let t = tree(&[
        (&["main", "big"], 100),
        (&["main", "small1"], 1),
        (&["main", "small2"], 2),
    ]);
    let mut want = vec![0u8, 0, 1, 4];
    want.extend(b"main");
    want.extend([0, 2, 5]);
    want.extend(b"other");
    want.extend([3, 0, 3]);
    want.extend(b"big");
    want.extend([100, 0]);
    assert_eq!(t.to_tree_bytes(2), want);
    // A function called `other` is kept and takes what its siblings lose.
    let t = tree(&[
        (&["main", "other", "x"], 50),
        (&["main", "big"], 100),
        (&["main", "tiny"], 1),
    ]);
    let (stacks, _) = read_tree(&t.to_tree_bytes(3));
    let s = |p: &[&str]| p.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(stacks[&s(&["main", "other"])], 1);
    assert_eq!(stacks[&s(&["main", "other", "x"])], 50);
    assert_eq!(stacks[&s(&["main", "big"])], 100);
    assert_eq!(stacks.values().sum::<i64>(), 151);
}

proptest! {
    /// The tree bytes read back are the tree's stacks; with a budget, the total is kept and
    /// at most the budget's nodes are written, besides `other` leaves.
    #[test]
    fn tree_bytes_round_trip(stacks in prop::collection::vec(
        (prop::collection::vec(prop::sample::select(vec!["a", "b", "c", "d", "é"]), 1..6), 1i64..1000),
        0..40), budget in 1usize..12)
    {
        let mut t = FlameTree::default();
        for (s, v) in &stacks {
            t.add_stack(s.iter().copied(), *v);
        }
        let (all, nodes) = read_tree(&t.to_tree_bytes(1 << 20));
        prop_assert_eq!(&all, &t.stacks());
        prop_assert_eq!(nodes, t.node_count());
        let (cut, _) = read_tree(&t.to_tree_bytes(budget));
        prop_assert_eq!(cut.values().sum::<i64>(), t.total());
        let min = t.min_value(budget);
        let above = t.nodes[1..].iter().filter(|n| n.total >= min).count();
        let named = cut.keys().flat_map(|k| k.iter().enumerate().map(move |(i, _)| k[..=i].to_vec()))
            .filter(|p| p.last().is_some_and(|n| n != OTHER_NAME))
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        prop_assert!(named <= above, "{} named nodes, {} at or above the threshold", named, above);
    }
}

/// Pyroscope's frame filter cases on a tree, with call_site after it, as the querier
/// applies them: whole stacks, totals summed again.
#[test]
fn frame_filters_keep_whole_stacks() {
    let t = tree(&[
        (&["root", "a"], 1),
        (&["root", "a", "b"], 1),
        (&["root", "b"], 1),
        (&["root", "forbidden"], 1),
        (&["root", "a", "forbidden"], 1),
    ]);
    let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
    let f = |inc: &[&str], exc: &[&str]| {
        FrameFilter::new(&s(inc), &s(exc), &[], &[])
            .unwrap()
            .unwrap()
    };
    let kept = t.retain_frames(&f(&["a"], &["forbidden"]));
    assert_eq!(kept.total(), 2);
    let stacks: Vec<Vec<String>> = kept.stacks().into_keys().collect();
    assert_eq!(stacks, [s(&["root", "a"]), s(&["root", "a", "b"])]);
    // The kept tree's totals are its own: `a` holds 2, `root` 2, nothing else is left.
    let fg = kept.to_flamegraph(100);
    assert_eq!(fg.total, 2);
    assert!(!fg.names.iter().any(|n| n == "forbidden"), "{:?}", fg.names);
    // With call_site [root, a] after it: only b's stack.
    assert_eq!(
        t.retain_frames(&f(&["b"], &[]))
            .focus(&["root", "a"])
            .total(),
        1
    );
    assert_eq!(t.retain_frames(&f(&["missing"], &[])).total(), 0);
    assert_eq!(t.retain_frames(&f(&[], &["forbidden"])).total(), 3);
}

#[test]
fn empty_tree_has_a_root() {
    let fg = FlameTree::default().to_flamegraph(10);
    assert_eq!(fg.total, 0);
    assert_eq!(fg.names, ["total"]);
    assert_eq!(fg.levels.len(), 1);
}

proptest! {
    /// Decoding the levels back gives exactly the stacks that went in.
    #[test]
    fn round_trip(stacks in prop::collection::vec(
        (prop::collection::vec(prop::sample::select(vec!["a", "b", "c", "d", "other2"]), 1..6), 1i64..1000),
        0..40)
    ) {
        let mut t = FlameTree::default();
        let mut want: BTreeMap<Vec<String>, i64> = BTreeMap::new();
        for (s, v) in &stacks {
            t.add_stack(s.iter().copied(), *v);
            *want.entry(s.iter().map(|x| x.to_string()).collect()).or_insert(0) += v;
        }
        let fg = t.to_flamegraph(1 << 20);
        prop_assert_eq!(fg.total, want.values().sum::<i64>());
        let got = flamegraph_stacks(&fg).unwrap();
        prop_assert_eq!(&got, &want);
        prop_assert_eq!(t.stacks(), want);
    }

    /// Trees merged draw the same flame graph as one tree of all their stacks, whatever
    /// tree each stack went into (as blocks fold into whichever worker's tree is free).
    #[test]
    fn merged_trees_are_one_tree(stacks in prop::collection::vec(
        (prop::collection::vec(prop::sample::select(vec!["a", "b", "c", "other", "total"]), 0..5),
         -50i64..1000, 0usize..3),
        0..40)
    ) {
        let mut one = FlameTree::default();
        let mut parts = vec![FlameTree::default(), FlameTree::default(), FlameTree::default()];
        for (s, v, part) in &stacks {
            one.add_stack(s.iter().copied(), *v);
            parts[*part].add_stack(s.iter().copied(), *v);
        }
        let merged = FlameTree::merged(parts);
        prop_assert_eq!(merged.stacks(), one.stacks());
        prop_assert_eq!(merged.to_flamegraph(1 << 20), one.to_flamegraph(1 << 20));
        prop_assert_eq!(merged.to_flamegraph(3), one.to_flamegraph(3));
        prop_assert_eq!(merged.to_tree_bytes(4), one.to_tree_bytes(4));
    }

    /// With a node budget, totals are kept and no more than the budget (plus `other` nodes) is drawn.
    #[test]
    fn truncation_keeps_totals(stacks in prop::collection::vec(
        (prop::collection::vec(prop::sample::select(vec!["a", "b", "c", "d", "e"]), 1..5), 1i64..1000),
        1..40), budget in 1usize..10)
    {
        let mut t = FlameTree::default();
        for (s, v) in &stacks {
            t.add_stack(s.iter().copied(), *v);
        }
        let fg = t.to_flamegraph(budget);
        let got = flamegraph_stacks(&fg).unwrap();
        prop_assert_eq!(got.values().sum::<i64>(), t.total());
        prop_assert_eq!(fg.levels[1].values.chunks(4).map(|n| n[1]).sum::<i64>(), t.total());
    }

    /// The shared decoder reads what `to_flamegraph` writes as a tree: every node's total is
    /// its self value plus its children's totals, truncated or not.
    #[test]
    fn decoded_totals_add_up(stacks in prop::collection::vec(
        (prop::collection::vec(prop::sample::select(vec!["a", "b", "c", "d", "e"]), 1..5), 1i64..1000),
        0..40), budget in prop::sample::select(vec![1usize, 3, 8, 1 << 20]))
    {
        let mut t = FlameTree::default();
        for (s, v) in &stacks {
            t.add_stack(s.iter().copied(), *v);
        }
        let fg = t.to_flamegraph(budget);
        let nodes = flamegraph::decode(&fg).unwrap();
        prop_assert_eq!(nodes.len(), fg.levels.iter().map(|l| l.values.len() / 4).sum::<usize>());
        let mut children = vec![0i64; nodes.len()];
        for n in &nodes {
            if let Some(p) = n.parent {
                children[p] += n.total;
            }
        }
        for (n, c) in nodes.iter().zip(children) {
            prop_assert_eq!(n.total, n.self_value + c);
        }
        prop_assert_eq!(nodes[0].total, t.total());
        prop_assert_eq!(nodes.iter().map(|n| n.self_value).max().unwrap_or(0), fg.max_self);
    }
}
