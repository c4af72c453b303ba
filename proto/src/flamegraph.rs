//! Decoding Pyroscope's flame graph encoding ([`FlameGraph`]): `names`, plus one [`Level`] per
//! depth holding four int64 per node — x offset (the delta from the right edge of the previous
//! node of the level), total, self, name index. A node's parent is the node of the level above
//! whose span `[offset, offset + total)` holds it, as Grafana's flame graph rebuilds the tree.
//!
//! [`decode`] is the one reader of that encoding in Kiln: it checks the input and returns every
//! node with its absolute offset and its parent, or a [`FlameGraphError`] naming the first
//! inconsistency. It never panics, whatever the input.
//!
//! [`Level`]: crate::querier::v1::Level

use crate::querier::v1::FlameGraph;

/// One node of a decoded flame graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlameNode {
    /// Depth: 0 for the root level.
    pub level: usize,
    /// Absolute x offset (the left edge), in value units.
    pub offset: i64,
    /// The node's value with its descendants'.
    pub total: i64,
    /// The node's own value.
    pub self_value: i64,
    /// Index into [`FlameGraph::names`] (checked to be in range).
    pub name: usize,
    /// Index into the decoded nodes of the parent; `None` on level 0.
    pub parent: Option<usize>,
}

impl FlameNode {
    /// The node's right edge, `offset + total` (checked not to overflow when decoded).
    pub fn end(&self) -> i64 {
        self.offset.saturating_add(self.total)
    }
}

/// Why a [`FlameGraph`] does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlameGraphError {
    /// A level's values are not whole 4-tuples.
    #[error("level {level} has {len} values, not a multiple of 4")]
    Ragged { level: usize, len: usize },
    /// A name index is negative or beyond `names`.
    #[error("level {level}: name index {index} out of range ({names} names)")]
    NameOutOfRange {
        level: usize,
        index: i64,
        names: usize,
    },
    /// An x offset delta, total or self value is negative.
    #[error("level {level}: negative {field} {value}")]
    Negative {
        level: usize,
        field: &'static str,
        value: i64,
    },
    /// A node's self value is more than its total.
    #[error("level {level}: the node at {offset} has self {self_value} above its total {total}")]
    SelfAboveTotal {
        level: usize,
        offset: i64,
        self_value: i64,
        total: i64,
    },
    /// Offsets or totals add up beyond `i64`.
    #[error("level {level}: offsets overflow")]
    Overflow { level: usize },
    /// No node of the level above spans the node's offset.
    #[error("level {level}: the node at {offset} has no parent")]
    NoParent { level: usize, offset: i64 },
    /// The node starts inside its parent but ends after it.
    #[error("level {level}: the node at {offset} escapes its parent")]
    EscapesParent { level: usize, offset: i64 },
}

/// Decodes `fg` into its nodes, level by level, left to right within a level (so a node's parent
/// comes before it, and siblings come in order). An empty `levels` gives no nodes.
///
/// A node of zero total (which encoders leave out below the root) is placed by its offset alone:
/// it finds no parent at the right edge of one.
pub fn decode(fg: &FlameGraph) -> Result<Vec<FlameNode>, FlameGraphError> {
    let node_count: usize = fg.levels.iter().map(|l| l.values.len() / 4).sum();
    let mut nodes: Vec<FlameNode> = Vec::with_capacity(node_count);
    // The nodes of the level above: `nodes[above.clone()]`.
    let mut above = 0..0;
    for (level, values) in fg.levels.iter().map(|l| &l.values).enumerate() {
        if !values.len().is_multiple_of(4) {
            return Err(FlameGraphError::Ragged {
                level,
                len: values.len(),
            });
        }
        let start = nodes.len();
        let mut right = 0i64;
        let mut parent = above.start;
        for v in values.chunks_exact(4) {
            let (delta, total, self_value, name) = (v[0], v[1], v[2], v[3]);
            for (field, value) in [("x offset", delta), ("total", total), ("self", self_value)] {
                if value < 0 {
                    return Err(FlameGraphError::Negative {
                        level,
                        field,
                        value,
                    });
                }
            }
            let name_index = usize::try_from(name)
                .ok()
                .filter(|&n| n < fg.names.len())
                .ok_or(FlameGraphError::NameOutOfRange {
                    level,
                    index: name,
                    names: fg.names.len(),
                })?;
            let overflow = FlameGraphError::Overflow { level };
            let offset = right.checked_add(delta).ok_or(overflow.clone())?;
            right = offset.checked_add(total).ok_or(overflow)?;
            if self_value > total {
                return Err(FlameGraphError::SelfAboveTotal {
                    level,
                    offset,
                    self_value,
                    total,
                });
            }
            let parent = if level == 0 {
                None
            } else {
                // Offsets only grow along a level, so the parent search resumes where it stopped.
                while parent < above.end && nodes[parent].end() <= offset {
                    parent += 1;
                }
                let Some(p) = nodes[..above.end].get(parent) else {
                    return Err(FlameGraphError::NoParent { level, offset });
                };
                if offset < p.offset || right > p.end() {
                    return Err(FlameGraphError::EscapesParent { level, offset });
                }
                Some(parent)
            };
            nodes.push(FlameNode {
                level,
                offset,
                total,
                self_value,
                name: name_index,
                parent,
            });
        }
        above = start..nodes.len();
    }
    Ok(nodes)
}

#[cfg(test)]
mod tests {
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
}
