//! The compactor's life: planning from the queue, leasing jobs by lane, running a merge, and
//! swapping its outputs for its sources in one metastore transaction.

use crate::caches::Caches;
use crate::clock::now_ms;
use crate::format::meta::{BlockMeta, EntryKey};
use crate::metastore::{Job, Metastore};
use crate::metrics::{CompactionLabels, LevelLabels};
use crate::store::ObjectStorage;
use crate::{Error, Result};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::merge::{Lineage, Written};
use super::*;

impl Compactor {
    /// A compactor writing its scratch files under `scratch`; with `warm`, the symbols of what
    /// it writes go into `query`'s cache.
    pub fn new(
        config: CompactionConfig,
        store: ObjectStorage,
        metastore: Arc<dyn Metastore>,
        caches: Caches,
        scratch: PathBuf,
        delete_delay: Duration,
        warm: bool,
    ) -> Self {
        Self {
            config,
            store,
            metastore,
            caches,
            scratch,
            delete_delay,
            warm,
            owner: format!("compactor-{}", ulid::Ulid::generate()),
            recorder: std::sync::OnceLock::new(),
        }
    }

    /// Has `recorder` evaluate the recording rules on every level-0 job from now on (a
    /// cluster's compactor; ADR 0021). Set once; a second call is ignored.
    pub fn record_with(&self, recorder: Arc<dyn JobRecorder>) {
        let _ = self.recorder.set(recorder);
    }

    /// This compactor's name in leases (one per process).
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Plans jobs for what waits in the queue, when this compactor holds the cluster's planner
    /// lease ([`PLANNER_LEASE`]): one planner reads the whole queue at a time, not one per
    /// compacting process. Returns how many were created.
    pub async fn plan(&self, now_ms: u64) -> Result<usize> {
        if !self.config.enabled {
            return Ok(0);
        }
        let lease = self
            .metastore
            .hold_lease(PLANNER_LEASE, &self.owner, crate::metastore::LEASE_TTL)
            .await?;
        if lease.is_none() {
            return Ok(0);
        }
        self.plan_as(now_ms, false).await
    }

    /// Plans regardless of the planner lease; `first_sight` judges when blocks came by their
    /// times alone, not by when they were registered (tests and `kiln bench`, whose clock runs
    /// ahead of the metastore's).
    async fn plan_as(&self, now_ms: u64, first_sight: bool) -> Result<usize> {
        if !self.config.enabled {
            return Ok(0);
        }
        let mut queued = self.metastore.queued_blocks().await?;
        self.store
            .metrics()
            .compaction_queued_blocks
            .set(queued.len() as i64);
        let arrivals = if first_sight {
            for b in &mut queued {
                b.arrived_ms = 0;
            }
            Arrivals::of(&queued)
        } else {
            // Blocks that jobs hold came too: a partition whose fresh blocks are being merged
            // up is not quiet.
            let held = self.metastore.jobs().await?;
            Arrivals::of(
                queued
                    .iter()
                    .chain(held.iter().flat_map(|j| j.sources.iter())),
            )
        };
        let jobs = plan_jobs(&self.config, queued, &arrivals, now_ms);
        if jobs.is_empty() {
            return Ok(0);
        }
        self.metastore.add_jobs(jobs).await
    }

    /// Leases and runs jobs of `levels` (one lane, see the module's documentation), the
    /// lowest level first, until none is left or the round's budget is spent. Returns how many
    /// completed.
    pub async fn run_pending(&self, levels: Range<u32>) -> Result<usize> {
        if !self.config.enabled {
            return Ok(0);
        }
        let mut done = 0;
        for _ in 0..self.config.jobs_per_round {
            let lease = self.config.lease.as_millis() as u64;
            let Some(job) = self
                .metastore
                .lease_job(&self.owner, now_ms(), lease, levels.clone())
                .await?
            else {
                break;
            };
            if self.run_renewed(&job, lease).await? {
                done += 1;
            }
        }
        Ok(done)
    }

    /// Runs a leased job ([`Self::run`]), renewing its lease every third of `lease_ms` while
    /// the merge runs: a merge may take longer than a lease, and a compactor that stops (killed,
    /// or paused) loses its job within one lease. A lease found lost is not renewed again, and
    /// the completion is refused (fenced by owner and epoch).
    async fn run_renewed(&self, job: &Job, lease_ms: u64) -> Result<bool> {
        let run = self.run(job);
        tokio::pin!(run);
        let every = Duration::from_millis((lease_ms / 3).max(1));
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        let mut held = true;
        loop {
            tokio::select! {
                done = &mut run => return done,
                _ = tick.tick(), if held => {
                    match self.metastore.renew_job(job, &self.owner, now_ms(), lease_ms).await {
                        Ok(true) => {}
                        Ok(false) => {
                            tracing::warn!(job = job.id, tenant = %job.tenant,
                                "compaction lease lost; the merge's outputs will be refused");
                            held = false;
                        }
                        Err(e) => tracing::warn!(job = job.id, error = %e,
                            "compaction lease not renewed; retrying"),
                    }
                }
            }
        }
    }

    /// Plans and runs jobs until the queue holds nothing due at `now_ms` (tests and `kiln
    /// bench`), judging when blocks came by their times: a merge's output does not hold its
    /// partition's packing back.
    pub async fn compact_all(&self, now_ms: u64) -> Result<usize> {
        let mut done = 0;
        loop {
            let planned = self.plan_as(now_ms, true).await?;
            let ran = self.run_pending(ALL_LEVELS).await?;
            done += ran;
            if planned == 0 && ran == 0 {
                return Ok(done);
            }
        }
    }

    /// Runs one leased job. Returns whether it completed; a corrupt source is quarantined and
    /// the job given up (its other sources go back to the queue).
    #[tracing::instrument(name = "compaction.job", skip_all, fields(job = job.id, tenant = %job.tenant, level = job.level, sources = job.sources.len()))]
    pub async fn run(&self, job: &Job) -> Result<bool> {
        let started = std::time::Instant::now();
        let metrics = self.store.metrics();
        let outcome = |outcome: &'static str| {
            metrics
                .compaction_jobs
                .get_or_create(&CompactionLabels {
                    level: job.level,
                    outcome,
                })
                .inc();
        };
        match self.merge_off_the_workers(job).await {
            Ok(outputs) => {
                let rows: u64 = outputs.iter().map(|o| o.meta.rows).sum();
                let bytes: u64 = outputs.iter().map(|o| o.meta.object_size).sum();
                for o in &outputs {
                    let result = self.store.put_file_durable(&o.meta.path(), &o.path).await;
                    if result.is_ok() && self.warm {
                        self.warm_object(o).await;
                    }
                    let _ = std::fs::remove_file(&o.path);
                    result?;
                }
                // Before the outputs are visible: a query that finds them finds their symbols.
                if self.warm {
                    for o in &outputs {
                        self.caches
                            .warm_symbols(&o.meta, Arc::clone(&o.symbols))
                            .await;
                        // And, for a block of many series, its series index, which the entry
                        // carries into the metastore's cache: built here rather than by the
                        // first query after the merge (half a second at a million series).
                        // Small blocks' are left to their first query: building every output's
                        // cost the `small` bench 5 % of its ingest CPU.
                        if o.meta.series.len() >= WARM_INDEX_SERIES {
                            o.meta.series_index();
                        }
                    }
                }
                let delay = self.delete_delay.as_millis() as u64;
                // The outputs' entries go to the metastore, not copies: a million-series
                // entry is a hundred megabytes.
                let written: Vec<(EntryKey, String)> = outputs
                    .iter()
                    .map(|o| (o.meta.key(), o.meta.path()))
                    .collect();
                let metas: Vec<BlockMeta> = outputs.into_iter().map(|o| o.meta).collect();
                // `Err((committing, e))`: whether the commit was sent when it failed.
                let completed = match self.recorded_sums(job, metas).await {
                    Ok((metas, sums)) => self
                        .metastore
                        .complete_job_recorded(job, &self.owner, metas, &sums, now_ms(), delay)
                        .await
                        .map_err(|e| (true, e)),
                    Err(e) => Err((false, e)),
                };
                match completed {
                    Ok(()) => {
                        outcome("ok");
                        // Their blocks are read from the outputs now.
                        for source in &job.sources {
                            self.caches
                                .forget_block(&(
                                    job.tenant.clone(),
                                    source.id.clone(),
                                    source.partition,
                                ))
                                .await;
                        }
                        let level = LevelLabels { level: job.level };
                        metrics
                            .compaction_duration
                            .get_or_create(&level)
                            .observe(started.elapsed().as_secs_f64());
                        metrics
                            .compaction_input_bytes
                            .get_or_create(&level)
                            .inc_by(job.sources.iter().map(|b| b.bytes).sum());
                        metrics
                            .compaction_output_bytes
                            .get_or_create(&level)
                            .inc_by(bytes);
                        metrics
                            .compaction_output_rows
                            .get_or_create(&level)
                            .inc_by(rows);
                        tracing::debug!(tenant = %job.tenant, job = job.id, level = job.level,
                            sources = job.sources.len(), outputs = written.len(), rows, bytes,
                            elapsed_ms = started.elapsed().as_millis() as u64, "compaction job done");
                        Ok(true)
                    }
                    Err((committing, e)) => {
                        for (key, _) in &written {
                            self.caches.forget_block(key).await;
                        }
                        if !committing || refused(&e) {
                            // Not registered: the outputs are garbage.
                            for (_, path) in &written {
                                let _ = self.store.delete(path).await;
                            }
                        } else {
                            // The commit may have gone through with its answer lost: its
                            // outputs may be what queries read now, and the sources are then
                            // tombstoned. They are left to the orphan sweep, which deletes
                            // them after `orphan_grace` only if the metastore has no entry.
                            tracing::warn!(tenant = %job.tenant, job = job.id, error = %e,
                                outputs = written.len(),
                                "a compaction job's commit failed without an answer; its outputs \
                                 are kept, and the orphan sweep deletes them if unregistered");
                        }
                        match e {
                            Error::LeaseLost { .. } => {
                                outcome("lost");
                                Ok(false)
                            }
                            e => {
                                outcome("error");
                                Err(e)
                            }
                        }
                    }
                }
            }
            Err((Some(bad), e)) if crate::error::is_corruption(&e) => {
                tracing::error!(tenant = %bad.tenant, block = %bad.id, error = %e,
                    "compaction source quarantined: it cannot be read");
                outcome("quarantined");
                self.caches
                    .counters()
                    .quarantined
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.metastore
                    .quarantine(&bad.tenant, &bad.id, &e.to_string(), now_ms())
                    .await?;
                self.metastore.cancel_job(job).await?;
                Ok(false)
            }
            Err((_, e)) => {
                tracing::warn!(tenant = %job.tenant, job = job.id, error = %e,
                    "compaction job failed; it is retried when its lease expires");
                outcome("error");
                Err(e)
            }
        }
    }

    /// The recording rules' sums of a level-0 job's outputs (ADR 0021), when a recorder is
    /// set; the outputs are handed back for the metastore, not copied.
    async fn recorded_sums(
        &self,
        job: &Job,
        metas: Vec<BlockMeta>,
    ) -> Result<(Vec<BlockMeta>, Vec<crate::metastore::RecordedSum>)> {
        let Some(recorder) = self.recorder.get().filter(|_| job.level == 0) else {
            return Ok((metas, Vec::new()));
        };
        let shared: Vec<Arc<BlockMeta>> = metas.into_iter().map(Arc::new).collect();
        let sums = recorder.sums(&job.tenant, &shared).await?;
        let metas = shared
            .into_iter()
            .map(|m| Arc::try_unwrap(m).unwrap_or_else(|m| (*m).clone()))
            .collect();
        Ok((metas, sums))
    }

    /// Keeps a small output's object in the query engine's memory, as the writer does with
    /// its segments: the outputs of the first levels hold the last minutes that dashboards
    /// read, and would otherwise be read back from the store by every query of them.
    async fn warm_object(&self, o: &Written) {
        if !self.caches.holds_fresh(o.meta.object_size) {
            return;
        }
        match tokio::fs::read(&o.path).await {
            Ok(bytes) => self.caches.warm_object(&o.meta, &bytes::Bytes::from(bytes)),
            Err(e) => tracing::debug!(error = %e, "compaction output not kept in memory"),
        }
    }

    /// [`Compactor::merge`] on a thread the runtime has handed its worker's other tasks away
    /// from (`block_in_place`): a merge computes for long stretches between the points where
    /// it yields, and the queries and writes queued on its worker would wait that long; the
    /// operating system shares the cores among threads instead. On a current-thread runtime
    /// (tests) it runs in place.
    async fn merge_off_the_workers(
        &self,
        job: &Job,
    ) -> std::result::Result<Vec<Written>, (Option<Arc<BlockMeta>>, Error)> {
        match tokio::runtime::Handle::try_current() {
            Ok(rt) if rt.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(|| rt.block_on(self.merge(job)))
            }
            _ => self.merge(job).await,
        }
    }

    /// What the outputs' footers say of where their data came from ([`Lineage`]). Replaced:
    /// the job's sources, and the sources' own replaced entries whose objects may still exist.
    /// A source's source outlives it when it is an L0 segment another tenant's entry keeps, or
    /// when deletions run out of order (a crash between two): named here, it is not read back
    /// beside the data it was merged into once the source between has gone.
    pub(super) async fn lineage(
        &self,
        job: &Job,
        ids: &[String],
        metas: &[Arc<BlockMeta>],
    ) -> Result<Lineage> {
        let logs = crate::format::meta::latest_checkpoints(metas.iter().flat_map(|m| &m.logs));
        let replaced = self.replaced(job, ids, metas).await?;
        Ok(Lineage { replaced, logs })
    }

    async fn replaced(
        &self,
        job: &Job,
        ids: &[String],
        metas: &[Arc<BlockMeta>],
    ) -> Result<Vec<String>> {
        let mut out: Vec<String> = ids
            .iter()
            .map(|id| crate::format::meta::compacted_source(id, job.partition))
            .collect();
        let inherited: Vec<&String> = metas.iter().flat_map(|m| &m.compacted_from).collect();
        if inherited.is_empty() {
            return Ok(out);
        }
        let object = |source: &str| {
            source
                .split_once('@')
                .map_or(source, |(id, _)| id)
                .to_owned()
        };
        let mut objects: Vec<String> = inherited.iter().map(|s| object(s)).collect();
        objects.sort_unstable();
        objects.dedup();
        let alive = self.metastore.known_among(&objects).await?;
        out.extend(
            inherited
                .into_iter()
                .filter(|s| alive.contains(&object(s)))
                .cloned(),
        );
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }
}

/// Whether a metastore error means the commit was refused, so nothing of it was registered:
/// the lease passed on, an output already there, or a conflict whose retries ran out (each
/// try rolled back). Any other error may have followed a commit whose answer was lost.
fn refused(e: &Error) -> bool {
    matches!(
        e,
        Error::LeaseLost { .. } | Error::BlockExists { .. } | Error::MetastoreConflict(_)
    )
}
