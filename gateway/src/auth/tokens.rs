//! JSON Web Tokens: the claims Kiln reads, their verification (`--auth jwt`), and minting and
//! inspecting them for `kiln token`.

use std::path::Path;

use axum::http::{HeaderMap, header};
use jsonwebtoken::{Algorithm, Validation};
use serde::{Deserialize, Serialize};

use super::keys::{VerifyKey, key_err};
use super::tenant::{ORG_ID_HEADER, validate_tenant};
use super::{Authenticator, Principal, Scope, TenantId, forbidden, now_secs, unauthenticated};
use crate::error::ApiError;

/// The claims Kiln reads and writes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Claims {
    pub tenant: String,
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
    /// Basic with the token as the password).
    pub(super) fn jwt(&self, headers: &HeaderMap) -> Result<Principal, ApiError> {
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
        if let Some(org) = headers.get(ORG_ID_HEADER) {
            let org = org.to_str().unwrap_or("");
            if org != claims.tenant {
                return Err(forbidden(format!(
                    "a token of tenant {:?} cannot act for tenant {org:?}",
                    claims.tenant
                )));
            }
        }
        let scopes = claims
            .all_scopes()
            .iter()
            .filter_map(|s| Scope::parse(s))
            .collect();
        Ok(Principal {
            tenant: TenantId::vouched(claims.tenant),
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

/// Mints a token for `kiln token create`. `key_file` is an HMAC secret or a private key PEM
/// (RSA → RS256, ECDSA P-256 → ES256, Ed25519 → EdDSA).
pub fn mint(
    key_file: &Path,
    kid: &str,
    tenant: &str,
    scopes: &[Scope],
    ttl_secs: u64,
    issuer: Option<String>,
    audience: Option<String>,
) -> anyhow::Result<String> {
    use jsonwebtoken::EncodingKey;
    validate_tenant(tenant).map_err(|e| anyhow::anyhow!("{}", e.message))?;
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
        tenant: tenant.to_owned(),
        scopes: scopes.iter().map(|s| s.as_str().to_owned()).collect(),
        scope: None,
        exp: now + ttl_secs,
        nbf: Some(now),
        iat: Some(now),
        iss: issuer,
        aud: audience.map(Audience::One),
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
