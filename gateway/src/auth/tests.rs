use super::*;

const SECRET: &str = "0123456789abcdef0123456789abcdef-kiln-test-secret";

fn store(dir: &Path) -> KeyStore {
    std::fs::write(dir.join("k1"), SECRET).unwrap();
    KeyStore::open(dir).unwrap()
}

fn auth(keys: KeyStore) -> Authenticator {
    Authenticator {
        mode: AuthMode::Jwt,
        keys: Some(keys),
        issuer: None,
        audience: None,
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
        &dir.path().join("k1"),
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
        &dir.path().join("k1"),
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
        &dir.path().join("k1"),
        "k1",
        "t",
        &[Scope::Read],
        60,
        None,
        None,
    )
    .unwrap();
    std::fs::write(dir.path().join("k2"), format!("{SECRET}-two")).unwrap();
    assert!(keys.reload_if_changed().unwrap());
    let a = auth(keys);
    let new = mint(
        &dir.path().join("k2"),
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
    std::fs::remove_file(dir.path().join("k1")).unwrap();
    assert!(a.keys.as_ref().unwrap().reload_if_changed().unwrap());
    let err = a.authenticate(&bearer(&old), Scope::Read).unwrap_err();
    assert!(err.message.contains("unknown key id"), "{}", err.message);
    assert!(a.authenticate(&bearer(&new), Scope::Read).is_ok());
}

#[test]
fn durations() {
    assert_eq!(parse_duration_secs("30d"), Some(30 * 86_400));
    assert_eq!(parse_duration_secs("90"), Some(90));
    assert_eq!(parse_duration_secs("3x"), None);
}
