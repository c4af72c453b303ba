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

#[cfg(test)]
mod tests;

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
