//! Recording rules where processes share a metastore (ADR 0021). State lives in PostgreSQL,
//! never in a process:
//!
//! - **Sums**: a compactor evaluates the tenant's rules on each level-0 job's outputs
//!   (`crate::server::recording::Recorder`); the metastore adds the sums in the transaction
//!   that registers the outputs (`kiln_recording_sums`). Each L0 segment is compacted once, so each acknowledged profile is
//!   counted once, whichever ingest process took it and whatever crashed.
//! - **Counters**: the holder of the [`RECORDING_LEASE`] seals due intervals into each tenant's
//!   counters ([`TenantState`], kept as `kiln_recording_state`), queues the points in
//!   `kiln_recording_outbox` and takes the sums it used off, in one transaction fenced by the
//!   lease's epoch.
//! - **Sending**: the holder posts the outbox in order and removes what the receiver took. A
//!   new holder resends what the last did not remove: the same time with the same value, which
//!   Prometheus accepts.
//! - **Pull**: any process answers the counters from `kiln_recording_state`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kiln_storage::Storage;
use kiln_storage::format::meta::BlockMeta;
use kiln_storage::metastore::{LeaseFence, OutboxPoint, RecordedSum};
use kiln_storage::query::{Aggregation, Exemplars, SampleFilter};

use super::remote_write::{self, Destination, Outcome, Sample};
use super::rules::CompiledRule;
use super::state::{Checkpoint, Contribution, Point, SeriesKey, TenantState};
use super::{MAX_SEAL_INTERVALS, Recording, TENANT_LABEL, internal, now_ms};
use crate::error::ApiError;
use crate::tenants::Tenants;

/// The cluster-wide lease whose holder seals every tenant's intervals and sends their points.
pub const RECORDING_LEASE: &str = "recording";

/// How long the lease lasts unless renewed (the holder renews it every second).
const LEASE_TTL: Duration = Duration::from_secs(15);

/// How long a compactor evaluates with a tenant's rules before reading them again: a rule
/// made or changed counts the level-0 jobs completed from at most this long after.
const RULES_TTL: Duration = Duration::from_secs(10);

/// Time allowed for a level-0 merge to run and commit, on top of the level's age, before
/// its intervals are sealed (later sums are late sums, counted in the next interval).
pub const MERGE_ALLOWANCE: Duration = Duration::from_secs(5);

/// Points read from the outbox at a time.
const OUTBOX_BATCH: usize = 2_000;

/// A tenant's compiled rules, with when they were read.
pub(super) type CachedRules = HashMap<String, (Instant, Arc<Vec<Arc<CompiledRule>>>)>;

/// The sums of `rules` over `outputs`, per rule, series and interval on the epoch's grid.
async fn job_sums(
    storage: &Storage,
    tenant: &str,
    rules: &[Arc<CompiledRule>],
    outputs: &[Arc<BlockMeta>],
    interval_ms: i64,
) -> kiln_storage::Result<Vec<RecordedSum>> {
    if rules.is_empty() || outputs.is_empty() {
        return Ok(Vec::new());
    }
    let min = outputs.iter().map(|b| b.min_time_nanos).min().unwrap_or(0);
    let max = outputs.iter().map(|b| b.max_time_nanos).max().unwrap_or(0);
    let step = interval_ms.saturating_mul(1_000_000);
    let start = min.div_euclid(step).saturating_mul(step);
    let end = (max.div_euclid(step).saturating_add(1)).saturating_mul(step);
    let engine = storage.query().over_blocks(outputs.to_vec());
    let mut sums = Vec::new();
    for rule in rules {
        let filter = SampleFilter {
            tenant: tenant.to_owned(),
            profile_type: rule.profile_type.clone(),
            selector: rule.selector.clone(),
            start_nanos: start,
            end_nanos: end,
            span_ids: Vec::new(),
            trace_ids: Vec::new(),
            profile_ids: Vec::new(),
        };
        let series = engine
            .select_series_of_stacks(
                &filter,
                &rule.rule.group_by,
                step,
                Aggregation::Sum,
                None,
                Exemplars::None,
                rule.frames.clone(),
            )
            .await?;
        for s in series {
            let encoded = encode_group(&s.labels);
            sums.extend(
                s.points
                    .into_iter()
                    .filter(|&(_, v)| v != 0.0)
                    .map(|(t, v)| RecordedSum {
                        rule: rule.rule.id.clone(),
                        series: encoded.clone(),
                        interval_ms: t,
                        value: v as i64,
                    }),
            );
        }
    }
    Ok(sums)
}

fn encode_group(group: &[(String, String)]) -> String {
    serde_json::to_string(group).unwrap_or_default()
}

fn decode_group(series: &str) -> Option<Vec<(String, String)>> {
    serde_json::from_str(series).ok()
}

impl Recording {
    /// The sums of a tenant's rules over a level-0 job's `outputs` (a cluster compactor's
    /// [`kiln_storage::compaction::JobRecorder`]).
    pub async fn job_sums(
        &self,
        storage: &Storage,
        tenants: &Tenants,
        tenant: &str,
        outputs: &[Arc<BlockMeta>],
    ) -> kiln_storage::Result<Vec<RecordedSum>> {
        let rules = self
            .cluster_rules(storage, tenants, tenant)
            .await
            .map_err(|e| {
                kiln_storage::Error::MetastoreUnavailable(format!("recording rules: {e}"))
            })?;
        job_sums(storage, tenant, &rules, outputs, self.interval_ms()).await
    }

    /// A tenant's compiled rules, read again after [`RULES_TTL`].
    pub(super) async fn cluster_rules(
        &self,
        storage: &Storage,
        tenants: &Tenants,
        tenant: &str,
    ) -> Result<Arc<Vec<Arc<CompiledRule>>>, ApiError> {
        if let Some((at, rules)) = self.cached_rules(tenant)
            && at.elapsed() < RULES_TTL
        {
            return Ok(rules);
        }
        let rules = self.compiled_rules(storage, tenants, tenant).await?;
        let rules = Arc::new(rules);
        self.cluster_rules
            .lock()
            .expect("recording rules cache")
            .insert(tenant.to_owned(), (Instant::now(), Arc::clone(&rules)));
        Ok(rules)
    }

    fn cached_rules(&self, tenant: &str) -> Option<(Instant, Arc<Vec<Arc<CompiledRule>>>)> {
        self.cluster_rules
            .lock()
            .expect("recording rules cache")
            .get(tenant)
            .cloned()
    }

    /// One round of the cluster's sealer: while this process holds [`RECORDING_LEASE`], seals
    /// every tenant's due intervals and sends the outbox.
    /// `lag`: how long after their time sums are committed (a level-0 job's wait and run),
    /// added to `--recording-delay`.
    pub async fn cluster_round(
        &self,
        storage: &Storage,
        tenants: &Tenants,
        client: &reqwest::Client,
        lag: Duration,
    ) {
        let holder = storage.compactor().owner().to_owned();
        let epoch = match storage
            .metastore()
            .hold_lease(RECORDING_LEASE, &holder, LEASE_TTL)
            .await
        {
            Ok(Some(epoch)) => epoch,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, "recording rules: the lease is not held");
                return;
            }
        };
        let fence = LeaseFence {
            name: RECORDING_LEASE.to_owned(),
            holder,
            epoch,
        };
        match storage.metastore().recording_tenants().await {
            Ok(all) => {
                for tenant in all {
                    if let Err(e) = self
                        .seal_cluster_tenant(storage, tenants, &tenant, &fence, lag)
                        .await
                    {
                        tracing::warn!(%tenant, error = %e, "recording rules: sealing failed; retried");
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "recording rules: no tenant list"),
        }
        if let Err(e) = self.send_outbox(storage, client).await {
            tracing::warn!(error = %e, "recording rules: the outbox is not read");
        }
    }

    /// Seals a tenant's due intervals from the committed sums: counters kept, points queued
    /// and sums taken off in one fenced transaction.
    async fn seal_cluster_tenant(
        &self,
        storage: &Storage,
        tenants: &Tenants,
        tenant: &str,
        fence: &LeaseFence,
        lag: Duration,
    ) -> Result<(), ApiError> {
        let metastore = storage.metastore();
        let interval = self.interval_ms();
        let now = now_ms();
        let (mut s, mut activations) = match metastore.recording_state(tenant).await? {
            Some(bytes) => {
                let mut c: Checkpoint =
                    serde_json::from_slice(&bytes).map_err(|e| internal("the state", e))?;
                let activations: BTreeMap<String, i64> =
                    std::mem::take(&mut c.activations).into_iter().collect();
                (TenantState::from_checkpoint(c, interval), activations)
            }
            None => (TenantState::new(interval, now), BTreeMap::new()),
        };
        let rules = self.cluster_rules(storage, tenants, tenant).await?;
        let ids: HashSet<&str> = rules.iter().map(|r| r.rule.id.as_str()).collect();
        s.retain_rules(|id| ids.contains(id));
        let known = activations.len();
        activations.retain(|id, _| ids.contains(id.as_str()));
        let mut changed = activations.len() != known;
        // A rule new to the state counts level-0 sums from an interval every compactor has
        // read it by; its backfill covers the time before, read from storage at that point.
        let from = s.interval_of(now + RULES_TTL.as_millis() as i64) + interval;
        for r in rules.iter() {
            if !activations.contains_key(&r.rule.id) {
                activations.insert(r.rule.id.clone(), from);
                changed = true;
            }
        }
        let delay = (self.config.delay + lag).as_millis() as i64;
        let mut through = s
            .due(now, delay)
            .unwrap_or(s.sealed_through())
            .min(s.sealed_through() + MAX_SEAL_INTERVALS * interval);
        // Sealing stops at the next activation, where that rule's backfill is read.
        if let Some(&next) = activations
            .values()
            .filter(|&&a| a > s.sealed_through())
            .min()
        {
            through = through.min(next);
        }
        let max_series = tenants.limits(tenant).max_recording_series;
        let mut points = Vec::new();
        for r in rules.iter() {
            if activations.get(&r.rule.id) == Some(&s.sealed_through()) && !s.start(&r.rule.id) {
                points.extend(
                    self.backfill(storage, tenant, r, &mut s, max_series, None)
                        .await?,
                );
                changed = true;
            }
        }
        let sums = if through > s.sealed_through() {
            metastore.recording_sums(tenant, through).await?
        } else {
            Vec::new()
        };
        // Sums of rules deleted since, and of intervals before a rule's activation (its
        // backfill counted them), are taken off uncounted.
        let contributions: Vec<Contribution> = sums
            .iter()
            .filter(|x| {
                activations
                    .get(&x.rule)
                    .is_some_and(|&a| x.interval_ms >= a)
            })
            .filter_map(|x| {
                Some(Contribution {
                    key: SeriesKey {
                        rule: x.rule.clone(),
                        group: decode_group(&x.series)?,
                    },
                    time_ms: x.interval_ms,
                    value: x.value,
                })
            })
            .collect();
        let added = s.add(&contributions, max_series);
        points.extend(s.seal(through));
        if points.is_empty() && sums.is_empty() && !changed {
            // Nothing counted, sent or started: the grid moves on at the next seal that has.
            return Ok(());
        }
        let outbox = self.outbox_points(tenants, tenant, &rules, &points);
        let mut checkpoint = s.checkpoint();
        checkpoint.activations = activations.into_iter().collect();
        let state = serde_json::to_vec(&checkpoint).map_err(|e| internal("the state", e))?;
        if metastore
            .commit_recording_seal(fence, tenant, &state, &sums, &outbox)
            .await?
        {
            let stats = &self.stats;
            stats.late.fetch_add(added.late as u64, Ordering::Relaxed);
            stats
                .series_refused
                .fetch_add(added.refused as u64, Ordering::Relaxed);
            stats
                .points_sealed
                .fetch_add(points.len() as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    /// The points as the outbox keeps them, for the tenant's receiver (none: the pull
    /// endpoint only).
    fn outbox_points(
        &self,
        tenants: &Tenants,
        tenant: &str,
        rules: &[Arc<CompiledRule>],
        points: &[Point],
    ) -> Vec<OutboxPoint> {
        let own = Some(tenants.limits(tenant).remote_write_url).filter(|u| !u.is_empty());
        let shared = own.is_none();
        let Some(url) = own.or_else(|| self.config.remote_write_url.clone()) else {
            return Vec::new();
        };
        super::samples_of(rules, points)
            .into_iter()
            .map(|mut s| {
                if shared {
                    s.labels.push((TENANT_LABEL.to_owned(), tenant.to_owned()));
                    s.labels.sort();
                }
                OutboxPoint {
                    seq: 0,
                    tenant: tenant.to_owned(),
                    destination: url.clone(),
                    labels: encode_group(&s.labels),
                    time_ms: s.timestamp_ms,
                    value: s.value as i64,
                }
            })
            .collect()
    }

    /// Posts the outbox, each destination's points in order; what a receiver took, or refused
    /// for good, leaves it. A destination that fails waits for the next round.
    async fn send_outbox(
        &self,
        storage: &Storage,
        client: &reqwest::Client,
    ) -> Result<(), ApiError> {
        let metastore = storage.metastore();
        let mut failed: HashSet<(String, String)> = HashSet::new();
        loop {
            let points = metastore.recording_outbox(OUTBOX_BATCH).await?;
            let full = points.len() == OUTBOX_BATCH;
            // Per destination and tenant, in the outbox's order.
            let mut groups: Vec<((String, String), Vec<OutboxPoint>)> = Vec::new();
            for p in points {
                let key = (p.destination.clone(), p.tenant.clone());
                match groups.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, g)) => g.push(p),
                    None => groups.push((key, vec![p])),
                }
            }
            let mut removed = Vec::new();
            for (key, group) in groups {
                if failed.contains(&key) {
                    continue;
                }
                let samples: Vec<Sample> = group
                    .iter()
                    .map(|p| Sample {
                        labels: decode_group(&p.labels).unwrap_or_default(),
                        timestamp_ms: p.time_ms,
                        value: p.value as f64,
                    })
                    .collect();
                let seqs = group.iter().map(|p| p.seq);
                let dest = Destination {
                    url: key.0.clone(),
                    tenant: key.1.clone(),
                };
                let body = remote_write::encode(&samples).map_err(|e| internal("encode", e))?;
                match remote_write::post(client, &dest, Bytes::from(body)).await {
                    Outcome::Sent => {
                        self.stats
                            .outbox_sent
                            .fetch_add(samples.len() as u64, Ordering::Relaxed);
                        removed.extend(seqs);
                    }
                    Outcome::Rejected { reason } | Outcome::Unreadable { reason } => {
                        tracing::warn!(tenant = %dest.tenant, url = %remote_write::redacted(&dest.url),
                            samples = samples.len(), %reason, "recording rules: points refused for good; dropped");
                        self.stats
                            .outbox_rejected
                            .fetch_add(samples.len() as u64, Ordering::Relaxed);
                        removed.extend(seqs);
                    }
                    Outcome::Retry { reason, .. } => {
                        tracing::debug!(tenant = %dest.tenant, url = %remote_write::redacted(&dest.url),
                            %reason, "recording rules: send failed; retried next round");
                        self.stats.outbox_failures.fetch_add(1, Ordering::Relaxed);
                        failed.insert(key);
                    }
                }
            }
            let progress = !removed.is_empty();
            metastore.remove_recording_outbox(&removed).await?;
            if !full || !progress {
                return Ok(());
            }
        }
    }

    /// The tenant's counters through their sealed point, from the metastore (any process).
    pub(super) async fn cluster_exposition(
        &self,
        storage: &Storage,
        tenants: &Tenants,
        tenant: &str,
    ) -> Result<String, ApiError> {
        let Some(bytes) = storage.metastore().recording_state(tenant).await? else {
            return Ok(String::new());
        };
        let c: Checkpoint = serde_json::from_slice(&bytes).map_err(|e| internal("the state", e))?;
        let rules = self.cluster_rules(storage, tenants, tenant).await?;
        let s = TenantState::from_checkpoint(c, self.interval_ms());
        Ok(super::counters_text(&rules, &s))
    }
}
