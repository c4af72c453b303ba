use crate::querier::v1::FlameGraph;

use proptest::prelude::*;

use super::*;
use crate::querier::v1::Level;

fn fg(names: &[&str], levels: &[&[i64]]) -> FlameGraph {
    FlameGraph {
        names: names.iter().map(|n| n.to_string()).collect(),
        levels: levels
            .iter()
            .map(|l| Level { values: l.to_vec() })
            .collect(),
        total: 0,
        max_self: 0,
    }
}

/// total(10) -> main(10, self 2) -> a(3), b(5)
fn example() -> FlameGraph {
    fg(
        &["total", "main", "a", "b"],
        &[&[0, 10, 0, 0], &[0, 10, 2, 1], &[2, 3, 3, 2, 0, 5, 5, 3]],
    )
}

fn node(
    level: usize,
    offset: i64,
    total: i64,
    self_value: i64,
    name: usize,
    parent: Option<usize>,
) -> FlameNode {
    FlameNode {
        level,
        offset,
        total,
        self_value,
        name,
        parent,
    }
}

#[test]
fn decodes_offsets_and_parents() {
    assert_eq!(
        decode(&example()).unwrap(),
        [
            node(0, 0, 10, 0, 0, None),
            node(1, 0, 10, 2, 1, Some(0)),
            node(2, 2, 3, 3, 2, Some(1)),
            node(2, 5, 5, 5, 3, Some(1)),
        ]
    );
    assert_eq!(decode(&FlameGraph::default()).unwrap(), []);
}

#[test]
fn parents_by_containment_across_siblings() {
    // root(10) -> a(4) at 0, b(6) at 4; a -> c(4); b -> d(2) at 5, e(3) at 7.
    let g = fg(
        &["total", "a", "b", "c", "d", "e"],
        &[
            &[0, 10, 0, 0],
            &[0, 4, 0, 1, 0, 6, 1, 2],
            &[0, 4, 4, 3, 1, 2, 2, 4, 0, 3, 3, 5],
        ],
    );
    let nodes = decode(&g).unwrap();
    let parents: Vec<Option<usize>> = nodes.iter().map(|n| n.parent).collect();
    assert_eq!(parents, [None, Some(0), Some(0), Some(1), Some(2), Some(2)]);
    assert_eq!(nodes[5].offset, 7);
    assert_eq!(nodes[5].end(), 10);
}

#[test]
fn malformed_input_is_an_error() {
    let names = &["total", "a"][..];
    let cases: Vec<(FlameGraph, FlameGraphError)> = vec![
        (
            fg(names, &[&[0, 10, 0]]),
            FlameGraphError::Ragged { level: 0, len: 3 },
        ),
        (
            fg(names, &[&[0, 10, 0, 2]]),
            FlameGraphError::NameOutOfRange {
                level: 0,
                index: 2,
                names: 2,
            },
        ),
        (
            fg(names, &[&[0, 10, 0, -1]]),
            FlameGraphError::NameOutOfRange {
                level: 0,
                index: -1,
                names: 2,
            },
        ),
        (
            fg(names, &[&[0, -1, 0, 0]]),
            FlameGraphError::Negative {
                level: 0,
                field: "total",
                value: -1,
            },
        ),
        (
            fg(names, &[&[0, 10, 0, 0], &[-2, 3, 0, 1]]),
            FlameGraphError::Negative {
                level: 1,
                field: "x offset",
                value: -2,
            },
        ),
        (
            fg(names, &[&[0, 10, -3, 0]]),
            FlameGraphError::Negative {
                level: 0,
                field: "self",
                value: -3,
            },
        ),
        (
            fg(names, &[&[0, 10, 11, 0]]),
            FlameGraphError::SelfAboveTotal {
                level: 0,
                offset: 0,
                self_value: 11,
                total: 10,
            },
        ),
        (
            fg(names, &[&[0, i64::MAX, 0, 0, 1, 1, 0, 0]]),
            FlameGraphError::Overflow { level: 0 },
        ),
        (
            fg(names, &[&[0, 10, 0, 0], &[10, 1, 1, 1]]),
            FlameGraphError::NoParent {
                level: 1,
                offset: 10,
            },
        ),
        (
            fg(names, &[&[0, 10, 0, 0], &[], &[0, 1, 1, 1]]),
            FlameGraphError::NoParent {
                level: 2,
                offset: 0,
            },
        ),
        (
            fg(names, &[&[0, 10, 0, 0], &[8, 3, 3, 1]]),
            FlameGraphError::EscapesParent {
                level: 1,
                offset: 8,
            },
        ),
        (
            // Two roots side by side; the child starts in the gap between them.
            fg(names, &[&[0, 2, 2, 0, 3, 2, 2, 0], &[2, 2, 2, 1]]),
            FlameGraphError::EscapesParent {
                level: 1,
                offset: 2,
            },
        ),
    ];
    for (g, want) in cases {
        assert_eq!(decode(&g), Err(want), "{g:?}");
    }
}

/// A random tree: each node is (name index, self value, children).
#[derive(Debug, Clone)]
struct Tree(usize, i64, Vec<Tree>);

impl Tree {
    fn total(&self) -> i64 {
        self.1 + self.2.iter().map(Tree::total).sum::<i64>()
    }
}

fn tree() -> impl Strategy<Value = Tree> {
    // Self values of at least 1: a node of zero total has no span to find a parent by.
    let leaf = (0usize..4, 1i64..100).prop_map(|(n, s)| Tree(n, s, Vec::new()));
    leaf.prop_recursive(5, 64, 4, |inner| {
        (0usize..4, 1i64..100, prop::collection::vec(inner, 0..4))
            .prop_map(|(n, s, c)| Tree(n, s, c))
    })
}

/// A decoded node as a tuple: (level, offset, total, self, name, parent).
type Row = (usize, i64, i64, i64, usize, Option<usize>);

/// Encodes `t` as Pyroscope does (children after the parent's self value, left to right),
/// and lists the rows decoding must give, in level order.
fn encode(t: &Tree) -> (FlameGraph, Vec<Row>) {
    let mut levels: Vec<Vec<(i64, &Tree, Option<(usize, usize)>)>> = vec![vec![(0, t, None)]];
    while let Some(last) = levels.last().filter(|l| !l.is_empty()) {
        let mut next = Vec::new();
        for (i, &(offset, node, _)) in last.iter().enumerate() {
            let mut x = offset + node.1;
            for c in &node.2 {
                next.push((x, c, Some((levels.len() - 1, i))));
                x += c.total();
            }
        }
        levels.push(next);
    }
    levels.pop();
    let starts: Vec<usize> = levels
        .iter()
        .scan(0, |n, l| {
            let s = *n;
            *n += l.len();
            Some(s)
        })
        .collect();
    let mut want = Vec::new();
    let mut g = fg(&["total", "a", "b", "c"], &[]);
    for (d, level) in levels.iter().enumerate() {
        let mut values = Vec::new();
        let mut right = 0;
        for &(offset, node, parent) in level {
            let total = node.total();
            values.extend([offset - right, total, node.1, node.0 as i64]);
            right = offset + total;
            want.push((
                d,
                offset,
                total,
                node.1,
                node.0,
                parent.map(|(pd, pi)| starts[pd] + pi),
            ));
        }
        g.levels.push(Level { values });
    }
    (g, want)
}

proptest! {
    /// What an encoder writes decodes back to the same tree.
    #[test]
    fn round_trip(t in tree()) {
        let (g, want) = encode(&t);
        let got: Vec<Row> = decode(&g)
            .unwrap()
            .into_iter()
            .map(|n| (n.level, n.offset, n.total, n.self_value, n.name, n.parent))
            .collect();
        prop_assert_eq!(got, want);
    }

    /// Any input decodes or is refused; nothing panics, and what decodes is consistent.
    #[test]
    fn arbitrary_input_never_panics(
        names in 0usize..4,
        levels in prop::collection::vec(
            prop::collection::vec(
                prop_oneof![-2i64..20, Just(i64::MAX), Just(i64::MIN)],
                0..14,
            ),
            0..5,
        ),
    ) {
        let g = FlameGraph {
            names: (0..names).map(|i| i.to_string()).collect(),
            levels: levels.into_iter().map(|values| Level { values }).collect(),
            total: 0,
            max_self: 0,
        };
        if let Ok(nodes) = decode(&g) {
            for (i, n) in nodes.iter().enumerate() {
                prop_assert!(n.name < names && n.self_value <= n.total);
                match n.parent {
                    None => prop_assert_eq!(n.level, 0),
                    Some(p) => {
                        prop_assert!(p < i);
                        let p = &nodes[p];
                        prop_assert_eq!(p.level + 1, n.level);
                        prop_assert!(p.offset <= n.offset && n.end() <= p.end());
                    }
                }
            }
        }
    }
}
