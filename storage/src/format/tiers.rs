//! Compaction levels and what follows from a block's level: how hard its pages are compressed
//! ([`Pages`]), and the metastore's time partitions.

use std::ops::Range;

use parquet::basic::{Compression, ZstdLevel};

use crate::Result;

/// Blocks at this compaction level are not compacted further.
pub const TOP_LEVEL: u32 = 3;

/// Length of a metastore time partition.
pub const PARTITION_NANOS: i64 = 6 * 3600 * 1_000_000_000;

/// The time partition of a timestamp (Unix nanoseconds).
pub fn partition_of(time_nanos: i64) -> i64 {
    time_nanos.div_euclid(PARTITION_NANOS)
}

/// Levels whose jobs a compactor's fresh lane runs (L0 segments and L1 blocks merged).
pub const FRESH_LEVELS: Range<u32> = 0..2;
/// Levels whose jobs its bulk lane runs (L2 and top-level blocks merged).
pub const BULK_LEVELS: Range<u32> = 2..u32::MAX;
/// Every level: `Compactor::compact_all` and a direct [`crate::Storage::upkeep`].
pub const ALL_LEVELS: Range<u32> = 0..u32::MAX;

/// How hard a samples section's pages are compressed: by what stays and what a later merge
/// replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pages {
    /// LZ4 (raw): L0 segments, a flush's few thousand rows, which the first merge replaces
    /// within seconds. Parquet's zstd codec makes a compression and a decompression context
    /// for every column chunk it writes or reads, and each context asks the CPU for its
    /// features (`cpuid`, which a virtual machine traps); LZ4 keeps no context. On the `small`
    /// bench the zstd codecs' making was 3.4 % of the server's CPU, most of it for the
    /// segments' chunks, written once and read by the L0 merge and the queries of fresh data.
    Segment,
    /// zstd level 1: the L1 and L2 blocks merged from segments, which later merges replace
    /// within minutes. zstd resets its tables for every page it compresses, a level 3
    /// context's several times larger than a level 1 one's: on the `small` bench those resets
    /// were 1.4 % of the server's instructions, most of them for the segments' pages (zstd
    /// then), where a segment's few hundred rows make pages of a few KiB.
    Fresh,
    /// zstd level 3: top-level blocks, which stay.
    Kept,
}

impl Pages {
    /// The pages of a block of `level`.
    pub fn of_level(level: u32) -> Self {
        if level >= TOP_LEVEL {
            Self::Kept
        } else {
            Self::Fresh
        }
    }

    pub(crate) fn compression(self) -> Result<Compression> {
        Ok(match self {
            Self::Segment => Compression::LZ4_RAW,
            Self::Fresh => Compression::ZSTD(ZstdLevel::try_new(1)?),
            Self::Kept => Compression::ZSTD(ZstdLevel::try_new(3)?),
        })
    }
}
