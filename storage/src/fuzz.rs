//! One entry per decoder of Kiln's own files for fuzzing: an object's footer and a metastore
//! entry (block metadata), a symbols section, a write-ahead log file. Kiln wrote these, but a
//! disk or an object store can hand back anything, and `kiln metastore rebuild` reads whatever
//! objects it finds: damage must be an error, never a panic. Each entry takes arbitrary bytes,
//! decodes them, and, where that succeeds, uses the result as queries and compaction do (and a
//! decoded value encoded again must read back the same).
//!
//! A CRC guards each of these formats, so a mutation of a whole file stops at the checksum.
//! The block and symbols entries therefore also take their input as the message inside the
//! frame: its first byte picks a format version, the rest is sealed with that version, its
//! length and a good CRC, so the mutations reach the protobuf decoders and the checks behind
//! them.
//!
//! Each returns how many of its decodings succeeded: the test checks that some mutations get
//! past the checks to the code that uses what was decoded.
//!
//! The `cargo fuzz` targets of `fuzz/` call these, and `tests/fuzz_entries.rs` runs each over
//! seeds and seeded mutations in the test command (as `kiln_otel::fuzz` for requests).

use crate::format::meta::{self, BLOCK_FORMAT_VERSION, BlockMeta, MIN_BLOCK_FORMAT_VERSION};
use crate::format::symbols::{
    self, MIN_SYMBOLS_VERSION, SYMBOLS_VERSION, SymbolTable, SymbolsBuilder,
};
use crate::selector::parse_selector;

#[cfg(any(test, feature = "testing"))]
pub mod seeds;

/// Every fuzz entry, by the name its `cargo fuzz` target has.
pub const ENTRIES: [(&str, fn(&[u8]) -> usize); 3] = [
    ("block_meta", block_meta),
    ("symbols", symbols),
    ("wal_file", wal_file),
];

/// A version in `min..=max` picked by a byte.
fn version(byte: u8, min: u32, max: u32) -> u32 {
    min + u32::from(byte) % (max - min + 1)
}

/// Block metadata: the input as an object's last bytes (its footer), as a metastore entry, and
/// (first byte a format version) as a footer's message sealed as a good footer.
pub fn block_meta(data: &[u8]) -> usize {
    let mut decoded = 0;
    // The object's size is not known here: any section fits the largest object, but the
    // sections' ends must not overflow.
    if let Ok(metas) = meta::decode_footer(data, u64::MAX) {
        decoded += use_metas(&metas);
    }
    if let Ok(m) = BlockMeta::decode_entry(data) {
        decoded += use_metas(std::slice::from_ref(&m));
    }
    let Some((&v, body)) = data.split_first() else {
        return decoded;
    };
    let v = version(v, MIN_BLOCK_FORMAT_VERSION, BLOCK_FORMAT_VERSION);
    let footer = meta::sealed_footer(body.to_vec(), v);
    if let Ok(metas) = meta::decode_footer(&footer, u64::MAX) {
        decoded += use_metas(&metas);
    }
    decoded
}

/// What the metastore and queries do with decoded entries: index their series, select from the
/// index, take their row ranges; and an entry encoded again reads back the same.
fn use_metas(metas: &[BlockMeta]) -> usize {
    let selector = parse_selector(r#"{service_name=~"a.*", pod!="b"}"#).expect("a valid selector");
    for m in metas {
        let index = m.series_index();
        let _ = index.select(std::slice::from_ref(&selector), i64::MIN, i64::MAX);
        let _ = (m.key(), m.path(), m.service_names(), m.profile_types());
        let _ = (m.samples.range(), m.symbols.range(), m.dataset_bytes());
        for s in &m.series {
            let _ = s.row_range();
        }
        for r in &m.rollups {
            let _ = r.section.range();
        }
        let again = BlockMeta::decode_entry(&m.encode_entry())
            .unwrap_or_else(|e| panic!("a decoded entry encoded again does not decode: {e}"));
        assert_eq!(
            &again, m,
            "a decoded entry encoded again reads back differently"
        );
    }
    1
}

/// A symbols section: the input as a whole section, and (first byte a format version) as a
/// section's `Symbols` protobuf sealed as a good section.
pub fn symbols(data: &[u8]) -> usize {
    let mut decoded = 0;
    if let Ok(t) = SymbolTable::decode(data) {
        decoded += use_table(&t);
    }
    let Some((&v, raw)) = data.split_first() else {
        return decoded;
    };
    let v = version(v, MIN_SYMBOLS_VERSION, SYMBOLS_VERSION);
    if let Ok(t) = SymbolTable::decode(&symbols::sealed_protobuf(v, raw)) {
        decoded += use_table(&t);
    }
    decoded
}

/// What queries and compaction do with a decoded table: every stack's locations and their
/// function names, the name trie of flame graphs, and the table merged into a new one (whose
/// encoding must decode).
fn use_table(t: &SymbolTable) -> usize {
    let mut locations = Vec::new();
    let mut b = SymbolsBuilder::default();
    let of_location = b.add_table_locations(t);
    for id in 0..t.stack_count() as u32 {
        t.stack_locations(id, &mut locations);
        for &l in &locations {
            let _ = t.location_function_names(l).count();
        }
        let mapped: Vec<u32> = locations.iter().map(|&l| of_location[l as usize]).collect();
        b.add_stack_path(&mapped);
    }
    let trie = t.name_trie();
    assert_eq!(
        trie.of_stack.len(),
        t.stack_count(),
        "a name trie node per stack"
    );
    if let Ok(bytes) = b.encode() {
        SymbolTable::decode(&bytes)
            .unwrap_or_else(|e| panic!("a merged table's encoding does not decode: {e}"));
    }
    1
}

/// A write-ahead log file, read as opening the log reads it (its first sequence number from its
/// header, as its name would give it).
pub fn wal_file(data: &[u8]) -> usize {
    let first = data
        .get(8..16)
        .map_or(1, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
    let (records, end) = crate::writer::wal::read_file(data, first);
    assert!(end <= data.len(), "a log file read past its end");
    for (i, f) in records.iter().enumerate() {
        assert_eq!(f.seq, first + i as u64, "records out of sequence");
        assert!(
            f.payload.len() <= data.len(),
            "a record longer than its file"
        );
    }
    records.len().min(1)
}
