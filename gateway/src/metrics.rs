//! Kiln's own metrics and per-tenant usage, served on `/metrics` in the Prometheus text format.
//! Names follow `kiln_<subsystem>_<name>_<unit>[_total]`; label values are bounded (protocol,
//! outcome, method, reason) except `tenant`, which is the point of metering.

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde::Serialize;

/// An API method and its transport (`api::api_method`, `api::transport`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiLabels {
    pub method: &'static str,
    pub transport: &'static str,
}

/// [`ApiLabels`] and the answer's status class (`2xx` … `5xx`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiRequestLabels {
    pub method: &'static str,
    pub transport: &'static str,
    pub status: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    pub method: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheLabels {
    /// `symbols` or `parquet_metadata`.
    pub cache: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabels {
    pub tenant: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    pub tenant: String,
    pub reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RoleLabels {
    pub role: &'static str,
}

/// The registry and its metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    /// Requests by API method, transport and status class (the telemetry layer).
    pub api_requests: Family<ApiRequestLabels, Counter>,
    /// Time from a request's arrival to its answer's headers, by API method and transport.
    pub api_duration: Family<ApiLabels, Histogram>,
    /// Requests being served now.
    pub api_in_flight: Family<ApiLabels, Gauge>,
    /// Bytes each query read from the object store, by method (1 KiB to 256 MiB buckets).
    pub query_read_bytes: Family<MethodLabels, Histogram>,
    pub auth_refusals: Family<ReasonLabels, Counter>,
    /// Live members of the cluster by role, as this process's last heartbeat counted them.
    pub cluster_members: Family<RoleLabels, Gauge>,
    /// Connections closed on accept because `--max-connections` were open.
    pub connections_refused: Counter,
    pub tenant_received_bytes: Family<TenantLabels, Counter>,
    pub tenant_decompressed_bytes: Family<TenantLabels, Counter>,
    pub tenant_profiles: Family<TenantLabels, Counter>,
    pub tenant_samples: Family<TenantLabels, Counter>,
    /// Settings written or deleted (`settings.v1`), per tenant.
    pub tenant_settings_writes: Family<TenantLabels, Counter>,
    /// Ad-hoc profiles uploaded, and their bytes as uploaded, per tenant.
    pub tenant_adhoc_uploads: Family<TenantLabels, Counter>,
    pub tenant_adhoc_upload_bytes: Family<TenantLabels, Counter>,
    pub tenant_refused: Family<RefusedLabels, Counter>,
    pub tenant_stored_bytes: Family<TenantLabels, Gauge>,
    /// Blocks quarantined since start-up (unreadable: left out of answers and compaction).
    pub storage_quarantined_blocks: Gauge,
    /// Bytes queries read from the object store since start-up.
    pub storage_query_read_bytes: Gauge,
    /// Series row ranges queries read from rollups instead of samples since start-up.
    pub storage_query_rollup_reads: Gauge,
    /// Lookups and misses of the query caches since start-up, by cache.
    pub storage_cache_lookups: Family<CacheLabels, Gauge>,
    pub storage_cache_misses: Family<CacheLabels, Gauge>,
    /// Bytes the allocator has handed out and not had back (jemalloc's `stats.allocated`).
    pub memory_allocated: Gauge,
    /// Bytes of physical memory the allocator holds (jemalloc's `stats.resident`).
    pub memory_resident: Gauge,
    /// Bytes of the in-flight decode budget held by requests now.
    pub ingest_decode_budget_used: Gauge,
    /// Stack ids of Parca `Write` streams found in the known-stack cache, and not found.
    pub parca_stack_cache_hits: Counter,
    pub parca_stack_cache_misses: Counter,
    /// Bytes of stacks the known-stack cache holds (refreshed on each scrape).
    pub parca_stack_cache_bytes: Gauge,
    seen: Mutex<std::collections::BTreeSet<String>>,
    /// Each tenant's counters as last added to the metastore's ([`Metrics::unflushed`]).
    flushed: Mutex<std::collections::HashMap<String, UsageCounters>>,
}

/// Usage counters by name (`received_bytes`, `refused:rate_limited`, ...): the shape in which
/// the metastore keeps them for the cluster.
pub type UsageCounters = std::collections::BTreeMap<String, u64>;

/// A tenant's usage, as the admin API shows it.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Usage {
    pub tenant: String,
    pub received_bytes: u64,
    pub decompressed_bytes: u64,
    pub profiles: u64,
    pub samples: u64,
    pub stored_bytes: u64,
    pub settings_writes: u64,
    pub adhoc_uploads: u64,
    pub adhoc_upload_bytes: u64,
    pub refused: std::collections::BTreeMap<String, u64>,
}

impl Usage {
    /// The counters by name (stored bytes aside: those come from the metastore's blocks).
    pub fn counters(&self) -> UsageCounters {
        let mut out: UsageCounters = [
            ("received_bytes", self.received_bytes),
            ("decompressed_bytes", self.decompressed_bytes),
            ("profiles", self.profiles),
            ("samples", self.samples),
            ("settings_writes", self.settings_writes),
            ("adhoc_uploads", self.adhoc_uploads),
            ("adhoc_upload_bytes", self.adhoc_upload_bytes),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        for (reason, n) in &self.refused {
            out.insert(format!("refused:{reason}"), *n);
        }
        out
    }

    /// Adds counters by name ([`Usage::counters`]); unknown names are left out.
    pub fn add(&mut self, counters: &UsageCounters) {
        for (name, &n) in counters {
            let field = match name.as_str() {
                "received_bytes" => &mut self.received_bytes,
                "decompressed_bytes" => &mut self.decompressed_bytes,
                "profiles" => &mut self.profiles,
                "samples" => &mut self.samples,
                "settings_writes" => &mut self.settings_writes,
                "adhoc_uploads" => &mut self.adhoc_uploads,
                "adhoc_upload_bytes" => &mut self.adhoc_upload_bytes,
                other => match other.strip_prefix("refused:") {
                    Some(reason) if REASONS.contains(&reason) => {
                        self.refused.entry(reason.to_owned()).or_default()
                    }
                    _ => continue,
                },
            };
            *field += n;
        }
        self.refused.retain(|_, n| *n > 0);
    }
}

/// Every refusal reason `ApiError::reason` gives.
pub const REASONS: [&str; 11] = [
    "invalid",
    "unauthenticated",
    "forbidden",
    "not_found",
    "too_large",
    "unsupported_media_type",
    "rate_limited",
    "timeout",
    "unimplemented",
    "unavailable",
    "internal",
];

impl Default for Metrics {
    fn default() -> Self {
        let mut r = Registry::with_prefix("kiln");
        let m = Self {
            registry: Mutex::new(Registry::default()),
            api_requests: Family::default(),
            // 1 ms to about 65 s.
            api_duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 17))
            }),
            api_in_flight: Family::default(),
            query_read_bytes: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(1024.0, 4.0, 10))
            }),
            auth_refusals: Family::default(),
            cluster_members: Family::default(),
            connections_refused: Counter::default(),
            tenant_received_bytes: Family::default(),
            tenant_decompressed_bytes: Family::default(),
            tenant_profiles: Family::default(),
            tenant_samples: Family::default(),
            tenant_settings_writes: Family::default(),
            tenant_adhoc_uploads: Family::default(),
            tenant_adhoc_upload_bytes: Family::default(),
            tenant_refused: Family::default(),
            tenant_stored_bytes: Family::default(),
            storage_quarantined_blocks: Gauge::default(),
            storage_query_read_bytes: Gauge::default(),
            storage_query_rollup_reads: Gauge::default(),
            storage_cache_lookups: Family::default(),
            storage_cache_misses: Family::default(),
            memory_allocated: Gauge::default(),
            memory_resident: Gauge::default(),
            ingest_decode_budget_used: Gauge::default(),
            parca_stack_cache_hits: Counter::default(),
            parca_stack_cache_misses: Counter::default(),
            parca_stack_cache_bytes: Gauge::default(),
            seen: Mutex::new(std::collections::BTreeSet::new()),
            flushed: Mutex::default(),
        };
        r.register(
            "api_requests",
            "Requests by API method, transport and status class",
            m.api_requests.clone(),
        );
        r.register(
            "api_request_duration_seconds",
            "Time from a request's arrival to its answer, by API method and transport",
            m.api_duration.clone(),
        );
        r.register(
            "api_requests_in_flight",
            "Requests being served now, by API method and transport",
            m.api_in_flight.clone(),
        );
        r.register(
            "query_read_bytes",
            "Bytes each query read from the object store, by method",
            m.query_read_bytes.clone(),
        );
        r.register(
            "connections_refused",
            "Connections closed on accept because --max-connections were open",
            m.connections_refused.clone(),
        );
        r.register(
            "auth_refusals",
            "Requests refused before a tenant was known, by reason",
            m.auth_refusals.clone(),
        );
        r.register(
            "cluster_members",
            "Live members of the cluster by role, as this process last counted them",
            m.cluster_members.clone(),
        );
        r.register(
            "tenant_ingest_received_bytes",
            "Ingest request bytes as sent, per tenant",
            m.tenant_received_bytes.clone(),
        );
        r.register(
            "tenant_ingest_decompressed_bytes",
            "Ingested profile bytes after decompression, per tenant",
            m.tenant_decompressed_bytes.clone(),
        );
        r.register(
            "tenant_ingest_profiles",
            "Profile series stored, per tenant",
            m.tenant_profiles.clone(),
        );
        r.register(
            "tenant_ingest_samples",
            "Samples stored, per tenant",
            m.tenant_samples.clone(),
        );
        r.register(
            "tenant_settings_writes",
            "Settings written or deleted (settings.v1), per tenant",
            m.tenant_settings_writes.clone(),
        );
        r.register(
            "tenant_adhoc_uploads",
            "Ad-hoc profiles uploaded (adhocprofiles.v1), per tenant",
            m.tenant_adhoc_uploads.clone(),
        );
        r.register(
            "tenant_adhoc_upload_bytes",
            "Bytes of ad-hoc profiles as uploaded, per tenant",
            m.tenant_adhoc_upload_bytes.clone(),
        );
        r.register(
            "tenant_refused_requests",
            "Requests refused, per tenant and reason",
            m.tenant_refused.clone(),
        );
        r.register(
            "tenant_stored_bytes",
            "Bytes of blocks stored, per tenant",
            m.tenant_stored_bytes.clone(),
        );
        r.register(
            "storage_quarantined_blocks",
            "Blocks quarantined since start-up because they could not be read",
            m.storage_quarantined_blocks.clone(),
        );
        r.register(
            "storage_query_read_bytes",
            "Bytes read from the object store by queries since start-up",
            m.storage_query_read_bytes.clone(),
        );
        r.register(
            "storage_query_rollup_reads",
            "Series row ranges read from pre-aggregated rollups instead of samples since start-up",
            m.storage_query_rollup_reads.clone(),
        );
        r.register(
            "storage_cache_lookups",
            "Lookups of the query caches (symbols, parquet metadata, partial results) since start-up",
            m.storage_cache_lookups.clone(),
        );
        r.register(
            "storage_cache_misses",
            "Misses of the query caches (symbols, parquet metadata, partial results) since start-up",
            m.storage_cache_misses.clone(),
        );
        r.register(
            "memory_allocated_bytes",
            "Bytes allocated and not freed (jemalloc stats.allocated)",
            m.memory_allocated.clone(),
        );
        r.register(
            "memory_resident_bytes",
            "Bytes of physical memory the allocator holds (jemalloc stats.resident)",
            m.memory_resident.clone(),
        );
        r.register(
            "ingest_decode_budget_used_bytes",
            "Bytes of the in-flight decode budget (--max-inflight-decode-bytes) held now",
            m.ingest_decode_budget_used.clone(),
        );
        r.register(
            "parca_stack_cache_hits",
            "Stack ids of Parca Write streams the known-stack cache knew",
            m.parca_stack_cache_hits.clone(),
        );
        r.register(
            "parca_stack_cache_misses",
            "Stack ids of Parca Write streams the known-stack cache did not know (asked of the agent)",
            m.parca_stack_cache_misses.clone(),
        );
        r.register(
            "parca_stack_cache_bytes",
            "Bytes of stacks the known-stack cache holds",
            m.parca_stack_cache_bytes.clone(),
        );
        *m.registry.lock().expect("metrics lock") = r;
        m
    }
}

fn t(tenant: &str) -> TenantLabels {
    TenantLabels {
        tenant: tenant.to_owned(),
    }
}

impl Metrics {
    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().expect("metrics lock");
        prometheus_client::encoding::text::encode(&mut out, &registry)
            .expect("writing to a String cannot fail");
        out
    }

    /// Registers the storage engine's metrics beside these.
    pub fn register_storage(&self, storage: &kiln_storage::metrics::StorageMetrics) {
        storage.register(&mut self.registry.lock().expect("metrics lock"));
    }

    /// Registers metrics read at each scrape (a subsystem's own counters).
    pub fn register_collector(&self, c: Box<dyn prometheus_client::collector::Collector>) {
        self.registry
            .lock()
            .expect("metrics lock")
            .register_collector(c);
    }

    /// Registers the symbolizer's metrics (`kiln_symbolizer_…`).
    pub fn register_symbolizer(&self, m: &kiln_symbolize::Metrics) {
        m.register(&mut self.registry.lock().expect("metrics lock"));
    }

    /// Records what a query read (its [`kiln_storage::query::QueryStats`]).
    pub fn query_read(&self, method: &'static str, stats: &kiln_storage::query::QueryStats) {
        self.query_read_bytes
            .get_or_create(&MethodLabels { method })
            .observe(stats.bytes_read as f64);
    }

    pub fn auth_refused(&self, reason: &'static str) {
        self.auth_refusals
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    pub fn connection_refused(&self) {
        self.connections_refused.inc();
    }

    pub fn refused(&self, tenant: &str, reason: &'static str) {
        self.see(tenant);
        self.tenant_refused
            .get_or_create(&RefusedLabels {
                tenant: tenant.to_owned(),
                reason,
            })
            .inc();
    }

    pub fn received(&self, tenant: &str, bytes: usize) {
        self.see(tenant);
        self.tenant_received_bytes
            .get_or_create(&t(tenant))
            .inc_by(bytes as u64);
    }

    pub fn decompressed(&self, tenant: &str, bytes: usize) {
        self.tenant_decompressed_bytes
            .get_or_create(&t(tenant))
            .inc_by(bytes as u64);
    }

    pub fn stored(&self, tenant: &str, profiles: usize, samples: usize) {
        self.tenant_profiles
            .get_or_create(&t(tenant))
            .inc_by(profiles as u64);
        self.tenant_samples
            .get_or_create(&t(tenant))
            .inc_by(samples as u64);
    }

    pub fn settings_written(&self, tenant: &str) {
        self.see(tenant);
        self.tenant_settings_writes.get_or_create(&t(tenant)).inc();
    }

    pub fn adhoc_uploaded(&self, tenant: &str, bytes: usize) {
        self.see(tenant);
        self.tenant_adhoc_uploads.get_or_create(&t(tenant)).inc();
        self.tenant_adhoc_upload_bytes
            .get_or_create(&t(tenant))
            .inc_by(bytes as u64);
    }

    pub fn set_stored_bytes(&self, tenant: &str, bytes: u64) {
        self.tenant_stored_bytes
            .get_or_create(&t(tenant))
            .set(bytes as i64);
    }

    /// Removes every tenant's stored-bytes gauge (another process exports them).
    pub fn clear_stored_bytes(&self) {
        self.tenant_stored_bytes.clear();
    }

    /// Counters of one tenant since start-up (stored bytes come from the metastore).
    pub fn usage(&self, tenant: &str, stored_bytes: u64) -> Usage {
        let get =
            |f: &Family<TenantLabels, Counter>| f.get(&t(tenant)).map(|c| c.get()).unwrap_or(0);
        let refused = REASONS
            .iter()
            .filter_map(|reason| {
                let n = self
                    .tenant_refused
                    .get(&RefusedLabels {
                        tenant: tenant.to_owned(),
                        reason,
                    })
                    .map(|c| c.get())
                    .unwrap_or(0);
                (n > 0).then(|| ((*reason).to_owned(), n))
            })
            .collect();
        Usage {
            tenant: tenant.to_owned(),
            received_bytes: get(&self.tenant_received_bytes),
            decompressed_bytes: get(&self.tenant_decompressed_bytes),
            profiles: get(&self.tenant_profiles),
            samples: get(&self.tenant_samples),
            stored_bytes,
            settings_writes: get(&self.tenant_settings_writes),
            adhoc_uploads: get(&self.tenant_adhoc_uploads),
            adhoc_upload_bytes: get(&self.tenant_adhoc_upload_bytes),
            refused,
        }
    }

    /// What this process counted for `tenant` since it last added to the metastore's
    /// counters ([`Metrics::flushed`]).
    pub fn unflushed(&self, tenant: &str) -> UsageCounters {
        let now = self.usage(tenant, 0).counters();
        let flushed = self.flushed.lock().expect("flushed lock");
        let before = flushed.get(tenant);
        now.into_iter()
            .map(|(k, v)| {
                let was = before.and_then(|b| b.get(&k)).copied().unwrap_or(0);
                (k, v.saturating_sub(was))
            })
            .filter(|(_, v)| *v > 0)
            .collect()
    }

    /// Notes `added` as added to the metastore's counters for `tenant`.
    pub fn flushed(&self, tenant: &str, added: &UsageCounters) {
        let mut flushed = self.flushed.lock().expect("flushed lock");
        let at = flushed.entry(tenant.to_owned()).or_default();
        for (k, v) in added {
            *at.entry(k.clone()).or_default() += v;
        }
    }

    /// Tenants the counters have seen since start-up.
    pub fn tenants(&self) -> Vec<String> {
        self.seen
            .lock()
            .expect("seen lock")
            .iter()
            .cloned()
            .collect()
    }

    fn see(&self, tenant: &str) {
        let mut seen = self.seen.lock().expect("seen lock");
        if !seen.contains(tenant) {
            seen.insert(tenant.to_owned());
        }
    }
}

#[cfg(test)]
mod usage_tests {
    use super::*;

    /// Counters by name go back into a usage as they came out; the unflushed share is what was
    /// counted since the last flush.
    #[test]
    fn usage_counters_round_trip_and_unflushed_shares_shrink() {
        let m = Metrics::default();
        m.tenant_profiles.get_or_create(&t("a")).inc_by(3);
        m.tenant_refused
            .get_or_create(&RefusedLabels {
                tenant: "a".into(),
                reason: "rate_limited",
            })
            .inc_by(2);
        let usage = m.usage("a", 0);
        let mut back = Usage {
            tenant: "a".into(),
            ..Default::default()
        };
        back.add(&usage.counters());
        assert_eq!(back, usage);
        let first = m.unflushed("a");
        assert_eq!(first.get("profiles"), Some(&3));
        assert_eq!(first.get("refused:rate_limited"), Some(&2));
        m.flushed("a", &first);
        assert!(m.unflushed("a").is_empty());
        m.tenant_profiles.get_or_create(&t("a")).inc();
        assert_eq!(
            m.unflushed("a").into_iter().collect::<Vec<_>>(),
            [("profiles".into(), 1)]
        );
        assert!(m.unflushed("b").is_empty());
    }
}
