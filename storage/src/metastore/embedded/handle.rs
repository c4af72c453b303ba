//! The [`Metastore`] implementation on [`Embedded`]: each call one redb transaction, writes on a
//! blocking thread.

use crate::metastore::{
    BlockMeta, BlockQuery, Job, LogCheckpoint, Metastore, PartitionStats, Quarantined, QueuedBlock,
    Removed, Tombstone,
};
use crate::{Error, Result};
use redb::ReadableTable;
use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use super::*;

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
                let deletions = tx.open_table(TENANT_DELETIONS).map_err(db_err)?;
                let mut kept = Vec::with_capacity(blocks.len());
                for b in &blocks {
                    let deleted = deletions.get(b.tenant.as_str()).map_err(db_err)?;
                    kept.push(
                        deleted.is_none_or(|at| !crate::metastore::received_by(b, at.value())),
                    );
                }
                drop(deletions);
                for (b, _) in blocks.iter().zip(&kept).filter(|(_, k)| **k) {
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
                Ok(crate::metastore::registered(blocks, &kept))
            })
            .await?;
        crate::metastore::cache_written(
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
        let (job_id, owner, epoch) = (job.id, owner.to_owned(), job.attempts);
        let written = self
            .0
            .write(move |m, tx| {
                let Some(job) = EmbeddedMetastore::get_job(tx, job_id)? else {
                    return Err(Error::LeaseLost { job: job_id });
                };
                if job.owner != owner || job.attempts != epoch {
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
        crate::metastore::cache_written(
            &self.0.cache,
            self.0
                .keep_written
                .load(std::sync::atomic::Ordering::Relaxed),
            written,
        );
        Ok(())
    }

    async fn renew_job(&self, job: &Job, owner: &str, now_ms: u64, lease_ms: u64) -> Result<bool> {
        let (job_id, owner, epoch) = (job.id, owner.to_owned(), job.attempts);
        self.0
            .write(move |_, tx| {
                let Some(mut job) = EmbeddedMetastore::get_job(tx, job_id)? else {
                    return Ok(false);
                };
                if job.owner != owner || job.attempts != epoch {
                    return Ok(false);
                }
                job.lease_expires_ms = now_ms.saturating_add(lease_ms);
                tx.open_table(JOBS)
                    .map_err(db_err)?
                    .insert(job.id, json(&job).as_slice())
                    .map_err(db_err)?;
                Ok(true)
            })
            .await
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
                {
                    let mut t = tx.open_table(TENANT_DELETIONS).map_err(db_err)?;
                    let at = t
                        .get(tenant.as_str())
                        .map_err(db_err)?
                        .map_or(0, |v| v.value());
                    t.insert(tenant.as_str(), at.max(now_ms)).map_err(db_err)?;
                }
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
