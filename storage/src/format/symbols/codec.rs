//! The section's bytes: format version 4's function columns, the sealed frame (magic, version,
//! body, CRC) and the string hash names are interned by.

use crate::error::DecodeError;
use crate::format::tiers::Pages;
use bytes::Bytes;
use kiln_proto::kiln::storage::v1 as pb;
#[cfg(any(test, feature = "testing"))]
use prost::Message;

use super::*;

/// Writes `functions` into `msg` as format version 4's columns of differences.
pub(super) fn function_columns(functions: &[pb::Function], msg: &mut pb::Symbols) {
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
pub(super) fn functions_of_columns(
    msg: &mut pb::Symbols,
) -> Result<Vec<pb::Function>, DecodeError> {
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
pub(super) fn v1_section(msg: &pb::Symbols) -> Bytes {
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
pub(super) fn sealed(version: u32, body: &[&[u8]]) -> Bytes {
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

/// A thread's zstd contexts, made on first use and kept: making one per section (what
/// `zstd::bulk::compress` does) cost more than compressing a fresh segment's names.
pub(super) struct Zstd {
    /// A segment's compressor, and a compacted block's.
    pub(super) compressors: [Option<zstd::bulk::Compressor<'static>>; 2],
    pub(super) decompressor: Option<zstd::bulk::Decompressor<'static>>,
}

thread_local! {
    pub(super) static ZSTD: std::cell::RefCell<Zstd> = const {
        std::cell::RefCell::new(Zstd {
            compressors: [None, None],
            decompressor: None,
        })
    };
}

impl Zstd {
    pub(super) fn compress(&mut self, raw: &[u8], pages: Pages) -> Vec<u8> {
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

    pub(super) fn decompress(&mut self, frame: &[u8], len: usize) -> std::io::Result<Vec<u8>> {
        let d = match &mut self.decompressor {
            Some(d) => d,
            None => self.decompressor.insert(zstd::bulk::Decompressor::new()?),
        };
        d.decompress(frame, len)
    }
}
