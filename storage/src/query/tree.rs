//! The merged stack tree a flame graph is drawn from, and Pyroscope's `FlameGraph` encoding:
//! `names` plus one `Level` per depth with four int64 per node — x offset (delta from the right
//! edge of the previous node of the level), total, self, name index — `names[0] = "total"`, and
//! nodes below the `max_nodes` threshold folded into an `other` child. Reading the encoding back
//! is [`kiln_proto::flamegraph::decode`]'s ([`flamegraph_stacks`] lists stacks with it).

use std::collections::BTreeMap;

use hashbrown::HashMap;

use kiln_proto::flamegraph::{self, FlameGraphError};

use crate::format::symbols::string_hash;
use crate::query::frame_filter::FrameFilter;
use kiln_proto::querier::v1::{FlameGraph, Level};

/// A tree of frames keyed by function name, root first.
#[derive(Debug, Clone)]
pub struct FlameTree {
    names: Vec<String>,
    /// Per name id: its [`string_hash`].
    hashes: Vec<u128>,
    /// Name id by the name's 128-bit hash ([`string_hash`]), the identity the symbols writer
    /// interns strings by too: a lookup hashes no bytes when the caller has the hash.
    name_index: HashMap<u128, u32>,
    nodes: Vec<Node>,
    children: HashMap<(u32, u32), u32>,
    /// Each node's children in one list, made when first read after the tree last grew: the
    /// merges that build a tree only ever look children up by name ([`FlameTree::children`]).
    lists: std::sync::OnceLock<ChildLists>,
}

#[derive(Debug, Clone)]
struct Node {
    name: u32,
    parent: u32,
    self_value: i64,
    total: i64,
}

/// Children of every node: node `i`'s are `list[offsets[i]..offsets[i + 1]]`, by id (the order
/// they were added in).
#[derive(Debug, Clone, Default)]
struct ChildLists {
    offsets: Vec<u32>,
    list: Vec<u32>,
}

/// Name of the root node.
pub const ROOT_NAME: &str = "total";
/// Name of the node that collects what `max_nodes` cut off.
pub const OTHER_NAME: &str = "other";
/// The name id of [`OTHER_NAME`]: every tree names it second, after the root.
const OTHER: u32 = 1;

impl Default for FlameTree {
    fn default() -> Self {
        let mut t = Self {
            names: Vec::new(),
            hashes: Vec::new(),
            name_index: HashMap::new(),
            nodes: Vec::new(),
            children: HashMap::new(),
            lists: std::sync::OnceLock::new(),
        };
        let root = t.name(ROOT_NAME);
        let other = t.name(OTHER_NAME);
        debug_assert_eq!(other, OTHER);
        t.nodes.push(Node {
            name: root,
            parent: 0,
            self_value: 0,
            total: 0,
        });
        t
    }
}

impl FlameTree {
    /// The root node id.
    pub const ROOT: u32 = 0;

    /// The id of a frame name, interned.
    pub fn name_id(&mut self, name: &str) -> u32 {
        self.name(name)
    }

    /// [`FlameTree::name_id`] with the name's [`string_hash`] already made.
    pub fn name_id_hashed(&mut self, name: &str, hash: u128) -> u32 {
        debug_assert_eq!(hash, string_hash(name));
        if let Some(&i) = self.name_index.get(&hash) {
            return i;
        }
        let i = self.names.len() as u32;
        self.names.push(name.to_owned());
        self.hashes.push(hash);
        self.name_index.insert(hash, i);
        i
    }

    fn name(&mut self, name: &str) -> u32 {
        self.name_id_hashed(name, string_hash(name))
    }

    /// The child of `parent` called `name`, created if missing.
    pub fn child(&mut self, parent: u32, name: &str) -> u32 {
        let name = self.name(name);
        self.child_by_id(parent, name)
    }

    /// The child of `parent` whose name has id `name` (from [`FlameTree::name_id`]).
    pub fn child_by_id(&mut self, parent: u32, name: u32) -> u32 {
        let nodes = &mut self.nodes;
        let mut grew = false;
        let c = *self.children.entry((parent, name)).or_insert_with(|| {
            grew = true;
            nodes.push(Node {
                name,
                parent,
                self_value: 0,
                total: 0,
            });
            nodes.len() as u32 - 1
        });
        if grew {
            self.lists.take();
        }
        c
    }

    /// Adds every node of `other` to this tree, nodes of the same name path merging.
    pub fn merge(&mut self, other: &FlameTree) {
        const UNSEEN: u32 = u32::MAX;
        let mut names = vec![UNSEEN; other.names.len()];
        // `other`'s node -> this tree's; a parent's id is below its children's.
        let mut nodes = vec![Self::ROOT; other.nodes.len()];
        for (i, n) in other.nodes.iter().enumerate() {
            let node = if i == Self::ROOT as usize {
                Self::ROOT
            } else {
                let name = &mut names[n.name as usize];
                if *name == UNSEEN {
                    let i = n.name as usize;
                    *name = self.name_id_hashed(&other.names[i], other.hashes[i]);
                }
                self.child_by_id(nodes[n.parent as usize], *name)
            };
            nodes[i] = node;
            self.add_counts(node, n.self_value, n.total);
        }
    }

    /// Trees merged into one ([`FlameTree::merge`]), the largest taking the others.
    pub fn merged(trees: impl IntoIterator<Item = FlameTree>) -> FlameTree {
        let mut trees: Vec<FlameTree> = trees.into_iter().collect();
        let Some(largest) = (0..trees.len()).max_by_key(|&i| trees[i].nodes.len()) else {
            return FlameTree::default();
        };
        let mut tree = trees.swap_remove(largest);
        for other in &trees {
            tree.merge(other);
        }
        tree
    }

    /// Adds `value` as self value of `node` (and to the totals up to the root).
    pub fn add_value(&mut self, node: u32, value: i64) {
        let slot = &mut self.nodes[node as usize].self_value;
        *slot = slot.saturating_add(value);
        let mut n = node;
        loop {
            let total = &mut self.nodes[n as usize].total;
            *total = total.saturating_add(value);
            if n == Self::ROOT {
                break;
            }
            n = self.nodes[n as usize].parent;
        }
    }

    /// Adds `self_value` to `node`'s self value and `total` to its total, and nothing to its
    /// ancestors: for callers that sum whole subtrees themselves.
    pub fn add_counts(&mut self, node: u32, self_value: i64, total: i64) {
        let n = &mut self.nodes[node as usize];
        n.self_value = n.self_value.saturating_add(self_value);
        n.total = n.total.saturating_add(total);
    }

    /// Adds a root-first stack of frame names.
    pub fn add_stack<'a>(&mut self, root_first: impl IntoIterator<Item = &'a str>, value: i64) {
        let mut node = Self::ROOT;
        for name in root_first {
            node = self.child(node, name);
        }
        self.add_value(node, value);
    }

    /// Total of all stacks.
    pub fn total(&self) -> i64 {
        self.nodes[0].total
    }

    /// Number of nodes, the root excluded.
    pub fn node_count(&self) -> usize {
        self.nodes.len() - 1
    }

    /// Every stack with a self value: root-first names (without the root) → self value.
    pub fn stacks(&self) -> BTreeMap<Vec<String>, i64> {
        let mut out = BTreeMap::new();
        for (i, n) in self.nodes.iter().enumerate().skip(1) {
            if n.self_value == 0 {
                continue;
            }
            let mut path = Vec::new();
            let mut c = i as u32;
            while c != Self::ROOT {
                path.push(self.names[self.nodes[c as usize].name as usize].clone());
                c = self.nodes[c as usize].parent;
            }
            path.reverse();
            *out.entry(path).or_insert(0) += n.self_value;
        }
        out
    }

    /// The stacks `filter` keeps, as a tree of their own: whole stacks, so a node keeps its self
    /// value when the names on its path from the root pass the filter, and totals are summed
    /// again from what is kept (Pyroscope's `stack_trace_selector.frame_filter`). Exact because
    /// a node is one function of a stack, root first: its path is its stack's functions.
    pub fn retain_frames(&self, filter: &FrameFilter) -> FlameTree {
        let n = self.nodes.len();
        let all = filter.all_terms();
        let mut name_terms: Vec<Option<(u64, bool)>> = vec![None; self.names.len()];
        let mut state: Vec<(u64, bool)> = vec![(0, false); n];
        let mut totals = vec![0i64; n];
        // Parents come before their children in `nodes`: one pass down, one pass up.
        for i in 1..n {
            let node = &self.nodes[i];
            let name = node.name as usize;
            let (met, excluded) =
                *name_terms[name].get_or_insert_with(|| filter.terms(&self.names[name]));
            let parent = state[node.parent as usize];
            state[i] = (parent.0 | met, parent.1 || excluded);
            if !state[i].1 && state[i].0 == all {
                totals[i] = node.self_value;
            }
        }
        let kept_self = totals.clone();
        for i in (1..n).rev() {
            let parent = self.nodes[i].parent as usize;
            totals[parent] = totals[parent].saturating_add(totals[i]);
        }
        let mut out = FlameTree::default();
        let mut map = vec![None; n];
        map[0] = Some(Self::ROOT);
        for i in 1..n {
            let node = &self.nodes[i];
            let Some(parent) = map[node.parent as usize].filter(|_| totals[i] != 0) else {
                continue;
            };
            let name = out.name_id(&self.names[node.name as usize]);
            let c = out.child_by_id(parent, name);
            out.nodes[c as usize].self_value = kept_self[i];
            out.nodes[c as usize].total = totals[i];
            map[i] = Some(c);
        }
        out.nodes[0].total = totals[0];
        out
    }

    /// The stacks that start with `call_site` (root first, function names), as a tree of their
    /// own: the call site's frames as a chain above everything below it. What Pyroscope's
    /// `stack_trace_selector.call_site` selects, so a client refines a truncated subtree with
    /// the whole `max_nodes` budget spent below it. An empty call site is the whole tree; one
    /// that is not in the tree selects nothing. Consumes the tree: with no call site it is
    /// returned as it is, without a copy.
    pub fn focus(self, call_site: &[&str]) -> FlameTree {
        if call_site.is_empty() {
            return self;
        }
        let mut at = Self::ROOT;
        for name in call_site {
            let found = self
                .find_name(name)
                .and_then(|id| self.children.get(&(at, id)));
            match found {
                Some(&c) => at = c,
                None => return FlameTree::default(),
            }
        }
        let mut out = FlameTree::default();
        let total = self.nodes[at as usize].total;
        let mut chain = Self::ROOT;
        for name in &call_site[..call_site.len() - 1] {
            chain = out.child(chain, name);
        }
        // Copy the call site's subtree, then set the chain's totals (ancestors' own self values
        // belong to stacks that end above the call site).
        let mut copy = vec![(at, chain)];
        while let Some((from, parent)) = copy.pop() {
            let node = &self.nodes[from as usize];
            let to = out.child(parent, &self.names[node.name as usize]);
            out.nodes[to as usize].self_value = node.self_value;
            out.nodes[to as usize].total = node.total;
            copy.extend(self.children(from).iter().map(|&c| (c, to)));
        }
        let mut n = chain;
        loop {
            out.nodes[n as usize].total = total;
            if n == Self::ROOT {
                break;
            }
            n = out.nodes[n as usize].parent;
        }
        out
    }

    /// The smallest total a node needs to be drawn so that at most `max_nodes` nodes are.
    fn min_value(&self, max_nodes: usize) -> i64 {
        cutoff(self.nodes[1..].iter().map(|n| n.total).collect(), max_nodes)
    }

    /// Encodes the tree as Pyroscope's `FlameGraph`, drawing at most about `max_nodes` nodes.
    pub fn to_flamegraph(&self, max_nodes: usize) -> FlameGraph {
        let min_value = self.min_value(max_nodes);
        let mut names: Vec<String> = Vec::new();
        // Tree name id -> drawn name index.
        let mut drawn = vec![-1i64; self.names.len()];
        let mut name_id = |tree_name: u32, names: &mut Vec<String>| -> i64 {
            let slot = &mut drawn[tree_name as usize];
            if *slot < 0 {
                *slot = names.len() as i64;
                names.push(self.names[tree_name as usize].clone());
            }
            *slot
        };
        let other_name = OTHER;
        let mut levels: Vec<Vec<i64>> = Vec::new();
        let mut max_self = 0i64;

        enum Item {
            Node(u32),
            Other(i64),
        }
        // (item, depth, absolute x offset); a stack so children come out left to right.
        let mut stack: Vec<(Item, usize, i64)> = vec![(Item::Node(Self::ROOT), 0, 0)];
        while let Some((item, depth, offset)) = stack.pop() {
            if levels.len() == depth {
                levels.push(Vec::new());
            }
            match item {
                Item::Other(value) => {
                    let id = name_id(other_name, &mut names);
                    levels[depth].extend([offset, value, value, id]);
                    max_self = max_self.max(value);
                }
                Item::Node(n) => {
                    let node = &self.nodes[n as usize];
                    let id = name_id(node.name, &mut names);
                    levels[depth].extend([offset, node.total, node.self_value, id]);
                    max_self = max_self.max(node.self_value);
                    let mut children: Vec<u32> = self.children(n).to_vec();
                    children.sort_by(|a, b| {
                        self.names[self.nodes[*a as usize].name as usize]
                            .cmp(&self.names[self.nodes[*b as usize].name as usize])
                    });
                    let mut x = offset + node.self_value;
                    let mut placed = Vec::new();
                    let mut other = 0i64;
                    for c in children {
                        let child = &self.nodes[c as usize];
                        if child.total == 0 {
                            continue;
                        }
                        if child.total >= min_value && child.name != other_name {
                            placed.push((Item::Node(c), depth + 1, x));
                            x += child.total;
                        } else {
                            other += child.total;
                        }
                    }
                    if other > 0 {
                        placed.push((Item::Other(other), depth + 1, x));
                    }
                    stack.extend(placed.into_iter().rev());
                }
            }
        }
        // Delta-encode x offsets within each level.
        for level in &mut levels {
            let mut prev_right = 0i64;
            for node in level.chunks_exact_mut(4) {
                let abs = node[0];
                node[0] = abs - prev_right;
                prev_right = abs + node[1];
            }
        }
        FlameGraph {
            names,
            levels: levels.into_iter().map(|values| Level { values }).collect(),
            total: self.total(),
            max_self,
        }
    }
}

/// Read access to the nodes, for the projections in [`super::functions`]. Node ids run from
/// [`FlameTree::ROOT`] to `nodes() - 1`; a node's children have larger ids than the node.
impl FlameTree {
    /// Number of nodes, the root included.
    pub fn nodes(&self) -> usize {
        self.nodes.len()
    }

    /// Number of interned names (name ids run from 0).
    pub fn names(&self) -> usize {
        self.names.len()
    }

    /// The name of a name id.
    pub fn name_str(&self, name: u32) -> &str {
        &self.names[name as usize]
    }

    /// The id of a name, if the tree has it.
    pub fn find_name(&self, name: &str) -> Option<u32> {
        self.name_index.get(&string_hash(name)).copied()
    }

    /// The name id of a node.
    pub fn node_name(&self, node: u32) -> u32 {
        self.nodes[node as usize].name
    }

    /// The parent of a node (the root is its own parent).
    pub fn parent(&self, node: u32) -> u32 {
        self.nodes[node as usize].parent
    }

    /// The children of a node, in insertion order.
    pub fn children(&self, node: u32) -> &[u32] {
        let lists = self.lists.get_or_init(|| {
            let n = self.nodes.len();
            let mut offsets = vec![0u32; n + 1];
            for node in &self.nodes[1..] {
                offsets[node.parent as usize + 1] += 1;
            }
            for i in 0..n {
                offsets[i + 1] += offsets[i];
            }
            let mut next = offsets.clone();
            let mut list = vec![0u32; n.saturating_sub(1)];
            for (i, node) in self.nodes.iter().enumerate().skip(1) {
                let slot = &mut next[node.parent as usize];
                list[*slot as usize] = i as u32;
                *slot += 1;
            }
            ChildLists { offsets, list }
        });
        let i = node as usize;
        &lists.list[lists.offsets[i] as usize..lists.offsets[i + 1] as usize]
    }

    /// The child of `parent` with name id `name`, if there is one.
    pub fn find_child(&self, parent: u32, name: u32) -> Option<u32> {
        self.children.get(&(parent, name)).copied()
    }

    /// The value of the stacks ending at a node.
    pub fn self_value(&self, node: u32) -> i64 {
        self.nodes[node as usize].self_value
    }

    /// The value of the stacks through a node.
    pub fn node_total(&self, node: u32) -> i64 {
        self.nodes[node as usize].total
    }
}

impl FlameTree {
    /// Encodes the tree as Pyroscope's compact tree (`PROFILE_FORMAT_TREE`, the `tree` field of
    /// `SelectMergeStacktracesResponse`), byte for byte as Pyroscope's `MarshalTruncate` writes a
    /// function-name tree: nodes in pre-order, each as
    ///
    /// ```text
    /// uvarint(len(name)) name uvarint(self) uvarint(number of children)
    /// ```
    ///
    /// starting with a nameless root (self 0 unless stacks end at the root), children in
    /// descending byte order of their names (Pyroscope keeps them sorted ascending and walks a
    /// stack). A child whose total is below the `max_nodes` threshold (the one of
    /// [`FlameTree::to_flamegraph`]) is cut, its total added to its parent's `other` child: a
    /// leaf created for it, or the node of that name when there is one (it is never cut, and keeps
    /// its children). An empty tree is no bytes at all. Negative self values are written as
    /// their two's complement, as Go's `uint64(int64)` does.
    pub fn to_tree_bytes(&self, max_nodes: usize) -> Vec<u8> {
        /// A node to write: one of the tree's with the value folded into it (an `other` node
        /// gets what its siblings lost), or a made-up `other` leaf.
        #[derive(Clone, Copy)]
        enum Item {
            Node(u32, i64),
            Other(i64),
        }
        let live = |c: &u32| self.nodes[*c as usize].total != 0;
        if !self.children(Self::ROOT).iter().any(live) {
            return Vec::new();
        }
        let min_value = self.min_value(max_nodes);
        let other_name = OTHER;
        let name_of = |item: &Item| -> &str {
            match item {
                Item::Node(n, _) if *n == Self::ROOT => "",
                Item::Node(n, _) => &self.names[self.nodes[*n as usize].name as usize],
                Item::Other(_) => OTHER_NAME,
            }
        };
        let mut out = Vec::new();
        let mut stack = vec![Item::Node(Self::ROOT, 0)];
        let mut children: Vec<Item> = Vec::new();
        while let Some(item) = stack.pop() {
            let name = name_of(&item);
            prost::encoding::encode_varint(name.len() as u64, &mut out);
            out.extend_from_slice(name.as_bytes());
            let (n, extra) = match item {
                Item::Node(n, extra) => (n, extra),
                Item::Other(value) => {
                    prost::encoding::encode_varint(value as u64, &mut out);
                    prost::encoding::encode_varint(0, &mut out);
                    continue;
                }
            };
            let node = &self.nodes[n as usize];
            prost::encoding::encode_varint(node.self_value.wrapping_add(extra) as u64, &mut out);
            children.clear();
            let mut cut = 0i64;
            let mut other_at = None;
            for &c in self.children(n).iter().filter(|c| live(c)) {
                let child = &self.nodes[c as usize];
                if child.name == other_name {
                    other_at = Some(children.len());
                    children.push(Item::Node(c, 0));
                } else if child.total >= min_value {
                    children.push(Item::Node(c, 0));
                } else {
                    cut = cut.wrapping_add(child.total);
                }
            }
            if cut != 0 {
                match other_at {
                    Some(i) => {
                        if let Item::Node(c, _) = children[i] {
                            children[i] = Item::Node(c, cut);
                        }
                    }
                    None => children.push(Item::Other(cut)),
                }
            }
            children.sort_by(|a, b| name_of(a).as_bytes().cmp(name_of(b).as_bytes()));
            prost::encoding::encode_varint(children.len() as u64, &mut out);
            stack.extend_from_slice(&children);
        }
        out
    }
}

/// The `max_nodes`-th largest of `totals`: the smallest total a node needs to be kept so that
/// about `max_nodes` are (ties kept); 0 when all fit or `max_nodes` is 0. The one cut-off of
/// every `max_nodes` (flame graphs, TREE, pprof, projections, flamebearer).
pub fn cutoff(mut totals: Vec<i64>, max_nodes: usize) -> i64 {
    if max_nodes == 0 || totals.len() <= max_nodes {
        return 0;
    }
    let (_, nth, _) = totals.select_nth_unstable_by(max_nodes - 1, |a, b| b.cmp(a));
    *nth
}

/// Decodes a `FlameGraph` back into root-first stacks (without the root) with their self values,
/// rebuilding parents by interval containment as Grafana does ([`flamegraph::decode`]).
pub fn flamegraph_stacks(fg: &FlameGraph) -> Result<BTreeMap<Vec<String>, i64>, FlameGraphError> {
    let nodes = flamegraph::decode(fg)?;
    let mut stacks = BTreeMap::new();
    for n in &nodes {
        if n.level == 0 || n.self_value == 0 {
            continue;
        }
        let mut path = vec![fg.names[n.name].clone()];
        let mut up = n.parent.map(|p| &nodes[p]);
        while let Some(p) = up.filter(|p| p.level > 0) {
            path.push(fg.names[p.name].clone());
            up = p.parent.map(|p| &nodes[p]);
        }
        path.reverse();
        *stacks.entry(path).or_insert(0) += n.self_value;
    }
    Ok(stacks)
}

#[cfg(test)]
mod tests {
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
}
