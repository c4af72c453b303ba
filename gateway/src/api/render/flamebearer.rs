//! Pyroscope's flamebearer, the JSON profile of its first UI that `/pyroscope/render` and
//! `/pyroscope/render-diff` answer with, field for field as Pyroscope writes it (`version`,
//! `flamebearer{names, levels, numTicks, maxSelf}`, `metadata{format, spyName, sampleRate, units,
//! name}`, `timeline`, `groups`, `heatmap`, and `leftTicks`/`rightTicks` in a diff).
//!
//! `levels` holds one array per depth. A "single" profile has four numbers per node: x offset
//! (delta from the right edge of the previous node of the level), total, self, name index — the
//! querier's `FlameGraph` encoding, taken as is. A "double" (diff) profile has seven: x offset,
//! total and self of the left tree, the same three of the right tree, name index; the two trees
//! are aligned node for node (a node missing on one side has zeros there), children by name,
//! and nodes below the `max_nodes` threshold on both sides are folded into `other`.

use std::collections::BTreeMap;

use kiln_otel::model::ProfileType;
use kiln_proto::flamegraph::{self, FlameGraphError};
use kiln_proto::querier::v1::FlameGraph;
use kiln_proto::types::v1::Point;
use kiln_storage::query::FlameTree;
use kiln_storage::query::tree::{OTHER_NAME, ROOT_NAME};
use serde::Serialize;

/// A flamebearer profile (Pyroscope's `FlamebearerProfile`, version 1).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Profile {
    pub version: u32,
    pub flamebearer: Flamebearer,
    pub metadata: Metadata,
    /// The profile's values over time; `null` in a diff.
    pub timeline: Option<Timeline>,
    /// One timeline per value of the first `groupBy` label; `null` without `groupBy`.
    pub groups: Option<BTreeMap<String, Timeline>>,
    /// Never drawn by Kiln; `null`, as Pyroscope's render writes it.
    pub heatmap: Option<serde_json::Value>,
    /// Total of the left tree of a diff (left out when 0, as Pyroscope leaves it out).
    #[serde(rename = "leftTicks", skip_serializing_if = "is_zero")]
    pub left_ticks: u64,
    /// Total of the right tree of a diff (left out when 0).
    #[serde(rename = "rightTicks", skip_serializing_if = "is_zero")]
    pub right_ticks: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The tree: names and levels.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Flamebearer {
    pub names: Vec<String>,
    pub levels: Vec<Vec<i64>>,
    /// The root's total (a diff's: both trees' together).
    #[serde(rename = "numTicks")]
    pub num_ticks: i64,
    #[serde(rename = "maxSelf")]
    pub max_self: i64,
}

/// What the values are.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Metadata {
    /// `single` or `double` (a diff).
    pub format: &'static str,
    #[serde(rename = "spyName")]
    pub spy_name: String,
    #[serde(rename = "sampleRate")]
    pub sample_rate: u32,
    pub units: String,
    /// The sample type (`cpu`, `alloc_space`, …).
    pub name: String,
}

/// Values over time: one sample per `durationDelta` seconds from `startTime` (Unix seconds).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Timeline {
    #[serde(rename = "startTime")]
    pub start_time: i64,
    pub samples: Vec<u64>,
    #[serde(rename = "durationDelta")]
    pub duration_delta: i64,
    /// Unused by Kiln; `null`, as Pyroscope writes it.
    pub watermarks: Option<BTreeMap<i64, i64>>,
}

impl Timeline {
    /// The timeline of a series over `[start_ms, end_ms)` in steps of `step_secs`, with zeros
    /// where the series has no point; both ends snap down to a step boundary, as Pyroscope's do.
    pub fn new(points: &[Point], start_ms: i64, end_ms: i64, step_secs: i64) -> Self {
        let step_ms = step_secs.max(1) * 1_000;
        let start = start_ms.div_euclid(step_ms) * step_ms;
        let end = end_ms.div_euclid(step_ms) * step_ms;
        let start_secs = start.div_euclid(1_000);
        let mut samples = Vec::new();
        if start < end {
            let len = (end.div_euclid(1_000) - start_secs) / step_secs.max(1);
            samples = vec![0u64; usize::try_from(len).unwrap_or(0)];
            for p in points
                .iter()
                .filter(|p| (start..end).contains(&p.timestamp))
            {
                let at = (p.timestamp.div_euclid(1_000) - start_secs) / step_secs.max(1);
                if let Some(slot) = usize::try_from(at).ok().and_then(|i| samples.get_mut(i)) {
                    // Values are whole numbers of the profile's unit; Go's conversion truncates.
                    *slot = slot.saturating_add(p.value as u64);
                }
            }
        }
        Self {
            start_time: start_secs,
            samples,
            duration_delta: step_secs,
            watermarks: None,
        }
    }
}

/// Metadata of a profile type, as Pyroscope derives it: counts of objects, goroutines and
/// samples are `objects`, CPU time is `samples` at a rate of 1e9 (nanoseconds); the rest keep
/// their sample unit at a rate of 100.
pub fn metadata(format: &'static str, profile_type: &ProfileType) -> Metadata {
    let (units, sample_rate) = match profile_type.sample_type.as_str() {
        "inuse_objects" | "alloc_objects" | "goroutine" | "samples" => ("objects".into(), 100),
        "cpu" => ("samples".into(), 1_000_000_000),
        _ => (profile_type.sample_unit.clone(), 100),
    };
    Metadata {
        format,
        spy_name: String::new(),
        sample_rate,
        units,
        name: profile_type.sample_type.clone(),
    }
}

/// A "single" profile of a flame graph (its levels taken as they are).
pub fn single(fg: &FlameGraph, profile_type: &ProfileType) -> Profile {
    Profile {
        version: 1,
        flamebearer: Flamebearer {
            names: fg.names.clone(),
            levels: fg.levels.iter().map(|l| l.values.clone()).collect(),
            num_ticks: fg.total,
            max_self: fg.max_self,
        },
        metadata: metadata("single", profile_type),
        timeline: None,
        groups: None,
        heatmap: None,
        left_ticks: 0,
        right_ticks: 0,
    }
}

/// A tree read back from a flame graph: per node its name, self, total and children by name.
struct Tree<'a> {
    names: &'a [String],
    nodes: Vec<TreeNode>,
}

struct TreeNode {
    name: usize,
    self_value: i64,
    total: i64,
    children: Vec<usize>,
}

impl<'a> Tree<'a> {
    fn read(fg: &'a FlameGraph) -> Result<Self, FlameGraphError> {
        let decoded = flamegraph::decode(fg)?;
        let mut nodes: Vec<TreeNode> = decoded
            .iter()
            .map(|n| TreeNode {
                name: n.name,
                self_value: n.self_value,
                total: n.total,
                children: Vec::new(),
            })
            .collect();
        for (i, n) in decoded.iter().enumerate() {
            if let Some(p) = n.parent {
                nodes[p].children.push(i);
            }
        }
        let names = &fg.names;
        for n in &mut nodes {
            n.children.sort_by(|a, b| {
                names[decoded[*a].name]
                    .as_bytes()
                    .cmp(names[decoded[*b].name].as_bytes())
            });
        }
        Ok(Self { names, nodes })
    }

    fn name(&self, node: usize) -> &'a str {
        &self.names[self.nodes[node].name]
    }
}

/// One node of the two trees aligned: (total, self) on each side.
struct Pair<'a> {
    name: &'a str,
    left: (i64, i64),
    right: (i64, i64),
    children: Vec<usize>,
}

/// Aligns two trees node for node from the root down: children are matched by name, a child
/// on one side only gets a zero node on the other.
fn align<'a>(left: &Tree<'a>, right: &Tree<'a>) -> Vec<Pair<'a>> {
    let side = |t: &Tree<'_>, n: Option<usize>| {
        n.map_or((0, 0), |n| (t.nodes[n].total, t.nodes[n].self_value))
    };
    let root = |t: &Tree<'_>| (!t.nodes.is_empty()).then_some(0);
    let mut pairs = vec![Pair {
        name: ROOT_NAME,
        left: side(left, root(left)),
        right: side(right, root(right)),
        children: Vec::new(),
    }];
    let mut work = vec![(0usize, root(left), root(right))];
    while let Some((at, l, r)) = work.pop() {
        let kids = |t: &Tree<'_>, n: Option<usize>| -> Vec<usize> {
            n.map_or_else(Vec::new, |n| t.nodes[n].children.clone())
        };
        let (lk, rk) = (kids(left, l), kids(right, r));
        let (mut i, mut j) = (0, 0);
        while i < lk.len() || j < rk.len() {
            let order = match (lk.get(i), rk.get(j)) {
                (Some(&a), Some(&b)) => left.name(a).as_bytes().cmp(right.name(b).as_bytes()),
                (Some(_), None) => std::cmp::Ordering::Less,
                _ => std::cmp::Ordering::Greater,
            };
            let (l_child, r_child) = match order {
                std::cmp::Ordering::Equal => (Some(lk[i]), Some(rk[j])),
                std::cmp::Ordering::Less => (Some(lk[i]), None),
                std::cmp::Ordering::Greater => (None, Some(rk[j])),
            };
            i += usize::from(l_child.is_some());
            j += usize::from(r_child.is_some());
            let name = l_child.map_or_else(|| right.name(r_child.unwrap_or(0)), |c| left.name(c));
            let id = pairs.len();
            pairs.push(Pair {
                name,
                left: side(left, l_child),
                right: side(right, r_child),
                children: Vec::new(),
            });
            pairs[at].children.push(id);
            work.push((id, l_child, r_child));
        }
    }
    pairs
}

/// The smallest total (the larger of a node's two) a node needs to be drawn so that about
/// `max_nodes` nodes are; 0 when every node fits.
fn min_value(pairs: &[Pair<'_>], max_nodes: usize) -> i64 {
    kiln_storage::query::tree::cutoff(
        pairs.iter().map(|p| p.left.0.max(p.right.0)).collect(),
        max_nodes,
    )
}

/// A "double" profile: the two merged trees aligned, at most about `max_nodes` nodes drawn.
pub fn diff(
    left: &FlameTree,
    right: &FlameTree,
    max_nodes: usize,
    profile_type: &ProfileType,
) -> Result<Profile, FlameGraphError> {
    // Every node of both trees (a budget of 0 draws all), read back by the shared decoder.
    let (left_fg, right_fg) = (left.to_flamegraph(0), right.to_flamegraph(0));
    let (left_tree, right_tree) = (Tree::read(&left_fg)?, Tree::read(&right_fg)?);
    let pairs = align(&left_tree, &right_tree);
    let min = min_value(&pairs, max_nodes);

    enum Item {
        Pair(usize),
        /// Folded children: (total on the left, total on the right).
        Other(i64, i64),
    }
    let mut names: Vec<String> = Vec::new();
    let mut name_ids: BTreeMap<&str, i64> = BTreeMap::new();
    let mut levels: Vec<Vec<i64>> = Vec::new();
    let mut max_self = 0i64;
    // (item, depth, left x, right x). Pyroscope walks the rightmost child first, naming nodes
    // in that order, and reverses each level at the end: so does this.
    let mut stack = vec![(Item::Pair(0), 0usize, 0i64, 0i64)];
    while let Some((item, depth, mut x_left, mut x_right)) = stack.pop() {
        let (name, l, r) = match item {
            Item::Pair(p) => (pairs[p].name, pairs[p].left, pairs[p].right),
            Item::Other(l, r) => (OTHER_NAME, (l, l), (r, r)),
        };
        let next_id = names.len() as i64;
        let id = *name_ids.entry(name).or_insert_with(|| {
            names.push(name.to_owned());
            next_id
        });
        if levels.len() == depth {
            levels.push(Vec::new());
        }
        levels[depth].extend([x_left, l.0, l.1, x_right, r.0, r.1, id]);
        max_self = max_self.max(l.1).max(r.1);
        let Item::Pair(p) = item else { continue };
        x_left += l.1;
        x_right += r.1;
        let (mut other_left, mut other_right) = (0, 0);
        for &c in &pairs[p].children {
            let child = &pairs[c];
            if child.left.0 >= min || child.right.0 >= min {
                stack.push((Item::Pair(c), depth + 1, x_left, x_right));
                x_left += child.left.0;
                x_right += child.right.0;
            } else {
                other_left += child.left.0;
                other_right += child.right.0;
            }
        }
        if other_left != 0 || other_right != 0 {
            stack.push((
                Item::Other(other_left, other_right),
                depth + 1,
                x_left,
                x_right,
            ));
        }
    }
    for level in &mut levels {
        // Left to right, then offsets as deltas from the previous node's right edge, per side.
        let mut nodes: Vec<[i64; 7]> = level
            .chunks_exact(7)
            .rev()
            .map(|c| c.try_into().expect("chunks of 7"))
            .collect();
        for (offset, total) in [(0, 1), (3, 4)] {
            let mut right_edge = 0;
            for n in &mut nodes {
                let x = n[offset];
                n[offset] = x - right_edge;
                right_edge = x + n[total];
            }
        }
        *level = nodes.concat();
    }
    let (left_total, right_total) = (pairs[0].left.0, pairs[0].right.0);
    Ok(Profile {
        version: 1,
        flamebearer: Flamebearer {
            names,
            levels,
            num_ticks: left_total.saturating_add(right_total),
            max_self,
        },
        metadata: metadata("double", profile_type),
        timeline: None,
        groups: None,
        heatmap: None,
        left_ticks: u64::try_from(left_total).unwrap_or(0),
        right_ticks: u64::try_from(right_total).unwrap_or(0),
    })
}
