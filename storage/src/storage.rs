//! The storage engine as one value: object store, metastore, writer, query engine, and the
//! background upkeep (compaction, deletion of tombstoned objects, the orphan sweeper).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kiln_otel::NormalizedProfile;

use crate::caches::Caches;
use crate::clock::now_ms;
use crate::compaction::{CompactionConfig, Compactor};
use crate::format::meta::{BlockMeta, decode_footer, footer_len, object_id_of_path, partition_of};
use crate::metastore::embedded::Embedded;
use crate::metastore::postgres;
use crate::metastore::{BlockQuery, Metastore, Removed};
use crate::query::QueryEngine;
use crate::store::ObjectStorage;
use crate::writer::spool::{Spool, SpoolConfig};
use crate::writer::{ExpectedWrite, Writer, WriterConfig};
use crate::{Error, Result};

/// Storage settings.
#[derive(Debug, Clone)]
pub struct StorageConfig {
    /// Root of the local object store and of the embedded metastore (when they are not set
    /// elsewhere), and of compaction's scratch files.
    pub data_dir: PathBuf,
    /// The object store's URL ([`ObjectStorage::from_url`]); `None`: `{data_dir}/objects`.
    pub object_store: Option<String>,
    /// How long requests to a remote object store are retried before failing.
    pub object_store_retry_timeout: Duration,
    /// The metastore: `postgres://…`, or a redb file path; `None`: the embedded metastore
    /// under `{data_dir}/metastore`.
    pub metastore: Option<String>,
    /// Connections a PostgreSQL metastore's pool opens at most (`--metastore-max-connections`).
    pub metastore_max_connections: usize,
    pub writer: WriterConfig,
    /// Memory for cached symbol tables (and a quarter of it for Parquet metadata).
    pub symbols_cache_bytes: u64,
    /// Memory for cached partial results: the stack totals of blocks a query's range covers
    /// whole (0: none kept).
    pub results_cache_bytes: u64,
    /// Memory for the byte ranges queries read from a remote object store (the local file
    /// system's pages are the OS page cache's); 0: none kept.
    pub pages_cache_bytes: u64,
    /// Memory for the objects of fresh segments, kept as they were written so that queries of
    /// the last minutes (and their compaction) read no store; 0: none kept. Only where
    /// `warm_query_cache` is set.
    pub fresh_cache_bytes: u64,
    pub compaction: CompactionConfig,
    /// How long an object that lost its last metastore entry stays readable before deletion
    /// (queries that looked it up just before still finish).
    pub delete_delay: Duration,
    /// An object no metastore entry names is deleted once it is this old (a crash between the
    /// PUT and the metastore commit leaves such objects).
    pub orphan_grace: Duration,
    /// Bytes of acknowledged segments the spool may hold while the object store is unreachable
    /// (`{data_dir}/spool`); 0: no spool (writes are refused while the store is down).
    pub spool_max_bytes: u64,
    /// Whether the blocks this process writes (segments, compaction outputs) go into its query
    /// engine's symbol cache as they are registered, so the first query of fresh data reads and
    /// decodes no symbols, and their metastore entries stay decoded as written: where this
    /// process answers queries.
    pub warm_query_cache: bool,
}

impl StorageConfig {
    /// Defaults under `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            object_store: None,
            object_store_retry_timeout: Duration::from_secs(10),
            metastore: None,
            metastore_max_connections: 16,
            writer: WriterConfig::default(),
            symbols_cache_bytes: 256 << 20,
            results_cache_bytes: 64 << 20,
            pages_cache_bytes: 128 << 20,
            fresh_cache_bytes: 64 << 20,
            compaction: CompactionConfig::default(),
            delete_delay: Duration::from_secs(60),
            orphan_grace: Duration::from_secs(3600),
            spool_max_bytes: 1 << 30,
            warm_query_cache: true,
        }
    }

    /// The object store these settings name.
    pub fn open_object_store(&self) -> Result<ObjectStorage> {
        match &self.object_store {
            None => ObjectStorage::local(&self.data_dir.join("objects")),
            Some(url) => ObjectStorage::from_url(url, self.object_store_retry_timeout),
        }
    }

    /// The metastore these settings name (PostgreSQL: connected and migrated).
    pub async fn open_metastore(&self) -> Result<Arc<dyn Metastore>> {
        // Entries written are kept decoded where this process also answers queries.
        let keep = self.warm_query_cache;
        let embedded = |path: &Path| -> Result<Arc<dyn Metastore>> {
            let m = Embedded::open(path)?;
            m.keep_written(keep);
            Ok(Arc::new(m))
        };
        match &self.metastore {
            Some(url) if postgres::is_postgres_url(url) => {
                let mut pg = postgres::PostgresConfig::new(url);
                pg.max_connections = self.metastore_max_connections.max(1);
                let m = postgres::Postgres::connect(&pg).await?;
                m.keep_written(keep);
                Ok(Arc::new(m))
            }
            Some(url) if url.contains("://") => Err(Error::Config(format!(
                "metastore {url}: use postgres://…, or a path for the embedded metastore"
            ))),
            Some(path) => embedded(Path::new(path)),
            None => embedded(&self.embedded_metastore_path()),
        }
    }

    /// Where the embedded metastore lives by default.
    pub fn embedded_metastore_path(&self) -> PathBuf {
        self.data_dir.join("metastore").join("metastore.redb")
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<()> {
        if self.writer.shards == 0 {
            return Err(Error::Config("shards must be at least 1".into()));
        }
        if self.writer.flush_interval.is_zero() {
            return Err(Error::Config("the flush interval must be positive".into()));
        }
        self.compaction.validate()
    }
}

/// A stable hash of a series: its profile type and its (sorted) labels.
pub fn series_hash<'a>(
    profile_type: &str,
    labels: impl Iterator<Item = (&'a str, &'a str)>,
) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(profile_type.as_bytes());
    for (k, v) in labels {
        h.update(b"\0");
        h.update(k.as_bytes());
        h.update(b"=");
        h.update(v.as_bytes());
    }
    h.digest()
}

/// The cluster-wide lease whose holder deletes objects whose tombstones are due.
pub const GARBAGE_LEASE: &str = "garbage";

/// The cluster-wide lease whose holder sweeps the bucket for orphans.
pub const SWEEP_LEASE: &str = "sweep";

/// What one upkeep round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpkeepReport {
    pub jobs_planned: usize,
    pub jobs_done: usize,
    pub objects_deleted: usize,
    pub orphans_deleted: usize,
}

/// Aborts a task when dropped: the bulk compaction lane ends with the upkeep task that
/// started it.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Kiln's storage engine.
#[derive(Debug, Clone)]
pub struct Storage {
    writer: Writer,
    query: QueryEngine,
    metastore: Arc<dyn Metastore>,
    store: ObjectStorage,
    compactor: Arc<Compactor>,
    config: Arc<StorageConfig>,
}

impl Storage {
    /// Opens the storage on the local file system with the embedded metastore.
    pub async fn open(config: StorageConfig) -> Result<Self> {
        config.validate()?;
        let store = config.open_object_store()?;
        let metastore = config.open_metastore().await?;
        let storage = Self::with_parts(config, store, metastore)?;
        // With a write-ahead log: what it held is replayed and registered before anything else.
        storage.writer.ready().await?;
        Ok(storage)
    }

    /// Opens the storage on the given object store and metastore.
    pub fn with_parts(
        config: StorageConfig,
        store: ObjectStorage,
        metastore: Arc<dyn Metastore>,
    ) -> Result<Self> {
        config.validate()?;
        let mut config = config;
        let shards = config.writer.shards.max(1);
        if let Some(log) = &mut config.writer.log {
            log.id = crate::writer::log_id(&log.dir, shards)?;
        }
        let store = store.instrumented(Arc::default());
        // With a write-ahead log, a segment the store refuses is kept and tried again, its
        // writes in the log meanwhile: no spool.
        let spool = if config.spool_max_bytes > 0 && config.writer.log.is_none() {
            let spool = Spool::open(SpoolConfig {
                dir: config.data_dir.join("spool"),
                max_bytes: config.spool_max_bytes,
            })?;
            store.metrics().spool_bytes.set(spool.bytes() as i64);
            Some(Arc::new(spool))
        } else {
            None
        };
        let caches = Caches::new(
            store.clone(),
            Arc::clone(&metastore),
            config.symbols_cache_bytes,
            config.pages_cache_bytes,
            config.fresh_cache_bytes,
        );
        let query = QueryEngine::new(caches.clone(), config.results_cache_bytes);
        let writer = Writer::start(
            &config.writer,
            store.clone(),
            Arc::clone(&metastore),
            spool,
            config.warm_query_cache.then(|| caches.clone()),
        );
        let compactor = Arc::new(Compactor::new(
            config.compaction.clone(),
            store.clone(),
            Arc::clone(&metastore),
            caches.clone(),
            config.data_dir.join("compaction"),
            config.delete_delay,
            config.warm_query_cache,
        ));
        Ok(Self {
            writer,
            query,
            metastore,
            store,
            compactor,
            config: Arc::new(config),
        })
    }

    /// Gives queries and compaction what names native frames (ADR 0013); a query waits for it
    /// `deadline` at most.
    pub fn set_frame_namer(
        &self,
        namer: Arc<dyn crate::caches::names::FrameNamer>,
        deadline: std::time::Duration,
    ) {
        self.query.caches().set_frame_namer(namer, deadline);
    }

    /// The directory of the engine's local files.
    pub fn data_dir(&self) -> &Path {
        &self.config.data_dir
    }

    /// The engine's metrics, to register in the process's registry.
    pub fn metrics(&self) -> &Arc<crate::metrics::StorageMetrics> {
        self.store.metrics()
    }

    /// Writes a profile for `tenant`; returns once it is durable and queryable.
    pub async fn write(&self, tenant: &str, profile: NormalizedProfile) -> Result<()> {
        self.writer.write(tenant, vec![profile]).await
    }

    /// Writes the profiles of one request together: all are stored, or none.
    pub async fn write_all(&self, tenant: &str, profiles: Vec<NormalizedProfile>) -> Result<()> {
        self.writer.write(tenant, profiles).await
    }

    /// Like [`Storage::write_all`], with the write's write-ahead log record (the request the
    /// profiles were decoded from): acknowledged once the log is synced, where the writer logs
    /// writes ([`crate::writer::Writer::write_logged`]).
    /// `expected`: the write's [`Storage::expect_write`], if it took one.
    pub async fn write_logged(
        &self,
        tenant: &str,
        profiles: Vec<NormalizedProfile>,
        record: Option<Vec<u8>>,
        expected: Option<ExpectedWrite>,
    ) -> Result<()> {
        self.writer
            .write_logged(tenant, profiles, record, expected)
            .await
    }

    /// Announces a write whose request has started ([`crate::writer::Writer::expect_write`]): a
    /// group of log records waits briefly for it, so one `fdatasync` acknowledges more writes.
    pub fn expect_write(&self) -> ExpectedWrite {
        self.writer.expect_write()
    }

    /// How many ingest processes share the cluster's writes: logged shards cut segments that
    /// much less often ([`crate::writer::Writer::scale_segment_interval`]).
    pub fn scale_segment_interval(&self, processes: u32) {
        self.writer.scale_segment_interval(processes);
    }

    /// Whether writes are acknowledged from a write-ahead log (and so take a record).
    pub fn logs_writes(&self) -> bool {
        self.writer.logs_writes()
    }

    /// Waits until every write acknowledged so far is in a registered block (ADR 0018).
    pub async fn barrier(&self) {
        self.writer.barrier().await;
    }

    /// Flushes every buffer now.
    pub async fn flush(&self) {
        self.writer.flush().await;
    }

    /// Drains the spool now, if the object store answers (a task does it every second).
    pub async fn drain_spool(&self) {
        self.writer.drain_spool().await;
    }

    /// Flushes every buffer and stops the writers (used on shutdown). Queries keep working.
    pub async fn close(&self) {
        self.writer.close().await;
    }

    fn delete_delay_ms(&self) -> u64 {
        self.config.delete_delay.as_millis() as u64
    }

    /// Erases every block of `tenant`: its index entries at once (no query sees them after
    /// this), its objects once no other tenant's entry needs them. Returns entries removed.
    /// Final for every write received before it, in any process ([`Metastore::delete_tenant`]):
    /// a write racing the deletion may go either way.
    pub async fn delete_tenant(&self, tenant: &str) -> Result<usize> {
        // This process's writes acknowledged from the log are registered first, so the
        // deletion removes them and no query reads them unregistered after it.
        self.writer.barrier().await;
        // The writers' clock, which times the writes the deletion is compared with.
        let at_ms = self.config.writer.clock.now_ms();
        let removed = self.metastore.delete_tenant(tenant, at_ms, 0).await?;
        self.collect_garbage(now_ms()).await?;
        for doc in self.store.list(&tenant_documents(tenant)).await? {
            self.store.delete(doc.location.as_ref()).await?;
        }
        Ok(removed.entries)
    }

    /// A small document a tenant keeps besides its profiles (the Drilldown app's settings),
    /// `None` when it was never written. Documents live under `tenants/<tenant>/`, outside the
    /// block layout, so neither compaction nor the orphan sweep touches them, and go with
    /// [`Storage::delete_tenant`].
    pub async fn tenant_document(&self, tenant: &str, name: &str) -> Result<Option<Bytes>> {
        match self.store.get(&tenant_document(tenant, name)).await {
            Ok(data) => Ok(Some(data)),
            Err(Error::ObjectStore {
                source: object_store::Error::NotFound { .. },
                ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes a tenant's document durably ([`Storage::tenant_document`]).
    pub async fn put_tenant_document(&self, tenant: &str, name: &str, data: Bytes) -> Result<()> {
        self.store
            .put_durable(&tenant_document(tenant, name), data)
            .await
    }

    /// The names of the tenant's documents in folder `folder` (the part after `folder/`), with
    /// their sizes in bytes, in no particular order.
    pub async fn list_tenant_documents(
        &self,
        tenant: &str,
        folder: &str,
    ) -> Result<Vec<(String, u64)>> {
        let prefix = tenant_document(tenant, folder);
        let under = format!("{prefix}/");
        Ok(self
            .store
            .list(&prefix)
            .await?
            .into_iter()
            .filter_map(|o| {
                let name = o.location.as_ref().strip_prefix(&under)?.to_owned();
                Some((name, o.size))
            })
            .collect())
    }

    /// Deletes a tenant's document; a missing one is not an error.
    pub async fn delete_tenant_document(&self, tenant: &str, name: &str) -> Result<()> {
        self.store.delete(&tenant_document(tenant, name)).await
    }

    /// Drops the partitions of `tenant` whose data is wholly older than `before_nanos`
    /// (retention), then gives the metastore's freed space back. Returns entries removed.
    pub async fn apply_retention(&self, tenant: &str, before_nanos: i64) -> Result<usize> {
        // A partition can be dropped when its whole window is before the cut-off.
        let before_partition = partition_of(before_nanos);
        let Removed { entries, .. } = self
            .metastore
            .drop_partitions(tenant, before_partition, now_ms(), self.delete_delay_ms())
            .await?;
        if entries > 0 {
            self.metastore.shrink().await?;
        }
        Ok(entries)
    }

    /// Deletes objects whose tombstones are due. Returns how many went.
    pub async fn collect_garbage(&self, now: u64) -> Result<usize> {
        let mut deleted = 0;
        loop {
            let due = self.metastore.due_tombstones(now, 256).await?;
            if due.is_empty() {
                return Ok(deleted);
            }
            let mut done = Vec::with_capacity(due.len());
            for t in &due {
                self.store.delete(&t.path).await?;
                done.push(t.id.clone());
            }
            deleted += done.len();
            self.metastore.forget_tombstones(&done).await?;
            if due.len() < 256 {
                return Ok(deleted);
            }
        }
    }

    /// What of the metastore and the object store does not answer within `timeout` (both
    /// asked at once): `/ready`'s check. Empty when both answer.
    pub async fn unreachable(&self, timeout: Duration) -> Vec<&'static str> {
        let (metastore, store) = tokio::join!(
            tokio::time::timeout(timeout, self.metastore.ping()),
            tokio::time::timeout(timeout, self.store.probe()),
        );
        let mut down = Vec::new();
        if !matches!(metastore, Ok(Ok(()))) {
            down.push("metastore");
        }
        if !matches!(store, Ok(Ok(()))) {
            down.push("object store");
        }
        down
    }

    /// Whether this process holds the cluster-wide lease `name` for `ttl` from now
    /// ([`Metastore::hold_lease`]): work one process does for the whole cluster runs only
    /// there. Always true on an embedded metastore.
    pub async fn holds_lease(&self, name: &str, ttl: Duration) -> Result<bool> {
        Ok(self
            .metastore
            .hold_lease(name, self.compactor.owner(), ttl)
            .await?
            .is_some())
    }

    /// Deletes objects no metastore record names that are older than the grace period, and
    /// the leftovers of uploads and compactions a crash interrupted.
    pub async fn sweep_orphans(&self, now: u64) -> Result<usize> {
        Ok(self.remove_leftovers().await? + self.sweep_bucket(now).await?)
    }

    /// Removes this process's leftovers of uploads and compactions a crash interrupted (its
    /// own data directory).
    async fn remove_leftovers(&self) -> Result<usize> {
        let (store, scratch, grace_d) = (
            self.store.clone(),
            self.config.data_dir.join("compaction"),
            self.config.orphan_grace,
        );
        let leftovers = tokio::task::spawn_blocking(move || -> Result<usize> {
            Ok(store.remove_stale_uploads(grace_d)?
                + crate::store::remove_stale_files(&scratch, grace_d, &|n| n.ends_with(".part"))?)
        })
        .await
        .map_err(|e| Error::Task(e.to_string()))??;
        if leftovers > 0 {
            tracing::info!(
                files = leftovers,
                "interrupted uploads and compactions removed"
            );
        }
        Ok(leftovers)
    }

    /// Deletes the bucket's objects that no metastore record names and that are older than
    /// the grace period.
    async fn sweep_bucket(&self, now: u64) -> Result<usize> {
        let grace = self.config.orphan_grace.as_millis() as u64;
        let mut objects = self.store.list("segments").await?;
        objects.extend(self.store.list("blocks").await?);
        // Listed before the metastore is asked: an object registered in between is known.
        let known = self.metastore.known_objects().await?;
        let mut deleted = 0;
        for o in objects {
            let path = o.location.to_string();
            let known_id = object_id_of_path(&path).is_some_and(|id| known.contains(id));
            let age = now.saturating_sub(o.last_modified.timestamp_millis().max(0) as u64);
            if !known_id && age >= grace {
                tracing::info!(path = %path, age_ms = age, "orphan object deleted");
                self.store.delete(&path).await?;
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    /// One upkeep round: plan and run compaction jobs of every level, delete due objects,
    /// sweep orphans when `sweep` is set.
    pub async fn upkeep(&self, sweep: bool) -> Result<UpkeepReport> {
        let every = sweep.then_some(crate::metastore::LEASE_TTL);
        self.upkeep_levels(every, crate::compaction::ALL_LEVELS)
            .await
    }

    /// An upkeep round whose compaction runs only jobs of `levels`. Planning
    /// ([`crate::compaction::PLANNER_LEASE`]), deletions ([`GARBAGE_LEASE`]) and the bucket's
    /// sweep ([`SWEEP_LEASE`]) run on one process of the cluster at a time; jobs run on every
    /// compacting process. `sweep_every` is how long the sweep lease lasts: one sweep of the
    /// bucket per interval, whichever process does it.
    async fn upkeep_levels(
        &self,
        sweep: Option<Duration>,
        levels: std::ops::Range<u32>,
    ) -> Result<UpkeepReport> {
        let now = now_ms();
        let mut report = UpkeepReport {
            jobs_planned: self.compactor.plan(now).await?,
            ..Default::default()
        };
        report.jobs_done = self.compactor.run_pending(levels).await?;
        if self
            .holds_lease(GARBAGE_LEASE, crate::metastore::LEASE_TTL)
            .await?
        {
            report.objects_deleted = self.collect_garbage(now_ms()).await?;
        }
        if let Some(every) = sweep {
            report.orphans_deleted = self.remove_leftovers().await?;
            if self.holds_lease(SWEEP_LEASE, every).await? {
                report.orphans_deleted += self.sweep_bucket(now_ms()).await?;
            }
        }
        Ok(report)
    }

    /// Runs upkeep every `every` until the process ends (or the handle is aborted): planning,
    /// the compaction's fresh lane and deletions on one task, its bulk lane on another, so a
    /// long merge holds back neither the first levels' merges nor deletions
    /// ([`crate::compaction`]). Sweeps orphans at start-up and every `sweep_every`.
    pub fn spawn_upkeep(
        &self,
        every: Duration,
        sweep_every: Duration,
    ) -> tokio::task::JoinHandle<()> {
        let storage = self.clone();
        tokio::spawn(async move {
            let bulk = storage.clone();
            // Held (and so the bulk lane kept) for as long as this task runs.
            let _bulk = AbortOnDrop(tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let lane = crate::compaction::BULK_LEVELS;
                    if let Err(e) = bulk.compactor.run_pending(lane).await {
                        tracing::warn!(error = %e, "compaction (bulk lane) failed; retrying");
                    }
                }
            }));
            let mut last_sweep: Option<std::time::Instant> = None;
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let sweep = last_sweep.is_none_or(|t| t.elapsed() >= sweep_every);
                let lane = crate::compaction::FRESH_LEVELS;
                match storage
                    .upkeep_levels(sweep.then_some(sweep_every), lane)
                    .await
                {
                    Ok(r) => {
                        if sweep {
                            last_sweep = Some(std::time::Instant::now());
                        }
                        if r != UpkeepReport::default() {
                            tracing::debug!(?r, "storage upkeep");
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "storage upkeep failed; retrying"),
                }
            }
        })
    }

    /// Reads ahead, until the process ends, the new blocks other processes write for the
    /// tenants this one queried lately (ADR 0019). `None` where there is nothing to follow: on
    /// the local file system, or with a metastore no other process writes to.
    pub fn spawn_fresh_follower(&self) -> Option<tokio::task::JoinHandle<()>> {
        let caches = self.query.caches().clone();
        if caches.pages.is_none() || !self.metastore.shared() {
            return None;
        }
        Some(tokio::spawn(async move { caches.follow().await }))
    }

    /// Bytes stored for `tenant` (its datasets), from the metastore's partition summaries.
    pub async fn stored_bytes(&self, tenant: &str) -> Result<u64> {
        self.writer.barrier().await;
        Ok(self
            .metastore
            .partitions(tenant)
            .await?
            .iter()
            .map(|p| p.bytes)
            .sum())
    }

    /// Sets the `storage_blocks{level}` gauges from the metastore (every tenant's blocks; the
    /// process calls this in the background, never on a scrape).
    pub async fn refresh_block_gauges(&self) -> Result<()> {
        let mut per_level = std::collections::BTreeMap::<u32, i64>::new();
        for level in 0..=crate::format::meta::TOP_LEVEL {
            per_level.insert(level, 0);
        }
        for tenant in self.metastore.tenants().await? {
            for b in self
                .metastore
                .query_blocks(BlockQuery::all(&tenant))
                .await?
            {
                *per_level.entry(b.level).or_default() += 1;
            }
        }
        for (level, n) in per_level {
            self.metrics()
                .blocks
                .get_or_create(&crate::metrics::LevelLabels { level })
                .set(n);
        }
        Ok(())
    }

    /// Removes the `storage_blocks{level}` gauges (another process of the cluster sets them).
    pub fn clear_block_gauges(&self) {
        self.metrics().blocks.clear();
    }

    /// Hashes of the series of `tenant` (profile type and labels) with profiles at or after
    /// `since_nanos`, for the limit on active series.
    pub async fn series_hashes(&self, tenant: &str, since_nanos: i64) -> Result<Vec<u64>> {
        let blocks = self
            .metastore
            .query_blocks(BlockQuery::new(tenant, since_nanos, i64::MAX))
            .await?;
        let mut out: Vec<u64> = blocks
            .iter()
            .flat_map(|b| b.series.iter())
            .filter(|s| s.max_time_nanos >= since_nanos)
            .map(|s| series_hash(&s.profile_type, s.labels.iter()))
            .collect();
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    /// The query engine.
    pub fn query(&self) -> &QueryEngine {
        &self.query
    }

    /// The metastore.
    pub fn metastore(&self) -> &Arc<dyn Metastore> {
        &self.metastore
    }

    /// The compactor.
    pub fn compactor(&self) -> &Compactor {
        &self.compactor
    }

    /// The object store.
    pub fn store(&self) -> &ObjectStorage {
        &self.store
    }
}

/// Reads the footer of the object at `path` (of `size` bytes) into its datasets.
pub async fn read_footer(store: &ObjectStorage, path: &str, size: u64) -> Result<Vec<BlockMeta>> {
    let corrupt = |reason: String| Error::Corrupt {
        tenant: String::new(),
        block: path.to_owned(),
        reason,
    };
    let undecodable = |source| Error::Decode {
        tenant: String::new(),
        block: path.to_owned(),
        what: "footer",
        source,
    };
    let tail_len = size.min(64 * 1024);
    let tail = store.get_range(path, size - tail_len..size).await?;
    let need = footer_len(&tail).map_err(undecodable)? as u64;
    let footer = if need <= tail_len {
        tail
    } else if need <= size {
        store.get_range(path, size - need..size).await?
    } else {
        return Err(corrupt("footer longer than the object".into()));
    };
    decode_footer(&footer, size).map_err(undecodable)
}

/// What [`rebuild_metastore`] did.
#[derive(Debug, Default)]
pub struct Rebuilt {
    /// Entries added.
    pub entries: usize,
    /// Objects whose footer could not be read (path and error), left out.
    pub unreadable: Vec<String>,
    /// The write-ahead logs' checkpoints restored.
    pub checkpoints: Vec<crate::metastore::LogCheckpoint>,
}

/// Recreates the index from the objects' footers (`kiln metastore rebuild`): every dataset of
/// every object, less those another object says it was compacted from, and each write-ahead
/// log's checkpoint, the latest an object's footer names (so the records of a log left on disk
/// that the objects hold are not replayed again). Objects whose footer cannot be read are
/// reported and skipped.
pub async fn rebuild_metastore(
    store: &ObjectStorage,
    metastore: &dyn Metastore,
) -> Result<Rebuilt> {
    let mut objects = store.list("segments").await?;
    objects.extend(store.list("blocks").await?);
    let mut all: Vec<BlockMeta> = Vec::new();
    let mut bad = Vec::new();
    for o in &objects {
        let path = o.location.to_string();
        match read_footer(store, &path, o.size).await {
            Ok(datasets) => all.extend(datasets.into_iter().filter(|d| d.path() == path)),
            Err(e) => bad.push(format!("{path}: {e}")),
        }
    }
    let replaced: std::collections::HashSet<(String, String)> = all
        .iter()
        .flat_map(|b| {
            b.compacted_from
                .iter()
                .map(|source| (b.tenant.clone(), source.clone()))
        })
        .collect();
    // Every object's, replaced ones too: a source's checkpoints are at most its output's.
    let checkpoints = crate::format::meta::latest_checkpoints(all.iter().flat_map(|b| &b.logs));
    let keep: Vec<BlockMeta> = all
        .into_iter()
        .filter(|b| {
            let me = crate::format::meta::compacted_source(&b.id, b.partition());
            !replaced.contains(&(b.tenant.clone(), me))
        })
        .collect();
    let mut added = 0;
    for chunk in keep.chunks(256) {
        for b in chunk {
            match metastore.add_blocks(vec![b.clone()]).await {
                Ok(()) => added += 1,
                Err(Error::BlockExists { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
    for c in &checkpoints {
        metastore.add_blocks_checkpointed(Vec::new(), c).await?;
    }
    Ok(Rebuilt {
        entries: added,
        unreadable: bad,
        checkpoints,
    })
}

/// Where a tenant's documents live.
fn tenant_documents(tenant: &str) -> String {
    format!("tenants/{}", crate::format::meta::escape_tenant(tenant))
}

/// The object path of a tenant's document `name` ([`Storage::tenant_document`]): what other
/// parts keep among a tenant's documents (debug files) is written there directly, through
/// [`Storage::store`], and goes with [`Storage::delete_tenant`].
pub fn tenant_document_path(tenant: &str, name: &str) -> String {
    tenant_document(tenant, name)
}

fn tenant_document(tenant: &str, name: &str) -> String {
    format!("{}/{name}", tenant_documents(tenant))
}
