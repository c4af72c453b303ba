//! TLS to PostgreSQL with libpq's settings in the URL: `sslmode` (`disable`, `allow`,
//! `prefer`, `require`, `verify-ca`, `verify-full`), `sslrootcert`, `sslcert` and `sslkey`.
//! tokio-postgres knows only three modes and no files, so these are read here, and the
//! connection's TLS is rustls (the stack the object stores already use).
//!
//! As libpq: `prefer` (the default) uses TLS when the server offers it, `require` insists on
//! it; neither checks the server's certificate, unless `require` is given a root certificate
//! (then it is `verify-ca`). `verify-ca` checks the chain against `sslrootcert`;
//! `verify-full` checks the host name too. `allow` is taken as `prefer`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

use crate::{Error, Result};

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// The TLS settings of a metastore URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    pub mode: SslMode,
    /// Certificates the server's chain must end in (`sslrootcert`).
    pub root_cert: Option<PathBuf>,
    /// This client's certificate and key (`sslcert`, `sslkey`), sent when the server asks.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// Takes libpq's TLS parameters out of a `postgres://` URL: the URL left for tokio-postgres
/// (with the mode it knows), and the settings. Other URLs (libpq's `key=value` form) pass as
/// they are, with tokio-postgres's own reading of `sslmode`.
pub fn split_url(url: &str) -> Result<(String, TlsSettings)> {
    let mut settings = TlsSettings {
        mode: SslMode::Prefer,
        root_cert: None,
        cert: None,
        key: None,
    };
    let is_url = url.starts_with("postgres://") || url.starts_with("postgresql://");
    let Some((base, query)) = url.split_once('?').filter(|_| is_url) else {
        return Ok((url.to_owned(), settings));
    };
    let mut kept = Vec::new();
    for param in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = param.split_once('=').unwrap_or((param, ""));
        let value = percent_encoding::percent_decode_str(value)
            .decode_utf8()
            .map_err(|_| Error::Config(format!("bad PostgreSQL URL: {key} is not UTF-8")))?;
        match key {
            "sslmode" => {
                settings.mode = match value.as_ref() {
                    "disable" => SslMode::Disable,
                    "allow" | "prefer" => SslMode::Prefer,
                    "require" => SslMode::Require,
                    "verify-ca" => SslMode::VerifyCa,
                    "verify-full" => SslMode::VerifyFull,
                    other => {
                        return Err(Error::Config(format!(
                            "bad PostgreSQL URL: sslmode {other:?} is none of disable, allow, \
                             prefer, require, verify-ca, verify-full"
                        )));
                    }
                }
            }
            "sslrootcert" if value == "system" => {
                return Err(Error::Config(
                    "sslrootcert=system is not supported: name a file of root certificates".into(),
                ));
            }
            "sslrootcert" => settings.root_cert = Some(PathBuf::from(value.as_ref())),
            "sslcert" => settings.cert = Some(PathBuf::from(value.as_ref())),
            "sslkey" => settings.key = Some(PathBuf::from(value.as_ref())),
            _ => kept.push(param),
        }
    }
    // libpq: `require` with a root certificate checks the chain.
    if settings.mode == SslMode::Require && settings.root_cert.is_some() {
        settings.mode = SslMode::VerifyCa;
    }
    let known = match settings.mode {
        SslMode::Disable => "disable",
        SslMode::Prefer => "prefer",
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => "require",
    };
    let sslmode = format!("sslmode={known}");
    kept.push(&sslmode);
    Ok((format!("{base}?{}", kept.join("&")), settings))
}

/// The rustls connector for `settings`.
pub fn connector(settings: &TlsSettings) -> Result<tokio_postgres_rustls::MakeRustlsConnect> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config(format!("PostgreSQL TLS: {e}")))?;
    let verifier: Arc<dyn ServerCertVerifier> = match settings.mode {
        SslMode::Disable | SslMode::Prefer | SslMode::Require => {
            Arc::new(AnyCertificate(Arc::clone(&provider)))
        }
        SslMode::VerifyCa | SslMode::VerifyFull => {
            let Some(path) = &settings.root_cert else {
                return Err(Error::Config(
                    "sslmode verify-ca and verify-full need sslrootcert (a file of root \
                     certificates) in the PostgreSQL URL"
                        .into(),
                ));
            };
            let mut roots = rustls::RootCertStore::empty();
            for cert in certificates(path)? {
                roots
                    .add(cert)
                    .map_err(|e| Error::Config(format!("sslrootcert {}: {e}", path.display())))?;
            }
            let full = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| Error::Config(format!("PostgreSQL TLS: {e}")))?;
            if settings.mode == SslMode::VerifyFull {
                full
            } else {
                Arc::new(ChainOnly(full))
            }
        }
    };
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let config = match (&settings.cert, &settings.key) {
        (Some(cert), Some(key)) => {
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| Error::Config(format!("sslkey {}: {e}", key.display())))?;
            builder
                .with_client_auth_cert(certificates(cert)?, key)
                .map_err(|e| Error::Config(format!("sslcert {}: {e}", cert.display())))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err(Error::Config(
                "sslcert and sslkey go together in the PostgreSQL URL".into(),
            ));
        }
    };
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

/// The certificates of a PEM file.
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(Error::Config(format!(
            "{}: no PEM certificate in it",
            path.display()
        )));
    }
    Ok(certs)
}

/// `prefer` and `require`: any certificate will do (as libpq), but the handshake's signatures
/// are still checked, so the connection is encrypted to whoever holds the certificate's key.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must end in a root certificate; the host name is not checked.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libpq_parameters_are_taken_out_of_the_url() {
        let (url, s) = split_url(
            "postgres://kiln@db:5432/m?application_name=k&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem",
        )
        .unwrap();
        assert_eq!(
            url,
            "postgres://kiln@db:5432/m?application_name=k&sslmode=require"
        );
        assert_eq!(s.mode, SslMode::VerifyFull);
        assert_eq!(s.root_cert.as_deref(), Some(Path::new("/etc/ca.pem")));
        let (url, s) = split_url("postgres://kiln@db/m").unwrap();
        assert_eq!(
            (url.as_str(), s.mode),
            ("postgres://kiln@db/m", SslMode::Prefer)
        );
        let (_, s) = split_url("postgres://db/m?sslmode=require&sslrootcert=ca.pem").unwrap();
        assert_eq!(s.mode, SslMode::VerifyCa, "require with a root certificate");
        let (url, s) = split_url("postgres://db/m?sslmode=allow").unwrap();
        assert_eq!(
            (url.as_str(), s.mode),
            ("postgres://db/m?sslmode=prefer", SslMode::Prefer)
        );
        assert!(split_url("postgres://db/m?sslmode=sometimes").is_err());
        assert!(split_url("postgres://db/m?sslrootcert=system").is_err());
        let s = split_url("postgres://db/m?sslmode=verify-ca").unwrap().1;
        assert!(connector(&s).is_err(), "verify-ca needs a root certificate");
        let s = split_url("postgres://db/m?sslcert=c.pem").unwrap().1;
        assert!(connector(&s).is_err(), "a certificate needs its key");
        let (url, _) = split_url("host=db sslmode=disable").unwrap();
        assert_eq!(url, "host=db sslmode=disable");
    }
}
