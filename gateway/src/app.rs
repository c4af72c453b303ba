//! The state every handler reads ([`App`]: storage, tenants' limits, authentication, metrics,
//! roles, the Parca agents' stacks, `kiln upload`'s batch ids), and what the APIs share below
//! their transports: the decode budget ([`budget`]) and the write path every write API ends in
//! ([`write`](mod@write)).

pub mod budget;
mod roles;
mod stacks;
mod upload_ids;
pub mod write;

use std::sync::Arc;

use axum::http::HeaderMap;
use kiln_storage::Storage;

use crate::auth::{Authenticator, Scope, TenantId};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::tenants::{TenantLimits, Tenants};
use budget::DecodeBudget;

pub use roles::{Roles, RolesError};
pub use stacks::{DEFAULT_STACK_CACHE_BYTES, StackCache};
pub use upload_ids::UploadIds;

/// Everything a request handler needs.
#[derive(Debug)]
pub struct App {
    pub storage: Storage,
    pub tenants: Tenants,
    pub auth: Authenticator,
    pub metrics: Metrics,
    /// Ceiling for one gRPC message (tenants' own limits are checked after decoding).
    pub grpc_max_message_bytes: usize,
    /// What this process does: its APIs and background work.
    pub roles: Roles,
    /// Decoded bytes ingest requests may hold at once.
    pub decode_budget: DecodeBudget,
    /// The stacks Parca agents sent, per tenant (`Write` asks only for the others).
    pub stacks: StackCache,
    /// `kiln upload` batches stored recently, so a resumed upload stores none twice.
    pub upload_ids: UploadIds,
}

impl App {
    /// An app with built-in tenant limits.
    pub fn new(storage: Storage, auth: Authenticator, tenants: Tenants) -> Self {
        let metrics = Metrics::default();
        metrics.register_storage(storage.metrics());
        Self {
            storage,
            tenants,
            auth,
            metrics,
            grpc_max_message_bytes: 64 << 20,
            roles: Roles::ALL,
            decode_budget: DecodeBudget::new(256 << 20),
            stacks: StackCache::new(DEFAULT_STACK_CACHE_BYTES),
            upload_ids: UploadIds::default(),
        }
    }

    /// The limits of a tenant.
    pub fn limits(&self, tenant: &str) -> TenantLimits {
        self.tenants.limits(tenant)
    }

    /// Authenticates a request for `scope`; refusals are counted.
    pub fn authenticate(&self, headers: &HeaderMap, scope: Scope) -> Result<TenantId, ApiError> {
        self.auth
            .authenticate(headers, scope)
            .map(|p| p.tenant)
            .inspect(|tenant| {
                // The request's span (`transport::telemetry::track`) carries its tenant from
                // here on.
                tracing::Span::current().record("tenant", tenant.as_str());
            })
            .inspect_err(|e| self.metrics.auth_refused(e.reason()))
    }
}

/// Shared handle.
pub type AppRef = Arc<App>;
