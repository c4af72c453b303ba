//! Who is calling: a request's authentication as the extractors its handler receives
//! ([`Reads`], [`ReadsAcross`], [`Writes`], [`Admin`], and [`Credentials`] where the scope
//! depends on the call),
//! and what the telemetry layer learns of it ([`CallerSlot`]), so that the layer counts every
//! refusal: by reason before a tenant is known, by tenant and reason after.
//!
//! One function ([`authenticate`]) authenticates for all of them and for gRPC's `steer`; no
//! handler reads credentials itself.

use std::sync::{Arc, OnceLock};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{Extensions, HeaderMap};

use crate::app::AppRef;
use crate::auth::{Principal, Scope, TenantId, TenantSet};
use crate::error::ApiError;

/// What authentication found for a request: set once by [`authenticate`], read by the telemetry
/// layer once the response is made. The layer puts one in each request's extensions; it lives
/// as long as the request.
#[derive(Debug, Clone, Default)]
pub struct CallerSlot(Arc<OnceLock<Caller>>);

/// A request's caller, as the telemetry layer counts its refusals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// Authenticated as this tenant: a refusal is the tenant's.
    Tenant(TenantId),
    /// Refused by authentication: no tenant is known.
    Refused,
}

impl CallerSlot {
    /// The caller, when the request was authenticated (or refused by authentication).
    pub fn get(&self) -> Option<&Caller> {
        self.0.get()
    }

    fn set(&self, caller: Caller) {
        // The first answer stands: a request is authenticated once.
        let _ = self.0.set(caller);
    }
}

/// Authenticates a request for `scope` and tells the request's [`CallerSlot`] (in
/// `extensions`, when the telemetry layer put one there) and its span who called. The tenant
/// is the one the request reads or writes: a read spanning tenants is refused here.
pub fn authenticate(
    app: &AppRef,
    headers: &HeaderMap,
    extensions: &Extensions,
    scope: Scope,
) -> Result<TenantId, ApiError> {
    authenticate_reads(app, headers, extensions, scope).and_then(TenantSet::single)
}

/// As [`authenticate`], for an API that reads across tenants (`X-Scope-OrgID: a|b`): every
/// tenant the request covers.
pub fn authenticate_reads(
    app: &AppRef,
    headers: &HeaderMap,
    extensions: &Extensions,
    scope: Scope,
) -> Result<TenantSet, ApiError> {
    principal(app, headers, extensions.get::<CallerSlot>(), scope).map(|p| p.reads)
}

fn principal(
    app: &AppRef,
    headers: &HeaderMap,
    slot: Option<&CallerSlot>,
    scope: Scope,
) -> Result<Principal, ApiError> {
    let result = app.auth.authenticate(headers, scope);
    let caller = match &result {
        Ok(p) => {
            // The request's span (`transport::telemetry::track`) carries its tenant from here.
            tracing::Span::current().record("tenant", p.reads.to_string());
            Caller::Tenant(p.tenant.clone())
        }
        Err(_) => Caller::Refused,
    };
    if let Some(slot) = slot {
        slot.set(caller);
    }
    result
}

/// The tenant of a request authenticated for `read`.
#[derive(Debug, Clone)]
pub struct Reads(pub TenantId);

/// The tenants of a request authenticated for `read` on an API that spans tenants (the
/// querier, the render APIs).
#[derive(Debug, Clone)]
pub struct ReadsAcross(pub TenantSet);

impl FromRequestParts<AppRef> for ReadsAcross {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &AppRef) -> Result<Self, ApiError> {
        authenticate_reads(app, &parts.headers, &parts.extensions, Scope::Read).map(Self)
    }
}

/// The tenant of a request authenticated for `write`.
#[derive(Debug, Clone)]
pub struct Writes(pub TenantId);

impl FromRequestParts<AppRef> for Reads {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &AppRef) -> Result<Self, ApiError> {
        authenticate(app, &parts.headers, &parts.extensions, Scope::Read).map(Self)
    }
}

impl FromRequestParts<AppRef> for Writes {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &AppRef) -> Result<Self, ApiError> {
        authenticate(app, &parts.headers, &parts.extensions, Scope::Write).map(Self)
    }
}

/// A caller authenticated for `admin`. Which tenants it administers is the handler's to ask
/// ([`Admin::administers`]): the target is in the path or the query.
#[derive(Debug, Clone)]
pub struct Admin {
    principal: Principal,
    app: AppRef,
}

impl Admin {
    /// Whether the caller administers `target` (a tenant; every tenant when `None`): 403 if not.
    pub fn administers(&self, target: Option<&str>) -> Result<(), ApiError> {
        self.app.auth.administers(&self.principal, target)
    }
}

impl FromRequestParts<AppRef> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &AppRef) -> Result<Self, ApiError> {
        let slot = parts.extensions.get::<CallerSlot>();
        let principal = principal(app, &parts.headers, slot, Scope::Admin)?;
        Ok(Self {
            principal,
            app: app.clone(),
        })
    }
}

/// A request's credentials, for a handler whose scope depends on the call (a Connect service
/// whose methods read or write): authenticated by [`Credentials::tenant`], once.
#[derive(Debug, Clone)]
pub struct Credentials {
    app: AppRef,
    headers: HeaderMap,
    slot: Option<CallerSlot>,
}

impl Credentials {
    /// The tenant, authenticated for `scope`.
    pub fn tenant(&self, scope: Scope) -> Result<TenantId, ApiError> {
        principal(&self.app, &self.headers, self.slot.as_ref(), scope)
            .and_then(|p| p.reads.single())
    }

    /// The caller, authenticated for `scope`, with its scopes.
    pub fn principal(&self, scope: Scope) -> Result<Principal, ApiError> {
        principal(&self.app, &self.headers, self.slot.as_ref(), scope)
    }
}

impl FromRequestParts<AppRef> for Credentials {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        app: &AppRef,
    ) -> Result<Self, std::convert::Infallible> {
        Ok(Self {
            app: app.clone(),
            headers: parts.headers.clone(),
            slot: parts.extensions.get::<CallerSlot>().cloned(),
        })
    }
}
