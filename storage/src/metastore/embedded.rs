//! Embedded metastore on redb: one file under the data directory, fsynced on every commit.
//!
//! Tables (keys in parentheses):
//!
//! | table | key | value |
//! |---|---|---|
//! | `blocks` | (partition, tenant, shard, id) | the entry: protobuf `BlockMeta` with one dataset |
//! | `block_index` | (tenant, id, partition) | shard |
//! | `partitions` | (tenant, partition) | blocks, bytes, rows, min and max time |
//! | `objects` | id | (entries referencing the object, path) |
//! | `object_tombstones` | id | (due ms, path) |
//! | `entry_tombstones` | (id, tenant, partition) | compacted entries, never to be added again |
//! | `queue` | (tenant, partition, shard, level, id) | JSON `QueuedBlock` |
//! | `jobs` | job id | JSON `Job` |
//! | `claims` | (tenant, id, partition) | job id |
//! | `quarantine` | (tenant, id, partition) | JSON `Quarantined` |
//! | `tenant_deletions` | tenant | when it was last deleted (Unix ms) |
//!
//! An entry is one tenant's dataset of one object in one partition: (tenant, id, partition).
//!
//! Nothing is loaded at start-up: lookups range-scan the partitions of their tenant and time
//! range and decode entries through a cache bounded in bytes. A storage failure (a full disk,
//! say) answers [`Error::MetastoreUnavailable`] and closes the database; the next call opens it
//! again, so the metastore recovers without a restart once the disk has room.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use redb::{Database, TableDefinition};

use crate::metastore::PartitionStats;
use crate::{Error, Result};

const BLOCKS: TableDefinition<'_, (i64, &str, u32, &str), &[u8]> =
    TableDefinition::new("blocks_v2");
const BLOCK_INDEX: TableDefinition<'_, (&str, &str, i64), u32> =
    TableDefinition::new("block_index");
const PARTITIONS: TableDefinition<'_, (&str, i64), &[u8]> = TableDefinition::new("partitions");
const OBJECTS: TableDefinition<'_, &str, (u32, &str)> = TableDefinition::new("objects");
const OBJECT_TOMBSTONES: TableDefinition<'_, &str, (u64, &str)> =
    TableDefinition::new("object_tombstones");
const ENTRY_TOMBSTONES: TableDefinition<'_, (&str, &str, i64), ()> =
    TableDefinition::new("entry_tombstones");
const QUEUE: TableDefinition<'_, (&str, i64, u32, u32, &str), &[u8]> =
    TableDefinition::new("queue");
const JOBS: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("jobs");
const CLAIMS: TableDefinition<'_, (&str, &str, i64), u64> = TableDefinition::new("claims");
const QUARANTINE: TableDefinition<'_, (&str, &str, i64), &[u8]> =
    TableDefinition::new("quarantine");
const COUNTERS: TableDefinition<'_, &str, u64> = TableDefinition::new("counters");
/// Write-ahead logs' checkpoints, by log name.
const LOG_CHECKPOINTS: TableDefinition<'_, &str, u64> = TableDefinition::new("log_checkpoints");
/// When each tenant was last deleted (Unix ms), by tenant.
const TENANT_DELETIONS: TableDefinition<'_, &str, u64> = TableDefinition::new("tenant_deletions");

/// Greater than every tenant id and block id (both ASCII).
const MAX_STR: &str = "\u{10FFFF}";

/// The highest level: its blocks merge only with each other, by size.
pub use crate::format::meta::TOP_LEVEL;

#[cfg(any(test, feature = "testing"))]
mod disk_fault;
mod handle;
mod tables;

#[cfg(test)]
mod tests;

#[cfg(any(test, feature = "testing"))]
pub use disk_fault::DiskFault;
pub use handle::Embedded;

/// Opens the storage backend of the database file; the disk-full test passes [`DiskFault`].
#[cfg(any(test, feature = "testing"))]
pub type BackendFactory = Arc<dyn Fn(&Path) -> std::io::Result<DiskFault> + Send + Sync>;
#[cfg(not(any(test, feature = "testing")))]
pub type BackendFactory =
    Arc<dyn Fn(&Path) -> std::io::Result<redb::backends::FileBackend> + Send + Sync>;

/// The single-binary metastore.
pub struct EmbeddedMetastore {
    path: PathBuf,
    backend: Option<BackendFactory>,
    db: RwLock<Option<Arc<Database>>>,
    /// One write transaction at a time, and reopening only between them.
    write_lock: tokio::sync::Mutex<()>,
    cache: crate::metastore::EntryCache,
    /// Whether entries written are kept in `cache` ([`Embedded::keep_written`]).
    keep_written: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for EmbeddedMetastore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedMetastore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

fn unavailable(e: impl std::fmt::Display) -> Error {
    Error::MetastoreUnavailable(e.to_string())
}

/// Maps a redb error: storage failures are "unavailable" (and close the database), the rest
/// are bugs.
fn db_err(e: impl Into<redb::Error>) -> Error {
    let e: redb::Error = e.into();
    match e {
        redb::Error::Io(_)
        | redb::Error::PreviousIo
        | redb::Error::DatabaseAlreadyOpen
        | redb::Error::DatabaseClosed
        | redb::Error::TransactionPoisoned => unavailable(e),
        other => Error::Metastore(other.to_string()),
    }
}

fn json<T: serde::Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("metastore records serialize")
}

fn from_json<T: serde::de::DeserializeOwned>(what: &str, data: &[u8]) -> Result<T> {
    serde_json::from_slice(data).map_err(|e| Error::Metastore(format!("bad {what} record: {e}")))
}

fn encode_stats(s: &PartitionStats) -> [u8; 40] {
    let mut out = [0u8; 40];
    out[0..8].copy_from_slice(&s.blocks.to_le_bytes());
    out[8..16].copy_from_slice(&s.bytes.to_le_bytes());
    out[16..24].copy_from_slice(&s.rows.to_le_bytes());
    out[24..32].copy_from_slice(&s.min_time_nanos.to_le_bytes());
    out[32..40].copy_from_slice(&s.max_time_nanos.to_le_bytes());
    out
}

fn decode_stats(partition: i64, data: &[u8]) -> Result<PartitionStats> {
    if data.len() != 40 {
        return Err(Error::Metastore("bad partition record".into()));
    }
    let u = |i: usize| u64::from_le_bytes(data[i..i + 8].try_into().expect("8 bytes"));
    let s = |i: usize| i64::from_le_bytes(data[i..i + 8].try_into().expect("8 bytes"));
    Ok(PartitionStats {
        partition,
        blocks: u(0),
        bytes: u(8),
        rows: u(16),
        min_time_nanos: s(24),
        max_time_nanos: s(32),
    })
}
