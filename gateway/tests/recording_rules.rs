//! `settings.v1.RecordingRulesService` in process: rules made, listed, replaced and deleted as
//! the Profiles Drilldown app and Pyroscope's clients do it (Connect JSON and gRPC), kept per
//! tenant across a restart and erased with the tenant; provisioned rules from the tenant file
//! read-only; bad rules refused with what is wrong, changing nothing. Their evaluation against a
//! real Prometheus is the e2e test `recording_rules`.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use kiln_gateway::app::App;
use kiln_gateway::auth::Authenticator;
use kiln_gateway::server::router;
use kiln_gateway::tenants::Tenants;
use kiln_proto::settings::v1 as pb;
use kiln_storage::{Storage, StorageConfig};
use serde_json::{Value, json};
use tower::ServiceExt;

const OPERATOR: &str = "ops";
const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
const RR: &str = "/settings.v1.RecordingRulesService";

/// The tenant file: two rules per tenant at most, one rule provisioned for team-a.
const TENANTS: &str = r#"
[defaults]
max_recording_rules = 2

[tenants.team-a]
recording_rules = [
  { metric_name = "profiles_recorded_fleet_cpu", matchers = ['{__profile_type__="process_cpu:cpu:nanoseconds:cpu:nanoseconds"}'], group_by = ["service_name"] },
]
"#;

async fn app(dir: &std::path::Path) -> Arc<App> {
    let tenants_file = dir.join("tenants.toml");
    std::fs::write(&tenants_file, TENANTS).unwrap();
    let tenants = Tenants::load(Some(&tenants_file), toml::Table::new()).unwrap();
    let mut config = StorageConfig::new(dir.join("data"));
    config.writer.flush_interval = std::time::Duration::from_millis(10);
    let storage = Storage::open(config).await.unwrap();
    let mut auth = Authenticator::trusted_header();
    auth.admin_tenant = Some(OPERATOR.into());
    Arc::new(App::new(storage, auth, tenants))
}

async fn call(
    router: &axum::Router,
    tenant: &str,
    method: &str,
    body: Value,
) -> (StatusCode, Value) {
    let resp = router
        .clone()
        .oneshot(
            Request::post(format!("{RR}/{method}"))
                .header("content-type", "application/json")
                .header("x-scope-orgid", tenant)
                .body(Body::from(body.to_string()))
                .unwrap(),
        )
        .await
        .unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap_or_default())
}

async fn list(router: &axum::Router, tenant: &str) -> Value {
    let (status, v) = call(router, tenant, "ListRecordingRules", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v
}

/// The body the Drilldown app sends for "create metric" with a function (protobuf-es adds
/// `$typeName`, and the enum is a number).
fn app_rule(name: &str, service: &str) -> Value {
    json!({
        "metricName": format!("profiles_recorded_{name}"),
        "matchers": [format!("{{ service_name=\"{service}\" }}"), format!("{{ __profile_type__=\"{CPU}\"}}")],
        "groupBy": ["pod"],
        "stacktraceFilter": {
            "$typeName": "settings.v1.StacktraceFilter",
            "functionName": {
                "$typeName": "settings.v1.StacktraceFilterFunctionName",
                "functionName": "runtime.mallocgc",
                "metricType": 0
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_are_kept_per_tenant_as_pyroscope_answers() {
    let dir = tempfile::tempdir().unwrap();
    let first = app(dir.path()).await;
    let router = router(Arc::clone(&first));

    // Provisioned first, read-only, with a stable id.
    let before = list(&router, "team-a").await;
    let provisioned = &before["rules"][0];
    assert_eq!(provisioned["provisioned"], true, "{before}");
    assert_eq!(provisioned["profileType"], CPU);
    let provisioned_id = provisioned["id"].as_str().unwrap().to_owned();
    assert!(provisioned_id.len() == 10 && provisioned_id.bytes().all(|b| b.is_ascii_alphabetic()));
    // Another tenant has none of team-a's.
    assert_eq!(list(&router, "team-b").await, json!({}));

    // Made as the app makes it: an id of ten letters, generation 1, matchers as sent.
    let (status, made) = call(
        &router,
        "team-a",
        "UpsertRecordingRule",
        app_rule("checkout_malloc", "checkout"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{made}");
    let rule = &made["rule"];
    let id = rule["id"].as_str().unwrap().to_owned();
    assert!(
        id.len() == 10 && id.bytes().all(|b| b.is_ascii_alphabetic()),
        "{id}"
    );
    assert_eq!(rule["generation"], "1");
    assert_eq!(rule["matchers"][0], "{ service_name=\"checkout\" }");
    assert_eq!(
        rule["stacktraceFilter"]["functionName"]["functionName"],
        "runtime.mallocgc"
    );
    let (status, got) = call(&router, "team-a", "GetRecordingRule", json!({"id": id})).await;
    assert_eq!((status, &got["rule"]), (StatusCode::OK, rule), "{got}");
    let (status, _) = call(&router, "team-b", "GetRecordingRule", json!({"id": id})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "team-b reads team-a's rule");
    let (status, _) = call(&router, "team-b", "DeleteRecordingRule", json!({"id": id})).await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "team-b deletes team-a's rule"
    );

    // Replaced with the generation it read; a stale generation is a conflict.
    let mut change = app_rule("checkout_malloc", "checkout");
    change["id"] = json!(id);
    change["generation"] = json!("1");
    change["groupBy"] = json!(["pod", "region"]);
    let (status, v) = call(&router, "team-a", "UpsertRecordingRule", change.clone()).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["rule"]["generation"], "2");
    let now = list(&router, "team-a").await;
    let (status, v) = call(&router, "team-a", "UpsertRecordingRule", change).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["code"], "already_exists");
    assert_eq!(
        list(&router, "team-a").await,
        now,
        "a refused change changed something"
    );

    // Bad rules: refused with what is wrong, nothing changed.
    let mut bad: Vec<(&str, Value, StatusCode)> = Vec::new();
    let mut r = app_rule("x", "checkout");
    r["matchers"][0] = json!("{ service_name= }");
    bad.push(("invalid matcher", r, StatusCode::BAD_REQUEST));
    let mut r = app_rule("x", "checkout");
    r["groupBy"] = json!(["__tenant__"]);
    bad.push(("is unknown", r, StatusCode::BAD_REQUEST));
    let mut r = app_rule("x", "checkout");
    r["metricName"] = json!("profiles_recorded_cpu-usage");
    bad.push((
        "not a valid Prometheus metric name",
        r,
        StatusCode::BAD_REQUEST,
    ));
    let mut r = app_rule("x", "checkout");
    r["metricName"] = json!("cpu_usage");
    bad.push((
        "must start with profiles_recorded_",
        r,
        StatusCode::BAD_REQUEST,
    ));
    let mut r = app_rule("x", "checkout");
    r["matchers"] = json!(["{ service_name=\"checkout\" }"]);
    bad.push(("__profile_type__", r, StatusCode::BAD_REQUEST));
    let mut r = app_rule("x", "checkout");
    r["groupBy"] = json!(["pod-name"]);
    bad.push((
        "not a valid Prometheus label name",
        r,
        StatusCode::BAD_REQUEST,
    ));
    let mut r = app_rule("x", "checkout");
    r["groupBy"] = json!(["profiles_rule_id"]);
    bad.push(("a label Kiln sets", r, StatusCode::BAD_REQUEST));
    let mut r = app_rule("x", "checkout");
    r["id"] = json!(provisioned_id);
    bad.push(("provisioned", r, StatusCode::BAD_REQUEST));
    for (want, body, code) in bad {
        let (status, v) = call(&router, "team-a", "UpsertRecordingRule", body).await;
        assert_eq!(status, code, "{want}: {v}");
        assert!(
            v["message"].as_str().unwrap_or("").contains(want),
            "{want}: {v}"
        );
        assert_eq!(
            list(&router, "team-a").await,
            now,
            "{want} changed something"
        );
    }
    let (status, v) = call(
        &router,
        "team-a",
        "DeleteRecordingRule",
        json!({"id": provisioned_id}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");

    // The cap (2) counts the rules made through the API, per tenant.
    let (status, v) = call(
        &router,
        "team-a",
        "UpsertRecordingRule",
        app_rule("second", "web"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let full = list(&router, "team-a").await;
    let (status, v) = call(
        &router,
        "team-a",
        "UpsertRecordingRule",
        app_rule("third", "web"),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("max_recording_rules"),
        "{v}"
    );
    assert_eq!(list(&router, "team-a").await, full);
    for name in ["one", "two"] {
        let (status, v) = call(
            &router,
            "team-b",
            "UpsertRecordingRule",
            app_rule(name, "web"),
        )
        .await;
        assert_eq!(
            status,
            StatusCode::OK,
            "team-a's rules count against team-b: {v}"
        );
    }

    // Kept across a restart (a new app on the same data).
    drop(router);
    first.storage.close().await;
    drop(first);
    let second = app(dir.path()).await;
    let router = kiln_gateway::server::router(Arc::clone(&second));
    assert_eq!(list(&router, "team-a").await, full);

    // Deleted: gone, and a second delete is a 404.
    let (status, _) = call(&router, "team-a", "DeleteRecordingRule", json!({"id": id})).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = call(&router, "team-a", "DeleteRecordingRule", json!({"id": id})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        list(&router, "team-a").await["rules"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    // Erased with the tenant (what `DELETE /api/v1/tenants/team-b` does; trusted-header
    // callers have no admin scope): team-b's rules go, team-a's stay.
    second.storage.delete_tenant("team-b").await.unwrap();
    second.recording.forget("team-b");
    assert_eq!(list(&router, "team-b").await, json!({}));
    assert_eq!(
        list(&router, "team-a").await["rules"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

fn with_tenant<T>(msg: T, tenant: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut()
        .insert("x-scope-orgid", tenant.parse().unwrap());
    req
}

/// The same service over gRPC, as Pyroscope's Go clients call it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_over_grpc() {
    use pb::recording_rules_service_client::RecordingRulesServiceClient;
    let dir = tempfile::tempdir().unwrap();
    let app = app(dir.path()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(axum::serve(listener, router(app)).into_future());
    let mut client = RecordingRulesServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let made = client
        .upsert_recording_rule(with_tenant(
            pb::UpsertRecordingRuleRequest {
                metric_name: "profiles_recorded_api_cpu".into(),
                matchers: vec![format!(
                    "{{__profile_type__=\"{CPU}\", service_name=\"api\"}}"
                )],
                group_by: vec!["pod".into()],
                ..Default::default()
            },
            "team-c",
        ))
        .await
        .unwrap()
        .into_inner()
        .rule
        .unwrap();
    assert_eq!(made.profile_type, CPU);
    let listed = client
        .list_recording_rules(with_tenant(pb::ListRecordingRulesRequest {}, "team-c"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.rules, vec![made.clone()]);
    let err = client
        .upsert_recording_rule(with_tenant(
            pb::UpsertRecordingRuleRequest {
                id: made.id.clone(),
                generation: 7,
                metric_name: "profiles_recorded_api_cpu".into(),
                matchers: made.matchers.clone(),
                ..Default::default()
            },
            "team-c",
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::AlreadyExists, "{err}");
    let other = client
        .list_recording_rules(with_tenant(pb::ListRecordingRulesRequest {}, "team-d"))
        .await
        .unwrap()
        .into_inner();
    assert!(other.rules.is_empty());
}

/// An app whose rules seal every second, at once.
async fn fast_app(dir: &std::path::Path) -> Arc<App> {
    let mut config = StorageConfig::new(dir.join("data"));
    config.writer.flush_interval = std::time::Duration::from_millis(10);
    let storage = Storage::open(config).await.unwrap();
    let recording = kiln_gateway::recording::Recording::new(
        kiln_gateway::recording::RecordingConfig {
            interval: std::time::Duration::from_secs(1),
            delay: std::time::Duration::ZERO,
            remote_write_url: None,
            backfill: std::time::Duration::ZERO,
        },
        None,
    );
    let symbolizer = kiln_symbolize::SymbolizerConfig::without_debuginfod(storage.data_dir());
    Arc::new(
        App::with_symbolizer(
            storage,
            Authenticator::trusted_header(),
            Tenants::defaults(),
            symbolizer,
            kiln_gateway::app::DEFAULT_SYMBOLIZE_DEADLINE,
            recording,
        )
        .unwrap(),
    )
}

/// `/ingest` of folded stacks at `secs` for `pod` of service `shop`.
async fn ingest(router: &axum::Router, tenant: &str, pod: &str, secs: i64, text: &str) {
    let resp = router
        .clone()
        .oneshot(
            Request::post(format!(
                "/ingest?name=shop.cpu%7Bpod%3D{pod}%7D&from={secs}&format=folded"
            ))
            .header("x-scope-orgid", tenant)
            .body(Body::from(text.to_owned()))
            .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
}

/// The tenant's counters on the pull endpoint: (labels, value, time).
async fn counters(app: &Arc<App>, tenant: &str) -> Vec<(String, i64, i64)> {
    let text = app
        .recording
        .exposition(&app.storage, &app.tenants, tenant)
        .await
        .unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let mut parts = l.rsplitn(3, ' ');
            let time = parts.next().unwrap().parse().unwrap();
            let value: f64 = parts.next().unwrap().parse().unwrap();
            (parts.next().unwrap().to_owned(), value as i64, time)
        })
        .collect()
}

/// Exactly once across a restart: a late profile's sums (its interval sealed before it came)
/// are kept before it is acknowledged, and the open intervals' sums are read back from storage,
/// so a new process on the same data seals the same totals — nothing lost, nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_and_open_sums_survive_a_restart() {
    const TICK: i64 = 10_000_000;
    let dir = tempfile::tempdir().unwrap();
    let first = fast_app(dir.path()).await;
    let router = router(Arc::clone(&first));
    let rule = json!({
        "metricName": "profiles_recorded_shop_cpu",
        "matchers": [format!("{{service_name=\"shop\", __profile_type__=\"{CPU}\"}}")],
        "groupBy": ["pod"],
    });
    let (status, v) = call(&router, "team-a", "UpsertRecordingRule", rule).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    // Late: an hour old, long sealed. On time: now.
    ingest(&router, "team-a", "p1", now - 3600, "main;work 5\n").await;
    ingest(&router, "team-a", "p1", now, "main;work 2\n").await;
    ingest(&router, "team-a", "p2", now, "main;work 1\n").await;
    ingest(&router, "team-b", "p1", now, "main;work 100\n").await;
    // Killed before anything was sealed: nothing of the state in memory survives.
    drop(router);
    first.storage.close().await;
    drop(first);

    let second = fast_app(dir.path()).await;
    second
        .recording
        .load_all(&second.storage, &second.tenants)
        .await;
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    second
        .recording
        .seal_due(&second.storage, &second.tenants)
        .await;
    let mut got: Vec<(String, i64)> = counters(&second, "team-a")
        .await
        .into_iter()
        .map(|(labels, value, _)| (labels, value))
        .collect();
    got.sort();
    let series = |pod: &str| format!("profiles_recorded_shop_cpu{{pod=\"{pod}\",");
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got[0].0.starts_with(&series("p1")), "{got:?}");
    assert_eq!(
        got[0].1,
        7 * TICK,
        "p1: the late 5 and the open 2, once each"
    );
    assert!(got[1].0.starts_with(&series("p2")), "{got:?}");
    assert_eq!(got[1].1, TICK);
    // team-b has no rules, and its profiles feed none of team-a's; it keeps no state document.
    assert!(counters(&second, "team-b").await.is_empty());
    second
        .recording
        .seal_due(&second.storage, &second.tenants)
        .await;
    assert_eq!(
        second
            .storage
            .tenant_document("team-b", kiln_gateway::recording::STATE_DOCUMENT)
            .await
            .unwrap(),
        None
    );
}

/// A rule made with `Kiln-Backfill` starts from what the stored profiles of that range hold; one
/// made without it (here `--recording-backfill 0s`) starts from nothing; a backfill past 7 days
/// is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_made_with_a_backfill_counts_the_stored_past() {
    const TICK: i64 = 10_000_000;
    let dir = tempfile::tempdir().unwrap();
    let app = fast_app(dir.path()).await;
    let router = router(Arc::clone(&app));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    ingest(&router, "team-a", "p1", now - 3600, "main;work 5\n").await;
    ingest(&router, "team-a", "p1", now - 5 * 3600, "main;work 9\n").await;
    let upsert = |name: &str, backfill: Option<&str>| {
        let mut req = Request::post(format!("{RR}/UpsertRecordingRule"))
            .header("content-type", "application/json")
            .header("x-scope-orgid", "team-a");
        if let Some(b) = backfill {
            req = req.header("kiln-backfill", b);
        }
        req.body(Body::from(
            json!({
                "metricName": format!("profiles_recorded_{name}"),
                "matchers": [format!("{{service_name=\"shop\", __profile_type__=\"{CPU}\"}}")],
            })
            .to_string(),
        ))
        .unwrap()
    };
    for (name, backfill, want) in [
        ("two_hours", Some("2h"), StatusCode::OK),
        ("none", None, StatusCode::OK),
        ("too_far", Some("8d"), StatusCode::BAD_REQUEST),
    ] {
        let resp = router
            .clone()
            .oneshot(upsert(name, backfill))
            .await
            .unwrap();
        assert_eq!(resp.status(), want, "{name}");
    }
    let got = counters(&app, "team-a").await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].0.starts_with("profiles_recorded_two_hours{"),
        "{got:?}"
    );
    assert_eq!(
        got[0].1,
        5 * TICK,
        "the hour-old profile, not the five-hour-old one"
    );
    let listed = list(&router, "team-a").await;
    assert_eq!(listed["rules"].as_array().unwrap().len(), 2, "{listed}");
}

/// A new rule's backfill is read while the tenant's writes go on: a write made during it is
/// acknowledged at once, and the rule still counts every stored profile once. A write older
/// than the backfill's end, made meanwhile, has the backfill read again under the gate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_does_not_hold_the_tenants_writes_back() {
    const TICK: i64 = 10_000_000;
    let dir = tempfile::tempdir().unwrap();
    let app = fast_app(dir.path()).await;
    let router = router(Arc::clone(&app));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let upsert = |name: &str, backfill: &str| {
        Request::post(format!("{RR}/UpsertRecordingRule"))
            .header("content-type", "application/json")
            .header("x-scope-orgid", "team-a")
            .header("kiln-backfill", backfill)
            .body(Body::from(
                json!({
                    "metricName": format!("profiles_recorded_{name}"),
                    "matchers": [format!("{{service_name=\"shop\", __profile_type__=\"{CPU}\"}}")],
                })
                .to_string(),
            ))
            .unwrap()
    };
    // A first rule loads the tenant's state; backfills of a loaded state are read ahead.
    let resp = router.clone().oneshot(upsert("first", "0s")).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    ingest(&router, "team-a", "p1", now - 1800, "main;work 5\n").await;
    ingest(&router, "team-b", "p1", now - 1800, "main;work 100\n").await;

    // (rule, the write made during its backfill: its time and value, backfills read again).
    // The on-time write is ahead of the grid's start, which no seal moves on meanwhile.
    for (name, at, value, reread) in [("on_time", now + 2, 2, 0), ("late", now - 1200, 3, 1)] {
        let hold = app.recording.read_ahead_pause.release.write().await;
        let made = tokio::spawn(router.clone().oneshot(upsert(name, "1h")));
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            app.recording.read_ahead_pause.reached.notified(),
        )
        .await
        .expect("the backfill is read ahead");
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            ingest(&router, "team-a", "p1", at, &format!("main;work {value}\n")),
        )
        .await
        .expect("a write is not held back by a backfill");
        assert!(
            !made.is_finished(),
            "{name}: the backfill is still being read"
        );
        drop(hold);
        let resp = made.await.unwrap().unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{name}");
        assert_eq!(
            app.recording
                .stats
                .backfills_reread
                .load(std::sync::atomic::Ordering::Relaxed),
            reread,
            "{name}"
        );
    }
    // Sealed past the on-time write.
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let due = std::time::Duration::from_secs((now + 4) as u64);
    tokio::time::sleep(due.saturating_sub(wall)).await;
    app.recording.seal_due(&app.storage, &app.tenants).await;
    let got = counters(&app, "team-a").await;
    let value = |name: &str| {
        got.iter()
            .find(|(labels, _, _)| labels.starts_with(&format!("profiles_recorded_{name}{{")))
            .map(|&(_, v, _)| v)
    };
    // Every profile once: 5 stored before, 2 on time, 3 twenty minutes old. The new rules
    // count the past from their backfills, the first rule as late sums carried.
    for name in ["first", "on_time", "late"] {
        assert_eq!(value(name), Some(10 * TICK), "{name}: {got:?}");
    }
    assert!(counters(&app, "team-b").await.is_empty());
}
