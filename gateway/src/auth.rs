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

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use axum::http::{HeaderMap, header};
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::{Deserialize, Serialize};

use crate::error::{ApiError, ErrorKind};
use crate::tenant::{ANONYMOUS, ORG_ID_HEADER, validate_tenant};

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

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub tenant: String,
    pub scopes: Vec<Scope>,
}

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

/// A verification key and the algorithm family it may verify.
#[derive(Clone)]
pub struct VerifyKey {
    pub key: DecodingKey,
    /// Where it came from, for messages.
    pub source: String,
}

impl std::fmt::Debug for VerifyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerifyKey({:?}, {})", self.key.family(), self.source)
    }
}

/// Verification keys by `kid`, loaded from one key file, a directory of key files, or a JWKS
/// file, and reloaded when they change (rotation without downtime: add the new key, move
/// signing to it, then delete the old file; tokens of a deleted key stop working at the reload).
///
/// A key file's `kid` is its file name without extension. PEM public keys (`BEGIN PUBLIC KEY`,
/// `BEGIN RSA PUBLIC KEY`) are RSA, ECDSA (P-256/P-384) or Ed25519; any other file is an HMAC
/// secret (its bytes, surrounding whitespace trimmed; at least 32 bytes). JWKS files (`.json`)
/// give `kid`s themselves.
#[derive(Debug)]
pub struct KeyStore {
    path: PathBuf,
    keys: RwLock<Arc<HashMap<String, VerifyKey>>>,
    stamp: std::sync::Mutex<Vec<(PathBuf, Option<SystemTime>, u64)>>,
}

fn key_err(path: &Path, what: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{}: {what}", path.display())
}

fn load_file(path: &Path, out: &mut HashMap<String, VerifyKey>) -> anyhow::Result<()> {
    let data = std::fs::read(path).map_err(|e| key_err(path, e))?;
    let source = path.display().to_string();
    let is_json =
        path.extension().is_some_and(|e| e == "json") || data.trim_ascii_start().starts_with(b"{");
    if is_json {
        let set: JwkSet =
            serde_json::from_slice(&data).map_err(|e| key_err(path, format!("not a JWKS: {e}")))?;
        for jwk in &set.keys {
            let kid = jwk
                .common
                .key_id
                .clone()
                .ok_or_else(|| key_err(path, "a JWK has no kid"))?;
            let key =
                DecodingKey::from_jwk(jwk).map_err(|e| key_err(path, format!("JWK {kid}: {e}")))?;
            out.insert(
                kid,
                VerifyKey {
                    key,
                    source: source.clone(),
                },
            );
        }
        return Ok(());
    }
    let kid = path
        .file_stem()
        .and_then(|s| s.to_str())
        .ok_or_else(|| key_err(path, "no usable file name for the kid"))?
        .to_owned();
    let text = String::from_utf8_lossy(&data);
    let is_secret = path.extension().is_some_and(|e| e == "secret");
    let key = if !is_secret {
        if !text.contains("-----BEGIN") {
            return Err(key_err(
                path,
                "is neither a PEM public key, a JWKS (.json) nor an HMAC secret (.secret)",
            ));
        }
        if text.contains("PRIVATE KEY") {
            return Err(key_err(path, "is a private key: give Kiln the public key"));
        }
        DecodingKey::from_rsa_pem(&data)
            .or_else(|_| DecodingKey::from_ec_pem(&data))
            .or_else(|_| DecodingKey::from_ed_pem(&data))
            .map_err(|e| {
                key_err(
                    path,
                    format!("not an RSA, ECDSA or Ed25519 public key: {e}"),
                )
            })?
    } else {
        // Only files named *.secret are HMAC secrets, so no public key (SSH, DER, ...) can ever
        // become one.
        let secret = data.trim_ascii();
        if secret.len() < 32 {
            return Err(key_err(path, "an HMAC secret must have at least 32 bytes"));
        }
        DecodingKey::from_secret(secret)
    };
    out.insert(kid, VerifyKey { key, source });
    Ok(())
}

fn key_files(path: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if path.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| key_err(path, e))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.is_file()
                    && !p
                        .file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with('.'))
            })
            .collect();
        files.sort();
        Ok(files)
    } else {
        Ok(vec![path.to_owned()])
    }
}

impl KeyStore {
    /// Loads keys from `path` (file, directory or JWKS). Fails when none loads.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let store = Self {
            path: path.to_owned(),
            keys: RwLock::new(Arc::new(HashMap::new())),
            stamp: std::sync::Mutex::new(Vec::new()),
        };
        store.reload()?;
        Ok(store)
    }

    /// Reloads every key; on error the keys in use stay as they were.
    pub fn reload(&self) -> anyhow::Result<usize> {
        let mut keys = HashMap::new();
        let files = key_files(&self.path)?;
        let mut errors = Vec::new();
        for f in &files {
            // A bad file is skipped, not fatal: the rest of the directory (and the removal of
            // a revoked key) still takes effect.
            if let Err(e) = load_file(f, &mut keys) {
                errors.push(e.to_string());
            }
        }
        if keys.is_empty() {
            anyhow::bail!(
                "{}: no usable keys ({})",
                self.path.display(),
                errors.join("; ")
            );
        }
        for e in &errors {
            tracing::warn!(error = %e, "key file skipped");
        }
        let n = keys.len();
        *self.keys.write().expect("keys lock") = Arc::new(keys);
        *self.stamp.lock().expect("stamp lock") = Self::stamp_of(&files);
        Ok(n)
    }

    fn stamp_of(files: &[PathBuf]) -> Vec<(PathBuf, Option<SystemTime>, u64)> {
        files
            .iter()
            .map(|f| {
                let m = std::fs::metadata(f).ok();
                (
                    f.clone(),
                    m.as_ref().and_then(|m| m.modified().ok()),
                    m.map(|m| m.len()).unwrap_or(0),
                )
            })
            .collect()
    }

    /// Reloads when a key file was added, removed or changed since the last load (SIGHUP calls
    /// [`KeyStore::reload`] instead, unconditionally).
    pub fn reload_if_changed(&self) -> anyhow::Result<bool> {
        let files = key_files(&self.path)?;
        if Self::stamp_of(&files) == *self.stamp.lock().expect("stamp lock") {
            return Ok(false);
        }
        self.reload()?;
        Ok(true)
    }

    /// The current keys.
    pub fn keys(&self) -> Arc<HashMap<String, VerifyKey>> {
        Arc::clone(&self.keys.read().expect("keys lock"))
    }
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
    pub fn authenticate(&self, headers: &HeaderMap, needed: Scope) -> Result<Principal, ApiError> {
        if headers.get_all(ORG_ID_HEADER).iter().count() > 1 {
            return Err(ApiError::invalid(
                "more than one X-Scope-OrgID header: send exactly one tenant",
            ));
        }
        let principal = match self.mode {
            AuthMode::None => Principal {
                tenant: ANONYMOUS.to_owned(),
                scopes: vec![Scope::Read, Scope::Write, Scope::Admin],
            },
            AuthMode::TrustedHeader => {
                let Some(value) = headers.get(ORG_ID_HEADER) else {
                    return Err(unauthenticated(
                        "no tenant: the X-Scope-OrgID header is required",
                    ));
                };
                let id = value
                    .to_str()
                    .map_err(|_| ApiError::invalid("the X-Scope-OrgID header is not valid text"))?;
                validate_tenant(id)?;
                Principal {
                    tenant: id.to_owned(),
                    scopes: vec![Scope::Read, Scope::Write],
                }
            }
            AuthMode::Jwt => self.jwt(headers)?,
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

    /// Authorizes an admin call on `target` (a tenant id), or on every tenant when `None`.
    pub fn authorize_admin(
        &self,
        headers: &HeaderMap,
        target: Option<&str>,
    ) -> Result<Principal, ApiError> {
        let p = self.authenticate(headers, Scope::Admin)?;
        let operator =
            self.mode == AuthMode::None || self.admin_tenant.as_deref() == Some(p.tenant.as_str());
        if operator || target == Some(p.tenant.as_str()) {
            return Ok(p);
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

    fn jwt(&self, headers: &HeaderMap) -> Result<Principal, ApiError> {
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
            tenant: claims.tenant,
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

/// Parses `30d`, `12h`, `15m`, `90s` or plain seconds.
pub fn parse_duration_secs(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().ok()?;
    let mult = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 604_800,
        _ => return None,
    };
    n.checked_mul(mult)
}

#[cfg(test)]
mod tests;
