//! Shared server state.

use std::sync::Arc;

use axum::http::HeaderMap;
use kiln_storage::Storage;

use crate::auth::{Authenticator, Scope};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::tenants::{TenantLimits, Tenants};

/// Everything a request handler needs.
#[derive(Debug)]
pub struct App {
    pub storage: Storage,
    pub tenants: Tenants,
    pub auth: Authenticator,
    pub metrics: Metrics,
    /// Ceiling for one gRPC message (tenants' own limits are checked after decoding).
    pub grpc_max_message_bytes: usize,
}

impl App {
    /// An app with built-in tenant limits.
    pub fn new(storage: Storage, auth: Authenticator, tenants: Tenants) -> Self {
        Self {
            storage,
            tenants,
            auth,
            metrics: Metrics::default(),
            grpc_max_message_bytes: 64 << 20,
        }
    }

    /// The limits of a tenant.
    pub fn limits(&self, tenant: &str) -> TenantLimits {
        self.tenants.limits(tenant)
    }

    /// Authenticates a request for `scope`; refusals are counted.
    pub fn authenticate(&self, headers: &HeaderMap, scope: Scope) -> Result<String, ApiError> {
        self.auth
            .authenticate(headers, scope)
            .map(|p| p.tenant)
            .inspect_err(|e| self.metrics.auth_refused(e.reason()))
    }
}

/// Shared handle.
pub type AppRef = Arc<App>;
