//! PostgreSQL metastore: the scale-out backend, shared by any number of `kiln` processes.
//!
//! The same contract as the embedded one (the conformance suite runs on both) on the schema of
//! `postgres/0001_init.sql`, applied at connection time under an advisory lock (so processes
//! starting together migrate once). Entries are rows keyed (tenant, partition, id) with the
//! columns lookups filter on and the protobuf entry; partition rows carry the data time range
//! lookups prune by, as in the embedded index.
//!
//! Concurrency: every change is one transaction at PostgreSQL's default isolation (read
//! committed) with row locks taken where a check precedes a change (`FOR UPDATE`). Adding blocks
//! (the ingest path) and leasing jobs (`FOR UPDATE SKIP LOCKED`) run concurrently; changes that
//! remove entries or move claims (completing, cancelling and planning jobs, retention, tenant
//! deletion, quarantine) also take one transaction-scoped advisory lock, so they apply one at a
//! time as they do on the embedded backend. A transaction aborted by a deadlock or a
//! serialization failure is retried; a lost connection answers "unavailable" (503) and the pool
//! reconnects on the next call.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;

use super::{
    BlockMeta, BlockQuery, Job, LogCheckpoint, Metastore, PartitionStats, Quarantined, QueuedBlock,
    Removed, Tombstone,
};
use crate::{Error, Result};

/// Schema migrations, applied in order; each runs once per database.
const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("postgres/0001_init.sql")),
    (2, include_str!("postgres/0002_log_checkpoints.sql")),
];

/// Advisory lock keys (arbitrary, fixed): migrations, and changes that remove entries.
const MIGRATION_LOCK: i64 = 0x6b69_6c6e_0001;
const REMOVAL_LOCK: i64 = 0x6b69_6c6e_0002;

/// How often a transaction aborted by a deadlock or serialization failure is tried again.
const CONFLICT_RETRIES: usize = 5;

/// Connection settings of the PostgreSQL metastore.
#[derive(Debug, Clone)]
pub struct PostgresConfig {
    /// `postgres://user:password@host:port/database`.
    pub url: String,
    /// Connections in the pool.
    pub max_connections: usize,
    /// How long a call waits for a connection (or to make one) before answering
    /// "unavailable".
    pub connect_timeout: Duration,
}

impl PostgresConfig {
    /// Defaults for `url`.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            max_connections: 16,
            connect_timeout: Duration::from_secs(5),
        }
    }
}

/// The PostgreSQL metastore.
#[derive(Clone)]
pub struct Postgres {
    pool: Pool,
    cache: super::EntryCache,
    /// Whether entries written are kept in `cache` ([`Postgres::keep_written`]).
    keep_written: Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for Postgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Postgres")
            .field("pool", &self.pool.status())
            .finish_non_exhaustive()
    }
}

fn unavailable(e: impl std::fmt::Display) -> Error {
    Error::MetastoreUnavailable(e.to_string())
}

/// Maps a PostgreSQL error: lost connections and exhausted resources (a full disk, say) are
/// "unavailable", deadlocks and serialization failures are conflicts (retried), the rest are
/// bugs.
fn pg_err(e: tokio_postgres::Error) -> Error {
    let Some(code) = e.code() else {
        // No SQLSTATE: the connection failed or closed.
        return unavailable(e);
    };
    let message = e
        .as_db_error()
        .map_or_else(|| e.to_string(), |d| d.message().to_owned());
    if code == &SqlState::T_R_DEADLOCK_DETECTED || code == &SqlState::T_R_SERIALIZATION_FAILURE {
        return Error::MetastoreConflict(message);
    }
    // 08: connection exception, 53: insufficient resources, 57: operator intervention
    // (shutdown), 58: system error (I/O).
    if ["08", "53", "57", "58"]
        .iter()
        .any(|class| code.code().starts_with(class))
    {
        return unavailable(format!("{} ({})", message, code.code()));
    }
    Error::Metastore(format!("postgres: {message} ({})", code.code()))
}

/// Stores a `u64` in a `BIGINT` (values past `i64::MAX` mean "never" and compare the same).
fn big(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn unbig(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn json<T: serde::Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("metastore records serialize")
}

fn from_json<T: serde::de::DeserializeOwned>(what: &str, data: &[u8]) -> Result<T> {
    serde_json::from_slice(data).map_err(|e| Error::Metastore(format!("bad {what} record: {e}")))
}

/// Runs `$body` in a transaction bound to `$tx` and commits it, trying again when PostgreSQL
/// aborts it for a deadlock or a serialization failure. With `$exclusive`, the transaction
/// first takes the removal lock.
macro_rules! transaction {
    ($self:ident, $exclusive:expr, |$tx:ident| $body:block) => {{
        let mut attempt = 0;
        loop {
            let mut client = $self.client().await?;
            let $tx = client.transaction().await.map_err(pg_err)?;
            if $exclusive {
                $tx.execute("SELECT pg_advisory_xact_lock($1)", &[&REMOVAL_LOCK])
                    .await
                    .map_err(pg_err)?;
            }
            let result: Result<_> = async { $body }.await;
            let result = match result {
                Ok(v) => $tx.commit().await.map_err(pg_err).map(|()| v),
                Err(e) => Err(e),
            };
            match result {
                Err(Error::MetastoreConflict(reason)) if attempt < CONFLICT_RETRIES => {
                    attempt += 1;
                    tracing::debug!(%reason, attempt, "metastore transaction conflicted; retrying");
                    tokio::time::sleep(Duration::from_millis(5 << attempt)).await;
                }
                other => break other,
            }
        }
    }};
}

/// The columns of a queue summary, in [`queued_from_row`]'s order.
const QUEUED_COLUMNS: &str =
    "tenant, id, partition, shard, level, created_ms, bytes, rows, stack_nodes";

fn queued_from_row(r: &tokio_postgres::Row) -> QueuedBlock {
    QueuedBlock {
        tenant: r.get(0),
        id: r.get(1),
        partition: r.get(2),
        shard: u32::try_from(r.get::<_, i64>(3)).unwrap_or(u32::MAX),
        level: u32::try_from(r.get::<_, i32>(4)).unwrap_or(0),
        created_ms: unbig(r.get(5)),
        bytes: unbig(r.get(6)),
        rows: unbig(r.get(7)),
        stack_nodes: unbig(r.get(8)),
    }
}

/// The columns of a job, in [`job_from_row`]'s order.
const JOB_COLUMNS: &str =
    "id, tenant, partition, shard, level, sources, owner, lease_expires_ms, attempts";

fn job_from_row(r: &tokio_postgres::Row) -> Result<Job> {
    Ok(Job {
        id: unbig(r.get(0)),
        tenant: r.get(1),
        partition: r.get(2),
        shard: u32::try_from(r.get::<_, i64>(3)).unwrap_or(u32::MAX),
        level: u32::try_from(r.get::<_, i32>(4)).unwrap_or(0),
        sources: from_json("job", r.get::<_, &[u8]>(5))?,
        owner: r.get(6),
        lease_expires_ms: unbig(r.get(7)),
        attempts: u32::try_from(r.get::<_, i32>(8)).unwrap_or(0),
    })
}

/// What removing an entry needs to know of it.
struct EntryRef {
    tenant: String,
    partition: i64,
    id: String,
    bytes: i64,
    rows: i64,
}

type Tx<'a> = deadpool_postgres::Transaction<'a>;

impl Postgres {
    /// Connects to the database at `config.url` and brings its schema up to date.
    pub async fn connect(config: &PostgresConfig) -> Result<Self> {
        let pg = tokio_postgres::Config::from_str(&config.url)
            .map_err(|e| Error::Config(format!("bad PostgreSQL URL: {e}")))?;
        let manager = Manager::from_config(
            pg,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(config.max_connections.max(1))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(config.connect_timeout))
            .create_timeout(Some(config.connect_timeout))
            .recycle_timeout(Some(config.connect_timeout))
            .build()
            .map_err(|e| Error::Config(format!("PostgreSQL pool: {e}")))?;
        let m = Self {
            pool,
            cache: super::entry_cache(),
            keep_written: Arc::new(std::sync::atomic::AtomicBool::new(true)),
        };
        m.migrate().await?;
        Ok(m)
    }

    /// Whether entries this process writes are kept decoded in its cache as written (the
    /// default), for the queries and compactions of the same process that read them next.
    pub fn keep_written(&self, keep: bool) {
        self.keep_written
            .store(keep, std::sync::atomic::Ordering::Relaxed);
    }

    fn keeps_written(&self) -> bool {
        self.keep_written.load(std::sync::atomic::Ordering::Relaxed)
    }

    async fn client(&self) -> Result<deadpool_postgres::Object> {
        self.pool.get().await.map_err(|e| match e {
            deadpool_postgres::PoolError::Backend(e) => pg_err(e),
            other => unavailable(format!("PostgreSQL: {other}")),
        })
    }

    /// Applies the migrations this database lacks, one process at a time.
    async fn migrate(&self) -> Result<()> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_err)?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(pg_err)?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS kiln_migrations (
                version INTEGER PRIMARY KEY,
                applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
            )",
        )
        .await
        .map_err(pg_err)?;
        let applied: HashSet<i32> = tx
            .query("SELECT version FROM kiln_migrations", &[])
            .await
            .map_err(pg_err)?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let newest = MIGRATIONS.last().map_or(0, |m| m.0);
        if let Some(v) = applied.iter().find(|v| **v > newest) {
            return Err(Error::Config(format!(
                "the metastore's schema (version {v}) is newer than this kiln's ({newest}); \
                 upgrade kiln"
            )));
        }
        for (version, sql) in MIGRATIONS {
            if applied.contains(version) {
                continue;
            }
            tx.batch_execute(sql).await.map_err(pg_err)?;
            tx.execute(
                "INSERT INTO kiln_migrations (version) VALUES ($1)",
                &[version],
            )
            .await
            .map_err(pg_err)?;
            tracing::info!(version, "metastore schema migrated");
        }
        tx.commit().await.map_err(pg_err)
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

    /// Adds one entry; refuses a duplicate or a compacted one.
    async fn insert_entry(tx: &Tx<'_>, b: &BlockMeta) -> Result<()> {
        let exists = || Error::BlockExists {
            tenant: b.tenant.clone(),
            block: b.id.clone(),
        };
        let partition = b.partition();
        let tombstoned = tx
            .query_opt(
                "SELECT 1 FROM kiln_entry_tombstones WHERE id = $1 AND tenant = $2 AND partition = $3",
                &[&b.id, &b.tenant, &partition],
            )
            .await
            .map_err(pg_err)?;
        if tombstoned.is_some() {
            return Err(exists());
        }
        let services: Vec<&str> = b.service_names();
        let profile_types: Vec<&str> = b.profile_types();
        let inserted = tx
            .execute(
                "INSERT INTO kiln_blocks (tenant, partition, id, shard, level, min_time, max_time,
                    services, profile_types, created_ms, bytes, rows, stack_nodes, entry)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
                 ON CONFLICT DO NOTHING",
                &[
                    &b.tenant,
                    &partition,
                    &b.id,
                    &i64::from(b.shard),
                    &i32::try_from(b.level).unwrap_or(i32::MAX),
                    &b.min_time_nanos,
                    &b.max_time_nanos,
                    &services,
                    &profile_types,
                    &big(b.created_ms()),
                    &big(b.dataset_bytes()),
                    &big(b.rows),
                    &big(b.stack_nodes),
                    &b.encode_entry(),
                ],
            )
            .await
            .map_err(pg_err)?;
        if inserted == 0 {
            return Err(exists());
        }
        tx.execute(
            "INSERT INTO kiln_partitions (tenant, partition, blocks, bytes, rows, min_time, max_time)
             VALUES ($1, $2, 1, $3, $4, $5, $6)
             ON CONFLICT (tenant, partition) DO UPDATE SET
                blocks = kiln_partitions.blocks + 1,
                bytes = kiln_partitions.bytes + EXCLUDED.bytes,
                rows = kiln_partitions.rows + EXCLUDED.rows,
                min_time = LEAST(kiln_partitions.min_time, EXCLUDED.min_time),
                max_time = GREATEST(kiln_partitions.max_time, EXCLUDED.max_time)",
            &[
                &b.tenant,
                &partition,
                &big(b.dataset_bytes()),
                &big(b.rows),
                &b.min_time_nanos,
                &b.max_time_nanos,
            ],
        )
        .await
        .map_err(pg_err)?;
        tx.execute(
            "INSERT INTO kiln_objects (id, path, refs) VALUES ($1, $2, 1)
             ON CONFLICT (id) DO UPDATE SET refs = kiln_objects.refs + 1",
            &[&b.id, &b.path()],
        )
        .await
        .map_err(pg_err)?;
        Ok(())
    }

    /// Removes one entry from the index. With `keep_object`, the object keeps its reference
    /// (quarantine); otherwise an object left without entries is tombstoned, due at `due_ms`.
    /// Returns whether an object was tombstoned.
    async fn remove_entry(
        &self,
        tx: &Tx<'_>,
        e: &EntryRef,
        due_ms: u64,
        tombstone_entry: bool,
        keep_object: bool,
    ) -> Result<bool> {
        let removed = tx
            .execute(
                "DELETE FROM kiln_blocks WHERE tenant = $1 AND partition = $2 AND id = $3",
                &[&e.tenant, &e.partition, &e.id],
            )
            .await
            .map_err(pg_err)?;
        if removed > 0 {
            let left = tx
                .query_opt(
                    "UPDATE kiln_partitions SET blocks = blocks - 1,
                        bytes = GREATEST(bytes - $3, 0), rows = GREATEST(rows - $4, 0)
                     WHERE tenant = $1 AND partition = $2 RETURNING blocks",
                    &[&e.tenant, &e.partition, &e.bytes, &e.rows],
                )
                .await
                .map_err(pg_err)?;
            if left.is_some_and(|r| r.get::<_, i64>(0) <= 0) {
                tx.execute(
                    "DELETE FROM kiln_partitions WHERE tenant = $1 AND partition = $2",
                    &[&e.tenant, &e.partition],
                )
                .await
                .map_err(pg_err)?;
            }
        }
        if tombstone_entry {
            tx.execute(
                "INSERT INTO kiln_entry_tombstones (id, tenant, partition) VALUES ($1, $2, $3)
                 ON CONFLICT DO NOTHING",
                &[&e.id, &e.tenant, &e.partition],
            )
            .await
            .map_err(pg_err)?;
        }
        self.cache
            .invalidate(&(e.tenant.clone(), e.id.clone(), e.partition));
        if keep_object {
            return Ok(false);
        }
        Self::release_object(tx, &e.id, due_ms).await
    }

    /// Drops one reference to object `id`; tombstones it when none is left.
    async fn release_object(tx: &Tx<'_>, id: &str, due_ms: u64) -> Result<bool> {
        let Some(row) = tx
            .query_opt(
                "UPDATE kiln_objects SET refs = refs - 1 WHERE id = $1 RETURNING refs, path",
                &[&id],
            )
            .await
            .map_err(pg_err)?
        else {
            return Ok(false);
        };
        if row.get::<_, i32>(0) > 0 {
            return Ok(false);
        }
        let path: String = row.get(1);
        tx.execute("DELETE FROM kiln_objects WHERE id = $1", &[&id])
            .await
            .map_err(pg_err)?;
        tx.execute(
            "INSERT INTO kiln_object_tombstones (id, path, due_ms) VALUES ($1, $2, $3)
             ON CONFLICT (id) DO UPDATE SET path = EXCLUDED.path, due_ms = EXCLUDED.due_ms",
            &[&id, &path, &big(due_ms)],
        )
        .await
        .map_err(pg_err)?;
        Ok(true)
    }

    /// Locks and reads the removal summary of one entry.
    async fn entry_ref(
        tx: &Tx<'_>,
        tenant: &str,
        id: &str,
        partition: i64,
    ) -> Result<Option<EntryRef>> {
        Ok(tx
            .query_opt(
                "SELECT bytes, rows FROM kiln_blocks
                 WHERE tenant = $1 AND partition = $2 AND id = $3 FOR UPDATE",
                &[&tenant, &partition, &id],
            )
            .await
            .map_err(pg_err)?
            .map(|r| EntryRef {
                tenant: tenant.to_owned(),
                partition,
                id: id.to_owned(),
                bytes: r.get(0),
                rows: r.get(1),
            }))
    }

    /// Deletes a job and gives back the entries it claimed (those still in the index return
    /// to the queue).
    async fn delete_job(tx: &Tx<'_>, job_id: i64) -> Result<()> {
        tx.execute("DELETE FROM kiln_jobs WHERE id = $1", &[&job_id])
            .await
            .map_err(pg_err)?;
        tx.execute(
            "UPDATE kiln_blocks SET job_id = NULL WHERE job_id = $1",
            &[&job_id],
        )
        .await
        .map_err(pg_err)?;
        Ok(())
    }

    /// Removes the entries of `tenant` in partitions before `before` (every partition when
    /// `None`) with the jobs there.
    async fn remove_tenant_entries(
        &self,
        tx: &Tx<'_>,
        tenant: &str,
        before: Option<i64>,
        due_ms: u64,
    ) -> Result<Removed> {
        let before = before.unwrap_or(i64::MAX);
        let jobs = tx
            .query(
                "DELETE FROM kiln_jobs WHERE tenant = $1 AND partition < $2 RETURNING id",
                &[&tenant, &before],
            )
            .await
            .map_err(pg_err)?;
        let job_ids: Vec<i64> = jobs.iter().map(|r| r.get(0)).collect();
        if !job_ids.is_empty() {
            tx.execute(
                "UPDATE kiln_blocks SET job_id = NULL WHERE job_id = ANY($1)",
                &[&job_ids],
            )
            .await
            .map_err(pg_err)?;
        }
        let rows = tx
            .query(
                "SELECT partition, id, bytes, rows FROM kiln_blocks
                 WHERE tenant = $1 AND partition < $2 ORDER BY partition, id FOR UPDATE",
                &[&tenant, &before],
            )
            .await
            .map_err(pg_err)?;
        let mut removed = Removed::default();
        for r in rows {
            let e = EntryRef {
                tenant: tenant.to_owned(),
                partition: r.get(0),
                id: r.get(1),
                bytes: r.get(2),
                rows: r.get(3),
            };
            removed.entries += 1;
            removed.objects += usize::from(self.remove_entry(tx, &e, due_ms, false, false).await?);
        }
        Ok(removed)
    }

    /// Decodes rows of (partition, id, entry) of `tenant`, leaving out (and logging) entries
    /// that cannot be read.
    fn decode_rows(
        &self,
        tenant: &str,
        rows: &[tokio_postgres::Row],
        keep: impl Fn(&BlockMeta) -> bool,
    ) -> Vec<Arc<BlockMeta>> {
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let (partition, id): (i64, &str) = (r.get(0), r.get(1));
            match self.decode(tenant, id, partition, r.get::<_, &[u8]>(2)) {
                Ok(b) if keep(&b) => out.push(b),
                Ok(_) => {}
                Err(e) => tracing::error!(tenant, block = id, error = %e,
                    "unreadable metastore entry left out of a query"),
            }
        }
        out
    }
}

/// The blocks of a [`BlockQuery`] (`$1` tenant, `$2` start, `$3` end, `$4` service, `$5`
/// profile type), in partition, shard and id order: the `FROM` onward of its `SELECT`.
const QUERY_BLOCKS: &str = "FROM kiln_blocks b
     JOIN kiln_partitions p ON p.tenant = b.tenant AND p.partition = b.partition
     WHERE b.tenant = $1
       AND p.min_time < $3 AND p.max_time >= $2
       AND b.min_time < $3 AND b.max_time >= $2
       AND ($4::TEXT IS NULL OR $4 = ANY (b.services))
       AND ($5::TEXT IS NULL OR $5 = ANY (b.profile_types))
     ORDER BY b.partition, b.shard, b.id";

impl Postgres {
    /// Registers `blocks` and records `checkpoint`, in one transaction.
    async fn add(
        &self,
        mut blocks: Vec<BlockMeta>,
        checkpoint: Option<&LogCheckpoint>,
    ) -> Result<()> {
        if blocks.is_empty() && checkpoint.is_none() {
            return Ok(());
        }
        // One lock order for every writer: partition rows by (tenant, partition).
        blocks.sort_by(|a, b| {
            (a.tenant.as_str(), a.partition(), a.id.as_str()).cmp(&(
                b.tenant.as_str(),
                b.partition(),
                b.id.as_str(),
            ))
        });
        let written = &blocks;
        transaction!(self, false, |tx| {
            for b in written {
                Self::insert_entry(&tx, b).await?;
            }
            if let Some(c) = checkpoint {
                tx.execute(
                    "INSERT INTO kiln_log_checkpoints (log, seq) VALUES ($1, $2)
                     ON CONFLICT (log) DO UPDATE
                     SET seq = GREATEST(kiln_log_checkpoints.seq, EXCLUDED.seq)",
                    &[&c.log, &(c.seq as i64)],
                )
                .await
                .map_err(pg_err)?;
            }
            Ok(())
        })?;
        super::cache_written(&self.cache, self.keeps_written(), blocks);
        Ok(())
    }
}

#[async_trait::async_trait]
impl Metastore for Postgres {
    async fn add_blocks(&self, blocks: Vec<BlockMeta>) -> Result<()> {
        self.add(blocks, None).await
    }

    async fn add_blocks_checkpointed(
        &self,
        blocks: Vec<BlockMeta>,
        checkpoint: &LogCheckpoint,
    ) -> Result<()> {
        self.add(blocks, Some(checkpoint)).await
    }

    async fn log_checkpoint(&self, log: &str) -> Result<u64> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT seq FROM kiln_log_checkpoints WHERE log = $1",
                &[&log],
            )
            .await
            .map_err(pg_err)?;
        Ok(row.map_or(0, |r| r.get::<_, i64>(0) as u64))
    }

    async fn query_blocks(&self, q: BlockQuery<'_>) -> Result<Vec<Arc<BlockMeta>>> {
        let client = self.client().await?;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [
            &q.tenant,
            &q.start_nanos,
            &q.end_nanos,
            &q.service_name,
            &q.profile_type,
        ];
        // The listing first, then the entries not decoded yet: an entry never changes, and one
        // of a million series is tens of megabytes, too much to send for every query.
        let listed = client
            .query(&format!("SELECT b.partition, b.id {QUERY_BLOCKS}"), &params)
            .await
            .map_err(pg_err)?;
        let mut found: Vec<Option<Arc<BlockMeta>>> = Vec::with_capacity(listed.len());
        let mut missing: Vec<&str> = Vec::new();
        for r in &listed {
            let (partition, id): (i64, &str) = (r.get(0), r.get(1));
            let cached = self
                .cache
                .get(&(q.tenant.to_owned(), id.to_owned(), partition));
            if cached.is_none() {
                missing.push(id);
            }
            found.push(cached);
        }
        if !missing.is_empty() {
            let rows = client
                .query(
                    "SELECT partition, id, entry FROM kiln_blocks
                     WHERE tenant = $1 AND id = ANY ($2)",
                    &[&q.tenant, &missing],
                )
                .await
                .map_err(pg_err)?;
            let mut fetched: HashMap<(&str, i64), &tokio_postgres::Row> = HashMap::new();
            for r in &rows {
                fetched.insert((r.get(1), r.get(0)), r);
            }
            for (slot, r) in found.iter_mut().zip(&listed) {
                if slot.is_some() {
                    continue;
                }
                let (partition, id): (i64, &str) = (r.get(0), r.get(1));
                let Some(row) = fetched.get(&(id, partition)) else {
                    // Compacted away between the two reads: one read of the entries with the
                    // listing is a consistent view.
                    let rows = client
                        .query(
                            &format!("SELECT b.partition, b.id, b.entry {QUERY_BLOCKS}"),
                            &params,
                        )
                        .await
                        .map_err(pg_err)?;
                    return Ok(self.decode_rows(q.tenant, &rows, |b| q.matches(b)));
                };
                match self.decode(q.tenant, id, partition, row.get::<_, &[u8]>(2)) {
                    Ok(b) => *slot = Some(b),
                    Err(e) => tracing::error!(tenant = q.tenant, block = id, error = %e,
                        "unreadable metastore entry left out of a query"),
                }
            }
        }
        Ok(found
            .into_iter()
            .flatten()
            .filter(|b| q.matches(b))
            .collect())
    }

    async fn get_blocks(&self, tenant: &str, ids: &[String]) -> Result<Vec<Arc<BlockMeta>>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT partition, id, entry FROM kiln_blocks
                 WHERE tenant = $1 AND id = ANY ($2)
                 ORDER BY array_position($2, id), partition",
                &[&tenant, &ids],
            )
            .await
            .map_err(pg_err)?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            out.push(self.decode(tenant, r.get(1), r.get(0), r.get::<_, &[u8]>(2))?);
        }
        Ok(out)
    }

    async fn tenants(&self) -> Result<Vec<String>> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT DISTINCT tenant FROM kiln_partitions ORDER BY tenant",
                &[],
            )
            .await
            .map_err(pg_err)?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn partitions(&self, tenant: &str) -> Result<Vec<PartitionStats>> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT partition, blocks, bytes, rows, min_time, max_time FROM kiln_partitions
                 WHERE tenant = $1 ORDER BY partition",
                &[&tenant],
            )
            .await
            .map_err(pg_err)?;
        Ok(rows
            .iter()
            .map(|r| PartitionStats {
                partition: r.get(0),
                blocks: unbig(r.get(1)),
                bytes: unbig(r.get(2)),
                rows: unbig(r.get(3)),
                min_time_nanos: r.get(4),
                max_time_nanos: r.get(5),
            })
            .collect())
    }

    async fn queued_blocks(&self) -> Result<Vec<QueuedBlock>> {
        let client = self.client().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT {QUEUED_COLUMNS} FROM kiln_blocks
                     WHERE job_id IS NULL
                     ORDER BY tenant, partition, shard, level, id"
                ),
                &[],
            )
            .await
            .map_err(pg_err)?;
        Ok(rows.iter().map(queued_from_row).collect())
    }

    async fn add_jobs(&self, jobs: Vec<Job>) -> Result<usize> {
        let jobs = &jobs;
        transaction!(self, true, |tx| {
            let mut created = 0;
            'jobs: for job in jobs {
                for s in &job.sources {
                    let free = tx
                        .query_opt(
                            "SELECT 1 FROM kiln_blocks
                             WHERE tenant = $1 AND partition = $2 AND id = $3 AND shard = $4
                               AND level = $5 AND job_id IS NULL
                             FOR UPDATE",
                            &[
                                &s.tenant,
                                &s.partition,
                                &s.id,
                                &i64::from(s.shard),
                                &i32::try_from(s.level).unwrap_or(i32::MAX),
                            ],
                        )
                        .await
                        .map_err(pg_err)?;
                    if s.tenant != job.tenant || free.is_none() {
                        continue 'jobs;
                    }
                }
                let job_id: i64 = tx
                    .query_one(
                        "INSERT INTO kiln_jobs (tenant, partition, shard, level, sources)
                         VALUES ($1, $2, $3, $4, $5) RETURNING id",
                        &[
                            &job.tenant,
                            &job.partition,
                            &i64::from(job.shard),
                            &i32::try_from(job.level).unwrap_or(i32::MAX),
                            &json(&job.sources),
                        ],
                    )
                    .await
                    .map_err(pg_err)?
                    .get(0);
                for s in &job.sources {
                    tx.execute(
                        "UPDATE kiln_blocks SET job_id = $4
                         WHERE tenant = $1 AND partition = $2 AND id = $3",
                        &[&s.tenant, &s.partition, &s.id, &job_id],
                    )
                    .await
                    .map_err(pg_err)?;
                }
                created += 1;
            }
            Ok(created)
        })
    }

    async fn lease_job(
        &self,
        owner: &str,
        now_ms: u64,
        lease_ms: u64,
        levels: std::ops::Range<u32>,
    ) -> Result<Option<Job>> {
        let level = |l: u32| i32::try_from(l).unwrap_or(i32::MAX);
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!(
                    "UPDATE kiln_jobs SET owner = $1, lease_expires_ms = $2,
                        attempts = attempts + 1
                     WHERE id = (
                        SELECT id FROM kiln_jobs
                        WHERE (owner = '' OR lease_expires_ms <= $3)
                            AND level >= $4 AND level < $5
                        ORDER BY level, id LIMIT 1 FOR UPDATE SKIP LOCKED)
                     RETURNING {JOB_COLUMNS}"
                ),
                &[
                    &owner,
                    &big(now_ms.saturating_add(lease_ms)),
                    &big(now_ms),
                    &level(levels.start),
                    &level(levels.end),
                ],
            )
            .await
            .map_err(pg_err)?;
        row.as_ref().map(job_from_row).transpose()
    }

    async fn complete_job(
        &self,
        job: &Job,
        owner: &str,
        outputs: Vec<BlockMeta>,
        now_ms: u64,
        delete_after_ms: u64,
    ) -> Result<()> {
        let job_id = big(job.id);
        let written = &outputs;
        transaction!(self, true, |tx| {
            let Some(row) = tx
                .query_opt(
                    &format!("SELECT {JOB_COLUMNS} FROM kiln_jobs WHERE id = $1 FOR UPDATE"),
                    &[&job_id],
                )
                .await
                .map_err(pg_err)?
            else {
                return Err(Error::LeaseLost { job: job.id });
            };
            let current = job_from_row(&row)?;
            if current.owner != owner {
                return Err(Error::LeaseLost { job: job.id });
            }
            let due = now_ms.saturating_add(delete_after_ms);
            for s in &current.sources {
                let Some(e) = Self::entry_ref(&tx, &current.tenant, &s.id, s.partition).await?
                else {
                    return Err(Error::Metastore(format!(
                        "source {} of job {} is gone",
                        s.id, job.id
                    )));
                };
                self.remove_entry(&tx, &e, due, true, false).await?;
            }
            Self::delete_job(&tx, job_id).await?;
            for b in written {
                if b.tenant != current.tenant {
                    return Err(Error::Metastore("output of another tenant".into()));
                }
                Self::insert_entry(&tx, b).await?;
            }
            Ok(())
        })?;
        super::cache_written(&self.cache, self.keeps_written(), outputs);
        Ok(())
    }

    async fn cancel_job(&self, job: &Job) -> Result<()> {
        let job_id = big(job.id);
        transaction!(self, true, |tx| { Self::delete_job(&tx, job_id).await })
    }

    async fn jobs(&self) -> Result<Vec<Job>> {
        let client = self.client().await?;
        let rows = client
            .query(
                &format!("SELECT {JOB_COLUMNS} FROM kiln_jobs ORDER BY id"),
                &[],
            )
            .await
            .map_err(pg_err)?;
        rows.iter().map(job_from_row).collect()
    }

    async fn drop_partitions(
        &self,
        tenant: &str,
        before_partition: i64,
        now_ms: u64,
        delete_after_ms: u64,
    ) -> Result<Removed> {
        let due = now_ms.saturating_add(delete_after_ms);
        transaction!(self, true, |tx| {
            self.remove_tenant_entries(&tx, tenant, Some(before_partition), due)
                .await
        })
    }

    async fn delete_tenant(
        &self,
        tenant: &str,
        now_ms: u64,
        delete_after_ms: u64,
    ) -> Result<Removed> {
        let due = now_ms.saturating_add(delete_after_ms);
        transaction!(self, true, |tx| {
            let mut removed = self.remove_tenant_entries(&tx, tenant, None, due).await?;
            let quarantined = tx
                .query(
                    "DELETE FROM kiln_quarantine WHERE tenant = $1 RETURNING id",
                    &[&tenant],
                )
                .await
                .map_err(pg_err)?;
            for r in quarantined {
                removed.entries += 1;
                removed.objects += usize::from(Self::release_object(&tx, r.get(0), due).await?);
            }
            Ok(removed)
        })
    }

    async fn due_tombstones(&self, now_ms: u64, limit: usize) -> Result<Vec<Tombstone>> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT id, path, due_ms FROM kiln_object_tombstones WHERE due_ms <= $1
                 ORDER BY due_ms, id LIMIT $2",
                &[&big(now_ms), &big(limit as u64)],
            )
            .await
            .map_err(pg_err)?;
        Ok(rows
            .iter()
            .map(|r| Tombstone {
                id: r.get(0),
                path: r.get(1),
                due_ms: unbig(r.get(2)),
            })
            .collect())
    }

    async fn forget_tombstones(&self, ids: &[String]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        transaction!(self, false, |tx| {
            tx.execute(
                "DELETE FROM kiln_object_tombstones WHERE id = ANY ($1)",
                &[&ids],
            )
            .await
            .map_err(pg_err)?;
            tx.execute(
                "DELETE FROM kiln_entry_tombstones WHERE id = ANY ($1)",
                &[&ids],
            )
            .await
            .map_err(pg_err)?;
            Ok(())
        })
    }

    async fn known_objects(&self) -> Result<HashSet<String>> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT id FROM kiln_objects UNION SELECT id FROM kiln_object_tombstones",
                &[],
            )
            .await
            .map_err(pg_err)?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn known_among(&self, ids: &[String]) -> Result<HashSet<String>> {
        if ids.is_empty() {
            return Ok(HashSet::new());
        }
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT id FROM kiln_objects WHERE id = ANY($1)
                 UNION SELECT id FROM kiln_object_tombstones WHERE id = ANY($1)",
                &[&ids],
            )
            .await
            .map_err(pg_err)?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn quarantine(&self, tenant: &str, id: &str, reason: &str, now_ms: u64) -> Result<bool> {
        transaction!(self, true, |tx| {
            let located = tx
                .query(
                    "SELECT partition, bytes, rows, job_id FROM kiln_blocks
                     WHERE tenant = $1 AND id = $2 ORDER BY partition FOR UPDATE",
                    &[&tenant, &id],
                )
                .await
                .map_err(pg_err)?;
            if located.is_empty() {
                return Ok(false);
            }
            let path: String = tx
                .query_opt("SELECT path FROM kiln_objects WHERE id = $1", &[&id])
                .await
                .map_err(pg_err)?
                .map(|r| r.get(0))
                .unwrap_or_default();
            for r in &located {
                let e = EntryRef {
                    tenant: tenant.to_owned(),
                    partition: r.get(0),
                    id: id.to_owned(),
                    bytes: r.get(1),
                    rows: r.get(2),
                };
                // The object keeps its reference, so it stays known (and kept) while listed.
                self.remove_entry(&tx, &e, 0, false, true).await?;
                // A job holding it gives its other sources back to the queue.
                if let Some(job_id) = r.get::<_, Option<i64>>(3) {
                    Self::delete_job(&tx, job_id).await?;
                }
                tx.execute(
                    "INSERT INTO kiln_quarantine (tenant, id, partition, path, reason, at_ms)
                     VALUES ($1, $2, $3, $4, $5, $6)
                     ON CONFLICT (tenant, id, partition) DO UPDATE SET
                        path = EXCLUDED.path, reason = EXCLUDED.reason, at_ms = EXCLUDED.at_ms",
                    &[&tenant, &id, &e.partition, &path, &reason, &big(now_ms)],
                )
                .await
                .map_err(pg_err)?;
            }
            Ok(true)
        })
    }

    async fn quarantined(&self, tenant: Option<&str>) -> Result<Vec<Quarantined>> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT tenant, id, partition, path, reason, at_ms FROM kiln_quarantine
                 WHERE $1::TEXT IS NULL OR tenant = $1 ORDER BY tenant, id, partition",
                &[&tenant],
            )
            .await
            .map_err(pg_err)?;
        Ok(rows
            .iter()
            .map(|r| Quarantined {
                tenant: r.get(0),
                id: r.get(1),
                partition: r.get(2),
                path: r.get(3),
                reason: r.get(4),
                at_ms: unbig(r.get(5)),
            })
            .collect())
    }

    async fn shrink(&self) -> Result<()> {
        // Plain VACUUM: dead rows' space is reused (and the tables' empty tails returned)
        // without the exclusive lock VACUUM FULL would take.
        let client = self.client().await?;
        client
            .batch_execute(
                "VACUUM (ANALYZE) kiln_blocks, kiln_partitions, kiln_objects,
                    kiln_object_tombstones, kiln_entry_tombstones, kiln_jobs, kiln_quarantine",
            )
            .await
            .map_err(pg_err)
    }
}

/// Whether a metastore URL names PostgreSQL.
pub fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metastore::conformance::{block_id, entry};
    use crate::testing::postgres_database;

    crate::metastore_conformance_suite!({
        let url = postgres_database().await;
        (
            Postgres::connect(&PostgresConfig::new(url)).await.unwrap(),
            (),
        )
    });

    const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

    /// Several processes starting at once migrate the schema once, and a second connection
    /// sees the first one's entries (state lives in the database, not the process).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn processes_share_one_database() {
        let url = postgres_database().await;
        let config = PostgresConfig::new(url);
        let (a, b) = tokio::join!(Postgres::connect(&config), Postgres::connect(&config));
        let (a, b) = (a.unwrap(), b.unwrap());
        let id = block_id(1, 1);
        let written = entry("t", &id, 0, 0, 5, 9, &[("s", CPU)]);
        a.add_blocks(vec![written.clone()]).await.unwrap();
        // The other process decodes it from the database: the same entry.
        let got = b.query_blocks(BlockQuery::all("t")).await.unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(*got[0], written);
        assert!(
            b.query_blocks(BlockQuery::all("other"))
                .await
                .unwrap()
                .is_empty()
        );
        let err = b
            .add_blocks(vec![entry("t", &id, 0, 0, 5, 9, &[("s", CPU)])])
            .await
            .unwrap_err();
        assert!(matches!(err, Error::BlockExists { .. }), "{err}");
    }

    /// Compactors racing for one queue: every job is leased to exactly one of them, and
    /// planners racing to claim the same blocks create each job once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_planners_and_compactors_never_share_work() {
        let url = postgres_database().await;
        let config = PostgresConfig::new(url);
        let m = Postgres::connect(&config).await.unwrap();
        let blocks: Vec<BlockMeta> = (0..40u128)
            .map(|n| entry("t", &block_id(1, n), 0, 0, 5, 9, &[("s", CPU)]))
            .collect();
        m.add_blocks(blocks).await.unwrap();
        let queued = m.queued_blocks().await.unwrap();
        let jobs: Vec<Job> = queued
            .chunks(4)
            .map(|c| Job {
                id: 0,
                tenant: "t".into(),
                partition: c[0].partition,
                shard: 0,
                level: 0,
                sources: c.to_vec(),
                owner: String::new(),
                lease_expires_ms: 0,
                attempts: 0,
            })
            .collect();
        // Four planners offer the same ten jobs at once.
        let planners = (0..4).map(|_| {
            let (m, jobs) = (m.clone(), jobs.clone());
            tokio::spawn(async move { m.add_jobs(jobs).await.unwrap() })
        });
        let created: usize = futures::future::join_all(planners)
            .await
            .into_iter()
            .map(|r| r.unwrap())
            .sum();
        assert_eq!(created, 10);
        // Four compactors lease until the queue is empty.
        let compactors = (0..4).map(|i| {
            let m = m.clone();
            tokio::spawn(async move {
                let mut mine = Vec::new();
                while let Some(job) = m
                    .lease_job(
                        &format!("c{i}"),
                        1_000,
                        60_000,
                        crate::compaction::ALL_LEVELS,
                    )
                    .await
                    .unwrap()
                {
                    mine.push(job.id);
                }
                mine
            })
        });
        let mut leased: Vec<u64> = futures::future::join_all(compactors)
            .await
            .into_iter()
            .flat_map(|r| r.unwrap())
            .collect();
        leased.sort_unstable();
        let mut all: Vec<u64> = m.jobs().await.unwrap().iter().map(|j| j.id).collect();
        all.sort_unstable();
        assert_eq!(leased, all, "each job leased exactly once");
    }

    /// Retention's DELETE plus VACUUM keeps the tables from growing across cycles of ingest
    /// and removal, as PostgreSQL reuses the space VACUUM frees.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn vacuum_keeps_tables_from_growing() {
        let url = postgres_database().await;
        let m = Postgres::connect(&PostgresConfig::new(url)).await.unwrap();
        let services: Vec<(String, &str)> = (0..40).map(|i| (format!("svc-{i}"), CPU)).collect();
        let series: Vec<(&str, &str)> = services.iter().map(|(s, p)| (s.as_str(), *p)).collect();
        let size = async || -> i64 {
            m.client()
                .await
                .unwrap()
                .query_one("SELECT pg_total_relation_size('kiln_blocks')", &[])
                .await
                .unwrap()
                .get(0)
        };
        let mut sizes = Vec::new();
        for cycle in 0..3u128 {
            for batch in 0..10u128 {
                let blocks = (0..100u128)
                    .map(|n| {
                        let id = block_id(1, cycle * 10_000 + batch * 100 + n);
                        entry("t", &id, 1, 0, 5, 9, &series)
                    })
                    .collect();
                m.add_blocks(blocks).await.unwrap();
            }
            sizes.push(size().await);
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
        }
        assert!(
            sizes[2] < sizes[0] * 3 / 2,
            "kiln_blocks grew across cycles: {sizes:?} bytes"
        );
        assert!(
            m.query_blocks(BlockQuery::all("t"))
                .await
                .unwrap()
                .is_empty()
        );
    }
}
