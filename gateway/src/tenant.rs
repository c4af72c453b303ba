//! Who a request belongs to. This modes: `none` (every request is tenant `anonymous`)
//! and `trusted-header` (the tenant is `X-Scope-OrgID`, set by an authenticating proxy).

use axum::http::HeaderMap;

use crate::error::{ApiError, ErrorKind};

/// The tenant of single-tenant mode.
pub const ANONYMOUS: &str = "anonymous";
/// The header a trusted proxy puts the tenant in.
pub const ORG_ID_HEADER: &str = "x-scope-orgid";

/// How requests are mapped to tenants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthMode {
    /// One tenant, `anonymous`.
    None,
    /// Tenant from `X-Scope-OrgID`, trusted as is (behind an authenticating proxy).
    TrustedHeader,
}

/// Checks a tenant id: `[A-Za-z0-9!_.*'()-]`, at most 150 characters, not `.` or `..`.
pub fn validate_tenant(id: &str) -> Result<(), ApiError> {
    let ok = !id.is_empty()
        && id.len() <= 150
        && id != "."
        && id != ".."
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "!-_.*'()".contains(c));
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(format!("invalid tenant id {id:?}")))
    }
}

/// The tenant of a request, from its headers (HTTP headers or gRPC metadata).
pub fn tenant_of(mode: AuthMode, headers: &HeaderMap) -> Result<String, ApiError> {
    match mode {
        AuthMode::None => Ok(ANONYMOUS.to_owned()),
        AuthMode::TrustedHeader => {
            let Some(value) = headers.get(ORG_ID_HEADER) else {
                return Err(ApiError::new(
                    ErrorKind::Unauthenticated,
                    "no tenant: the X-Scope-OrgID header is required",
                ));
            };
            let id = value
                .to_str()
                .map_err(|_| ApiError::invalid("the X-Scope-OrgID header is not valid text"))?;
            validate_tenant(id)?;
            Ok(id.to_owned())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_ids() {
        for good in ["anonymous", "team-a", "a.b_c*(d)'!"] {
            assert!(validate_tenant(good).is_ok(), "{good}");
        }
        for bad in ["", ".", "..", "a/b", "a b", &"x".repeat(151)] {
            assert!(validate_tenant(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn modes() {
        let mut h = HeaderMap::new();
        assert_eq!(tenant_of(AuthMode::None, &h).unwrap(), "anonymous");
        assert_eq!(
            tenant_of(AuthMode::TrustedHeader, &h).unwrap_err().kind,
            ErrorKind::Unauthenticated
        );
        h.insert("X-Scope-OrgID", "team-a".parse().unwrap());
        assert_eq!(tenant_of(AuthMode::TrustedHeader, &h).unwrap(), "team-a");
        assert_eq!(tenant_of(AuthMode::None, &h).unwrap(), "anonymous");
    }
}
