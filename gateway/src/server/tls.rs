//! TLS on the API port (`--tls-cert`, `--tls-key`, `--tls-client-ca`): rustls, HTTP/1.1 and
//! h2 by ALPN. The files are read again when they change and on SIGHUP, so a renewed
//! certificate needs no restart; a file that does not load leaves the last good one serving.
//!
//! Where the state lives: the current configuration, in this process only (each process
//! reads its own files). The reload task owns changes; each accepted connection takes the
//! configuration current when it arrives.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tracing::{info, warn};

/// The files TLS is served from.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// CA certificates clients' certificates must chain to.
    pub client_ca: Option<PathBuf>,
    /// Whether a client may connect without a certificate (with `client_ca`).
    pub client_optional: bool,
}

/// The TLS configuration served now, and what its files looked like when it was read.
#[derive(Debug)]
pub struct Tls {
    files: TlsFiles,
    current: RwLock<(Arc<ServerConfig>, Vec<Stamp>)>,
}

/// A file's length and change time: a file that changed differs in one.
type Stamp = Option<(u64, SystemTime)>;

impl Tls {
    /// Reads the files; an error names the one that does not load.
    pub fn load(files: TlsFiles) -> Result<Arc<Self>, String> {
        let stamps = stamps(&files);
        let config = server_config(&files)?;
        Ok(Arc::new(Self {
            files,
            current: RwLock::new((config, stamps)),
        }))
    }

    /// An acceptor with the configuration current now.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let current = self.current.read().expect("tls lock");
        tokio_rustls::TlsAcceptor::from(Arc::clone(&current.0))
    }

    /// Reads the files again if one changed since the last read (or always, with `force`);
    /// whether a new configuration now serves. A file that does not load is an error, and the
    /// last configuration stays.
    pub fn reload(&self, force: bool) -> Result<bool, String> {
        let now = stamps(&self.files);
        if !force && self.current.read().expect("tls lock").1 == now {
            return Ok(false);
        }
        let loaded = server_config(&self.files);
        let mut current = self.current.write().expect("tls lock");
        // Noted even when loading failed: the same broken files are not read every second.
        current.1 = now;
        current.0 = loaded?;
        Ok(true)
    }
}

fn stamps(files: &TlsFiles) -> Vec<Stamp> {
    [
        Some(&files.cert),
        Some(&files.key),
        files.client_ca.as_ref(),
    ]
    .into_iter()
    .flatten()
    .map(|p| {
        std::fs::metadata(p)
            .ok()
            .and_then(|m| Some((m.len(), m.modified().ok()?)))
    })
    .collect()
}

/// The server configuration of `files`: their certificate and key, client certificates
/// checked against their CA when named, ALPN for h2 and HTTP/1.1.
fn server_config(files: &TlsFiles) -> Result<Arc<ServerConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certificates(ca)? {
                roots
                    .add(cert)
                    .map_err(|e| format!("--tls-client-ca {}: {e}", ca.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if files.client_optional {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            let verifier = verifier
                .build()
                .map_err(|e| format!("--tls-client-ca {}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| format!("--tls-key {}: {e}", files.key.display()))?;
    let mut config = builder
        .with_single_cert(certificates(&files.cert)?, key)
        .map_err(|e| format!("--tls-cert {}: {e}", files.cert.display()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The certificates of a PEM file (at least one).
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no PEM certificate in it", path.display()));
    }
    Ok(certs)
}

/// Reads the files again each second when they changed, and on SIGHUP.
pub fn spawn_reload(tls: Arc<Tls>) {
    let polled = Arc::clone(&tls);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            log_reload(&polled, "changed on disk", false);
        }
    });
    #[cfg(unix)]
    tokio::spawn(async move {
        let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        else {
            return;
        };
        while hup.recv().await.is_some() {
            log_reload(&tls, "SIGHUP", true);
        }
    });
}

fn log_reload(tls: &Tls, why: &str, force: bool) {
    match tls.reload(force) {
        Ok(true) => info!(why, "TLS certificate reloaded"),
        Ok(false) => {}
        Err(e) => warn!(error = %e, "TLS certificate not reloaded; the last one serves"),
    }
}
