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

mod builder;
mod codec;
mod table;
mod trie;

#[cfg(test)]
mod tests;

pub use builder::{SymbolsBuilder, SymbolsCapacity};
pub(crate) use codec::sealed_protobuf;
pub use codec::{decoded_len, string_hash};
pub use table::SymbolTable;
pub use trie::NameTrie;

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
