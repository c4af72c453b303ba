//! The redb tables and the transactions over them: entries, the compaction queue, jobs,
//! tombstones and counters.

use crate::metastore::{BlockMeta, Job, PartitionStats, QueuedBlock};
use crate::{Error, Result};
use redb::{Database, ReadTransaction, ReadableDatabase, ReadableTable, WriteTransaction};
use std::path::Path;
use std::sync::{Arc, RwLock};

use super::*;

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
            cache: crate::metastore::entry_cache(),
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

    pub(super) fn open_db(&self) -> Result<Database> {
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
    pub(super) fn db(&self) -> Result<Arc<Database>> {
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
    pub(super) fn close_db(&self) {
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
    pub(super) async fn write<T: Send + 'static>(
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

    pub(super) fn read_tx(&self) -> Result<ReadTransaction> {
        let result = self.db()?.begin_read().map_err(db_err);
        if matches!(result, Err(Error::MetastoreUnavailable(_))) {
            self.close_db();
        }
        result
    }

    pub(super) fn decode(
        &self,
        tenant: &str,
        id: &str,
        partition: i64,
        data: &[u8],
    ) -> Result<Arc<BlockMeta>> {
        crate::metastore::decode_cached(&self.cache, tenant, id, partition, data)
    }

    pub(super) fn next_counter(tx: &WriteTransaction, name: &str) -> Result<u64> {
        let mut t = tx.open_table(COUNTERS).map_err(db_err)?;
        let next = t.get(name).map_err(db_err)?.map_or(1, |v| v.value() + 1);
        t.insert(name, next).map_err(db_err)?;
        Ok(next)
    }

    /// Adds one entry; refuses a duplicate or a compacted one.
    pub(super) fn insert_entry(tx: &WriteTransaction, b: &BlockMeta) -> Result<()> {
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
    pub(super) fn enqueue(tx: &WriteTransaction, b: &BlockMeta) -> Result<()> {
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
                json(&QueuedBlock {
                    arrived_ms: crate::clock::now_ms(),
                    ..QueuedBlock::of(b)
                })
                .as_slice(),
            )
            .map_err(db_err)?;
        Ok(())
    }

    /// Reads an entry inside a write transaction.
    pub(super) fn entry_in(
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
    pub(super) fn remove_entry(
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
    pub(super) fn release_object(
        &self,
        tx: &WriteTransaction,
        id: &str,
        due_ms: u64,
    ) -> Result<bool> {
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

    pub(super) fn get_job(tx: &WriteTransaction, id: u64) -> Result<Option<Job>> {
        let jobs = tx.open_table(JOBS).map_err(db_err)?;
        let job = jobs.get(id).map_err(db_err)?;
        job.map(|v| from_json("job", v.value())).transpose()
    }

    pub(super) fn delete_job(tx: &WriteTransaction, job: &Job) -> Result<()> {
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
    pub(super) fn entries_of(
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

    pub(super) fn tenant_partitions(tx: &WriteTransaction, tenant: &str) -> Result<Vec<i64>> {
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
    pub(super) fn delete_jobs_of(
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
