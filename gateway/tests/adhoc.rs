//! The Drilldown app's upload tab (`adhocprofiles.v1`) through the router in process, as the
//! app calls it (Connect JSON, `{name, profile: <base64>}`): uploads of each format are listed,
//! drawn with the totals that went in, kept across a restart, bounded, and seen by their
//! tenant only.

use std::io::Write;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use kiln_gateway::app::App;
use kiln_gateway::auth::Authenticator;
use kiln_gateway::server::router;
use kiln_gateway::tenants::Tenants;
use kiln_proto::google::v1 as p;
use kiln_storage::{Storage, StorageConfig};
use prost::Message;
use serde_json::{Value, json};
use tower::ServiceExt;

const SERVICE: &str = "/adhocprofiles.v1.AdHocProfileService";

/// A router over `dir` with the default limits but these.
async fn app(dir: &std::path::Path, metastore: &str, limits: toml::Table) -> axum::Router {
    let mut config = StorageConfig::new(dir);
    config.metastore = Some(dir.join(metastore).to_string_lossy().into_owned());
    router(Arc::new(App::new(
        Storage::open(config).await.unwrap(),
        Authenticator::trusted_header(),
        Tenants::load(None, limits).unwrap(),
    )))
}

async fn call(
    router: &axum::Router,
    tenant: &str,
    method: &str,
    body: Value,
) -> (StatusCode, Value) {
    let req = Request::post(format!("{SERVICE}/{method}"))
        .header("content-type", "application/json")
        .header("x-scope-orgid", tenant)
        .body(Body::from(body.to_string()))
        .unwrap();
    let resp = router.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or_default())
}

async fn ok(router: &axum::Router, tenant: &str, method: &str, body: Value) -> Value {
    let (status, out) = call(router, tenant, method, body).await;
    assert_eq!(status, StatusCode::OK, "{method}: {out}");
    out
}

fn int(v: &Value) -> i64 {
    v.as_str()
        .map(|s| s.parse().unwrap())
        .or_else(|| v.as_i64())
        .unwrap_or(0)
}

/// The flamebearer of a Get or Upload answer.
fn flamebearer(answer: &Value) -> Value {
    serde_json::from_str(answer["flamebearerProfile"].as_str().unwrap()).unwrap()
}

/// A pprof of two sample types (samples/count, cpu/nanoseconds), gzip-compressed as Go writes
/// it: `main;work` and `main;idle` with their values; returns it and each type's total.
fn two_type_pprof() -> (Vec<u8>, [i64; 2]) {
    let strings: Vec<String> = [
        "",
        "samples",
        "count",
        "cpu",
        "nanoseconds",
        "main",
        "work",
        "idle",
    ]
    .map(String::from)
    .to_vec();
    let function = |id: u64, name: i64| p::Function {
        id,
        name,
        ..Default::default()
    };
    let location = |id: u64| p::Location {
        id,
        line: vec![p::Line {
            function_id: id,
            line: 1,
        }],
        ..Default::default()
    };
    let profile = p::Profile {
        sample_type: vec![
            p::ValueType { r#type: 1, unit: 2 },
            p::ValueType { r#type: 3, unit: 4 },
        ],
        sample: vec![
            p::Sample {
                location_id: vec![2, 1],
                value: vec![7, 70_000_000],
                label: Vec::new(),
            },
            p::Sample {
                location_id: vec![3, 1],
                value: vec![2, 20_000_000],
                label: Vec::new(),
            },
        ],
        location: vec![location(1), location(2), location(3)],
        function: vec![function(1, 5), function(2, 6), function(3, 7)],
        string_table: strings,
        period_type: Some(p::ValueType { r#type: 3, unit: 4 }),
        period: 10_000_000,
        time_nanos: 1_700_000_000_000_000_000,
        ..Default::default()
    };
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&profile.encode_to_vec()).unwrap();
    (gz.finish().unwrap(), [9, 90_000_000])
}

fn upload_body(name: &str, data: &[u8]) -> Value {
    json!({ "name": name, "profile": kiln_otel::base64::encode(data) })
}

/// Upload, List, Get and Diff as the app calls them, for a pprof and a folded file; another
/// tenant lists nothing and cannot get them; both outlive the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_are_listed_drawn_and_kept_per_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let router = app(dir.path(), "meta-1.redb", toml::Table::new()).await;
    let before = kiln_gateway::time::now_nanos() / 1_000_000;

    let (pprof, [samples, cpu]) = two_type_pprof();
    let up = ok(
        &router,
        "team-a",
        "Upload",
        upload_body("cpu profile.pb.gz", &pprof),
    )
    .await;
    let pprof_id = up["id"].as_str().unwrap().to_owned();
    assert_eq!(pprof_id.len(), 26 + 1 + "cpu_profile.pb.gz".len(), "{up}");
    assert!(pprof_id.ends_with("-cpu_profile.pb.gz"), "{up}");
    assert_eq!(up["name"], "cpu_profile.pb.gz");
    assert_eq!(up["profileTypes"], json!(["samples", "cpu"]), "{up}");
    assert_eq!(up["profileType"], "samples");
    let fb = flamebearer(&up);
    assert_eq!(fb["version"], 1);
    assert_eq!(int(&fb["flamebearer"]["numTicks"]), samples, "{fb}");
    assert_eq!(fb["metadata"]["format"], "single");
    assert_eq!(fb["metadata"]["name"], "samples");
    assert_eq!(
        fb["metadata"]["units"], "objects",
        "as Pyroscope names a count of samples"
    );
    let names = fb["flamebearer"]["names"].to_string();
    assert!(
        names.contains("\"work\"") && names.contains("\"idle\""),
        "{names}"
    );

    // Get, as the app asks for the second type.
    let got = ok(
        &router,
        "team-a",
        "Get",
        json!({ "id": pprof_id, "profile_type": "cpu" }),
    )
    .await;
    assert_eq!(got["id"], pprof_id.as_str());
    assert_eq!(got["profileType"], "cpu");
    let fb = flamebearer(&got);
    assert_eq!(int(&fb["flamebearer"]["numTicks"]), cpu, "{fb}");
    assert_eq!(fb["metadata"]["sampleRate"], 1_000_000_000);
    assert_eq!(int(&got["uploadedAt"]), int(&up["uploadedAt"]));

    // Folded text: one profile type named after the file, values as they are.
    let text = "main;checkout;pay 3\nmain;browse 1\nmain 4\n";
    let up = ok(
        &router,
        "team-a",
        "Upload",
        upload_body("shop.txt", text.as_bytes()),
    )
    .await;
    let folded_id = up["id"].as_str().unwrap().to_owned();
    assert_eq!(up["profileTypes"], json!(["shop.txt"]));
    let fb = flamebearer(&up);
    assert_eq!(int(&fb["flamebearer"]["numTicks"]), 8);
    assert_eq!(fb["metadata"]["spyName"], "unknown");

    // List: both, newest first, with Pyroscope's fields.
    let list = ok(&router, "team-a", "List", json!({})).await;
    let profiles = list["profiles"].as_array().unwrap();
    assert_eq!(profiles.len(), 2, "{list}");
    assert_eq!(profiles[0]["id"], folded_id.as_str());
    assert_eq!(profiles[0]["name"], "shop.txt");
    assert_eq!(profiles[1]["id"], pprof_id.as_str());
    let uploaded = int(&profiles[1]["uploadedAt"]);
    assert!(uploaded >= before && uploaded <= before + 60_000, "{list}");
    assert_eq!(uploaded, int(&got["uploadedAt"]));

    // Diff of an upload with itself: one type both have, the ticks of both sides.
    let diff = ok(
        &router,
        "team-a",
        "Diff",
        json!({ "leftId": pprof_id, "rightId": pprof_id, "profileType": "cpu" }),
    )
    .await;
    assert_eq!(diff["profileTypes"], json!(["samples", "cpu"]));
    let fb = flamebearer(&diff);
    assert_eq!(fb["metadata"]["format"], "double");
    assert_eq!(int(&fb["leftTicks"]), cpu);
    assert_eq!(int(&fb["rightTicks"]), cpu);
    let (status, e) = call(
        &router,
        "team-a",
        "Diff",
        json!({ "leftId": pprof_id, "rightId": folded_id }),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "no type in common: {e}");

    // Another tenant: nothing listed, nothing found.
    let other = ok(&router, "team-b", "List", json!({})).await;
    assert!(
        other["profiles"].as_array().is_none_or(|p| p.is_empty()),
        "{other}"
    );
    let (status, e) = call(&router, "team-b", "Get", json!({ "id": pprof_id })).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{e}");
    assert_eq!(e["code"], "not_found");

    // Another process on the same object store (its own metastore) has them.
    let router = app(dir.path(), "meta-2.redb", toml::Table::new()).await;
    let list = ok(&router, "team-a", "List", json!({})).await;
    assert_eq!(list["profiles"].as_array().map(Vec::len), Some(2), "{list}");
    let got = ok(&router, "team-a", "Get", json!({ "id": folded_id })).await;
    assert_eq!(int(&flamebearer(&got)["flamebearer"]["numTicks"]), 8);
    let other = ok(&router, "team-b", "List", json!({})).await;
    assert!(
        other["profiles"].as_array().is_none_or(|p| p.is_empty()),
        "{other}"
    );
}

/// Bad uploads and ids are the client's mistakes (400, or 413 past the size limit), each with
/// a message; nothing is stored; past `max_adhoc_profiles` the oldest uploads go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_uploads_are_refused_and_uploads_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let mut limits = toml::Table::new();
    limits.insert("max_decompressed_bytes".into(), 4096.into());
    limits.insert("max_adhoc_profiles".into(), 3.into());
    let router = app(dir.path(), "meta.redb", limits).await;

    let refusals = [
        (json!({ "name": "x", "profile": "not base64!" }), "base64"),
        (json!({ "name": "x", "profile": "" }), "empty"),
        (
            upload_body("x.pb", &[0x0a, 0x05, 0x08, 0xff, 0xff, 0xff]),
            "pprof",
        ),
        (upload_body("x.txt", b"main;a three\n"), "folded"),
        (upload_body("x.json", b"{\"hello\": 1}"), "JSON"),
    ];
    for (body, why) in refusals {
        let (status, e) = call(&router, "team-a", "Upload", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{why}: {e}");
        assert_eq!(e["code"], "invalid_argument", "{why}");
        let message = e["message"].as_str().unwrap_or_default();
        assert!(message.contains(why), "{why}: {message}");
    }
    // Too large as uploaded, and too large once inflated.
    let big = "main;x 1\n".repeat(1000);
    let (status, e) = call(
        &router,
        "team-a",
        "Upload",
        upload_body("big.txt", big.as_bytes()),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{e}");
    assert_eq!(e["code"], "resource_exhausted");
    assert!(e["message"].as_str().unwrap().contains("4096"), "{e}");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(big.as_bytes()).unwrap();
    let (status, e) = call(
        &router,
        "team-a",
        "Upload",
        upload_body("big.gz", &gz.finish().unwrap()),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{e}");
    for (id, status) in [
        ("../../settings.json", StatusCode::BAD_REQUEST),
        ("", StatusCode::BAD_REQUEST),
        (
            "01ARZ3NDEKTSV4RRFFQ69G5FAV-never-uploaded",
            StatusCode::NOT_FOUND,
        ),
        ("not-an-upload", StatusCode::NOT_FOUND),
    ] {
        let (got, e) = call(&router, "team-a", "Get", json!({ "id": id })).await;
        assert_eq!(got, status, "{id:?}: {e}");
    }
    let list = ok(&router, "team-a", "List", json!({})).await;
    assert!(
        list["profiles"].as_array().is_none_or(|p| p.is_empty()),
        "{list}"
    );

    // Five uploads, three kept: the newest.
    let mut ids = Vec::new();
    for i in 0..5 {
        let up = ok(
            &router,
            "team-a",
            "Upload",
            upload_body(
                &format!("p{i}.txt"),
                format!("main;f{i} {}\n", i + 1).as_bytes(),
            ),
        )
        .await;
        ids.push(up["id"].as_str().unwrap().to_owned());
        // Distinct milliseconds, so "oldest" is well defined.
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    }
    let list = ok(&router, "team-a", "List", json!({})).await;
    let listed: Vec<&str> = list["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [&ids[4], &ids[3], &ids[2]], "{list}");
    let (status, _) = call(&router, "team-a", "Get", json!({ "id": ids[0] })).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Another tenant's uploads do not count against this one's.
    ok(
        &router,
        "team-b",
        "Upload",
        upload_body("b.txt", b"main 1\n"),
    )
    .await;
    let list = ok(&router, "team-a", "List", json!({})).await;
    assert_eq!(list["profiles"].as_array().map(Vec::len), Some(3));
}
