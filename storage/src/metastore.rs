//! The metastore: which blocks exist, for which tenant, shard and time range, with their series;
//! which objects may be deleted and when; compaction jobs and their leases; quarantined blocks.
//!
//! One [`Metastore`] trait for two backends: the embedded one ([`embedded::EmbeddedMetastore`],
//! on redb) serves the single binary, and [`postgres::Postgres`] serves several `kiln` processes
//! sharing one database (the conformance suite in [`conformance`] states the contract as tests
//! both run). The index is
//! partitioned by time window (six hours of the block's minimum time), then tenant, then shard,
//! as Pyroscope's metastore is, so lookups touch only the partitions of the range asked for and
//! retention drops whole partitions.
//!
//! Objects: an L0 segment holds every tenant of one flush, so it is referenced by one entry per
//! tenant; a compacted block by one. When the last entry of an object goes (compaction, retention,
//! tenant deletion), the object gets a tombstone with a due time, and the deleter removes it after
//! that, so queries that already looked the entry up can still read it. An entry removed by
//! compaction keeps a tombstone too, so it can never be added again.

#[cfg(any(test, feature = "testing"))]
pub mod conformance;
pub mod embedded;
pub mod postgres;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::Result;
pub use crate::format::meta::{
    BlockMeta, LogCheckpoint, PARTITION_NANOS, SeriesMeta, partition_of,
};

/// Which blocks a lookup wants.
#[derive(Debug, Clone, Copy)]
pub struct BlockQuery<'a> {
    pub tenant: &'a str,
    /// Inclusive start, Unix nanoseconds.
    pub start_nanos: i64,
    /// Exclusive end, Unix nanoseconds.
    pub end_nanos: i64,
    /// Only blocks with a series of this `service_name`.
    pub service_name: Option<&'a str>,
    /// Only blocks with a series of this profile type.
    pub profile_type: Option<&'a str>,
}

impl<'a> BlockQuery<'a> {
    /// Every block of `tenant` meeting `[start, end)`.
    pub fn new(tenant: &'a str, start_nanos: i64, end_nanos: i64) -> Self {
        Self {
            tenant,
            start_nanos,
            end_nanos,
            service_name: None,
            profile_type: None,
        }
    }

    /// Every block of `tenant`.
    pub fn all(tenant: &'a str) -> Self {
        Self::new(tenant, i64::MIN, i64::MAX)
    }

    /// Whether a block matches: a series of it meets the range, the service and the type
    /// (answered by the block's series index).
    pub fn matches(&self, b: &BlockMeta) -> bool {
        if b.tenant != self.tenant || !b.overlaps(self.start_nanos, self.end_nanos) {
            return false;
        }
        if self.service_name.is_none() && self.profile_type.is_none() {
            // Any series in range will do, usually the first: no index is built for the
            // listings (gauges, series limits) that read every entry.
            return b
                .series
                .iter()
                .any(|s| s.overlaps(self.start_nanos, self.end_nanos));
        }
        let index = b.series_index();
        let mut set = index.in_range(self.start_nanos, self.end_nanos);
        if let Some(n) = self.service_name {
            set.intersect_with(&index.with_value(kiln_otel::model::LABEL_SERVICE_NAME, n));
        }
        if let Some(p) = self.profile_type {
            set.intersect_with(
                &index.with_value(crate::format::series_index::PROFILE_TYPE_LABEL, p),
            );
        }
        !set.is_clear()
    }
}

/// What a tenant holds in one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PartitionStats {
    pub partition: i64,
    pub blocks: u64,
    /// Bytes of the tenant's datasets.
    pub bytes: u64,
    pub rows: u64,
    /// Bounds of the data's time range (they may be wider than the data left after removals).
    pub min_time_nanos: i64,
    pub max_time_nanos: i64,
}

/// A block waiting for compaction: the summary the planner decides from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuedBlock {
    pub tenant: String,
    pub id: String,
    pub partition: i64,
    pub shard: u32,
    pub level: u32,
    pub created_ms: u64,
    pub bytes: u64,
    pub rows: u64,
    pub stack_nodes: u64,
    /// When the block was registered (Unix milliseconds, the metastore's clock): when it came,
    /// which its ULID time does not say of a merge's output. 0 when unknown (a block
    /// registered by an older version): its creation time stands in.
    #[serde(default)]
    pub arrived_ms: u64,
}

impl QueuedBlock {
    /// The summary of a block, its arrival unknown.
    pub fn of(b: &BlockMeta) -> Self {
        Self {
            tenant: b.tenant.clone(),
            id: b.id.clone(),
            partition: b.partition(),
            shard: b.shard,
            level: b.level,
            created_ms: b.created_ms(),
            bytes: b.dataset_bytes(),
            rows: b.rows,
            stack_nodes: b.stack_nodes,
            arrived_ms: 0,
        }
    }

    /// When the block came: its arrival, or its creation time where that is unknown.
    pub fn arrived_ms(&self) -> u64 {
        if self.arrived_ms == 0 {
            self.created_ms
        } else {
            self.arrived_ms
        }
    }
}

/// A compaction job: merge `sources` (blocks of one tenant, partition, shard and level) into
/// blocks one level up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub id: u64,
    pub tenant: String,
    pub partition: i64,
    pub shard: u32,
    pub level: u32,
    pub sources: Vec<QueuedBlock>,
    /// Who holds the lease ("" = nobody).
    pub owner: String,
    pub lease_expires_ms: u64,
    pub attempts: u32,
}

impl Job {
    /// Ids of the source blocks.
    pub fn source_ids(&self) -> Vec<String> {
        self.sources.iter().map(|s| s.id.clone()).collect()
    }
}

/// An object to delete once `due_ms` has passed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tombstone {
    pub id: String,
    pub path: String,
    pub due_ms: u64,
}

/// A block taken out of the index because it could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quarantined {
    pub tenant: String,
    pub id: String,
    pub partition: i64,
    pub path: String,
    pub reason: String,
    pub at_ms: u64,
}

/// What a removal took away.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Removed {
    /// Entries (one tenant's dataset of one object) removed from the index.
    pub entries: usize,
    /// Objects that lost their last entry and were tombstoned.
    pub objects: usize,
}

/// A process of a cluster, as membership records it: its instance id (`--instance-id`) and
/// the roles it runs (`ingest,query`, as `--roles` spells them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: String,
    pub roles: String,
}

/// How long a member not heard from stays alive by default (ten missed heartbeats of one
/// second).
pub const MEMBER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// An amount to add to one of a tenant's usage counters ([`Metastore::add_usage`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageCount {
    pub tenant: String,
    /// The counter's name (`received_bytes`, `refused:rate_limited`, ...).
    pub counter: String,
    pub value: u64,
}

/// Refusals of a tenant's writes for its ingest rate in one minute ([`Metastore::add_throttled`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThrottledMinute {
    pub tenant: String,
    /// The minute's start, Unix milliseconds.
    pub minute_ms: i64,
    pub refused: u64,
}

/// How long a shared metastore keeps throttled minutes.
pub const THROTTLED_KEPT_MS: i64 = 31 * 24 * 3600 * 1000;

/// A recording rule's sum over one interval of one series ([`Metastore::complete_job_recorded`]).
/// The gateway names the rule and encodes the series; the metastore only adds them up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedSum {
    pub rule: String,
    /// The series' group labels, encoded by the gateway.
    pub series: String,
    /// The interval's start, Unix milliseconds.
    pub interval_ms: i64,
    pub value: i64,
}

/// A sealed point waiting to be sent ([`Metastore::commit_recording_seal`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxPoint {
    /// Its place in the outbox (ignored when one is added).
    pub seq: i64,
    pub tenant: String,
    /// Where it goes (a remote-write URL).
    pub destination: String,
    /// Its labels, encoded by the gateway.
    pub labels: String,
    pub time_ms: i64,
    pub value: i64,
}

/// A lease as one holder took it ([`Metastore::hold_lease`]): work committed under it checks
/// that the lease has not changed hands since.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseFence {
    pub name: String,
    pub holder: String,
    pub epoch: u64,
}

/// How long a cluster-wide lease ([`Metastore::hold_lease`]) lasts unless renewed: its holder
/// renews it every round (a second or so), and another process takes it over this long after
/// the holder stops.
pub const LEASE_TTL: std::time::Duration = std::time::Duration::from_secs(15);

/// Block metadata storage. Every method that changes something is one transaction, durable when
/// it returns.
#[async_trait::async_trait]
pub trait Metastore: Send + Sync + std::fmt::Debug {
    /// Registers blocks in one transaction (every dataset of one flush, say); they are
    /// queryable once this returns. Refuses the whole batch with [`crate::Error::BlockExists`]
    /// when one of them is already registered or was compacted away. Leaves out, quietly, the
    /// entries of a tenant deleted after their newest write was received
    /// ([`Metastore::delete_tenant`]).
    async fn add_blocks(&self, blocks: Vec<BlockMeta>) -> Result<()>;

    /// Registers blocks as [`Metastore::add_blocks`] does and, in the same transaction, records
    /// that a write-ahead log's records up to `checkpoint.seq` are in registered blocks (ADR
    /// 0018): after a crash, only the records above it are replayed. A checkpoint never moves
    /// back. `blocks` may be empty (records whose writes held no samples).
    async fn add_blocks_checkpointed(
        &self,
        blocks: Vec<BlockMeta>,
        checkpoint: &LogCheckpoint,
    ) -> Result<()>;

    /// The last checkpoint recorded for the log `log` ([`Metastore::add_blocks_checkpointed`]);
    /// 0 when none was.
    async fn log_checkpoint(&self, log: &str) -> Result<u64>;

    /// Blocks that `query` selects, reading only the partitions of its time range.
    async fn query_blocks(&self, query: BlockQuery<'_>) -> Result<Vec<Arc<BlockMeta>>>;

    /// Blocks of `tenant` by id (every partition's entry of each); ids not registered are left
    /// out.
    async fn get_blocks(&self, tenant: &str, ids: &[String]) -> Result<Vec<Arc<BlockMeta>>>;

    /// Tenants with at least one block.
    async fn tenants(&self) -> Result<Vec<String>>;

    /// The partitions of `tenant`, oldest first.
    async fn partitions(&self, tenant: &str) -> Result<Vec<PartitionStats>>;

    /// Blocks that no job has claimed, of every tenant (top-level ones too: they merge by size).
    async fn queued_blocks(&self) -> Result<Vec<QueuedBlock>>;

    /// Creates jobs, each claiming its sources in the same transaction; a job one of whose
    /// sources is gone or already claimed is skipped. Returns how many were created.
    async fn add_jobs(&self, jobs: Vec<Job>) -> Result<usize>;

    /// Leases a job of a level in `levels` that nobody holds (or whose lease expired) to
    /// `owner` until `now_ms + lease_ms`: the lowest level first, the oldest of it first.
    /// Compactors run two lanes side by side ([`crate::compaction::FRESH_LEVELS`]), so the
    /// first levels' small merges do not wait behind a long merge of the top level.
    async fn lease_job(
        &self,
        owner: &str,
        now_ms: u64,
        lease_ms: u64,
        levels: std::ops::Range<u32>,
    ) -> Result<Option<Job>>;

    /// Replaces a leased job's sources by `outputs` in one transaction: the sources leave the
    /// index (tombstoned, never to be added again), objects that lost their last entry are
    /// tombstoned for deletion at `now_ms + delete_after_ms`, the outputs are added and the job
    /// is done. Fails with [`crate::Error::LeaseLost`] when `owner` no longer holds the lease
    /// with the job's epoch (`attempts`, one more at each lease): an expired lease taken again,
    /// even by the same owner, fences the older holder off.
    async fn complete_job(
        &self,
        job: &Job,
        owner: &str,
        outputs: Vec<BlockMeta>,
        now_ms: u64,
        delete_after_ms: u64,
    ) -> Result<()>;

    /// Extends the lease of `job` to `now_ms + lease_ms` while `owner` holds it with the
    /// job's epoch (its `attempts`): whether it still did. A merge longer than a lease renews
    /// it as it runs; a lease that expired and was taken by another is not given back.
    async fn renew_job(&self, job: &Job, owner: &str, now_ms: u64, lease_ms: u64) -> Result<bool>;

    /// Gives a job up: its sources go back to the queue (less those quarantined since).
    async fn cancel_job(&self, job: &Job) -> Result<()>;

    /// Every job, leased or not.
    async fn jobs(&self) -> Result<Vec<Job>>;

    /// Removes the partitions of `tenant` before `before_partition` (retention).
    async fn drop_partitions(
        &self,
        tenant: &str,
        before_partition: i64,
        now_ms: u64,
        delete_after_ms: u64,
    ) -> Result<Removed>;

    /// Removes every entry, job and quarantine record of `tenant`, and records that it was
    /// deleted at `now_ms`: from then on, registering an entry of the tenant whose writes were
    /// all received by `now_ms` ([`BlockMeta::received_ms`]) registers nothing. So a write
    /// acknowledged before the deletion does not come back from a spool, a retry, a log replay
    /// or another process's buffer; the tenant's later writes are stored as a new tenant's.
    async fn delete_tenant(
        &self,
        tenant: &str,
        now_ms: u64,
        delete_after_ms: u64,
    ) -> Result<Removed>;

    /// Tombstones due at `now_ms`, at most `limit`.
    async fn due_tombstones(&self, now_ms: u64, limit: usize) -> Result<Vec<Tombstone>>;

    /// Forgets tombstones whose objects were deleted.
    async fn forget_tombstones(&self, ids: &[String]) -> Result<()>;

    /// Ids of every object the metastore knows: referenced by an entry, tombstoned or
    /// quarantined. An object not among them is an orphan.
    async fn known_objects(&self) -> Result<HashSet<String>>;

    /// Those of `ids` the metastore knows (as [`Metastore::known_objects`] does): objects
    /// that may still be in the store.
    async fn known_among(&self, ids: &[String]) -> Result<HashSet<String>>;

    /// Takes every entry of object `id` of `tenant` out of the index because it cannot be read.
    /// Returns false when there was none (already quarantined, say).
    async fn quarantine(&self, tenant: &str, id: &str, reason: &str, now_ms: u64) -> Result<bool>;

    /// Quarantined blocks, of one tenant or of all.
    async fn quarantined(&self, tenant: Option<&str>) -> Result<Vec<Quarantined>>;

    /// Gives storage freed by removals back to the system (redb compaction, `VACUUM`).
    async fn shrink(&self) -> Result<()>;

    /// Membership: records `me` alive now and answers the members heard from within `timeout`
    /// (on the database's clock), `me` among them, by id. An embedded metastore serves one
    /// process, so it answers `me` alone.
    async fn heartbeat(&self, me: &Member, timeout: std::time::Duration) -> Result<Vec<Member>> {
        let _ = timeout;
        Ok(vec![me.clone()])
    }

    /// Holds the cluster-wide lease `name` for `holder` for `ttl` from now, on the
    /// metastore's clock: taken when nobody holds it or it expired, renewed when `holder`
    /// has it. Answers its epoch while `holder` holds it (one more each time the lease changes
    /// hands), `None` while another does. Work that one process does for the cluster
    /// (planning compaction, deletions, retention, gauges) runs under one. An embedded
    /// metastore serves one process, which always holds every lease.
    async fn hold_lease(
        &self,
        name: &str,
        holder: &str,
        ttl: std::time::Duration,
    ) -> Result<Option<u64>> {
        let _ = (name, holder, ttl);
        Ok(Some(1))
    }

    /// Adds to tenants' usage counters, kept for the cluster (each process adds what it
    /// counted since it last did). An embedded metastore serves one process, whose own
    /// counters are the cluster's: it keeps none.
    async fn add_usage(&self, counts: &[UsageCount]) -> Result<()> {
        let _ = counts;
        Ok(())
    }

    /// Adds to the minutes in which tenants' writes were refused for their ingest rate, kept
    /// for the cluster ([`THROTTLED_KEPT_MS`]). An embedded metastore keeps none: its one
    /// process keeps its own.
    async fn add_throttled(&self, minutes: &[ThrottledMinute]) -> Result<()> {
        let _ = minutes;
        Ok(())
    }

    /// The throttled minutes of `tenant` from `from_ms` to `to_ms` (inclusive) as every process
    /// added them, by minute; `None` where the metastore keeps none (embedded).
    async fn throttled(
        &self,
        tenant: &str,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Option<Vec<(i64, u64)>>> {
        let _ = (tenant, from_ms, to_ms);
        Ok(None)
    }

    /// A tenant's usage counters as every process added them ([`Metastore::add_usage`]);
    /// `None` where the metastore keeps none (embedded).
    async fn usage(&self, tenant: &str) -> Result<Option<BTreeMap<String, u64>>> {
        let _ = tenant;
        Ok(None)
    }

    /// [`Metastore::complete_job`], adding `sums` to the recording rules' sums in the same
    /// transaction: counted if and only if the job's outputs are registered. Only a shared
    /// metastore keeps sums (one process counts its rules itself).
    async fn complete_job_recorded(
        &self,
        job: &Job,
        owner: &str,
        outputs: Vec<BlockMeta>,
        sums: &[RecordedSum],
        now_ms: u64,
        delete_after_ms: u64,
    ) -> Result<()> {
        if !sums.is_empty() {
            return Err(crate::Error::Metastore(
                "recording sums need a shared metastore".into(),
            ));
        }
        self.complete_job(job, owner, outputs, now_ms, delete_after_ms)
            .await
    }

    /// Tenants with recording sums or counters ([`Metastore::complete_job_recorded`]).
    async fn recording_tenants(&self) -> Result<Vec<String>> {
        Ok(Vec::new())
    }

    /// A tenant's recording sums of intervals starting before `before_ms`.
    async fn recording_sums(&self, tenant: &str, before_ms: i64) -> Result<Vec<RecordedSum>> {
        let _ = (tenant, before_ms);
        Ok(Vec::new())
    }

    /// A tenant's recording state as the last seal kept it.
    async fn recording_state(&self, tenant: &str) -> Result<Option<Vec<u8>>> {
        let _ = tenant;
        Ok(None)
    }

    /// Seals under `fence`, in one transaction: keeps `state`, takes `consumed` off the sums
    /// (sums added since stay) and queues `points`. `false`, with nothing changed, when the
    /// lease has changed hands.
    async fn commit_recording_seal(
        &self,
        fence: &LeaseFence,
        tenant: &str,
        state: &[u8],
        consumed: &[RecordedSum],
        points: &[OutboxPoint],
    ) -> Result<bool> {
        let _ = (fence, tenant, state, consumed, points);
        Err(crate::Error::Metastore(
            "recording seals need a shared metastore".into(),
        ))
    }

    /// Up to `limit` points of the outbox, oldest first.
    async fn recording_outbox(&self, limit: usize) -> Result<Vec<OutboxPoint>> {
        let _ = limit;
        Ok(Vec::new())
    }

    /// Removes points from the outbox (sent, or refused for good).
    async fn remove_recording_outbox(&self, seqs: &[i64]) -> Result<()> {
        let _ = seqs;
        Ok(())
    }

    /// Whether the metastore answers (readiness checks): one round trip, nothing read.
    async fn ping(&self) -> Result<()> {
        Ok(())
    }

    /// Gives the lease `name` up if `holder` holds it, so another may take it at once.
    async fn release_lease(&self, name: &str, holder: &str) -> Result<()> {
        let _ = (name, holder);
        Ok(())
    }

    /// `id` leaves the cluster: it is no longer among the members alive.
    async fn leave(&self, id: &str) -> Result<()> {
        let _ = id;
        Ok(())
    }

    /// Whether processes share this metastore, and with it the cluster's counts of active
    /// series ([`Metastore::admit_series`]) and its sessions ([`Metastore::put_session`]); an
    /// embedded metastore serves one process, which keeps its own.
    fn shared(&self) -> bool {
        false
    }

    /// Admits `hashes`, series of `tenant` new to the calling process, against `max` active
    /// series (0: no limit) counted over every process: a series is active when one was seen
    /// within `window`. Admitted, all of them are active from now; refused (`false`), none is
    /// recorded. Admissions of one tenant run one at a time.
    async fn admit_series(
        &self,
        tenant: &str,
        hashes: &[u64],
        max: usize,
        window: std::time::Duration,
    ) -> Result<bool> {
        let _ = (tenant, hashes, max, window);
        Ok(true)
    }

    /// Marks `hashes` of `tenant` seen now (a process's series that stay active).
    async fn touch_series(&self, tenant: &str, hashes: &[u64]) -> Result<()> {
        let _ = (tenant, hashes);
        Ok(())
    }

    /// A session that calls reaching different processes share (a debug-file upload's): a
    /// small document of `tenant` under `key`, kept for `ttl`, replacing what was there. Only
    /// a [`Metastore::shared`] metastore keeps sessions.
    async fn put_session(
        &self,
        tenant: &str,
        key: &str,
        value: Vec<u8>,
        ttl: std::time::Duration,
    ) -> Result<()> {
        let _ = (tenant, key, value, ttl);
        Err(crate::Error::Config(
            "an embedded metastore keeps no sessions: its one process keeps its own".into(),
        ))
    }

    /// Puts a session as [`Metastore::put_session`] does only where there is none (or it
    /// expired): whether this call made it. Of calls racing for one key, one makes it.
    async fn claim_session(
        &self,
        tenant: &str,
        key: &str,
        value: Vec<u8>,
        ttl: std::time::Duration,
    ) -> Result<bool> {
        let _ = (tenant, key, value, ttl);
        Err(crate::Error::Config(
            "an embedded metastore keeps no sessions: its one process keeps its own".into(),
        ))
    }

    /// The session of `tenant` under `key`, unless it expired.
    async fn get_session(&self, tenant: &str, key: &str) -> Result<Option<Vec<u8>>> {
        let _ = (tenant, key);
        Ok(None)
    }

    /// Removes the session of `tenant` under `key`, answering what it held.
    async fn take_session(&self, tenant: &str, key: &str) -> Result<Option<Vec<u8>>> {
        let _ = (tenant, key);
        Ok(None)
    }

    /// The sessions of `tenant` whose keys start with `prefix`, by key.
    async fn sessions(&self, tenant: &str, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let _ = (tenant, prefix);
        Ok(Vec::new())
    }
}

/// Decoded metastore entries by (tenant, id, partition), bounded in bytes: entries never change
/// once written, so both backends cache their decoding.
pub(crate) type EntryCache = moka::sync::Cache<(String, String, i64), Arc<BlockMeta>>;

/// An [`EntryCache`] of 512 MiB, entries weighed by the memory their series and series index
/// hold, so a tenant of a million series keeps its entries decoded and indexed (one query's
/// worth) rather than decoding them again for every query.
pub(crate) fn entry_cache() -> EntryCache {
    moka::sync::Cache::builder()
        // Least recently used: TinyLFU's admission would turn away a tenant's one large entry,
        // new and so seldom seen, and decode it again on every query.
        .eviction_policy(moka::policy::EvictionPolicy::lru())
        .weigher(|_, b: &Arc<BlockMeta>| entry_weight(b).try_into().unwrap_or(u32::MAX))
        .max_capacity(512 << 20)
        .build()
}

/// Approximate bytes an entry holds once decoded and indexed: its label tables (each shared by
/// many series, counted once), per series its struct, label pairs and index postings, and per
/// distinct string a value of the index.
fn entry_weight(b: &BlockMeta) -> usize {
    let mut tables: Vec<*const crate::format::series_labels::LabelTable> = Vec::new();
    let mut bytes = 512;
    for s in &b.series {
        let table = Arc::as_ptr(s.labels.table());
        if tables.last() != Some(&table) && !tables.contains(&table) {
            tables.push(table);
            bytes += s.labels.table().heap_bytes() + 40 * s.labels.table().strings();
        }
        bytes += 96 + 12 * s.labels.len();
    }
    bytes
}

/// Keeps entries just written in `cache` as they were given (when `keep` is set), so the
/// listing or the compaction that reads them next does not decode them again: a million-series
/// entry decoded beside the writer's own copy was a few hundred megabytes more at the peak of a
/// compaction (ADR 0017). Decoding an entry gives back what was encoded (`meta::wire`'s tests),
/// so the cached value is the one a read would have made. A process that answers no queries
/// keeps none: it would seldom read them, and another process's compaction removes them
/// without this cache knowing.
/// Whether entry `b` holds only writes received by `at_ms` (Unix ms), when its tenant was
/// deleted: its newest write's time, or its object's (a ULID's) when that is not known. An id
/// that is not a ULID (never one Kiln makes) tells nothing, and the entry is kept.
pub(crate) fn received_by(b: &BlockMeta, at_ms: u64) -> bool {
    let received = match b.received_ms {
        0 => ulid::Ulid::from_string(&b.id).map_or(u64::MAX, |u| u.timestamp_ms()),
        ms => ms,
    };
    received <= at_ms
}

/// The `blocks` a registration kept (`kept` flags them, in order; the others were a deleted
/// tenant's), as they are stored: without their time of receipt.
pub(crate) fn registered(blocks: Vec<BlockMeta>, kept: &[bool]) -> Vec<BlockMeta> {
    let refused = kept.iter().filter(|&&k| !k).count();
    if refused > 0 {
        tracing::info!(
            entries = refused,
            "entries of deleted tenants refused: they hold only writes received before the \
             deletion"
        );
    }
    blocks
        .into_iter()
        .zip(kept)
        .filter(|(_, k)| **k)
        .map(|(mut b, _)| {
            b.received_ms = 0;
            b
        })
        .collect()
}

pub(crate) fn cache_written(cache: &EntryCache, keep: bool, blocks: Vec<BlockMeta>) {
    if !keep {
        return;
    }
    for mut b in blocks {
        // Built by pushing, a writer's lists may hold twice their length.
        b.series.shrink_to_fit();
        for r in &mut b.rollups {
            r.series_rows.shrink_to_fit();
        }
        cache.insert(b.key(), Arc::new(b));
    }
}

/// Decodes the entry `data` stored under (tenant, id, partition) through `cache`; an entry
/// that does not decode, or names another block, is corrupt.
pub(crate) fn decode_cached(
    cache: &EntryCache,
    tenant: &str,
    id: &str,
    partition: i64,
    data: &[u8],
) -> Result<Arc<BlockMeta>> {
    let key = (tenant.to_owned(), id.to_owned(), partition);
    if let Some(b) = cache.get(&key) {
        return Ok(b);
    }
    let corrupt = |reason: String| crate::Error::Corrupt {
        tenant: tenant.to_owned(),
        block: id.to_owned(),
        reason,
    };
    let b = BlockMeta::decode_entry(data).map_err(|source| crate::Error::Decode {
        tenant: tenant.to_owned(),
        block: id.to_owned(),
        what: "metastore entry",
        source,
    })?;
    if b.tenant != tenant || b.id != id || b.partition() != partition {
        return Err(corrupt("metastore entry names another block".into()));
    }
    let b = Arc::new(b);
    cache.insert(key, Arc::clone(&b));
    Ok(b)
}
