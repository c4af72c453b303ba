//! Block metadata: what the metastore indexes and what every object's footer carries.
//!
//! An object (an L0 segment or a compacted block) holds one dataset per tenant. The metastore
//! keeps one [`BlockMeta`] per (object, tenant): the tenant's dataset with the object's identity,
//! so a tenant's lookups never see another tenant's metadata. On disk and in the metastore the
//! metadata is the compact protobuf `kiln.storage.v1.BlockMeta` (strings once, in a table).
//!
//! Object layout (format versions 2 and 3; 3 added the samples' `profile_id` column):
//!
//! ```text
//!  dataset 0: samples (Parquet) | symbols (KSYM) | dataset 1: … | footer
//!  footer:    BlockMeta (protobuf, every dataset) | u32 LE length | u32 LE format version
//!             | u32 LE CRC32 of the metadata, length and version | b"KBLK"
//! ```

use crate::error::DecodeError;
use crate::format::series_index::SeriesIndex;

mod wire;

pub use super::series_labels::SeriesMeta;
pub use super::tiers::{PARTITION_NANOS, TOP_LEVEL, partition_of};

/// Current block format version (see `docs/adr/0002-block-format.md`): 3 added the samples'
/// `profile_id` column, 4 the profile totals' `sample_row` column.
pub const BLOCK_FORMAT_VERSION: u32 = 4;

/// Switches for the tests of old formats.
#[cfg(feature = "testing")]
pub mod testing {
    /// While 3, compaction writes blocks of format version 3 (profile totals without their
    /// `sample_row` column), as builds before version 4 did: for the tests that read and
    /// compact old and new blocks together.
    pub static WRITE_VERSION: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
}

/// The block format version compaction writes: the current one, unless a test asks for an
/// older one ([`testing::WRITE_VERSION`]).
pub(crate) fn write_version() -> u32 {
    #[cfg(feature = "testing")]
    if let v @ 1.. = testing::WRITE_VERSION.load(std::sync::atomic::Ordering::Relaxed) {
        return v;
    }
    BLOCK_FORMAT_VERSION
}

/// The oldest block format this build reads: version 2 blocks (no `profile_id` column) read
/// as if every row had no profile id, and compaction rewrites them as the current version.
pub const MIN_BLOCK_FORMAT_VERSION: u32 = 2;

/// Magic bytes closing every object.
pub const FOOTER_MAGIC: &[u8; 4] = b"KBLK";

/// Bytes after the footer's metadata: length, version, CRC and magic.
pub const FOOTER_TRAILER_BYTES: usize = 16;

/// A byte range of an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Section {
    pub offset: u64,
    pub size: u64,
}

impl Section {
    /// The range as `offset..offset + size`.
    pub fn range(&self) -> std::ops::Range<u64> {
        self.offset..self.offset + self.size
    }
}

/// One tenant's dataset of one object, as the metastore indexes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockMeta {
    pub format_version: u32,
    /// ULID of the object.
    pub id: String,
    pub tenant: String,
    pub shard: u32,
    /// Compaction level; 0 = an L0 segment (shared by every tenant of one flush).
    pub level: u32,
    pub min_time_nanos: i64,
    pub max_time_nanos: i64,
    /// Bytes of the whole object.
    pub object_size: u64,
    pub samples: Section,
    pub symbols: Section,
    /// Series in sort order; a row's `series_id` indexes this list.
    pub series: Vec<SeriesMeta>,
    pub rows: u64,
    pub profiles: u64,
    /// Nodes of the dataset's stack tree.
    pub stack_nodes: u64,
    /// Entries of the same tenant this one replaced, as [`compacted_source`] writes them.
    pub compacted_from: Vec<String>,
    /// Pre-aggregated copies of the samples (compacted blocks only), finest first.
    pub rollups: Vec<Rollup>,
    /// The index of `series`, built on first use ([`BlockMeta::series_index`]).
    pub index: IndexCell,
    /// The write-ahead logs the object's data came from, each with the last record it holds
    /// (an object's datasets share them); `kiln metastore rebuild` restores the logs'
    /// checkpoints from them.
    pub logs: Vec<LogCheckpoint>,
    /// When the newest write this entry holds was received (Unix ms), for a segment on its way
    /// to the metastore; 0 when not known (the object's id then bounds it). Not stored: a
    /// deleted tenant's entries received before its deletion are refused with it
    /// ([`crate::metastore::Metastore::delete_tenant`]).
    pub received_ms: u64,
}

/// Where a write-ahead log stands: every record up to `seq` of the log named `log` (a process's
/// log id and shard, [`crate::writer`]) is in registered blocks, or, in an object's metadata,
/// in that object's data.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LogCheckpoint {
    pub log: String,
    pub seq: u64,
}

/// The highest checkpoint of each log among `logs`, by log name.
pub fn latest_checkpoints<'a>(
    logs: impl IntoIterator<Item = &'a LogCheckpoint>,
) -> Vec<LogCheckpoint> {
    let mut latest: std::collections::BTreeMap<&str, u64> = Default::default();
    for c in logs {
        let seq = latest.entry(c.log.as_str()).or_default();
        *seq = (*seq).max(c.seq);
    }
    latest
        .into_iter()
        .map(|(log, seq)| LogCheckpoint {
            log: log.to_owned(),
            seq,
        })
        .collect()
}

/// A block's [`SeriesIndex`], built once on first use. Entries are immutable once they are in
/// the metastore; a clone starts empty, so an entry changed after cloning is indexed afresh.
#[derive(Default)]
pub struct IndexCell(std::sync::OnceLock<SeriesIndex>);

impl Clone for IndexCell {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl PartialEq for IndexCell {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for IndexCell {}

impl std::fmt::Debug for IndexCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "IndexCell(built)"
        } else {
            "IndexCell(empty)"
        })
    }
}

/// Bucket width of a rollup that holds profile totals rather than stacks.
pub const PROFILE_TOTALS: i64 = 0;

/// A pre-aggregated copy of a dataset's samples (ADR 0007): a Parquet section with the samples'
/// schema. With a resolution, each (series, stack)'s values summed per time bucket aligned to the
/// Unix epoch (the row's timestamp is the bucket's start); with [`PROFILE_TOTALS`], each
/// profile's total per (series, timestamp), stack 0. Span, trace and per-sample labels are
/// dropped, so a query filtering on them reads the samples.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollup {
    /// Bucket width in nanoseconds, or [`PROFILE_TOTALS`].
    pub resolution_nanos: i64,
    pub section: Section,
    /// Row range of each series of the dataset (same order).
    pub series_rows: Vec<std::ops::Range<u64>>,
}

/// What identifies a metastore entry: tenant, object id and partition.
pub type EntryKey = (String, String, i64);

impl BlockMeta {
    /// The entry's identity: one tenant's dataset of one partition in one object.
    pub fn key(&self) -> EntryKey {
        (self.tenant.clone(), self.id.clone(), self.partition())
    }

    /// Whether the block's time range meets `[start, end)`.
    pub fn overlaps(&self, start_nanos: i64, end_nanos: i64) -> bool {
        self.min_time_nanos < end_nanos && self.max_time_nanos >= start_nanos
    }

    /// The metastore partition: the six-hour window of the object's creation (its ULID time),
    /// as in Pyroscope's metastore index. Compaction merges within a partition and gives its
    /// output the oldest source's time, so a block never leaves its partition; retention drops
    /// partitions by age of ingestion, so backfilled profiles get the full retention period.
    /// Lookups by data time use each partition's data time range.
    pub fn partition(&self) -> i64 {
        partition_of((self.created_ms() as i64).saturating_mul(1_000_000))
    }

    /// The object's path.
    pub fn path(&self) -> String {
        object_path(self.level, self.shard, &self.tenant, &self.id)
    }

    /// Bytes of this tenant's dataset.
    pub fn dataset_bytes(&self) -> u64 {
        self.samples.size + self.symbols.size + self.rollup_bytes()
    }

    /// Bytes of the dataset's rollups.
    pub fn rollup_bytes(&self) -> u64 {
        self.rollups.iter().map(|r| r.section.size).sum()
    }

    /// Creation time of the object (its ULID's), Unix milliseconds.
    pub fn created_ms(&self) -> u64 {
        ulid::Ulid::from_string(&self.id).map_or(0, |u| u.timestamp_ms())
    }

    /// The index of the block's series (built on first use, then kept with the entry).
    pub fn series_index(&self) -> &SeriesIndex {
        self.index
            .0
            .get_or_init(|| SeriesIndex::build(&self.series))
    }

    /// Distinct `service_name` values, sorted. (A scan: called when an entry is written, where
    /// building the index would be wasted.)
    pub fn service_names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self
            .series
            .iter()
            .filter_map(|s| s.label(kiln_otel::model::LABEL_SERVICE_NAME))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Distinct profile type ids, sorted.
    pub fn profile_types(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.series.iter().map(|s| &*s.profile_type).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The metastore entry: this dataset alone, as protobuf.
    pub fn encode_entry(&self) -> Vec<u8> {
        wire::encode(std::slice::from_ref(self), self.object_size)
    }

    /// Decodes a metastore entry.
    pub fn decode_entry(data: &[u8]) -> Result<Self, DecodeError> {
        let mut metas = wire::decode(data)?;
        if metas.len() != 1 {
            return Err(DecodeError::EntryDatasets(metas.len()));
        }
        Ok(metas.remove(0))
    }
}

/// How a compacted block names one of its sources in `compacted_from`: `{id}@{partition}`.
pub fn compacted_source(id: &str, partition: i64) -> String {
    format!("{id}@{partition}")
}

/// The object path of a block: L0 segments under `segments/{shard}/` (they hold several
/// tenants), compacted blocks under `blocks/{tenant}/{shard}/`.
pub fn object_path(level: u32, shard: u32, tenant: &str, id: &str) -> String {
    if level == 0 {
        format!("segments/{shard}/{id}.kblk")
    } else {
        format!("blocks/{}/{shard}/{id}.kblk", escape_tenant(tenant))
    }
}

/// The object id (ULID) in an object path written by [`object_path`].
pub fn object_id_of_path(path: &str) -> Option<&str> {
    let name = path.rsplit('/').next()?;
    let id = name.strip_suffix(".kblk")?;
    ulid::Ulid::from_string(id).ok().map(|_| id)
}

/// A tenant id as a path segment: letters, digits, `_`, `.` and `-` as they are, every other
/// byte as `+HH` (`+` is not a tenant character, so the mapping is one to one; object stores
/// percent-encode `~`, so it cannot serve).
pub fn escape_tenant(tenant: &str) -> String {
    let mut out = String::with_capacity(tenant.len());
    for b in tenant.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-') {
            out.push(b as char);
        } else {
            out.push_str(&format!("+{b:02X}"));
        }
    }
    out
}

/// The footer closing an object whose datasets are `datasets` (their `object_size` is ignored).
pub fn encode_footer(datasets: &[BlockMeta]) -> Vec<u8> {
    let version = datasets
        .first()
        .map_or(BLOCK_FORMAT_VERSION, |d| d.format_version);
    sealed_footer(wire::encode(datasets, 0), version)
}

/// `body` (the footer's `BlockMeta` protobuf) closed as a footer of format `version`: its
/// length, the version, the CRC32 of all of it and the magic.
pub(crate) fn sealed_footer(mut out: Vec<u8>, version: u32) -> Vec<u8> {
    let len = out.len() as u32;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&version.to_le_bytes());
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(FOOTER_MAGIC);
    out
}

/// How many bytes at the end of an object hold the footer, read from its last
/// [`FOOTER_TRAILER_BYTES`]; the error says what is wrong.
pub fn footer_len(trailer: &[u8]) -> Result<usize, DecodeError> {
    if trailer.len() < FOOTER_TRAILER_BYTES || &trailer[trailer.len() - 4..] != FOOTER_MAGIC {
        return Err(DecodeError::Magic("block footer"));
    }
    let t = &trailer[trailer.len() - FOOTER_TRAILER_BYTES..];
    let len = u32::from_le_bytes(t[0..4].try_into().expect("4 bytes")) as usize;
    let version = u32::from_le_bytes(t[4..8].try_into().expect("4 bytes"));
    if !(MIN_BLOCK_FORMAT_VERSION..=BLOCK_FORMAT_VERSION).contains(&version) {
        return Err(DecodeError::Version {
            what: "block format",
            version,
            supported: BLOCK_FORMAT_VERSION,
        });
    }
    Ok(len + FOOTER_TRAILER_BYTES)
}

/// Decodes an object's footer (the object's last [`footer_len`] bytes) into its datasets, with
/// `object_size` set to `object_size`.
pub fn decode_footer(footer: &[u8], object_size: u64) -> Result<Vec<BlockMeta>, DecodeError> {
    let total = footer_len(footer)?;
    if footer.len() < total {
        return Err(DecodeError::Truncated("footer"));
    }
    let footer = &footer[footer.len() - total..];
    let (body, tail) = footer.split_at(total - 8);
    let crc = u32::from_le_bytes(tail[0..4].try_into().expect("4 bytes"));
    if crc32fast::hash(body) != crc {
        return Err(DecodeError::Checksum("footer"));
    }
    let mut metas = wire::decode(&body[..body.len() - 8])?;
    // A section past the end (or whose end overflows) is damage, not a range to read.
    let outside = |s: &Section| {
        s.offset
            .checked_add(s.size)
            .is_none_or(|end| end > object_size)
    };
    for m in &mut metas {
        m.object_size = object_size;
        if outside(&m.samples)
            || outside(&m.symbols)
            || m.rollups.iter().any(|r| outside(&r.section))
        {
            return Err(DecodeError::OutsideObject(m.tenant.clone()));
        }
    }
    Ok(metas)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::series_labels::SeriesLabels;

    pub(crate) fn meta(tenant: &str, id: &str) -> BlockMeta {
        BlockMeta {
            format_version: BLOCK_FORMAT_VERSION,
            id: id.into(),
            tenant: tenant.into(),
            shard: 1,
            level: 0,
            min_time_nanos: 10,
            max_time_nanos: 20,
            object_size: 0,
            samples: Section { offset: 0, size: 5 },
            symbols: Section { offset: 5, size: 3 },
            series: vec![SeriesMeta {
                labels: SeriesLabels::new([("service_name", "api")]),
                profile_type: "p:c:n:c:n".into(),
                min_time_nanos: 10,
                max_time_nanos: 20,
                first_row: 0,
                rows: 7,
            }],
            rows: 7,
            profiles: 1,
            stack_nodes: 4,
            compacted_from: vec![],
            rollups: vec![],
            index: Default::default(),
            logs: Vec::new(),
            received_ms: 0,
        }
    }

    #[test]
    fn tenant_escaping_is_literal_and_one_to_one() {
        assert_eq!(escape_tenant("team-a_1.x"), "team-a_1.x");
        assert_eq!(escape_tenant("team*(1)!'"), "team+2A+281+29+21+27");
        assert_ne!(escape_tenant("a*"), escape_tenant("a+2A"));
    }

    #[test]
    fn entries_and_footers_round_trip_and_detect_damage() {
        let id = ulid::Ulid::generate().to_string();
        let a = meta("a", &id);
        assert_eq!(BlockMeta::decode_entry(&a.encode_entry()).unwrap(), a);
        let mut b = meta("b*", &id);
        b.samples.offset = 8;
        b.symbols.offset = 13;
        let footer = encode_footer(&[a.clone(), b.clone()]);
        let size = 16 + footer.len() as u64;
        let mut object = vec![0u8; 16];
        object.extend_from_slice(&footer);
        let n = footer_len(&object[object.len() - FOOTER_TRAILER_BYTES..]).unwrap();
        let got = decode_footer(&object[object.len() - n..], size).unwrap();
        assert_eq!(got[0].tenant, "a");
        assert_eq!(got[1].tenant, "b*");
        assert_eq!(got[1].samples, b.samples);
        let mut damaged = object.clone();
        let mid = damaged.len() - n + 3;
        damaged[mid] ^= 0x40;
        let err = decode_footer(&damaged[damaged.len() - n..], size).unwrap_err();
        assert_eq!(err, DecodeError::Checksum("footer"));
        assert!(err.to_string().contains("checksum"));
        assert_eq!(
            footer_len(b"nothing here at all"),
            Err(DecodeError::Magic("block footer"))
        );
        // A section past the object's end, or whose end overflows, is damage.
        let mut past = b.clone();
        past.symbols.offset = size;
        let footer = encode_footer(&[past]);
        assert_eq!(
            decode_footer(&footer, size),
            Err(DecodeError::OutsideObject("b*".into()))
        );
        let mut overflowing = b.clone();
        overflowing.samples.offset = u64::MAX - 1;
        let footer = encode_footer(&[overflowing]);
        assert_eq!(
            decode_footer(&footer, u64::MAX),
            Err(DecodeError::OutsideObject("b*".into()))
        );
    }

    #[test]
    fn object_paths_name_their_id() {
        let id = ulid::Ulid::generate().to_string();
        assert_eq!(object_id_of_path(&object_path(0, 1, "t", &id)), Some(&*id));
        assert_eq!(
            object_path(2, 0, "a*", &id),
            format!("blocks/a+2A/0/{id}.kblk")
        );
        assert_eq!(object_id_of_path("blocks/x/0/nope.kblk"), None);
    }
}
