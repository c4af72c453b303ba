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

#[cfg(test)]
mod tests;

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
