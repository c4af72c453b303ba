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

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio_postgres::error::SqlState;

use crate::metastore::{Job, QueuedBlock};
use crate::{Error, Result};

/// Schema migrations, applied in order; each runs once per database.
const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("postgres/0001_init.sql")),
    (2, include_str!("postgres/0002_log_checkpoints.sql")),
    (3, include_str!("postgres/0003_members.sql")),
    (4, include_str!("postgres/0004_active_series.sql")),
    (5, include_str!("postgres/0005_sessions.sql")),
    (6, include_str!("postgres/0006_compaction_leases.sql")),
    (7, include_str!("postgres/0007_usage.sql")),
    (8, include_str!("postgres/0008_recording.sql")),
    (9, include_str!("postgres/0009_tenant_deletions.sql")),
    (10, include_str!("postgres/0010_throttled.sql")),
];

/// Advisory lock keys (arbitrary, fixed): migrations, and changes that remove entries.
const MIGRATION_LOCK: i64 = 0x6b69_6c6e_0001;
const REMOVAL_LOCK: i64 = 0x6b69_6c6e_0002;
/// The class of the per-tenant advisory locks that serialize a tenant's series admissions
/// (`pg_advisory_xact_lock(class, hashtext(tenant))`).
const SERIES_LOCK_CLASS: i32 = 0x6b69_0003;
/// The class of the per-tenant advisory locks between a tenant's deletion (exclusive) and the
/// registration of its new entries (shared): a registration sees the deletion, or the deletion
/// sees what it registered.
const DELETION_LOCK_CLASS: i32 = 0x6b69_0004;

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
    cache: crate::metastore::EntryCache,
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
        // No SQLSTATE: the connection failed or closed; its causes say why (a refused TLS
        // certificate, say).
        let mut message = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            message = format!("{message}: {cause}");
            source = cause.source();
        }
        return unavailable(message);
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
    "tenant, id, partition, shard, level, created_ms, bytes, rows, stack_nodes, arrived_ms";

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
        arrived_ms: unbig(r.get(9)),
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

/// Whether a metastore URL names PostgreSQL.
pub fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

mod handle;
mod tables;
pub mod tls;

#[cfg(test)]
mod tests;
