//! Verification keys: key files, directories of them and JWKS files, by `kid`, reloaded when
//! they change.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use jsonwebtoken::DecodingKey;
use jsonwebtoken::jwk::JwkSet;

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

pub(super) fn key_err(path: &Path, what: impl std::fmt::Display) -> anyhow::Error {
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
