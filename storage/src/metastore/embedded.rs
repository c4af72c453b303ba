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
//!
//! An entry is one tenant's dataset of one object in one partition: (tenant, id, partition).
//!
//! Nothing is loaded at start-up: lookups range-scan the partitions of their tenant and time
//! range and decode entries through a cache bounded in bytes. A storage failure (a full disk,
//! say) answers [`Error::MetastoreUnavailable`] and closes the database; the next call opens it
//! again, so the metastore recovers without a restart once the disk has room.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use redb::{
    Database, ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction,
};

use super::{
    BlockMeta, BlockQuery, Job, LogCheckpoint, Metastore, PartitionStats, Quarantined, QueuedBlock,
    Removed, Tombstone,
};
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

/// Greater than every tenant id and block id (both ASCII).
const MAX_STR: &str = "\u{10FFFF}";

/// The highest level: its blocks merge only with each other, by size.
pub use crate::format::meta::TOP_LEVEL;

/// Opens the storage backend of the database file; the disk-full test passes [`DiskFault`].
#[cfg(any(test, feature = "testing"))]
pub type BackendFactory = Arc<dyn Fn(&Path) -> std::io::Result<DiskFault> + Send + Sync>;
#[cfg(not(any(test, feature = "testing")))]
pub type BackendFactory =
    Arc<dyn Fn(&Path) -> std::io::Result<redb::backends::FileBackend> + Send + Sync>;

/// A file backend whose writes fail with "no space left on device" while `full` is set: the
/// disk-full test of the embedded metastore.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug)]
pub struct DiskFault {
    inner: redb::backends::FileBackend,
    full: Arc<std::sync::atomic::AtomicBool>,
}

#[cfg(any(test, feature = "testing"))]
impl DiskFault {
    /// A factory for [`EmbeddedMetastore::open_with_backend`] sharing one `full` switch.
    pub fn factory(full: Arc<std::sync::atomic::AtomicBool>) -> BackendFactory {
        Arc::new(move |path: &Path| {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)?;
            let inner = redb::backends::FileBackend::new(file).map_err(std::io::Error::other)?;
            Ok(DiskFault {
                inner,
                full: Arc::clone(&full),
            })
        })
    }

    fn check(&self) -> std::io::Result<()> {
        if self.full.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(std::io::Error::from(std::io::ErrorKind::StorageFull));
        }
        Ok(())
    }
}

#[cfg(any(test, feature = "testing"))]
impl redb::StorageBackend for DiskFault {
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.check()?;
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.check()?;
        self.inner.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.check()?;
        self.inner.write(offset, data)
    }
    fn close(&self) -> std::io::Result<()> {
        self.inner.close()
    }
    fn try_lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> std::result::Result<bool, redb::BackendError> {
        self.inner.try_lock_range(start, end)
    }
    fn try_lock_shared_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> std::result::Result<bool, redb::BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }
    fn lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> std::result::Result<(), redb::BackendError> {
        self.inner.lock_range(start, end)
    }
    fn lock_shared_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> std::result::Result<(), redb::BackendError> {
        self.inner.lock_shared_range(start, end)
    }
    fn unlock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> std::result::Result<(), redb::BackendError> {
        self.inner.unlock_range(start, end)
    }
    fn query_lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> std::result::Result<bool, redb::BackendError> {
        self.inner.query_lock_range(start, end)
    }
}

/// The single-binary metastore.
pub struct EmbeddedMetastore {
    path: PathBuf,
    backend: Option<BackendFactory>,
    db: RwLock<Option<Arc<Database>>>,
    /// One write transaction at a time, and reopening only between them.
    write_lock: tokio::sync::Mutex<()>,
    cache: super::EntryCache,
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

impl EmbeddedMetastore {
    /// Opens (or creates) the metastore file.
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_with_backend(path, None)
    }

    /// Opens the metastore on a custom storage backend (tests inject failures with one).
    pub fn open_with_backend(path: &Path, backend: Option<BackendFactory>) -> Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| Error::Io {
                path: dir.display().to_string(),
                source,
            })?;
        }
        let m = Self {
            path: path.to_owned(),
            backend,
            db: RwLock::new(None),
            write_lock: tokio::sync::Mutex::new(()),
            cache: super::entry_cache(),
            keep_written: std::sync::atomic::AtomicBool::new(true),
        };
        let db = m.db()?;
        let tx = db.begin_write().map_err(db_err)?;
        {
            tx.open_table(BLOCKS).map_err(db_err)?;
            tx.open_table(BLOCK_INDEX).map_err(db_err)?;
            tx.open_table(PARTITIONS).map_err(db_err)?;
            tx.open_table(OBJECTS).map_err(db_err)?;
            tx.open_table(OBJECT_TOMBSTONES).map_err(db_err)?;
            tx.open_table(ENTRY_TOMBSTONES).map_err(db_err)?;
            tx.open_table(QUEUE).map_err(db_err)?;
            tx.open_table(JOBS).map_err(db_err)?;
            tx.open_table(CLAIMS).map_err(db_err)?;
            tx.open_table(QUARANTINE).map_err(db_err)?;
            tx.open_table(COUNTERS).map_err(db_err)?;
            tx.open_table(LOG_CHECKPOINTS).map_err(db_err)?;
        }
        tx.commit().map_err(db_err)?;
        Ok(m)
    }

    /// The metastore file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn open_db(&self) -> Result<Database> {
        match &self.backend {
            None => Database::create(&self.path).map_err(db_err),
            Some(factory) => {
                let backend = factory(&self.path).map_err(unavailable)?;
                Database::builder()
                    .create_with_backend(backend)
                    .map_err(db_err)
            }
        }
    }

    /// The open database, opening it again after a storage failure closed it.
    fn db(&self) -> Result<Arc<Database>> {
        if let Some(db) = self.db.read().expect("metastore lock").as_ref() {
            return Ok(Arc::clone(db));
        }
        let mut slot = self.db.write().expect("metastore lock");
        if let Some(db) = slot.as_ref() {
            return Ok(Arc::clone(db));
        }
        let db = Arc::new(self.open_db()?);
        *slot = Some(Arc::clone(&db));
        tracing::info!(path = %self.path.display(), "metastore opened");
        Ok(db)
    }

    /// Closes the database after a storage failure, waiting for readers to let go of it.
    fn close_db(&self) {
        let mut slot = self.db.write().expect("metastore lock");
        let Some(mut db) = slot.take() else {
            return;
        };
        for _ in 0..500 {
            match Arc::try_unwrap(db) {
                Ok(db) => {
                    drop(db);
                    return;
                }
                Err(still_shared) => {
                    db = still_shared;
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
            }
        }
        // A reader holds on for a second: keep the old handle rather than open a second one.
        *slot = Some(db);
    }

    /// Runs `f` in one write transaction on a blocking thread and commits it.
    async fn write<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Self, &WriteTransaction) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let _guard = self.write_lock.lock().await;
        let this = Arc::clone(self);
        let result = tokio::task::spawn_blocking(move || {
            let db = this.db()?;
            let tx = db.begin_write().map_err(db_err)?;
            let out = f(&this, &tx);
            match out {
                Ok(v) => {
                    tx.commit().map_err(db_err)?;
                    Ok(v)
                }
                Err(e) => {
                    let _ = tx.abort();
                    Err(e)
                }
            }
        })
        .await
        .map_err(|e| Error::Task(e.to_string()))?;
        if let Err(Error::MetastoreUnavailable(e)) = &result {
            tracing::warn!(error = %e, "metastore storage failed; reopening it on the next call");
            let this = Arc::clone(self);
            let _ = tokio::task::spawn_blocking(move || this.close_db()).await;
        }
        result
    }

    fn read_tx(&self) -> Result<ReadTransaction> {
        let result = self.db()?.begin_read().map_err(db_err);
        if matches!(result, Err(Error::MetastoreUnavailable(_))) {
            self.close_db();
        }
        result
    }

    fn decode(
        &self,
        tenant: &str,
        id: &str,
        partition: i64,
        data: &[u8],
    ) -> Result<Arc<BlockMeta>> {
        super::decode_cached(&self.cache, tenant, id, partition, data)
    }

    fn next_counter(tx: &WriteTransaction, name: &str) -> Result<u64> {
        let mut t = tx.open_table(COUNTERS).map_err(db_err)?;
        let next = t.get(name).map_err(db_err)?.map_or(1, |v| v.value() + 1);
        t.insert(name, next).map_err(db_err)?;
        Ok(next)
    }

    /// Adds one entry; refuses a duplicate or a compacted one.
    fn insert_entry(tx: &WriteTransaction, b: &BlockMeta) -> Result<()> {
        let exists = || Error::BlockExists {
            tenant: b.tenant.clone(),
            block: b.id.clone(),
        };
        let partition = b.partition();
        {
            let mut index = tx.open_table(BLOCK_INDEX).map_err(db_err)?;
            if index
                .get((b.tenant.as_str(), b.id.as_str(), partition))
                .map_err(db_err)?
                .is_some()
            {
                return Err(exists());
            }
            let tombs = tx.open_table(ENTRY_TOMBSTONES).map_err(db_err)?;
            if tombs
                .get((b.id.as_str(), b.tenant.as_str(), partition))
                .map_err(db_err)?
                .is_some()
            {
                return Err(exists());
            }
            index
                .insert((b.tenant.as_str(), b.id.as_str(), partition), b.shard)
                .map_err(db_err)?;
        }
        tx.open_table(BLOCKS)
            .map_err(db_err)?
            .insert(
                (partition, b.tenant.as_str(), b.shard, b.id.as_str()),
                b.encode_entry().as_slice(),
            )
            .map_err(db_err)?;
        {
            let mut parts = tx.open_table(PARTITIONS).map_err(db_err)?;
            let mut s = match parts.get((b.tenant.as_str(), partition)).map_err(db_err)? {
                Some(v) => decode_stats(partition, v.value())?,
                None => PartitionStats {
                    partition,
                    min_time_nanos: i64::MAX,
                    max_time_nanos: i64::MIN,
                    ..Default::default()
                },
            };
            s.blocks += 1;
            s.bytes += b.dataset_bytes();
            s.rows += b.rows;
            s.min_time_nanos = s.min_time_nanos.min(b.min_time_nanos);
            s.max_time_nanos = s.max_time_nanos.max(b.max_time_nanos);
            parts
                .insert((b.tenant.as_str(), partition), encode_stats(&s).as_slice())
                .map_err(db_err)?;
        }
        {
            let mut objects = tx.open_table(OBJECTS).map_err(db_err)?;
            let path = b.path();
            let refs = objects
                .get(b.id.as_str())
                .map_err(db_err)?
                .map_or(0, |v| v.value().0);
            objects
                .insert(b.id.as_str(), (refs + 1, path.as_str()))
                .map_err(db_err)?;
        }
        Self::enqueue(tx, b)
    }

    /// Puts a block in the compaction queue (top-level blocks too: they merge by size).
    fn enqueue(tx: &WriteTransaction, b: &BlockMeta) -> Result<()> {
        tx.open_table(QUEUE)
            .map_err(db_err)?
            .insert(
                (
                    b.tenant.as_str(),
                    b.partition(),
                    b.shard,
                    b.level,
                    b.id.as_str(),
                ),
                json(&QueuedBlock::of(b)).as_slice(),
            )
            .map_err(db_err)?;
        Ok(())
    }

    /// Reads an entry inside a write transaction.
    fn entry_in(
        &self,
        tx: &WriteTransaction,
        tenant: &str,
        id: &str,
        partition: i64,
    ) -> Result<Option<BlockMeta>> {
        let Some(shard) = tx
            .open_table(BLOCK_INDEX)
            .map_err(db_err)?
            .get((tenant, id, partition))
            .map_err(db_err)?
            .map(|v| v.value())
        else {
            return Ok(None);
        };
        let blocks = tx.open_table(BLOCKS).map_err(db_err)?;
        let Some(data) = blocks.get((partition, tenant, shard, id)).map_err(db_err)? else {
            return Err(Error::Metastore(format!(
                "block {id} of {tenant} is indexed but missing"
            )));
        };
        Ok(Some(
            (*self.decode(tenant, id, partition, data.value())?).clone(),
        ))
    }

    /// Removes one entry from the index. With `keep_object`, the object keeps its reference
    /// (quarantine); otherwise an object left without entries is tombstoned, due at `due_ms`.
    /// Returns whether an object was tombstoned.
    fn remove_entry(
        &self,
        tx: &WriteTransaction,
        b: &BlockMeta,
        due_ms: u64,
        tombstone_entry: bool,
        keep_object: bool,
    ) -> Result<bool> {
        let (tenant, id, partition) = (b.tenant.as_str(), b.id.as_str(), b.partition());
        tx.open_table(BLOCK_INDEX)
            .map_err(db_err)?
            .remove((tenant, id, partition))
            .map_err(db_err)?;
        tx.open_table(BLOCKS)
            .map_err(db_err)?
            .remove((partition, tenant, b.shard, id))
            .map_err(db_err)?;
        tx.open_table(QUEUE)
            .map_err(db_err)?
            .remove((tenant, partition, b.shard, b.level, id))
            .map_err(db_err)?;
        {
            let mut parts = tx.open_table(PARTITIONS).map_err(db_err)?;
            let stats = parts
                .get((tenant, partition))
                .map_err(db_err)?
                .map(|v| decode_stats(partition, v.value()))
                .transpose()?;
            if let Some(mut s) = stats {
                s.blocks = s.blocks.saturating_sub(1);
                s.bytes = s.bytes.saturating_sub(b.dataset_bytes());
                s.rows = s.rows.saturating_sub(b.rows);
                if s.blocks == 0 {
                    parts.remove((tenant, partition)).map_err(db_err)?;
                } else {
                    parts
                        .insert((tenant, partition), encode_stats(&s).as_slice())
                        .map_err(db_err)?;
                }
            }
        }
        if tombstone_entry {
            tx.open_table(ENTRY_TOMBSTONES)
                .map_err(db_err)?
                .insert((id, tenant, partition), ())
                .map_err(db_err)?;
        }
        self.cache
            .invalidate(&(tenant.to_owned(), id.to_owned(), partition));
        if keep_object {
            return Ok(false);
        }
        self.release_object(tx, id, due_ms)
    }

    /// Drops one reference to object `id`; tombstones it when none is left.
    fn release_object(&self, tx: &WriteTransaction, id: &str, due_ms: u64) -> Result<bool> {
        let mut objects = tx.open_table(OBJECTS).map_err(db_err)?;
        let Some((refs, path)) = objects
            .get(id)
            .map_err(db_err)?
            .map(|v| (v.value().0, v.value().1.to_owned()))
        else {
            return Ok(false);
        };
        if refs > 1 {
            objects
                .insert(id, (refs - 1, path.as_str()))
                .map_err(db_err)?;
            return Ok(false);
        }
        objects.remove(id).map_err(db_err)?;
        tx.open_table(OBJECT_TOMBSTONES)
            .map_err(db_err)?
            .insert(id, (due_ms, path.as_str()))
            .map_err(db_err)?;
        Ok(true)
    }

    fn get_job(tx: &WriteTransaction, id: u64) -> Result<Option<Job>> {
        let jobs = tx.open_table(JOBS).map_err(db_err)?;
        let job = jobs.get(id).map_err(db_err)?;
        job.map(|v| from_json("job", v.value())).transpose()
    }

    fn delete_job(tx: &WriteTransaction, job: &Job) -> Result<()> {
        tx.open_table(JOBS)
            .map_err(db_err)?
            .remove(job.id)
            .map_err(db_err)?;
        let mut claims = tx.open_table(CLAIMS).map_err(db_err)?;
        for s in &job.sources {
            claims
                .remove((job.tenant.as_str(), s.id.as_str(), s.partition))
                .map_err(db_err)?;
        }
        Ok(())
    }

    /// Every entry of `tenant` in `partitions`, from inside a write transaction.
    fn entries_of(
        &self,
        tx: &WriteTransaction,
        tenant: &str,
        partitions: &[i64],
    ) -> Result<Vec<BlockMeta>> {
        let blocks = tx.open_table(BLOCKS).map_err(db_err)?;
        let mut out = Vec::new();
        for &p in partitions {
            for row in blocks
                .range((p, tenant, 0u32, "")..=(p, tenant, u32::MAX, MAX_STR))
                .map_err(db_err)?
            {
                let (k, v) = row.map_err(db_err)?;
                let id = k.value().3.to_owned();
                out.push((*self.decode(tenant, &id, p, v.value())?).clone());
            }
        }
        Ok(out)
    }

    fn tenant_partitions(tx: &WriteTransaction, tenant: &str) -> Result<Vec<i64>> {
        let parts = tx.open_table(PARTITIONS).map_err(db_err)?;
        let mut out = Vec::new();
        for row in parts
            .range((tenant, i64::MIN)..=(tenant, i64::MAX))
            .map_err(db_err)?
        {
            out.push(row.map_err(db_err)?.0.value().1);
        }
        Ok(out)
    }

    /// Deletes the jobs of `tenant` in `partitions` (all partitions when `None`).
    fn delete_jobs_of(
        tx: &WriteTransaction,
        tenant: &str,
        partitions: Option<&[i64]>,
    ) -> Result<()> {
        let doomed: Vec<Job> = {
            let jobs = tx.open_table(JOBS).map_err(db_err)?;
            let mut v = Vec::new();
            for row in jobs.iter().map_err(db_err)? {
                let job: Job = from_json("job", row.map_err(db_err)?.1.value())?;
                if job.tenant == tenant && partitions.is_none_or(|p| p.contains(&job.partition)) {
                    v.push(job);
                }
            }
            v
        };
        for job in &doomed {
            Self::delete_job(tx, job)?;
        }
        Ok(())
    }
}

/// The [`Metastore`] implementation lives on `Arc<EmbeddedMetastore>`, so writes can run on
/// blocking threads.
#[derive(Debug, Clone)]
pub struct Embedded(pub Arc<EmbeddedMetastore>);

impl Embedded {
    /// Whether entries this process writes are kept decoded in its cache as written (the
    /// default), for the queries and compactions of the same process that read them next.
    pub fn keep_written(&self, keep: bool) {
        self.0
            .keep_written
            .store(keep, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Embedded {
    /// Opens (or creates) the metastore file.
    pub fn open(path: &Path) -> Result<Self> {
        Ok(Self(Arc::new(EmbeddedMetastore::open(path)?)))
    }

    /// Opens the metastore on a custom storage backend.
    pub fn open_with_backend(path: &Path, backend: BackendFactory) -> Result<Self> {
        Ok(Self(Arc::new(EmbeddedMetastore::open_with_backend(
            path,
            Some(backend),
        )?)))
    }
}

impl Embedded {
    /// Registers `blocks` and records `checkpoint`, in one transaction.
    async fn add(&self, blocks: Vec<BlockMeta>, checkpoint: Option<LogCheckpoint>) -> Result<()> {
        if blocks.is_empty() && checkpoint.is_none() {
            return Ok(());
        }
        let written = self
            .0
            .write(move |_, tx| {
                for b in &blocks {
                    EmbeddedMetastore::insert_entry(tx, b)?;
                }
                if let Some(c) = &checkpoint {
                    let mut t = tx.open_table(LOG_CHECKPOINTS).map_err(db_err)?;
                    let at = t
                        .get(c.log.as_str())
                        .map_err(db_err)?
                        .map_or(0, |v| v.value());
                    t.insert(c.log.as_str(), at.max(c.seq)).map_err(db_err)?;
                }
                Ok(blocks)
            })
            .await?;
        super::cache_written(
            &self.0.cache,
            self.0
                .keep_written
                .load(std::sync::atomic::Ordering::Relaxed),
            written,
        );
        Ok(())
    }
}

#[async_trait::async_trait]
impl Metastore for Embedded {
    async fn add_blocks(&self, blocks: Vec<BlockMeta>) -> Result<()> {
        self.add(blocks, None).await
    }

    async fn add_blocks_checkpointed(
        &self,
        blocks: Vec<BlockMeta>,
        checkpoint: &LogCheckpoint,
    ) -> Result<()> {
        self.add(blocks, Some(checkpoint.clone())).await
    }

    async fn log_checkpoint(&self, log: &str) -> Result<u64> {
        let tx = self.0.read_tx()?;
        let t = tx.open_table(LOG_CHECKPOINTS).map_err(db_err)?;
        Ok(t.get(log).map_err(db_err)?.map_or(0, |v| v.value()))
    }

    async fn query_blocks(&self, q: BlockQuery<'_>) -> Result<Vec<Arc<BlockMeta>>> {
        let m = &self.0;
        let tx = m.read_tx()?;
        let parts = tx.open_table(PARTITIONS).map_err(db_err)?;
        let blocks = tx.open_table(BLOCKS).map_err(db_err)?;
        let mut out = Vec::new();
        for row in parts
            .range((q.tenant, i64::MIN)..=(q.tenant, i64::MAX))
            .map_err(db_err)?
        {
            let (k, v) = row.map_err(db_err)?;
            let p = k.value().1;
            let stats = decode_stats(p, v.value())?;
            if stats.min_time_nanos >= q.end_nanos || stats.max_time_nanos < q.start_nanos {
                continue;
            }
            for row in blocks
                .range((p, q.tenant, 0u32, "")..=(p, q.tenant, u32::MAX, MAX_STR))
                .map_err(db_err)?
            {
                let (k, v) = row.map_err(db_err)?;
                let id = k.value().3;
                match m.decode(q.tenant, id, p, v.value()) {
                    Ok(b) if q.matches(&b) => out.push(b),
                    Ok(_) => {}
                    Err(e) => tracing::error!(tenant = q.tenant, block = id, error = %e,
                        "unreadable metastore entry left out of a query"),
                }
            }
        }
        Ok(out)
    }

    async fn get_blocks(&self, tenant: &str, ids: &[String]) -> Result<Vec<Arc<BlockMeta>>> {
        let m = &self.0;
        let tx = m.read_tx()?;
        let index = tx.open_table(BLOCK_INDEX).map_err(db_err)?;
        let blocks = tx.open_table(BLOCKS).map_err(db_err)?;
        let mut out = Vec::new();
        for id in ids {
            for row in index
                .range((tenant, id.as_str(), i64::MIN)..=(tenant, id.as_str(), i64::MAX))
                .map_err(db_err)?
            {
                let (k, v) = row.map_err(db_err)?;
                let (p, shard) = (k.value().2, v.value());
                if let Some(v) = blocks
                    .get((p, tenant, shard, id.as_str()))
                    .map_err(db_err)?
                {
                    out.push(m.decode(tenant, id, p, v.value())?);
                }
            }
        }
        Ok(out)
    }

    async fn tenants(&self) -> Result<Vec<String>> {
        let tx = self.0.read_tx()?;
        let parts = tx.open_table(PARTITIONS).map_err(db_err)?;
        let mut out: Vec<String> = Vec::new();
        for row in parts.iter().map_err(db_err)? {
            let (k, _) = row.map_err(db_err)?;
            let t = k.value().0;
            if out.last().is_none_or(|l| l != t) {
                out.push(t.to_owned());
            }
        }
        Ok(out)
    }

    async fn partitions(&self, tenant: &str) -> Result<Vec<PartitionStats>> {
        let tx = self.0.read_tx()?;
        let parts = tx.open_table(PARTITIONS).map_err(db_err)?;
        let mut out = Vec::new();
        for row in parts
            .range((tenant, i64::MIN)..=(tenant, i64::MAX))
            .map_err(db_err)?
        {
            let (k, v) = row.map_err(db_err)?;
            out.push(decode_stats(k.value().1, v.value())?);
        }
        Ok(out)
    }

    async fn queued_blocks(&self) -> Result<Vec<QueuedBlock>> {
        let tx = self.0.read_tx()?;
        let queue = tx.open_table(QUEUE).map_err(db_err)?;
        let mut out = Vec::new();
        for row in queue.iter().map_err(db_err)? {
            out.push(from_json("queue", row.map_err(db_err)?.1.value())?);
        }
        Ok(out)
    }

    async fn add_jobs(&self, jobs: Vec<Job>) -> Result<usize> {
        self.0
            .write(move |_, tx| {
                let mut created = 0;
                'jobs: for mut job in jobs {
                    {
                        let queue = tx.open_table(QUEUE).map_err(db_err)?;
                        let claims = tx.open_table(CLAIMS).map_err(db_err)?;
                        for s in &job.sources {
                            let key = (
                                s.tenant.as_str(),
                                s.partition,
                                s.shard,
                                s.level,
                                s.id.as_str(),
                            );
                            if s.tenant != job.tenant
                                || queue.get(key).map_err(db_err)?.is_none()
                                || claims
                                    .get((s.tenant.as_str(), s.id.as_str(), s.partition))
                                    .map_err(db_err)?
                                    .is_some()
                            {
                                continue 'jobs;
                            }
                        }
                    }
                    job.id = EmbeddedMetastore::next_counter(tx, "job")?;
                    job.owner.clear();
                    job.lease_expires_ms = 0;
                    {
                        let mut queue = tx.open_table(QUEUE).map_err(db_err)?;
                        let mut claims = tx.open_table(CLAIMS).map_err(db_err)?;
                        for s in &job.sources {
                            queue
                                .remove((
                                    s.tenant.as_str(),
                                    s.partition,
                                    s.shard,
                                    s.level,
                                    s.id.as_str(),
                                ))
                                .map_err(db_err)?;
                            claims
                                .insert((s.tenant.as_str(), s.id.as_str(), s.partition), job.id)
                                .map_err(db_err)?;
                        }
                    }
                    tx.open_table(JOBS)
                        .map_err(db_err)?
                        .insert(job.id, json(&job).as_slice())
                        .map_err(db_err)?;
                    created += 1;
                }
                Ok(created)
            })
            .await
    }

    async fn lease_job(
        &self,
        owner: &str,
        now_ms: u64,
        lease_ms: u64,
        levels: std::ops::Range<u32>,
    ) -> Result<Option<Job>> {
        let owner = owner.to_owned();
        self.0
            .write(move |_, tx| {
                let mut jobs = tx.open_table(JOBS).map_err(db_err)?;
                // Ids ascend: the first job met of the lowest level is that level's oldest.
                let mut found: Option<Job> = None;
                for row in jobs.iter().map_err(db_err)? {
                    let job: Job = from_json("job", row.map_err(db_err)?.1.value())?;
                    let free = job.owner.is_empty() || job.lease_expires_ms <= now_ms;
                    if free
                        && levels.contains(&job.level)
                        && found.as_ref().is_none_or(|f| job.level < f.level)
                    {
                        found = Some(job);
                    }
                }
                let Some(mut job) = found else {
                    return Ok(None);
                };
                job.owner = owner;
                job.lease_expires_ms = now_ms.saturating_add(lease_ms);
                job.attempts += 1;
                jobs.insert(job.id, json(&job).as_slice()).map_err(db_err)?;
                Ok(Some(job))
            })
            .await
    }

    async fn complete_job(
        &self,
        job: &Job,
        owner: &str,
        outputs: Vec<BlockMeta>,
        now_ms: u64,
        delete_after_ms: u64,
    ) -> Result<()> {
        let (job_id, owner) = (job.id, owner.to_owned());
        let written = self
            .0
            .write(move |m, tx| {
                let Some(job) = EmbeddedMetastore::get_job(tx, job_id)? else {
                    return Err(Error::LeaseLost { job: job_id });
                };
                if job.owner != owner {
                    return Err(Error::LeaseLost { job: job_id });
                }
                let due = now_ms.saturating_add(delete_after_ms);
                for s in &job.sources {
                    let Some(b) = m.entry_in(tx, &job.tenant, &s.id, s.partition)? else {
                        return Err(Error::Metastore(format!(
                            "source {} of job {job_id} is gone",
                            s.id
                        )));
                    };
                    m.remove_entry(tx, &b, due, true, false)?;
                }
                EmbeddedMetastore::delete_job(tx, &job)?;
                for b in &outputs {
                    if b.tenant != job.tenant {
                        return Err(Error::Metastore("output of another tenant".into()));
                    }
                    EmbeddedMetastore::insert_entry(tx, b)?;
                }
                Ok(outputs)
            })
            .await?;
        super::cache_written(
            &self.0.cache,
            self.0
                .keep_written
                .load(std::sync::atomic::Ordering::Relaxed),
            written,
        );
        Ok(())
    }

    async fn cancel_job(&self, job: &Job) -> Result<()> {
        let job_id = job.id;
        self.0
            .write(move |m, tx| {
                let Some(job) = EmbeddedMetastore::get_job(tx, job_id)? else {
                    return Ok(());
                };
                EmbeddedMetastore::delete_job(tx, &job)?;
                for s in &job.sources {
                    if let Some(b) = m.entry_in(tx, &job.tenant, &s.id, s.partition)? {
                        EmbeddedMetastore::enqueue(tx, &b)?;
                    }
                }
                Ok(())
            })
            .await
    }

    async fn jobs(&self) -> Result<Vec<Job>> {
        let tx = self.0.read_tx()?;
        let jobs = tx.open_table(JOBS).map_err(db_err)?;
        let mut out = Vec::new();
        for row in jobs.iter().map_err(db_err)? {
            out.push(from_json("job", row.map_err(db_err)?.1.value())?);
        }
        Ok(out)
    }

    async fn drop_partitions(
        &self,
        tenant: &str,
        before_partition: i64,
        now_ms: u64,
        delete_after_ms: u64,
    ) -> Result<Removed> {
        let tenant = tenant.to_owned();
        self.0
            .write(move |m, tx| {
                let partitions: Vec<i64> = EmbeddedMetastore::tenant_partitions(tx, &tenant)?
                    .into_iter()
                    .filter(|p| *p < before_partition)
                    .collect();
                EmbeddedMetastore::delete_jobs_of(tx, &tenant, Some(&partitions))?;
                let due = now_ms.saturating_add(delete_after_ms);
                let mut removed = Removed::default();
                for b in m.entries_of(tx, &tenant, &partitions)? {
                    removed.entries += 1;
                    removed.objects += usize::from(m.remove_entry(tx, &b, due, false, false)?);
                }
                Ok(removed)
            })
            .await
    }

    async fn delete_tenant(
        &self,
        tenant: &str,
        now_ms: u64,
        delete_after_ms: u64,
    ) -> Result<Removed> {
        let tenant = tenant.to_owned();
        self.0
            .write(move |m, tx| {
                let partitions = EmbeddedMetastore::tenant_partitions(tx, &tenant)?;
                EmbeddedMetastore::delete_jobs_of(tx, &tenant, None)?;
                let due = now_ms.saturating_add(delete_after_ms);
                let mut removed = Removed::default();
                for b in m.entries_of(tx, &tenant, &partitions)? {
                    removed.entries += 1;
                    removed.objects += usize::from(m.remove_entry(tx, &b, due, false, false)?);
                }
                let quarantined: Vec<(String, i64)> = {
                    let q = tx.open_table(QUARANTINE).map_err(db_err)?;
                    let mut v = Vec::new();
                    for row in q
                        .range(
                            (tenant.as_str(), "", i64::MIN)..=(tenant.as_str(), MAX_STR, i64::MAX),
                        )
                        .map_err(db_err)?
                    {
                        let k = row.map_err(db_err)?.0;
                        v.push((k.value().1.to_owned(), k.value().2));
                    }
                    v
                };
                for (id, p) in quarantined {
                    tx.open_table(QUARANTINE)
                        .map_err(db_err)?
                        .remove((tenant.as_str(), id.as_str(), p))
                        .map_err(db_err)?;
                    removed.entries += 1;
                    removed.objects += usize::from(m.release_object(tx, &id, due)?);
                }
                Ok(removed)
            })
            .await
    }

    async fn due_tombstones(&self, now_ms: u64, limit: usize) -> Result<Vec<Tombstone>> {
        let tx = self.0.read_tx()?;
        let t = tx.open_table(OBJECT_TOMBSTONES).map_err(db_err)?;
        let mut out = Vec::new();
        for row in t.iter().map_err(db_err)? {
            let (k, v) = row.map_err(db_err)?;
            let (due_ms, path) = v.value();
            if due_ms <= now_ms {
                out.push(Tombstone {
                    id: k.value().to_owned(),
                    path: path.to_owned(),
                    due_ms,
                });
                if out.len() >= limit {
                    break;
                }
            }
        }
        Ok(out)
    }

    async fn forget_tombstones(&self, ids: &[String]) -> Result<()> {
        let ids = ids.to_vec();
        self.0
            .write(move |_, tx| {
                let mut objects = tx.open_table(OBJECT_TOMBSTONES).map_err(db_err)?;
                let mut entries = tx.open_table(ENTRY_TOMBSTONES).map_err(db_err)?;
                for id in &ids {
                    objects.remove(id.as_str()).map_err(db_err)?;
                    let keys: Vec<(String, i64)> = entries
                        .range((id.as_str(), "", i64::MIN)..=(id.as_str(), MAX_STR, i64::MAX))
                        .map_err(db_err)?
                        .map(|r| r.map(|(k, _)| (k.value().1.to_owned(), k.value().2)))
                        .collect::<std::result::Result<_, _>>()
                        .map_err(db_err)?;
                    for (t, p) in keys {
                        entries
                            .remove((id.as_str(), t.as_str(), p))
                            .map_err(db_err)?;
                    }
                }
                Ok(())
            })
            .await
    }

    async fn known_objects(&self) -> Result<HashSet<String>> {
        let tx = self.0.read_tx()?;
        let mut out = HashSet::new();
        for row in tx
            .open_table(OBJECTS)
            .map_err(db_err)?
            .iter()
            .map_err(db_err)?
        {
            out.insert(row.map_err(db_err)?.0.value().to_owned());
        }
        for row in tx
            .open_table(OBJECT_TOMBSTONES)
            .map_err(db_err)?
            .iter()
            .map_err(db_err)?
        {
            out.insert(row.map_err(db_err)?.0.value().to_owned());
        }
        Ok(out)
    }

    async fn known_among(&self, ids: &[String]) -> Result<HashSet<String>> {
        let tx = self.0.read_tx()?;
        let objects = tx.open_table(OBJECTS).map_err(db_err)?;
        let tombstones = tx.open_table(OBJECT_TOMBSTONES).map_err(db_err)?;
        let mut out = HashSet::new();
        for id in ids {
            if objects.get(id.as_str()).map_err(db_err)?.is_some()
                || tombstones.get(id.as_str()).map_err(db_err)?.is_some()
            {
                out.insert(id.clone());
            }
        }
        Ok(out)
    }

    async fn quarantine(&self, tenant: &str, id: &str, reason: &str, now_ms: u64) -> Result<bool> {
        let (tenant, id, reason) = (tenant.to_owned(), id.to_owned(), reason.to_owned());
        self.0
            .write(move |m, tx| {
                let located: Vec<(i64, u32)> = {
                    let index = tx.open_table(BLOCK_INDEX).map_err(db_err)?;
                    let mut v = Vec::new();
                    for row in index
                        .range(
                            (tenant.as_str(), id.as_str(), i64::MIN)
                                ..=(tenant.as_str(), id.as_str(), i64::MAX),
                        )
                        .map_err(db_err)?
                    {
                        let (k, v2) = row.map_err(db_err)?;
                        v.push((k.value().2, v2.value()));
                    }
                    v
                };
                if located.is_empty() {
                    return Ok(false);
                }
                let path = tx
                    .open_table(OBJECTS)
                    .map_err(db_err)?
                    .get(id.as_str())
                    .map_err(db_err)?
                    .map(|v| v.value().1.to_owned())
                    .unwrap_or_default();
                for (partition, shard) in located {
                    // An entry that cannot even be decoded is removed by its keys alone; the
                    // object keeps its reference, so it stays known (and kept) while listed.
                    match m.entry_in(tx, &tenant, &id, partition) {
                        Ok(Some(b)) => {
                            m.remove_entry(tx, &b, 0, false, true)?;
                        }
                        Ok(None) => continue,
                        Err(_) => {
                            tx.open_table(BLOCK_INDEX)
                                .map_err(db_err)?
                                .remove((tenant.as_str(), id.as_str(), partition))
                                .map_err(db_err)?;
                            tx.open_table(BLOCKS)
                                .map_err(db_err)?
                                .remove((partition, tenant.as_str(), shard, id.as_str()))
                                .map_err(db_err)?;
                        }
                    }
                    // A job holding it gives its other sources back to the queue.
                    let claim = tx
                        .open_table(CLAIMS)
                        .map_err(db_err)?
                        .get((tenant.as_str(), id.as_str(), partition))
                        .map_err(db_err)?
                        .map(|v| v.value());
                    if let Some(job_id) = claim
                        && let Some(job) = EmbeddedMetastore::get_job(tx, job_id)?
                    {
                        EmbeddedMetastore::delete_job(tx, &job)?;
                        for s in job.sources.iter().filter(|s| s.id != id) {
                            if let Some(b) = m.entry_in(tx, &job.tenant, &s.id, s.partition)? {
                                EmbeddedMetastore::enqueue(tx, &b)?;
                            }
                        }
                    }
                    let record = Quarantined {
                        tenant: tenant.clone(),
                        id: id.clone(),
                        partition,
                        path: path.clone(),
                        reason: reason.clone(),
                        at_ms: now_ms,
                    };
                    tx.open_table(QUARANTINE)
                        .map_err(db_err)?
                        .insert(
                            (tenant.as_str(), id.as_str(), partition),
                            json(&record).as_slice(),
                        )
                        .map_err(db_err)?;
                }
                Ok(true)
            })
            .await
    }

    async fn quarantined(&self, tenant: Option<&str>) -> Result<Vec<Quarantined>> {
        let tx = self.0.read_tx()?;
        let q = tx.open_table(QUARANTINE).map_err(db_err)?;
        let mut out = Vec::new();
        let rows = match tenant {
            Some(t) => q
                .range((t, "", i64::MIN)..=(t, MAX_STR, i64::MAX))
                .map_err(db_err)?,
            None => q.iter().map_err(db_err)?,
        };
        for row in rows {
            out.push(from_json("quarantine", row.map_err(db_err)?.1.value())?);
        }
        Ok(out)
    }

    async fn shrink(&self) -> Result<()> {
        let m = Arc::clone(&self.0);
        let _guard = m.write_lock.lock().await;
        let this = Arc::clone(&m);
        tokio::task::spawn_blocking(move || -> Result<()> {
            this.close_db();
            let mut slot = this.db.write().expect("metastore lock");
            if slot.is_some() {
                // Still shared with a reader: try again at the next retention run.
                return Ok(());
            }
            let mut db = this.open_db()?;
            let result = db.compact().map(|_| ()).map_err(unavailable);
            *slot = Some(Arc::new(db));
            result
        })
        .await
        .map_err(|e| Error::Task(e.to_string()))?
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::metastore::conformance::{block_id, entry};

    crate::metastore_conformance_suite!({
        let dir = tempfile::tempdir().unwrap();
        let m = Embedded::open(&dir.path().join("m.redb")).unwrap();
        (m, dir)
    });

    const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn entries_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.redb");
        let id = block_id(1, 1);
        let written = entry("t", &id, 0, 0, 5, 9, &[("s", CPU)]);
        {
            let m = Embedded::open(&path).unwrap();
            m.add_blocks(vec![written.clone()]).await.unwrap();
            // Kept as written (not decoded) by the process that wrote it.
            let got = m.query_blocks(BlockQuery::all("t")).await.unwrap();
            assert_eq!(*got[0], written);
        }
        // Decoded from the file by the next: the same entry.
        let m = Embedded::open(&path).unwrap();
        let got = m.query_blocks(BlockQuery::all("t")).await.unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(*got[0], written);
        assert!(
            m.query_blocks(BlockQuery::all("u"))
                .await
                .unwrap()
                .is_empty()
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn written_entries_are_kept_decoded_only_where_asked() {
        let dir = tempfile::tempdir().unwrap();
        let m = Embedded::open(&dir.path().join("m.redb")).unwrap();
        let kept = entry("t", &block_id(1, 1), 0, 0, 5, 9, &[("s", CPU)]);
        m.add_blocks(vec![kept.clone()]).await.unwrap();
        assert!(m.0.cache.contains_key(&kept.key()));
        m.keep_written(false);
        let not_kept = entry("t", &block_id(1, 2), 0, 0, 5, 9, &[("s", CPU)]);
        m.add_blocks(vec![not_kept.clone()]).await.unwrap();
        assert!(!m.0.cache.contains_key(&not_kept.key()));
        // Read, it is decoded (and cached then), the same either way.
        let mut got: Vec<BlockMeta> = m
            .query_blocks(BlockQuery::all("t"))
            .await
            .unwrap()
            .iter()
            .map(|b| (**b).clone())
            .collect();
        got.sort_by(|a, b| a.id.cmp(&b.id));
        assert_eq!(got, [kept, not_kept]);
        assert!(
            m.query_blocks(BlockQuery::all("u"))
                .await
                .unwrap()
                .is_empty()
        );
    }

    /// Retention and tenant deletion give the file's space back (redb compaction), unlike
    /// BoltDB's file under Pyroscope's metastore.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_file_shrinks_after_removals() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.redb");
        let m = Embedded::open(&path).unwrap();
        let services: Vec<(String, &str)> = (0..40).map(|i| (format!("svc-{i}"), CPU)).collect();
        let series: Vec<(&str, &str)> = services.iter().map(|(s, p)| (s.as_str(), *p)).collect();
        for batch in 0..20u128 {
            let blocks = (0..100u128)
                .map(|n| entry("t", &block_id(1, batch * 100 + n), 1, 0, 5, 9, &series))
                .collect();
            m.add_blocks(blocks).await.unwrap();
        }
        let full = std::fs::metadata(&path).unwrap().len();
        m.delete_tenant("t", 0, 0).await.unwrap();
        let ids: Vec<String> = m
            .due_tombstones(u64::MAX, 10_000)
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.id)
            .collect();
        m.forget_tombstones(&ids).await.unwrap();
        m.shrink().await.unwrap();
        let shrunk = std::fs::metadata(&path).unwrap().len();
        assert!(shrunk * 4 < full, "{full} bytes before, {shrunk} after");
        m.add_blocks(vec![entry("t", &block_id(2, 1), 0, 0, 5, 9, &series)])
            .await
            .expect("usable after shrinking");
    }

    /// A full disk refuses writes as unavailable; once there is room again, writes succeed
    /// without a restart and nothing refused was registered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn full_disk_is_unavailable_then_recovers() {
        let dir = tempfile::tempdir().unwrap();
        let full = Arc::new(AtomicBool::new(false));
        let m = Embedded::open_with_backend(
            &dir.path().join("m.redb"),
            DiskFault::factory(Arc::clone(&full)),
        )
        .unwrap();
        let (a, b, c) = (block_id(1, 1), block_id(1, 2), block_id(1, 3));
        m.add_blocks(vec![entry("t", &a, 0, 0, 5, 9, &[("s", CPU)])])
            .await
            .unwrap();
        full.store(true, Ordering::SeqCst);
        for id in [&b, &c] {
            let err = m
                .add_blocks(vec![entry("t", id, 0, 0, 5, 9, &[("s", CPU)])])
                .await
                .unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::Unavailable, "{err}");
        }
        full.store(false, Ordering::SeqCst);
        m.add_blocks(vec![entry("t", &c, 0, 0, 5, 9, &[("s", CPU)])])
            .await
            .expect("writes recover once the disk has room");
        let got: Vec<String> = m
            .query_blocks(BlockQuery::all("t"))
            .await
            .unwrap()
            .iter()
            .map(|b| b.id.clone())
            .collect();
        assert_eq!(got.len(), 2);
        assert!(
            got.contains(&a) && got.contains(&c) && !got.contains(&b),
            "{got:?}"
        );
    }
}
