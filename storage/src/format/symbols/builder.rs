//! The symbols writer: profiles' symbols deduplicated into one block's tables as they are
//! added, then encoded as a section.

use crate::format::tiers::Pages;
use bytes::Bytes;
use hashbrown::{DefaultHashBuilder, HashMap, HashTable};
use kiln_otel::model::Symbols as ProfileSymbols;
use kiln_proto::kiln::storage::v1 as pb;
use prost::Message;
use std::hash::{BuildHasher, BuildHasherDefault};

#[cfg(any(test, feature = "testing"))]
use super::codec::v1_section;
use super::codec::{ZSTD, function_columns, sealed};
use super::*;

/// Accumulates the symbols of one block, deduplicating as profiles are added.
#[derive(Debug)]
pub struct SymbolsBuilder {
    pub(super) strings: Vec<String>,
    /// Bytes of `strings`, kept as they are added ([`Self::estimated_bytes`] runs per write).
    pub(super) string_bytes: usize,
    /// Indices into `strings` by the string's 128-bit xxh3: a hit reads no stored string, and
    /// each string is held once (a collision of two strings is a 2^-128 chance).
    pub(super) string_index: HashMap<u128, u32, BuildHasherDefault<PreHashed>>,
    pub(super) mappings: Vec<pb::Mapping>,
    pub(super) mapping_index: HashMap<(u64, u64, u64, u32, u32), u32>,
    pub(super) functions: Vec<pb::Function>,
    pub(super) function_index: HashMap<(u32, u32, u32, i64), u32>,
    pub(super) locations: Vec<pb::Location>,
    /// Indices into `locations`, by a hash of their content (looked up without building one).
    pub(super) location_index: HashTable<u32>,
    /// Indices into `locations` by the 128-bit xxh3 of a profile's location as
    /// [`Self::add_locations`] keys it (its strings' hashes, not this block's indices).
    pub(super) location_keys: HashMap<u128, u32, BuildHasherDefault<PreHashed>>,
    pub(super) hasher: DefaultHashBuilder,
    /// Reused buffers for a location's lines while it is looked up.
    pub(super) scratch_functions: Vec<u32>,
    pub(super) scratch_lines: Vec<i64>,
    pub(super) scratch_key: Vec<u8>,
    pub(super) scratch_hashes: Vec<u128>,
    pub(super) parents: Vec<u32>,
    pub(super) node_locations: Vec<u32>,
    pub(super) children: HashMap<(u32, u32), u32>,
    /// Stack id -> tree node: the stacks rows refer to, numbered as they are first met.
    pub(super) stacks: Vec<u32>,
    /// Tree node -> its stack id plus one (0: no row refers to the node yet).
    pub(super) node_stacks: Vec<u32>,
    /// Stack ids of the stacks [`Self::add_stack_path`] added, by the 128-bit xxh3 of their
    /// locations (leaf first): a stack met again in the same block (a service's hot stacks,
    /// profile after profile) is one hash and one probe, not a probe of `children` per frame
    /// (two stacks sharing a hash are a 2^-128 chance, as two strings are).
    pub(super) stack_paths: HashMap<u128, u32, BuildHasherDefault<PreHashed>>,
    /// [`Self::add_stack_path`] calls, and those that found their stack in `stack_paths`.
    pub(super) path_lookups: u64,
    pub(super) path_hits: u64,
}

/// The hasher of keys that are hashes already: the low 64 bits of the key.
#[derive(Default)]
pub(crate) struct PreHashed(u64);

impl std::hash::Hasher for PreHashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u128 keys are hashed with it; fold anything else in so it stays a hash.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64;
    }
}

impl Default for SymbolsBuilder {
    fn default() -> Self {
        Self {
            // String 0 is the empty string, as in pprof.
            strings: vec![String::new()],
            string_bytes: 0,
            string_index: HashMap::default(),
            mappings: Vec::new(),
            mapping_index: HashMap::new(),
            functions: Vec::new(),
            function_index: HashMap::new(),
            locations: Vec::new(),
            location_index: HashTable::new(),
            location_keys: HashMap::default(),
            hasher: DefaultHashBuilder::default(),
            scratch_functions: Vec::new(),
            scratch_lines: Vec::new(),
            scratch_key: Vec::new(),
            scratch_hashes: Vec::new(),
            parents: vec![0],
            node_locations: vec![0],
            children: HashMap::new(),
            stacks: Vec::new(),
            node_stacks: vec![0],
            stack_paths: HashMap::default(),
            path_lookups: 0,
            path_hits: 0,
        }
    }
}

/// How many strings, mappings, functions, locations, tree nodes and stacks a
/// [`SymbolsBuilder`] held ([`SymbolsBuilder::capacity_hint`]): a shard's next segment of the
/// same tenant starts with room for as many ([`SymbolsBuilder::with_capacity`]), its tables
/// reserved once rather than grown by doubling and rehashing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SymbolsCapacity {
    pub(super) strings: usize,
    pub(super) mappings: usize,
    pub(super) functions: usize,
    pub(super) locations: usize,
    pub(super) nodes: usize,
    pub(super) stacks: usize,
}

impl SymbolsCapacity {
    /// Room for the larger of each table: what a merge of blocks holds at least.
    pub fn max(self, other: Self) -> Self {
        Self {
            strings: self.strings.max(other.strings),
            mappings: self.mappings.max(other.mappings),
            functions: self.functions.max(other.functions),
            locations: self.locations.max(other.locations),
            nodes: self.nodes.max(other.nodes),
            stacks: self.stacks.max(other.stacks),
        }
    }
}

impl SymbolsBuilder {
    /// An empty builder with room for `c`. The stack paths' table is left to grow:
    /// [`Self::estimated_bytes`] counts its capacity, and a flush follows that estimate.
    pub fn with_capacity(c: SymbolsCapacity) -> Self {
        let mut b = Self::default();
        b.strings.reserve(c.strings);
        b.string_index.reserve(c.strings);
        b.mappings.reserve(c.mappings);
        b.mapping_index.reserve(c.mappings);
        b.functions.reserve(c.functions);
        b.function_index.reserve(c.functions);
        b.locations.reserve(c.locations);
        b.location_index = HashTable::with_capacity(c.locations);
        b.location_keys.reserve(c.locations);
        b.parents.reserve(c.nodes);
        b.node_locations.reserve(c.nodes);
        b.node_stacks.reserve(c.nodes);
        b.children.reserve(c.nodes);
        b.stacks.reserve(c.stacks);
        b
    }

    /// What this builder holds, as [`Self::with_capacity`] takes it.
    pub fn capacity_hint(&self) -> SymbolsCapacity {
        SymbolsCapacity {
            strings: self.strings.len(),
            mappings: self.mappings.len(),
            functions: self.functions.len(),
            locations: self.locations.len(),
            nodes: self.parents.len(),
            stacks: self.stacks.len(),
        }
    }

    fn string(&mut self, s: &str) -> u32 {
        if s.is_empty() {
            return 0; // interned first, by `Default`
        }
        let key = string_hash(s);
        let next = self.strings.len() as u32;
        let i = *self.string_index.entry(key).or_insert(next);
        if i == next {
            self.strings.push(s.to_owned());
            self.string_bytes += s.len();
        }
        i
    }

    /// Interns a mapping whose strings are already interned.
    fn intern_mapping(&mut self, m: pb::Mapping) -> u32 {
        let key = (
            m.memory_start,
            m.memory_limit,
            m.file_offset,
            m.filename,
            m.build_id,
        );
        if let Some(&i) = self.mapping_index.get(&key) {
            return i;
        }
        let i = self.mappings.len() as u32;
        self.mappings.push(m);
        self.mapping_index.insert(key, i);
        i
    }

    /// Interns a function whose strings are already interned.
    fn intern_function(&mut self, f: pb::Function) -> u32 {
        let key = (f.name, f.system_name, f.filename, f.start_line);
        if let Some(&i) = self.function_index.get(&key) {
            return i;
        }
        let i = self.functions.len() as u32;
        self.functions.push(f);
        self.function_index.insert(key, i);
        i
    }

    /// Interns a location whose mapping, functions and strings are already interned, given by
    /// its parts; nothing is allocated unless it is new.
    fn intern_location(
        &mut self,
        mapping: u32,
        address: u64,
        line_functions: &[u32],
        line_numbers: &[i64],
        frame_type: u32,
    ) -> u32 {
        let hash =
            self.hasher
                .hash_one((mapping, address, line_functions, line_numbers, frame_type));
        let locations = &self.locations;
        if let Some(&i) = self.location_index.find(hash, |&i| {
            let l = &locations[i as usize];
            l.mapping == mapping
                && l.address == address
                && l.frame_type == frame_type
                && l.line_functions == line_functions
                && l.line_numbers == line_numbers
        }) {
            return i;
        }
        let i = self.locations.len() as u32;
        self.locations.push(pb::Location {
            mapping,
            address,
            line_functions: line_functions.to_vec(),
            line_numbers: line_numbers.to_vec(),
            frame_type,
        });
        let (locations, hasher) = (&self.locations, &self.hasher);
        self.location_index.insert_unique(hash, i, |&j| {
            let l = &locations[j as usize];
            hasher.hash_one((
                l.mapping,
                l.address,
                l.line_functions.as_slice(),
                l.line_numbers.as_slice(),
                l.frame_type,
            ))
        });
        i
    }

    /// Interns a profile's locations (and the functions and mappings they name); returns, for
    /// every location of the profile, its index in this block.
    ///
    /// A location is found by the 128-bit xxh3 of its content ([`Self::location_keys`]): its
    /// mapping, address and frame type, and for each line the line number and the hashes of
    /// its function's strings. A location met before (most of a profile's: a service's stacks
    /// repeat) is one probe; its function's strings and the function itself are interned only
    /// when the location is new. A function no location names is not kept.
    pub fn add_locations(&mut self, symbols: &ProfileSymbols) -> Vec<u32> {
        let mappings: Vec<u32> = symbols
            .mappings
            .iter()
            .map(|m| {
                let mapping = pb::Mapping {
                    memory_start: m.memory_start,
                    memory_limit: m.memory_limit,
                    file_offset: m.file_offset,
                    filename: self.string(&m.filename),
                    build_id: self.string(&m.build_id),
                    has_functions: m.has_functions,
                };
                self.intern_mapping(mapping)
            })
            .collect();
        // Per function of the profile: the hash of its content, then (once a new location
        // names it) its index in this block; computed when a location first names it.
        const UNSET: u32 = u32::MAX;
        let mut function_keys: Vec<Option<u128>> = vec![None; symbols.functions.len()];
        let mut function_ids: Vec<u32> = vec![UNSET; symbols.functions.len()];
        // A profile's functions share their file names (`model::Function`'s strings are
        // shared): each one is hashed once, then found by its address and length (an empty
        // string may start where another one does; two strings never share both).
        let mut files: hashbrown::HashMap<(*const u8, usize), u128> = hashbrown::HashMap::new();
        let same = |a: &str, b: &str| a.as_ptr() == b.as_ptr() && a.len() == b.len();
        let mut function_key = |i: usize| -> u128 {
            if let Some(k) = function_keys[i] {
                return k;
            }
            let f = &symbols.functions[i];
            let name = string_hash(&f.name);
            // Most producers (Go's runtime/pprof among them) repeat the name here: comparing
            // the bytes costs less than hashing them again.
            let system_name = if same(&f.system_name, &f.name) || f.system_name == f.name {
                name
            } else {
                string_hash(&f.system_name)
            };
            let filename = *files
                .entry((f.filename.as_ptr(), f.filename.len()))
                .or_insert_with(|| string_hash(&f.filename));
            let mut key = [0u8; 56];
            key[..16].copy_from_slice(&name.to_le_bytes());
            key[16..32].copy_from_slice(&system_name.to_le_bytes());
            key[32..48].copy_from_slice(&filename.to_le_bytes());
            key[48..].copy_from_slice(&f.start_line.to_le_bytes());
            let k = xxhash_rust::xxh3::xxh3_128(&key);
            function_keys[i] = Some(k);
            k
        };
        // Three passes: every location's key, then the lookups, then the new locations. The
        // lookups are most of the cost (a table of a block's locations is larger than the
        // caches, and a probe waits on memory); in a loop of their own, independent of each
        // other and of hashing, the processor has several in flight at once.
        let mut key = std::mem::take(&mut self.scratch_key);
        let mut hashes = std::mem::take(&mut self.scratch_hashes);
        hashes.clear();
        for l in &symbols.locations {
            let mapping = l.mapping.map_or(0, |m| mappings[m as usize] + 1);
            let frame_type = self.string(&l.frame_type);
            key.clear();
            key.extend_from_slice(&mapping.to_le_bytes());
            key.extend_from_slice(&frame_type.to_le_bytes());
            key.extend_from_slice(&l.address.to_le_bytes());
            for line in &l.lines {
                key.extend_from_slice(&function_key(line.function as usize).to_le_bytes());
                key.extend_from_slice(&line.line.to_le_bytes());
            }
            hashes.push(xxhash_rust::xxh3::xxh3_128(&key));
        }
        self.scratch_key = key;
        let mut out: Vec<u32> = hashes
            .iter()
            .map(|hash| self.location_keys.get(hash).copied().unwrap_or(UNSET))
            .collect();
        let (mut funcs, mut lines) = (
            std::mem::take(&mut self.scratch_functions),
            std::mem::take(&mut self.scratch_lines),
        );
        for ((l, &hash), slot) in symbols.locations.iter().zip(&hashes).zip(&mut out) {
            if *slot != UNSET {
                continue;
            }
            // The same content twice in one profile: the first made it.
            if let Some(&i) = self.location_keys.get(&hash) {
                *slot = i;
                continue;
            }
            funcs.clear();
            for line in &l.lines {
                let id = &mut function_ids[line.function as usize];
                if *id == UNSET {
                    *id = self.intern_profile_function(&symbols.functions[line.function as usize]);
                }
                funcs.push(*id);
            }
            lines.clear();
            lines.extend(l.lines.iter().map(|x| x.line));
            let mapping = l.mapping.map_or(0, |m| mappings[m as usize] + 1);
            let frame_type = self.string(&l.frame_type);
            let i = self.intern_location(mapping, l.address, &funcs, &lines, frame_type);
            self.location_keys.insert(hash, i);
            *slot = i;
        }
        (
            self.scratch_functions,
            self.scratch_lines,
            self.scratch_hashes,
        ) = (funcs, lines, hashes);
        out
    }

    /// Interns a profile's function (and its strings).
    fn intern_profile_function(&mut self, f: &kiln_otel::model::Function) -> u32 {
        let name = self.string(&f.name);
        let system_name = if f.system_name == f.name {
            name
        } else {
            self.string(&f.system_name)
        };
        let function = pb::Function {
            name,
            system_name,
            filename: self.string(&f.filename),
            start_line: f.start_line,
        };
        self.intern_function(function)
    }

    /// Inserts a stack of block location indices, leaf first; returns its stack id.
    pub fn add_stack(&mut self, leaf_first: impl DoubleEndedIterator<Item = u32>) -> u32 {
        let mut node = 0u32;
        for loc in leaf_first.rev() {
            node = self.child(node, loc);
        }
        self.stack_id(node)
    }

    /// [`Self::add_stack`] of a stack of block location indices, leaf first, found by its
    /// locations' 128-bit xxh3 when this builder added it before (one probe, no walk up the
    /// tree comparing its nodes).
    pub fn add_stack_path(&mut self, leaf_first: &[u32]) -> u32 {
        self.path_lookups += 1;
        let mut key = std::mem::take(&mut self.scratch_key);
        key.clear();
        key.extend(leaf_first.iter().flat_map(|l| l.to_le_bytes()));
        let hash = xxhash_rust::xxh3::xxh3_128(&key);
        self.scratch_key = key;
        if let Some(&id) = self.stack_paths.get(&hash) {
            self.path_hits += 1;
            return id;
        }
        let id = self.add_stack(leaf_first.iter().copied());
        self.stack_paths.insert(hash, id);
        id
    }

    /// How many [`Self::add_stack_path`] calls there were, and how many found their stack.
    pub fn path_lookups(&self) -> (u64, u64) {
        (self.path_lookups, self.path_hits)
    }

    /// The stack id of tree node `node` (of this builder), given the next id if no row refers
    /// to it yet. Rows hold stack ids, not nodes: ids numbered as stacks are first met stay
    /// close together within a series, where its stacks' nodes spread over every node their
    /// paths added (`kiln bench`'s small preset: the stack id column 0.82 -> 0.18 B a row).
    pub fn stack_id(&mut self, node: u32) -> u32 {
        let slot = &mut self.node_stacks[node as usize];
        if *slot == 0 {
            self.stacks.push(node);
            *slot = self.stacks.len() as u32;
        }
        *slot - 1
    }

    /// The tree node of stack id `id` (of this builder).
    pub fn stack_node(&self, id: u32) -> u32 {
        self.stacks[id as usize]
    }

    /// Numbers the stack ids again in the order `ids` (this builder's) first name them, those
    /// it does not name after; returns, for every old id, its new one.
    pub fn renumber_stacks(&mut self, ids: impl Iterator<Item = u32>) -> Vec<u32> {
        const UNSET: u32 = u32::MAX;
        let mut new_of = vec![UNSET; self.stacks.len()];
        let mut stacks = Vec::with_capacity(self.stacks.len());
        for id in ids.chain(0..self.stacks.len() as u32) {
            let slot = &mut new_of[id as usize];
            if *slot == UNSET {
                *slot = stacks.len() as u32;
                stacks.push(self.stacks[id as usize]);
            }
        }
        for (id, &node) in stacks.iter().enumerate() {
            self.node_stacks[node as usize] = id as u32 + 1;
        }
        self.stacks = stacks;
        for id in self.stack_paths.values_mut() {
            *id = new_of[*id as usize];
        }
        new_of
    }

    /// Interns every location of a decoded table (with its functions and mappings); returns,
    /// for every location of `table`, its index in this builder.
    pub fn add_table_locations(&mut self, table: &SymbolTable) -> Vec<u32> {
        let t = &table.symbols;
        // Each of the table's strings is hashed once, when first used: a file name or a frame
        // type is used by many functions or locations, a name twice (system name).
        let mut strings = vec![u32::MAX; t.strings.len()];
        let mut string = |this: &mut Self, i: u32| match strings.get_mut(i as usize) {
            Some(s) if *s != u32::MAX => *s,
            Some(s) => {
                *s = this.string(&t.strings[i as usize]);
                *s
            }
            None => 0,
        };
        let mappings: Vec<u32> = t
            .mappings
            .iter()
            .map(|m| {
                let mapping = pb::Mapping {
                    filename: string(self, m.filename),
                    build_id: string(self, m.build_id),
                    ..*m
                };
                self.intern_mapping(mapping)
            })
            .collect();
        let functions: Vec<u32> = t
            .functions
            .iter()
            .map(|f| {
                let function = pb::Function {
                    name: string(self, f.name),
                    system_name: string(self, f.system_name),
                    filename: string(self, f.filename),
                    start_line: f.start_line,
                };
                self.intern_function(function)
            })
            .collect();
        let mut funcs = std::mem::take(&mut self.scratch_functions);
        let out = t
            .locations
            .iter()
            .map(|l| {
                funcs.clear();
                funcs.extend(l.line_functions.iter().map(|&f| functions[f as usize]));
                let frame_type = string(self, l.frame_type);
                self.intern_location(
                    match l.mapping {
                        0 => 0,
                        m => mappings[m as usize - 1] + 1,
                    },
                    l.address,
                    &funcs,
                    &l.line_numbers,
                    frame_type,
                )
            })
            .collect();
        self.scratch_functions = funcs;
        out
    }

    /// The child of stack node `parent` at location `loc` (both of this builder), created if
    /// missing.
    pub fn child(&mut self, parent: u32, loc: u32) -> u32 {
        // One probe, hit or miss: a fresh segment's profiles are mostly misses.
        let (parents, node_locations, node_stacks) = (
            &mut self.parents,
            &mut self.node_locations,
            &mut self.node_stacks,
        );
        *self.children.entry((parent, loc)).or_insert_with(|| {
            parents.push(parent);
            node_locations.push(loc);
            node_stacks.push(0);
            parents.len() as u32 - 1
        })
    }

    /// Nodes of the stack tree, the root included.
    pub fn stack_nodes(&self) -> usize {
        self.parents.len()
    }

    /// Rough heap size, for flush decisions.
    pub fn estimated_bytes(&self) -> usize {
        self.string_bytes
            + self.strings.len() * 48
            + self.functions.len() * 64
            + self.locations.len() * 96
            + self.location_keys.capacity() * 20
            + self.parents.len() * 44
            + self.stacks.len() * 4
            + self.stack_paths.capacity() * 33
    }

    /// Encodes the section.
    ///
    /// The rows must hold this builder's stack ids; under [`testing::WRITE_VERSION`] 1 or 2
    /// they must hold tree nodes ([`SymbolsBuilder::stack_node`]), as those versions have no
    /// stack ids.
    pub fn encode(self) -> crate::Result<Bytes> {
        Ok(self.encode_with_table(Pages::Kept)?.0)
    }

    /// [`Self::encode`], and the table a reader decodes from it, made of the builder's own
    /// vectors rather than decoded: the writer and the compactor hand it to the query engine's
    /// cache, so the first query of a new block neither reads nor decodes its symbols.
    /// `pages`: what the section's block is; a segment's section is compressed at zstd's fast
    /// level, a compacted block's at level 1 (the same format either way).
    pub fn encode_with_table(self, pages: Pages) -> crate::Result<(Bytes, SymbolTable)> {
        #[cfg(feature = "testing")]
        match testing::legacy_version() {
            Some(1) => {
                let bytes = self.encode_v1();
                let table = SymbolTable::decode(&bytes).map_err(|e| {
                    crate::Error::InvalidWrite(format!("a version 1 symbols section: {e}"))
                })?;
                return Ok((bytes, table));
            }
            Some(v) => return self.encode_version(v.min(SYMBOLS_VERSION), pages),
            None => {}
        }
        self.encode_version(SYMBOLS_VERSION, pages)
    }

    /// The zstd encoding of format `version` (2: without stack ids; 3: functions as messages;
    /// 4), and the table [`SymbolTable::decode`] makes of it.
    pub(super) fn encode_version(
        self,
        version: u32,
        pages: Pages,
    ) -> crate::Result<(Bytes, SymbolTable)> {
        let distances = self
            .parents
            .iter()
            .enumerate()
            .map(|(i, &p)| i as u32 - p)
            .collect();
        let mut previous = 0i64;
        let stack_node_deltas = if version >= 3 {
            self.stacks
                .iter()
                .map(|&n| {
                    let d = i64::from(n) - previous;
                    previous = i64::from(n);
                    d
                })
                .collect()
        } else {
            Vec::new()
        };
        let mut msg = pb::Symbols {
            strings: self.strings,
            mappings: self.mappings,
            functions: Vec::new(),
            locations: self.locations,
            stack_parents: Vec::new(),
            stack_locations: self.node_locations,
            stack_parent_distances: distances,
            stack_node_deltas,
            ..Default::default()
        };
        let mut functions = self.functions;
        if version >= 4 {
            function_columns(&functions, &mut msg);
        } else {
            msg.functions = std::mem::take(&mut functions);
        }
        let raw = msg.encode_to_vec();
        // Never met: flushes and compaction outputs are cut far below it (`flush_bytes`,
        // `max_output_stack_nodes`).
        let raw_len = u32::try_from(raw.len()).map_err(|_| {
            crate::Error::InvalidWrite(format!(
                "a symbols section of {} bytes is past the format's 4 GiB",
                raw.len()
            ))
        })?;
        let compressed = ZSTD.with_borrow_mut(|z| z.compress(&raw, pages));
        let bytes = sealed(version, &[&raw_len.to_le_bytes(), &compressed]);
        // What decoding makes of it: the tree as parents, functions as messages.
        msg.stack_parent_distances = Vec::new();
        msg.stack_parents = self.parents;
        if version >= 4 {
            msg.functions = functions;
            msg.function_name_deltas = Vec::new();
            msg.function_system_name_deltas = Vec::new();
            msg.function_filename_deltas = Vec::new();
            msg.function_start_line_deltas = Vec::new();
        }
        let table = SymbolTable::new(msg)
            .map_err(|e| crate::Error::InvalidWrite(format!("a symbols section: {e}")))?;
        Ok((bytes, table))
    }

    /// The format version 1 encoding (uncompressed, parents themselves), for the tests that
    /// check old blocks still read and compact.
    #[cfg(any(test, feature = "testing"))]
    pub fn encode_v1(self) -> Bytes {
        v1_section(&pb::Symbols {
            strings: self.strings,
            mappings: self.mappings,
            functions: self.functions,
            locations: self.locations,
            stack_parents: self.parents,
            stack_locations: self.node_locations,
            stack_parent_distances: Vec::new(),
            ..Default::default()
        })
    }
}
