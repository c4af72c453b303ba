use std::path::Path;

use axum::http::header;
use jsonwebtoken::Algorithm;

use super::*;

const SECRET: &str = "0123456789abcdef0123456789abcdef-kiln-test-secret";

fn store(dir: &Path) -> KeyStore {
    std::fs::write(dir.join("k1.secret"), SECRET).unwrap();
    KeyStore::open(dir).unwrap()
}

fn auth(keys: KeyStore) -> Authenticator {
    Authenticator {
        mode: AuthMode::Jwt,
        keys: Some(keys),
        issuer: None,
        audience: None,
        admin_tenant: None,
    }
}

fn bearer(token: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        header::AUTHORIZATION,
        format!("Bearer {token}").parse().unwrap(),
    );
    h
}

#[test]
fn minted_tokens_verify_with_scopes() {
    let dir = tempfile::tempdir().unwrap();
    let a = auth(store(dir.path()));
    let token = mint(
        &dir.path().join("k1.secret"),
        "k1",
        "team-a",
        &[Scope::Read],
        60,
        None,
        None,
    )
    .unwrap();
    let p = a.authenticate(&bearer(&token), Scope::Read).unwrap();
    assert_eq!(p.tenant, "team-a");
    let err = a.authenticate(&bearer(&token), Scope::Write).unwrap_err();
    assert_eq!(err.kind, ErrorKind::PermissionDenied);
    assert!(err.message.contains("write scope"), "{}", err.message);
}

#[test]
fn basic_auth_user_must_match_the_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let a = auth(store(dir.path()));
    let token = mint(
        &dir.path().join("k1.secret"),
        "k1",
        "team-a",
        &[Scope::Write],
        60,
        None,
        None,
    )
    .unwrap();
    let basic = |user: &str| {
        let mut h = HeaderMap::new();
        let raw = format!("{user}:{token}");
        let enc = kiln_otel::base64::encode(raw.as_bytes());
        h.insert(
            header::AUTHORIZATION,
            format!("Basic {enc}").parse().unwrap(),
        );
        h
    };
    assert_eq!(
        a.authenticate(&basic("team-a"), Scope::Write)
            .unwrap()
            .tenant,
        "team-a"
    );
    assert_eq!(
        a.authenticate(&basic(""), Scope::Write).unwrap().tenant,
        "team-a"
    );
    let err = a.authenticate(&basic("team-b"), Scope::Write).unwrap_err();
    assert_eq!(err.kind, ErrorKind::PermissionDenied);
}

#[test]
fn rotation_and_revocation_follow_the_key_directory() {
    let dir = tempfile::tempdir().unwrap();
    let keys = store(dir.path());
    let old = mint(
        &dir.path().join("k1.secret"),
        "k1",
        "t",
        &[Scope::Read],
        60,
        None,
        None,
    )
    .unwrap();
    std::fs::write(dir.path().join("k2.secret"), format!("{SECRET}-two")).unwrap();
    assert!(keys.reload_if_changed().unwrap());
    let a = auth(keys);
    let new = mint(
        &dir.path().join("k2.secret"),
        "k2",
        "t",
        &[Scope::Read],
        60,
        None,
        None,
    )
    .unwrap();
    assert!(a.authenticate(&bearer(&old), Scope::Read).is_ok());
    assert!(a.authenticate(&bearer(&new), Scope::Read).is_ok());
    std::fs::remove_file(dir.path().join("k1.secret")).unwrap();
    assert!(a.keys.as_ref().unwrap().reload_if_changed().unwrap());
    let err = a.authenticate(&bearer(&old), Scope::Read).unwrap_err();
    assert!(err.message.contains("unknown key id"), "{}", err.message);
    assert!(a.authenticate(&bearer(&new), Scope::Read).is_ok());
}

#[test]
fn only_secret_files_are_hmac_secrets() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ops.pub"),
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ0kVbP3oR0ZO9e4dqO+ops-laptop-key",
    )
    .unwrap();
    std::fs::write(dir.path().join("good.secret"), SECRET).unwrap();
    let keys = KeyStore::open(dir.path()).unwrap();
    assert!(keys.keys().contains_key("good"));
    assert!(
        !keys.keys().contains_key("ops"),
        "an SSH public key must never become an HMAC secret"
    );
}

#[test]
fn issuer_and_audience_are_required_when_configured() {
    let dir = tempfile::tempdir().unwrap();
    let keys = store(dir.path());
    let a = Authenticator {
        mode: AuthMode::Jwt,
        keys: Some(keys),
        issuer: Some("idp".into()),
        audience: Some("kiln".into()),
        admin_tenant: None,
    };
    let key = dir.path().join("k1.secret");
    let bare = mint(&key, "k1", "t", &[Scope::Read], 60, None, None).unwrap();
    let err = a.authenticate(&bearer(&bare), Scope::Read).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Unauthenticated, "{}", err.message);
    let full = mint(
        &key,
        "k1",
        "t",
        &[Scope::Read],
        60,
        Some("idp".into()),
        Some("kiln".into()),
    )
    .unwrap();
    assert!(a.authenticate(&bearer(&full), Scope::Read).is_ok());
    // An array audience that includes Kiln is accepted.
    let claims = serde_json::json!({ "tenant": "t", "scopes": ["read"], "exp": now_secs() + 60, "iss": "idp", "aud": ["other", "kiln"] });
    let mut h = jsonwebtoken::Header::new(Algorithm::HS256);
    h.kid = Some("k1".into());
    let token = jsonwebtoken::encode(
        &h,
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .unwrap();
    assert!(a.authenticate(&bearer(&token), Scope::Read).is_ok());
}

#[test]
fn two_tenant_headers_are_refused() {
    let a = Authenticator::trusted_header();
    let mut h = HeaderMap::new();
    h.append(ORG_ID_HEADER, "a".parse().unwrap());
    h.append(ORG_ID_HEADER, "b".parse().unwrap());
    assert!(a.authenticate(&h, Scope::Read).is_err());
}

fn org(headers: &mut HeaderMap, value: &str) {
    headers.insert(ORG_ID_HEADER, value.parse().unwrap());
}

#[test]
fn a_read_may_span_the_tenants_the_header_names() {
    let a = Authenticator::trusted_header();
    let mut h = HeaderMap::new();
    org(&mut h, "b|a|b");
    let p = a.authenticate(&h, Scope::Read).unwrap();
    assert_eq!(p.reads.to_string(), "a|b");
    assert!(p.reads.spans_tenants());
    let err = a.authenticate(&h, Scope::Write).unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidInput);
    assert!(err.message.contains("only reads"), "{}", err.message);
    org(&mut h, "a|b/c");
    assert!(a.authenticate(&h, Scope::Read).is_err());
    org(&mut h, "a||b");
    assert!(a.authenticate(&h, Scope::Read).is_err());
}

#[test]
fn a_token_reads_only_the_tenants_it_names() {
    let dir = tempfile::tempdir().unwrap();
    let a = auth(store(dir.path()));
    let key = dir.path().join("k1.secret");
    let grant = Grant {
        tenant: "a".into(),
        reads: vec!["b".into()],
        scopes: vec![Scope::Read, Scope::Write],
        ttl_secs: 60,
        issuer: None,
        audience: None,
    };
    let both = mint_grant(&key, "k1", &grant).unwrap();
    let only_a = mint(&key, "k1", "a", &[Scope::Read], 60, None, None).unwrap();

    // No header: the token's own tenant.
    let p = a.authenticate(&bearer(&both), Scope::Read).unwrap();
    assert_eq!(p.reads.to_string(), "a");
    let mut h = bearer(&both);
    org(&mut h, "a|b");
    assert_eq!(
        a.authenticate(&h, Scope::Read).unwrap().reads.to_string(),
        "a|b"
    );
    // Another tenant is read, never written.
    let mut h = bearer(&both);
    org(&mut h, "b");
    let p = a.authenticate(&h, Scope::Read).unwrap();
    assert_eq!(p.reads.to_string(), "b");
    let err = a.authenticate(&h, Scope::Write).unwrap_err();
    assert_eq!(err.kind, ErrorKind::PermissionDenied);

    let mut h = bearer(&only_a);
    org(&mut h, "a|b");
    let err = a.authenticate(&h, Scope::Read).unwrap_err();
    assert_eq!(err.kind, ErrorKind::PermissionDenied);
    assert!(err.message.contains("\"b\""), "{}", err.message);
}

#[test]
fn single_tenant_mode_ignores_the_tenant_header() {
    let a = Authenticator::none();
    let mut h = HeaderMap::new();
    org(&mut h, "not a tenant|b");
    let p = a.authenticate(&h, Scope::Write).unwrap();
    assert_eq!(p.reads.to_string(), ANONYMOUS);
}
