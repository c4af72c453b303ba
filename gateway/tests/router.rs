//! The gateway's router in process (no sockets): ingest then query over Connect, with tenants
//! from `X-Scope-OrgID`, and the error bodies of each protocol.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use kiln_gateway::app::App;
use kiln_gateway::auth::Authenticator;
use kiln_gateway::server::router;
use kiln_gateway::tenants::Tenants;
use kiln_proto::querier::v1 as q;
use kiln_storage::{Storage, StorageConfig};
use prost::Message;
use tower::ServiceExt;

/// The tenant whose `X-Scope-OrgID` may read `/metrics` (`--admin-tenant`).
const OPERATOR: &str = "ops";

/// Trusted-header authentication with an operator tenant.
fn operator_auth() -> Authenticator {
    let mut auth = Authenticator::trusted_header();
    auth.admin_tenant = Some(OPERATOR.into());
    auth
}

/// A scrape of `/metrics` as the operator's proxy sends it.
fn metrics_request() -> Request<Body> {
    Request::get("/metrics")
        .header("x-scope-orgid", OPERATOR)
        .body(Body::empty())
        .unwrap()
}

async fn app(dir: &std::path::Path) -> axum::Router {
    let mut config = StorageConfig::new(dir);
    config.writer.flush_interval = std::time::Duration::from_millis(10);
    let storage = Storage::open(config).await.unwrap();
    router(Arc::new(App::new(
        storage,
        operator_auth(),
        Tenants::defaults(),
    )))
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

    // A sixth `:delta` part of the profile type is accepted and ignored, as Pyroscope does.
    let mut req = q::SelectMergeStacktracesRequest::decode(
        axum::body::to_bytes(flamegraph_request("team-a", false).into_body(), usize::MAX)
            .await
            .unwrap(),
    )
    .unwrap();
    req.profile_type_id.push_str(":delta");
    let (status, body) = send(
        &router,
        Request::post("/querier.v1.QuerierService/SelectMergeStacktraces")
            .header("content-type", "application/proto")
            .header("x-scope-orgid", "team-a")
            .body(Body::from(req.encode_to_vec()))
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let fg = q::SelectMergeStacktracesResponse::decode(body.as_slice())
        .unwrap()
        .flamegraph
        .unwrap();
    assert_eq!(fg.total, 40_000_000);

    // What each query read is in a header: the blocks, rows and bytes from the store.
    let stats = |resp: &axum::http::Response<Body>| -> kiln_storage::query::QueryStats {
        resp.headers()["kiln-query-stats"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    let resp = router
        .clone()
        .oneshot(flamegraph_request("team-a", false))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let a = stats(&resp);
    // The third query of the same range: its block came from the partial-result cache.
    assert!(a.blocks >= 1, "{a:?}");
    assert_eq!((a.blocks_cached, a.rows_read), (a.blocks, 0), "{a:?}");
    // `Cache-Control: no-store` reads the rows again.
    let mut req = flamegraph_request("team-a", false);
    req.headers_mut()
        .insert("cache-control", "no-store".parse().unwrap());
    let resp = router.clone().oneshot(req).await.unwrap();
    let fresh = stats(&resp);
    assert_eq!(fresh.blocks_cached, 0, "{fresh:?}");
    assert!(fresh.rows_read >= 2, "{fresh:?}");
    let resp = router
        .clone()
        .oneshot(flamegraph_request("team-b", false))
        .await
        .unwrap();
    let b = stats(&resp);
    assert_eq!((b.blocks, b.bytes_read, b.rows_read), (0, 0, 0), "{b:?}");

    // Another tenant sees nothing.
    let (status, body) = send(&router, flamegraph_request("team-b", false)).await;
    assert_eq!(status, StatusCode::OK);
    let fg = q::SelectMergeStacktracesResponse::decode(body.as_slice())
        .unwrap()
        .flamegraph
        .unwrap();
    assert_eq!(fg.total, 0);
    assert_eq!(fg.names, ["total"]);

    // The queries went through the symbol cache: its lookups and misses are on /metrics.
    let (status, body) = send(&router, metrics_request()).await;
    assert_eq!(status, StatusCode::OK);
    let metrics = String::from_utf8(body).unwrap();
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{metrics}"))
    };
    let lookups = value("kiln_storage_cache_lookups{cache=\"symbols\"}");
    let misses = value("kiln_storage_cache_misses{cache=\"symbols\"}");
    // The segment's symbols were cached as it was written: no query read them.
    assert!(lookups >= 2.0 && misses == 0.0, "{lookups} {misses}");
    assert!(value("kiln_storage_cache_lookups{cache=\"parquet_metadata\"}") >= 1.0);
    // Partial results: the queries' ranges cover the block whole (it is not compacted, but
    // whole), so the later ones were answered from the cache.
    let results = value("kiln_storage_cache_lookups{cache=\"partial_results\"}");
    assert!(
        results >= 2.0 && value("kiln_storage_cache_misses{cache=\"partial_results\"}") < results
    );
    // Bytes read per query, by method.
    assert!(
        value("kiln_query_read_bytes_count{method=\"SelectMergeStacktraces\"}") >= 5.0,
        "{metrics}"
    );
    // The segment was queried as the writer left it in memory: nothing read from the store.
    assert_eq!(
        value("kiln_query_read_bytes_sum{method=\"SelectMergeStacktraces\"}"),
        0.0
    );
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

fn tiny_pprof(function: &str, value: i64) -> Vec<u8> {
    use kiln_proto::google::v1 as p;
    let profile = p::Profile {
        string_table: ["", "alloc_space", "bytes", "main", function]
            .map(String::from)
            .to_vec(),
        sample_type: vec![p::ValueType { r#type: 1, unit: 2 }],
        function: vec![
            p::Function {
                id: 1,
                name: 3,
                ..Default::default()
            },
            p::Function {
                id: 2,
                name: 4,
                ..Default::default()
            },
        ],
        location: vec![
            p::Location {
                id: 1,
                line: vec![p::Line {
                    function_id: 1,
                    line: 1,
                }],
                ..Default::default()
            },
            p::Location {
                id: 2,
                line: vec![p::Line {
                    function_id: 2,
                    line: 1,
                }],
                ..Default::default()
            },
        ],
        sample: vec![p::Sample {
            location_id: vec![2, 1],
            value: vec![value],
            label: vec![],
        }],
        time_nanos: 1_700_000_000_000_000_000,
        ..Default::default()
    };
    profile.encode_to_vec()
}

async fn flamegraph_total(
    router: &axum::Router,
    tenant: &str,
    profile_type: &str,
    selector: &str,
) -> (i64, Vec<String>) {
    let req = q::SelectMergeStacktracesRequest {
        profile_type_id: profile_type.into(),
        label_selector: selector.into(),
        start: 1_699_999_000_000,
        end: 1_700_001_000_000,
        ..Default::default()
    };
    let (status, body) = send(
        router,
        Request::post("/querier.v1.QuerierService/SelectMergeStacktraces")
            .header("content-type", "application/proto")
            .header("x-scope-orgid", tenant)
            .body(Body::from(req.encode_to_vec()))
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let fg = q::SelectMergeStacktracesResponse::decode(body.as_slice())
        .unwrap()
        .flamegraph
        .unwrap();
    (fg.total, fg.names)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multipart_lines_and_push_json() {
    let dir = tempfile::tempdir().unwrap();
    let router = app(dir.path()).await;

    // Multipart pprof upload, the way pyroscope-go and old @pyroscope/nodejs send it.
    let boundary = "----kiln-test-boundary";
    let mut body = Vec::new();
    body.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"profile\"; filename=\"profile\"\r\nContent-Type: application/octet-stream\r\n\r\n").as_bytes());
    body.extend_from_slice(&tiny_pprof("multipart_fn", 123));
    body.extend_from_slice(format!("\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"sample_type_config\"; filename=\"sample_type_config.json\"\r\n\r\n{{\"alloc_space\":{{\"units\":\"bytes\",\"display-name\":\"alloc_space\"}}}}\r\n--{boundary}--\r\n").as_bytes());
    let req = Request::post("/ingest?name=mp-app%7Bteam%3Dx%7D&from=1700000000")
        .header("x-scope-orgid", "t1")
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(Body::from(body))
        .unwrap();
    let (status, body) = send(&router, req).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let (total, names) = flamegraph_total(
        &router,
        "t1",
        "memory:alloc_space:bytes::",
        r#"{service_name="mp-app",team="x"}"#,
    )
    .await;
    assert_eq!(total, 123);
    assert!(names.contains(&"multipart_fn".to_string()));

    // `lines`: every line is one sample of a stack.
    let req = Request::post("/ingest?name=lines-app.alloc_objects&format=lines&from=1700000000")
        .header("x-scope-orgid", "t1")
        .body(Body::from("a;b\na;b\na;c\n"))
        .unwrap();
    assert_eq!(send(&router, req).await.0, StatusCode::OK);
    let (total, _) = flamegraph_total(
        &router,
        "t1",
        "memory:alloc_objects:count::",
        r#"{service_name="lines-app"}"#,
    )
    .await;
    assert_eq!(total, 3);

    // push.v1 over Connect JSON: bytes are base64, names lowerCamel.
    let raw = kiln_otel::base64::encode(&tiny_pprof("pushed_json_fn", 7));
    let json = format!(
        r#"{{"series":[{{"labels":[{{"name":"__name__","value":"memory"}},{{"name":"service_name","value":"json-app"}}],"samples":[{{"rawProfile":"{raw}","ID":"x"}}]}}]}}"#
    );
    let req = Request::post("/push.v1.PusherService/Push")
        .header("x-scope-orgid", "t1")
        .header("content-type", "application/json")
        .body(Body::from(json))
        .unwrap();
    let (status, body) = send(&router, req).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let (total, names) = flamegraph_total(
        &router,
        "t1",
        "memory:alloc_space:bytes::",
        r#"{service_name="json-app"}"#,
    )
    .await;
    assert_eq!(total, 7);
    assert!(names.contains(&"pushed_json_fn".to_string()));

    // None of it is visible to another tenant.
    let (total, _) = flamegraph_total(&router, "t2", "memory:alloc_space:bytes::", "{}").await;
    assert_eq!(total, 0);
}

/// An object store that fails: every write of the flush is answered 503 with `Retry-After` and
/// nothing of it is stored; when the store is back, ingest works again without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_object_store_is_answered_503_and_ingest_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = StorageConfig::new(dir.path());
    config.writer.flush_interval = std::time::Duration::from_millis(10);
    // Without a spool (with one, writes wait in it: `storage/tests/spool.rs`).
    config.spool_max_bytes = 0;
    // Nothing kept in memory of fresh segments, so the query below needs the store (with it,
    // fresh data is answered through an outage: `storage/tests/warm.rs`).
    config.fresh_cache_bytes = 0;
    let (storage, faulty) = kiln_storage::testing::faulty_storage(config).await;
    let router = router(Arc::new(App::new(
        storage,
        operator_auth(),
        Tenants::defaults(),
    )));
    let ingest = |body: &'static str| {
        Request::post("/ingest?name=shop.cpu&from=1700000000")
            .header("x-scope-orgid", "team-a")
            .body(Body::from(body))
            .unwrap()
    };
    let (status, _) = send(&router, ingest("main;kept 3\n")).await;
    assert_eq!(status, StatusCode::OK);
    faulty.set_down(true);
    let resp = router
        .clone()
        .oneshot(ingest("main;lost 5\n"))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(resp.headers()["retry-after"], "5");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("unavailable"), "{text}");
    // A query while the store is down is unavailable too, not an internal error.
    let (status, _) = send(&router, flamegraph_request("team-a", false)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    faulty.set_down(false);
    let (status, body) = send(&router, ingest("main;after 1\n")).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let (status, body) = send(&router, flamegraph_request("team-a", false)).await;
    assert_eq!(status, StatusCode::OK);
    let fg = q::SelectMergeStacktracesResponse::decode(body.as_slice())
        .unwrap()
        .flamegraph
        .unwrap();
    assert_eq!(
        fg.total, 40_000_000,
        "only the acknowledged writes are stored"
    );
    assert!(!fg.names.iter().any(|n| n == "lost"));
    let (status, body) = send(&router, flamegraph_request("team-b", false)).await;
    assert_eq!(status, StatusCode::OK);
    let fg = q::SelectMergeStacktracesResponse::decode(body.as_slice())
        .unwrap()
        .flamegraph
        .unwrap();
    assert_eq!(fg.total, 0, "another tenant sees nothing");
}

/// A block whose bytes were damaged is quarantined: the query answers from the rest with a
/// `kiln-warning` header, and the admin API lists it to its own tenant only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_block_is_quarantined_with_a_warning_and_listed() {
    let dir = tempfile::tempdir().unwrap();
    let ingest = |body: &'static str| {
        Request::post("/ingest?name=shop.cpu&from=1700000000")
            .header("x-scope-orgid", "team-a")
            .body(Body::from(body))
            .unwrap()
    };
    {
        let mut config = StorageConfig::new(dir.path());
        config.writer.flush_interval = std::time::Duration::from_millis(10);
        let app = Arc::new(App::new(
            Storage::open(config).await.unwrap(),
            operator_auth(),
            Tenants::defaults(),
        ));
        let router = router(Arc::clone(&app));
        for body in ["main;first 3\n", "main;second 1\n"] {
            let (status, _) = send(&router, ingest(body)).await;
            assert_eq!(status, StatusCode::OK);
        }
        app.storage.close().await;
    }
    // Damage the first segment's symbols section, as a bad disk would.
    let mut segments: Vec<std::path::PathBuf> = Vec::new();
    let mut dirs = vec![dir.path().join("objects/segments")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(d).unwrap().flatten() {
            if e.path().is_dir() {
                dirs.push(e.path());
            } else {
                segments.push(e.path());
            }
        }
    }
    segments.sort_by_key(|p| p.file_name().unwrap().to_owned());
    let footer_meta = {
        let store = kiln_storage::store::ObjectStorage::local(&dir.path().join("objects")).unwrap();
        let rel = segments[0]
            .strip_prefix(dir.path().join("objects"))
            .unwrap();
        let size = std::fs::metadata(&segments[0]).unwrap().len();
        kiln_storage::read_footer(&store, rel.to_str().unwrap(), size)
            .await
            .unwrap()
    };
    let mut bytes = std::fs::read(&segments[0]).unwrap();
    let sym = footer_meta[0].symbols;
    bytes[(sym.offset + sym.size / 2) as usize] ^= 0x33;
    std::fs::write(&segments[0], bytes).unwrap();

    let mut config = StorageConfig::new(dir.path());
    config.writer.flush_interval = std::time::Duration::from_millis(10);
    let app = Arc::new(App::new(
        Storage::open(config).await.unwrap(),
        operator_auth(),
        Tenants::defaults(),
    ));
    let router = router(Arc::clone(&app));
    let resp = router
        .clone()
        .oneshot(flamegraph_request("team-a", false))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let warning = resp.headers()["kiln-warning"].to_str().unwrap().to_owned();
    assert!(warning.contains("quarantined"), "{warning}");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let fg = q::SelectMergeStacktracesResponse::decode(body.as_ref())
        .unwrap()
        .flamegraph
        .unwrap();
    assert_eq!(fg.total, 10_000_000, "the undamaged block answers");
    // The next answer is whole again: the block is out of the index.
    let resp = router
        .clone()
        .oneshot(flamegraph_request("team-a", false))
        .await
        .unwrap();
    assert!(resp.headers().get("kiln-warning").is_none());
    let listed = app
        .storage
        .metastore()
        .quarantined(Some("team-a"))
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert!(
        listed[0].reason.contains("checksum"),
        "{}",
        listed[0].reason
    );
    let other = app
        .storage
        .metastore()
        .quarantined(Some("team-b"))
        .await
        .unwrap();
    assert!(other.is_empty(), "another tenant's list is its own");
    // The admin route exists and wants the admin scope (trusted-header tenants lack it).
    let req = Request::get("/api/v1/tenants/team-a/quarantine")
        .header("x-scope-orgid", "team-a")
        .body(Body::empty())
        .unwrap();
    let (status, _) = send(&router, req).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

/// The embedded metastore's disk fills up: writes are answered 503 and nothing of them is
/// stored; once there is room, ingest works again without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_metastore_disk_is_answered_503_and_ingest_recovers() {
    use kiln_storage::metastore::embedded::{DiskFault, Embedded};
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let mut config = StorageConfig::new(dir.path());
    config.writer.flush_interval = std::time::Duration::from_millis(10);
    let full = Arc::new(AtomicBool::new(false));
    let metastore = Embedded::open_with_backend(
        &dir.path().join("metastore.redb"),
        DiskFault::factory(Arc::clone(&full)),
    )
    .unwrap();
    let store = kiln_storage::store::ObjectStorage::local(&dir.path().join("objects")).unwrap();
    let storage = Storage::with_parts(config, store, Arc::new(metastore)).unwrap();
    let router = router(Arc::new(App::new(
        storage,
        operator_auth(),
        Tenants::defaults(),
    )));
    let ingest = |body: &'static str| {
        Request::post("/ingest?name=shop.cpu&from=1700000000")
            .header("x-scope-orgid", "team-a")
            .body(Body::from(body))
            .unwrap()
    };
    full.store(true, Ordering::SeqCst);
    let resp = router
        .clone()
        .oneshot(ingest("main;lost 5\n"))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(resp.headers().contains_key("retry-after"));
    full.store(false, Ordering::SeqCst);
    let (status, body) = send(&router, ingest("main;kept 3\n")).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let (status, body) = send(&router, flamegraph_request("team-a", false)).await;
    assert_eq!(status, StatusCode::OK);
    let fg = q::SelectMergeStacktracesResponse::decode(body.as_slice())
        .unwrap()
        .flamegraph
        .unwrap();
    assert_eq!(
        fg.total, 30_000_000,
        "only the acknowledged write is stored"
    );
}

/// A `/metrics` scrape reads gauges only: stored bytes per tenant appear once the background
/// refresh has run, not because a scrape scanned the metastore.
/// A scrape reads gauges: with 10,000 blocks of 10 tenants in the metastore, scraping
/// `/metrics` makes no metastore call at all (counted by a wrapper); the per-tenant stored bytes
/// come from the background refresh, which does read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_does_not_scan_storage() {
    use kiln_storage::metastore::Metastore;
    use kiln_storage::testing::{CountingMetastore, synthetic_block};
    let dir = tempfile::tempdir().unwrap();
    let mut config = StorageConfig::new(dir.path());
    config.writer.flush_interval = std::time::Duration::from_millis(10);
    let counting = Arc::new(CountingMetastore::new(
        config.open_metastore().await.unwrap(),
    ));
    let storage = Storage::with_parts(
        config.clone(),
        config.open_object_store().unwrap(),
        Arc::clone(&counting) as Arc<dyn Metastore>,
    )
    .unwrap();
    let app = Arc::new(App::new(storage, operator_auth(), Tenants::defaults()));
    let router = router(Arc::clone(&app));
    let ingest = Request::post("/ingest?name=shop.cpu&from=1700000000")
        .header("x-scope-orgid", "team-a")
        .body(Body::from("main;pay 3\n"))
        .unwrap();
    assert_eq!(send(&router, ingest).await.0, StatusCode::OK);
    for t in 0..10 {
        let blocks = (0..1_000)
            .map(|n| {
                synthetic_block(
                    &format!("many-{t}"),
                    n,
                    1_700_000_000_000_000_000 + n as i64,
                )
            })
            .collect();
        counting.add_blocks(blocks).await.unwrap();
    }
    let scrape = || async {
        let (status, body) = send(&router, metrics_request()).await;
        assert_eq!(status, StatusCode::OK);
        String::from_utf8(body).unwrap()
    };
    let stored = |m: &str, tenant: &str| -> Option<f64> {
        m.lines().find_map(|l| {
            l.strip_prefix(&format!("kiln_tenant_stored_bytes{{tenant=\"{tenant}\"}}"))
                .and_then(|v| v.trim().parse().ok())
        })
    };
    let before = counting.calls();
    for _ in 0..3 {
        assert_eq!(stored(&scrape().await, "team-a"), None);
    }
    assert_eq!(counting.calls(), before, "a scrape called the metastore");
    kiln_gateway::server::upkeep::refresh_stored_bytes(&app)
        .await
        .unwrap();
    assert!(counting.calls() > before, "the refresh reads the metastore");
    let m = scrape().await;
    assert!(stored(&m, "team-a").is_some_and(|b| b > 0.0), "{m}");
    assert_eq!(stored(&m, "many-3"), Some(1_000_000.0), "{m}");
    assert!(m.contains("kiln_storage_blocks{level=\"0\"} 10001"), "{m}");
    assert_eq!(stored(&m, "team-b"), None, "no data, no gauge");
}

/// One row of `docs/instrumentation.md`'s metrics table.
struct Spec {
    name: String,
    kind: String,
    labels: Vec<String>,
    driven: bool,
}

fn metrics_spec() -> Vec<Spec> {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/instrumentation.md"),
    )
    .unwrap();
    doc.lines()
        .filter(|l| l.starts_with("| `kiln_"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            Spec {
                name: cells[1].trim_matches('`').to_owned(),
                kind: cells[2].to_owned(),
                labels: cells[3]
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect(),
                driven: cells[4] == "yes",
            }
        })
        .collect()
}

/// The sum of a metric's samples (a histogram's `_count`), `None` when it has none.
fn metric_sum(exposition: &str, spec: &Spec) -> Option<f64> {
    let sample = match spec.kind.as_str() {
        "histogram" => format!("{}_count", spec.name),
        _ => spec.name.clone(),
    };
    let values: Vec<f64> = exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(&sample)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// `docs/instrumentation.md` holds: one request through every API, then every documented
/// metric is exported with its documented labels, each marked driven moved, and no label but
/// `tenant` has more values than a bounded set allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_spec_holds() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = kiln_storage::testing::config(dir.path());
    // No blocks held in memory: the queries read pages from the store, so its bytes move.
    config.fresh_cache_bytes = 0;
    let app = Arc::new(App::new(
        Storage::open(config).await.unwrap(),
        operator_auth(),
        Tenants::defaults(),
    ));
    let router = router(Arc::clone(&app));
    let spec = metrics_spec();
    assert!(spec.len() >= 30, "the table has {} rows", spec.len());
    let scrape = || async {
        let (status, body) = send(&router, metrics_request()).await;
        assert_eq!(status, StatusCode::OK);
        String::from_utf8(body).unwrap()
    };
    let before = scrape().await;

    let post = |path: &str, tenant: Option<&str>, ct: &str, body: Vec<u8>| {
        let mut r = Request::post(path).header("content-type", ct);
        if let Some(t) = tenant {
            r = r.header("x-scope-orgid", t);
        }
        r.body(Body::from(body)).unwrap()
    };
    // Ingest: enough flushes for a compaction job; a refusal of each kind.
    for i in 0..5 {
        let req = post(
            &format!("/ingest?name=spec.cpu&from={}", 1_700_000_000 + i),
            Some("spec"),
            "text/plain",
            format!("main;work_{i} 3\n").into_bytes(),
        );
        assert_eq!(send(&router, req).await.0, StatusCode::OK);
        app.storage.flush().await;
    }
    let refused = post(
        "/ingest?name=x&format=pdf",
        Some("spec"),
        "text/plain",
        b"x".to_vec(),
    );
    assert_eq!(send(&router, refused).await.0, StatusCode::BAD_REQUEST);
    let anonymous = post("/ingest?name=x", None, "text/plain", b"main 1\n".to_vec());
    assert_eq!(send(&router, anonymous).await.0, StatusCode::UNAUTHORIZED);
    // The app's own writes: a setting and an ad-hoc upload.
    let setting = post(
        "/settings.v1.SettingsService/Set",
        Some("spec"),
        "application/json",
        br#"{"setting":{"name":"pluginSettings","value":"{}"}}"#.to_vec(),
    );
    assert_eq!(send(&router, setting).await.0, StatusCode::OK);
    let upload = serde_json::json!({
        "name": "spec.folded",
        "profile": kiln_otel::base64::encode(b"main;work 3\n"),
    });
    let upload = post(
        "/adhocprofiles.v1.AdHocProfileService/Upload",
        Some("spec"),
        "application/json",
        serde_json::to_vec(&upload).unwrap(),
    );
    assert_eq!(send(&router, upload).await.0, StatusCode::OK);
    let push = kiln_proto::push::v1::PushRequest {
        series: vec![kiln_proto::push::v1::RawProfileSeries {
            labels: vec![kiln_proto::types::v1::LabelPair {
                name: "service_name".into(),
                value: "spec".into(),
            }],
            samples: vec![kiln_proto::push::v1::RawSample {
                raw_profile: tiny_pprof("pushed", 5).into(),
                id: String::new(),
            }],
            ..Default::default()
        }],
    };
    let req = post(
        "/push.v1.PusherService/Push",
        Some("spec"),
        "application/proto",
        push.encode_to_vec(),
    );
    assert_eq!(send(&router, req).await.0, StatusCode::OK);
    let req = post(
        "/v1development/profiles",
        Some("spec"),
        "application/json",
        br#"{"resourceProfiles":[]}"#.to_vec(),
    );
    assert_eq!(send(&router, req).await.0, StatusCode::OK);
    // The app's other services: settings, the capability probe, and one Kiln does not offer.
    for (path, body, status) in [
        ("/settings.v1.SettingsService/Get", "{}", StatusCode::OK),
        (
            "/settings.v1.SettingsService/Set",
            r#"{"setting":{"name":"pluginSettings","value":"{}"}}"#,
            StatusCode::OK,
        ),
        (
            "/settings.v1.SettingsService/Delete",
            r#"{"name":"pluginSettings"}"#,
            StatusCode::OK,
        ),
        (
            "/capabilities.v1.FeatureFlagsService/GetFeatureFlags",
            "{}",
            StatusCode::OK,
        ),
        (
            "/adhocprofiles.v1.AdHocProfileService/List",
            "{}",
            StatusCode::OK,
        ),
        (
            "/vcs.v1.VCSService/GetFile",
            "{}",
            StatusCode::NOT_IMPLEMENTED,
        ),
    ] {
        let req = post(
            path,
            Some("spec"),
            "application/json",
            body.as_bytes().to_vec(),
        );
        assert_eq!(send(&router, req).await.0, status, "{path}");
    }
    // Every querier method, as Connect JSON.
    let range = r#""start":"1699999000000","end":"1700001000000""#;
    let cpu = r#""profileTypeID":"process_cpu:cpu:nanoseconds:cpu:nanoseconds""#;
    for (method, body) in [
        ("ProfileTypes", format!("{{{range}}}")),
        ("LabelNames", format!("{{{range}}}")),
        (
            "LabelValues",
            format!(r#"{{"name":"service_name",{range}}}"#),
        ),
        ("Series", format!(r#"{{"matchers":["{{}}"],{range}}}"#)),
        (
            "SelectMergeStacktraces",
            format!(r#"{{{cpu},"labelSelector":"{{}}",{range}}}"#),
        ),
        (
            "SelectMergeSpanProfile",
            format!(
                r#"{{{cpu},"labelSelector":"{{}}","spanSelector":["0000000000000001"],{range}}}"#
            ),
        ),
        (
            "SelectMergeProfile",
            format!(r#"{{{cpu},"labelSelector":"{{}}",{range}}}"#),
        ),
        (
            "SelectSeries",
            format!(r#"{{{cpu},"labelSelector":"{{}}","step":60,{range}}}"#),
        ),
        ("GetProfileStats", "{}".into()),
        (
            "Diff",
            format!(
                r#"{{"left":{{{cpu},"labelSelector":"{{}}",{range}}},"right":{{{cpu},"labelSelector":"{{}}",{range}}}}}"#
            ),
        ),
        (
            "AnalyzeQuery",
            format!(r#"{{"query":"process_cpu:cpu:nanoseconds:cpu:nanoseconds{{}}",{range}}}"#),
        ),
        ("NoSuchMethod", "{}".into()),
    ] {
        let req = post(
            &format!("/querier.v1.QuerierService/{method}"),
            Some("spec"),
            "application/json",
            body.into_bytes(),
        );
        let (status, body) = send(&router, req).await;
        if method != "NoSuchMethod" {
            assert_eq!(
                status,
                StatusCode::OK,
                "{method}: {}",
                String::from_utf8_lossy(&body)
            );
        }
    }
    // The legacy query API.
    let cpu_query = "process_cpu%3Acpu%3Ananoseconds%3Acpu%3Ananoseconds%7B%7D";
    for path in [
        format!("/pyroscope/render?query={cpu_query}&from=1699999000&until=1700001000"),
        format!("/pyroscope/render?query={cpu_query}&from=1699999000&until=1700001000&format=dot"),
        format!(
            "/pyroscope/render-diff?leftQuery={cpu_query}&leftFrom=1699999000000&leftUntil=1700001000000\
             &rightQuery={cpu_query}&rightFrom=1699999000000&rightUntil=1700001000000"
        ),
        format!("/pyroscope/labels?query={cpu_query}&from=1699999000&until=1700001000"),
        format!("/pyroscope/label-values?label=service_name&query={cpu_query}"),
    ] {
        let req = Request::get(&path)
            .header("x-scope-orgid", "spec")
            .body(Body::empty())
            .unwrap();
        let (status, body) = send(&router, req).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "{path}: {}",
            String::from_utf8_lossy(&body)
        );
    }
    for path in [
        "/api/v1/tenants",
        "/api/v1/tenants/spec/usage",
        "/api/v1/tenants/spec/blocks",
        "/api/v1/quarantine",
        "/ready",
        "/no/such/path",
    ] {
        let req = Request::get(path)
            .header("x-scope-orgid", "spec")
            .body(Body::empty())
            .unwrap();
        send(&router, req).await;
    }
    app.storage
        .compactor()
        .compact_all(u64::MAX / 2)
        .await
        .unwrap();
    kiln_gateway::server::upkeep::refresh_stored_bytes(&app)
        .await
        .unwrap();

    let after = scrape().await;
    for s in &spec {
        assert!(
            after.contains(&format!("# TYPE {} ", s.name))
                || after.contains(&format!("# TYPE {} ", s.name.trim_end_matches("_total"))),
            "{} is not exported",
            s.name
        );
        if s.driven {
            let (b, a) = (metric_sum(&before, s).unwrap_or(0.0), metric_sum(&after, s));
            assert!(
                a.is_some_and(|a| a > b),
                "{} did not move ({b} → {a:?})",
                s.name
            );
        }
        // Each sample's label names are the documented ones.
        for line in after
            .lines()
            .filter(|l| l.starts_with(&format!("{}{{", s.name)))
        {
            let labels = &line[s.name.len() + 1..line.rfind('}').unwrap()];
            let names: Vec<&str> = labels
                .split(',')
                .filter_map(|kv| kv.split_once('=').map(|(k, _)| k))
                .collect();
            assert_eq!(names, s.labels, "{line}");
        }
    }
    // The dashboard (docs/grafana/kiln-dashboard.json) queries only metrics exported here.
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../docs/grafana/kiln-dashboard.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        if panel["type"] == "row" {
            continue;
        }
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "panel {} has no query", panel["title"]);
        exprs.extend(
            targets
                .iter()
                .map(|t| t["expr"].as_str().unwrap().to_owned()),
        );
    }
    for var in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(q) = var["definition"].as_str() {
            exprs.push(q.to_owned());
        }
    }
    let mut named = std::collections::BTreeSet::new();
    for expr in &exprs {
        for (at, _) in expr.match_indices("kiln_") {
            let name: String = expr[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            named.insert(name);
        }
    }
    assert!(
        named.len() >= 25,
        "the dashboard names {} metrics",
        named.len()
    );
    for name in &named {
        assert!(
            after.lines().any(|l| l
                .strip_prefix(name.as_str())
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))),
            "the dashboard queries {name}, which Kiln does not export"
        );
    }

    // Bounded label values: methods from the fixed table, a few transports and classes.
    let mut values: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    for line in after
        .lines()
        .filter(|l| l.starts_with("kiln_") && l.contains('{'))
    {
        let labels = &line[line.find('{').unwrap() + 1..line.rfind('}').unwrap()];
        for kv in labels.split(',') {
            if let Some((k, v)) = kv.split_once('=') {
                values
                    .entry(k.into())
                    .or_default()
                    .insert(v.trim_matches('"').into());
            }
        }
    }
    let methods = kiln_gateway::api::api_methods();
    for m in &values["method"] {
        assert!(
            methods.contains(m) || !m.contains('/') && !m.contains('.'),
            "unbounded method {m:?}"
        );
    }
    assert!(values["method"].contains("querier.v1.QuerierService/unknown"));
    assert!(values["method"].contains("settings.v1.SettingsService/Set"));
    assert!(values["method"].contains("adhocprofiles.v1.AdHocProfileService/List"));
    assert!(values["method"].contains("vcs.v1.VCSService"));
    for r in &kiln_gateway::api::legacy::ROUTES {
        assert!(
            values["method"].contains(r.method),
            "{} was not counted",
            r.method
        );
    }
    assert!(values["method"].contains("other"));
    assert!(
        !values["method"]
            .iter()
            .any(|m| m.contains("NoSuchMethod") || m.contains("no/such"))
    );
    for t in &values["transport"] {
        assert!(["http", "connect", "grpc"].contains(&t.as_str()), "{t}");
    }
    for s in &values["status"] {
        assert!(["2xx", "3xx", "4xx", "5xx"].contains(&s.as_str()), "{s}");
    }
    for (label, vals) in &values {
        if label != "tenant" && label != "le" && label != "method" {
            assert!(vals.len() <= 16, "label {label} has {} values", vals.len());
        }
    }
}

/// A Connect JSON call to a querier method with the body as the Drilldown app writes it; it
/// must succeed.
async fn connect_json(
    router: &axum::Router,
    tenant: &str,
    method: &str,
    body: serde_json::Value,
) -> serde_json::Value {
    let path = format!("/querier.v1.QuerierService/{method}");
    let (status, out) = connect_call(router, tenant, &path, body).await;
    assert_eq!(status, StatusCode::OK, "{path}: {out}");
    out
}

fn json_i64(v: &serde_json::Value) -> i64 {
    v.as_str()
        .map(|s| s.parse().unwrap())
        .or_else(|| v.as_i64())
        .unwrap_or(0)
}

/// `stack_trace_selector.frame_filter` as newer datasource and Drilldown builds send it (JSON
/// and binary protobuf, field 3): whole stacks kept by their functions' names, with a call site
/// too, in flame graphs, pprof and series; an invalid regex is a 400 before anything is read;
/// another tenant sees nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frame_filters_as_newer_clients_send_them() {
    let dir = tempfile::tempdir().unwrap();
    let router = app(dir.path()).await;
    let ingest = Request::post("/ingest?name=shop.cpu&from=1700000000")
        .header("x-scope-orgid", "team-a")
        .body(Body::from(
            "main;checkout;pay 3\nmain;checkout;render 2\nmain;browse 1\nmain 4\ngc 5\n",
        ))
        .unwrap();
    assert_eq!(send(&router, ingest).await.0, StatusCode::OK);
    let cpu = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
    let ms = 10_000_000; // 100 Hz
    let request = |filter: serde_json::Value, call_site: &[&str]| {
        let sites: Vec<serde_json::Value> = call_site
            .iter()
            .map(|n| serde_json::json!({ "name": n }))
            .collect();
        serde_json::json!({
            "profile_typeID": cpu,
            "labelSelector": "{}",
            "start": "1699999000000",
            "end": 1_700_001_000_000i64,
            "stackTraceSelector": { "callSite": sites, "frameFilter": filter },
        })
    };
    let flame_total = |tenant: &'static str,
                       filter: serde_json::Value,
                       call_site: &'static [&'static str]| {
        let router = router.clone();
        let body = request(filter, call_site);
        async move {
            json_i64(
                &connect_json(&router, tenant, "SelectMergeStacktraces", body).await["flamegraph"]
                    ["total"],
            )
        }
    };
    use serde_json::json;
    for (filter, want) in [
        (json!({ "includeFunctionNames": ["checkout"] }), 5),
        (json!({ "excludeFunctionNames": ["render"] }), 13),
        (json!({ "includeFunctionNameRegexes": ["^p"] }), 3),
        (
            json!({ "includeFunctionNames": ["main"], "excludeFunctionNameRegexes": ["brow"] }),
            9,
        ),
        (json!({ "includeFunctionNames": ["checkout", "pay"] }), 3),
        (json!({ "include_function_names": ["missing"] }), 0),
        (json!({}), 15),
    ] {
        assert_eq!(
            flame_total("team-a", filter.clone(), &[]).await,
            want * ms,
            "{filter}"
        );
    }
    // With a call site: both apply.
    assert_eq!(
        flame_total(
            "team-a",
            json!({ "excludeFunctionNames": ["render"] }),
            &["main", "checkout"]
        )
        .await,
        3 * ms
    );
    assert_eq!(
        flame_total(
            "team-b",
            json!({ "includeFunctionNames": ["checkout"] }),
            &[]
        )
        .await,
        0
    );

    // Series narrow too: the stacks through `checkout`, summed per step (team-b: none).
    for (tenant, want) in [("team-a", 5 * ms), ("team-b", 0)] {
        let mut body = request(json!({ "includeFunctionNames": ["checkout"] }), &[]);
        body["step"] = json!(3600.0);
        let out = connect_json(&router, tenant, "SelectSeries", body).await;
        let sum: f64 = out["series"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|s| s["points"].as_array().cloned().unwrap_or_default())
            .map(|p| p["value"].as_f64().unwrap_or(0.0))
            .sum();
        assert_eq!(sum as i64, want, "{tenant}: {out}");
    }

    // pprof (the function details panel, and pprof export), as the Go datasource sends it:
    // binary protobuf, the filter at field 3 of the selector.
    let req = q::SelectMergeProfileRequest {
        profile_type_id: cpu.into(),
        label_selector: "{}".into(),
        start: 1_699_999_000_000,
        end: 1_700_001_000_000,
        stack_trace_selector: Some(kiln_proto::types::v1::StackTraceSelector {
            frame_filter: Some(kiln_proto::types::v1::StackFrameFilter {
                include_function_names: vec!["checkout".into()],
                exclude_function_name_regexes: vec!["^ren".into()],
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let selector = req.stack_trace_selector.as_ref().unwrap().encode_to_vec();
    assert_eq!(
        selector[0], 0x1a,
        "the filter is field 3 (length-delimited) of the selector"
    );
    let body = req.encode_to_vec();
    let (status, out) = send(
        &router,
        Request::post("/querier.v1.QuerierService/SelectMergeProfile")
            .header("content-type", "application/proto")
            .header("x-scope-orgid", "team-a")
            .body(Body::from(body))
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let profile = kiln_proto::google::v1::Profile::decode(out.as_slice()).unwrap();
    let total: i64 = profile.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(total, 3 * ms, "pay's stack only");

    // An invalid regex: refused, naming it, on every method that takes a selector.
    for method in [
        "SelectMergeStacktraces",
        "SelectMergeProfile",
        "SelectSeries",
    ] {
        let mut body = request(json!({ "includeFunctionNameRegexes": ["("] }), &[]);
        body["step"] = json!(15.0);
        let (status, out) = connect_call(
            &router,
            "team-a",
            &format!("/querier.v1.QuerierService/{method}"),
            body,
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{method}: {out}");
        assert!(
            out["message"]
                .as_str()
                .unwrap()
                .contains("invalid include function name regex"),
            "{method}: {out}"
        );
    }
}

/// The app's JSON (proto and lowerCamel names mixed, int64 as strings and numbers, enum names,
/// unknown fields) and its call-site selectors: a progressive flame graph's refinements add up
/// to the whole, and the function-details panel's pprof is the call site's stacks only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_site_selectors_as_the_app_sends_them() {
    let dir = tempfile::tempdir().unwrap();
    let router = app(dir.path()).await;
    let ingest = Request::post("/ingest?name=shop.cpu&from=1700000000")
        .header("x-scope-orgid", "team-a")
        .body(Body::from(
            "main;checkout;pay 3\nmain;checkout;render 2\nmain;browse 1\nmain 4\ngc 5\n",
        ))
        .unwrap();
    let (status, body) = send(&router, ingest).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let cpu = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
    let flame = |call_site: Vec<&str>, max_nodes: i64| {
        let sites: Vec<serde_json::Value> = call_site
            .iter()
            .map(|n| serde_json::json!({ "name": n }))
            .collect();
        serde_json::json!({
            "profile_typeID": cpu,
            "labelSelector": "{service_name=\"shop\"}",
            "start": "1699999000000",
            "end": 1_700_001_000_000i64,
            "maxNodes": max_nodes.to_string(),
            "format": "PROFILE_FORMAT_FLAMEGRAPH",
            "stackTraceSelector": { "call_site": sites, "frameFilter": { "x": 1 } },
            "someFutureField": [1, 2, 3],
        })
    };
    let ms = 10_000_000; // 100 Hz
    let whole = connect_json(
        &router,
        "team-a",
        "SelectMergeStacktraces",
        flame(vec![], 1 << 20),
    )
    .await;
    assert_eq!(json_i64(&whole["flamegraph"]["total"]), 15 * ms);
    let checkout = connect_json(
        &router,
        "team-a",
        "SelectMergeStacktraces",
        flame(vec!["main", "checkout"], 1 << 20),
    )
    .await;
    assert_eq!(json_i64(&checkout["flamegraph"]["total"]), 5 * ms);
    let names: Vec<&str> = checkout["flamegraph"]["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert!(names.contains(&"pay") && names.contains(&"render"));
    assert!(
        !names.contains(&"browse") && !names.contains(&"gc"),
        "{names:?}"
    );
    // A truncated graph, then each root child refined on its own: they add up to the whole.
    let truncated = connect_json(
        &router,
        "team-a",
        "SelectMergeStacktraces",
        flame(vec![], 2),
    )
    .await;
    assert_eq!(json_i64(&truncated["flamegraph"]["total"]), 15 * ms);
    let refined: i64 = {
        let mut sum = 0;
        for root in ["main", "gc"] {
            let part = connect_json(
                &router,
                "team-a",
                "SelectMergeStacktraces",
                flame(vec![root], 2),
            )
            .await;
            sum += json_i64(&part["flamegraph"]["total"]);
        }
        sum
    };
    assert_eq!(refined, 15 * ms);

    // The function-details panel: SelectMergeProfile in JSON with a call site and maxNodes.
    let pprof = connect_json(
        &router,
        "team-a",
        "SelectMergeProfile",
        serde_json::json!({
            "profile_typeID": cpu,
            "label_selector": "{service_name=\"shop\"}",
            "start": 1_699_999_000_000i64,
            "end": "1700001000000",
            "stackTraceSelector": { "call_site": [{ "name": "main" }, { "name": "checkout" }] },
            "maxNodes": 500,
        }),
    )
    .await;
    let total: i64 = pprof["sample"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| json_i64(&s["value"][0]))
        .sum();
    assert_eq!(total, 5 * ms);

    // Another tenant sees nothing through the same calls.
    let other = connect_json(
        &router,
        "team-b",
        "SelectMergeStacktraces",
        flame(vec!["main"], 100),
    )
    .await;
    assert_eq!(json_i64(&other["flamegraph"]["total"]), 0);
}

/// The app lists services and profile types from `Series` with `__profile_type__` asked for and
/// used as a matcher, and filters label names and values by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profile_type_is_a_label_for_series_names_and_values() {
    let dir = tempfile::tempdir().unwrap();
    let router = app(dir.path()).await;
    for (name, body) in [
        ("shop.cpu", "main;pay 3\n"),
        ("shop.alloc_objects", "main;buf 2\n"),
    ] {
        let ingest = Request::post(format!(
            "/ingest?name={name}%7Benv%3Dprod%7D&from=1700000000"
        ))
        .header("x-scope-orgid", "team-a")
        .body(Body::from(body))
        .unwrap();
        let (status, body) = send(&router, ingest).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    }
    let cpu = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
    let series = connect_json(
        &router,
        "team-a",
        "Series",
        serde_json::json!({
            "start": 1_699_999_000_000i64, "end": "1700001000000",
            "labelNames": ["service_name", "__profile_type__"],
            "matchers": ["{service_name=\"shop\"}"],
        }),
    )
    .await;
    let sets = series["labelsSet"].as_array().unwrap();
    let types: Vec<&str> = sets
        .iter()
        .flat_map(|s| s["labels"].as_array().unwrap())
        .filter(|l| l["name"] == "__profile_type__")
        .map(|l| l["value"].as_str().unwrap())
        .collect();
    assert!(types.contains(&cpu), "{series}");
    assert_eq!(types.len(), 2, "{series}");
    let only_cpu = connect_json(
        &router,
        "team-a",
        "Series",
        serde_json::json!({
            "start": 1_699_999_000_000i64, "end": 1_700_001_000_000i64,
            "labelNames": ["service_name", "__profile_type__"],
            "matchers": [format!("{{__profile_type__=\"{cpu}\", service_name=\"shop\"}}")],
        }),
    )
    .await;
    assert_eq!(
        only_cpu["labelsSet"].as_array().unwrap().len(),
        1,
        "{only_cpu}"
    );
    let names = connect_json(
        &router,
        "team-a",
        "LabelNames",
        serde_json::json!({
            "matchers": [format!("{{__profile_type__=\"{cpu}\"}}")],
            "start": 1_699_999_000_000i64, "end": 1_700_001_000_000i64,
        }),
    )
    .await;
    assert!(
        names["names"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n == "env"),
        "{names}"
    );
    let values = connect_json(
        &router,
        "team-a",
        "LabelValues",
        serde_json::json!({
            "name": "env",
            "matchers": [format!("{{__profile_type__=\"{cpu}\"}}")],
            "start": 1_699_999_000_000i64, "end": 1_700_001_000_000i64,
        }),
    )
    .await;
    assert_eq!(values["names"], serde_json::json!(["prod"]), "{values}");
    // Another tenant: nothing.
    let other = connect_json(
        &router,
        "team-b",
        "Series",
        serde_json::json!({ "labelNames": ["__profile_type__"], "matchers": ["{}"] }),
    )
    .await;
    assert!(
        other["labelsSet"].as_array().is_none_or(|s| s.is_empty()),
        "{other}"
    );

    // The query-size tooltip: what a query would read, from the index.
    let analyze = |tenant: &'static str, query: String| {
        let router = router.clone();
        async move {
            connect_json(
                &router,
                tenant,
                "AnalyzeQuery",
                serde_json::json!({
                    "start": "1699999000000", "end": 1_700_001_000_000i64, "query": query,
                }),
            )
            .await
        }
    };
    let a = analyze("team-a", format!("{cpu}{{service_name=\"shop\"}}")).await;
    let scope = &a["queryScopes"][0];
    assert_eq!(json_i64(&scope["seriesCount"]), 1, "{a}");
    assert_eq!(json_i64(&scope["sampleCount"]), 1, "{a}");
    assert!(json_i64(&scope["blockCount"]) >= 1, "{a}");
    assert!(
        json_i64(&a["queryImpact"]["totalBytesInTimeRange"]) > 0,
        "{a}"
    );
    assert_eq!(json_i64(&a["queryImpact"]["totalQueriedSeries"]), 1, "{a}");
    let none = analyze("team-a", format!("{cpu}{{service_name=\"nope\"}}")).await;
    assert_eq!(
        json_i64(&none["queryImpact"]["totalQueriedSeries"]),
        0,
        "{none}"
    );
    let other = analyze("team-b", format!("{cpu}{{}}")).await;
    assert_eq!(
        json_i64(&other["queryImpact"]["totalBytesInTimeRange"]),
        0,
        "{other}"
    );
}

/// A Connect JSON call to any service; the status and the JSON body.
async fn connect_call(
    router: &axum::Router,
    tenant: &str,
    path: &str,
    body: serde_json::Value,
) -> (StatusCode, serde_json::Value) {
    let (status, out) = send(
        router,
        Request::post(path)
            .header("content-type", "application/json")
            .header("x-scope-orgid", tenant)
            .body(Body::from(body.to_string()))
            .unwrap(),
    )
    .await;
    (status, serde_json::from_slice(&out).unwrap_or_default())
}

/// The app's plugin settings persist per tenant (across a restart), the capability probe
/// offers the function projections, and the services Kiln does not offer answer Connect `unimplemented`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_persist_per_tenant_and_absent_services_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let router = app(dir.path()).await;
    let get = "/settings.v1.SettingsService/Get";
    let (status, empty) = connect_call(&router, "team-a", get, serde_json::json!({})).await;
    assert_eq!(status, StatusCode::OK, "{empty}");
    assert!(
        empty["settings"].as_array().is_none_or(|s| s.is_empty()),
        "{empty}"
    );
    let value = r#"{"maxNodes":16384,"enableFlameGraphDotComExport":true}"#;
    let (status, set) = connect_call(
        &router,
        "team-a",
        "/settings.v1.SettingsService/Set",
        serde_json::json!({ "setting": { "name": "pluginSettings", "value": value } }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{set}");
    assert!(
        set["setting"]["modifiedAt"]
            .as_str()
            .is_some_and(|t| t != "0"),
        "{set}"
    );

    // Another process on the same object store (its own metastore) reads it back; another
    // tenant does not.
    let mut config = StorageConfig::new(dir.path());
    config.metastore = Some(
        dir.path()
            .join("other-metastore.redb")
            .to_string_lossy()
            .into_owned(),
    );
    let router = kiln_gateway::server::router(Arc::new(App::new(
        Storage::open(config).await.unwrap(),
        operator_auth(),
        Tenants::defaults(),
    )));
    let (_, got) = connect_call(&router, "team-a", get, serde_json::json!({})).await;
    assert_eq!(got["settings"][0]["name"], "pluginSettings", "{got}");
    assert_eq!(got["settings"][0]["value"], value, "{got}");
    let (_, other) = connect_call(&router, "team-b", get, serde_json::json!({})).await;
    assert!(
        other["settings"].as_array().is_none_or(|s| s.is_empty()),
        "{other}"
    );

    let (status, _) = connect_call(
        &router,
        "team-a",
        "/settings.v1.SettingsService/Delete",
        serde_json::json!({ "name": "pluginSettings" }),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (_, gone) = connect_call(&router, "team-a", get, serde_json::json!({})).await;
    assert!(
        gone["settings"].as_array().is_none_or(|s| s.is_empty()),
        "{gone}"
    );

    let (status, flags) = connect_call(
        &router,
        "team-a",
        "/capabilities.v1.FeatureFlagsService/GetFeatureFlags",
        serde_json::json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let projections = flags["featureFlags"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "functionProjections")
        .expect("the flag the app looks for");
    assert_eq!(projections["enabled"], true, "{flags}");

    let path = "/vcs.v1.VCSService/GetFile";
    let (status, body) = connect_call(&router, "team-a", path, serde_json::json!({})).await;
    assert_eq!(status, StatusCode::NOT_IMPLEMENTED, "{path}");
    assert_eq!(body["code"], "unimplemented", "{path}");
    assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));
}

/// A tenant's settings are bounded (64, 1 MiB in all) and its own: one tenant at its cap
/// leaves another free; settings writes and ad-hoc uploads (both open to read-scope
/// credentials, as the app needs them) are counted in the tenant's usage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_and_uploads_are_bounded_and_counted_per_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let router = app(dir.path()).await;
    let set = |tenant: &'static str, name: String| {
        let router = router.clone();
        async move {
            connect_call(
                &router,
                tenant,
                "/settings.v1.SettingsService/Set",
                serde_json::json!({ "setting": { "name": name, "value": "{}" } }),
            )
            .await
        }
    };
    for i in 0..64 {
        let (status, body) = set("team-a", format!("s{i}")).await;
        assert_eq!(status, StatusCode::OK, "{i}: {body}");
    }
    let (status, body) = set("team-a", "one-too-many".into()).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("delete one"),
        "{body}"
    );
    // Replacing one it has still works; another tenant is not held by team-a's cap.
    assert_eq!(set("team-a", "s3".into()).await.0, StatusCode::OK);
    assert_eq!(set("team-b", "s0".into()).await.0, StatusCode::OK);
    // Values of 60 KiB: the 1 MiB total refuses the 18th.
    let big = "x".repeat(60 << 10);
    for i in 0..18 {
        let (status, body) = connect_call(
            &router,
            "team-c",
            "/settings.v1.SettingsService/Set",
            serde_json::json!({ "setting": { "name": format!("big{i}"), "value": big } }),
        )
        .await;
        let want = if i < 17 {
            StatusCode::OK
        } else {
            StatusCode::PAYLOAD_TOO_LARGE
        };
        assert_eq!(status, want, "{i}: {}", body["message"]);
    }

    let profile = kiln_otel::base64::encode(b"main;work 3\nmain;idle 1\n");
    let (status, body) = connect_call(
        &router,
        "team-a",
        "/adhocprofiles.v1.AdHocProfileService/Upload",
        serde_json::json!({ "name": "a.folded", "profile": profile }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let (status, metrics) = send(&router, metrics_request()).await;
    assert_eq!(status, StatusCode::OK);
    let metrics = String::from_utf8_lossy(&metrics);
    for line in [
        r#"kiln_tenant_settings_writes_total{tenant="team-a"} 65"#,
        r#"kiln_tenant_settings_writes_total{tenant="team-b"} 1"#,
        r#"kiln_tenant_adhoc_uploads_total{tenant="team-a"} 1"#,
        r#"kiln_tenant_adhoc_upload_bytes_total{tenant="team-a"} 24"#,
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    assert!(!metrics.contains(r#"kiln_tenant_adhoc_uploads_total{tenant="team-b"}"#));
}

/// A CPU pprof of one stack per span (`span_id` labels), at `time_secs`.
fn spans_pprof(time_secs: i64, spans: &[(&str, i64)]) -> Vec<u8> {
    use kiln_proto::google::v1 as p;
    let mut strings: Vec<String> = ["", "cpu", "nanoseconds", "main", "work", "span_id"]
        .map(String::from)
        .to_vec();
    let sample = spans
        .iter()
        .map(|(span, value)| {
            strings.push((*span).to_owned());
            p::Sample {
                location_id: vec![2, 1],
                value: vec![*value],
                label: vec![p::Label {
                    key: 5,
                    str: strings.len() as i64 - 1,
                    ..Default::default()
                }],
            }
        })
        .collect();
    let line = |id: u64| p::Location {
        id,
        line: vec![p::Line {
            function_id: id,
            line: 1,
        }],
        ..Default::default()
    };
    p::Profile {
        string_table: strings,
        sample_type: vec![p::ValueType { r#type: 1, unit: 2 }],
        period_type: Some(p::ValueType { r#type: 1, unit: 2 }),
        period: 10_000_000,
        function: vec![
            p::Function {
                id: 1,
                name: 3,
                ..Default::default()
            },
            p::Function {
                id: 2,
                name: 4,
                ..Default::default()
            },
        ],
        location: vec![line(1), line(2)],
        sample,
        time_nanos: time_secs * 1_000_000_000,
        ..Default::default()
    }
    .encode_to_vec()
}

/// SelectHeatmap as the app sends it: profiles' totals (individual) and spans' (with span
/// exemplars) in slots of value buckets; another tenant gets none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heatmaps_count_profiles_and_spans() {
    let dir = tempfile::tempdir().unwrap();
    let router = app(dir.path()).await;
    // Three profiles a minute apart; the first has two spans, the others one each.
    let profiles = [
        (
            1_700_000_000,
            vec![("00000000000000a1", 10), ("00000000000000a2", 30)],
        ),
        (1_700_000_060, vec![("00000000000000b1", 20)]),
        (1_700_000_120, vec![("00000000000000c1", 90)]),
    ];
    for (t, spans) in &profiles {
        let req = Request::post(format!("/ingest?name=shop&from={t}&format=pprof"))
            .header("x-scope-orgid", "team-a")
            .body(Body::from(spans_pprof(*t, spans)))
            .unwrap();
        let (status, body) = send(&router, req).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    }
    let heatmap = |tenant: &'static str, query_type: &'static str| {
        let router = router.clone();
        async move {
            connect_json(
                &router,
                tenant,
                "SelectHeatmap",
                serde_json::json!({
                    "profileTypeID": "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
                    "labelSelector": "{service_name=\"shop\"}",
                    "start": 1_699_999_980_000i64, "end": "1700000180000",
                    "step": 60, "groupBy": [],
                    "queryType": query_type, "exemplarType": "EXEMPLAR_TYPE_SPAN",
                }),
            )
            .await
        }
    };
    let counts = |h: &serde_json::Value| -> (usize, i64) {
        let slots = h["series"][0]["slots"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let n = slots
            .iter()
            .flat_map(|s| s["counts"].as_array().unwrap().clone())
            .map(|c| c.as_i64().unwrap())
            .sum();
        (slots.len(), n)
    };
    let individual = heatmap("team-a", "HEATMAP_QUERY_TYPE_INDIVIDUAL").await;
    assert_eq!(
        counts(&individual),
        (3, 3),
        "three profiles in three slots: {individual}"
    );
    let slot = &individual["series"][0]["slots"][0];
    assert_eq!(slot["yMin"].as_array().unwrap().len(), 20);
    assert_eq!(slot["counts"].as_array().unwrap().len(), 20);
    let spans = heatmap("team-a", "HEATMAP_QUERY_TYPE_SPAN").await;
    assert_eq!(counts(&spans), (3, 4), "four spans: {spans}");
    let exemplar_spans: Vec<&str> = spans["series"][0]["slots"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["exemplars"].as_array().unwrap())
        .map(|e| e["spanId"].as_str().unwrap())
        .collect();
    assert!(exemplar_spans.contains(&"00000000000000c1"), "{spans}");
    assert_eq!(exemplar_spans.len(), 4, "one per occupied bucket: {spans}");
    let other = heatmap("team-b", "HEATMAP_QUERY_TYPE_SPAN").await;
    assert!(
        other["series"].as_array().is_none_or(|s| s.is_empty()),
        "{other}"
    );
}

/// The legacy query API belongs to the query role: a process without it answers 404 naming its
/// roles, as it answers `querier.v1`; with it, a tenant sees its own data only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_api_follows_the_query_role_and_tenants() {
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::open(kiln_storage::testing::config(dir.path()))
        .await
        .unwrap();
    let mut ingest_app = App::new(storage, operator_auth(), Tenants::defaults());
    ingest_app.roles = kiln_gateway::app::Roles::parse("ingest,compact").unwrap();
    let ingest_only = router(Arc::new(ingest_app));
    for path in kiln_gateway::api::legacy::ROUTES.map(|r| r.path) {
        let req = Request::get(path)
            .header("x-scope-orgid", "a")
            .body(Body::empty())
            .unwrap();
        let (status, body) = send(&ingest_only, req).await;
        let body = String::from_utf8_lossy(&body);
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
        assert!(
            body.contains("not served here") && body.contains("ingest,compact"),
            "{body}"
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let router = app(dir.path()).await;
    let ingest = Request::post("/ingest?name=shop.cpu&from=1700000000")
        .header("x-scope-orgid", "a")
        .body(Body::from("main;legacy_fn 7\n"))
        .unwrap();
    assert_eq!(send(&router, ingest).await.0, StatusCode::OK);
    let get = |tenant: Option<&str>, path: &str| {
        let mut r = Request::get(path);
        if let Some(t) = tenant {
            r = r.header("x-scope-orgid", t);
        }
        r.body(Body::empty()).unwrap()
    };
    let render = "/pyroscope/render?query=shop.cpu&from=1699999000&until=1700001000";
    let (status, body) = send(&router, get(Some("a"), render)).await;
    assert_eq!(status, StatusCode::OK);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert!(v["flamebearer"]["numTicks"].as_i64().unwrap() > 0, "{v}");
    let (status, body) = send(&router, get(Some("b"), render)).await;
    assert_eq!(status, StatusCode::OK);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["flamebearer"]["numTicks"], 0, "{v}");
    // groupBy: one timeline per value of the label.
    let ingest = Request::post("/ingest?name=shop.cpu%7Benv%3Dprod%7D&from=1700000030")
        .header("x-scope-orgid", "a")
        .body(Body::from("main;legacy_fn 2\n"))
        .unwrap();
    assert_eq!(send(&router, ingest).await.0, StatusCode::OK);
    let (status, body) = send(&router, get(Some("a"), &format!("{render}&groupBy=env"))).await;
    assert_eq!(status, StatusCode::OK);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let groups = v["groups"].as_object().expect("groups");
    let sums: std::collections::BTreeMap<&str, i64> = groups
        .iter()
        .map(|(k, t)| {
            let samples = t["samples"].as_array().unwrap();
            (
                k.as_str(),
                samples.iter().map(|s| s.as_i64().unwrap()).sum(),
            )
        })
        .collect();
    assert_eq!(sums.get("prod"), Some(&20_000_000), "{sums:?}");
    assert_eq!(sums.values().sum::<i64>(), 90_000_000, "{sums:?}");
    // No tenant: refused, as the querier refuses.
    let (status, body) = send(&router, get(None, render)).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "{}",
        String::from_utf8_lossy(&body)
    );
    // A bad query: the Connect-style JSON error Pyroscope writes.
    let (status, body) = send(&router, get(Some("a"), "/pyroscope/render?from=now-1h")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["code"], "invalid_argument", "{v}");
    assert_eq!(v["message"], "\"query\" is required", "{v}");
}

/// Diff as the app's function-tables branch sends it: left and right ticks are the two sides'
/// totals, levels hold seven values per node; another tenant's sides are empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diff_aligns_two_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let router = app(dir.path()).await;
    for (from, body) in [
        (1_700_000_000, "main;old_path 3\nmain;shared 1\n"),
        (1_700_003_600, "main;new_path 5\nmain;shared 2\n"),
    ] {
        let req = Request::post(format!("/ingest?name=shop.cpu&from={from}"))
            .header("x-scope-orgid", "team-a")
            .body(Body::from(body))
            .unwrap();
        assert_eq!(send(&router, req).await.0, StatusCode::OK);
    }
    let side = |start: i64, end: i64| {
        serde_json::json!({
            "profileTypeID": "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            "labelSelector": "{service_name=\"shop\"}",
            "start": start, "end": end.to_string(), "maxNodes": 100,
        })
    };
    let body = serde_json::json!({
        "left": side(1_699_999_000_000, 1_700_001_000_000),
        "right": side(1_700_003_000_000, 1_700_004_000_000),
    });
    let diff = connect_json(&router, "team-a", "Diff", body.clone()).await;
    let fg = &diff["flamegraph"];
    let ms = 10_000_000;
    assert_eq!(json_i64(&fg["leftTicks"]), 4 * ms, "{diff}");
    assert_eq!(json_i64(&fg["rightTicks"]), 7 * ms, "{diff}");
    assert_eq!(json_i64(&fg["total"]), 11 * ms, "{diff}");
    for level in fg["levels"].as_array().unwrap() {
        assert_eq!(level["values"].as_array().unwrap().len() % 7, 0);
    }
    let names: Vec<&str> = fg["names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    for n in ["old_path", "new_path", "shared"] {
        assert!(names.contains(&n), "{names:?}");
    }
    let other = connect_json(&router, "team-b", "Diff", body).await;
    assert_eq!(json_i64(&other["flamegraph"]["leftTicks"]), 0, "{other}");
    assert_eq!(json_i64(&other["flamegraph"]["rightTicks"]), 0, "{other}");
}

/// `service_repository`, `service_git_ref` and `service_root_path` become each mapping's build
/// id as Pyroscope writes it, which the app's function-details panel reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_version_labels_reach_the_mappings() {
    use kiln_proto::google::v1 as p;
    let dir = tempfile::tempdir().unwrap();
    let router = app(dir.path()).await;
    let profile = p::Profile {
        string_table: ["", "cpu", "nanoseconds", "main", "/bin/shop", "abc123"]
            .map(String::from)
            .to_vec(),
        sample_type: vec![p::ValueType { r#type: 1, unit: 2 }],
        period_type: Some(p::ValueType { r#type: 1, unit: 2 }),
        period: 10_000_000,
        mapping: vec![p::Mapping {
            id: 1,
            filename: 4,
            build_id: 5,
            has_functions: true,
            ..Default::default()
        }],
        function: vec![p::Function {
            id: 1,
            name: 3,
            ..Default::default()
        }],
        location: vec![p::Location {
            id: 1,
            mapping_id: 1,
            line: vec![p::Line {
                function_id: 1,
                line: 1,
            }],
            ..Default::default()
        }],
        sample: vec![p::Sample {
            location_id: vec![1],
            value: vec![5],
            label: vec![],
        }],
        time_nanos: 1_700_000_000_000_000_000,
        ..Default::default()
    };
    // `name=app{k=v,…}` as Pyroscope's SDKs send it: values unquoted.
    let labels = "shop%7Bservice_repository%3Dhttps%3A%2F%2Fgithub.com%2Facme%2Fshop%2Cservice_git_ref%3Dv1.2%7D";
    let req = Request::post(format!(
        "/ingest?name={labels}&from=1700000000&format=pprof"
    ))
    .header("x-scope-orgid", "team-a")
    .body(Body::from(profile.encode_to_vec()))
    .unwrap();
    let (status, body) = send(&router, req).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let pprof = connect_json(
        &router,
        "team-a",
        "SelectMergeProfile",
        serde_json::json!({
            "profile_typeID": "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            "label_selector": "{service_name=\"shop\"}",
            "start": 1_699_999_000_000i64, "end": 1_700_001_000_000i64,
        }),
    )
    .await;
    let strings = pprof["stringTable"].as_array().unwrap();
    let build_id = &pprof["mapping"][0]["buildId"];
    let text = strings[json_i64(build_id) as usize].as_str().unwrap();
    let version: serde_json::Value = serde_json::from_str(text).unwrap();
    assert_eq!(
        version,
        serde_json::json!({
            "repository": "https://github.com/acme/shop",
            "git_ref": "v1.2",
            "build_id": "abc123",
        })
    );
    assert!(
        text.starts_with(r#"{"repository":"#),
        "Pyroscope's field order: {text}"
    );
    let other = connect_json(
        &router,
        "team-b",
        "SelectMergeProfile",
        serde_json::json!({
            "profile_typeID": "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            "label_selector": "{service_name=\"shop\"}",
            "start": 1_699_999_000_000i64, "end": 1_700_001_000_000i64,
        }),
    )
    .await;
    assert!(
        other["sample"].as_array().is_none_or(|s| s.is_empty()),
        "{other}"
    );
}

/// Individual exemplars name the profiles they come from, and `profile_id_selector` opens
/// exactly that profile (flame graph and pprof), as the app's exemplar click does; another
/// tenant cannot open it, and a malformed id is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn individual_exemplars_open_their_profile() {
    let dir = tempfile::tempdir().unwrap();
    let router = app(dir.path()).await;
    // Three profiles a minute apart, each its own stacks; team-b has one of its own.
    let profiles = [
        (1_700_000_000, "main;a 3\nmain;b 4\n", 7),
        (1_700_000_060, "main;c 10\n", 10),
        (1_700_000_120, "main;a 1\nmain;d 1\n", 2),
    ];
    for (tenant, (t, folded, _)) in profiles
        .iter()
        .map(|p| ("team-a", p))
        .chain([("team-b", &(1_700_000_000, "other 5\n", 5))])
    {
        let req = Request::post(format!("/ingest?name=shop.cpu{{env=prod}}&from={t}"))
            .header("x-scope-orgid", tenant)
            .body(Body::from(*folded))
            .unwrap();
        let (status, body) = send(&router, req).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    }
    let cpu = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
    let ms = 10_000_000; // folded values are samples of 100 Hz
    let series = connect_json(
        &router,
        "team-a",
        "SelectSeries",
        serde_json::json!({
            "profileTypeID": cpu, "labelSelector": "{service_name=\"shop\"}",
            "start": "1699999980000", "end": 1_700_000_180_000i64, "step": 60,
            "exemplarType": "EXEMPLAR_TYPE_INDIVIDUAL",
        }),
    )
    .await;
    let points = series["series"][0]["points"].as_array().unwrap();
    assert_eq!(points.len(), 3, "{series}");
    let mut ids = Vec::new();
    for (point, (_, _, total)) in points.iter().zip(&profiles) {
        let e = &point["exemplars"].as_array().unwrap()[0];
        assert_eq!(json_i64(&e["value"]), total * ms, "{point}");
        assert_eq!(point["value"].as_f64().unwrap(), (total * ms) as f64);
        let labels = e["labels"].as_array().unwrap();
        assert!(
            labels
                .iter()
                .any(|l| l["name"] == "env" && l["value"] == "prod"),
            "{e}"
        );
        ids.push(e["profileId"].as_str().unwrap().to_owned());
    }
    for (id, (_, _, total)) in ids.iter().zip(&profiles) {
        assert_eq!(id.len(), 36, "a UUID: {id}");
        let flame = |tenant: &'static str| {
            let router = router.clone();
            let id = id.clone();
            async move {
                connect_json(
                    &router,
                    tenant,
                    "SelectMergeStacktraces",
                    serde_json::json!({
                        "profile_typeID": cpu, "label_selector": "{}",
                        "start": 1_699_999_980_000i64, "end": "1700000180000",
                        "maxNodes": 16384, "profileIdSelector": [id],
                    }),
                )
                .await
            }
        };
        let fg = flame("team-a").await;
        assert_eq!(json_i64(&fg["flamegraph"]["total"]), total * ms, "{fg}");
        assert_eq!(json_i64(&flame("team-b").await["flamegraph"]["total"]), 0);
        let pprof = connect_json(
            &router,
            "team-a",
            "SelectMergeProfile",
            serde_json::json!({
                "profile_typeID": cpu, "label_selector": "{}",
                "start": 1_699_999_980_000i64, "end": 1_700_000_180_000i64,
                "profileIdSelector": [id],
            }),
        )
        .await;
        let sum: i64 = pprof["sample"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| json_i64(&s["value"][0]))
            .sum();
        assert_eq!(sum, total * ms, "{pprof}");
    }
    // The heatmap's individual exemplars carry the same ids.
    let heatmap = connect_json(
        &router,
        "team-a",
        "SelectHeatmap",
        serde_json::json!({
            "profileTypeID": cpu, "labelSelector": "{}",
            "start": 1_699_999_980_000i64, "end": 1_700_000_180_000i64, "step": 60,
            "queryType": "HEATMAP_QUERY_TYPE_INDIVIDUAL",
            "exemplarType": "EXEMPLAR_TYPE_INDIVIDUAL",
        }),
    )
    .await;
    let mut heat_ids: Vec<String> = heatmap["series"][0]["slots"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["exemplars"].as_array().unwrap())
        .map(|e| e["profileId"].as_str().unwrap().to_owned())
        .collect();
    heat_ids.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(heat_ids, want, "{heatmap}");
    // A diff of two profiles (each side a whole request: its profile ids apply).
    let side = |id: &str| {
        serde_json::json!({
            "profileTypeID": cpu, "labelSelector": "{}",
            "start": 1_699_999_980_000i64, "end": 1_700_000_180_000i64,
            "profileIdSelector": [id],
        })
    };
    let diff = connect_json(
        &router,
        "team-a",
        "Diff",
        serde_json::json!({"left": side(&ids[0]), "right": side(&ids[1])}),
    )
    .await;
    assert_eq!(json_i64(&diff["flamegraph"]["leftTicks"]), 7 * ms, "{diff}");
    assert_eq!(
        json_i64(&diff["flamegraph"]["rightTicks"]),
        10 * ms,
        "{diff}"
    );
    // A malformed id is the caller's error.
    let (status, body) = connect_call(
        &router,
        "team-a",
        "/querier.v1.QuerierService/SelectMergeStacktraces",
        serde_json::json!({
            "profileTypeID": cpu, "labelSelector": "{}",
            "start": 1_699_999_980_000i64, "end": 1_700_000_180_000i64,
            "profileIdSelector": ["not-a-uuid"],
        }),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["code"], "invalid_argument");
}

/// Every endpoint of the API table is routed: with every role it reaches its handler, with none
/// it answers the role's 404, and never the router's fallback (a path of no API); the telemetry
/// layer names each with a name of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_is_routed() {
    use kiln_gateway::api::{Transport, Verb, endpoints};
    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::open(kiln_storage::testing::config(dir.path()))
        .await
        .unwrap();
    let all = router(Arc::new(App::new(
        storage.clone(),
        operator_auth(),
        Tenants::defaults(),
    )));
    let mut compact_only = App::new(storage, operator_auth(), Tenants::defaults());
    compact_only.roles = kiln_gateway::app::Roles::parse("compact").unwrap();
    let compact_only = router(Arc::new(compact_only));
    let (status, body) = send(
        &all,
        Request::get("/no/such/api").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(String::from_utf8_lossy(&body).contains("is not an API of Kiln"));
    let endpoints = endpoints();
    assert!(endpoints.len() > 20, "{}", endpoints.len());
    let paths = endpoints.iter().flat_map(|e| {
        // Concrete paths: each method the endpoint names for `{method}` (any, for a service Kiln
        // does not offer), a tenant for `{id}`.
        let methods: Vec<&str> = match e.names {
            kiln_gateway::api::Names::Methods { methods, .. } if !methods.is_empty() => methods
                .iter()
                .map(|m| m.rsplit('/').next().unwrap())
                .collect(),
            _ => vec!["Anything"],
        };
        methods.into_iter().map(move |m| {
            let path = e.path.replace("{method}", m).replace("{id}", "team-a");
            (e, path)
        })
    });
    for (e, path) in paths {
        let method = kiln_gateway::api::api_method(&path);
        assert_ne!(method, "other", "{path} has no name of its own");
        assert!(!method.ends_with("/unknown"), "{path}: {method}");
        let request = |content_type: &str| {
            let verb = match e.verb {
                Verb::Get => "GET",
                Verb::Post => "POST",
                Verb::Delete => "DELETE",
            };
            Request::builder()
                .method(verb)
                .uri(&path)
                .header("x-scope-orgid", "team-a")
                .header("content-type", content_type)
                .body(Body::from("{}"))
                .unwrap()
        };
        let content_type = match e.transport {
            Transport::Grpc => "application/grpc",
            _ => "application/json",
        };
        let (status, body) = send(&all, request(content_type)).await;
        let body = String::from_utf8_lossy(&body);
        assert!(
            !body.contains("is not an API of Kiln") && status != StatusCode::METHOD_NOT_ALLOWED,
            "{path}: {status} {body}"
        );
        if e.handler.is_some()
            && !e
                .role
                .served_by(kiln_gateway::app::Roles::parse("compact").unwrap())
        {
            let (status, body) = send(&compact_only, request(content_type)).await;
            let body = String::from_utf8_lossy(&body);
            assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
            assert!(body.contains("not served here"), "{path}: {body}");
        }
    }
}

/// The rows of a function table as `(name, self, total)`.
fn function_rows(table: &serde_json::Value) -> Vec<(String, i64, i64)> {
    table["functions"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .map(|r| {
                    (
                        r["name"].as_str().unwrap_or_default().to_owned(),
                        json_i64(&r["self"]),
                        json_i64(&r["total"]),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A call tree or sandwich half as `name total self` lines, indented by depth (`names` resolves
/// a sandwich's `nameIndex`).
fn tree_lines(node: &serde_json::Value, names: Option<&serde_json::Value>) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![(node, 0)];
    while let Some((n, depth)) = todo.pop() {
        let name = match names {
            Some(names) => names[n["nameIndex"].as_u64().unwrap_or(0) as usize]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            None => n["name"].as_str().unwrap_or_default().to_owned(),
        };
        let mark = if n["truncated"] == true || n["hasChildren"] == true {
            " +"
        } else {
            ""
        };
        out.push(format!(
            "{}{name} {} {}{mark}",
            "  ".repeat(depth),
            json_i64(&n["total"]),
            json_i64(&n["self"]),
        ));
        if let Some(children) = n["children"].as_array() {
            todo.extend(children.iter().rev().map(|c| (c, depth + 1)));
        }
    }
    out
}

/// PROFILE_FORMAT_FUNCTIONS, FUNCTION_TREE and SANDWICH with the bodies the app's clients send
/// (`functionProjections.ts`, `FunctionTableApiClient.ts`, `SandwichApiClient.ts`): exact values
/// over the whole profile whatever the limit, the call site honoured, bad options refused with
/// 400, and another tenant's tables empty. Values are in samples of 10 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_projections_as_the_app_asks() {
    let dir = tempfile::tempdir().unwrap();
    let router = app(dir.path()).await;
    let ingest = Request::post("/ingest?name=shop.cpu&from=1700000000")
        .header("x-scope-orgid", "team-a")
        .body(Body::from(
            "main;checkout;pay 3\nmain;checkout;render 2\nmain;browse;render 1\n\
             main;rec;rec;leaf 4\nmain 4\ngc 5\n",
        ))
        .unwrap();
    let (status, body) = send(&router, ingest).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let ms = 10_000_000;
    let cpu = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
    let query = |extra: serde_json::Value| {
        let mut body = serde_json::json!({
            "profileTypeID": cpu,
            "labelSelector": "{service_name=\"shop\"}",
            "start": 1_699_999_000_000i64,
            "end": 1_700_001_000_000i64,
        });
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    let samples = |rows: Vec<(String, i64, i64)>| -> Vec<(String, i64, i64)> {
        rows.into_iter()
            .map(|(n, s, t)| (n, s / ms, t / ms))
            .collect()
    };
    let row = |n: &str, s: i64, t: i64| (n.to_owned(), s, t);

    // The projection client: every row (limit 0), recursion counted once per stack.
    let all = connect_json(
        &router,
        "team-a",
        "SelectMergeStacktraces",
        query(serde_json::json!({
            "format": "PROFILE_FORMAT_FUNCTIONS",
            "formatOptions": { "functions": { "limit": "0" } },
        })),
    )
    .await;
    let table = &all["functions"];
    assert!(all.get("flamegraph").is_none(), "{all}");
    assert_eq!(json_i64(&table["total"]), 19 * ms, "{all}");
    assert_eq!(json_i64(&table["totalFunctions"]), 8, "{all}");
    assert_eq!(
        samples(function_rows(table)),
        [
            row("gc", 5, 5),
            row("main", 4, 14),
            row("leaf", 4, 4),
            row("pay", 3, 3),
            row("render", 3, 3),
            row("checkout", 0, 5),
            row("rec", 0, 4),
            row("browse", 0, 1),
        ]
    );
    // The table client: maxNodes is the row limit, the totals stay the profile's.
    let top = connect_json(
        &router,
        "team-a",
        "SelectMergeStacktraces",
        query(serde_json::json!({ "format": "PROFILE_FORMAT_FUNCTIONS", "maxNodes": 3 })),
    )
    .await;
    assert_eq!(
        samples(function_rows(&top["functions"])),
        [row("gc", 5, 5), row("main", 4, 14), row("leaf", 4, 4)]
    );
    assert_eq!(json_i64(&top["functions"]["total"]), 19 * ms);
    assert_eq!(json_i64(&top["functions"]["totalFunctions"]), 8);
    // A call site (proto names mixed in) selects the stacks through it, as for a flame graph.
    let checkout = connect_json(
        &router,
        "team-a",
        "SelectMergeStacktraces",
        serde_json::json!({
            "profile_typeID": cpu,
            "label_selector": "{service_name=\"shop\"}",
            "start": "1699999000000",
            "end": "1700001000000",
            "format": "PROFILE_FORMAT_FUNCTIONS",
            "stackTraceSelector": { "call_site": [{ "name": "main" }, { "name": "checkout" }] },
        }),
    )
    .await;
    assert_eq!(
        samples(function_rows(&checkout["functions"])),
        [
            row("pay", 3, 3),
            row("render", 2, 2),
            row("checkout", 0, 5),
            row("main", 0, 5)
        ]
    );
    // The same table over binary proto.
    let req = q::SelectMergeStacktracesRequest {
        profile_type_id: cpu.into(),
        label_selector: "{}".into(),
        format: q::ProfileFormat::Functions as i32,
        max_nodes: Some(1),
        ..Default::default()
    };
    let (status, body) = send(
        &router,
        Request::post("/querier.v1.QuerierService/SelectMergeStacktraces")
            .header("content-type", "application/proto")
            .header("x-scope-orgid", "team-a")
            .body(Body::from(req.encode_to_vec()))
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let table = q::SelectMergeStacktracesResponse::decode(body.as_slice())
        .unwrap()
        .functions
        .unwrap();
    assert_eq!(
        (table.functions.len(), table.total, table.total_functions),
        (1, 19 * ms, 8)
    );

    // Function trees: the callers and callees of render, two levels; the root's children.
    let tree = |options: serde_json::Value, path: &[&str]| {
        let sites: Vec<serde_json::Value> = path
            .iter()
            .map(|n| serde_json::json!({ "name": n }))
            .collect();
        query(serde_json::json!({
            "format": "PROFILE_FORMAT_FUNCTION_TREE",
            "formatOptions": { "functionTree": options },
            "stackTraceSelector": { "callSite": sites },
        }))
    };
    let render = connect_json(
        &router,
        "team-a",
        "SelectMergeStacktraces",
        tree(
            serde_json::json!({
                "selection": "FUNCTION_TREE_SELECTION_FUNCTION_CHAIN",
                "direction": "FUNCTION_TREE_DIRECTION_BOTH",
                "maxDepth": 2,
            }),
            &["render"],
        ),
    )
    .await;
    let ft = &render["functionTree"];
    let s = |lines: Vec<&str>| lines.into_iter().map(String::from).collect::<Vec<_>>();
    let in_samples = |lines: Vec<String>| -> Vec<String> {
        lines
            .into_iter()
            .map(|l| {
                l.split(' ')
                    .map(|w| match w.parse::<i64>() {
                        Ok(v) => (v / ms).to_string(),
                        Err(_) => w.to_owned(),
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect()
    };
    assert_eq!(
        in_samples(tree_lines(&ft["callers"]["root"], None)),
        s(vec![
            "render 3 3 +",
            "  checkout 2 0 +",
            "    main 2 0",
            "  browse 1 0 +",
            "    main 1 0",
        ]),
        "{render}"
    );
    assert_eq!(
        in_samples(tree_lines(&ft["callees"]["root"], None)),
        s(vec!["render 3 3"])
    );
    let root = connect_json(
        &router,
        "team-a",
        "SelectMergeStacktraces",
        tree(
            serde_json::json!({
                "selection": "FUNCTION_TREE_SELECTION_ROOT_PATH",
                "direction": "FUNCTION_TREE_DIRECTION_CALLEES",
            }),
            &[],
        ),
    )
    .await;
    assert!(root["functionTree"].get("callers").is_none(), "{root}");
    assert_eq!(
        in_samples(tree_lines(&root["functionTree"]["callees"]["root"], None)),
        s(vec![" 19 0 +", "  main 14 4 +", "  gc 5 5"])
    );

    // Sandwiches: a recursive function counts once in `total`, per occurrence in the halves.
    let sandwich = |function: &str, max_nodes: i64| {
        query(serde_json::json!({
            "format": "PROFILE_FORMAT_SANDWICH",
            "sandwichFunction": function,
            "maxNodes": max_nodes,
        }))
    };
    let rec = connect_json(
        &router,
        "team-a",
        "SelectMergeStacktraces",
        sandwich("rec", 16384),
    )
    .await;
    let sw = &rec["sandwich"];
    assert_eq!((json_i64(&sw["total"]), json_i64(&sw["self"])), (4 * ms, 0));
    assert_eq!(
        in_samples(tree_lines(&sw["callers"], Some(&sw["names"]))),
        s(vec!["rec 8 0", "  main 4 0", "  rec 4 0", "    main 4 0"])
    );
    assert_eq!(
        in_samples(tree_lines(&sw["callees"], Some(&sw["names"]))),
        s(vec!["rec 8 0", "  leaf 4 4", "  rec 4 0", "    leaf 4 4"])
    );
    // The callers' root is the function's total (it does not recurse) and maxNodes is per half,
    // what it cuts summed in a truncated `other`.
    let main = connect_json(
        &router,
        "team-a",
        "SelectMergeStacktraces",
        sandwich("main", 2),
    )
    .await;
    let sw = &main["sandwich"];
    assert_eq!(json_i64(&sw["total"]), 14 * ms);
    assert_eq!(json_i64(&sw["callers"]["total"]), 14 * ms);
    assert_eq!(
        in_samples(tree_lines(&sw["callees"], Some(&sw["names"]))),
        s(vec![
            "main 14 4",
            "  checkout 5 0",
            "    other 5 5 +",
            "  other 5 5 +"
        ])
    );
    // The sandwich client sends `maxNodes: null` when the setting is unset: the default.
    let mut unset = sandwich("rec", 0);
    unset["maxNodes"] = serde_json::Value::Null;
    let unset = connect_json(&router, "team-a", "SelectMergeStacktraces", unset).await;
    assert_eq!(unset["sandwich"], rec["sandwich"]);
    // A function the profile does not have: zero roots, as upstream answers.
    let nope = connect_json(
        &router,
        "team-a",
        "SelectMergeStacktraces",
        sandwich("nope", 10),
    )
    .await;
    assert_eq!(
        nope["sandwich"]["names"],
        serde_json::json!(["nope"]),
        "{nope}"
    );
    assert!(nope["sandwich"]["callers"].is_object() && nope["sandwich"].get("total").is_none());

    // Bad options: 400 with a message, never a panic.
    let q_path = "/querier.v1.QuerierService/SelectMergeStacktraces";
    for (body, says) in [
        (
            query(serde_json::json!({ "format": "PROFILE_FORMAT_SANDWICH" })),
            "sandwich_function",
        ),
        (
            tree(
                serde_json::json!({
                    "selection": "FUNCTION_TREE_SELECTION_ROOT_PATH",
                    "direction": "FUNCTION_TREE_DIRECTION_CALLERS",
                }),
                &["main"],
            ),
            "ROOT_PATH",
        ),
        (
            tree(
                serde_json::json!({
                    "selection": "FUNCTION_TREE_SELECTION_FUNCTION_CHAIN",
                    "direction": "FUNCTION_TREE_DIRECTION_BOTH",
                    "maxDepth": 129,
                }),
                &["main"],
            ),
            "max_depth",
        ),
        (
            tree(
                serde_json::json!({
                    "selection": "FUNCTION_TREE_SELECTION_FUNCTION_CHAIN",
                    "direction": "FUNCTION_TREE_DIRECTION_BOTH",
                }),
                &["main", "checkout"],
            ),
            "exactly one function",
        ),
        (
            query(serde_json::json!({ "format": "PROFILE_FORMAT_FUNCTION_TREE" })),
            "function_tree",
        ),
        (
            query(serde_json::json!({
                "format": "PROFILE_FORMAT_FUNCTIONS",
                "formatOptions": { "functions": { "limit": "-1" } },
            })),
            "negative",
        ),
    ] {
        let (status, v) = connect_call(&router, "team-a", q_path, body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert_eq!(v["code"], "invalid_argument", "{v}");
        assert!(v["message"].as_str().unwrap().contains(says), "{says}: {v}");
    }

    // Another tenant: the same calls answer empty projections.
    let other = connect_json(
        &router,
        "team-b",
        "SelectMergeStacktraces",
        query(serde_json::json!({ "format": "PROFILE_FORMAT_FUNCTIONS" })),
    )
    .await;
    assert!(function_rows(&other["functions"]).is_empty(), "{other}");
    assert_eq!(json_i64(&other["functions"]["total"]), 0);
    let other = connect_json(
        &router,
        "team-b",
        "SelectMergeStacktraces",
        sandwich("rec", 10),
    )
    .await;
    assert_eq!(other["sandwich"], serde_json::json!({}), "{other}");
    let other = connect_json(
        &router,
        "team-b",
        "SelectMergeStacktraces",
        tree(
            serde_json::json!({
                "selection": "FUNCTION_TREE_SELECTION_FUNCTION_CHAIN",
                "direction": "FUNCTION_TREE_DIRECTION_BOTH",
            }),
            &["render"],
        ),
    )
    .await;
    assert_eq!(
        other["functionTree"],
        serde_json::json!({ "callers": {}, "callees": {} })
    );
}

/// Diff with function projections, as the app's two clients ask: the projection client's
/// `left.format` gets both sides' rows aligned (and call trees side by side), the table client's
/// request `format` one joined table; the limit applies to the joined rows, totals stay whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diff_joins_function_tables() {
    let dir = tempfile::tempdir().unwrap();
    let router = app(dir.path()).await;
    for (from, body) in [
        (1_700_000_000, "main;old_path 3\nmain;shared 1\n"),
        (1_700_003_600, "main;new_path 5\nmain;shared 2\n"),
    ] {
        let req = Request::post(format!("/ingest?name=shop.cpu&from={from}"))
            .header("x-scope-orgid", "team-a")
            .body(Body::from(body))
            .unwrap();
        assert_eq!(send(&router, req).await.0, StatusCode::OK);
    }
    let ms = 10_000_000;
    let side = |start: i64, end: i64| {
        serde_json::json!({
            "profileTypeID": "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            "labelSelector": "{service_name=\"shop\"}",
            "start": start, "end": end,
        })
    };
    let with = |mut v: serde_json::Value, extra: serde_json::Value| {
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        v
    };
    let (l, r) = (
        side(1_699_999_000_000, 1_700_001_000_000),
        side(1_700_003_000_000, 1_700_004_000_000),
    );
    let projection = serde_json::json!({
        "left": with(l.clone(), serde_json::json!({
            "format": "PROFILE_FORMAT_FUNCTIONS",
            "formatOptions": { "functions": { "limit": "2" } },
        })),
        "right": r.clone(),
    });
    let diff = connect_json(&router, "team-a", "Diff", projection.clone()).await;
    let f = &diff["functions"];
    assert!(diff.get("flamegraph").is_none(), "{diff}");
    let samples = |rows: Vec<(String, i64, i64)>| -> Vec<(String, i64, i64)> {
        rows.into_iter()
            .map(|(n, s, t)| (n, s / ms, t / ms))
            .collect()
    };
    let row = |n: &str, s: i64, t: i64| (n.to_owned(), s, t);
    assert_eq!(
        samples(function_rows(&f["left"])),
        [row("new_path", 0, 0), row("old_path", 3, 3)],
        "{diff}"
    );
    assert_eq!(
        samples(function_rows(&f["right"])),
        [row("new_path", 5, 5), row("old_path", 0, 0)]
    );
    assert_eq!(json_i64(&f["left"]["total"]), 4 * ms);
    assert_eq!(json_i64(&f["right"]["total"]), 7 * ms);
    assert_eq!(json_i64(&f["left"]["totalFunctions"]), 4);

    // The table client: one row per function, ranked by share, the outer maxNodes.
    let table = serde_json::json!({
        "left": l, "right": r, "format": "PROFILE_FORMAT_FUNCTIONS", "maxNodes": 3,
    });
    let joined = connect_json(&router, "team-a", "Diff", table.clone()).await;
    let f = &joined["functions"];
    let rows: Vec<(String, i64, i64, i64, i64)> = f["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_owned(),
                json_i64(&r["leftSelf"]) / ms,
                json_i64(&r["leftTotal"]) / ms,
                json_i64(&r["rightSelf"]) / ms,
                json_i64(&r["rightTotal"]) / ms,
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("main".to_owned(), 0, 4, 0, 7),
            ("old_path".to_owned(), 3, 3, 0, 0),
            ("new_path".to_owned(), 0, 0, 5, 5),
        ],
        "{joined}"
    );
    assert_eq!(
        (json_i64(&f["leftTotal"]), json_i64(&f["rightTotal"])),
        (4 * ms, 7 * ms)
    );

    // Call trees side by side, each side its own call site.
    let site = serde_json::json!({ "callSite": [{ "name": "main" }] });
    let trees = serde_json::json!({
        "left": with(l.clone(), serde_json::json!({
            "stackTraceSelector": site,
            "format": "PROFILE_FORMAT_FUNCTION_TREE",
            "formatOptions": { "functionTree": {
                "selection": "FUNCTION_TREE_SELECTION_FUNCTION_CHAIN",
                "direction": "FUNCTION_TREE_DIRECTION_CALLEES",
                "maxDepth": 1,
            } },
        })),
        "right": with(r.clone(), serde_json::json!({ "stackTraceSelector": site })),
    });
    let trees = connect_json(&router, "team-a", "Diff", trees).await;
    let ft = &trees["functionTree"];
    let children = |root: &serde_json::Value| -> Vec<(String, i64)> {
        root["children"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().unwrap().to_owned(),
                    json_i64(&c["total"]) / ms,
                )
            })
            .collect()
    };
    assert_eq!(
        children(&ft["left"]["callees"]["root"]),
        [("old_path".to_owned(), 3), ("shared".to_owned(), 1)],
        "{trees}"
    );
    assert_eq!(
        children(&ft["right"]["callees"]["root"]),
        [("new_path".to_owned(), 5), ("shared".to_owned(), 2)]
    );

    // Another tenant: empty sides.
    let other = connect_json(&router, "team-b", "Diff", projection).await;
    assert!(
        function_rows(&other["functions"]["left"]).is_empty(),
        "{other}"
    );
    assert_eq!(json_i64(&other["functions"]["right"]["total"]), 0);
    let other = connect_json(&router, "team-b", "Diff", table).await;
    assert!(
        other["functions"]["functions"]
            .as_array()
            .is_none_or(|r| r.is_empty())
    );
}

/// `/metrics` names every tenant: in trusted-header mode the proxy's header must name the
/// operator tenant; any other tenant it forwards is refused, as is a request without one.
#[tokio::test]
async fn metrics_answer_the_operator_only() {
    let dir = tempfile::tempdir().unwrap();
    let router = app(dir.path()).await;
    let (status, body) = send(&router, metrics_request()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(String::from_utf8_lossy(&body).contains("# TYPE kiln_"));
    let stranger = Request::get("/metrics")
        .header("x-scope-orgid", "team-a")
        .body(Body::empty())
        .unwrap();
    let (status, body) = send(&router, stranger).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(String::from_utf8_lossy(&body).contains("--admin-listen"));
    let anonymous = Request::get("/metrics").body(Body::empty()).unwrap();
    assert_eq!(send(&router, anonymous).await.0, StatusCode::UNAUTHORIZED);
    // Without an operator tenant, nobody reads it on this port.
    let storage = Storage::open(StorageConfig::new(dir.path().join("other")))
        .await
        .unwrap();
    let plain = router_of(App::new(
        storage,
        Authenticator::trusted_header(),
        Tenants::defaults(),
    ));
    assert_eq!(
        send(&plain, metrics_request()).await.0,
        StatusCode::FORBIDDEN
    );
}

fn router_of(app: App) -> axum::Router {
    router(Arc::new(app))
}

/// The built-in UI (ADR 0016): `/` and `/ui/...` serve the embedded page, its script and style,
/// with a same-origin content security policy; the page holds no data (so no credentials), and
/// an unknown path outside it is still a 404 naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ui_is_served_from_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let router = app(dir.path()).await;
    for (path, content_type, needle) in [
        ("/", "text/html", "<script src=\"/ui/kiln.js\">"),
        (
            "/?query=process_cpu%7B%7D&from=now-1h",
            "text/html",
            "id=\"flame\"",
        ),
        (
            "/ui/kiln.js",
            "text/javascript",
            "querier.v1.QuerierService",
        ),
        ("/ui/kiln.css", "text/css", "#flame"),
        ("/ui/some/deep/link", "text/html", "id=\"flame\""),
    ] {
        let resp = router
            .clone()
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        let h = resp.headers();
        assert!(
            h[axum::http::header::CONTENT_TYPE]
                .to_str()
                .unwrap()
                .starts_with(content_type),
            "{path}"
        );
        assert!(
            h[axum::http::header::CONTENT_SECURITY_POLICY]
                .to_str()
                .unwrap()
                .contains("default-src 'self'")
        );
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert!(String::from_utf8_lossy(&body).contains(needle), "{path}");
    }
    let (status, body) = send(&router, Request::get("/nope").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(String::from_utf8_lossy(&body).contains("/nope is not an API of Kiln"));
}

/// `/ready` follows the object store: a query process whose store stops answering is unready
/// (at most a second later: the check stands a second) and ready again once it answers; an
/// ingest process stays ready, its writes waiting in the log and spool, and says what is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_follows_the_object_store_for_queries() {
    use kiln_gateway::app::Roles;
    let ready = |router: axum::Router| async move {
        let (status, body) =
            send(&router, Request::get("/ready").body(Body::empty()).unwrap()).await;
        (status, String::from_utf8_lossy(&body).into_owned())
    };
    let mut routers = Vec::new();
    let mut faults = Vec::new();
    let mut dirs = Vec::new();
    for roles in ["query", "ingest"] {
        let dir = tempfile::tempdir().unwrap();
        let (storage, faulty) =
            kiln_storage::testing::faulty_storage(StorageConfig::new(dir.path())).await;
        let mut app = App::new(storage, operator_auth(), Tenants::defaults());
        app.roles = Roles::parse(roles).unwrap();
        routers.push(router(Arc::new(app)));
        faults.push(faulty);
        dirs.push(dir);
    }
    let (query, ingest) = (routers[0].clone(), routers[1].clone());
    assert_eq!(
        ready(query.clone()).await,
        (StatusCode::OK, "ready\n".into())
    );
    for f in &faults {
        f.set_down(true);
    }
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let (status, body) = ready(query.clone()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body, "unreachable: object store\n");
    let (status, body) = ready(ingest.clone()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("unreachable: object store"), "{body}");
    for f in &faults {
        f.set_down(false);
    }
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(ready(query).await, (StatusCode::OK, "ready\n".into()));
}
