use std::collections::BTreeMap;

use kiln_otel::model::ProfileType;
use kiln_proto::querier::v1::{FlameGraph, Level};
use kiln_proto::types::v1::Point;
use kiln_storage::query::FlameTree;
use kiln_storage::query::tree::flamegraph_stacks;
use proptest::prelude::*;

use super::*;

const NOW: i64 = 1_700_000_000_000;
const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

#[test]
fn timelines_backfill_and_snap() {
    let point = |timestamp: i64, value: f64| Point {
        timestamp,
        value,
        ..Default::default()
    };
    // [t0 + 5 s, t0 + 65 s) in 15 s steps: snapped to [t0, t0 + 60 s), four samples.
    let t0 = NOW - NOW % 15_000;
    let t = flamebearer::Timeline::new(
        &[point(t0 + 5_000, 7.0), point(t0 + 35_000, 3.9)],
        t0 + 5_000,
        t0 + 65_000,
        15,
    );
    assert_eq!(t.start_time, t0 / 1_000);
    assert_eq!(t.duration_delta, 15);
    assert_eq!(t.samples, [7, 0, 3, 0]);
    let empty = flamebearer::Timeline::new(&[], t0, t0, 15);
    assert!(empty.samples.is_empty());
    assert_eq!(
        serde_json::to_value(&empty).unwrap(),
        serde_json::json!({"startTime": t0 / 1_000, "samples": [], "durationDelta": 15, "watermarks": null})
    );
}

fn tree(stacks: &[(&[&str], i64)]) -> FlameTree {
    let mut t = FlameTree::default();
    for (s, v) in stacks {
        t.add_stack(s.iter().copied(), *v);
    }
    t
}

fn cpu() -> ProfileType {
    ProfileType::parse(CPU).unwrap()
}

#[test]
fn single_flamebearer_has_pyroscopes_fields() {
    let t = tree(&[(&["main", "a"], 3), (&["main", "b"], 5), (&["main"], 2)]);
    let profile = flamebearer::single(&t.to_flamegraph(8192), &cpu());
    let json = serde_json::to_value(&profile).unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "version": 1,
            "flamebearer": {
                "names": ["total", "main", "a", "b"],
                "levels": [[0, 10, 0, 0], [0, 10, 2, 1], [2, 3, 3, 2, 0, 5, 5, 3]],
                "numTicks": 10,
                "maxSelf": 5
            },
            "metadata": {"format": "single", "spyName": "", "sampleRate": 1_000_000_000u32, "units": "samples", "name": "cpu"},
            "timeline": null,
            "groups": null,
            "heatmap": null
        })
    );
    let memory = ProfileType::parse("memory:alloc_space:bytes:space:bytes").unwrap();
    let m = flamebearer::single(&FlameGraph::default(), &memory).metadata;
    assert_eq!(
        (m.units.as_str(), m.sample_rate, m.name.as_str()),
        ("bytes", 100, "alloc_space")
    );
    let objects = ProfileType::parse("memory:alloc_objects:count:space:bytes").unwrap();
    assert_eq!(
        flamebearer::single(&FlameGraph::default(), &objects)
            .metadata
            .units,
        "objects"
    );
}

#[test]
fn diff_aligns_both_trees_as_pyroscope_encodes_them() {
    let left = tree(&[(&["main", "a"], 3), (&["main"], 1)]);
    let right = tree(&[(&["main", "b"], 5), (&["main", "a"], 1)]);
    let profile = flamebearer::diff(&left, &right, 0, &cpu()).unwrap();
    let json = serde_json::to_value(&profile).unwrap();
    // Names in the order Pyroscope meets them: rightmost child first.
    assert_eq!(
        json["flamebearer"],
        serde_json::json!({
            "names": ["total", "main", "b", "a"],
            "levels": [
                [0, 4, 0, 0, 6, 0, 0],
                [0, 4, 1, 0, 6, 0, 1],
                [1, 3, 3, 0, 1, 1, 3, 0, 0, 0, 0, 5, 5, 2]
            ],
            "numTicks": 10,
            "maxSelf": 5
        })
    );
    assert_eq!(json["metadata"]["format"], "double");
    assert_eq!(
        (json["leftTicks"].clone(), json["rightTicks"].clone()),
        (4.into(), 6.into())
    );
    assert_eq!(json["timeline"], serde_json::Value::Null);

    // An empty side has no ticks field, as Go's omitempty leaves it out.
    let only_right = flamebearer::diff(&FlameTree::default(), &right, 0, &cpu()).unwrap();
    let json = serde_json::to_value(&only_right).unwrap();
    assert!(json.get("leftTicks").is_none());
    assert_eq!(json["rightTicks"], 6);
}

#[test]
fn diff_folds_small_nodes_of_both_sides_into_other() {
    let left = tree(&[(&["main", "big"], 100), (&["main", "s1"], 1)]);
    let right = tree(&[(&["main", "big"], 90), (&["main", "s2"], 2)]);
    // Nodes: total, main, big, s1, s2; the three largest stay.
    let profile = flamebearer::diff(&left, &right, 3, &cpu()).unwrap();
    let fb = &profile.flamebearer;
    let last = &fb.levels[2];
    assert_eq!(last.len(), 14, "big and other: {fb:?}");
    let other = &last[7..];
    assert_eq!(fb.names[other[6] as usize], "other");
    assert_eq!((other[1], other[2], other[4], other[5]), (1, 1, 2, 2));
    assert_eq!((profile.left_ticks, profile.right_ticks), (101, 92));
}

/// One side of a diff as a single flame graph: its 4-tuples, nodes of zero total left out.
fn side(fb: &flamebearer::Flamebearer, right: bool) -> FlameGraph {
    let at = if right { 3 } else { 0 };
    let levels = fb
        .levels
        .iter()
        .map(|l| {
            let mut values = Vec::new();
            let (mut x, mut edge) = (0, 0);
            for n in l.chunks(7) {
                x += n[at];
                let (total, self_value) = (n[at + 1], n[at + 2]);
                if total > 0 {
                    values.extend([x - edge, total, self_value, n[6]]);
                    edge = x + total;
                }
                x += total;
            }
            Level { values }
        })
        .filter(|l| !l.values.is_empty())
        .collect();
    FlameGraph {
        names: fb.names.clone(),
        levels,
        total: 0,
        max_self: 0,
    }
}

fn stacks_strategy() -> impl Strategy<Value = Vec<(Vec<&'static str>, i64)>> {
    prop::collection::vec(
        (
            prop::collection::vec(prop::sample::select(vec!["a", "b", "c", "d"]), 1..5),
            1i64..1000,
        ),
        0..30,
    )
}

fn tree_of(stacks: &[(Vec<&str>, i64)]) -> FlameTree {
    let mut t = FlameTree::default();
    for (s, v) in stacks {
        t.add_stack(s.iter().copied(), *v);
    }
    t
}

proptest! {
    /// Each side of an untruncated diff decodes back to its own tree; truncated, totals hold.
    #[test]
    fn diff_sides_decode_to_their_trees(
        left in stacks_strategy(),
        right in stacks_strategy(),
        budget in prop::sample::select(vec![0usize, 2, 5, 1 << 20]),
    ) {
        let (l, r) = (tree_of(&left), tree_of(&right));
        let profile = flamebearer::diff(&l, &r, budget, &cpu()).unwrap();
        prop_assert_eq!(profile.left_ticks as i64, l.total());
        prop_assert_eq!(profile.right_ticks as i64, r.total());
        prop_assert_eq!(profile.flamebearer.num_ticks, l.total() + r.total());
        for (tree, is_right) in [(&l, false), (&r, true)] {
            let got = flamegraph_stacks(&side(&profile.flamebearer, is_right)).unwrap();
            if budget == 0 || budget == 1 << 20 {
                prop_assert_eq!(&got, &tree.stacks());
            }
            prop_assert_eq!(got.values().sum::<i64>(), tree.total());
        }
    }
}

fn dot_of(stacks: &[(&[&str], i64)], max_nodes: usize) -> String {
    let stacks: BTreeMap<Vec<String>, i64> = stacks
        .iter()
        .map(|(s, v)| (s.iter().map(|f| f.to_string()).collect(), *v))
        .collect();
    dot::render(
        &stacks,
        max_nodes,
        &dot::Meta {
            sample_type: "cpu",
            sample_unit: "nanoseconds",
            start_ms: NOW - 3_600_000,
            end_ms: NOW,
        },
    )
}

const SECOND: i64 = 1_000_000_000;

#[test]
fn dot_is_pprofs_call_graph() {
    let text = dot_of(
        &[
            (&["main", "a"], 3 * SECOND),
            (&["main", "b"], 5 * SECOND),
            (&["main"], 2 * SECOND),
        ],
        0,
    );
    let want = [
        r##"digraph "unnamed" {"##,
        r##"node [style=filled fillcolor="#f8f8f8"]"##,
        r##"subgraph cluster_L { "Type: cpu" [shape=box fontsize=16 label="Type: cpu\lTime: Nov 14, 2023 at 10:13pm (UTC)\lDuration: 1hrs, Total samples = 10s ( 0.28%)\lShowing nodes accounting for 10s, 100% of 10s total\l\lSee https://git.io/JfYMW for how to read the graph\l"] }"##,
        r##"N1 [label="main\n2s (20.00%)\nof 10s (100%)" id="node1" fontsize=19 shape=box tooltip="main (10s)" color="#b20000" fillcolor="#edd5d5"]"##,
        r##"N2 [label="b\n5s (50.00%)" id="node2" fontsize=24 shape=box tooltip="b (5s)" color="#b22100" fillcolor="#edd9d5"]"##,
        r##"N3 [label="a\n3s (30.00%)" id="node3" fontsize=21 shape=box tooltip="a (3s)" color="#b23600" fillcolor="#eddcd5"]"##,
        r##"N1 -> N2 [label=" 5s" weight=51 penwidth=3 color="#b22100" tooltip="main -> b (5s)" labeltooltip="main -> b (5s)"]"##,
        r##"N1 -> N3 [label=" 3s" weight=31 penwidth=2 color="#b23600" tooltip="main -> a (3s)" labeltooltip="main -> a (3s)"]"##,
        "}",
    ];
    assert_eq!(text.lines().collect::<Vec<_>>(), want, "{text}");
}

#[test]
fn dot_max_nodes_leaves_residual_edges() {
    // main → mid → leaf: with two nodes, mid goes and main reaches leaf by a dotted edge.
    let text = dot_of(
        &[
            (&["main", "mid", "leaf"], 8 * SECOND),
            (&["main", "other_leaf"], SECOND),
        ],
        2,
    );
    assert!(text.contains("Showing top 2 nodes out of 4"), "{text}");
    let nodes: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("N") && !l.contains("->"))
        .collect();
    assert_eq!(nodes.len(), 2, "{text}");
    assert!(text.contains(r#"tooltip="main ... leaf (8s)""#), "{text}");
    assert!(text.contains(r#"style="dotted""#), "{text}");
    assert!(!text.contains("mid"), "{text}");
}

#[test]
fn dot_drops_residual_edges_another_path_covers() {
    // x (the least interesting node) goes; main → leaf through it would be residual, but
    // main → a → leaf connects them already.
    let text = dot_of(
        &[
            (&["main", "x", "leaf"], 2 * SECOND),
            (&["main", "a", "leaf"], 5 * SECOND),
            (&["main", "a"], 10 * SECOND),
        ],
        3,
    );
    assert!(text.contains("Showing top 3 nodes out of 4"), "{text}");
    assert!(text.contains(r#"tooltip="main -> a (15s)""#), "{text}");
    assert!(text.contains(r#"tooltip="a -> leaf (5s)""#), "{text}");
    assert!(
        !text.contains("main ... leaf") && !text.contains("dotted"),
        "{text}"
    );
}

#[test]
fn dot_names_are_shortened_and_broken_into_lines() {
    for (name, short) in [
        (
            "github.com/grafana/pyroscope/pkg/model.(*Tree).Insert",
            "model.(*Tree).Insert",
        ),
        ("github.com/foo/bar/v2.Func", "bar.Func"),
        (
            "java.util.concurrent.ThreadPoolExecutor$Worker.run",
            "ThreadPoolExecutor$Worker.run",
        ),
        ("java.lang.Object.<init>", "Object.<init>"),
        ("ns::inner::Class::method<int>", "Class::method<int>"),
        ("(anonymous namespace)::Foo::bar", "Foo::bar"),
        ("main.main", "main.main"),
        ("std::vec::Vec<T>::push", "std::vec::Vec<T>::push"),
    ] {
        assert_eq!(dot::shorten(name), short, "{name}");
    }
    let text = dot_of(&[(&["runtime.main", "main.(*Server).Serve"], SECOND)], 0);
    assert!(
        text.contains(r#"label="main\n(*Server)\nServe\n1s (100%)""#),
        "{text}"
    );
    assert!(
        text.contains(r#"tooltip="main.(*Server).Serve (1s)""#),
        "{text}"
    );
}

#[test]
fn dot_formats_values_as_pprof() {
    let fmt = |v: i64, from: &str, to: &str| dot::scaled_label(v as f64, from, to);
    assert_eq!(fmt(1_500_000_000, "nanoseconds", ""), "1.50s");
    assert_eq!(fmt(1, "nanoseconds", ""), "0");
    assert_eq!(fmt(3_600_000_000_000, "nanoseconds", "auto"), "1hrs");
    assert_eq!(fmt(90_000_000_000, "nanoseconds", "auto"), "90s");
    assert_eq!(fmt(2048, "bytes", ""), "2048B");
    assert_eq!(fmt(3 << 20, "bytes", "auto"), "3MB");
    assert_eq!(fmt(42, "count", ""), "42");
    assert_eq!(dot::percentage(1.0, 3.0), "33.33%");
    assert_eq!(dot::percentage(1.0, 200.0), "  0.5%");
    assert_eq!(dot::percentage(1.0, 100_000_000.0), "1e-06%");
    assert_eq!(dot::percentage(3.0, 3.0), "  100%");
}
