//! Recording rules: metrics from profiles (ADR 0015). Rules are kept per tenant (`rules`),
//! evaluated on every profile the write path stores, and added once it is acknowledged
//! (`state`); each interval is sealed into counter samples, which are sent with Prometheus
//! remote write through a bounded on-disk queue (`remote_write`) and answered on the pull
//! endpoint.
//!
//! Exactly once: a write holds its tenant's gate shared from evaluation until its sums are
//! added, and loading or changing rules holds it exclusively. So the sums of the intervals not
//! yet sealed are either in memory (added after the write) or in storage (written before the
//! gate was taken): at start-up and when a rule is made they are read back from the stored
//! profiles ([`Recording::load`]). What sealing made of them (the counters) and the late sums
//! are kept in the tenant document [`STATE_DOCUMENT`], written after the sealed points are in
//! the queue and, for late sums, before the write is acknowledged.
//!
//! A new rule's backfill (up to 7 days of stored profiles) is read before the gate is taken, so
//! the tenant's writes go on meanwhile. A write older than the backfill's end that comes
//! meanwhile may be missing from what was read: the backfill is then read again under the gate.

pub mod cluster;
pub mod remote_write;
pub mod rules;
pub mod state;

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use kiln_otel::model::NormalizedProfile;
use kiln_otel::normalize::kernel::unsymbolized_name;
use kiln_storage::Storage;
use kiln_storage::query::{Aggregation, Exemplars, SampleFilter};
use tokio::sync::{OwnedRwLockReadGuard, RwLock};

use crate::error::{ApiError, ErrorKind};
use crate::tenants::Tenants;
use remote_write::{Destination, RemoteWriteQueue, Sample};
use rules::{CompiledRule, RULES_DOCUMENT, Rule};
use state::{Checkpoint, Contribution, Point, SeriesKey, TenantState};

/// The tenant document of the counters and late sums.
pub const STATE_DOCUMENT: &str = "recording-state.json";

/// The longest backfill a rule may have (`--recording-backfill`, `Kiln-Backfill`).
pub const MAX_BACKFILL: Duration = Duration::from_secs(7 * 86_400);

/// Most intervals one sealing pass seals (an hour of 15 s intervals).
const MAX_SEAL_INTERVALS: i64 = 240;

/// A state document sealed longer ago than this is not resumed (its grid restarts now).
const MAX_RESUME_MS: i64 = 7 * 86_400_000;

/// Where the remote-write queue keeps its batches.
pub fn queue_dir(data_dir: &std::path::Path) -> std::path::PathBuf {
    data_dir.join("recording").join("remote-write")
}

/// The label naming the tenant of every series sent to the shared `--remote-write-url`.
pub const TENANT_LABEL: &str = "kiln_tenant";

/// The label naming the rule of every output series (Pyroscope's).
pub const RULE_ID_LABEL: &str = "profiles_rule_id";

/// How rules are evaluated and where their samples go (`kiln serve` flags).
#[derive(Debug, Clone)]
pub struct RecordingConfig {
    /// The length of an interval: one point per series each.
    pub interval: Duration,
    /// How long after its end an interval is sealed (profiles arrive after their time).
    pub delay: Duration,
    /// Where samples go for tenants without a `remote_write_url` of their own.
    pub remote_write_url: Option<String>,
    /// How far back a new rule is evaluated from stored profiles.
    pub backfill: Duration,
}

impl Default for RecordingConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(15),
            delay: Duration::from_secs(30),
            remote_write_url: None,
            backfill: Duration::from_secs(3600),
        }
    }
}

/// Counts of what evaluation did.
#[derive(Debug, Default)]
pub struct RecordingStats {
    /// Profile samples added to rule series.
    pub samples_recorded: AtomicU64,
    /// Contributions to already sealed intervals, carried into the next one.
    pub late: AtomicU64,
    /// Contributions refused because the tenant's output series are at their cap.
    pub series_refused: AtomicU64,
    /// New rules' backfills read again under the gate, because a write older than their end
    /// came while they were read ahead.
    pub backfills_reread: AtomicU64,
    /// Points sealed (sent or answered on the pull endpoint).
    pub points_sealed: AtomicU64,
    /// In a cluster: samples of the outbox the receiver took, refused for good, and failed
    /// sends (retried).
    pub outbox_sent: AtomicU64,
    pub outbox_rejected: AtomicU64,
    pub outbox_failures: AtomicU64,
}

/// A tenant's rules and series.
#[derive(Debug)]
struct TenantRecording {
    /// Shared by writes from evaluation to commit; exclusive while rules load or change.
    /// `None` until loaded.
    gate: Arc<RwLock<Option<Arc<Vec<Arc<CompiledRule>>>>>>,
    state: tokio::sync::Mutex<Option<TenantState>>,
    /// Changes of the state the document must keep (late sums, seals), numbered under the
    /// state's lock.
    changes: AtomicU64,
    /// The last change the document keeps, and the one writer of it: writers wait here, and
    /// one document write covers every change made before it (group commit).
    kept: tokio::sync::Mutex<u64>,
    /// One load of the tenant's rules at a time (a load reads backfills before taking the gate).
    loading: tokio::sync::Mutex<()>,
    /// While a backfill is read ahead: its end. Writes with a time before it count in
    /// `late_writes`, and make the backfill be read again under the gate.
    watch_below_ms: AtomicI64,
    late_writes: AtomicU64,
    /// The latest time of a write with unnamed native frames while the tenant has function
    /// rules: until it is sealed, sealing reads those rules' open sums back from storage.
    native_until_ms: AtomicI64,
}

/// New rules' backfill sums read before the gate is taken ([`Recording::read_ahead`]).
struct AheadBackfills {
    /// The sealed point the sums were read up to.
    end_ms: i64,
    /// `late_writes` when the reading began: the sums stand only if it is unchanged.
    late_writes: u64,
    /// By rule id: the rule as read and its sums.
    sums: HashMap<String, (Rule, Vec<(SeriesKey, i64, i64)>)>,
}

/// Recording rules of every tenant this process writes for.
#[derive(Debug)]
pub struct Recording {
    config: RecordingConfig,
    tenants: Mutex<HashMap<String, Arc<TenantRecording>>>,
    queue: Option<Arc<RemoteWriteQueue>>,
    pub stats: RecordingStats,
    /// In a cluster: tenants' compiled rules as last read ([`cluster`]).
    cluster_rules: Mutex<cluster::CachedRules>,
    /// Lets tests hold backfills in their read-ahead phase.
    #[doc(hidden)]
    pub read_ahead_pause: ReadAheadPause,
}

/// A test's hold on backfills read ahead: each one notifies `reached`, then waits while
/// `release` is held exclusively.
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct ReadAheadPause {
    pub reached: tokio::sync::Notify,
    pub release: RwLock<()>,
}

/// A write under way: the rules it was evaluated with, held until its sums are added.
pub struct Evaluation {
    tenant: Arc<TenantRecording>,
    rules: OwnedRwLockReadGuard<Option<Arc<Vec<Arc<CompiledRule>>>>>,
    contributions: Vec<Contribution>,
    samples: u64,
}

fn internal(what: &str, e: impl std::fmt::Display) -> ApiError {
    ApiError::internal(format!("recording rules: {what}: {e}"))
}

impl Recording {
    /// Rules evaluated with `config`; sealed points are queued in `queue` (none: only the pull
    /// endpoint answers them).
    pub fn new(config: RecordingConfig, queue: Option<Arc<RemoteWriteQueue>>) -> Self {
        Self {
            config,
            tenants: Mutex::new(HashMap::new()),
            queue,
            stats: RecordingStats::default(),
            cluster_rules: Mutex::new(HashMap::new()),
            read_ahead_pause: ReadAheadPause::default(),
        }
    }

    /// The queue of samples for remote write, when there is one.
    pub fn queue(&self) -> Option<&Arc<RemoteWriteQueue>> {
        self.queue.as_ref()
    }

    /// The configuration.
    pub fn config(&self) -> &RecordingConfig {
        &self.config
    }

    fn interval_ms(&self) -> i64 {
        (self.config.interval.as_millis() as i64).max(1)
    }

    fn tenant(&self, tenant: &str) -> Arc<TenantRecording> {
        let mut all = self.tenants.lock().expect("recording tenants");
        Arc::clone(all.entry(tenant.to_owned()).or_insert_with(|| {
            Arc::new(TenantRecording {
                gate: Arc::new(RwLock::new(None)),
                state: tokio::sync::Mutex::new(None),
                changes: AtomicU64::new(0),
                kept: tokio::sync::Mutex::new(0),
                loading: tokio::sync::Mutex::new(()),
                watch_below_ms: AtomicI64::new(i64::MIN),
                late_writes: AtomicU64::new(0),
                native_until_ms: AtomicI64::new(i64::MIN),
            })
        }))
    }

    fn loaded_tenants(&self) -> Vec<(String, Arc<TenantRecording>)> {
        let all = self.tenants.lock().expect("recording tenants");
        all.iter()
            .map(|(k, v)| (k.clone(), Arc::clone(v)))
            .collect()
    }

    /// The rules of a tenant: the provisioned ones first (they hide stored rules of their id),
    /// then the ones made through the API, in the order they were made.
    pub async fn rules(
        &self,
        storage: &Storage,
        tenants: &Tenants,
        tenant: &str,
    ) -> Result<Vec<Rule>, ApiError> {
        let provisioned: Vec<Rule> = tenants
            .limits(tenant)
            .recording_rules
            .iter()
            .map(|p| p.rule())
            .collect();
        let stored = stored_rules(storage, tenant).await?;
        let mut all = provisioned;
        let hidden: Vec<String> = all.iter().map(|r| r.id.clone()).collect();
        all.extend(stored.into_iter().filter(|r| !hidden.contains(&r.id)));
        Ok(all)
    }

    /// [`Self::rules`], compiled; a rule that does not compile is skipped (and logged).
    async fn compiled_rules(
        &self,
        storage: &Storage,
        tenants: &Tenants,
        tenant: &str,
    ) -> Result<Vec<Arc<CompiledRule>>, ApiError> {
        Ok(self
            .rules(storage, tenants, tenant)
            .await?
            .into_iter()
            .filter_map(|r| match r.compile() {
                Ok(c) => Some(Arc::new(c)),
                Err(e) => {
                    tracing::warn!(%tenant, rule = %r.id, error = %e, "recording rule skipped");
                    None
                }
            })
            .collect())
    }

    /// Starts a write's evaluation: the tenant's rules loaded (their open sums read back from
    /// storage the first time), and held until [`Evaluation::commit`].
    pub async fn begin(
        &self,
        storage: &Storage,
        tenants: &Tenants,
        tenant: &str,
        profiles: &[NormalizedProfile],
    ) -> Result<Evaluation, ApiError> {
        let t = self.tenant(tenant);
        if storage.metastore().shared() {
            // In a cluster the compactors evaluate the rules ([`cluster`]); nothing is held.
            let rules = Arc::clone(&t.gate).read_owned().await;
            return Ok(Evaluation {
                tenant: t,
                rules,
                contributions: Vec::new(),
                samples: 0,
            });
        }
        loop {
            let guard = Arc::clone(&t.gate).read_owned().await;
            if guard.is_some() {
                let watch = t.watch_below_ms.load(Ordering::SeqCst);
                if watch != i64::MIN && earliest_ms(profiles) < watch {
                    t.late_writes.fetch_add(1, Ordering::SeqCst);
                }
                let rules = guard.as_ref().map(Arc::clone).unwrap_or_default();
                if rules.iter().any(|r| r.frames.is_some())
                    && let Some(latest) = latest_unnamed_native_ms(profiles)
                {
                    t.native_until_ms.fetch_max(latest, Ordering::SeqCst);
                }
                let (contributions, samples) = evaluate(&rules, profiles);
                return Ok(Evaluation {
                    tenant: t,
                    rules: guard,
                    contributions,
                    samples,
                });
            }
            drop(guard);
            if let Err(e) = self.load(storage, tenants, tenant).await {
                // The rules cannot be read (the object store away): the write goes through
                // unevaluated, holding the gate so no load reads storage before it is there.
                // Nothing is sealed until a load succeeds, and that load reads the open
                // intervals back from storage, this write included.
                tracing::warn!(%tenant, error = %e, "recording rules not loaded; write not held back");
                let guard = Arc::clone(&t.gate).read_owned().await;
                if guard.is_none() {
                    return Ok(Evaluation {
                        tenant: t,
                        rules: guard,
                        contributions: Vec::new(),
                        samples: 0,
                    });
                }
            }
        }
    }

    /// Loads (or reloads) a tenant's rules under its gate: new and changed rules get their
    /// open sums from the stored profiles (and a new rule its backfill), deleted ones lose
    /// their series.
    pub async fn load(
        &self,
        storage: &Storage,
        tenants: &Tenants,
        tenant: &str,
    ) -> Result<(), ApiError> {
        let t = self.tenant(tenant);
        let rules = self.compiled_rules(storage, tenants, tenant).await?;
        let same = |loaded: &[Arc<CompiledRule>]| {
            loaded.len() == rules.len() && loaded.iter().zip(&rules).all(|(a, b)| a.rule == b.rule)
        };
        // Unchanged (the periodic reload, mostly): writes are not held back.
        if t.gate.read().await.as_deref().is_some_and(|r| same(r)) {
            return Ok(());
        }
        let _loading = t.loading.lock().await;
        let ahead = self.read_ahead(storage, tenant, &t, &rules).await;
        t.watch_below_ms.store(i64::MIN, Ordering::SeqCst);
        let mut ahead = ahead?;
        let mut gate = t.gate.write().await;
        if gate.as_deref().is_some_and(|r| same(r)) {
            return Ok(());
        }
        let mut state = t.state.lock().await;
        let first = state.is_none();
        // Changed on a copy, kept only when every read below succeeded.
        let mut s = match state.as_ref() {
            Some(s) => s.clone(),
            None => {
                let now = now_ms();
                match read_checkpoint(storage, tenant).await? {
                    // A grid older than the longest backfill is not resumed (a damaged or
                    // ancient document): it restarts now, its counters kept.
                    Some(c) if c.sealed_through_ms >= now - MAX_RESUME_MS => {
                        TenantState::from_checkpoint(c, self.interval_ms())
                    }
                    Some(c) => {
                        tracing::warn!(%tenant, sealed_through_ms = c.sealed_through_ms, "recording rules: the state's grid is too old to resume; restarted now");
                        let mut fresh = TenantState::from_checkpoint(c, self.interval_ms());
                        fresh.restart_grid(now);
                        fresh
                    }
                    None => TenantState::new(self.interval_ms(), now),
                }
            }
        };
        let before: HashMap<String, Rule> = gate
            .as_ref()
            .map(|rs| {
                rs.iter()
                    .map(|r| (r.rule.id.clone(), r.rule.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let ids: std::collections::HashSet<String> =
            rules.iter().map(|r| r.rule.id.clone()).collect();
        s.retain_rules(|id| ids.contains(id));
        let max_series = tenants.limits(tenant).max_recording_series;
        let mut backfilled = Vec::new();
        for rule in &rules {
            let new = !s.start(&rule.rule.id);
            if new {
                let had = ahead
                    .as_ref()
                    .is_some_and(|a| a.sums.contains_key(&rule.rule.id));
                let read = ahead
                    .as_mut()
                    .and_then(|a| a.take(&t, rule, s.sealed_through()));
                if had && read.is_none() {
                    self.stats.backfills_reread.fetch_add(1, Ordering::Relaxed);
                }
                backfilled.extend(
                    self.backfill(storage, tenant, rule, &mut s, max_series, read)
                        .await?,
                );
            } else if !first && before.get(&rule.rule.id) == Some(&rule.rule) {
                continue;
            }
            reread_open(storage, tenant, rule, &mut s).await?;
        }
        if !backfilled.is_empty() {
            self.send(tenants, tenant, &rules, &backfilled).await?;
        }
        // A tenant that has never had rules keeps no document.
        let keep = state.as_ref().map(TenantState::checkpoint) != Some(s.checkpoint())
            && !(first && before.is_empty() && ids.is_empty());
        *state = Some(s);
        let change = keep.then(|| t.changes.fetch_add(1, Ordering::SeqCst) + 1);
        drop(state);
        *gate = Some(Arc::new(rules));
        drop(gate);
        if let Some(change) = change {
            persist(storage, tenant, &t, change).await?;
        }
        Ok(())
    }

    /// How far back a new rule is backfilled, in whole intervals (0: not at all).
    fn backfill_range_ms(&self, rule: &CompiledRule, interval: i64) -> i64 {
        let backfill = rule
            .rule
            .backfill_secs
            .map_or(self.config.backfill, Duration::from_secs)
            .min(MAX_BACKFILL);
        (backfill.as_millis() as i64).div_euclid(interval) * interval
    }

    /// Reads the backfills of the rules new to a loaded state before the gate is taken, so a
    /// long backfill does not hold the tenant's writes back. The gate is held only for a
    /// moment: every write begun before it is then stored, and every later write with a time
    /// before the backfills' end is counted in `late_writes` (such a write voids the sums).
    async fn read_ahead(
        &self,
        storage: &Storage,
        tenant: &str,
        t: &TenantRecording,
        rules: &[Arc<CompiledRule>],
    ) -> Result<Option<AheadBackfills>, ApiError> {
        let (end_ms, interval, late_writes, new) = {
            let _gate = t.gate.write().await;
            let state = t.state.lock().await;
            let Some(s) = state.as_ref() else {
                // Not loaded yet: writes wait for the first load anyway.
                return Ok(None);
            };
            let interval = s.interval_ms();
            let new: Vec<Arc<CompiledRule>> = rules
                .iter()
                .filter(|r| !s.started(&r.rule.id) && self.backfill_range_ms(r, interval) > 0)
                .cloned()
                .collect();
            if new.is_empty() {
                return Ok(None);
            }
            let end_ms = s.sealed_through();
            t.watch_below_ms.store(end_ms, Ordering::SeqCst);
            (end_ms, interval, t.late_writes.load(Ordering::SeqCst), new)
        };
        self.read_ahead_pause.reached.notify_one();
        drop(self.read_ahead_pause.release.read().await);
        let mut sums = HashMap::new();
        for rule in new {
            let start = end_ms - self.backfill_range_ms(&rule, interval);
            let read = rule_sums(storage, tenant, &rule, start, end_ms, interval).await?;
            sums.insert(rule.rule.id.clone(), (rule.rule.clone(), read));
        }
        Ok(Some(AheadBackfills {
            end_ms,
            late_writes,
            sums,
        }))
    }

    /// A new rule's points over the backfill range, from the stored profiles: a 0 at the start
    /// of each series' first interval, then its counter at every interval's end through the
    /// sealed point, which the counter continues from. `ahead`: its sums read before the gate,
    /// through [`AheadBackfills::end_ms`].
    async fn backfill(
        &self,
        storage: &Storage,
        tenant: &str,
        rule: &CompiledRule,
        s: &mut TenantState,
        max_series: usize,
        ahead: Option<(i64, Vec<(SeriesKey, i64, i64)>)>,
    ) -> Result<Vec<Point>, ApiError> {
        let end = s.sealed_through();
        let interval = s.interval_ms();
        let range = self.backfill_range_ms(rule, interval);
        if range <= 0 {
            return Ok(Vec::new());
        }
        let start = end - range;
        let sums = match ahead {
            // Sealing went on meanwhile: the intervals it sealed are read now.
            Some((read_to, mut sums)) => {
                if read_to < end {
                    sums.extend(rule_sums(storage, tenant, rule, read_to, end, interval).await?);
                }
                sums.retain(|&(_, t, _)| t >= start);
                sums
            }
            None => rule_sums(storage, tenant, rule, start, end, interval).await?,
        };
        let mut by_series: std::collections::BTreeMap<SeriesKey, Vec<(i64, i64)>> =
            Default::default();
        for (key, t, v) in sums {
            by_series.entry(key).or_default().push((t, v));
        }
        let mut points = Vec::new();
        let mut totals = Vec::new();
        let room = max_series.saturating_sub(s.series());
        for (key, mut buckets) in by_series.into_iter().take(room) {
            buckets.sort_unstable();
            let first = buckets[0].0;
            points.push(Point {
                key: key.clone(),
                time_ms: first,
                value: 0,
            });
            let mut total = 0i64;
            let mut next = buckets.into_iter().peekable();
            let mut t = first;
            while t < end {
                while let Some(&(b, v)) = next.peek() {
                    if b > t {
                        break;
                    }
                    total = total.saturating_add(v);
                    next.next();
                }
                points.push(Point {
                    key: key.clone(),
                    time_ms: t + interval,
                    value: total,
                });
                t += interval;
            }
            totals.push((key, total));
        }
        s.seed_counters(totals);
        Ok(points)
    }

    /// Seals every loaded tenant's due intervals: points queued (and counted), then the
    /// counters kept.
    pub async fn seal_due(&self, storage: &Storage, tenants: &Tenants) {
        for (tenant, t) in self.loaded_tenants() {
            let pending = t.changes.load(Ordering::SeqCst);
            if *t.kept.lock().await < pending
                && let Err(e) = persist(storage, &tenant, &t, pending).await
            {
                tracing::warn!(%tenant, error = %e, "recording rules: the state is not kept yet; retried");
                continue;
            }
            if let Err(e) = self.seal_tenant(storage, tenants, &tenant, &t).await {
                tracing::warn!(%tenant, error = %e, "recording rules: sealing failed; retried");
            }
        }
    }

    async fn seal_tenant(
        &self,
        storage: &Storage,
        tenants: &Tenants,
        tenant: &str,
        t: &TenantRecording,
    ) -> Result<(), ApiError> {
        let delay = self.config.delay.as_millis() as i64;
        // A look first, so writes are held back only when an interval is due and there is
        // something to keep.
        {
            // A tenant whose rules are loading (a backfill, a rebuild) is sealed at a later
            // tick, so it never holds the others back.
            let Ok(gate) = t.gate.try_read() else {
                return Ok(());
            };
            let has_rules = gate.as_ref().is_some_and(|r| !r.is_empty());
            drop(gate);
            let mut state = t.state.lock().await;
            let Some(s) = state.as_mut() else {
                return Ok(());
            };
            let Some(through) = s.due(now_ms(), delay) else {
                return Ok(());
            };
            if !has_rules && s.series() == 0 {
                // Nothing to keep: the grid moves on in memory only.
                s.seal(through);
                return Ok(());
            }
        }
        // Exclusive: every write stored before this point has added its sums, so what is
        // sealed is what storage holds for those intervals.
        let gate = t.gate.write().await;
        let Some(rules) = gate.as_ref().map(Arc::clone) else {
            return Ok(());
        };
        let mut state = t.state.lock().await;
        let Some(s) = state.as_mut() else {
            return Ok(());
        };
        let Some(through) = s.due(now_ms(), delay) else {
            return Ok(());
        };
        // At most an hour of intervals a pass: a long outage is caught up in bounded steps.
        let through = through.min(s.sealed_through() + MAX_SEAL_INTERVALS * s.interval_ms());
        let mut sealed = s.clone();
        if t.native_until_ms.load(Ordering::SeqCst) >= sealed.sealed_through() {
            // Native frames arrive unnamed; storage names them from the debug files at hand.
            for rule in rules.iter().filter(|r| r.frames.is_some()) {
                reread_open(storage, tenant, rule, &mut sealed).await?;
            }
        }
        let points = sealed.seal(through);
        self.send(tenants, tenant, &rules, &points).await?;
        // Queued: the points are sealed, whatever becomes of the document write below (a
        // failed one is retried, never the seal, so no time is ever sent two values).
        *s = sealed;
        let change = t.changes.fetch_add(1, Ordering::SeqCst) + 1;
        drop(state);
        drop(gate);
        persist(storage, tenant, t, change).await
    }

    /// Queues points for the tenant's receiver (when it has one) and counts them.
    async fn send(
        &self,
        tenants: &Tenants,
        tenant: &str,
        rules: &[Arc<CompiledRule>],
        points: &[Point],
    ) -> Result<(), ApiError> {
        self.stats
            .points_sealed
            .fetch_add(points.len() as u64, Ordering::Relaxed);
        let Some(queue) = &self.queue else {
            return Ok(());
        };
        let own = Some(tenants.limits(tenant).remote_write_url).filter(|u| !u.is_empty());
        let shared = own.is_none();
        let Some(url) = own.or_else(|| self.config.remote_write_url.clone()) else {
            return Ok(());
        };
        let mut samples = samples_of(rules, points);
        if shared {
            // One receiver for every tenant (a plain Prometheus ignores `X-Scope-OrgID`): the
            // tenant is a label too, so no tenant's series can be another's.
            for s in &mut samples {
                s.labels.push((TENANT_LABEL.to_owned(), tenant.to_owned()));
                s.labels.sort();
            }
        }
        let dest = Destination {
            url,
            tenant: tenant.to_owned(),
        };
        let queue = Arc::clone(queue);
        tokio::task::spawn_blocking(move || queue.push(&dest, &samples))
            .await
            .map_err(|e| internal("queue", e))?
            .map_err(|e| internal("queue", e))
    }

    /// The tenant's counters through its sealed point in the Prometheus text format (the pull
    /// endpoint), each with its time.
    pub async fn exposition(
        &self,
        storage: &Storage,
        tenants: &Tenants,
        tenant: &str,
    ) -> Result<String, ApiError> {
        if storage.metastore().shared() {
            return self.cluster_exposition(storage, tenants, tenant).await;
        }
        let t = self.tenant(tenant);
        if t.gate.read().await.is_none() {
            self.load(storage, tenants, tenant).await?;
        }
        let gate = t.gate.read().await;
        let rules = gate.as_ref().map(Arc::clone).unwrap_or_default();
        let state = t.state.lock().await;
        let Some(s) = state.as_ref() else {
            return Ok(String::new());
        };
        Ok(counters_text(&rules, s))
    }

    /// Forgets a deleted tenant's series (its documents are deleted with its data).
    pub fn forget(&self, tenant: &str) {
        self.tenants
            .lock()
            .expect("recording tenants")
            .remove(tenant);
    }

    /// Loads the rules of every tenant with stored profiles, so the intervals written before
    /// a restart are sealed even if the tenant writes no more.
    pub async fn load_all(&self, storage: &Storage, tenants: &Tenants) {
        match storage.metastore().tenants().await {
            Ok(all) => {
                for tenant in all {
                    if let Err(e) = self.load(storage, tenants, &tenant).await {
                        tracing::warn!(%tenant, error = %e, "recording rules: loading failed");
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "recording rules: no tenant list"),
        }
    }

    /// Reloads the rules of every loaded tenant (changed by another process, or in the
    /// tenant file).
    pub async fn reload_all(&self, storage: &Storage, tenants: &Tenants) {
        for (tenant, _) in self.loaded_tenants() {
            if let Err(e) = self.load(storage, tenants, &tenant).await {
                tracing::warn!(%tenant, error = %e, "recording rules: reload failed");
            }
        }
    }
}

impl AheadBackfills {
    /// A rule's sums read ahead and their end, if they stand: the rule is unchanged, no write
    /// older than their end came since, and sealing did not go back before it.
    fn take(
        &mut self,
        t: &TenantRecording,
        rule: &CompiledRule,
        sealed_through: i64,
    ) -> Option<(i64, Vec<(SeriesKey, i64, i64)>)> {
        let (read, sums) = self.sums.remove(&rule.rule.id)?;
        (read == rule.rule
            && self.end_ms <= sealed_through
            && t.late_writes.load(Ordering::SeqCst) == self.late_writes)
            .then_some((self.end_ms, sums))
    }
}

/// The latest time (ms) of a write's samples with a native frame ingest could not name (a
/// mapping with a build id, the address as its only name), if any.
fn latest_unnamed_native_ms(profiles: &[NormalizedProfile]) -> Option<i64> {
    let mut latest = None;
    for p in profiles {
        let symbols = &p.symbols;
        let unnamed: Vec<bool> = symbols
            .locations
            .iter()
            .map(|loc| {
                let Some(m) = loc.mapping.and_then(|m| symbols.mappings.get(m as usize)) else {
                    return false;
                };
                if loc.address == 0 || m.build_id.is_empty() || loc.lines.len() > 1 {
                    return false;
                }
                loc.lines.first().is_none_or(|l| {
                    symbols.functions.get(l.function as usize).is_some_and(|f| {
                        *f.name == unsymbolized_name(Some(&m.filename), loc.address)
                    })
                })
            })
            .collect();
        if !unnamed.contains(&true) {
            continue;
        }
        for series in &p.series {
            for x in &series.samples {
                if x.stack
                    .iter()
                    .any(|&l| unnamed.get(l as usize) == Some(&true))
                {
                    let t = match x.timestamp_nanos {
                        0 => series.time_nanos,
                        t => t,
                    };
                    latest = latest.max(Some(t.div_euclid(1_000_000)));
                }
            }
        }
    }
    latest
}

/// The earliest time (ms) of a write's samples, as [`evaluate`] places them.
fn earliest_ms(profiles: &[NormalizedProfile]) -> i64 {
    profiles
        .iter()
        .flat_map(|p| &p.series)
        .flat_map(|series| {
            series.samples.iter().map(|x| match x.timestamp_nanos {
                0 => series.time_nanos,
                t => t,
            })
        })
        .min()
        .map_or(i64::MAX, |t| t.div_euclid(1_000_000))
}

impl Evaluation {
    /// Adds the write's sums once it is acknowledged; late sums are kept before this returns.
    pub async fn commit(
        self,
        storage: &Storage,
        tenant: &str,
        max_series: usize,
        stats: &RecordingStats,
    ) -> Result<(), ApiError> {
        if self.contributions.is_empty() {
            return Ok(());
        }
        let t = &self.tenant;
        let mine = {
            let mut state = t.state.lock().await;
            let Some(s) = state.as_mut() else {
                return Ok(());
            };
            let added = s.add(&self.contributions, max_series);
            stats
                .samples_recorded
                .fetch_add(self.samples, Ordering::Relaxed);
            stats.late.fetch_add(added.late as u64, Ordering::Relaxed);
            stats
                .series_refused
                .fetch_add(added.refused as u64, Ordering::Relaxed);
            if added.late == 0 {
                return Ok(());
            }
            t.changes.fetch_add(1, Ordering::SeqCst) + 1
        };
        // Late sums are kept before the write is acknowledged.
        persist(storage, tenant, t, mine).await?;
        drop(self.rules);
        Ok(())
    }
}

/// Writes the tenant's state document once it holds change `mine`: one write covers every
/// change made before it was taken (group commit).
async fn persist(
    storage: &Storage,
    tenant: &str,
    t: &TenantRecording,
    mine: u64,
) -> Result<(), ApiError> {
    let mut kept = t.kept.lock().await;
    if *kept >= mine {
        return Ok(());
    }
    let (checkpoint, covered) = {
        let state = t.state.lock().await;
        let Some(s) = state.as_ref() else {
            return Ok(());
        };
        (s.checkpoint(), t.changes.load(Ordering::SeqCst))
    };
    write_checkpoint(storage, tenant, &checkpoint).await?;
    *kept = covered;
    Ok(())
}

/// A write's sums for every rule that matches its series: per rule and series, the samples'
/// values summed by millisecond, one key built per series.
fn evaluate(
    rules: &[Arc<CompiledRule>],
    profiles: &[NormalizedProfile],
) -> (Vec<Contribution>, u64) {
    if rules.is_empty() {
        return (Vec::new(), 0);
    }
    let mut sums: HashMap<SeriesKey, HashMap<i64, i64>> = HashMap::new();
    let mut samples = 0u64;
    for p in profiles {
        for series in &p.series {
            let profile_type = series.profile_type.id();
            let get = |name: &str| series.labels.get(name);
            for rule in rules.iter().filter(|r| r.matches(&profile_type, get)) {
                let group: Vec<(String, String)> = rule
                    .rule
                    .group_by
                    .iter()
                    .filter_map(|g| series.labels.get(g).map(|v| (g.clone(), v.to_owned())))
                    .collect();
                let by_time = sums
                    .entry(SeriesKey {
                        rule: rule.rule.id.clone(),
                        group,
                    })
                    .or_default();
                for sample in &series.samples {
                    if let Some(f) = &rule.frames
                        && !f.keeps(p.symbols.frame_names(&sample.stack))
                    {
                        continue;
                    }
                    let t = if sample.timestamp_nanos != 0 {
                        sample.timestamp_nanos
                    } else {
                        series.time_nanos
                    };
                    let slot = by_time.entry(t.div_euclid(1_000_000)).or_default();
                    *slot = slot.saturating_add(sample.value);
                    samples += 1;
                }
            }
        }
    }
    let mut contributions = Vec::new();
    for (key, by_time) in sums {
        for (time_ms, value) in by_time {
            contributions.push(Contribution {
                key: key.clone(),
                time_ms,
                value,
            });
        }
    }
    (contributions, samples)
}

/// Replaces a rule's open sums in `s` with what the stored profiles hold from its sealed point
/// on.
async fn reread_open(
    storage: &Storage,
    tenant: &str,
    rule: &CompiledRule,
    s: &mut TenantState,
) -> Result<(), ApiError> {
    let sums = rule_sums(
        storage,
        tenant,
        rule,
        s.sealed_through(),
        i64::MAX / 1_000_000,
        s.interval_ms(),
    )
    .await?;
    s.replace_open(&rule.rule.id, sums);
    Ok(())
}

/// A rule's sums per series and interval (start) over `[start, end)` of the stored profiles.
async fn rule_sums(
    storage: &Storage,
    tenant: &str,
    rule: &CompiledRule,
    start_ms: i64,
    end_ms: i64,
    interval_ms: i64,
) -> Result<Vec<(SeriesKey, i64, i64)>, ApiError> {
    let filter = SampleFilter {
        tenant: tenant.to_owned(),
        profile_type: rule.profile_type.clone(),
        selector: rule.selector.clone(),
        start_nanos: start_ms.saturating_mul(1_000_000),
        end_nanos: end_ms.saturating_mul(1_000_000),
        span_ids: Vec::new(),
        trace_ids: Vec::new(),
        profile_ids: Vec::new(),
    };
    let series = storage
        .query()
        .select_series_of_stacks(
            &filter,
            &rule.rule.group_by,
            interval_ms.saturating_mul(1_000_000),
            Aggregation::Sum,
            None,
            Exemplars::None,
            rule.frames.clone(),
        )
        .await?;
    Ok(series
        .into_iter()
        .flat_map(|s| {
            let key = SeriesKey {
                rule: rule.rule.id.clone(),
                group: s.labels,
            };
            s.points
                .into_iter()
                .map(move |(t, v)| (key.clone(), t, v as i64))
        })
        .collect())
}

/// A state's counters through its sealed point, stamped with that time, in the Prometheus
/// text format (the pull endpoint).
fn counters_text(rules: &[Arc<CompiledRule>], s: &TenantState) -> String {
    let at = s.sealed_through();
    let points: Vec<Point> = s
        .counters()
        .map(|(key, value)| Point {
            key: key.clone(),
            time_ms: at,
            value,
        })
        .collect();
    exposition_text(&samples_of(rules, &points))
}

/// Points as samples: each series labelled by its rule (points of rules no longer there are
/// left out).
fn samples_of(rules: &[Arc<CompiledRule>], points: &[Point]) -> Vec<Sample> {
    let by_id: HashMap<&str, &CompiledRule> = rules
        .iter()
        .map(|r| (r.rule.id.as_str(), r.as_ref()))
        .collect();
    points
        .iter()
        .filter_map(|p| {
            let rule = by_id.get(p.key.rule.as_str())?;
            let mut labels = rule.output_labels(&p.key.group);
            labels.push((RULE_ID_LABEL.to_owned(), rule.rule.id.clone()));
            labels.sort();
            Some(Sample {
                labels,
                timestamp_ms: p.time_ms,
                value: p.value as f64,
            })
        })
        .collect()
}

/// Samples in the Prometheus text format, as counters with their times.
fn exposition_text(samples: &[Sample]) -> String {
    use std::fmt::Write;
    let mut by_name: std::collections::BTreeMap<&str, Vec<&Sample>> = Default::default();
    for s in samples {
        let name = s
            .labels
            .iter()
            .find(|(k, _)| k == "__name__")
            .map_or("", |(_, v)| v.as_str());
        by_name.entry(name).or_default().push(s);
    }
    let mut out = String::new();
    for (name, samples) in by_name {
        let _ = writeln!(out, "# TYPE {name} counter");
        for s in samples {
            let labels: Vec<String> = s
                .labels
                .iter()
                .filter(|(k, _)| k != "__name__")
                .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
                .collect();
            let _ = writeln!(
                out,
                "{name}{{{}}} {} {}",
                labels.join(","),
                s.value,
                s.timestamp_ms
            );
        }
    }
    out
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn now_ms() -> i64 {
    crate::time::now_nanos().div_euclid(1_000_000)
}

/// The rules a tenant made through the API.
pub async fn stored_rules(storage: &Storage, tenant: &str) -> Result<Vec<Rule>, ApiError> {
    match storage.tenant_document(tenant, RULES_DOCUMENT).await? {
        None => Ok(Vec::new()),
        Some(doc) => serde_json::from_slice(&doc)
            .map_err(|e| internal(&format!("the rules of {tenant} are unreadable"), e)),
    }
}

/// Replaces the rules a tenant made through the API.
pub async fn put_stored_rules(
    storage: &Storage,
    tenant: &str,
    rules: &[Rule],
) -> Result<(), ApiError> {
    let doc = serde_json::to_vec(rules).map_err(ApiError::internal)?;
    Ok(storage
        .put_tenant_document(tenant, RULES_DOCUMENT, Bytes::from(doc))
        .await?)
}

async fn read_checkpoint(storage: &Storage, tenant: &str) -> Result<Option<Checkpoint>, ApiError> {
    match storage.tenant_document(tenant, STATE_DOCUMENT).await? {
        None => Ok(None),
        Some(doc) => serde_json::from_slice(&doc)
            .map(Some)
            .map_err(|e| internal(&format!("the recording state of {tenant} is unreadable"), e)),
    }
}

async fn write_checkpoint(storage: &Storage, tenant: &str, c: &Checkpoint) -> Result<(), ApiError> {
    let doc = serde_json::to_vec(c).map_err(ApiError::internal)?;
    storage
        .put_tenant_document(tenant, STATE_DOCUMENT, Bytes::from(doc))
        .await
        .map_err(|e| {
            ApiError::new(
                ErrorKind::Unavailable,
                "the recording rules' state could not be kept; retry",
            )
            .with_detail(e.to_string())
        })
}

/// Recording rules' metrics, read at each scrape: `kiln_recording_…` and the remote-write
/// queue's `kiln_recording_remote_write_…`.
#[derive(Debug)]
pub struct StatsCollector(pub Arc<Recording>);

impl prometheus_client::collector::Collector for StatsCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        let s = &self.0.stats;
        let mut counters: Vec<(&str, &str, u64)> = vec![
            (
                "recording_samples_recorded",
                "Profile samples added to recording rules' series",
                s.samples_recorded.load(Ordering::Relaxed),
            ),
            (
                "recording_late_contributions",
                "Rule sums of profiles acknowledged after their interval was sealed (counted in the next)",
                s.late.load(Ordering::Relaxed),
            ),
            (
                "recording_series_refused",
                "Rule sums dropped because the tenant's rule series are at max_recording_series",
                s.series_refused.load(Ordering::Relaxed),
            ),
            (
                "recording_backfills_reread",
                "New rules' backfills read again under the tenant's gate: a write older than their end came while they were read ahead",
                s.backfills_reread.load(Ordering::Relaxed),
            ),
            (
                "recording_points_sealed",
                "Points of rule series sealed (queued for remote write, answered on the pull endpoint)",
                s.points_sealed.load(Ordering::Relaxed),
            ),
            (
                "recording_outbox_samples_sent",
                "In a cluster: samples of the shared outbox the receiver took",
                s.outbox_sent.load(Ordering::Relaxed),
            ),
            (
                "recording_outbox_samples_rejected",
                "In a cluster: samples of the shared outbox the receiver refused for good",
                s.outbox_rejected.load(Ordering::Relaxed),
            ),
            (
                "recording_outbox_failures",
                "In a cluster: sends of the shared outbox that failed and are retried",
                s.outbox_failures.load(Ordering::Relaxed),
            ),
        ];
        if let Some(q) = &self.0.queue {
            let q = q.stats();
            counters.extend([
                ("recording_remote_write_samples_sent", "Samples the receiver took", q.samples_sent()),
                (
                    "recording_remote_write_samples_dropped",
                    "Samples dropped, oldest first, because the queue passed --remote-write-queue-bytes",
                    q.samples_dropped(),
                ),
                (
                    "recording_remote_write_samples_rejected",
                    "Samples the receiver refused for good (a 4xx other than 429)",
                    q.samples_rejected(),
                ),
                (
                    "recording_remote_write_failures",
                    "Sends that failed and are retried (5xx, 429, no answer)",
                    q.send_failures(),
                ),
            ]);
        }
        for (name, help, value) in counters {
            let c = ConstCounter::new(value);
            c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)?;
        }
        if let Some(q) = &self.0.queue {
            let g = ConstGauge::new(q.stats().pending_bytes() as i64);
            g.encode(encoder.encode_descriptor(
                "recording_remote_write_pending_bytes",
                "Bytes of samples waiting in the remote-write queue",
                None,
                g.metric_type(),
            )?)?;
        }
        Ok(())
    }
}
