//! The symbols section of a block: strings, mappings, functions, locations and a stack tree.
//!
//! Stacks are stored once, as a parent-pointer tree (a trie over root-first location paths):
//! a stack is the path from a tree node up to the root. Samples store only a stack id, so a
//! stack shared by many samples, profiles and series costs a few bits a row. Stack ids are
//! numbered apart from the nodes, as the block's writer first meets them in its sorted rows
//! (format version 3), so a series' stacks have neighbouring ids and its rows' delta-coded ids
//! stay small; the section lists each id's node.
//!
//! On disk (format version 4): `b"KSYM"`, `u32` LE version, `u32` LE length of the protobuf
//! `kiln.storage.v1.Symbols`, the protobuf in one zstd frame (the stack tree's parents as
//! distances back, each stack id's node as a delta from the previous id's, the functions as
//! four columns of differences), then a `u32` LE CRC32 of everything before it. Version 3,
//! still read, had the functions as messages; version 2 had no stack ids either (an id was a
//! node); version 1 had the protobuf uncompressed, with the parents themselves, and no length. Function and file names
//! are most of a section's bytes, and a fresh segment's section is most of the segment (its
//! names are amortised over a few profiles' rows): zstd takes a section to ~0.4× (ADR 0002).

use std::hash::{BuildHasher, BuildHasherDefault};

use hashbrown::{DefaultHashBuilder, HashMap, HashTable};

use bytes::Bytes;
use kiln_otel::model::Symbols as ProfileSymbols;
use kiln_proto::kiln::storage::v1 as pb;
use prost::Message;

use crate::error::DecodeError;
use crate::format::block::Pages;

/// Magic bytes of a symbols section.
pub const SYMBOLS_MAGIC: &[u8; 4] = b"KSYM";
/// Current symbols format version: 3 added stack ids apart from tree nodes, 4 the functions
/// as delta-coded columns.
pub const SYMBOLS_VERSION: u32 = 4;
/// The oldest symbols format version still read.
pub const MIN_SYMBOLS_VERSION: u32 = 1;
/// zstd level of symbols sections. Every level of compaction writes its output's section
/// again, so this is paid ~80 raw bytes a sample row over a row's life; level 3 cost 5–9 % of
/// the `small` bench's ingest CPU, level 1 about half that, for 4 % more bytes (fresh
/// segments' sections measured 22.2 / 21.3 / 18.7 B a row at levels 1 / 3 / 9, compacted blocks
/// 0.36 / 0.34 / 0.32).
const SYMBOLS_ZSTD_LEVEL: i32 = 1;
/// zstd level of a segment's symbols section: one of zstd's fast levels, for a section the
/// first merge reads once and replaces within seconds.
const SEGMENT_SYMBOLS_ZSTD_LEVEL: i32 = -3;

/// Accumulates the symbols of one block, deduplicating as profiles are added.
#[derive(Debug)]
pub struct SymbolsBuilder {
    strings: Vec<String>,
    /// Bytes of `strings`, kept as they are added ([`Self::estimated_bytes`] runs per write).
    string_bytes: usize,
    /// Indices into `strings` by the string's 128-bit xxh3: a hit reads no stored string, and
    /// each string is held once (a collision of two strings is a 2^-128 chance).
    string_index: HashMap<u128, u32, BuildHasherDefault<PreHashed>>,
    mappings: Vec<pb::Mapping>,
    mapping_index: HashMap<(u64, u64, u64, u32, u32), u32>,
    functions: Vec<pb::Function>,
    function_index: HashMap<(u32, u32, u32, i64), u32>,
    locations: Vec<pb::Location>,
    /// Indices into `locations`, by a hash of their content (looked up without building one).
    location_index: HashTable<u32>,
    /// Indices into `locations` by the 128-bit xxh3 of a profile's location as
    /// [`Self::add_locations`] keys it (its strings' hashes, not this block's indices).
    location_keys: HashMap<u128, u32, BuildHasherDefault<PreHashed>>,
    hasher: DefaultHashBuilder,
    /// Reused buffers for a location's lines while it is looked up.
    scratch_functions: Vec<u32>,
    scratch_lines: Vec<i64>,
    scratch_key: Vec<u8>,
    scratch_hashes: Vec<u128>,
    parents: Vec<u32>,
    node_locations: Vec<u32>,
    children: HashMap<(u32, u32), u32>,
    /// Stack id -> tree node: the stacks rows refer to, numbered as they are first met.
    stacks: Vec<u32>,
    /// Tree node -> its stack id plus one (0: no row refers to the node yet).
    node_stacks: Vec<u32>,
    /// Stack ids of the stacks [`Self::add_stack_path`] added, by the 128-bit xxh3 of their
    /// locations (leaf first): a stack met again in the same block (a service's hot stacks,
    /// profile after profile) is one hash and one probe, not a probe of `children` per frame
    /// (two stacks sharing a hash are a 2^-128 chance, as two strings are).
    stack_paths: HashMap<u128, u32, BuildHasherDefault<PreHashed>>,
    /// [`Self::add_stack_path`] calls, and those that found their stack in `stack_paths`.
    path_lookups: u64,
    path_hits: u64,
}

/// A thread's zstd contexts, made on first use and kept: making one per section (what
/// `zstd::bulk::compress` does) cost more than compressing a fresh segment's names.
struct Zstd {
    /// A segment's compressor, and a compacted block's.
    compressors: [Option<zstd::bulk::Compressor<'static>>; 2],
    decompressor: Option<zstd::bulk::Decompressor<'static>>,
}

thread_local! {
    static ZSTD: std::cell::RefCell<Zstd> = const {
        std::cell::RefCell::new(Zstd {
            compressors: [None, None],
            decompressor: None,
        })
    };
}

impl Zstd {
    fn compress(&mut self, raw: &[u8], pages: Pages) -> Vec<u8> {
        let expect = "zstd's context and a Vec sized by its bound do not fail";
        let (slot, level) = match pages {
            Pages::Segment => (0, SEGMENT_SYMBOLS_ZSTD_LEVEL),
            Pages::Fresh | Pages::Kept => (1, SYMBOLS_ZSTD_LEVEL),
        };
        let c = match &mut self.compressors[slot] {
            Some(c) => c,
            None => {
                self.compressors[slot].insert(zstd::bulk::Compressor::new(level).expect(expect))
            }
        };
        c.compress(raw).expect(expect)
    }

    fn decompress(&mut self, frame: &[u8], len: usize) -> std::io::Result<Vec<u8>> {
        let d = match &mut self.decompressor {
            Some(d) => d,
            None => self.decompressor.insert(zstd::bulk::Decompressor::new()?),
        };
        d.decompress(frame, len)
    }
}

/// Switches for the tests of old formats.
#[cfg(feature = "testing")]
pub mod testing {
    /// While not 0, every symbols section the writer makes is written in this older format
    /// version (1: uncompressed; 2: zstd, rows holding tree nodes; 3: functions as messages),
    /// as blocks written before the current version are: for the tests that read and compact
    /// old and new together.
    pub static WRITE_VERSION: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

    /// The older format version the writer is set to make, if any.
    pub fn legacy_version() -> Option<u32> {
        match WRITE_VERSION.load(std::sync::atomic::Ordering::Relaxed) {
            0 => None,
            v => Some(v),
        }
    }
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
    strings: usize,
    mappings: usize,
    functions: usize,
    locations: usize,
    nodes: usize,
    stacks: usize,
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
    fn encode_version(self, version: u32, pages: Pages) -> crate::Result<(Bytes, SymbolTable)> {
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

/// Writes `functions` into `msg` as format version 4's columns of differences.
fn function_columns(functions: &[pb::Function], msg: &mut pb::Symbols) {
    let n = functions.len();
    msg.function_name_deltas.reserve_exact(n);
    msg.function_system_name_deltas.reserve_exact(n);
    msg.function_filename_deltas.reserve_exact(n);
    msg.function_start_line_deltas.reserve_exact(n);
    let (mut name, mut filename, mut start_line) = (0i64, 0i64, 0i64);
    for f in functions {
        let (n, file) = (i64::from(f.name), i64::from(f.filename));
        msg.function_name_deltas.push(n - name);
        msg.function_system_name_deltas
            .push(i64::from(f.system_name) - n);
        msg.function_filename_deltas.push(file - filename);
        msg.function_start_line_deltas
            .push(f.start_line.wrapping_sub(start_line));
        (name, filename, start_line) = (n, file, f.start_line);
    }
}

/// The functions of format version 4's columns (`msg`'s, taken), checked to be four columns of
/// one length whose sums are string indexes (a `u32` each; [`SymbolTable::validate`] checks
/// they name strings).
fn functions_of_columns(msg: &mut pb::Symbols) -> Result<Vec<pb::Function>, DecodeError> {
    let names = std::mem::take(&mut msg.function_name_deltas);
    let system_names = std::mem::take(&mut msg.function_system_name_deltas);
    let filenames = std::mem::take(&mut msg.function_filename_deltas);
    let start_lines = std::mem::take(&mut msg.function_start_line_deltas);
    if [system_names.len(), filenames.len(), start_lines.len()] != [names.len(); 3] {
        return Err(DecodeError::OutOfRange(
            "function columns of unequal lengths",
        ));
    }
    let index = |v: i64| u32::try_from(v).map_err(|_| DecodeError::OutOfRange("function string"));
    let (mut name, mut filename, mut start_line) = (0i64, 0i64, 0i64);
    let mut out = Vec::with_capacity(names.len());
    for i in 0..names.len() {
        name = name.saturating_add(names[i]);
        filename = filename.saturating_add(filenames[i]);
        start_line = start_line.wrapping_add(start_lines[i]);
        out.push(pb::Function {
            name: index(name)?,
            system_name: index(name.saturating_add(system_names[i]))?,
            filename: index(filename)?,
            start_line,
        });
    }
    Ok(out)
}

/// A section of format version 1: `msg` (with its parents) uncompressed.
#[cfg(any(test, feature = "testing"))]
fn v1_section(msg: &pb::Symbols) -> Bytes {
    sealed(1, &[&msg.encode_to_vec()])
}

/// `raw` (a `Symbols` protobuf as a section of `version` holds it: parents as distances from
/// version 2 on) sealed as a section of that version: uncompressed for version 1, else its
/// length and a zstd frame. For the fuzz entry and the tests of damaged sections.
pub(crate) fn sealed_protobuf(version: u32, raw: &[u8]) -> Bytes {
    if version == 1 {
        return sealed(1, &[raw]);
    }
    let compressed = ZSTD.with_borrow_mut(|z| z.compress(raw, Pages::Kept));
    sealed(version, &[&(raw.len() as u32).to_le_bytes(), &compressed])
}

/// A section: magic, `version`, the `body` parts, and the CRC32 of all of it.
fn sealed(version: u32, body: &[&[u8]]) -> Bytes {
    let len = body.iter().map(|b| b.len()).sum::<usize>();
    let mut out = Vec::with_capacity(len + 12);
    out.extend_from_slice(SYMBOLS_MAGIC);
    out.extend_from_slice(&version.to_le_bytes());
    for b in body {
        out.extend_from_slice(b);
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    Bytes::from(out)
}

/// The 128-bit hash a string is known by where strings are interned (the symbols writer,
/// flame trees): equal hashes are taken as equal strings.
pub fn string_hash(s: &str) -> u128 {
    xxhash_rust::xxh3::xxh3_128(s.as_bytes())
}

/// A decoded symbols section.
#[derive(Debug)]
pub struct SymbolTable {
    pub symbols: pb::Symbols,
    /// Stack id -> tree node (format version 3); empty where a stack id is a node id.
    stacks: Vec<u32>,
    /// The stack tree folded by function name, made on first use ([`SymbolTable::name_trie`]).
    name_trie: std::sync::OnceLock<NameTrie>,
}

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
    fn new(s: &pb::Symbols, stacks: &[u32]) -> Self {
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

/// The length of a section's protobuf once decompressed, from its first 12 bytes (`None` when
/// they are not a section's header): what decoding it will hold in memory.
pub fn decoded_len(head: &[u8], section_size: u64) -> Option<u64> {
    if head.len() < 12 || &head[..4] != SYMBOLS_MAGIC {
        return None;
    }
    match u32::from_le_bytes(head[4..8].try_into().expect("4 bytes")) {
        1 => Some(section_size.saturating_sub(12)),
        2..=4 => Some(u64::from(u32::from_le_bytes(
            head[8..12].try_into().expect("4 bytes"),
        ))),
        _ => None,
    }
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

#[cfg(test)]
mod tests {
    use kiln_otel::model::{Function, Line, Location};

    use super::*;

    fn profile_symbols(names: &[&str]) -> ProfileSymbols {
        let mut s = ProfileSymbols::default();
        for (i, n) in names.iter().enumerate() {
            s.functions.push(Function {
                name: (*n).into(),
                ..Default::default()
            });
            s.locations.push(Location {
                lines: kiln_otel::model::smallvec![Line {
                    function: i as u32,
                    line: 1,
                }],
                ..Default::default()
            });
        }
        s
    }

    /// The name trie merges locations of one function (other lines, other addresses), splits
    /// inlined lines into a node each, and leaves a location without lines out.
    #[test]
    fn name_trie_folds_stacks_by_function_name() {
        let mut s = profile_symbols(&["main", "work", "inlined"]);
        // main at another line; work with `inlined` inlined into it (innermost first); and an
        // unsymbolized address.
        s.locations.push(Location {
            lines: kiln_otel::model::smallvec![Line {
                function: 0,
                line: 7,
            }],
            ..Default::default()
        });
        s.locations.push(Location {
            lines: kiln_otel::model::smallvec![
                Line {
                    function: 2,
                    line: 3,
                },
                Line {
                    function: 1,
                    line: 4,
                },
            ],
            ..Default::default()
        });
        s.locations.push(Location {
            address: 0xdead,
            ..Default::default()
        });
        let mut b = SymbolsBuilder::default();
        let map = b.add_locations(&s);
        let stack = |b: &mut SymbolsBuilder, root_first: &[usize]| {
            b.add_stack(root_first.iter().rev().map(|&l| map[l]))
        };
        let a = stack(&mut b, &[0, 1]);
        let other_line = stack(&mut b, &[3, 1]);
        let inlined = stack(&mut b, &[0, 4]);
        let address = stack(&mut b, &[0, 1, 5]);
        let t = SymbolTable::decode(&b.encode().unwrap()).unwrap();
        let trie = t.name_trie();
        let name = |node: u32| t.string(trie.names[trie.names_of[node as usize] as usize]);
        let path = |stack: u32| {
            let mut out = Vec::new();
            let mut node = trie.of_stack[stack as usize];
            while node != 0 {
                out.push(name(node));
                node = trie.parents[node as usize];
            }
            out.reverse();
            out
        };
        assert_eq!(path(a), ["main", "work"]);
        assert_eq!(
            trie.of_stack[other_line as usize],
            trie.of_stack[a as usize]
        );
        assert_eq!(path(inlined), ["main", "work", "inlined"]);
        assert_eq!(trie.of_stack[address as usize], trie.of_stack[a as usize]);
        // root, main, main/work, main/work/inlined
        assert_eq!(trie.len(), 4);
        assert_eq!(trie.names.len(), 3);
        for (i, &n) in trie.names.iter().enumerate() {
            assert_eq!(trie.name_hashes[i], string_hash(t.string(n)));
        }
    }

    #[test]
    fn stacks_share_prefixes_and_round_trip() {
        let mut b = SymbolsBuilder::default();
        let map = b.add_locations(&profile_symbols(&["main", "a", "b"]));
        let map2 = b.add_locations(&profile_symbols(&["b", "main"]));
        assert_eq!(
            map2,
            vec![map[2], map[0]],
            "locations are deduplicated across profiles"
        );
        let s1 = b.add_stack([map[1], map[0]].into_iter()); // main -> a
        let s2 = b.add_stack([map[2], map[0]].into_iter()); // main -> b
        let s3 = b.add_stack([map[1], map[0]].into_iter());
        assert_eq!(s1, s3);
        assert_ne!(s1, s2);
        let t = SymbolTable::decode(&b.encode().unwrap()).unwrap();
        assert_eq!(t.node_count(), 4, "root, main, main>a, main>b");
        assert_eq!(t.stack_count(), 2, "the stacks rows name");
        assert_eq!((s1, s2), (0, 1), "ids numbered as stacks are first met");
        let mut locs = Vec::new();
        t.stack_locations(s2, &mut locs);
        let names: Vec<&str> = locs
            .iter()
            .flat_map(|&l| t.location_function_names(l))
            .collect();
        assert_eq!(names, ["b", "main"]);
    }

    proptest::proptest! {
        /// Stacks found by their locations get the ids, and build the tree, that walking them
        /// frame by frame does: prefixes of other stacks, the empty stack and repeats included.
        #[test]
        fn stacks_found_by_path_are_the_stacks_walked(
            stacks in proptest::collection::vec(proptest::collection::vec(1u32..5, 0..6), 1..80),
        ) {
            let (mut walked, mut found) = (SymbolsBuilder::default(), SymbolsBuilder::default());
            for stack in &stacks {
                let a = walked.add_stack(stack.iter().copied());
                let b = found.add_stack_path(stack);
                proptest::prop_assert_eq!(a, b);
            }
            proptest::prop_assert_eq!(&walked.parents, &found.parents);
            proptest::prop_assert_eq!(&walked.node_locations, &found.node_locations);
            proptest::prop_assert_eq!(&walked.stacks, &found.stacks);
            let distinct: std::collections::HashSet<&Vec<u32>> = stacks.iter().collect();
            let (lookups, hits) = found.path_lookups();
            proptest::prop_assert_eq!(lookups, stacks.len() as u64);
            proptest::prop_assert_eq!(hits, (stacks.len() - distinct.len()) as u64);
            // Renumbered, the stacks are still found, under their new ids.
            let reversed = (0..walked.stacks.len() as u32).rev();
            proptest::prop_assert_eq!(
                walked.renumber_stacks(reversed.clone()),
                found.renumber_stacks(reversed)
            );
            for stack in &stacks {
                let a = walked.add_stack(stack.iter().copied());
                let b = found.add_stack_path(stack);
                proptest::prop_assert_eq!(a, b);
            }
            proptest::prop_assert_eq!(found.path_lookups().1, hits + stacks.len() as u64);
        }
    }

    fn sample_builder() -> SymbolsBuilder {
        let mut b = SymbolsBuilder::default();
        let names: Vec<String> = (0..200)
            .map(|i| format!("github.com/acme/service/internal/handler.(*Server).Handle{i}"))
            .collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let map = b.add_locations(&profile_symbols(&names));
        for leaf in 1..map.len() {
            b.add_stack([map[leaf], map[leaf / 2], map[0]].into_iter());
        }
        b
    }

    #[test]
    fn version_1_sections_still_read_as_version_2_does() {
        let v1 = SymbolTable::decode(&sample_builder().encode_v1()).unwrap();
        let v2_bytes = sample_builder().encode().unwrap();
        assert_eq!(&v2_bytes[4..8], &SYMBOLS_VERSION.to_le_bytes());
        let v2 = SymbolTable::decode(&v2_bytes).unwrap();
        assert_eq!(v1.symbols, v2.symbols, "the same table from either format");
        assert!(v2.node_count() > 300, "{}", v2.node_count());
        // Version 1 has no stack ids: an id is a node there.
        assert_eq!(v1.stack_count(), v1.node_count());
        let builder = sample_builder();
        assert_eq!(v2.stack_count(), 199, "one a leaf");
        for id in 0..199 {
            assert_eq!(v2.stack_node(id), Some(builder.stack_node(id)));
            assert_eq!(
                v1.stack_node(builder.stack_node(id)),
                Some(builder.stack_node(id))
            );
        }
        assert_eq!(v2.stack_node(199), None);
        let v1_len = sample_builder().encode_v1().len();
        assert!(
            v2_bytes.len() * 3 < v1_len,
            "names compress: {} vs {v1_len}",
            v2_bytes.len()
        );
    }

    #[test]
    fn the_table_made_while_encoding_is_the_one_decoding_makes() {
        for version in 2..=SYMBOLS_VERSION {
            let (bytes, made) = function_table_builder()
                .encode_version(version, Pages::Kept)
                .unwrap();
            let decoded = SymbolTable::decode(&bytes).unwrap();
            assert_eq!(made.symbols, decoded.symbols, "version {version}");
            assert_eq!(made.stacks, decoded.stacks, "version {version}");
            let (bytes, made) = sample_builder()
                .encode_version(version, Pages::Kept)
                .unwrap();
            let decoded = SymbolTable::decode(&bytes).unwrap();
            assert_eq!(made.symbols, decoded.symbols, "version {version}");
            assert_eq!(made.stacks, decoded.stacks, "version {version}");
            assert!(!made.symbols.functions.is_empty() && made.stack_count() > 0);
        }
    }

    /// A segment's section (zstd's fast level) and a compacted block's (level 1) are the same
    /// format: each decodes to the table its builder made, and only the frames differ.
    #[test]
    fn segment_and_block_sections_decode_alike() {
        let (segment, made) = sample_builder().encode_with_table(Pages::Segment).unwrap();
        let (block, _) = sample_builder().encode_with_table(Pages::Kept).unwrap();
        assert_eq!(&segment[..8], &block[..8], "magic and version");
        assert_ne!(segment, block, "compressed at another level");
        for bytes in [&segment, &block] {
            let decoded = SymbolTable::decode(bytes).unwrap();
            assert_eq!(decoded.symbols, made.symbols);
            assert_eq!(decoded.stacks, made.stacks);
        }
        // Every compacted level's section is compressed alike (level 1).
        let (fresh, _) = sample_builder().encode_with_table(Pages::Fresh).unwrap();
        assert_eq!(fresh, block);
    }

    #[test]
    fn a_deep_recursive_stack_compresses_past_any_ratio_and_still_reads() {
        let mut b = SymbolsBuilder::default();
        let map = b.add_locations(&profile_symbols(&["recurse"]));
        let deep = b.add_stack(std::iter::repeat_n(map[0], 50_000));
        let bytes = b.encode().unwrap();
        let raw = decoded_len(&bytes[..12], bytes.len() as u64).unwrap();
        assert!(
            raw > 1000 * bytes.len() as u64,
            "{raw} from {}",
            bytes.len()
        );
        let t = SymbolTable::decode(&bytes).unwrap();
        let mut locs = Vec::new();
        t.stack_locations(deep, &mut locs);
        assert_eq!(locs.len(), 50_000);
    }

    /// Decodes `raw` (a `Symbols` protobuf) sealed as a zstd section of format `version`.
    fn decode_as(version: u32, raw: &[u8]) -> Result<SymbolTable, DecodeError> {
        SymbolTable::decode(&sealed_protobuf(version, raw))
    }

    /// A Go-like function table: files shared by several functions, system names the names
    /// but for a few, start lines going up and down (the first ones negative).
    fn function_table_builder() -> SymbolsBuilder {
        let mut p = ProfileSymbols::default();
        for i in 0..300u32 {
            let name = format!("github.com/acme/svc/pkg{}.Fn{i}", i % 7);
            p.functions.push(Function {
                system_name: if i % 50 == 7 {
                    format!("sys{i}").into()
                } else {
                    name.as_str().into()
                },
                name: name.into(),
                filename: format!("/src/pkg{}/file{}.go", i % 7, i % 13).into(),
                start_line: i64::from(i % 40) * 3 - 20,
            });
            p.locations.push(Location {
                lines: kiln_otel::model::smallvec![Line {
                    function: i,
                    line: 1,
                }],
                ..Default::default()
            });
        }
        let mut b = SymbolsBuilder::default();
        let map = b.add_locations(&p);
        for leaf in 1..map.len() {
            b.add_stack([map[leaf], map[0]].into_iter());
        }
        b
    }

    /// A profile whose functions share their strings (slices of one buffer, as a decoded pprof
    /// body's: one file name for a file's functions, a name that is also the system name) is
    /// interned as one whose strings are all apart; an empty file name at the address another
    /// file name starts at is a different file.
    #[test]
    fn shared_and_separate_strings_intern_alike() {
        use kiln_otel::model::SharedStr;
        let mut shared = ProfileSymbols::default();
        let mut apart = ProfileSymbols::default();
        let body = Bytes::from_static(b"/src/main.go");
        let file = SharedStr::try_from(body.clone()).unwrap();
        let empty = SharedStr::try_from(body.slice(0..0)).unwrap();
        assert_eq!(empty.as_ptr(), file.as_ptr());
        for i in 0..20u32 {
            let name = SharedStr::from(format!("main.f{}", i % 15));
            shared.functions.push(Function {
                system_name: name.clone(),
                name,
                filename: if i % 4 == 0 {
                    empty.clone()
                } else {
                    file.clone()
                },
                start_line: 0,
            });
            let f = &shared.functions[i as usize];
            apart.functions.push(Function {
                name: (*f.name).into(),
                system_name: (*f.system_name).into(),
                filename: (*f.filename).into(),
                start_line: 0,
            });
            for p in [&mut shared, &mut apart] {
                p.locations.push(Location {
                    lines: kiln_otel::model::smallvec![Line {
                        function: i,
                        line: 1,
                    }],
                    ..Default::default()
                });
            }
        }
        let (mut a, mut b) = (SymbolsBuilder::default(), SymbolsBuilder::default());
        assert_eq!(a.add_locations(&shared), b.add_locations(&apart));
        assert_eq!(a.functions, b.functions);
        assert_eq!(a.strings, b.strings);
        // 15 names, a file and the empty string.
        assert_eq!(a.strings.len(), 17);
        // Functions 15..20 repeat 0..5 but for three whose file differs.
        assert_eq!(a.functions.len(), 15 + 3);
    }

    /// Locations are found by their content's hash: the same content in another profile
    /// (other string buffers, other order) finds the same location, and a location differing in
    /// any part (mapping, address, frame type, a line's number, its function's name, system
    /// name, file or start line) is another; a function no location names is not kept.
    #[test]
    fn locations_found_by_content_hash_are_the_locations_interned() {
        use kiln_otel::model::Mapping;
        let function = |name: &str, system: &str, file: &str, start: i64| Function {
            name: name.into(),
            system_name: system.into(),
            filename: file.into(),
            start_line: start,
        };
        let profile = |reversed: bool| {
            let mut p = ProfileSymbols {
                functions: vec![
                    function("f", "f", "a.go", 1),
                    function("f", "f_sys", "a.go", 1),
                    function("f", "f", "b.go", 1),
                    function("f", "f", "a.go", 2),
                    function("g", "g", "a.go", 1),
                    function("unused", "unused", "c.go", 0),
                ],
                mappings: vec![Mapping {
                    memory_start: 0x1000,
                    filename: "/bin/app".into(),
                    ..Default::default()
                }],
                locations: Vec::new(),
            };
            let line = |function: u32, line: i64| Line { function, line };
            let location =
                |mapping: Option<u32>, address: u64, lines: Vec<Line>, frame: &str| Location {
                    mapping,
                    address,
                    lines: lines.into_iter().collect(),
                    frame_type: frame.into(),
                };
            p.locations = vec![
                location(None, 0, vec![line(0, 10)], ""),
                location(None, 0, vec![line(0, 11)], ""),
                location(None, 0, vec![line(1, 10)], ""),
                location(None, 0, vec![line(2, 10)], ""),
                location(None, 0, vec![line(3, 10)], ""),
                location(None, 0, vec![line(4, 10)], ""),
                location(None, 0, vec![line(4, 10), line(0, 10)], ""),
                location(None, 0, vec![line(0, 10)], "native"),
                location(None, 0x10, vec![line(0, 10)], ""),
                location(Some(0), 0x10, vec![line(0, 10)], ""),
                location(None, 0, vec![line(0, 10)], ""),
            ];
            if reversed {
                p.functions.reverse();
                for l in &mut p.locations {
                    for line in &mut l.lines {
                        line.function = 5 - line.function;
                    }
                }
                p.locations.reverse();
            }
            p
        };
        let mut b = SymbolsBuilder::default();
        let first = b.add_locations(&profile(false));
        // Ten distinct locations; the last repeats the first.
        assert_eq!(first, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0]);
        assert_eq!(b.locations.len(), 10);
        assert_eq!(b.functions.len(), 5, "the unused function is not kept");
        let mut again = b.add_locations(&profile(true));
        again.reverse();
        assert_eq!(again, first);
        assert_eq!((b.locations.len(), b.functions.len()), (10, 5));
    }

    #[test]
    fn function_columns_read_as_the_messages_did_and_are_smaller() {
        let functions = function_table_builder().functions.clone();
        assert!(functions.iter().any(|f| f.system_name != f.name));
        assert!(functions.iter().any(|f| f.start_line < 0));
        let v3 = function_table_builder()
            .encode_version(3, Pages::Kept)
            .unwrap()
            .0;
        let v4 = function_table_builder().encode().unwrap();
        assert_eq!(&v4[4..8], &4u32.to_le_bytes());
        let (t3, t4) = (
            SymbolTable::decode(&v3).unwrap(),
            SymbolTable::decode(&v4).unwrap(),
        );
        assert_eq!(t4.symbols.functions, functions);
        assert_eq!(t3.symbols, t4.symbols, "the same table from either version");
        assert!(v4.len() < v3.len(), "{} vs {}", v4.len(), v3.len());
    }

    #[test]
    fn bad_function_columns_are_errors() {
        let raw = |functions: Vec<pb::Function>, columns: [Vec<i64>; 4]| {
            let [names, system_names, filenames, start_lines] = columns;
            pb::Symbols {
                strings: vec![String::new(), "main".into()],
                functions,
                locations: vec![pb::Location::default()],
                stack_locations: vec![0],
                stack_parent_distances: vec![0],
                function_name_deltas: names,
                function_system_name_deltas: system_names,
                function_filename_deltas: filenames,
                function_start_line_deltas: start_lines,
                ..Default::default()
            }
            .encode_to_vec()
        };
        let good = raw(
            Vec::new(),
            [vec![1, 0], vec![0, -1], vec![0, 1], vec![5, -7]],
        );
        let t = decode_as(4, &good).unwrap();
        let f = |name, system_name, filename, start_line| pb::Function {
            name,
            system_name,
            filename,
            start_line,
        };
        assert_eq!(t.symbols.functions, [f(1, 1, 0, 5), f(1, 0, 1, -2)]);
        assert!(t.symbols.function_name_deltas.is_empty(), "taken");
        for (columns, what) in [
            (
                [vec![1], vec![], vec![0], vec![0]],
                "function columns of unequal lengths",
            ),
            ([vec![-1], vec![0], vec![0], vec![0]], "function string"),
            ([vec![2], vec![0], vec![0], vec![0]], "function string"),
            (
                [vec![1], vec![i64::MAX], vec![0], vec![0]],
                "function string",
            ),
            (
                [vec![1], vec![0], vec![i64::from(u32::MAX) + 1], vec![0]],
                "function string",
            ),
        ] {
            assert_eq!(
                decode_as(4, &raw(Vec::new(), columns)).unwrap_err(),
                DecodeError::OutOfRange(what)
            );
        }
        assert_eq!(
            decode_as(4, &raw(vec![f(1, 1, 0, 0)], Default::default())).unwrap_err(),
            DecodeError::OutOfRange("functions as messages in format version 4")
        );
        assert_eq!(
            decode_as(3, &good).unwrap_err(),
            DecodeError::OutOfRange("function columns before format version 4")
        );
    }

    #[test]
    fn bad_lengths_and_parent_distances_are_errors() {
        let msg = |distances: Vec<u32>, parents: Vec<u32>| {
            pb::Symbols {
                strings: vec![String::new()],
                locations: vec![pb::Location::default()],
                stack_locations: vec![0; distances.len().max(parents.len())],
                stack_parents: parents,
                stack_parent_distances: distances,
                ..Default::default()
            }
            .encode_to_vec()
        };
        let v2 = |raw: &[u8], claimed: u32| {
            let mut body = claimed.to_le_bytes().to_vec();
            body.extend_from_slice(&zstd::bulk::compress(raw, 1).unwrap());
            SymbolTable::decode(&sealed(2, &[&body]))
        };
        let good = msg(vec![0, 1, 2, 1], vec![]);
        let t = v2(&good, good.len() as u32).unwrap();
        assert_eq!(t.symbols.stack_parents, [0, 0, 0, 2]);
        for claimed in [good.len() as u32 - 1, good.len() as u32 + 1, u32::MAX] {
            assert!(matches!(
                v2(&good, claimed),
                Err(DecodeError::Decompress { .. })
            ));
        }
        let past_root = msg(vec![0, 2], vec![]);
        assert_eq!(
            v2(&past_root, past_root.len() as u32).unwrap_err(),
            DecodeError::StackNodeOrder(1)
        );
        let self_parent = msg(vec![0, 0], vec![]);
        assert_eq!(
            v2(&self_parent, self_parent.len() as u32).unwrap_err(),
            DecodeError::StackNodeOrder(1)
        );
        let both = msg(vec![0, 1], vec![0, 0]);
        assert_eq!(
            v2(&both, both.len() as u32).unwrap_err(),
            DecodeError::StackTreeLength
        );
        assert_eq!(
            SymbolTable::decode(&sealed(2, &[&[1, 2]])).unwrap_err(),
            DecodeError::Truncated("symbols")
        );
        assert!(matches!(
            SymbolTable::decode(&sealed(SYMBOLS_VERSION + 1, &[&good])).unwrap_err(),
            DecodeError::Version { version, .. } if version == SYMBOLS_VERSION + 1
        ));
        // Stack ids: a node of the tree each, and only from version 3 on.
        let with_ids = |deltas: Vec<i64>| {
            pb::Symbols {
                strings: vec![String::new()],
                locations: vec![pb::Location::default()],
                stack_locations: vec![0; 4],
                stack_parent_distances: vec![0, 1, 2, 1],
                stack_node_deltas: deltas,
                ..Default::default()
            }
            .encode_to_vec()
        };
        let t = decode_as(3, &with_ids(vec![3, -2, 1])).unwrap();
        assert_eq!(
            (0..4).map(|i| t.stack_node(i)).collect::<Vec<_>>(),
            [Some(3), Some(1), Some(2), None]
        );
        for bad in [vec![4], vec![1, -2], vec![i64::MAX, 1]] {
            assert_eq!(
                decode_as(3, &with_ids(bad)).unwrap_err(),
                DecodeError::OutOfRange("stack id")
            );
        }
        assert_eq!(
            decode_as(2, &with_ids(vec![1])).unwrap_err(),
            DecodeError::OutOfRange("stack ids before format version 3")
        );
    }

    proptest::proptest! {
        /// Any function table comes back from format version 4's columns as it went in (the
        /// naive model: the table itself).
        #[test]
        fn function_columns_round_trip(table in proptest::collection::vec((proptest::num::u32::ANY, proptest::num::u32::ANY, proptest::num::u32::ANY, proptest::num::i64::ANY), 0..64)) {
            let functions: Vec<pb::Function> = table
                .into_iter()
                .map(|(name, system_name, filename, start_line)| pb::Function {
                    name,
                    system_name,
                    filename,
                    start_line,
                })
                .collect();
            let mut msg = pb::Symbols::default();
            function_columns(&functions, &mut msg);
            proptest::prop_assert_eq!(functions_of_columns(&mut msg).unwrap(), functions);
        }

        /// Whatever follows a valid header and passes the CRC, a decode answers (no panic, no
        /// allocation beyond the ratio cap).
        #[test]
        fn any_sealed_body_decodes_or_errs(body in proptest::collection::vec(proptest::num::u8::ANY, 0..512), version in 1u32..=SYMBOLS_VERSION) {
            let _ = SymbolTable::decode(&sealed(version, &[&body]));
        }
    }

    #[test]
    fn corruption_is_detected() {
        let mut b = SymbolsBuilder::default();
        let map = b.add_locations(&profile_symbols(&["main"]));
        b.add_stack([map[0]].into_iter());
        let mut bytes = b.encode().unwrap().to_vec();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        let err = SymbolTable::decode(&bytes).unwrap_err();
        assert_eq!(err, DecodeError::Checksum("symbols"));
        assert!(err.to_string().contains("checksum"));
        assert!(SymbolTable::decode(b"nope").is_err());
    }
}
