//! Per-tenant limits from a TOML file (`--tenants PATH`), reloaded on SIGHUP or when the file
//! changes, and the state that enforces them: ingest rate buckets, series counts, query slots.
//!
//! Where the state lives: each process holds its own buckets and slots, in memory. A limit is
//! the cluster's, so each process enforces its share ([`Peers`]): the ingest rate divided by
//! the live ingest processes, the query slots by the live query processes, as Mimir, Loki and
//! Pyroscope divide theirs. Membership (`crate::server::cluster`) sets the counts each second.
//! Active series are exact for the cluster: where processes share a metastore, it counts them
//! (`Metastore::admit_series`), and this process's view only spares it the series it has seen.
//! The limits themselves (the file's model and parsing) are in [`limits`]; this module loads,
//! reloads and enforces them.
//!
//! ```toml
//! [defaults]                      # every key optional; Pyroscope's defaults otherwise
//! ingest_rate_bytes = 4194304     # decompressed bytes per second (0 = unlimited)
//! ingest_burst_bytes = 2097152
//! retention = "31d"
//!
//! [tenants.acme]                  # overrides for one tenant
//! ingest_rate_bytes = 1048576
//! max_series = 20000
//! ```
//! Unknown keys fail the load (at start-up: exit; at reload: the old limits stay, logged).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::Semaphore;

use crate::error::{ApiError, ErrorKind};

mod limits;
pub mod throttled;

pub use limits::{ProvisionedRule, Secs, TenantConfig, TenantLimits};

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    updated: Instant,
}

/// How long a series counts against `max_series` after a profile of it last arrived. The limit
/// is on active series, as Pyroscope's `max_global_series_per_user` is: the pods a deployment
/// replaced stop counting an hour after their last profile, so a fleet with churn does not
/// run into the limit as its history grows.
pub const ACTIVE_SERIES_WINDOW: Duration = Duration::from_secs(3600);

/// A tenant's active series.
#[derive(Debug, Default)]
struct ActiveSeries {
    /// Series hash -> when a profile of it last arrived, in seconds of [`Tenants`]' clock.
    last_seen: HashMap<u64, u64>,
    /// When series past the window were last dropped.
    swept: u64,
}

impl ActiveSeries {
    /// Drops the series not seen within the window before `now`.
    fn sweep(&mut self, now: u64) {
        let since = now.saturating_sub(ACTIVE_SERIES_WINDOW.as_secs());
        self.last_seen.retain(|_, seen| *seen >= since);
        self.swept = now;
    }
}

/// How many processes share the cluster's limits: the live members of each role, as membership
/// last counted them (1 each for a process alone, or before the first count).
#[derive(Debug)]
pub struct Peers {
    ingest: AtomicUsize,
    query: AtomicUsize,
}

impl Default for Peers {
    fn default() -> Self {
        Self {
            ingest: AtomicUsize::new(1),
            query: AtomicUsize::new(1),
        }
    }
}

impl Peers {
    /// Live ingest processes (at least 1).
    pub fn ingest(&self) -> usize {
        self.ingest.load(Ordering::Relaxed).max(1)
    }

    /// Live query processes (at least 1).
    pub fn query(&self) -> usize {
        self.query.load(Ordering::Relaxed).max(1)
    }
}

/// The refusal of a write that would take `tenant` past `max` active series (429).
pub fn series_limit(tenant: &str, max: usize) -> ApiError {
    ApiError::new(
        ErrorKind::ResourceExhausted,
        format!(
            "tenant {tenant:?} would have more than its limit of {max} active series \
             (series with a profile in the last hour)"
        ),
    )
}

/// Limits in force and the state enforcing them.
#[derive(Debug)]
pub struct Tenants {
    path: Option<PathBuf>,
    base: toml::Table,
    config: RwLock<Arc<TenantConfig>>,
    stamp: Mutex<Option<(SystemTime, u64)>>,
    buckets: Mutex<HashMap<String, Bucket>>,
    series: Mutex<HashMap<String, ActiveSeries>>,
    /// The clock of active series.
    started: Instant,
    /// Per tenant: the slot count in force and the semaphore handing slots out.
    queries: Mutex<HashMap<String, (usize, Arc<Semaphore>)>>,
    /// The processes sharing each limit.
    peers: Peers,
    /// Per tenant: series seen since the shared count was last told ([`Tenants::touched`]).
    touched: Mutex<HashMap<String, HashSet<u64>>>,
    /// The minutes this process refused a tenant's ingest for its rate.
    throttled: throttled::Throttled,
}

fn stamp_of(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

impl Tenants {
    /// Limits from `path` (or built-in defaults), with `base` overriding the file's defaults.
    pub fn load(path: Option<&Path>, base: toml::Table) -> anyhow::Result<Self> {
        let config = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
                TenantConfig::parse(&text, &base)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?
            }
            None => TenantConfig::parse("", &base)?,
        };
        Ok(Self {
            path: path.map(Path::to_owned),
            base,
            config: RwLock::new(Arc::new(config)),
            stamp: Mutex::new(path.and_then(stamp_of)),
            buckets: Mutex::new(HashMap::new()),
            series: Mutex::new(HashMap::new()),
            started: Instant::now(),
            queries: Mutex::new(HashMap::new()),
            peers: Peers::default(),
            touched: Mutex::new(HashMap::new()),
            throttled: throttled::Throttled::default(),
        })
    }

    /// Sets how many live processes of each role share the limits (membership, each second).
    pub fn set_peers(&self, ingest: usize, query: usize) {
        self.peers.ingest.store(ingest.max(1), Ordering::Relaxed);
        self.peers.query.store(query.max(1), Ordering::Relaxed);
    }

    /// Notes a refusal of `tenant`'s ingest for its rate, now.
    fn throttle(&self, tenant: &str) {
        self.throttled
            .record(tenant, crate::time::now_nanos().div_euclid(1_000_000));
    }

    /// The minutes this process refused tenants' ingest for their rate.
    pub fn throttled(&self) -> &throttled::Throttled {
        &self.throttled
    }

    /// The processes sharing each limit now.
    pub fn peers(&self) -> &Peers {
        &self.peers
    }

    /// This process's share of the tenant's ingest rate, in bytes per second (0: unlimited).
    /// The burst is not divided, as Pyroscope's is not: a process's bucket still takes one
    /// request of the burst's size.
    fn rate_share(&self, limits: &TenantLimits) -> f64 {
        limits.ingest_rate_bytes as f64 / self.peers.ingest() as f64
    }

    /// Built-in defaults for every tenant.
    pub fn defaults() -> Self {
        Self::load(None, toml::Table::new()).expect("built-in defaults parse")
    }

    /// Re-reads the file; on error the limits in force stay.
    pub fn reload(&self) -> anyhow::Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let text = std::fs::read_to_string(path)?;
        let config = TenantConfig::parse(&text, &self.base)?;
        *self.config.write().expect("config lock") = Arc::new(config);
        *self.stamp.lock().expect("stamp lock") = stamp_of(path);
        Ok(())
    }

    /// Reloads when the file changed since the last load.
    pub fn reload_if_changed(&self) -> anyhow::Result<bool> {
        let Some(path) = &self.path else {
            return Ok(false);
        };
        if stamp_of(path) == *self.stamp.lock().expect("stamp lock") {
            return Ok(false);
        }
        self.reload()?;
        Ok(true)
    }

    /// The limits of `tenant`.
    pub fn limits(&self, tenant: &str) -> TenantLimits {
        let config = Arc::clone(&self.config.read().expect("config lock"));
        config
            .tenants
            .get(tenant)
            .unwrap_or(&config.defaults)
            .clone()
    }

    /// Takes `bytes` from the tenant's ingest bucket (this process's share of its rate), or
    /// says when to retry (429).
    pub fn charge_ingest(&self, tenant: &str, bytes: u64) -> Result<(), ApiError> {
        let limits = self.limits(tenant);
        if limits.ingest_rate_bytes == 0 {
            return Ok(());
        }
        let rate = self.rate_share(&limits);
        let burst = limits.ingest_burst_bytes.max(1) as f64;
        let now = Instant::now();
        let mut buckets = self.buckets.lock().expect("buckets lock");
        let b = buckets.entry(tenant.to_owned()).or_insert(Bucket {
            tokens: burst,
            updated: now,
        });
        b.tokens = (b.tokens + now.duration_since(b.updated).as_secs_f64() * rate).min(burst);
        b.updated = now;
        // A request larger than the burst passes when the bucket is full, then drives it negative.
        let need = (bytes as f64).min(burst);
        if b.tokens >= need {
            b.tokens -= bytes as f64;
            return Ok(());
        }
        let wait = ((need - b.tokens) / rate).ceil().max(1.0) as u64;
        drop(buckets);
        self.throttle(tenant);
        Err(ApiError::new(
            ErrorKind::ResourceExhausted,
            format!(
                "tenant {tenant:?} is over its ingest rate of {} bytes/s (burst {}); retry in {wait} s",
                limits.ingest_rate_bytes, limits.ingest_burst_bytes
            ),
        )
        .retry_after(wait))
    }

    /// Refuses at once, before the body is decoded, a tenant whose bucket is already empty: a
    /// flood over the rate then costs reading its bytes, nothing more
    /// (`transport::http::admit`). The exact charge comes after decoding.
    pub fn check_ingest(&self, tenant: &str) -> Result<(), ApiError> {
        let limits = self.limits(tenant);
        if limits.ingest_rate_bytes == 0 {
            return Ok(());
        }
        let rate = self.rate_share(&limits);
        let burst = limits.ingest_burst_bytes.max(1) as f64;
        let now = Instant::now();
        let mut buckets = self.buckets.lock().expect("buckets lock");
        let Some(b) = buckets.get_mut(tenant) else {
            return Ok(());
        };
        b.tokens = (b.tokens + now.duration_since(b.updated).as_secs_f64() * rate).min(burst);
        b.updated = now;
        if b.tokens > 0.0 {
            return Ok(());
        }
        let wait = ((-b.tokens + 1.0) / rate).ceil().max(1.0) as u64;
        drop(buckets);
        self.throttle(tenant);
        Err(ApiError::new(
            ErrorKind::ResourceExhausted,
            format!(
                "tenant {tenant:?} is over its ingest rate of {} bytes/s; retry in {wait} s",
                limits.ingest_rate_bytes
            ),
        )
        .retry_after(wait))
    }

    /// Whether the tenant's series are known (loaded from the metastore).
    pub fn series_loaded(&self, tenant: &str) -> bool {
        self.series
            .lock()
            .expect("series lock")
            .contains_key(tenant)
    }

    /// Seeds a tenant's active series (from the metastore: the series with profiles in the
    /// last [`ACTIVE_SERIES_WINDOW`]), as seen now.
    pub fn seed_series(&self, tenant: &str, hashes: impl IntoIterator<Item = u64>) {
        let now = self.started.elapsed().as_secs();
        let mut series = self.series.lock().expect("series lock");
        let active = series.entry(tenant.to_owned()).or_default();
        active
            .last_seen
            .extend(hashes.into_iter().map(|h| (h, now)));
    }

    /// Admits the series of a write, or refuses all of it when new series would take the
    /// tenant's active series past the limit.
    pub fn admit_series(&self, tenant: &str, hashes: &[u64]) -> Result<(), ApiError> {
        self.admit_series_at(tenant, hashes, self.started.elapsed().as_secs())
    }

    fn admit_series_at(&self, tenant: &str, hashes: &[u64], now: u64) -> Result<(), ApiError> {
        let max = self.limits(tenant).max_series;
        let mut series = self.series.lock().expect("series lock");
        let active = series.entry(tenant.to_owned()).or_default();
        if now.saturating_sub(active.swept) >= 60 {
            active.sweep(now);
        }
        let count_new = |active: &ActiveSeries| {
            hashes
                .iter()
                .filter(|h| !active.last_seen.contains_key(*h))
                .collect::<HashSet<_>>()
                .len()
        };
        let mut new = count_new(active);
        if max > 0 && new > 0 && active.last_seen.len() + new > max {
            // Series may have gone quiet since the last sweep.
            active.sweep(now);
            new = count_new(active);
        }
        if max > 0 && active.last_seen.len() + new > max {
            return Err(series_limit(tenant, max));
        }
        for h in hashes {
            active.last_seen.insert(*h, now);
        }
        Ok(())
    }

    /// Where a shared count admits series (a cluster: `Metastore::admit_series`): the series
    /// of `hashes` this process has not seen active, each once. The shared count admits these;
    /// the others it admitted already.
    pub fn unseen_series(&self, tenant: &str, hashes: &[u64]) -> Vec<u64> {
        let now = self.started.elapsed().as_secs();
        let mut series = self.series.lock().expect("series lock");
        let active = series.entry(tenant.to_owned()).or_default();
        if now.saturating_sub(active.swept) >= 60 {
            active.sweep(now);
        }
        let unseen: HashSet<u64> = hashes
            .iter()
            .filter(|h| !active.last_seen.contains_key(*h))
            .copied()
            .collect();
        unseen.into_iter().collect()
    }

    /// Records the series of an admitted write as seen now, here and among those the shared
    /// count is told of next ([`Tenants::touched`]).
    pub fn saw_series(&self, tenant: &str, hashes: &[u64]) {
        let now = self.started.elapsed().as_secs();
        let mut series = self.series.lock().expect("series lock");
        let active = series.entry(tenant.to_owned()).or_default();
        for h in hashes {
            active.last_seen.insert(*h, now);
        }
        drop(series);
        let mut touched = self.touched.lock().expect("touched lock");
        touched
            .entry(tenant.to_owned())
            .or_default()
            .extend(hashes.iter().copied());
    }

    /// The series seen since the last call, by tenant: the shared count refreshes them, so a
    /// series this process keeps seeing stays active for every process.
    pub fn touched(&self) -> Vec<(String, Vec<u64>)> {
        std::mem::take(&mut *self.touched.lock().expect("touched lock"))
            .into_iter()
            .map(|(t, h)| (t, h.into_iter().collect()))
            .collect()
    }

    /// Forgets a tenant's series (after its data is erased).
    pub fn forget(&self, tenant: &str) {
        self.series.lock().expect("series lock").remove(tenant);
        self.touched.lock().expect("touched lock").remove(tenant);
        self.buckets.lock().expect("buckets lock").remove(tenant);
    }

    /// A query slot of the tenant (this process's share of its slots: the limit divided by the
    /// live query processes, rounded up); waits up to 10 s, then 429.
    pub async fn query_slot(
        &self,
        tenant: &str,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
        let limits = self.limits(tenant);
        let want = limits
            .max_concurrent_queries
            .max(1)
            .div_ceil(self.peers.query());
        let sem = {
            let mut q = self.queries.lock().expect("queries lock");
            let (size, sem) = q
                .entry(tenant.to_owned())
                .or_insert_with(|| (want, Arc::new(Semaphore::new(want))));
            // A reloaded limit resizes the slots in place, so running queries stay counted.
            if *size < want {
                sem.add_permits(want - *size);
                *size = want;
            } else if *size > want {
                let taken = sem.forget_permits(*size - want);
                *size -= taken;
            }
            Arc::clone(sem)
        };
        match tokio::time::timeout(Duration::from_secs(10), sem.acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(ApiError::new(
                ErrorKind::ResourceExhausted,
                format!(
                    "tenant {tenant:?} has {} queries running, its limit",
                    limits.max_concurrent_queries
                ),
            )
            .retry_after(1)),
        }
    }

    /// A query slot of each tenant a read spans ([`Tenants::query_slot`]): each tenant's
    /// concurrency is charged. Taken in the set's order (by name), so two reads never wait on
    /// each other's slots.
    pub async fn query_slots(
        &self,
        tenants: &crate::auth::TenantSet,
    ) -> Result<Vec<tokio::sync::OwnedSemaphorePermit>, ApiError> {
        let mut slots = Vec::with_capacity(tenants.len());
        for tenant in tenants.iter() {
            slots.push(self.query_slot(tenant).await?);
        }
        Ok(slots)
    }

    /// Tenants with limits of their own.
    pub fn configured(&self) -> Vec<String> {
        let mut t: Vec<String> = self
            .config
            .read()
            .expect("config lock")
            .tenants
            .keys()
            .cloned()
            .collect();
        t.sort();
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_defaults_and_overrides() {
        let base = toml::Table::new();
        let c = TenantConfig::parse(
            "[defaults]\nmax_series = 10\nretention = \"7d\"\n[tenants.acme]\ningest_rate_bytes = 100\n",
            &base,
        )
        .unwrap();
        assert_eq!(c.defaults.max_series, 10);
        assert_eq!(c.defaults.retention, Secs(7 * 86_400));
        assert_eq!(
            c.defaults.max_label_names_per_series, 30,
            "Pyroscope's default"
        );
        let acme = &c.tenants["acme"];
        assert_eq!(acme.ingest_rate_bytes, 100);
        assert_eq!(acme.max_series, 10, "overrides start from [defaults]");
    }

    #[test]
    fn unknown_keys_fail() {
        let base = toml::Table::new();
        let err = TenantConfig::parse("[defaults]\nmax_serie = 10\n", &base).unwrap_err();
        assert!(err.to_string().contains("max_serie"), "{err}");
        assert!(TenantConfig::parse("[limits]\n", &base).is_err());
        assert!(TenantConfig::parse("[tenants.\"a/b\"]\n", &base).is_err());
    }

    #[test]
    fn command_line_base_overrides_file_defaults_but_not_tenants() {
        let mut base = toml::Table::new();
        base.insert("max_body_bytes".into(), toml::Value::Integer(1000));
        let c = TenantConfig::parse(
            "[defaults]\nmax_body_bytes = 5\n[tenants.x]\nmax_body_bytes = 7\n",
            &base,
        )
        .unwrap();
        assert_eq!(c.defaults.max_body_bytes, 1000);
        assert_eq!(c.tenants["x"].max_body_bytes, 7);
    }

    #[test]
    fn rate_limit_refuses_then_recovers() {
        let t = Tenants::load(None, {
            let mut b = toml::Table::new();
            b.insert("ingest_rate_bytes".into(), toml::Value::Integer(1000));
            b.insert("ingest_burst_bytes".into(), toml::Value::Integer(1000));
            b
        })
        .unwrap();
        assert!(t.charge_ingest("a", 800).is_ok());
        let err = t.charge_ingest("a", 800).unwrap_err();
        assert_eq!(err.kind, ErrorKind::ResourceExhausted);
        assert_eq!(err.retry_after, Some(1));
        assert!(t.charge_ingest("b", 800).is_ok(), "buckets are per tenant");
        // Bigger than the burst: passes on a full bucket only.
        assert!(t.charge_ingest("c", 5000).is_ok());
        assert!(t.charge_ingest("c", 1).is_err());
    }

    /// With four live ingest processes each takes a quarter of the rate (the burst whole); with
    /// two live query processes each hands out half the slots, rounded up.
    #[tokio::test]
    async fn limits_are_shared_by_the_live_processes() {
        let t = Tenants::load(None, {
            let mut b = toml::Table::new();
            b.insert("ingest_rate_bytes".into(), toml::Value::Integer(1000));
            b.insert("ingest_burst_bytes".into(), toml::Value::Integer(1000));
            b.insert("max_concurrent_queries".into(), toml::Value::Integer(3));
            b
        })
        .unwrap();
        t.set_peers(4, 2);
        assert!(t.charge_ingest("a", 1000).is_ok(), "the whole burst");
        // 500 more at 250 bytes/s: two seconds, where one process alone waits one.
        let err = t.charge_ingest("a", 500).unwrap_err();
        assert_eq!(err.retry_after, Some(2));
        let slots = [t.query_slot("a").await, t.query_slot("a").await];
        assert!(slots.iter().all(Result::is_ok));
        // A third waits for one of the two.
        let third = tokio::time::timeout(Duration::from_millis(50), t.query_slot("a")).await;
        assert!(third.is_err(), "a third slot of this process's two");
        // One process again: all three slots are its own.
        t.set_peers(1, 1);
        assert!(t.query_slot("a").await.is_ok());
    }

    #[test]
    fn series_limit() {
        let t = Tenants::load(None, {
            let mut b = toml::Table::new();
            b.insert("max_series".into(), toml::Value::Integer(2));
            b
        })
        .unwrap();
        assert!(t.admit_series("a", &[1, 2]).is_ok());
        assert!(
            t.admit_series("a", &[1, 2]).is_ok(),
            "known series are free"
        );
        assert!(t.admit_series("a", &[3]).is_err());
        assert!(t.admit_series("b", &[3]).is_ok());
    }

    #[test]
    fn series_count_while_active() {
        let t = Tenants::load(None, {
            let mut b = toml::Table::new();
            b.insert("max_series".into(), toml::Value::Integer(2));
            b
        })
        .unwrap();
        let hour = ACTIVE_SERIES_WINDOW.as_secs();
        assert!(t.admit_series_at("a", &[1, 2], 0).is_ok());
        // Series 2 keeps sending; series 1 (a replaced pod) stops.
        assert!(t.admit_series_at("a", &[2], hour / 2).is_ok());
        let err = t.admit_series_at("a", &[3], hour).unwrap_err();
        assert!(err.to_string().contains("active series"), "{err}");
        // An hour after its last profile, series 1 no longer counts.
        assert!(t.admit_series_at("a", &[3], hour + 1).is_ok());
        // 2 and 3 are active: a fourth is refused, and a refused write marks nothing seen.
        assert!(t.admit_series_at("a", &[4], hour + 2).is_err());
        assert!(t.admit_series_at("a", &[2, 3], hour + 3).is_ok());
        // Seeded series (after a restart) count as seen now.
        t.seed_series("b", [7, 8]);
        assert!(t.admit_series("b", &[9]).is_err());
    }
}

#[cfg(test)]
mod example_file {
    /// The example in `docs/examples/tenants.toml` stays valid.
    #[test]
    fn documented_example_parses() {
        let text = include_str!("../../docs/examples/tenants.toml");
        let c = super::TenantConfig::parse(text, &toml::Table::new()).unwrap();
        assert_eq!(
            c.defaults,
            super::TenantLimits::default(),
            "the example shows the defaults"
        );
        assert_eq!(c.tenants["acme"].retention, super::Secs(90 * 86_400));
        assert_eq!(
            c.tenants["trial-user-42"].max_query_range,
            super::Secs(86_400)
        );
    }
}
