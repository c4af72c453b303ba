//! Tenant ids: what they may look like, and the names tenancy travels under.

use crate::error::ApiError;

/// The tenant of single-tenant mode.
pub const ANONYMOUS: &str = "anonymous";
/// The header a trusted proxy puts the tenant in.
pub const ORG_ID_HEADER: &str = "x-scope-orgid";

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
}
