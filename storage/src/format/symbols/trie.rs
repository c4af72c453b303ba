//! The name trie: a block's stack tree folded by function name, as flame graphs draw it.

use hashbrown::HashMap;
use kiln_proto::kiln::storage::v1 as pb;

use super::*;

/// A block's stack tree as a flame graph draws it: each node's location replaced by its
/// function names (inlined lines in turn, outermost first), and nodes whose name paths are the
/// same merged. A location without lines adds no node: its stacks' values stay with the
/// caller's. Flame graph queries add a block's values through this, so the walk over the
/// locations and the merge of same-named frames happen once per table rather than per query.
#[derive(Debug, Default)]
pub struct NameTrie {
    /// Stack id -> trie node (0, the root, for the stack tree's root).
    pub of_stack: Vec<u32>,
    /// Per trie node: its parent, whose index is below its own (the root's is 0).
    pub parents: Vec<u32>,
    /// Per trie node: its name, an index into [`NameTrie::names`] (the root's is unused).
    pub names_of: Vec<u32>,
    /// The distinct names, as string indices of the table.
    pub names: Vec<u32>,
    /// Per distinct name: its [`string_hash`].
    pub name_hashes: Vec<u128>,
}

impl NameTrie {
    /// The trie of `s`, whose stack ids are `stacks` (empty: the tree's nodes).
    pub(super) fn new(s: &pb::Symbols, stacks: &[u32]) -> Self {
        const UNSEEN: u32 = u32::MAX;
        let n = s.stack_parents.len();
        let mut t = NameTrie {
            of_stack: Vec::with_capacity(n),
            parents: vec![0],
            names_of: vec![0],
            names: Vec::new(),
            name_hashes: Vec::new(),
        };
        let mut children: HashMap<(u32, u32), u32> = HashMap::new();
        let mut by_string: HashMap<u32, u32> = HashMap::new();
        let mut of_function = vec![UNSEEN; s.functions.len()];
        for i in 0..n {
            if i == 0 {
                t.of_stack.push(0);
                continue;
            }
            // Parents come before their nodes (checked when decoding).
            let mut node = t.of_stack[s.stack_parents[i] as usize];
            let lines = s
                .locations
                .get(s.stack_locations[i] as usize)
                .map_or(&[][..], |l| &l.line_functions[..]);
            for &f in lines.iter().rev() {
                let Some(slot) = of_function.get_mut(f as usize) else {
                    continue;
                };
                if *slot == UNSEEN {
                    let string = s.functions[f as usize].name;
                    *slot = *by_string.entry(string).or_insert_with(|| {
                        t.names.push(string);
                        t.name_hashes.push(string_hash(
                            s.strings.get(string as usize).map_or("", String::as_str),
                        ));
                        t.names.len() as u32 - 1
                    });
                }
                let name = *slot;
                node = *children.entry((node, name)).or_insert_with(|| {
                    t.parents.push(node);
                    t.names_of.push(name);
                    t.parents.len() as u32 - 1
                });
            }
            t.of_stack.push(node);
        }
        if !stacks.is_empty() {
            // Checked against the tree when the table was made.
            t.of_stack = stacks.iter().map(|&n| t.of_stack[n as usize]).collect();
        }
        t
    }

    /// Number of nodes, the root included.
    pub fn len(&self) -> usize {
        self.parents.len()
    }

    /// Whether the trie is the root alone.
    pub fn is_empty(&self) -> bool {
        self.parents.len() <= 1
    }
}
