//! Valid inputs for each entry of [`super::ENTRIES`] to mutate, made by Kiln's own writers: a
//! symbols table's sections, a block's footer and entry, a write-ahead log's file.

use kiln_otel::model::{Function, Line, Location, Mapping, Symbols, smallvec};

use crate::format::meta::{
    self, BLOCK_FORMAT_VERSION, BlockMeta, LogCheckpoint, MIN_BLOCK_FORMAT_VERSION, PROFILE_TOTALS,
    Rollup, Section, SeriesMeta,
};
use crate::format::series_labels::SeriesLabels;
use crate::format::symbols::{MIN_SYMBOLS_VERSION, SymbolsBuilder};

/// The seeds of a fuzz entry (a name of [`super::ENTRIES`]).
pub fn seeds(entry: &str) -> Vec<Vec<u8>> {
    match entry {
        "block_meta" => block_meta(),
        "symbols" => symbols(),
        "wal_file" => wal_file(),
        other => panic!("no fuzz entry {other}"),
    }
}

/// The byte that makes [`super::version`] pick `version` of `min..`.
fn version_byte(version: u32, min: u32) -> u8 {
    (version - min) as u8
}

fn builder() -> SymbolsBuilder {
    let mut s = Symbols::default();
    s.mappings.push(Mapping {
        memory_start: 0x40_0000,
        memory_limit: 0x80_0000,
        filename: "/usr/bin/api".into(),
        build_id: "b1d0".into(),
        has_functions: true,
        ..Default::default()
    });
    for (name, file) in [
        ("main", "main.go"),
        ("net/http.(*conn).serve", "net/http/server.go"),
        ("api.handle", "api/handle.go"),
        ("runtime.mallocgc", "runtime/malloc.go"),
    ] {
        s.functions.push(Function {
            name: name.into(),
            system_name: name.into(),
            filename: file.into(),
            start_line: 10,
        });
    }
    for (f, line) in [(0u32, 12i64), (1, 40), (2, 7), (3, 900)] {
        s.locations.push(Location {
            mapping: Some(0),
            address: 0x40_1000 + u64::from(f) * 0x10,
            lines: smallvec![Line { function: f, line }],
            frame_type: "go".into(),
        });
    }
    // An inlined pair, and an address without lines.
    s.locations.push(Location {
        mapping: Some(0),
        address: 0x40_2000,
        lines: smallvec![
            Line {
                function: 3,
                line: 901
            },
            Line {
                function: 2,
                line: 8
            }
        ],
        frame_type: "go".into(),
    });
    s.locations.push(Location {
        address: 0xdead,
        ..Default::default()
    });
    let mut b = SymbolsBuilder::default();
    let map = b.add_locations(&s);
    for root_first in [&[0, 1, 2][..], &[0, 1, 2, 3], &[0, 1, 4], &[0, 5], &[0]] {
        b.add_stack(root_first.iter().rev().map(|&l| map[l]));
    }
    b
}

/// Whole sections (current and version 1), and each one's protobuf behind its version byte.
fn symbols() -> Vec<Vec<u8>> {
    let current = builder().encode().expect("encodes").to_vec();
    let v1 = builder().encode_v1().to_vec();
    let version = |s: &[u8]| u32::from_le_bytes(s[4..8].try_into().expect("4 bytes"));
    // Version 1: the protobuf as it is; later ones: its length, then a zstd frame.
    let mut raw_v1 = vec![version_byte(1, MIN_SYMBOLS_VERSION)];
    raw_v1.extend_from_slice(&v1[8..v1.len() - 4]);
    let len = u32::from_le_bytes(current[8..12].try_into().expect("4 bytes")) as usize;
    let mut raw = vec![version_byte(version(&current), MIN_SYMBOLS_VERSION)];
    raw.extend(
        zstd::bulk::decompress(&current[12..current.len() - 4], len).expect("its own frame"),
    );
    vec![current, v1, raw, raw_v1]
}

fn dataset(tenant: &str, id: &str, level: u32) -> BlockMeta {
    let series = |service: &str, pod: &str, first_row: u64| SeriesMeta {
        labels: SeriesLabels::new([
            ("__name__", "process_cpu"),
            ("pod", pod),
            ("service_name", service),
        ]),
        profile_type: "process_cpu:cpu:nanoseconds:cpu:nanoseconds".into(),
        min_time_nanos: 1_700_000_000_000_000_000,
        max_time_nanos: 1_700_000_060_000_000_000,
        first_row,
        rows: 90,
    };
    BlockMeta {
        format_version: BLOCK_FORMAT_VERSION,
        id: id.into(),
        tenant: tenant.into(),
        shard: 1,
        level,
        min_time_nanos: 1_700_000_000_000_000_000,
        max_time_nanos: 1_700_000_060_000_000_000,
        object_size: 0,
        samples: Section {
            offset: 0,
            size: 4_000,
        },
        symbols: Section {
            offset: 4_000,
            size: 900,
        },
        series: vec![series("api", "api-0", 0), series("api", "api-1", 90)],
        rows: 180,
        profiles: 2,
        stack_nodes: 12,
        received_ms: 0,
        compacted_from: if level > 0 {
            vec![meta::compacted_source(
                "01HQ0000000000000000000001",
                472_000,
            )]
        } else {
            Vec::new()
        },
        rollups: if level > 0 {
            vec![Rollup {
                resolution_nanos: PROFILE_TOTALS,
                section: Section {
                    offset: 4_900,
                    size: 300,
                },
                series_rows: vec![0..1, 1..2],
            }]
        } else {
            Vec::new()
        },
        index: Default::default(),
        logs: vec![LogCheckpoint {
            log: "01HQ0000000000000000000LOG/0".into(),
            seq: 41,
        }],
    }
}

/// A segment's footer of two tenants, a compacted block's entry, and the footer's message
/// behind its version byte.
fn block_meta() -> Vec<Vec<u8>> {
    let id = "01HQ0000000000000000000002";
    let segment = [dataset("a", id, 0), dataset("b", id, 0)];
    let footer = meta::encode_footer(&segment);
    let mut entry = dataset("a", id, 2);
    entry.object_size = 6_000;
    // The footer's message: what precedes its length, version, CRC and magic (16 bytes).
    let mut body = vec![version_byte(BLOCK_FORMAT_VERSION, MIN_BLOCK_FORMAT_VERSION)];
    body.extend_from_slice(&footer[..footer.len() - 16]);
    vec![footer, entry.encode_entry(), body]
}

/// A log's file of three records, written by [`crate::writer::wal::Log`].
fn wal_file() -> Vec<Vec<u8>> {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "kiln-fuzz-seeds-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let (mut log, _) =
        crate::writer::wal::Log::open(&dir, 6, 1 << 20).expect("a log in a temporary directory");
    log.append([&b"first"[..], b"", b"the third record"], 1_700_000_000_000)
        .expect("appends");
    drop(log);
    let file = std::fs::read_dir(&dir)
        .expect("the log's directory")
        .map(|e| e.expect("an entry").path())
        .next()
        .expect("the log's file");
    let bytes = std::fs::read(file).expect("the log's file");
    let _ = std::fs::remove_dir_all(&dir);
    vec![bytes]
}
