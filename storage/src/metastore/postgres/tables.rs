//! The schema and the statements over it: connecting and migrating, entries, objects, jobs and
//! tenants' rows, each change in one transaction.

use crate::metastore::{BlockMeta, LogCheckpoint, RecordedSum, Removed};
use crate::{Error, Result};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use super::*;

type Tx<'a> = deadpool_postgres::Transaction<'a>;

impl Postgres {
    /// Connects to the database at `config.url` and brings its schema up to date.
    pub async fn connect(config: &PostgresConfig) -> Result<Self> {
        let (url, tls) = super::tls::split_url(&config.url)?;
        let pg = tokio_postgres::Config::from_str(&url)
            .map_err(|e| Error::Config(format!("bad PostgreSQL URL: {e}")))?;
        let manager = Manager::from_config(
            pg,
            super::tls::connector(&tls)?,
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
            cache: crate::metastore::entry_cache(),
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

    pub(super) fn keeps_written(&self) -> bool {
        self.keep_written.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(super) async fn client(&self) -> Result<deadpool_postgres::Object> {
        self.pool.get().await.map_err(|e| match e {
            deadpool_postgres::PoolError::Backend(e) => pg_err(e),
            other => unavailable(format!("PostgreSQL: {other}")),
        })
    }

    /// Applies the migrations this database lacks, one process at a time.
    pub(super) async fn migrate(&self) -> Result<()> {
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

    pub(super) fn decode(
        &self,
        tenant: &str,
        id: &str,
        partition: i64,
        data: &[u8],
    ) -> Result<Arc<BlockMeta>> {
        crate::metastore::decode_cached(&self.cache, tenant, id, partition, data)
    }

    /// Adds recording sums to a tenant's (one statement; rows in key order, so two
    /// transactions adding at once lock them in one order).
    pub(super) async fn add_recording_sums(
        tx: &Tx<'_>,
        tenant: &str,
        sums: &[RecordedSum],
    ) -> Result<()> {
        if sums.is_empty() {
            return Ok(());
        }
        let mut sums = sums.to_vec();
        sums.sort_by(|a, b| {
            (&a.rule, &a.series, a.interval_ms).cmp(&(&b.rule, &b.series, b.interval_ms))
        });
        // One row per key: an upsert may not touch a row twice.
        sums.dedup_by(|b, a| {
            let same = (&a.rule, &a.series, a.interval_ms) == (&b.rule, &b.series, b.interval_ms);
            if same {
                a.value = a.value.saturating_add(b.value);
            }
            same
        });
        let rules: Vec<&str> = sums.iter().map(|s| s.rule.as_str()).collect();
        let series: Vec<&str> = sums.iter().map(|s| s.series.as_str()).collect();
        let intervals: Vec<i64> = sums.iter().map(|s| s.interval_ms).collect();
        let values: Vec<i64> = sums.iter().map(|s| s.value).collect();
        tx.execute(
            "INSERT INTO kiln_recording_sums (tenant, rule, series, interval_ms, value)
             SELECT $1, * FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[])
             ON CONFLICT (tenant, rule, series, interval_ms) DO UPDATE
                 SET value = kiln_recording_sums.value + EXCLUDED.value",
            &[&tenant, &rules, &series, &intervals, &values],
        )
        .await
        .map_err(pg_err)?;
        Ok(())
    }

    /// Adds one entry; refuses a duplicate or a compacted one.
    pub(super) async fn insert_entry(tx: &Tx<'_>, b: &BlockMeta) -> Result<()> {
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
                    services, profile_types, created_ms, bytes, rows, stack_nodes, entry,
                    arrived_ms)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14,
                    (extract(epoch FROM clock_timestamp()) * 1000)::bigint)
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
    pub(super) async fn remove_entry(
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
    pub(super) async fn release_object(tx: &Tx<'_>, id: &str, due_ms: u64) -> Result<bool> {
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
    pub(super) async fn entry_ref(
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
    pub(super) async fn delete_job(tx: &Tx<'_>, job_id: i64) -> Result<()> {
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
    pub(super) async fn remove_tenant_entries(
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
    pub(super) fn decode_rows(
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

impl Postgres {
    /// Takes the deletion locks of `tenants` (sorted, shared; a deletion takes its tenant's
    /// exclusively) and reads when each was last deleted.
    async fn deletions(tx: &Tx<'_>, tenants: &[&str]) -> Result<HashMap<String, u64>> {
        tx.execute(
            "SELECT pg_advisory_xact_lock_shared($1, hashtext(t))
             FROM unnest($2::TEXT[]) WITH ORDINALITY AS u(t, n) ORDER BY n",
            &[&DELETION_LOCK_CLASS, &tenants],
        )
        .await
        .map_err(pg_err)?;
        Ok(tx
            .query(
                "SELECT tenant, deleted_ms FROM kiln_tenant_deletions WHERE tenant = ANY ($1)",
                &[&tenants],
            )
            .await
            .map_err(pg_err)?
            .iter()
            .map(|r| (r.get(0), unbig(r.get(1))))
            .collect())
    }

    /// Registers `blocks` and records `checkpoint`, in one transaction.
    pub(super) async fn add(
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
        let tenants: Vec<&str> = {
            let mut t: Vec<&str> = blocks.iter().map(|b| b.tenant.as_str()).collect();
            t.dedup();
            t
        };
        let kept = transaction!(self, false, |tx| {
            // A checkpoint alone (no blocks) needs neither the locks nor the marks.
            let deleted = if tenants.is_empty() {
                HashMap::new()
            } else {
                Self::deletions(&tx, &tenants).await?
            };
            let mut kept = Vec::with_capacity(blocks.len());
            for b in &blocks {
                let refused = deleted
                    .get(&b.tenant)
                    .is_some_and(|&at| crate::metastore::received_by(b, at));
                if !refused {
                    Self::insert_entry(&tx, b).await?;
                }
                kept.push(!refused);
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
            Ok(kept)
        })?;
        let blocks = crate::metastore::registered(blocks, &kept);
        crate::metastore::cache_written(&self.cache, self.keeps_written(), blocks);
        Ok(())
    }
}
