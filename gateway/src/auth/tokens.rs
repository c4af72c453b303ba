//! JSON Web Tokens: the claims Kiln reads, their verification (`--auth jwt`), and minting and
//! inspecting them for `kiln token`.

use std::path::Path;

use axum::http::{HeaderMap, header};
use jsonwebtoken::{Algorithm, Validation};
use serde::{Deserialize, Serialize};

use super::keys::{VerifyKey, key_err};
use super::tenant::validate_tenant;
use super::{
    Authenticator, Principal, Scope, TenantId, TenantSet, forbidden, now_secs, unauthenticated,
};
use crate::error::ApiError;

/// The claims Kiln reads and writes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Claims {
    /// The tenant the token acts for.
    pub tenant: String,
    /// More tenants the token may read (with `read` scope), named in `X-Scope-OrgID`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
    /// OAuth-style space-separated scopes, accepted too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    pub exp: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iat: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iss: Option<String>,
    /// One audience or several, as identity providers write it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aud: Option<Audience>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub: Option<String>,
}

impl Claims {
    /// Every scope the token grants.
    pub fn all_scopes(&self) -> Vec<String> {
        let mut s: Vec<String> = self.scopes.clone();
        if let Some(more) = &self.scope {
            s.extend(more.split_whitespace().map(str::to_owned));
        }
        s
    }
}

/// The `aud` claim: a string or an array of strings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum Audience {
    One(String),
    Many(Vec<String>),
}

impl Authenticator {
    /// The caller of a request in `--auth jwt` mode: its token from `Authorization` (Bearer, or
    /// Basic with the token as the password). `named` are the tenants of `X-Scope-OrgID`: each
    /// must be the token's tenant or one of its `tenants`.
    pub(super) fn jwt(
        &self,
        headers: &HeaderMap,
        named: Option<Vec<String>>,
    ) -> Result<Principal, ApiError> {
        let auth = headers
            .get(header::AUTHORIZATION)
            .ok_or_else(|| unauthenticated("missing credentials: send Authorization: Bearer <token>, or Basic auth with the token as password"))?
            .to_str()
            .map_err(|_| unauthenticated("the Authorization header is not valid text"))?;
        let (scheme, rest) = auth.split_once(' ').unwrap_or((auth, ""));
        let (basic_user, token) = if scheme.eq_ignore_ascii_case("bearer") {
            (None, rest.trim().to_owned())
        } else if scheme.eq_ignore_ascii_case("basic") {
            let decoded = kiln_otel::base64::decode(rest.trim())
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| unauthenticated("malformed Basic credentials"))?;
            let (user, pass) = decoded.split_once(':').unwrap_or(("", decoded.as_str()));
            (Some(user.to_owned()), pass.to_owned())
        } else {
            return Err(unauthenticated(format!(
                "unsupported authorization scheme {scheme:?}; use Bearer or Basic"
            )));
        };
        let claims = self.verify(&token)?;
        validate_tenant(&claims.tenant)
            .map_err(|_| unauthenticated("the token's tenant claim is not a valid tenant id"))?;
        if let Some(user) = basic_user.filter(|u| !u.is_empty())
            && user != claims.tenant
        {
            return Err(forbidden(format!(
                "basic auth user {user:?} does not match the token's tenant {:?}",
                claims.tenant
            )));
        }
        let scopes: Vec<Scope> = claims
            .all_scopes()
            .iter()
            .filter_map(|s| Scope::parse(s))
            .collect();
        let reads = match named {
            None => vec![claims.tenant.clone()],
            Some(named) => {
                for org in &named {
                    if *org != claims.tenant && !claims.tenants.contains(org) {
                        return Err(forbidden(format!(
                            "a token of tenant {:?} cannot act for tenant {org:?}",
                            claims.tenant
                        )));
                    }
                }
                named
            }
        };
        // Another tenant's data is only read: a token acts (writes, administers) for its own.
        let acts_for_self = reads.len() == 1 && reads[0] == claims.tenant;
        let scopes = if acts_for_self {
            scopes
        } else {
            scopes.into_iter().filter(|s| *s == Scope::Read).collect()
        };
        Ok(Principal {
            tenant: TenantId::vouched(claims.tenant),
            reads: TenantSet::vouched(reads.into_iter().map(TenantId::vouched).collect())
                .expect("one tenant at least"),
            scopes,
        })
    }

    /// Verifies a token's signature and claims.
    pub fn verify(&self, token: &str) -> Result<Claims, ApiError> {
        let Some(store) = &self.keys else {
            return Err(ApiError::internal("jwt mode without keys"));
        };
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| unauthenticated(format!("malformed token: {e}")))?;
        let keys = store.keys();
        let key = match &header.kid {
            Some(kid) => keys.get(kid).ok_or_else(|| {
                unauthenticated(format!(
                    "unknown key id {kid:?}: the key is not (or no longer) trusted"
                ))
            })?,
            None => {
                let family = header.alg.family();
                let mut same: Vec<&VerifyKey> =
                    keys.values().filter(|k| k.key.family() == family).collect();
                if same.len() != 1 {
                    return Err(unauthenticated(
                        "the token has no kid and more than one key could sign it",
                    ));
                }
                same.remove(0)
            }
        };
        if key.key.family() != header.alg.family() {
            return Err(unauthenticated(format!(
                "token algorithm {:?} does not match the {:?} key it names",
                header.alg,
                key.key.family()
            )));
        }
        let mut v = Validation::new(header.alg);
        v.leeway = 5;
        v.validate_nbf = true;
        let mut required = vec!["exp"];
        match &self.issuer {
            Some(iss) => {
                v.set_issuer(&[iss]);
                required.push("iss");
            }
            None => v.iss = None,
        }
        match &self.audience {
            Some(aud) => {
                v.set_audience(&[aud]);
                required.push("aud");
            }
            None => v.validate_aud = false,
        }
        v.set_required_spec_claims(&required);
        let data = jsonwebtoken::decode::<Claims>(token, &key.key, &v).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind as K;
            let why = match e.kind() {
                K::ExpiredSignature => "the token has expired".to_owned(),
                K::ImmatureSignature => "the token is not valid yet (nbf)".to_owned(),
                K::InvalidSignature => "bad token signature".to_owned(),
                K::InvalidIssuer => "wrong token issuer".to_owned(),
                K::InvalidAudience => "wrong token audience".to_owned(),
                K::MissingRequiredClaim(c) => format!("the token has no {c} claim"),
                other => format!("invalid token: {other:?}"),
            };
            unauthenticated(why)
        })?;
        Ok(data.claims)
    }
}

/// What a minted token grants.
#[derive(Debug, Clone)]
pub struct Grant {
    pub tenant: String,
    /// More tenants it may read (the `tenants` claim).
    pub reads: Vec<String>,
    pub scopes: Vec<Scope>,
    pub ttl_secs: u64,
    pub issuer: Option<String>,
    pub audience: Option<String>,
}

/// Mints a token for one tenant (see [`mint_grant`]).
pub fn mint(
    key_file: &Path,
    kid: &str,
    tenant: &str,
    scopes: &[Scope],
    ttl_secs: u64,
    issuer: Option<String>,
    audience: Option<String>,
) -> anyhow::Result<String> {
    let grant = Grant {
        tenant: tenant.to_owned(),
        reads: Vec::new(),
        scopes: scopes.to_vec(),
        ttl_secs,
        issuer,
        audience,
    };
    mint_grant(key_file, kid, &grant)
}

/// Mints a token for `kiln token create`. `key_file` is an HMAC secret or a private key PEM
/// (RSA → RS256, ECDSA P-256 → ES256, Ed25519 → EdDSA).
pub fn mint_grant(key_file: &Path, kid: &str, grant: &Grant) -> anyhow::Result<String> {
    use jsonwebtoken::EncodingKey;
    for tenant in std::iter::once(&grant.tenant).chain(&grant.reads) {
        validate_tenant(tenant).map_err(|e| anyhow::anyhow!("{}", e.message))?;
    }
    let data = std::fs::read(key_file).map_err(|e| key_err(key_file, e))?;
    let (alg, key) = if String::from_utf8_lossy(&data).contains("PRIVATE KEY") {
        if let Ok(k) = EncodingKey::from_rsa_pem(&data) {
            (Algorithm::RS256, k)
        } else if let Ok(k) = EncodingKey::from_ed_pem(&data) {
            (Algorithm::EdDSA, k)
        } else if let Ok(k) = EncodingKey::from_ec_pem(&data) {
            (Algorithm::ES256, k)
        } else {
            anyhow::bail!(
                "{}: not an RSA, ECDSA P-256 or Ed25519 private key",
                key_file.display()
            );
        }
    } else {
        let secret = data.trim_ascii();
        anyhow::ensure!(
            secret.len() >= 32,
            "{}: an HMAC secret must have at least 32 bytes",
            key_file.display()
        );
        (Algorithm::HS256, EncodingKey::from_secret(secret))
    };
    let now = now_secs();
    let claims = Claims {
        tenant: grant.tenant.clone(),
        tenants: grant.reads.clone(),
        scopes: grant.scopes.iter().map(|s| s.as_str().to_owned()).collect(),
        scope: None,
        exp: now + grant.ttl_secs,
        nbf: Some(now),
        iat: Some(now),
        iss: grant.issuer.clone(),
        aud: grant.audience.clone().map(Audience::One),
        sub: None,
    };
    let mut header = jsonwebtoken::Header::new(alg);
    header.kid = Some(kid.to_owned());
    Ok(jsonwebtoken::encode(&header, &claims, &key)?)
}

/// Decodes a token without verifying it, for `kiln token inspect`.
pub fn inspect(token: &str) -> anyhow::Result<serde_json::Value> {
    let header = jsonwebtoken::decode_header(token)?;
    let payload = token
        .split('.')
        .nth(1)
        .and_then(kiln_otel::base64::decode)
        .ok_or_else(|| anyhow::anyhow!("malformed token"))?;
    let claims: serde_json::Value = serde_json::from_slice(&payload)?;
    Ok(serde_json::json!({
        "header": { "alg": format!("{:?}", header.alg), "kid": header.kid, "typ": header.typ },
        "claims": claims,
    }))
}
