//! The [`Metastore`] implementation on [`Postgres`]: each call one transaction (or one
//! statement), retried on conflicts.

use crate::metastore::{
    BlockMeta, BlockQuery, Job, LeaseFence, LogCheckpoint, Member, Metastore, OutboxPoint,
    PartitionStats, Quarantined, QueuedBlock, RecordedSum, Removed, ThrottledMinute, Tombstone,
    UsageCount,
};
use crate::{Error, Result};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use super::*;

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

/// Marks a tenant's series (`$1` tenant, `$2` hashes) seen now, adding those not there.
const SEEN_SERIES: &str = "INSERT INTO kiln_active_series (tenant, hash)
     SELECT DISTINCT $1, h FROM unnest($2::BIGINT[]) AS h
     ON CONFLICT (tenant, hash) DO UPDATE SET last_seen = now()";

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
        self.complete_job_recorded(job, owner, outputs, &[], now_ms, delete_after_ms)
            .await
    }

    async fn complete_job_recorded(
        &self,
        job: &Job,
        owner: &str,
        outputs: Vec<BlockMeta>,
        sums: &[RecordedSum],
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
            if current.owner != owner || current.attempts != job.attempts {
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
            Self::add_recording_sums(&tx, &current.tenant, sums).await?;
            Ok(())
        })?;
        crate::metastore::cache_written(&self.cache, self.keeps_written(), outputs);
        Ok(())
    }

    async fn renew_job(&self, job: &Job, owner: &str, now_ms: u64, lease_ms: u64) -> Result<bool> {
        let client = self.client().await?;
        let renewed = client
            .execute(
                "UPDATE kiln_jobs SET lease_expires_ms = $4
                 WHERE id = $1 AND owner = $2 AND attempts = $3",
                &[
                    &big(job.id),
                    &owner,
                    &i32::try_from(job.attempts).unwrap_or(i32::MAX),
                    &big(now_ms.saturating_add(lease_ms)),
                ],
            )
            .await
            .map_err(pg_err)?;
        Ok(renewed == 1)
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
            // Waits for registrations of the tenant under way; later ones read the mark.
            tx.execute(
                "SELECT pg_advisory_xact_lock($1, hashtext($2))",
                &[&DELETION_LOCK_CLASS, &tenant],
            )
            .await
            .map_err(pg_err)?;
            tx.execute(
                "INSERT INTO kiln_tenant_deletions (tenant, deleted_ms) VALUES ($1, $2)
                 ON CONFLICT (tenant) DO UPDATE
                 SET deleted_ms = GREATEST(kiln_tenant_deletions.deleted_ms, EXCLUDED.deleted_ms)",
                &[&tenant, &big(now_ms)],
            )
            .await
            .map_err(pg_err)?;
            let mut removed = self.remove_tenant_entries(&tx, tenant, None, due).await?;
            // Its series counts, sessions, usage and recording rules' sums and counters go with it.
            for table in [
                "kiln_active_series",
                "kiln_sessions",
                "kiln_usage",
                "kiln_throttled",
                "kiln_recording_sums",
                "kiln_recording_state",
                "kiln_recording_outbox",
            ] {
                tx.execute(
                    &format!("DELETE FROM {table} WHERE tenant = $1"),
                    &[&tenant],
                )
                .await
                .map_err(pg_err)?;
            }
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

    async fn hold_lease(&self, name: &str, holder: &str, ttl: Duration) -> Result<Option<u64>> {
        let client = self.client().await?;
        // One statement on the database's clock: taken when free or expired (the epoch moves
        // on), renewed by its holder (the epoch stays), left alone otherwise (no row back).
        let row = client
            .query_opt(
                "INSERT INTO kiln_leases (name, holder, epoch, expires)
                 VALUES ($1, $2, 1, now() + make_interval(secs => $3))
                 ON CONFLICT (name) DO UPDATE SET
                     holder = EXCLUDED.holder,
                     epoch = kiln_leases.epoch
                         + CASE WHEN kiln_leases.holder = EXCLUDED.holder THEN 0 ELSE 1 END,
                     expires = EXCLUDED.expires
                 WHERE kiln_leases.holder = EXCLUDED.holder OR kiln_leases.expires <= now()
                 RETURNING epoch",
                &[&name, &holder, &ttl.as_secs_f64()],
            )
            .await
            .map_err(pg_err)?;
        Ok(row.map(|r| unbig(r.get(0))))
    }

    async fn recording_tenants(&self) -> Result<Vec<String>> {
        let rows = self
            .client()
            .await?
            .query(
                "SELECT DISTINCT tenant FROM kiln_recording_sums
                 UNION SELECT tenant FROM kiln_recording_state ORDER BY 1",
                &[],
            )
            .await
            .map_err(pg_err)?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn recording_sums(&self, tenant: &str, before_ms: i64) -> Result<Vec<RecordedSum>> {
        let rows = self
            .client()
            .await?
            .query(
                "SELECT rule, series, interval_ms, value FROM kiln_recording_sums
                 WHERE tenant = $1 AND interval_ms < $2",
                &[&tenant, &before_ms],
            )
            .await
            .map_err(pg_err)?;
        Ok(rows
            .iter()
            .map(|r| RecordedSum {
                rule: r.get(0),
                series: r.get(1),
                interval_ms: r.get(2),
                value: r.get(3),
            })
            .collect())
    }

    async fn recording_state(&self, tenant: &str) -> Result<Option<Vec<u8>>> {
        let row = self
            .client()
            .await?
            .query_opt(
                "SELECT state FROM kiln_recording_state WHERE tenant = $1",
                &[&tenant],
            )
            .await
            .map_err(pg_err)?;
        Ok(row.map(|r| r.get(0)))
    }

    async fn commit_recording_seal(
        &self,
        fence: &LeaseFence,
        tenant: &str,
        state: &[u8],
        consumed: &[RecordedSum],
        points: &[OutboxPoint],
    ) -> Result<bool> {
        transaction!(self, true, |tx| {
            // The lease row is locked for the transaction: it cannot change hands before the
            // commit, and a holder whose lease moved on commits nothing.
            let held = tx
                .query_opt(
                    "SELECT 1 FROM kiln_leases
                     WHERE name = $1 AND holder = $2 AND epoch = $3 AND expires > now()
                     FOR UPDATE",
                    &[&fence.name, &fence.holder, &big(fence.epoch)],
                )
                .await
                .map_err(pg_err)?;
            if held.is_none() {
                return Ok(false);
            }
            tx.execute(
                "INSERT INTO kiln_recording_state (tenant, state) VALUES ($1, $2)
                 ON CONFLICT (tenant) DO UPDATE SET state = EXCLUDED.state",
                &[&tenant, &state],
            )
            .await
            .map_err(pg_err)?;
            // Taken off, not deleted: sums a job added since they were read stay.
            let negated: Vec<RecordedSum> = consumed
                .iter()
                .map(|c| RecordedSum {
                    value: c.value.saturating_neg(),
                    ..c.clone()
                })
                .collect();
            Self::add_recording_sums(&tx, tenant, &negated).await?;
            tx.execute(
                "DELETE FROM kiln_recording_sums WHERE tenant = $1 AND value = 0",
                &[&tenant],
            )
            .await
            .map_err(pg_err)?;
            if !points.is_empty() {
                let destinations: Vec<&str> =
                    points.iter().map(|p| p.destination.as_str()).collect();
                let labels: Vec<&str> = points.iter().map(|p| p.labels.as_str()).collect();
                let times: Vec<i64> = points.iter().map(|p| p.time_ms).collect();
                let values: Vec<i64> = points.iter().map(|p| p.value).collect();
                tx.execute(
                    "INSERT INTO kiln_recording_outbox (tenant, destination, labels, time_ms, value)
                     SELECT $1, d, l, t, v
                     FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[])
                         WITH ORDINALITY AS p(d, l, t, v, n)
                     ORDER BY n",
                    &[&tenant, &destinations, &labels, &times, &values],
                )
                .await
                .map_err(pg_err)?;
            }
            Ok(true)
        })
    }

    async fn recording_outbox(&self, limit: usize) -> Result<Vec<OutboxPoint>> {
        let rows = self
            .client()
            .await?
            .query(
                "SELECT seq, tenant, destination, labels, time_ms, value
                 FROM kiln_recording_outbox ORDER BY seq LIMIT $1",
                &[&(limit as i64)],
            )
            .await
            .map_err(pg_err)?;
        Ok(rows
            .iter()
            .map(|r| OutboxPoint {
                seq: r.get(0),
                tenant: r.get(1),
                destination: r.get(2),
                labels: r.get(3),
                time_ms: r.get(4),
                value: r.get(5),
            })
            .collect())
    }

    async fn remove_recording_outbox(&self, seqs: &[i64]) -> Result<()> {
        if seqs.is_empty() {
            return Ok(());
        }
        self.client()
            .await?
            .execute(
                "DELETE FROM kiln_recording_outbox WHERE seq = ANY($1)",
                &[&seqs],
            )
            .await
            .map_err(pg_err)?;
        Ok(())
    }

    async fn add_usage(&self, counts: &[UsageCount]) -> Result<()> {
        if counts.is_empty() {
            return Ok(());
        }
        // In key order, so two processes adding at once take the rows' locks in one order.
        let mut counts = counts.to_vec();
        counts.sort_by(|a, b| (&a.tenant, &a.counter).cmp(&(&b.tenant, &b.counter)));
        let tenants: Vec<&str> = counts.iter().map(|c| c.tenant.as_str()).collect();
        let counters: Vec<&str> = counts.iter().map(|c| c.counter.as_str()).collect();
        let values: Vec<i64> = counts.iter().map(|c| big(c.value)).collect();
        self.client()
            .await?
            .execute(
                "INSERT INTO kiln_usage (tenant, counter, value)
                 SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])
                 ON CONFLICT (tenant, counter) DO UPDATE
                     SET value = kiln_usage.value + EXCLUDED.value",
                &[&tenants, &counters, &values],
            )
            .await
            .map_err(pg_err)?;
        Ok(())
    }

    async fn add_throttled(&self, minutes: &[ThrottledMinute]) -> Result<()> {
        let Some(newest) = minutes.iter().map(|m| m.minute_ms).max() else {
            return Ok(());
        };
        // In key order, so two processes adding at once take the rows' locks in one order.
        let mut minutes = minutes.to_vec();
        minutes.sort_by(|a, b| (&a.tenant, a.minute_ms).cmp(&(&b.tenant, b.minute_ms)));
        let tenants: Vec<&str> = minutes.iter().map(|m| m.tenant.as_str()).collect();
        let at: Vec<i64> = minutes.iter().map(|m| m.minute_ms).collect();
        let refused: Vec<i64> = minutes.iter().map(|m| big(m.refused)).collect();
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO kiln_throttled (tenant, minute_ms, refused)
                 SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[])
                 ON CONFLICT (tenant, minute_ms) DO UPDATE
                     SET refused = kiln_throttled.refused + EXCLUDED.refused",
                &[&tenants, &at, &refused],
            )
            .await
            .map_err(pg_err)?;
        client
            .execute(
                "DELETE FROM kiln_throttled WHERE minute_ms < $1",
                &[&(newest - crate::metastore::THROTTLED_KEPT_MS)],
            )
            .await
            .map_err(pg_err)?;
        Ok(())
    }

    async fn throttled(
        &self,
        tenant: &str,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Option<Vec<(i64, u64)>>> {
        let rows = self
            .client()
            .await?
            .query(
                "SELECT minute_ms, refused FROM kiln_throttled
                 WHERE tenant = $1 AND minute_ms BETWEEN $2 AND $3 ORDER BY minute_ms",
                &[&tenant, &from_ms, &to_ms],
            )
            .await
            .map_err(pg_err)?;
        Ok(Some(
            rows.iter()
                .map(|r| (r.get::<_, i64>(0), unbig(r.get(1))))
                .collect(),
        ))
    }

    async fn usage(&self, tenant: &str) -> Result<Option<BTreeMap<String, u64>>> {
        let rows = self
            .client()
            .await?
            .query(
                "SELECT counter, value FROM kiln_usage WHERE tenant = $1",
                &[&tenant],
            )
            .await
            .map_err(pg_err)?;
        Ok(Some(
            rows.iter()
                .map(|r| (r.get::<_, String>(0), unbig(r.get(1))))
                .collect(),
        ))
    }

    async fn ping(&self) -> Result<()> {
        self.client()
            .await?
            .execute("SELECT 1", &[])
            .await
            .map_err(pg_err)?;
        Ok(())
    }

    async fn release_lease(&self, name: &str, holder: &str) -> Result<()> {
        self.client()
            .await?
            .execute(
                "DELETE FROM kiln_leases WHERE name = $1 AND holder = $2",
                &[&name, &holder],
            )
            .await
            .map_err(pg_err)?;
        Ok(())
    }

    async fn heartbeat(&self, me: &Member, timeout: Duration) -> Result<Vec<Member>> {
        let client = self.client().await?;
        let secs = timeout.as_secs_f64();
        // One statement: the upsert and the reading of who is alive see one clock, the
        // database's, so hosts whose clocks differ agree on who is alive. The reading sees the
        // table as it was before the upsert, so `me` comes from the upsert.
        let rows = client
            .query(
                "WITH me AS (
                     INSERT INTO kiln_members (id, roles) VALUES ($1, $2)
                     ON CONFLICT (id) DO UPDATE
                         SET roles = $2, heartbeat = now(), leaving = false
                     RETURNING id, roles
                 )
                 SELECT id, roles FROM me
                 UNION
                 SELECT id, roles FROM kiln_members
                 WHERE id <> $1 AND NOT leaving
                   AND heartbeat > now() - make_interval(secs => $3)
                 ORDER BY id",
                &[&me.id, &me.roles, &secs],
            )
            .await
            .map_err(pg_err)?;
        // The dead of long ago are forgotten.
        client
            .execute(
                "DELETE FROM kiln_members WHERE heartbeat < now() - interval '1 day'",
                &[],
            )
            .await
            .map_err(pg_err)?;
        Ok(rows
            .iter()
            .map(|r| Member {
                id: r.get(0),
                roles: r.get(1),
            })
            .collect())
    }

    fn shared(&self) -> bool {
        true
    }

    async fn admit_series(
        &self,
        tenant: &str,
        hashes: &[u64],
        max: usize,
        window: Duration,
    ) -> Result<bool> {
        let hashes: Vec<i64> = hashes.iter().map(|h| *h as i64).collect();
        let secs = window.as_secs_f64();
        let max = max as i64;
        transaction!(self, false, |tx| {
            tx.execute(
                "SELECT pg_advisory_xact_lock($1, hashtext($2))",
                &[&SERIES_LOCK_CLASS, &tenant],
            )
            .await
            .map_err(pg_err)?;
            if max > 0 {
                // Under the tenant's lock: the series active now, and how many of these are not.
                let row = tx
                    .query_one(
                        "SELECT
                             (SELECT count(*) FROM kiln_active_series
                              WHERE tenant = $1 AND last_seen > now() - make_interval(secs => $3)),
                             (SELECT count(DISTINCT g.hash) FROM unnest($2::BIGINT[]) AS g(hash)
                              WHERE NOT EXISTS (
                                  SELECT 1 FROM kiln_active_series s
                                  WHERE s.tenant = $1 AND s.hash = g.hash
                                    AND s.last_seen > now() - make_interval(secs => $3)))",
                        &[&tenant, &hashes, &secs],
                    )
                    .await
                    .map_err(pg_err)?;
                let (active, new): (i64, i64) = (row.get(0), row.get(1));
                if new > 0 && active + new > max {
                    return Ok(false);
                }
            }
            tx.execute(SEEN_SERIES, &[&tenant, &hashes])
                .await
                .map_err(pg_err)?;
            // Series quiet past the window no longer count: their rows go.
            tx.execute(
                "DELETE FROM kiln_active_series
                 WHERE tenant = $1 AND last_seen < now() - make_interval(secs => $2)",
                &[&tenant, &secs],
            )
            .await
            .map_err(pg_err)?;
            Ok(true)
        })
    }

    async fn touch_series(&self, tenant: &str, hashes: &[u64]) -> Result<()> {
        let hashes: Vec<i64> = hashes.iter().map(|h| *h as i64).collect();
        let client = self.client().await?;
        client
            .execute(SEEN_SERIES, &[&tenant, &hashes])
            .await
            .map_err(pg_err)?;
        Ok(())
    }

    async fn put_session(
        &self,
        tenant: &str,
        key: &str,
        value: Vec<u8>,
        ttl: Duration,
    ) -> Result<()> {
        let client = self.client().await?;
        let secs = ttl.as_secs_f64();
        client
            .execute(
                "INSERT INTO kiln_sessions (tenant, key, value, expires)
                 VALUES ($1, $2, $3, now() + make_interval(secs => $4))
                 ON CONFLICT (tenant, key) DO UPDATE
                     SET value = $3, expires = now() + make_interval(secs => $4)",
                &[&tenant, &key, &value, &secs],
            )
            .await
            .map_err(pg_err)?;
        // The tenant's expired sessions go as it writes new ones.
        client
            .execute(
                "DELETE FROM kiln_sessions WHERE tenant = $1 AND expires < now()",
                &[&tenant],
            )
            .await
            .map_err(pg_err)?;
        Ok(())
    }

    async fn claim_session(
        &self,
        tenant: &str,
        key: &str,
        value: Vec<u8>,
        ttl: Duration,
    ) -> Result<bool> {
        let client = self.client().await?;
        let secs = ttl.as_secs_f64();
        // A row comes back where this statement inserted, or replaced an expired session.
        let row = client
            .query_opt(
                "INSERT INTO kiln_sessions (tenant, key, value, expires)
                 VALUES ($1, $2, $3, now() + make_interval(secs => $4))
                 ON CONFLICT (tenant, key) DO UPDATE
                     SET value = $3, expires = now() + make_interval(secs => $4)
                     WHERE kiln_sessions.expires <= now()
                 RETURNING 1",
                &[&tenant, &key, &value, &secs],
            )
            .await
            .map_err(pg_err)?;
        Ok(row.is_some())
    }

    async fn get_session(&self, tenant: &str, key: &str) -> Result<Option<Vec<u8>>> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT value FROM kiln_sessions
                 WHERE tenant = $1 AND key = $2 AND expires > now()",
                &[&tenant, &key],
            )
            .await
            .map_err(pg_err)?;
        Ok(row.map(|r| r.get(0)))
    }

    async fn take_session(&self, tenant: &str, key: &str) -> Result<Option<Vec<u8>>> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "DELETE FROM kiln_sessions WHERE tenant = $1 AND key = $2
                 RETURNING value, expires > now()",
                &[&tenant, &key],
            )
            .await
            .map_err(pg_err)?;
        Ok(row.filter(|r| r.get::<_, bool>(1)).map(|r| r.get(0)))
    }

    async fn sessions(&self, tenant: &str, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT key, value FROM kiln_sessions
                 WHERE tenant = $1 AND starts_with(key, $2) AND expires > now()
                 ORDER BY key",
                &[&tenant, &prefix],
            )
            .await
            .map_err(pg_err)?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    async fn leave(&self, id: &str) -> Result<()> {
        let client = self.client().await?;
        client
            .execute(
                "UPDATE kiln_members SET leaving = true WHERE id = $1",
                &[&id],
            )
            .await
            .map_err(pg_err)?;
        Ok(())
    }
}
