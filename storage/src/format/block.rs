//! Block format, version 4 (`docs/adr/0002-block-format.md`): one tenant's dataset of an object.
//! Version 4 changed only the profile totals rollup ([`profile_totals_schema`]).
//!
//! A dataset is two sections of an object (see [`crate::format::meta`] for the object's layout):
//!
//! - samples, Parquet: one row per (series, timestamp, stack, span, trace, per-sample labels),
//!   sorted by series (in series order: profile type, service name, labels), then timestamp,
//!   then stack. Columns: `series_id`, `timestamp` (ns), `stack_id`, `value`, `span_id`
//!   (0 = none), `trace_id` (16 bytes, null = none), `sample_labels` (null = none) and
//!   `profile_id` (the UUID given to each ingested profile of a series; version 2 blocks lack
//!   the column, read as null). Label
//!   selectors are answered from the series list in the metadata, which gives every series' row
//!   range, so a query reads only the rows of the series it selects.
//! - symbols: the [`crate::format::symbols`] section the stack ids point into.

pub use crate::format::tiers::Pages;

mod builder;
mod rows;
mod schema;

#[cfg(test)]
mod tests;

pub use builder::{
    BuiltDataset, DatasetBuilder, DatasetCapacity, assemble_object, series_order, series_sort_key,
};
pub use rows::{Row, RowBatchBuilder, RowKey, decode_sample_labels, encode_sample_labels};
pub(crate) use schema::samples_file_writer;
pub use schema::{Blank, col, columns, profile_totals_schema, samples_schema, writer_properties};

/// A new profile id: a version 7 UUID (RFC 9562) of the time in milliseconds, then 34 bits
/// drawn at random once per process, then a process-wide 40-bit counter (from a random start).
/// Unique without random bits of its own, so the ids one process writes differ only in the
/// time's and the counter's low bytes, which the column's zstd pages squeeze: with
/// 74 random bits an id (`Uuid::now_v7`) the column cost 0.28 B a sample row, and the profile
/// totals' rollup 0.13 B more, on `kiln bench`'s small preset; with these ids 0.09 and 0.04
/// (docs/performance.md, "Profile ids").
pub fn new_profile_id() -> [u8; 16] {
    // The process's bits, and where its counter starts (so an id does not tell how many
    // profiles the process took in before it).
    static PROCESS: std::sync::LazyLock<([u8; 5], u64)> = std::sync::LazyLock::new(|| {
        let r = uuid::Uuid::new_v4().into_bytes();
        let start = u64::from_be_bytes([0, 0, 0, r[8], r[9], r[10], r[11], r[12]]);
        ([r[0], r[1], r[2], r[3], r[4]], start)
    });
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let (bits, start) = &*PROCESS;
    let n = start.wrapping_add(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut tail = [0u8; 10];
    tail[..5].copy_from_slice(bits);
    // 40 bits of counter: it wraps after 10^12 profiles, and only ids of the same millisecond
    // could then meet.
    tail[5..].copy_from_slice(&n.to_be_bytes()[3..]);
    uuid::Builder::from_unix_timestamp_millis(ms, &tail)
        .into_uuid()
        .into_bytes()
}

/// Switches for the tests of old formats.
#[cfg(feature = "testing")]
pub mod testing {
    /// While set, segments' samples are written with zstd level 1, as builds before LZ4
    /// segments wrote them: for the tests that read and compact old and new together.
    pub static SEGMENT_ZSTD: std::sync::atomic::AtomicBool =
        std::sync::atomic::AtomicBool::new(false);
}
