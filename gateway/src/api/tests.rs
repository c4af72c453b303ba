use axum::http::header;

use super::*;

#[test]
fn paths_match_by_segment() {
    let (e, last) = endpoint_of("/api/v1/tenants/acme/usage").unwrap();
    assert_eq!(e.path, "/api/v1/tenants/{id}/usage");
    assert_eq!(last, "usage");
    assert!(endpoint_of("/api/v1/tenants/a/b/c").is_none());
    assert!(endpoint_of("/api/v1/tenants//usage").is_none());
    assert_eq!(
        method_name("/querier.v1.QuerierService/SelectSeries"),
        "querier.v1.QuerierService/SelectSeries"
    );
    assert_eq!(
        method_name("/querier.v1.QuerierService/Nope"),
        "querier.v1.QuerierService/unknown"
    );
    assert_eq!(
        method_name("/vcs.v1.VCSService/GithubApp"),
        "vcs.v1.VCSService"
    );
    assert_eq!(method_name("/nothing/here"), "other");
}

#[test]
fn every_path_is_listed_once() {
    let mut seen = std::collections::HashSet::new();
    for e in table() {
        assert!(
            seen.insert((e.path.clone(), e.verb as u8)),
            "{} twice",
            e.path
        );
    }
}

#[test]
fn methods_are_bounded_names() {
    assert_eq!(api_method("/ingest"), "ingest");
    assert_eq!(
        api_method("/querier.v1.QuerierService/SelectSeries"),
        "querier.v1.QuerierService/SelectSeries"
    );
    assert_eq!(
        api_method("/querier.v1.QuerierService/Whatever123"),
        "querier.v1.QuerierService/unknown"
    );
    assert_eq!(
        api_method("/api/v1/tenants/acme/usage"),
        "admin.tenant.usage"
    );
    assert_eq!(api_method("/api/v1/tenants/acme"), "admin.tenant");
    assert_eq!(api_method("/random/path/12345"), "other");
    assert_eq!(api_method("/pyroscope/render"), "pyroscope.render");
    assert_eq!(
        api_method("/pyroscope/render-diff"),
        "pyroscope.render-diff"
    );
    assert_eq!(api_method("/pyroscope/labels"), "pyroscope.labels");
    assert_eq!(
        api_method("/pyroscope/label-values"),
        "pyroscope.label-values"
    );
    for path in [
        "/ingest",
        "/metrics",
        "/x",
        "/api/v1/tenants/a/b/c",
        "/pyroscope/render",
        "/pyroscope/label-values",
        "/settings.v1.SettingsService/Get",
    ] {
        assert!(api_methods().contains(&api_method(path).to_owned()));
    }
    for m in querier::QUERIER_METHODS {
        assert_eq!(api_method(&format!("/{m}")), *m);
    }
}

#[test]
fn transports_come_from_the_table() {
    let none = HeaderMap::new();
    let mut grpc = HeaderMap::new();
    grpc.insert(header::CONTENT_TYPE, "application/grpc".parse().unwrap());
    assert_eq!(
        transport("/settings.v1.SettingsService/Get", &none),
        "connect"
    );
    assert_eq!(transport("/push.v1.PusherService/Push", &none), "connect");
    assert_eq!(transport("/push.v1.PusherService/Push", &grpc), "grpc");
    let mut web = HeaderMap::new();
    web.insert(
        header::CONTENT_TYPE,
        "application/grpc-web+proto".parse().unwrap(),
    );
    assert_eq!(
        transport("/querier.v1.QuerierService/Series", &web),
        "grpc-web"
    );
    assert_eq!(transport("/ingest", &none), "http");
    assert_eq!(transport("/unknown", &none), "http");
}
