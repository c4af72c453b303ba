//! A decoded symbols section, checked, with what queries derive from it once.

use crate::error::DecodeError;
use kiln_proto::kiln::storage::v1 as pb;
use prost::Message;

use super::codec::{ZSTD, functions_of_columns};
use super::*;

/// A decoded symbols section.
#[derive(Debug)]
pub struct SymbolTable {
    pub symbols: pb::Symbols,
    /// Stack id -> tree node (format version 3); empty where a stack id is a node id.
    pub(super) stacks: Vec<u32>,
    /// The stack tree folded by function name, made on first use ([`SymbolTable::name_trie`]).
    pub(super) name_trie: std::sync::OnceLock<NameTrie>,
}

impl SymbolTable {
    /// Decodes and checks a section; the error says what is wrong.
    pub fn decode(data: &[u8]) -> Result<Self, DecodeError> {
        if data.len() < 12 || &data[..4] != SYMBOLS_MAGIC {
            return Err(DecodeError::Magic("symbols section"));
        }
        let version = u32::from_le_bytes(data[4..8].try_into().expect("4 bytes"));
        if !(MIN_SYMBOLS_VERSION..=SYMBOLS_VERSION).contains(&version) {
            return Err(DecodeError::Version {
                what: "symbols",
                version,
                supported: SYMBOLS_VERSION,
            });
        }
        let (body, crc) = data.split_at(data.len() - 4);
        let crc = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
        if crc32fast::hash(body) != crc {
            return Err(DecodeError::Checksum("symbols"));
        }
        let protobuf = |bytes: &[u8]| {
            pb::Symbols::decode(bytes).map_err(|source| DecodeError::Protobuf {
                what: "symbols",
                source,
            })
        };
        let symbols = if version == 1 {
            protobuf(&body[8..])?
        } else {
            if body.len() < 12 {
                return Err(DecodeError::Truncated("symbols"));
            }
            let len = u32::from_le_bytes(body[8..12].try_into().expect("4 bytes")) as usize;
            let frame = &body[12..];
            // The frame records its own size too: the two must agree before anything is
            // allocated. (No ratio cap: a deep recursive stack's distances and locations are
            // long runs that compress past 1,000×.)
            let content = zstd::zstd_safe::get_frame_content_size(frame)
                .ok()
                .flatten();
            if content != Some(len as u64) {
                return Err(DecodeError::Decompress {
                    what: "symbols",
                    reason: format!("the frame holds {content:?} bytes, the section records {len}"),
                });
            }
            let raw = ZSTD
                .with_borrow_mut(|z| z.decompress(frame, len))
                .map_err(|e| DecodeError::Decompress {
                    what: "symbols",
                    reason: e.to_string(),
                })?;
            if raw.len() != len {
                return Err(DecodeError::Decompress {
                    what: "symbols",
                    reason: format!("{} bytes, the section records {len}", raw.len()),
                });
            }
            let mut symbols = protobuf(&raw)?;
            if !symbols.stack_parents.is_empty() {
                return Err(DecodeError::StackTreeLength);
            }
            let distances = std::mem::take(&mut symbols.stack_parent_distances);
            let mut parents = Vec::with_capacity(distances.len());
            for (i, d) in distances.into_iter().enumerate() {
                // Node 0 is the root (distance 0); every other parent comes before its node.
                match (i as u32).checked_sub(d) {
                    Some(p) if (d > 0) == (i > 0) => parents.push(p),
                    _ => return Err(DecodeError::StackNodeOrder(i)),
                }
            }
            symbols.stack_parents = parents;
            symbols
        };
        if version < 3 && !symbols.stack_node_deltas.is_empty() {
            return Err(DecodeError::OutOfRange("stack ids before format version 3"));
        }
        let mut symbols = symbols;
        if version >= 4 {
            if !symbols.functions.is_empty() {
                return Err(DecodeError::OutOfRange(
                    "functions as messages in format version 4",
                ));
            }
            symbols.functions = functions_of_columns(&mut symbols)?;
        } else if !symbols.function_name_deltas.is_empty()
            || !symbols.function_system_name_deltas.is_empty()
            || !symbols.function_filename_deltas.is_empty()
            || !symbols.function_start_line_deltas.is_empty()
        {
            return Err(DecodeError::OutOfRange(
                "function columns before format version 4",
            ));
        }
        let t = Self::new(symbols)?;
        t.validate()?;
        Ok(t)
    }

    /// A table of `symbols`, its stack ids resolved (the rest not checked:
    /// [`SymbolTable::decode`] checks what it reads).
    pub fn new(mut symbols: pb::Symbols) -> Result<Self, DecodeError> {
        let nodes = symbols.stack_locations.len() as i64;
        let mut node = 0i64;
        let mut stacks = Vec::with_capacity(symbols.stack_node_deltas.len());
        for d in std::mem::take(&mut symbols.stack_node_deltas) {
            node = node.saturating_add(d);
            if !(0..nodes).contains(&node) {
                return Err(DecodeError::OutOfRange("stack id"));
            }
            stacks.push(node as u32);
        }
        Ok(Self {
            symbols,
            stacks,
            name_trie: std::sync::OnceLock::new(),
        })
    }

    /// A table of `symbols`, which have this table's stack tree (other names for its
    /// locations), with this table's stack ids.
    pub(crate) fn with_tree_of(&self, symbols: pb::Symbols) -> Self {
        Self {
            symbols,
            stacks: self.stacks.clone(),
            name_trie: std::sync::OnceLock::new(),
        }
    }

    /// The stack tree folded by function name, made on the first call and kept with the table.
    pub fn name_trie(&self) -> &NameTrie {
        self.name_trie
            .get_or_init(|| NameTrie::new(&self.symbols, &self.stacks))
    }

    fn validate(&self) -> Result<(), DecodeError> {
        let s = &self.symbols;
        let n_str = s.strings.len() as u32;
        if s.stack_parents.len() != s.stack_locations.len() || s.stack_parents.is_empty() {
            return Err(DecodeError::StackTreeLength);
        }
        for (i, &p) in s.stack_parents.iter().enumerate().skip(1) {
            if p as usize >= i || s.stack_locations[i] as usize >= s.locations.len() {
                return Err(DecodeError::StackNodeOrder(i));
            }
        }
        for f in &s.functions {
            if f.name >= n_str || f.system_name >= n_str || f.filename >= n_str {
                return Err(DecodeError::OutOfRange("function string"));
            }
        }
        for m in &s.mappings {
            if m.filename >= n_str || m.build_id >= n_str {
                return Err(DecodeError::OutOfRange("mapping string"));
            }
        }
        for l in &s.locations {
            if l.mapping as usize > s.mappings.len()
                || l.line_functions.len() != l.line_numbers.len()
                || l.line_functions
                    .iter()
                    .any(|&f| f as usize >= s.functions.len())
                || l.frame_type >= n_str
            {
                return Err(DecodeError::OutOfRange("location"));
            }
        }
        Ok(())
    }

    /// Number of stack ids: rows' stack ids are below it.
    pub fn stack_count(&self) -> usize {
        if self.stacks.is_empty() {
            self.symbols.stack_parents.len()
        } else {
            self.stacks.len()
        }
    }

    /// Number of nodes of the stack tree, the root included.
    pub fn node_count(&self) -> usize {
        self.symbols.stack_parents.len()
    }

    /// What this table holds, as [`SymbolsBuilder::with_capacity`] takes it: a compaction's
    /// output starts with room for the largest of its sources' tables.
    pub fn capacity_hint(&self) -> SymbolsCapacity {
        let s = &self.symbols;
        SymbolsCapacity {
            strings: s.strings.len(),
            mappings: s.mappings.len(),
            functions: s.functions.len(),
            locations: s.locations.len(),
            nodes: s.stack_parents.len(),
            stacks: self.stack_count(),
        }
    }

    /// The tree node of stack id `id` (`None` past [`SymbolTable::stack_count`]).
    pub fn stack_node(&self, id: u32) -> Option<u32> {
        if self.stacks.is_empty() {
            ((id as usize) < self.symbols.stack_parents.len()).then_some(id)
        } else {
            self.stacks.get(id as usize).copied()
        }
    }

    /// The locations of stack `id`, leaf first. Unknown ids give an empty stack.
    pub fn stack_locations(&self, id: u32, out: &mut Vec<u32>) {
        out.clear();
        let s = &self.symbols;
        let Some(node) = self.stack_node(id) else {
            return;
        };
        let mut node = node as usize;
        while node != 0 {
            out.push(s.stack_locations[node]);
            node = s.stack_parents[node] as usize;
        }
    }

    /// The string at `i`.
    pub fn string(&self, i: u32) -> &str {
        self.symbols
            .strings
            .get(i as usize)
            .map_or("", String::as_str)
    }

    /// Function names of a location, innermost first.
    pub fn location_function_names(&self, loc: u32) -> impl Iterator<Item = &str> {
        self.symbols.locations[loc as usize]
            .line_functions
            .iter()
            .map(|&f| self.string(self.symbols.functions[f as usize].name))
    }

    /// Approximate memory use, for the cache weigher.
    pub fn estimated_bytes(&self) -> usize {
        let s = &self.symbols;
        // The name trie's nodes: at most one per line of each stack node's location (inlined
        // functions).
        let trie_nodes: usize = s
            .stack_locations
            .iter()
            .map(|&l| {
                s.locations
                    .get(l as usize)
                    .map_or(1, |l| l.line_functions.len().max(1))
            })
            .sum();
        s.strings.iter().map(|x| x.len() + 24).sum::<usize>()
            + s.functions.len() * 24
            + s.locations.len() * 64
            // The stack tree (parent and location, 8 bytes a node), the node's trie node (4),
            // the stack ids (4 bytes each, twice: theirs and the trie's) and the trie (8 bytes
            // a node).
            + s.stack_parents.len() * 12
            + self.stacks.len() * 8
            + trie_nodes * 8
    }
}
