//! Bounded work per debug-file upload, through the router in process: inflation bombs of real
//! programs (zlib and zstd `.debug_info` declaring 3 GiB) are answered 413 and store nothing, a
//! tenant runs at most `max_debuginfo_uploads` uploads at once (429 past it) while another
//! tenant's uploads go on, and a slot comes back when its upload ends.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use kiln_gateway::app::App;
use kiln_gateway::auth::Authenticator;
use kiln_gateway::server::router;
use kiln_gateway::tenants::Tenants;
use kiln_storage::{Storage, StorageConfig};
use kiln_symbolize::testing::{self, Compression, Program};
use tower::ServiceExt;

async fn app(dir: &std::path::Path) -> axum::Router {
    let storage = Storage::open(StorageConfig::new(dir)).await.unwrap();
    router(Arc::new(App::new(
        storage,
        Authenticator::trusted_header(),
        Tenants::defaults(),
    )))
}

fn upload(tenant: &str, name: &str, body: Body) -> Request<Body> {
    Request::post(format!("/api/v1/debuginfo?name={name}"))
        .header("X-Scope-OrgID", tenant)
        .body(body)
        .unwrap()
}

async fn send(router: &axum::Router, req: Request<Body>) -> (StatusCode, String) {
    let resp = router.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

async fn listed(router: &axum::Router, tenant: &str) -> usize {
    let req = Request::get("/api/v1/debuginfo")
        .header("X-Scope-OrgID", tenant)
        .body(Body::empty())
        .unwrap();
    let (status, body) = send(router, req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["files"].as_array().unwrap().len()
}

#[tokio::test]
async fn inflation_bombs_are_413_and_store_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let router = app(&dir.path().join("data")).await;
    let built = testing::build(Program::C, dir.path()).unwrap();
    for how in [Compression::Zlib, Compression::Zstd] {
        let compressed = testing::compress(&built.full, how).unwrap();
        let bomb = testing::inflation_bomb(&compressed, how, 3 << 30).unwrap();
        let (status, body) = send(&router, upload("team-a", "bomb", Body::from(bomb))).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{how:?}: {body}");
        assert!(body.contains(".debug_info"), "{body}");
        assert!(body.contains("max_debuginfo_inflated_bytes"), "{body}");
        // The honest compressed file is stored, for its tenant only.
        let honest = std::fs::read(&compressed).unwrap();
        let (status, body) = send(&router, upload("team-a", "honest", Body::from(honest))).await;
        assert_eq!(status, StatusCode::OK, "{how:?}: {body}");
    }
    assert_eq!(listed(&router, "team-a").await, 2);
    assert_eq!(listed(&router, "team-b").await, 0);
}

#[tokio::test]
async fn a_tenant_runs_its_uploads_within_its_slots_and_others_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let router = app(&dir.path().join("data")).await;
    let built = testing::build(Program::C, dir.path()).unwrap();
    let file = std::fs::read(&built.debug).unwrap();
    // Two uploads of team-a that send their first part and then hold their bodies open.
    let mut open = Vec::new();
    let mut running = Vec::new();
    for i in 0..2 {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(4);
        tx.send(Ok(bytes::Bytes::copy_from_slice(&file[..1024])))
            .await
            .unwrap();
        let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
        let r = router.clone();
        running.push(tokio::spawn(async move {
            send(&r, upload("team-a", &format!("slow-{i}"), body)).await
        }));
        open.push(tx);
    }
    // Both have their slots once their first part is written.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let (status, body) = send(&router, upload("team-a", "third", Body::from(file.clone()))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert!(body.contains("max_debuginfo_uploads"), "{body}");
    // Another tenant is not held to team-a's slots.
    let (status, body) = send(&router, upload("team-b", "b", Body::from(file.clone()))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // The held uploads finish; their slots come back.
    for tx in open.drain(..) {
        tx.send(Ok(bytes::Bytes::copy_from_slice(&file[1024..])))
            .await
            .unwrap();
    }
    for r in running {
        let (status, body) = r.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let (status, body) = send(&router, upload("team-a", "again", Body::from(file))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // One content, stored once per tenant.
    assert_eq!(listed(&router, "team-a").await, 1);
    assert_eq!(listed(&router, "team-b").await, 1);
    assert_eq!(listed(&router, "team-c").await, 0);
}

/// Uploads under way share the process's scratch space (`--debuginfo-scratch-size`): one that
/// would fill it is answered 503 naming the flag, and the space comes back when uploads end.
#[tokio::test]
async fn uploads_under_way_stay_within_the_scratch_space() {
    let dir = tempfile::tempdir().unwrap();
    let built = testing::build(Program::C, dir.path()).unwrap();
    let file = std::fs::read(&built.debug).unwrap();
    let storage = Storage::open(StorageConfig::new(dir.path().join("data")))
        .await
        .unwrap();
    let mut app = App::new(
        storage,
        Authenticator::trusted_header(),
        Tenants::defaults(),
    );
    // Room for one file and a half.
    let room = file.len() as u64 * 3 / 2;
    app.debuginfo_uploads =
        kiln_gateway::app::uploads::Uploads::new(4, 0, room, app.storage.metastore());
    let app = Arc::new(app);
    let router = router(Arc::clone(&app));
    // team-a's upload sends most of its file and holds its body open.
    let held = file.len() - 1024;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(4);
    tx.send(Ok(bytes::Bytes::copy_from_slice(&file[..held])))
        .await
        .unwrap();
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    let r = router.clone();
    let running = tokio::spawn(async move { send(&r, upload("team-a", "slow", body)).await });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(app.debuginfo_uploads.scratch.used(), held as u64);
    let (status, body) = send(&router, upload("team-b", "b", Body::from(file.clone()))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("--debuginfo-scratch-size"), "{body}");
    assert_eq!(
        app.debuginfo_uploads.scratch.used(),
        held as u64,
        "the refused upload gave its part back"
    );
    tx.send(Ok(bytes::Bytes::copy_from_slice(&file[held..])))
        .await
        .unwrap();
    drop(tx);
    let (status, body) = running.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(app.debuginfo_uploads.scratch.used(), 0);
    let (status, body) = send(&router, upload("team-b", "b", Body::from(file))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(listed(&router, "team-a").await, 1);
    assert_eq!(listed(&router, "team-b").await, 1);
}
