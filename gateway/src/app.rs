//! Shared server state.

pub mod budget;
pub mod write;

use std::sync::Arc;

use axum::http::HeaderMap;
use kiln_storage::Storage;

use crate::auth::{Authenticator, Scope, TenantId};
use crate::budget::DecodeBudget;
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
    /// What this process does: its APIs and background work.
    pub roles: Roles,
    /// Decoded bytes ingest requests may hold at once.
    pub decode_budget: DecodeBudget,
    /// The stacks Parca agents sent, per tenant (`Write` asks only for the others).
    pub stacks: crate::parca::StackCache,
    /// `kiln upload` batches stored recently, so a resumed upload stores none twice.
    pub upload_ids: crate::parca::UploadIds,
}

/// The roles of a `kiln` process (`--roles`). Any number of processes of each role can share
/// one metastore and one object store; the single binary runs all three.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Roles {
    /// Accepts profiles (`/ingest`, `push.v1`, OTLP).
    pub ingest: bool,
    /// Answers queries (`querier.v1`).
    pub query: bool,
    /// Compacts, applies retention, deletes tombstoned objects and sweeps orphans.
    pub compact: bool,
}

/// A `--roles` value Kiln cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RolesError {
    #[error("unknown role {0:?}: use ingest, query, compact or all")]
    Unknown(String),
    #[error("give at least one role: ingest, query, compact")]
    None,
}

impl Roles {
    /// Every role.
    pub const ALL: Self = Self {
        ingest: true,
        query: true,
        compact: true,
    };

    /// Parses `ingest,query,compact` (any non-empty subset; `all` for every role).
    pub fn parse(s: &str) -> Result<Self, RolesError> {
        let mut roles = Self {
            ingest: false,
            query: false,
            compact: false,
        };
        for r in s.split(',').map(str::trim).filter(|r| !r.is_empty()) {
            match r {
                "ingest" => roles.ingest = true,
                "query" => roles.query = true,
                "compact" => roles.compact = true,
                "all" => roles = Self::ALL,
                other => return Err(RolesError::Unknown(other.to_owned())),
            }
        }
        if roles
            == (Self {
                ingest: false,
                query: false,
                compact: false,
            })
        {
            return Err(RolesError::None);
        }
        Ok(roles)
    }
}

impl std::fmt::Display for Roles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = [
            (self.ingest, "ingest"),
            (self.query, "query"),
            (self.compact, "compact"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect();
        f.write_str(&names.join(","))
    }
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
            stacks: crate::parca::StackCache::new(crate::parca::DEFAULT_STACK_CACHE_BYTES),
            upload_ids: crate::parca::UploadIds::default(),
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
                // The request's span (`transport::telemetry::track`) carries its tenant from here on.
                tracing::Span::current().record("tenant", tenant.as_str());
            })
            .inspect_err(|e| self.metrics.auth_refused(e.reason()))
    }
}

/// Shared handle.
pub type AppRef = Arc<App>;
