//! Kiln's own metrics, served on `/metrics` in the Prometheus text format. Names follow
//! `kiln_<subsystem>_<name>_<unit>[_total]`; label values are bounded (protocol, outcome, method).

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IngestLabels {
    pub protocol: &'static str,
    pub outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueryLabels {
    pub method: &'static str,
    pub outcome: &'static str,
}

/// The registry and its metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    pub ingest_requests: Family<IngestLabels, Counter>,
    pub ingest_received_bytes: Counter,
    pub ingest_decompressed_bytes: Counter,
    pub ingest_samples: Counter,
    pub ingest_profiles: Counter,
    pub query_requests: Family<QueryLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("kiln");
        let m = Self {
            registry: Mutex::new(Registry::default()),
            ingest_requests: Family::default(),
            ingest_received_bytes: Counter::default(),
            ingest_decompressed_bytes: Counter::default(),
            ingest_samples: Counter::default(),
            ingest_profiles: Counter::default(),
            query_requests: Family::default(),
        };
        registry.register(
            "ingest_requests",
            "Ingest requests by protocol and outcome",
            m.ingest_requests.clone(),
        );
        registry.register(
            "ingest_received_bytes",
            "Request body bytes received by ingest, as sent",
            m.ingest_received_bytes.clone(),
        );
        registry.register(
            "ingest_decompressed_bytes",
            "Profile bytes ingested after decompression",
            m.ingest_decompressed_bytes.clone(),
        );
        registry.register("ingest_samples", "Samples stored", m.ingest_samples.clone());
        registry.register(
            "ingest_profiles",
            "Profile series stored",
            m.ingest_profiles.clone(),
        );
        registry.register(
            "query_requests",
            "Query requests by method and outcome",
            m.query_requests.clone(),
        );
        *m.registry.lock().expect("metrics lock") = registry;
        m
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

    pub fn ingest(&self, protocol: &'static str, ok: bool) {
        let outcome = if ok { "ok" } else { "error" };
        self.ingest_requests
            .get_or_create(&IngestLabels { protocol, outcome })
            .inc();
    }

    pub fn query(&self, method: &'static str, ok: bool) {
        let outcome = if ok { "ok" } else { "error" };
        self.query_requests
            .get_or_create(&QueryLabels { method, outcome })
            .inc();
    }
}
