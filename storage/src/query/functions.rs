//! Function projections of a merged [`FlameTree`], what Grafana Profiles Drilldown asks for with
//! `PROFILE_FORMAT_FUNCTIONS`, `FUNCTION_TREE` and `SANDWICH` (ADR 0010):
//!
//! - [`function_table`]: every function's self and total value;
//! - [`function_tree`]: the callers or callees of a call site, a few levels deep;
//! - [`sandwich`]: every caller and callee of one function, each half cut to a node budget.
//!
//! All of them read the whole tree, so no value depends on which nodes a flame graph's
//! `max_nodes` would keep; limits apply to what is returned, after the values are computed.

use hashbrown::HashMap;
use kiln_proto::querier::v1 as q;
use kiln_proto::types::v1 as t;

use super::tree::{FlameTree, OTHER_NAME};

/// Every function of the tree: `self` sums the stacks ending in it, `total` the stacks
/// containing it, each stack once however often it recurses into the function. Rows are sorted
/// by self descending, total descending, then name; `total` is the tree's total and
/// `total_functions` the number of rows (see [`limit_table`]).
pub fn function_table(tree: &FlameTree) -> t::FunctionTable {
    let names = tree.names();
    let mut self_values = vec![0i64; names];
    let mut totals = vec![0i64; names];
    let mut seen = vec![false; names];
    // Occurrences of each name on the path to the node being visited: a node adds its total
    // only when it is the outermost occurrence of its name.
    let mut open = vec![0u32; names];
    let mut stack: Vec<(u32, bool)> = tree
        .children(FlameTree::ROOT)
        .iter()
        .rev()
        .map(|&c| (c, false))
        .collect();
    while let Some((node, leaving)) = stack.pop() {
        let name = tree.node_name(node) as usize;
        if leaving {
            open[name] -= 1;
            continue;
        }
        seen[name] = true;
        self_values[name] = self_values[name].saturating_add(tree.self_value(node));
        if open[name] == 0 {
            totals[name] = totals[name].saturating_add(tree.node_total(node));
        }
        open[name] += 1;
        stack.push((node, true));
        stack.extend(tree.children(node).iter().rev().map(|&c| (c, false)));
    }
    let mut functions: Vec<t::FunctionStats> = (0..names)
        .filter(|&n| seen[n] && (totals[n] != 0 || self_values[n] != 0))
        .map(|n| t::FunctionStats {
            name: tree.name_str(n as u32).to_owned(),
            self_: self_values[n],
            total: totals[n],
        })
        .collect();
    functions.sort_by(|a, b| {
        b.self_
            .cmp(&a.self_)
            .then(b.total.cmp(&a.total))
            .then_with(|| a.name.cmp(&b.name))
    });
    t::FunctionTable {
        total_functions: functions.len() as i64,
        functions,
        total: tree.total(),
    }
}

/// Keeps the first `limit` rows of a table (all of them for 0); totals are untouched.
pub fn limit_table(table: &mut t::FunctionTable, limit: usize) {
    if limit > 0 {
        table.functions.truncate(limit);
    }
}

/// One function on both sides of a diff; a side without it has a zero row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionPair {
    pub name: String,
    pub left: t::FunctionStats,
    pub right: t::FunctionStats,
}

/// How the rows of a joined table are ranked before a limit cuts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiffRanking {
    /// The larger self value of the two sides, then the larger total, then the name.
    LargerSelf,
    /// The larger share of its side's profile total (total ÷ profile total), then the name.
    LargerShare,
}

/// The two sides' tables joined per function, one pair per function of either side, ranked
/// (a limit applies to the result: [`Vec::truncate`]).
pub fn join_tables(
    left: &t::FunctionTable,
    right: &t::FunctionTable,
    ranking: DiffRanking,
) -> Vec<FunctionPair> {
    let mut by_name: HashMap<&str, usize> = HashMap::new();
    let mut pairs: Vec<FunctionPair> = Vec::new();
    for (side, table) in [left, right].into_iter().enumerate() {
        for f in &table.functions {
            let i = *by_name.entry(f.name.as_str()).or_insert_with(|| {
                pairs.push(FunctionPair {
                    name: f.name.clone(),
                    left: zero_row(&f.name),
                    right: zero_row(&f.name),
                });
                pairs.len() - 1
            });
            if side == 0 {
                pairs[i].left = f.clone();
            } else {
                pairs[i].right = f.clone();
            }
        }
    }
    let share = |value: i64, of: i64| {
        if of == 0 {
            0.0
        } else {
            value as f64 / of as f64
        }
    };
    match ranking {
        DiffRanking::LargerSelf => pairs.sort_by(|a, b| {
            let larger = |p: &FunctionPair| {
                (
                    p.left.self_.max(p.right.self_),
                    p.left.total.max(p.right.total),
                )
            };
            larger(b).cmp(&larger(a)).then_with(|| a.name.cmp(&b.name))
        }),
        DiffRanking::LargerShare => {
            let larger = |p: &FunctionPair| {
                share(p.left.total, left.total).max(share(p.right.total, right.total))
            };
            pairs.sort_by(|a, b| {
                larger(b)
                    .total_cmp(&larger(a))
                    .then_with(|| a.name.cmp(&b.name))
            })
        }
    }
    pairs
}

fn zero_row(name: &str) -> t::FunctionStats {
    t::FunctionStats {
        name: name.to_owned(),
        ..Default::default()
    }
}

/// How a function tree's call site is matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    /// An exact root-first path from the tree's root; its callees only.
    RootPath,
    /// A root-first chain of functions, wherever it occurs in a stack; every occurrence counts.
    FunctionChain,
}

/// The callers and/or callees of a call site, `max_depth` levels below the root of each.
///
/// - Callees: the root is the call site's last function; below it what the stacks through the
///   call site call next. With [`Selection::RootPath`] an empty path is the whole tree, with a
///   root named `""`.
/// - Callers: the root is the call site's first function; below it its callers, outwards, each
///   with the value of the stacks through the call site it is on.
///
/// A node's `has_children` says whether it has children, shown or beyond `max_depth`; a call
/// site the tree does not have gives a tree without a root. Children are sorted by total
/// descending, then name.
pub fn function_tree(
    tree: &FlameTree,
    path: &[&str],
    selection: Selection,
    callers: bool,
    callees: bool,
    max_depth: usize,
) -> t::FunctionTree {
    let ids: Option<Vec<u32>> = path.iter().map(|n| tree.find_name(n)).collect();
    let occurrences = match (&ids, selection) {
        (None, _) => Vec::new(),
        (Some(ids), Selection::RootPath) => root_path(tree, ids).into_iter().collect(),
        (Some(ids), Selection::FunctionChain) => chain_occurrences(tree, ids),
    };
    let root_name = |name: Option<&&str>| name.map(|n| (*n).to_owned()).unwrap_or_default();
    t::FunctionTree {
        callers: callers.then(|| t::CallTree {
            root: callers_tree(tree, &occurrences, max_depth)
                .map(|trie| trie.call_tree(tree, root_name(path.first()))),
        }),
        callees: callees.then(|| t::CallTree {
            root: callees_tree(tree, &occurrences, max_depth)
                .map(|trie| trie.call_tree(tree, root_name(path.last()))),
        }),
    }
}

/// An occurrence of a call site: its first and its last node (the same for one function).
#[derive(Debug, Clone, Copy)]
struct Occurrence {
    first: u32,
    last: u32,
}

/// The node at a root-first path, as an occurrence (the root for an empty path).
fn root_path(tree: &FlameTree, ids: &[u32]) -> Option<Occurrence> {
    let mut at = FlameTree::ROOT;
    let mut first = None;
    for &id in ids {
        at = tree.find_child(at, id)?;
        first.get_or_insert(at);
    }
    Some(Occurrence {
        first: first.unwrap_or(at),
        last: at,
    })
}

/// Every node where the chain `ids` ends, with the node where that occurrence starts.
fn chain_occurrences(tree: &FlameTree, ids: &[u32]) -> Vec<Occurrence> {
    let Some((&last_id, before)) = ids.split_last() else {
        return Vec::new();
    };
    (1..tree.nodes() as u32)
        .filter(|&n| tree.node_name(n) == last_id)
        .filter_map(|last| {
            let mut first = last;
            for &id in before.iter().rev() {
                let up = tree.parent(first);
                if up == FlameTree::ROOT || tree.node_name(up) != id {
                    return None;
                }
                first = up;
            }
            Some(Occurrence { first, last })
        })
        .collect()
}

fn has_children(tree: &FlameTree, node: u32) -> bool {
    tree.children(node).iter().any(|&c| tree.node_total(c) != 0)
}

fn callees_tree(tree: &FlameTree, occurrences: &[Occurrence], max_depth: usize) -> Option<Trie> {
    let mut trie = Trie::new(u32::MAX);
    for o in occurrences {
        trie.merge_subtree(tree, o.last, Some(max_depth));
    }
    (trie.nodes[0].total != 0).then_some(trie)
}

fn callers_tree(tree: &FlameTree, occurrences: &[Occurrence], max_depth: usize) -> Option<Trie> {
    let mut trie = Trie::new(u32::MAX);
    for o in occurrences {
        let value = tree.node_total(o.last);
        let root = &mut trie.nodes[0];
        root.total = root.total.saturating_add(value);
        if o.first == o.last {
            root.self_value = root.self_value.saturating_add(tree.self_value(o.last));
        }
        trie.add_callers(tree, o.first, value, Some(max_depth));
    }
    (trie.nodes[0].total != 0).then_some(trie)
}

/// Every caller and callee of `function`, the Drilldown's sandwich view, from every
/// occurrence of it (a recursive function shows at several depths of both halves):
///
/// - `callers`: the function at the root, its callers below it, each credited with the value
///   of the function's occurrence above which it is;
/// - `callees`: the function at the root, the subtrees of all its occurrences merged below it;
/// - `total`: the stacks containing the function, each once (the function table's total);
///   `self`: the stacks ending in it.
///
/// Each half is cut to about `max_nodes` nodes (0: no limit) as a flame graph is: children
/// below the budget's smallest total are summed in one `other` child marked `truncated`. Names
/// are shared in `names`. An empty tree gives an empty report; a function the tree does not
/// have gives both halves as a zero root.
pub fn sandwich(tree: &FlameTree, function: &str, max_nodes: usize) -> q::SandwichReport {
    if tree.total() == 0 {
        return q::SandwichReport::default();
    }
    let Some(id) = tree.find_name(function) else {
        let zero = q::SandwichNode::default();
        return q::SandwichReport {
            names: vec![function.to_owned()],
            callers: Some(zero.clone()),
            callees: Some(zero),
            ..Default::default()
        };
    };
    let mut callers = Trie::new(id);
    let mut callees = Trie::new(id);
    let (mut total, mut self_value) = (0i64, 0i64);
    for node in (1..tree.nodes() as u32).filter(|&n| tree.node_name(n) == id) {
        let value = tree.node_total(node);
        self_value = self_value.saturating_add(tree.self_value(node));
        let mut up = tree.parent(node);
        let mut outermost = true;
        while up != FlameTree::ROOT {
            if tree.node_name(up) == id {
                outermost = false;
                break;
            }
            up = tree.parent(up);
        }
        if outermost {
            total = total.saturating_add(value);
        }
        let root = &mut callers.nodes[0];
        root.total = root.total.saturating_add(value);
        callers.add_callers(tree, node, value, None);
        callees.merge_subtree(tree, node, None);
    }
    let mut names = Names::default();
    let callers = callers.sandwich_half(tree, max_nodes, &mut names);
    let callees = callees.sandwich_half(tree, max_nodes, &mut names);
    q::SandwichReport {
        names: names.names,
        callers: Some(callers),
        callees: Some(callees),
        total,
        self_: self_value,
    }
}

/// A tree being built from parts of a [`FlameTree`], keyed by the tree's name ids. Node 0 is
/// the root; a node's children have larger ids than the node.
struct Trie {
    nodes: Vec<TrieNode>,
    children: HashMap<(u32, u32), u32>,
}

#[derive(Debug, Clone, Default)]
struct TrieNode {
    name: u32,
    total: i64,
    self_value: i64,
    has_children: bool,
    children: Vec<u32>,
}

impl Trie {
    fn new(root_name: u32) -> Self {
        Self {
            nodes: vec![TrieNode {
                name: root_name,
                ..Default::default()
            }],
            children: HashMap::new(),
        }
    }

    fn child(&mut self, parent: u32, name: u32) -> u32 {
        if let Some(&c) = self.children.get(&(parent, name)) {
            return c;
        }
        let c = self.nodes.len() as u32;
        self.nodes.push(TrieNode {
            name,
            ..Default::default()
        });
        self.nodes[parent as usize].children.push(c);
        self.children.insert((parent, name), c);
        c
    }

    /// Adds `node`'s values to the root and its subtree below the root, `max_depth` levels
    /// deep (`None`: all of it).
    fn merge_subtree(&mut self, tree: &FlameTree, node: u32, max_depth: Option<usize>) {
        let mut copy = vec![(node, 0u32, 0usize)];
        while let Some((from, to, depth)) = copy.pop() {
            let n = &mut self.nodes[to as usize];
            n.total = n.total.saturating_add(tree.node_total(from));
            n.self_value = n.self_value.saturating_add(tree.self_value(from));
            if !has_children(tree, from) {
                continue;
            }
            n.has_children = true;
            if max_depth.is_some_and(|m| depth >= m) {
                continue;
            }
            for &c in tree.children(from) {
                if tree.node_total(c) != 0 {
                    let child = self.child(to, tree.node_name(c));
                    copy.push((c, child, depth + 1));
                }
            }
        }
    }

    /// Adds `value` to the callers of `node` below the root, outwards, `max_depth` levels deep
    /// (`None`: up to the stack's root). The root's own values are the caller's to set.
    fn add_callers(&mut self, tree: &FlameTree, node: u32, value: i64, max_depth: Option<usize>) {
        let mut at = 0u32;
        let mut up = tree.parent(node);
        let mut depth = 0usize;
        while up != FlameTree::ROOT {
            self.nodes[at as usize].has_children = true;
            if max_depth.is_some_and(|m| depth >= m) {
                break;
            }
            at = self.child(at, tree.node_name(up));
            let n = &mut self.nodes[at as usize];
            n.total = n.total.saturating_add(value);
            up = tree.parent(up);
            depth += 1;
        }
    }

    /// Children of a node, total descending then name.
    fn sorted_children(&self, tree: &FlameTree, node: u32) -> Vec<u32> {
        let mut children = self.nodes[node as usize].children.clone();
        children.sort_by(|&a, &b| {
            let (a, b) = (&self.nodes[a as usize], &self.nodes[b as usize]);
            b.total
                .cmp(&a.total)
                .then_with(|| tree.name_str(a.name).cmp(tree.name_str(b.name)))
        });
        children
    }

    /// The trie as a `CallTreeNode`, the root named `root_name`.
    fn call_tree(&self, tree: &FlameTree, root_name: String) -> t::CallTreeNode {
        // Built from the last node back: every child is done before its parent.
        let mut built: Vec<Option<t::CallTreeNode>> = vec![None; self.nodes.len()];
        for i in (0..self.nodes.len()).rev() {
            let n = &self.nodes[i];
            let children = self
                .sorted_children(tree, i as u32)
                .into_iter()
                .filter_map(|c| built[c as usize].take())
                .collect();
            built[i] = Some(t::CallTreeNode {
                name: if i == 0 {
                    root_name.clone()
                } else {
                    tree.name_str(n.name).to_owned()
                },
                total: n.total,
                self_: n.self_value,
                children,
                has_children: n.has_children,
            });
        }
        built[0].take().unwrap_or_default()
    }

    /// The trie as one half of a sandwich, cut to about `max_nodes` nodes (0: all): children
    /// below the smallest total of the `max_nodes` largest are summed in one `other` child
    /// marked truncated (with a function called `other` of the same parent, if there is one),
    /// which is not descended into.
    fn sandwich_half(
        &self,
        tree: &FlameTree,
        max_nodes: usize,
        names: &mut Names,
    ) -> q::SandwichNode {
        let min_value =
            super::tree::cutoff(self.nodes.iter().map(|n| n.total).collect(), max_nodes);
        let other = tree.find_name(OTHER_NAME);
        // The kept nodes in pre-order (so that the name table is too), then built from the
        // last one back, every child before its parent.
        let mut out: Vec<(q::SandwichNode, Vec<usize>)> = Vec::new();
        // (node, or the stand-in's total and self; parent in `out`; depth)
        let mut todo: Vec<(Result<u32, (i64, i64)>, Option<usize>, usize)> = vec![(Ok(0), None, 0)];
        while let Some((item, parent, depth)) = todo.pop() {
            let index = out.len();
            if let Some(p) = parent {
                out[p].1.push(index);
            }
            let node = match item {
                Err((total, self_value)) => {
                    let stand_in = q::SandwichNode {
                        name_index: names.id(OTHER_NAME),
                        total,
                        self_: self_value,
                        truncated: true,
                        children: Vec::new(),
                    };
                    out.push((stand_in, Vec::new()));
                    continue;
                }
                Ok(node) => node,
            };
            let n = &self.nodes[node as usize];
            out.push((
                q::SandwichNode {
                    name_index: names.id(tree.name_str(n.name)),
                    total: n.total,
                    self_: n.self_value,
                    ..Default::default()
                },
                Vec::new(),
            ));
            let mut kept = Vec::new();
            let (mut cut, mut named_other) = (0i64, None);
            for c in self.sorted_children(tree, node) {
                let child = &self.nodes[c as usize];
                if depth >= MAX_SANDWICH_DEPTH {
                    cut = cut.saturating_add(child.total);
                } else if Some(child.name) == other {
                    named_other = Some(c);
                    kept.push(c);
                } else if child.total < min_value {
                    cut = cut.saturating_add(child.total);
                } else {
                    kept.push(c);
                }
            }
            // Pushed in reverse: the largest child comes out first, the stand-in last.
            if cut != 0 {
                let mut total = cut;
                if let Some(o) = named_other {
                    kept.retain(|&c| c != o);
                    total = total.saturating_add(self.nodes[o as usize].total);
                }
                // Nothing is shown below it: all of it is its own.
                todo.push((Err((total, total)), Some(index), depth + 1));
            }
            todo.extend(
                kept.into_iter()
                    .rev()
                    .map(|c| (Ok(c), Some(index), depth + 1)),
            );
        }
        let mut built: Vec<Option<q::SandwichNode>> = vec![None; out.len()];
        for i in (0..out.len()).rev() {
            let (mut node, children) = std::mem::take(&mut out[i]);
            node.children = children
                .into_iter()
                .filter_map(|c| built[c].take())
                .collect();
            built[i] = Some(node);
        }
        built[0].take().unwrap_or_default()
    }
}

/// The deepest node of a sandwich half: a node this deep keeps its total but not its children
/// (one `other` stand-in, marked truncated, carries their sum). A tree's depth counts lines, which
/// a profile may have any number of per location, and a response of nested messages is
/// encoded, serialized and dropped by recursion: the bound keeps that within a thread's stack
/// (the gateway's `decode_stack` test encodes one this deep).
pub const MAX_SANDWICH_DEPTH: usize = 1024;

/// A sandwich's shared name table.
#[derive(Default)]
struct Names {
    index: HashMap<String, i32>,
    names: Vec<String>,
}

impl Names {
    fn id(&mut self, name: &str) -> i32 {
        if let Some(&i) = self.index.get(name) {
            return i;
        }
        let i = self.names.len() as i32;
        self.names.push(name.to_owned());
        self.index.insert(name.to_owned(), i);
        i
    }
}

#[cfg(test)]
mod tests;
