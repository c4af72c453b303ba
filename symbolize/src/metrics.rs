//! The symbolizer's metrics (names in `docs/instrumentation.md`); the process registers them with
//! [`Metrics::register`].

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// A debuginfod fetch's outcome: `found`, `missing`, `failed`, `timeout`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
}

/// Where a frame's name came from: `upload`, `debuginfod`, or `none` (no file names it).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabels {
    pub source: &'static str,
}

#[derive(Debug)]
pub struct Metrics {
    pub debuginfod_fetches: Family<OutcomeLabels, Counter>,
    pub debuginfod_fetch_seconds: Histogram,
    /// Lookups that answered before their fetch ended (the query's deadline came first).
    pub debuginfod_deadline: Counter,
    /// Addresses resolved, by where the file came from.
    pub addresses: Family<SourceLabels, Counter>,
    pub resolved_cache_hits: Counter,
    pub resolved_cache_misses: Counter,
    /// Bytes of debuginfod's files in the object store, as the process that bounds them last
    /// counted (0 elsewhere), and the bytes it removed.
    pub debuginfod_stored_bytes: Gauge,
    pub debuginfod_evicted_bytes: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let m = Self {
            debuginfod_fetches: Family::default(),
            // 10 ms to about 5.5 min.
            debuginfod_fetch_seconds: Histogram::new(exponential_buckets(0.01, 2.0, 16)),
            debuginfod_deadline: Counter::default(),
            addresses: Family::default(),
            resolved_cache_hits: Counter::default(),
            resolved_cache_misses: Counter::default(),
            debuginfod_stored_bytes: Gauge::default(),
            debuginfod_evicted_bytes: Counter::default(),
        };
        // Every label value exported from the start, at zero.
        for outcome in ["found", "missing", "failed", "timeout"] {
            let _ = m
                .debuginfod_fetches
                .get_or_create(&OutcomeLabels { outcome });
        }
        for source in ["upload", "debuginfod", "none"] {
            let _ = m.addresses.get_or_create(&SourceLabels { source });
        }
        m
    }
}

impl Metrics {
    pub(crate) fn debuginfod_fetch(&self, outcome: &'static str) {
        self.debuginfod_fetches
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    pub(crate) fn addresses(&self, source: &'static str, n: u64) {
        self.addresses
            .get_or_create(&SourceLabels { source })
            .inc_by(n);
    }

    /// Registers every metric under `symbolizer_…` of `registry` (the process's has the `kiln`
    /// prefix).
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("symbolizer");
        r.register(
            "debuginfod_fetches",
            "Fetches from debuginfod servers, by outcome",
            self.debuginfod_fetches.clone(),
        );
        r.register(
            "debuginfod_fetch_seconds",
            "Time of a fetch from debuginfod servers, retries included",
            self.debuginfod_fetch_seconds.clone(),
        );
        r.register(
            "debuginfod_deadline_hits",
            "Queries that answered before a debuginfod fetch they waited for ended",
            self.debuginfod_deadline.clone(),
        );
        r.register(
            "addresses",
            "Native addresses looked up, by where their debug file came from",
            self.addresses.clone(),
        );
        r.register(
            "resolved_cache_hits",
            "Addresses answered from the resolved-location cache",
            self.resolved_cache_hits.clone(),
        );
        r.register(
            "resolved_cache_misses",
            "Addresses looked up in a debug file",
            self.resolved_cache_misses.clone(),
        );
        r.register(
            "debuginfod_stored_bytes",
            "Bytes of debuginfod's files in the object store (on the process that bounds them)",
            self.debuginfod_stored_bytes.clone(),
        );
        r.register(
            "debuginfod_evicted_bytes",
            "Bytes of debuginfod's files removed, least recently used first, past --debuginfod-stored-size",
            self.debuginfod_evicted_bytes.clone(),
        );
    }
}
