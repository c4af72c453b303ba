//! Authentication end to end: an attack matrix on every protocol, tokens minted by
//! `kiln token create` for every key type, key rotation and revocation, JWKS keys, the `none`
//! mode's loopback guard.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use kiln_e2e::{ALL_TIME, Kiln, kiln_bin};
use kiln_proto::querier::v1 as q;
use prost::Message;

pub const ISS: &str = "kiln-e2e";
pub const AUD: &str = "kiln";

/// Server keys (public and secrets, in `server/`) and signing keys (in `private/`).
pub struct Keys {
    pub root: tempfile::TempDir,
}

impl Keys {
    pub fn server(&self) -> PathBuf {
        self.root.path().join("server")
    }
    pub fn private(&self, name: &str) -> PathBuf {
        self.root.path().join("private").join(name)
    }
}

fn openssl(args: &[&str]) -> Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .context("running openssl")?;
    ensure!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// HMAC secrets `hs1`, `hs-old`; RSA `rsa1`, ECDSA P-256 `ec1`, Ed25519 `ed1` key pairs.
pub fn make_keys() -> Result<Keys> {
    let root = tempfile::tempdir()?;
    let server = root.path().join("server");
    let private = root.path().join("private");
    std::fs::create_dir_all(&server)?;
    std::fs::create_dir_all(&private)?;
    for (name, secret) in [
        ("hs1.secret", "kiln-e2e-hmac-secret-one-0123456789abcdef"),
        ("hs-old.secret", "kiln-e2e-hmac-secret-old-0123456789abcdef"),
    ] {
        std::fs::write(server.join(name), secret)?;
        std::fs::write(private.join(name), secret)?;
    }
    let p = |n: &str| private.join(n).display().to_string();
    let s = |n: &str| server.join(n).display().to_string();
    openssl(&[
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        "rsa_keygen_bits:2048",
        "-out",
        &p("rsa1.key"),
    ])?;
    openssl(&[
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        &p("ec1.key"),
    ])?;
    openssl(&["genpkey", "-algorithm", "ED25519", "-out", &p("ed1.key")])?;
    for n in ["rsa1", "ec1", "ed1"] {
        openssl(&[
            "pkey",
            "-in",
            &p(&format!("{n}.key")),
            "-pubout",
            "-out",
            &s(&format!("{n}.pem")),
        ])?;
    }
    Ok(Keys { root })
}

/// `kiln token create …`.
pub fn kiln_token(key: &Path, tenant: &str, scope: &str, extra: &[&str]) -> Result<String> {
    let out = Command::new(kiln_bin())
        .args([
            "token", "create", "--tenant", tenant, "--scope", scope, "--ttl", "1h", "--key",
        ])
        .arg(key)
        .args(extra)
        .output()?;
    ensure!(
        out.status.success(),
        "kiln token create: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?.trim().to_owned())
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn b64url(data: &[u8]) -> String {
    kiln_otel::base64::encode_url(data)
}

/// A valid HS256 token (key `hs1`) of `tenant` with `scopes`, issuer and audience as the server wants.
pub fn hs256_token(keys: &Keys, tenant: &str, scopes: &[&str]) -> Result<String> {
    let secret = std::fs::read(keys.private("hs1.secret"))?;
    Ok(hs256(&secret, "hs1", claims(tenant, scopes)))
}

/// An HS256 token with arbitrary claims.
fn hs256(secret: &[u8], kid: &str, claims: serde_json::Value) -> String {
    let mut h = Header::new(Algorithm::HS256);
    h.kid = Some(kid.into());
    jsonwebtoken::encode(&h, &claims, &EncodingKey::from_secret(secret)).unwrap()
}

fn claims(tenant: &str, scopes: &[&str]) -> serde_json::Value {
    serde_json::json!({ "tenant": tenant, "scopes": scopes, "exp": now() + 600, "iss": ISS, "aud": AUD })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Unauthenticated,
    Forbidden,
    Other(u16),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    HttpIngest,
    ConnectPush,
    ConnectQuery,
    GrpcQuery,
    GrpcPush,
    OtlpHttp,
    OtlpGrpc,
    Admin,
}

impl Op {
    pub const ALL: [Op; 8] = [
        Op::HttpIngest,
        Op::ConnectPush,
        Op::ConnectQuery,
        Op::GrpcQuery,
        Op::GrpcPush,
        Op::OtlpHttp,
        Op::OtlpGrpc,
        Op::Admin,
    ];

    pub fn scope(self) -> &'static str {
        match self {
            Op::ConnectQuery | Op::GrpcQuery => "read",
            Op::Admin => "admin",
            _ => "write",
        }
    }
}

fn tiny_pprof() -> Vec<u8> {
    use kiln_proto::google::v1 as p;
    p::Profile {
        string_table: ["", "cpu", "nanoseconds", "authz_fn"]
            .map(String::from)
            .to_vec(),
        sample_type: vec![p::ValueType { r#type: 1, unit: 2 }],
        function: vec![p::Function {
            id: 1,
            name: 3,
            ..Default::default()
        }],
        location: vec![p::Location {
            id: 1,
            line: vec![p::Line {
                function_id: 1,
                line: 1,
            }],
            ..Default::default()
        }],
        sample: vec![p::Sample {
            location_id: vec![1],
            value: vec![10],
            label: vec![],
        }],
        ..Default::default()
    }
    .encode_to_vec()
}

fn tiny_otlp()
-> opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest {
    use opentelemetry_proto::tonic::profiles::v1development as o;
    let dict = o::ProfilesDictionary {
        string_table: vec![
            "".into(),
            "samples".into(),
            "count".into(),
            "authz_otlp".into(),
        ],
        function_table: vec![
            Default::default(),
            o::Function {
                name_strindex: 3,
                ..Default::default()
            },
        ],
        location_table: vec![
            Default::default(),
            o::Location {
                lines: vec![o::Line {
                    function_index: 1,
                    line: 1,
                    column: 0,
                }],
                ..Default::default()
            },
        ],
        stack_table: vec![
            Default::default(),
            o::Stack {
                location_indices: vec![1],
            },
        ],
        ..Default::default()
    };
    let profile = o::Profile {
        sample_type: Some(o::ValueType {
            type_strindex: 1,
            unit_strindex: 2,
        }),
        samples: vec![o::Sample {
            stack_index: 1,
            values: vec![1],
            ..Default::default()
        }],
        ..Default::default()
    };
    opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest {
        resource_profiles: vec![o::ResourceProfiles {
            scope_profiles: vec![o::ScopeProfiles {
                profiles: vec![profile],
                ..Default::default()
            }],
            ..Default::default()
        }],
        dictionary: Some(dict),
    }
}

fn http_outcome(status: u16) -> Outcome {
    match status {
        200..=299 => Outcome::Ok,
        401 => Outcome::Unauthenticated,
        403 => Outcome::Forbidden,
        s => Outcome::Other(s),
    }
}

fn grpc_outcome(r: std::result::Result<(), tonic::Status>) -> Outcome {
    match r {
        Ok(()) => Outcome::Ok,
        Err(s) if s.code() == tonic::Code::Unauthenticated => Outcome::Unauthenticated,
        Err(s) if s.code() == tonic::Code::PermissionDenied => Outcome::Forbidden,
        Err(s) => Outcome::Other(1000 + s.code() as u16),
    }
}

/// Calls `op` on `kiln` as tenant `tenant` with these headers; returns the outcome and the
/// error message.
pub fn call(
    kiln: &Kiln,
    op: Op,
    tenant: &str,
    headers: &[(String, String)],
) -> Result<(Outcome, String)> {
    let http = kiln.http();
    let with = |mut r: reqwest::blocking::RequestBuilder| {
        for (k, v) in headers {
            r = r.header(k, v);
        }
        r
    };
    let query = q::SelectMergeStacktracesRequest {
        profile_type_id: "process_cpu:cpu:nanoseconds::".into(),
        label_selector: "{}".into(),
        start: ALL_TIME.0,
        end: ALL_TIME.1,
        ..Default::default()
    };
    let push = kiln_proto::push::v1::PushRequest {
        series: vec![kiln_proto::push::v1::RawProfileSeries {
            labels: vec![kiln_proto::types::v1::LabelPair {
                name: "service_name".into(),
                value: "authz".into(),
            }],
            samples: vec![kiln_proto::push::v1::RawSample {
                raw_profile: tiny_pprof().into(),
                id: "x".into(),
            }],
            annotations: vec![],
        }],
    };
    let http_call = |r: reqwest::blocking::RequestBuilder| -> Result<(Outcome, String)> {
        let resp = with(r).send()?;
        let s = resp.status().as_u16();
        Ok((http_outcome(s), resp.text()?))
    };
    match op {
        Op::HttpIngest => http_call(
            http.post(kiln.url("/ingest?name=authz.cpu"))
                .body("main;authz 1"),
        ),
        Op::ConnectPush => http_call(
            http.post(kiln.url("/push.v1.PusherService/Push"))
                .header("Content-Type", "application/proto")
                .body(push.encode_to_vec()),
        ),
        Op::ConnectQuery => http_call(
            http.post(kiln.url("/querier.v1.QuerierService/SelectMergeStacktraces"))
                .header("Content-Type", "application/proto")
                .body(query.encode_to_vec()),
        ),
        Op::OtlpHttp => http_call(
            http.post(kiln.url("/v1development/profiles"))
                .header("Content-Type", "application/x-protobuf")
                .body(tiny_otlp().encode_to_vec()),
        ),
        Op::Admin => http_call(http.get(kiln.url(&format!("/api/v1/tenants/{tenant}/usage")))),
        Op::GrpcQuery | Op::GrpcPush | Op::OtlpGrpc => {
            let url = kiln.url("");
            let headers = headers.to_vec();
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(async move {
                let channel = tonic::transport::Channel::from_shared(url)?.connect().await?;
                let md = |mut r: tonic::metadata::MetadataMap| {
                    for (k, v) in &headers {
                        if let (Ok(k), Ok(v)) = (
                            tonic::metadata::MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes()),
                            v.parse(),
                        ) {
                            r.insert(k, v);
                        }
                    }
                    r
                };
                let result = match op {
                    Op::GrpcQuery => {
                        let mut c = q::querier_service_client::QuerierServiceClient::new(channel);
                        let mut r = tonic::Request::new(query);
                        *r.metadata_mut() = md(r.metadata().clone());
                        c.select_merge_stacktraces(r).await.map(|_| ())
                    }
                    Op::GrpcPush => {
                        let mut c = kiln_proto::push::v1::pusher_service_client::PusherServiceClient::new(channel);
                        let mut r = tonic::Request::new(push);
                        *r.metadata_mut() = md(r.metadata().clone());
                        c.push(r).await.map(|_| ())
                    }
                    _ => {
                        let mut c = opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_client::ProfilesServiceClient::new(channel);
                        let mut r = tonic::Request::new(tiny_otlp());
                        *r.metadata_mut() = md(r.metadata().clone());
                        c.export(r).await.map(|_| ())
                    }
                };
                let msg = result.as_ref().err().map(|s| s.message().to_owned()).unwrap_or_default();
                Ok((grpc_outcome(result), msg))
            })
        }
    }
}

pub fn bearer(token: &str) -> Vec<(String, String)> {
    vec![("Authorization".into(), format!("Bearer {token}"))]
}

pub fn basic(user: &str, token: &str) -> Vec<(String, String)> {
    vec![(
        "Authorization".into(),
        format!("Basic {}", b64std(format!("{user}:{token}").as_bytes())),
    )]
}

pub fn b64std(data: &[u8]) -> String {
    kiln_otel::base64::encode(data)
}

pub fn start_jwt(keys: &Keys) -> Result<Kiln> {
    let dir = keys.server().display().to_string();
    Kiln::start_with(&[
        "--auth",
        "jwt",
        "--jwt-keys",
        &dir,
        "--jwt-issuer",
        ISS,
        "--jwt-audience",
        AUD,
    ])
}

#[test]
fn attack_matrix_on_every_protocol() -> Result<()> {
    let keys = make_keys()?;
    let mut kiln = start_jwt(&keys)?;
    let secret = std::fs::read(keys.private("hs1.secret"))?;
    let rw = |t: &str| hs256(&secret, "hs1", claims(t, &["read", "write"]));
    let iss_aud = ["--issuer", ISS, "--audience", AUD];

    // Rotation: a token of hs-old works, then hs-old is deleted and its tokens stop working.
    let old = kiln_token(
        &keys.private("hs-old.secret"),
        "team-a",
        "read,write,admin",
        &iss_aud,
    )?;
    ensure!(
        call(&kiln, Op::ConnectQuery, "team-a", &bearer(&old))?.0 == Outcome::Ok,
        "the old key works before rotation"
    );
    std::fs::remove_file(keys.server().join("hs-old.secret"))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while call(&kiln, Op::ConnectQuery, "team-a", &bearer(&old))?.0 == Outcome::Ok {
        ensure!(
            Instant::now() < deadline,
            "the deleted key still works after 10 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let mut none = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims("team-a", &["read", "write", "admin"]),
        &EncodingKey::from_secret(&secret),
    )?;
    none = {
        let parts: Vec<&str> = none.split('.').collect();
        format!(
            "{}.{}.",
            b64url(br#"{"alg":"none","typ":"JWT","kid":"hs1"}"#),
            parts[1]
        )
    };
    let rsa_pub = std::fs::read(keys.server().join("rsa1.pem"))?;
    let rsa_as_hmac = hs256(
        &rsa_pub,
        "rsa1",
        claims("team-a", &["read", "write", "admin"]),
    );
    let mut bad_sig = rw("team-a");
    let last = bad_sig.pop().unwrap();
    bad_sig.push(if last == 'A' { 'B' } else { 'A' });
    let mut expired = claims("team-a", &["read", "write", "admin"]);
    expired["exp"] = (now() - 3600).into();
    let mut immature = claims("team-a", &["read", "write", "admin"]);
    immature["nbf"] = (now() + 3600).into();
    let mut wrong_iss = claims("team-a", &["read", "write", "admin"]);
    wrong_iss["iss"] = "somebody-else".into();
    let mut wrong_aud = claims("team-a", &["read", "write", "admin"]);
    wrong_aud["aud"] = "other-service".into();
    let unknown_kid = hs256(
        &secret,
        "no-such-key",
        claims("team-a", &["read", "write", "admin"]),
    );
    let read_only = hs256(&secret, "hs1", claims("team-a", &["read"]));
    let write_only = hs256(&secret, "hs1", claims("team-a", &["write"]));

    let unauth_cases: Vec<(&str, Vec<(String, String)>)> = vec![
        ("missing token", vec![]),
        ("malformed token", bearer("not.a.jwt")),
        ("alg none", bearer(&none)),
        ("RSA public key as HMAC secret", bearer(&rsa_as_hmac)),
        ("bad signature", bearer(&bad_sig)),
        ("expired", bearer(&hs256(&secret, "hs1", expired))),
        ("not yet valid", bearer(&hs256(&secret, "hs1", immature))),
        ("wrong issuer", bearer(&hs256(&secret, "hs1", wrong_iss))),
        ("wrong audience", bearer(&hs256(&secret, "hs1", wrong_aud))),
        ("unknown kid", bearer(&unknown_kid)),
        ("revoked key after rotation", bearer(&old)),
    ];
    let mut checked = 0;
    for op in Op::ALL {
        for (what, headers) in &unauth_cases {
            let (outcome, msg) = call(&kiln, op, "team-a", headers)?;
            ensure!(
                outcome == Outcome::Unauthenticated,
                "{op:?} / {what}: {outcome:?} {msg}"
            );
            ensure!(!msg.is_empty(), "{op:?} / {what}: no message");
            checked += 1;
        }
        // Scope: a read token writing, a write token reading, a non-admin token on the admin API.
        let wrong_scope = match op.scope() {
            "write" => read_only.clone(),
            "read" => write_only.clone(),
            _ => rw("team-a"),
        };
        let forbidden_cases: Vec<(&str, Vec<(String, String)>)> = vec![
            ("wrong scope", bearer(&wrong_scope)),
            (
                "basic user is not the token's tenant",
                basic("team-b", &rw("team-a")),
            ),
            ("token of A with X-Scope-OrgID: B", {
                let mut h = bearer(&hs256(
                    &secret,
                    "hs1",
                    claims("team-a", &["read", "write", "admin"]),
                ));
                h.push(("X-Scope-OrgID".into(), "team-b".into()));
                h
            }),
        ];
        for (what, headers) in &forbidden_cases {
            let (outcome, msg) = call(&kiln, op, "team-a", headers)?;
            ensure!(
                outcome == Outcome::Forbidden,
                "{op:?} / {what}: {outcome:?} {msg}"
            );
            ensure!(!msg.is_empty(), "{op:?} / {what}: no message");
            checked += 1;
        }
    }
    eprintln!("attack matrix: {checked} refused calls checked");

    // Nothing was written by any refused call.
    kiln.set_auth(bearer(&rw("team-a")));
    kiln.assert_tenant_empty("team-a")?;
    kiln.set_auth(bearer(&rw("team-b")));
    kiln.assert_tenant_empty("team-b")?;

    // Positive controls: valid credentials pass on every protocol, for every key type.
    let admin = hs256(
        &secret,
        "hs1",
        claims("team-a", &["read", "write", "admin"]),
    );
    for op in Op::ALL {
        let (outcome, msg) = call(&kiln, op, "team-a", &bearer(&admin))?;
        ensure!(
            outcome == Outcome::Ok,
            "{op:?} with a valid token: {outcome:?} {msg}"
        );
    }
    let (outcome, msg) = call(&kiln, Op::HttpIngest, "team-a", &basic("team-a", &admin))?;
    ensure!(
        outcome == Outcome::Ok,
        "basic auth with the tenant as user: {outcome:?} {msg}"
    );
    for key in ["rsa1.key", "ec1.key", "ed1.key", "hs1.secret"] {
        let token = kiln_token(&keys.private(key), "team-a", "read", &iss_aud)?;
        let (outcome, msg) = call(&kiln, Op::GrpcQuery, "team-a", &bearer(&token))?;
        ensure!(outcome == Outcome::Ok, "{key}: {outcome:?} {msg}");
    }
    // kiln token inspect shows the claims.
    let out = Command::new(kiln_bin())
        .args(["token", "inspect", &admin])
        .output()?;
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    ensure!(
        shown["claims"]["tenant"] == "team-a" && shown["header"]["kid"] == "hs1",
        "{shown}"
    );

    // What the positive controls wrote is team-a's only.
    kiln.set_auth(bearer(&rw("team-a")));
    ensure!(!kiln.profile_types("team-a")?.is_empty());
    kiln.set_auth(bearer(&rw("team-b")));
    kiln.assert_tenant_empty("team-b")?;
    Ok(())
}

#[test]
fn jwks_keys_select_by_kid() -> Result<()> {
    let keys = make_keys()?;
    // A JWKS with the RSA public key (modulus and exponent from openssl) and an HMAC key.
    let out = Command::new("openssl")
        .args(["rsa", "-pubin", "-in"])
        .arg(keys.server().join("rsa1.pem"))
        .args(["-noout", "-modulus"])
        .output()?;
    let hex = String::from_utf8(out.stdout)?
        .trim()
        .trim_start_matches("Modulus=")
        .to_owned();
    let n: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    let secret = b"kiln-e2e-jwks-hmac-secret-0123456789abcdef";
    let jwks = serde_json::json!({ "keys": [
        { "kty": "RSA", "kid": "jwks-rsa", "use": "sig", "alg": "RS256", "n": b64url(&n), "e": "AQAB" },
        { "kty": "oct", "kid": "jwks-hmac", "alg": "HS256", "k": b64url(secret) },
    ]});
    let path = keys.root.path().join("keys.json");
    std::fs::write(&path, jwks.to_string())?;
    let kiln = Kiln::start_with(&["--auth", "jwt", "--jwt-keys", &path.display().to_string()])?;
    let rsa = kiln_token(
        &keys.private("rsa1.key"),
        "jwks-team",
        "read",
        &["--kid", "jwks-rsa"],
    )?;
    ensure!(call(&kiln, Op::ConnectQuery, "jwks-team", &bearer(&rsa))?.0 == Outcome::Ok);
    let hmac = hs256(
        secret,
        "jwks-hmac",
        serde_json::json!({ "tenant": "jwks-team", "scopes": ["read"], "exp": now() + 60 }),
    );
    ensure!(call(&kiln, Op::ConnectQuery, "jwks-team", &bearer(&hmac))?.0 == Outcome::Ok);
    // The RSA key signs only for its own kid.
    let wrong = kiln_token(
        &keys.private("rsa1.key"),
        "jwks-team",
        "read",
        &["--kid", "jwks-hmac"],
    )?;
    ensure!(
        call(&kiln, Op::ConnectQuery, "jwks-team", &bearer(&wrong))?.0 == Outcome::Unauthenticated
    );
    Ok(())
}

#[test]
fn anonymous_mode_refuses_public_addresses() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let out = Command::new(kiln_bin())
        .args([
            "serve",
            "--auth",
            "none",
            "--listen",
            "0.0.0.0:0",
            "--data-dir",
        ])
        .arg(dir.path())
        .output()?;
    ensure!(!out.status.success(), "kiln must refuse to start");
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(err.contains("--insecure-allow-anonymous"), "{err}");
    let out = Command::new(kiln_bin())
        .args(["serve", "--auth", "jwt"])
        .arg("--data-dir")
        .arg(dir.path())
        .output()?;
    ensure!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--jwt-keys"));
    Ok(())
}

/// The SDKs authenticate as Grafana Cloud users do: pyroscope-io with basic auth (user = tenant,
/// password = token), @pyroscope/nodejs with a bearer token; each writes to its own tenant and
/// can read only it.
#[test]
fn real_clients_authenticate_and_stay_in_their_tenants() -> Result<()> {
    let tools = kiln_e2e::Tools::find()?;
    let keys = make_keys()?;
    let mut kiln = start_jwt(&keys)?;
    let iss_aud = ["--issuer", ISS, "--audience", AUD];
    let py_token = kiln_token(
        &keys.private("ed1.key"),
        "py-tenant",
        "read,write",
        &iss_aud,
    )?;
    let node_token = kiln_token(
        &keys.private("rsa1.key"),
        "node-tenant",
        "read,write",
        &iss_aud,
    )?;

    let out = Command::new(&tools.python)
        .arg(kiln_e2e::repo_root().join("e2e/clients/python/pyroscope_app.py"))
        .arg(kiln.url(""))
        .args(["auth-py-app", "2"])
        .env("KILN_BASIC_USER", "py-tenant")
        .env("KILN_BASIC_PASSWORD", &py_token)
        .output()?;
    ensure!(
        out.status.success(),
        "pyroscope-io: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&tools.node)
        .current_dir(&tools.node_dir)
        .arg("app.js")
        .arg(kiln.url(""))
        .args(["auth-node-app", "3"])
        .env("KILN_AUTH_TOKEN", &node_token)
        .output()?;
    ensure!(
        out.status.success(),
        "@pyroscope/nodejs: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    kiln.set_auth(basic("py-tenant", &py_token));
    let types = kiln.profile_types("py-tenant")?;
    let cpu = types
        .iter()
        .find(|t| t.sample_type == "cpu")
        .context("py-tenant cpu")?;
    let fg = kiln.flamegraph("py-tenant", &cpu.id, "{}")?;
    ensure!(
        fg.names.iter().any(|n| n.contains("kiln_py_fib")),
        "{:?}",
        fg.names
    );
    ensure!(
        !fg.names.iter().any(|n| n.contains("kilnNodeFib")),
        "py-tenant sees node's functions"
    );
    let services: kiln_proto::types::v1::LabelValuesResponse = kiln.connect(
        "py-tenant",
        "/querier.v1.QuerierService/LabelValues",
        &kiln_proto::types::v1::LabelValuesRequest {
            name: "service_name".into(),
            matchers: vec![],
            start: ALL_TIME.0,
            end: ALL_TIME.1,
        },
    )?;
    ensure!(services.names == ["auth-py-app"], "{:?}", services.names);

    kiln.set_auth(bearer(&node_token));
    let types = kiln.profile_types("node-tenant")?;
    let wall = types
        .iter()
        .find(|t| t.sample_type == "wall")
        .context("node-tenant wall")?;
    let fg = kiln.flamegraph("node-tenant", &wall.id, "{}")?;
    ensure!(
        fg.names.iter().any(|n| n.contains("kilnNodeFib")),
        "{:?}",
        fg.names
    );
    ensure!(
        !types
            .iter()
            .any(|t| t.id == cpu.id && t.sample_type == "cpu" && t.name == "process_cpu"),
        "node-tenant sees py's types: {types:?}"
    );
    // One tenant's token cannot read the other tenant, even by asking for it.
    let mut h = bearer(&node_token);
    h.push(("X-Scope-OrgID".into(), "py-tenant".into()));
    ensure!(call(&kiln, Op::ConnectQuery, "py-tenant", &h)?.0 == Outcome::Forbidden);
    Ok(())
}

/// The admin API: list tenants with usage, one tenant's usage, erase a tenant.
#[test]
fn admin_api_meters_usage_and_erases_tenants() -> Result<()> {
    let keys = make_keys()?;
    let dir = keys.server().display().to_string();
    let mut kiln = Kiln::start_with(&[
        "--auth",
        "jwt",
        "--jwt-keys",
        &dir,
        "--jwt-issuer",
        ISS,
        "--jwt-audience",
        AUD,
        "--admin-tenant",
        "ops",
    ])?;
    let secret = std::fs::read(keys.private("hs1.secret"))?;
    let writer = |t: &str| hs256(&secret, "hs1", claims(t, &["read", "write"]));
    let admin = hs256(&secret, "hs1", claims("ops", &["admin"]));
    for (tenant, n) in [("metered-a", 3), ("metered-b", 1)] {
        kiln.set_auth(bearer(&writer(tenant)));
        for i in 0..n {
            let (s, b) = kiln.ingest(
                tenant,
                "name=m.cpu&from=1700000000",
                format!("main;work{i} 5\n").into_bytes(),
                &[],
            )?;
            ensure!(s == 200, "{s} {b}");
        }
        let (s, _) = kiln.ingest(tenant, "name=m.cpu&format=pdf", b"x".to_vec(), &[])?;
        ensure!(s == 400);
    }
    fn get(kiln: &Kiln, admin: &str, path: &str) -> Result<serde_json::Value> {
        let r = kiln
            .http()
            .get(kiln.url(path))
            .header("Authorization", format!("Bearer {admin}"))
            .send()?;
        ensure!(r.status().is_success(), "{path}: {}", r.status());
        Ok(r.json()?)
    }
    let usage = get(&kiln, &admin, "/api/v1/tenants/metered-a/usage")?;
    ensure!(usage["profiles"] == 3 && usage["samples"] == 3, "{usage}");
    ensure!(
        usage["received_bytes"].as_u64().unwrap() > 0
            && usage["stored_bytes"].as_u64().unwrap() > 0,
        "{usage}"
    );
    ensure!(usage["refused"]["invalid"] == 1, "{usage}");
    let list = get(&kiln, &admin, "/api/v1/tenants")?;
    let ids: Vec<&str> = list["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tenant"].as_str().unwrap())
        .collect();
    ensure!(
        ids.contains(&"metered-a") && ids.contains(&"metered-b"),
        "{list}"
    );

    // A tenant's own admin token administers that tenant only.
    let b_admin = hs256(&secret, "hs1", claims("metered-b", &["admin"]));
    let own = kiln
        .http()
        .get(kiln.url("/api/v1/tenants/metered-b/usage"))
        .header("Authorization", format!("Bearer {b_admin}"))
        .send()?;
    ensure!(own.status().is_success(), "own usage: {}", own.status());
    let other = kiln
        .http()
        .delete(kiln.url("/api/v1/tenants/metered-a"))
        .header("Authorization", format!("Bearer {b_admin}"))
        .send()?;
    ensure!(
        other.status().as_u16() == 403,
        "cross-tenant delete: {}",
        other.status()
    );
    let all = kiln
        .http()
        .get(kiln.url("/api/v1/tenants"))
        .header("Authorization", format!("Bearer {b_admin}"))
        .send()?;
    ensure!(
        all.status().as_u16() == 403,
        "listing every tenant: {}",
        all.status()
    );

    // A writer may not use the admin API.
    let r = kiln
        .http()
        .get(kiln.url("/api/v1/tenants"))
        .header("Authorization", format!("Bearer {}", writer("metered-a")))
        .send()?;
    ensure!(r.status().as_u16() == 403);

    // Erase metered-a: its data is gone, metered-b's stays.
    let r = kiln
        .http()
        .delete(kiln.url("/api/v1/tenants/metered-a"))
        .header("Authorization", format!("Bearer {admin}"))
        .send()?;
    ensure!(r.status().is_success());
    let body: serde_json::Value = r.json()?;
    ensure!(body["deleted_blocks"].as_u64().unwrap() >= 1, "{body}");
    kiln.set_auth(bearer(&writer("metered-a")));
    kiln.assert_tenant_empty("metered-a")?;
    kiln.set_auth(bearer(&writer("metered-b")));
    ensure!(
        kiln.flamegraph(
            "metered-b",
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            "{}"
        )?
        .total
            == 50_000_000
    );
    ensure!(get(&kiln, &admin, "/api/v1/tenants/metered-a/usage")?["stored_bytes"] == 0);
    Ok(())
}

/// `/metrics` names every tenant in its label values: with `--auth jwt` the API port serves it
/// only to an admin token of the operator tenant; `--admin-listen` serves it without credentials
/// on an address of the operator's choosing.
#[test]
fn metrics_need_the_operator_admin_token_in_jwt_mode() -> Result<()> {
    let keys = make_keys()?;
    let dir = keys.server().display().to_string();
    let admin_port = kiln_e2e::free_port().to_string();
    let admin_addr = format!("127.0.0.1:{admin_port}");
    let mut kiln = Kiln::start_with(&[
        "--auth",
        "jwt",
        "--jwt-keys",
        &dir,
        "--jwt-issuer",
        ISS,
        "--jwt-audience",
        AUD,
        "--admin-tenant",
        "ops",
        "--admin-listen",
        &admin_addr,
    ])?;
    let secret = std::fs::read(keys.private("hs1.secret"))?;
    let writer = hs256(&secret, "hs1", claims("metrics-a", &["read", "write"]));
    kiln.set_auth(bearer(&writer));
    let (s, b) = kiln.ingest("metrics-a", "name=m.cpu", b"main;work 5\n".to_vec(), &[])?;
    ensure!(s == 200, "{s} {b}");

    // A client of its own: `set_auth` gave the harness's client the writer's token.
    let http = reqwest::blocking::Client::new();
    let scrape = |url: String, token: Option<&str>| -> Result<(u16, String)> {
        let mut req = http.get(url);
        if let Some(t) = token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let r = req.send()?;
        Ok((r.status().as_u16(), r.text()?))
    };
    let on_api = kiln.url("/metrics");
    let (s, b) = scrape(on_api.clone(), None)?;
    ensure!(s == 401 && !b.contains("kiln_"), "{s} {b}");
    // A tenant's own tokens, even its admin token, do not show other tenants' ids.
    let tenant_admin = hs256(&secret, "hs1", claims("metrics-a", &["admin"]));
    for token in [&writer, &tenant_admin] {
        let (s, b) = scrape(on_api.clone(), Some(token))?;
        ensure!(s == 403 && !b.contains("kiln_"), "{s} {b}");
    }
    let operator = hs256(&secret, "hs1", claims("ops", &["admin"]));
    let (s, b) = scrape(on_api, Some(&operator))?;
    ensure!(
        s == 200 && b.contains("tenant=\"metrics-a\""),
        "{s} {}",
        &b[..b.len().min(300)]
    );
    // The admin listener: metrics and readiness, no credentials, and nothing else.
    let (s, b) = scrape(format!("http://{admin_addr}/metrics"), None)?;
    ensure!(s == 200 && b.contains("tenant=\"metrics-a\""), "{s}");
    let (s, _) = scrape(format!("http://{admin_addr}/ready"), None)?;
    ensure!(s == 200);
    let r = http
        .post(format!("http://{admin_addr}/ingest?name=x"))
        .body("main 1\n")
        .send()?;
    ensure!(r.status() == 404, "{}", r.status());
    Ok(())
}
