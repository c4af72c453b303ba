//! Who is calling, for which tenant, allowed to do what.
//!
//! Three modes (`--auth`):
//! - `none`: one tenant, `anonymous`, every scope; only on a loopback address unless
//!   `--insecure-allow-anonymous`.
//! - `jwt`: `Authorization: Bearer <token>`, or HTTP Basic with the token as the password (what
//!   Grafana's Pyroscope datasource and the Pyroscope SDKs send; a user name, when set, must equal
//!   the token's tenant). gRPC carries the same in metadata. Claims: `tenant`, `scopes` (`read`,
//!   `write`, `admin`; an array, or a space-separated `scope` string), `exp` (required), `nbf`,
//!   optional `iss`/`aud` checks. Keys are picked by `kid` from [`KeyStore`].
//! - `trusted-header`: the tenant is `X-Scope-OrgID`, set by an authenticating proxy in front.
//!
//! A read may span tenants: `X-Scope-OrgID: a|b` (Mimir's and Pyroscope's spelling). In
//! `trusted-header` mode the proxy vouches for each; in `jwt` mode each must be the token's
//! `tenant` or in its `tenants` claim. [`Principal::reads`] holds them. Writes and admin calls
//! act for one tenant only.

//!
//! Split by concern: the modes, scopes and the authenticated tenant here; verification keys in
//! [`keys`]; tokens (claims, verification, minting) in [`tokens`].

use std::time::SystemTime;

use axum::http::HeaderMap;

use crate::error::{ApiError, ErrorKind};

mod keys;
mod tenant;
mod tokens;

pub use keys::{KeyStore, VerifyKey};
pub use tenant::{ANONYMOUS, ORG_ID_HEADER, validate_tenant};
pub use tokens::{Audience, Claims, Grant, inspect, mint, mint_grant};

/// A tenant id that authentication vouched for: a request's tenant, or the tenant the operator
/// configured for Kiln's own profiles. Its field is private and only this module makes one, so
/// no code path can read or write data without having authenticated someone (ingest, push,
/// OTLP and the querier take a `&TenantId`). It reads as the `&str` it holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TenantId(String);

impl TenantId {
    /// Made only here, once a caller's tenant (already validated) is established.
    fn vouched(id: String) -> Self {
        Self(id)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A tenant for unit tests, unchecked.
    #[cfg(test)]
    pub(crate) fn vouched_for_tests(id: &str) -> Self {
        Self(id.to_owned())
    }
}

impl std::ops::Deref for TenantId {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<&str> for TenantId {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl std::fmt::Display for TenantId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// How requests are authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthMode {
    /// One tenant, `anonymous`, no credentials (loopback only by default).
    None,
    /// JSON Web Tokens: Bearer, or Basic with the token as password.
    Jwt,
    /// Tenant from `X-Scope-OrgID`, trusted as is (behind an authenticating proxy).
    TrustedHeader,
}

/// What a request may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    Read,
    Write,
    Admin,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "read" => Some(Self::Read),
            "write" => Some(Self::Write),
            "admin" => Some(Self::Admin),
            _ => None,
        }
    }
}

/// The tenants one read covers: at least one, sorted, each vouched for by authentication.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TenantSet(Vec<TenantId>);

impl TenantSet {
    /// A read of one (vouched) tenant.
    pub fn one(tenant: TenantId) -> Self {
        Self(vec![tenant])
    }

    /// Made only here, from vouched tenants; empty is not a set.
    fn vouched(mut tenants: Vec<TenantId>) -> Option<Self> {
        tenants.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        tenants.dedup();
        (!tenants.is_empty()).then_some(Self(tenants))
    }

    pub fn iter(&self) -> std::slice::Iter<'_, TenantId> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never true: a set holds a tenant at least.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether the read spans tenants (answers then carry `__tenant__`).
    pub fn spans_tenants(&self) -> bool {
        self.0.len() > 1
    }

    /// The first tenant, by name.
    pub fn first(&self) -> &TenantId {
        &self.0[0]
    }

    /// The one tenant of a single-tenant read; an error naming them when there are several.
    pub fn single(self) -> Result<TenantId, ApiError> {
        if self.spans_tenants() {
            return Err(ApiError::invalid(format!(
                "this API reads one tenant; X-Scope-OrgID names {}",
                self
            )));
        }
        Ok(self.0.into_iter().next().expect("a set is not empty"))
    }
}

impl std::fmt::Display for TenantSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, t) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("|")?;
            }
            f.write_str(t)?;
        }
        Ok(())
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The tenant it acts for: writes and admin calls go to it alone.
    pub tenant: TenantId,
    pub scopes: Vec<Scope>,
    /// The tenants a read covers: `tenant`, or those `X-Scope-OrgID` names.
    pub reads: TenantSet,
}

/// Authentication settings.
#[derive(Debug)]
pub struct Authenticator {
    pub mode: AuthMode,
    pub keys: Option<KeyStore>,
    pub issuer: Option<String>,
    pub audience: Option<String>,
    /// The operator tenant: its `admin` tokens administer every tenant. Other tenants' `admin`
    /// tokens administer only their own tenant.
    pub admin_tenant: Option<String>,
}

fn unauthenticated(msg: impl Into<String>) -> ApiError {
    ApiError::new(ErrorKind::Unauthenticated, msg)
}

fn forbidden(msg: impl Into<String>) -> ApiError {
    ApiError::new(ErrorKind::PermissionDenied, msg)
}

/// The tenants `X-Scope-OrgID` names (`a|b|c`), each checked; `None` without the header.
fn org_ids(headers: &HeaderMap) -> Result<Option<Vec<String>>, ApiError> {
    /// Most tenants one read may span: each is a query of its own.
    const MAX_TENANTS: usize = 64;
    let Some(value) = headers.get(ORG_ID_HEADER) else {
        return Ok(None);
    };
    let value = value
        .to_str()
        .map_err(|_| ApiError::invalid("the X-Scope-OrgID header is not valid text"))?;
    let ids: Vec<String> = value.split('|').map(|t| t.trim().to_owned()).collect();
    if ids.len() > MAX_TENANTS {
        return Err(ApiError::invalid(format!(
            "X-Scope-OrgID names {} tenants; one read spans at most {MAX_TENANTS}",
            ids.len()
        )));
    }
    for id in &ids {
        validate_tenant(id)?;
    }
    Ok(Some(ids))
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Authenticator {
    /// No authentication: everything is tenant `anonymous`.
    pub fn none() -> Self {
        Self {
            mode: AuthMode::None,
            keys: None,
            issuer: None,
            audience: None,
            admin_tenant: None,
        }
    }

    /// Trusted-header mode.
    pub fn trusted_header() -> Self {
        Self {
            mode: AuthMode::TrustedHeader,
            ..Self::none()
        }
    }

    /// Authenticates a request (HTTP headers or gRPC metadata) and checks it may do `needed`.
    /// `X-Scope-OrgID: a|b` is taken for reads only, each tenant checked.
    pub fn authenticate(&self, headers: &HeaderMap, needed: Scope) -> Result<Principal, ApiError> {
        if headers.get_all(ORG_ID_HEADER).iter().count() > 1 {
            return Err(ApiError::invalid(
                "more than one X-Scope-OrgID header: send one, with tenants joined by |",
            ));
        }
        // Single-tenant mode has one tenant whatever a client names.
        let named = match self.mode {
            AuthMode::None => None,
            _ => org_ids(headers)?,
        };
        if named.as_ref().is_some_and(|n| n.len() > 1) && needed != Scope::Read {
            return Err(ApiError::invalid(format!(
                "X-Scope-OrgID names several tenants; only reads may span tenants, a {} acts \
                 for one",
                needed.as_str()
            )));
        }
        let principal = match self.mode {
            AuthMode::None => {
                let tenant = TenantId::vouched(ANONYMOUS.to_owned());
                Principal {
                    reads: TenantSet::one(tenant.clone()),
                    tenant,
                    scopes: vec![Scope::Read, Scope::Write, Scope::Admin],
                }
            }
            AuthMode::TrustedHeader => {
                let Some(named) = named else {
                    return Err(unauthenticated(
                        "no tenant: the X-Scope-OrgID header is required",
                    ));
                };
                let reads: Vec<TenantId> = named.into_iter().map(TenantId::vouched).collect();
                Principal {
                    tenant: reads[0].clone(),
                    reads: TenantSet::vouched(reads).expect("one tenant at least"),
                    scopes: vec![Scope::Read, Scope::Write],
                }
            }
            AuthMode::Jwt => self.jwt(headers, named)?,
        };
        if !principal.scopes.contains(&needed) {
            return Err(forbidden(format!(
                "the credentials of tenant {:?} lack the {} scope",
                principal.tenant,
                needed.as_str()
            )));
        }
        Ok(principal)
    }

    /// The tenant the operator named for Kiln's own writes (`--self-profile-tenant`): trusted
    /// as configuration, checked like any tenant id.
    pub fn configured_tenant(&self, id: &str) -> Result<TenantId, ApiError> {
        validate_tenant(id)?;
        Ok(TenantId::vouched(id.to_owned()))
    }

    /// Whether `p`, authenticated for `admin`, administers `target` (a tenant id; every tenant
    /// when `None`): the operator tenant administers all, another tenant only itself.
    pub fn administers(&self, p: &Principal, target: Option<&str>) -> Result<(), ApiError> {
        let operator =
            self.mode == AuthMode::None || self.admin_tenant.as_deref() == Some(p.tenant.as_str());
        if operator || target == Some(p.tenant.as_str()) {
            return Ok(());
        }
        Err(forbidden(format!(
            "an admin token of tenant {:?} administers only that tenant; administering {} needs \
             an admin token of the operator tenant (--admin-tenant)",
            p.tenant,
            target
                .map(|t| format!("tenant {t:?}"))
                .unwrap_or_else(|| "every tenant".into())
        )))
    }
}

#[cfg(test)]
mod tests;
