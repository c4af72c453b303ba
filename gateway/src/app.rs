//! Shared server state and the limits requests are checked against.

use std::sync::Arc;

use kiln_otel::NormalizeLimits;
use kiln_storage::Storage;

use crate::metrics::Metrics;
use crate::tenant::AuthMode;

/// Request limits.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request body, as sent (413 above it).
    pub max_body_bytes: usize,
    /// Largest profile once decompressed (413 above it; bounds memory against gzip bombs).
    pub max_decompressed_bytes: usize,
    pub normalize: NormalizeLimits,
    /// Flame graph nodes when a query names none.
    pub max_flamegraph_nodes_default: i64,
    /// Largest `max_nodes` a query may ask for.
    pub max_flamegraph_nodes_max: i64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: 64 << 20,
            max_decompressed_bytes: 64 << 20,
            normalize: NormalizeLimits::default(),
            max_flamegraph_nodes_default: 8192,
            max_flamegraph_nodes_max: 1 << 20,
        }
    }
}

/// Everything a request handler needs.
#[derive(Debug)]
pub struct App {
    pub storage: Storage,
    pub limits: Limits,
    pub auth: AuthMode,
    pub metrics: Metrics,
}

/// Shared handle.
pub type AppRef = Arc<App>;
