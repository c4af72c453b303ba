//! The gateway's router in process (no sockets): ingest then query over Connect, with tenants
//! from `X-Scope-OrgID`, and the error bodies of each protocol.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use kiln_gateway::app::{App, Limits};
use kiln_gateway::metrics::Metrics;
use kiln_gateway::server::router;
use kiln_gateway::tenant::AuthMode;
use kiln_proto::querier::v1 as q;
use kiln_storage::{Storage, StorageConfig};
use prost::Message;
use tower::ServiceExt;

async fn app(dir: &std::path::Path) -> axum::Router {
    let mut config = StorageConfig::new(dir);
    config.writer.flush_interval = std::time::Duration::from_millis(10);
    let storage = Storage::open(config).await.unwrap();
    router(Arc::new(App {
        storage,
        limits: Limits::default(),
        auth: AuthMode::TrustedHeader,
        metrics: Metrics::default(),
    }))
}

async fn send(router: &axum::Router, req: Request<Body>) -> (StatusCode, Vec<u8>) {
    let resp = router.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    (
        status,
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
}

fn flamegraph_request(tenant: &str, json: bool) -> Request<Body> {
    let req = q::SelectMergeStacktracesRequest {
        profile_type_id: "process_cpu:cpu:nanoseconds:cpu:nanoseconds".into(),
        label_selector: r#"{service_name="shop"}"#.into(),
        start: 1_699_999_000_000,
        end: 1_700_001_000_000,
        ..Default::default()
    };
    let (ct, body) = if json {
        ("application/json", serde_json::to_vec(&req).unwrap())
    } else {
        ("application/proto", req.encode_to_vec())
    };
    Request::post("/querier.v1.QuerierService/SelectMergeStacktraces")
        .header("content-type", ct)
        .header("x-scope-orgid", tenant)
        .body(Body::from(body))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_then_query_per_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let router = app(dir.path()).await;
    let ingest = Request::post("/ingest?name=shop.cpu%7Benv%3Dprod%7D&from=1700000000")
        .header("x-scope-orgid", "team-a")
        .body(Body::from("main;checkout;pay 3\nmain;browse 1\n"))
        .unwrap();
    let (status, body) = send(&router, ingest).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));

    let (status, body) = send(&router, flamegraph_request("team-a", false)).await;
    assert_eq!(status, StatusCode::OK);
    let fg = q::SelectMergeStacktracesResponse::decode(body.as_slice())
        .unwrap()
        .flamegraph
        .unwrap();
    assert_eq!(fg.total, 40_000_000);
    assert!(fg.names.iter().any(|n| n == "pay"));

    // The same over Connect JSON: int64 as strings, lowerCamel names.
    let (status, body) = send(&router, flamegraph_request("team-a", true)).await;
    assert_eq!(status, StatusCode::OK);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["flamegraph"]["total"], "40000000");
    assert_eq!(v["flamegraph"]["names"][0], "total");

    // Another tenant sees nothing.
    let (status, body) = send(&router, flamegraph_request("team-b", false)).await;
    assert_eq!(status, StatusCode::OK);
    let fg = q::SelectMergeStacktracesResponse::decode(body.as_slice())
        .unwrap()
        .flamegraph
        .unwrap();
    assert_eq!(fg.total, 0);
    assert_eq!(fg.names, ["total"]);
}

#[tokio::test]
async fn errors_are_clear_per_protocol() {
    let dir = tempfile::tempdir().unwrap();
    let router = app(dir.path()).await;
    let req = Request::post("/querier.v1.QuerierService/SelectMergeStacktraces")
        .header("content-type", "application/json")
        .header("x-scope-orgid", "team-a")
        .body(Body::from(
            r#"{"profileTypeID":"nonsense","start":1,"end":2}"#,
        ))
        .unwrap();
    let (status, body) = send(&router, req).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["code"], "invalid_argument");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("invalid profile type")
    );

    let req = Request::post("/querier.v1.QuerierService/NoSuchMethod")
        .header("content-type", "application/proto")
        .header("x-scope-orgid", "team-a")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&router, req).await.0, StatusCode::NOT_FOUND);

    let req = Request::post("/ingest?name=shop.cpu")
        .body(Body::from("a;b 1"))
        .unwrap();
    let (status, body) = send(&router, req).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(String::from_utf8_lossy(&body).contains("X-Scope-OrgID"));
}
