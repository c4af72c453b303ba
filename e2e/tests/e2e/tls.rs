//! TLS on the API port with the real binary: HTTP/1.1 and h2 by ALPN over a certificate of a
//! CA made here, client certificates required by `--tls-client-ca` (mutual TLS), and a renewed
//! certificate served without a restart.

use std::time::Duration;

use anyhow::{Result, ensure};
use kiln_e2e::Kiln;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

/// A CA: its certificate (PEM) and what signs with it.
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    fn new(name: &str) -> Result<Self> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        Ok(Self { cert, key })
    }

    /// A certificate for `names` (IP addresses or host names): its PEM and its key's.
    fn issue(&self, cn: &str, names: &[&str]) -> Result<(String, String)> {
        let (pem, key, _) = self.issue_der(cn, names)?;
        Ok((pem, key))
    }

    /// [`Ca::issue`], with the certificate's DER.
    fn issue_der(&self, cn: &str, names: &[&str]) -> Result<(String, String, Vec<u8>)> {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())?;
        params.distinguished_name.push(DnType::CommonName, cn);
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.cert, &self.key)?;
        Ok((cert.pem(), key.serialize_pem(), cert.der().to_vec()))
    }
}

fn client(ca: &str, identity: Option<&(String, String)>) -> Result<reqwest::blocking::Client> {
    let mut builder = reqwest::blocking::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes())?)
        .tls_info(true)
        .timeout(Duration::from_secs(30));
    if let Some((cert, key)) = identity {
        builder = builder.identity(reqwest::Identity::from_pem(
            format!("{cert}{key}").as_bytes(),
        )?);
    }
    Ok(builder.build()?)
}

/// The certificate a new connection to `kiln` is served.
fn served_certificate(http: &reqwest::blocking::Client, url: &str) -> Result<Vec<u8>> {
    let resp = http.get(url).send()?;
    let info = resp
        .extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|i| i.peer_certificate())
        .map(<[u8]>::to_vec);
    info.ok_or_else(|| anyhow::anyhow!("no TLS info"))
}

#[test]
fn the_api_port_serves_tls_with_client_certificates_and_reloads() -> Result<()> {
    let server_ca = Ca::new("kiln e2e server CA")?;
    let client_ca = Ca::new("kiln e2e client CA")?;
    let (cert, key, cert_der) = server_ca.issue_der("kiln", &["127.0.0.1"])?;
    let agent = client_ca.issue("parca-agent", &[])?;
    let dir = tempfile::tempdir()?;
    let (cert_file, key_file, ca_file) = (
        dir.path().join("tls.crt"),
        dir.path().join("tls.key"),
        dir.path().join("clients.pem"),
    );
    std::fs::write(&cert_file, &cert)?;
    std::fs::write(&key_file, &key)?;
    std::fs::write(&ca_file, client_ca.cert.pem())?;
    let server_ca_pem = server_ca.cert.pem();
    let http = client(&server_ca_pem, Some(&agent))?;
    let (c, k, a) = (
        cert_file.display().to_string(),
        key_file.display().to_string(),
        ca_file.display().to_string(),
    );
    let kiln = Kiln::start_tls(
        &[
            "--auth",
            "trusted-header",
            "--tls-cert",
            &c,
            "--tls-key",
            &k,
            "--tls-client-ca",
            &a,
        ],
        http.clone(),
    )?;
    // Writes and reads over TLS, h2 negotiated by ALPN; another tenant sees nothing.
    let (status, body) = kiln.ingest(
        "tls-a",
        "name=shop.cpu&from=1700000000",
        b"main;over_tls 3\n".to_vec(),
        &[],
    )?;
    ensure!(status == 200, "{status} {body}");
    let fg = kiln.flamegraph("tls-a", CPU, "{}")?;
    ensure!(fg.names.iter().any(|n| n == "over_tls"), "{:?}", fg.names);
    kiln.assert_tenant_empty("tls-b")?;
    let resp = http.get(kiln.url("/ready")).send()?;
    ensure!(
        resp.version() == reqwest::Version::HTTP_2,
        "{:?}",
        resp.version()
    );
    // Without a client certificate, or without TLS, nothing is served.
    let anonymous = client(&server_ca_pem, None)?;
    ensure!(
        anonymous.get(kiln.url("/ready")).send().is_err(),
        "served without a client certificate"
    );
    let stranger = client(&server_ca_pem, Some(&server_ca.issue("stranger", &[])?))?;
    ensure!(
        stranger.get(kiln.url("/ready")).send().is_err(),
        "served a certificate of another CA"
    );
    let plain = reqwest::blocking::Client::new();
    let url = format!("http://127.0.0.1:{}/ready", kiln.port);
    ensure!(
        !plain
            .get(&url)
            .send()
            .is_ok_and(|r| r.status().is_success()),
        "served plain HTTP"
    );
    // A renewed certificate is served to new connections within seconds, without a restart.
    ensure!(served_certificate(&http, &kiln.url("/ready"))? == cert_der);
    let (renewed, renewed_key, renewed_der) =
        server_ca.issue_der("kiln renewed", &["127.0.0.1"])?;
    std::fs::write(&key_file, &renewed_key)?;
    std::fs::write(&cert_file, &renewed)?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let fresh = client(&server_ca_pem, Some(&agent))?;
        if served_certificate(&fresh, &kiln.url("/ready"))
            .ok()
            .as_ref()
            == Some(&renewed_der)
        {
            break;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "the renewed certificate was not served: {}",
            kiln.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    ensure!(kiln.log_text().contains("TLS certificate reloaded"));
    Ok(())
}
