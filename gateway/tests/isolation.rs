//! Tenant isolation as a property: several tenants write random data whose every label value and
//! function name carries the tenant's mark; random queries on every query method, with every
//! tenant's token, never return another tenant's labels, values or functions.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use kiln_gateway::app::App;
use kiln_gateway::auth::{AuthMode, Authenticator, KeyStore, Scope};
use kiln_gateway::server::router;
use kiln_gateway::tenants::Tenants;
use kiln_proto::querier::v1 as q;
use kiln_proto::types::v1 as t;
use kiln_storage::{Storage, StorageConfig};
use proptest::prelude::*;
use prost::Message;
use tower::ServiceExt;

const TENANTS: [&str; 4] = ["alpha", "bravo", "charlie", "delta"];
const TYPES: [&str; 2] = [
    "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
    "memory:alloc_space:bytes::",
];

struct World {
    router: axum::Router,
    tokens: Vec<String>,
    _dir: tempfile::TempDir,
}

async fn send(
    router: &axum::Router,
    token: &str,
    path: &str,
    body: Vec<u8>,
) -> (StatusCode, Vec<u8>) {
    let content_type = if path.starts_with("/ingest") {
        "text/plain"
    } else {
        "application/proto"
    };
    let req = Request::post(path)
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", content_type)
        .body(Body::from(body))
        .unwrap();
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

async fn world(seed: u64) -> World {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    std::fs::write(
        keys.join("k.secret"),
        "isolation-property-test-secret-0123456789",
    )
    .unwrap();
    let mut config = StorageConfig::new(dir.path().join("data"));
    config.writer.flush_interval = std::time::Duration::from_millis(5);
    let storage = Storage::open(config).await.unwrap();
    let auth = Authenticator {
        mode: AuthMode::Jwt,
        keys: Some(KeyStore::open(&keys).unwrap()),
        issuer: None,
        audience: None,
        admin_tenant: None,
    };
    let router = router(Arc::new(App::new(storage, auth, Tenants::defaults())));
    let tokens: Vec<String> = TENANTS
        .iter()
        .map(|t| {
            kiln_gateway::auth::mint(
                &keys.join("k.secret"),
                "k",
                t,
                &[Scope::Read, Scope::Write],
                600,
                None,
                None,
            )
            .unwrap()
        })
        .collect();
    // Random data: every tenant writes services, label values and functions marked with its name.
    let mut rng = seed;
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    for (i, tenant) in TENANTS.iter().enumerate() {
        for p in 0..3 {
            let mut body = String::new();
            for _ in 0..(2 + next(5)) {
                let depth = 1 + next(4);
                let frames: Vec<String> = (0..depth)
                    .map(|d| format!("{tenant}_fn{}_{d}", next(6)))
                    .collect();
                body.push_str(&format!("{} {}\n", frames.join(";"), 1 + next(50)));
            }
            let suffix = if p % 2 == 0 { "cpu" } else { "alloc_space" };
            let path = format!(
                "/ingest?name={tenant}-svc{}.{suffix}%7Benv%3D{tenant}-env{},shared%3Dsame%7D&from={}",
                next(2),
                next(3),
                1_700_000_000 + next(1000)
            );
            let (status, text) = send(&router, &tokens[i], &path, body.into_bytes()).await;
            assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&text));
        }
    }
    World {
        router,
        tokens,
        _dir: dir,
    }
}

/// Every string of a response that could leak: label names and values, function names.
fn strings_of(method: u8, body: &[u8]) -> Vec<String> {
    match method {
        0 => q::ProfileTypesResponse::decode(body)
            .unwrap()
            .profile_types
            .into_iter()
            .map(|p| p.id)
            .collect(),
        1 => t::LabelNamesResponse::decode(body).unwrap().names,
        2 => t::LabelValuesResponse::decode(body).unwrap().names,
        3 => q::SeriesResponse::decode(body)
            .unwrap()
            .labels_set
            .into_iter()
            .flat_map(|l| l.labels)
            .flat_map(|p| [p.name, p.value])
            .collect(),
        4 => q::SelectMergeStacktracesResponse::decode(body)
            .unwrap()
            .flamegraph
            .map(|f| f.names)
            .unwrap_or_default(),
        5 => {
            let p = kiln_proto::google::v1::Profile::decode(body).unwrap();
            p.string_table
        }
        6 => q::SelectSeriesResponse::decode(body)
            .unwrap()
            .series
            .into_iter()
            .flat_map(|s| s.labels)
            .flat_map(|p| [p.name, p.value])
            .collect(),
        8 => q::SelectMergeStacktracesResponse::decode(body)
            .unwrap()
            .functions
            .map(|f| f.functions.into_iter().map(|f| f.name).collect())
            .unwrap_or_default(),
        9 => {
            let tree = q::SelectMergeStacktracesResponse::decode(body)
                .unwrap()
                .function_tree
                .unwrap_or_default();
            let mut names = Vec::new();
            let mut todo: Vec<t::CallTreeNode> =
                tree.callees.and_then(|c| c.root).into_iter().collect();
            while let Some(n) = todo.pop() {
                names.push(n.name);
                todo.extend(n.children);
            }
            names
        }
        _ => q::SelectMergeSpanProfileResponse::decode(body)
            .unwrap()
            .flamegraph
            .map(|f| f.names)
            .unwrap_or_default(),
    }
}

fn request(method: u8, ty: &str, selector: &str, label: &str) -> (&'static str, Vec<u8>) {
    let (start, end) = (1_699_999_000_000, 1_700_002_000_000);
    match method {
        0 => (
            "ProfileTypes",
            q::ProfileTypesRequest { start, end }.encode_to_vec(),
        ),
        1 => (
            "LabelNames",
            t::LabelNamesRequest {
                matchers: vec![selector.into()],
                start,
                end,
            }
            .encode_to_vec(),
        ),
        2 => (
            "LabelValues",
            t::LabelValuesRequest {
                name: label.into(),
                matchers: vec![selector.into()],
                start,
                end,
            }
            .encode_to_vec(),
        ),
        3 => (
            "Series",
            q::SeriesRequest {
                matchers: vec![selector.into()],
                label_names: vec![],
                start,
                end,
            }
            .encode_to_vec(),
        ),
        4 => (
            "SelectMergeStacktraces",
            q::SelectMergeStacktracesRequest {
                profile_type_id: ty.into(),
                label_selector: selector.into(),
                start,
                end,
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        5 => (
            "SelectMergeProfile",
            q::SelectMergeProfileRequest {
                profile_type_id: ty.into(),
                label_selector: selector.into(),
                start,
                end,
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        6 => (
            "SelectSeries",
            q::SelectSeriesRequest {
                profile_type_id: ty.into(),
                label_selector: selector.into(),
                start,
                end,
                step: 60.0,
                group_by: vec![label.into()],
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        8 | 9 => (
            "SelectMergeStacktraces",
            q::SelectMergeStacktracesRequest {
                profile_type_id: ty.into(),
                label_selector: selector.into(),
                start,
                end,
                format: if method == 8 {
                    q::ProfileFormat::Functions as i32
                } else {
                    q::ProfileFormat::FunctionTree as i32
                },
                format_options: Some(q::ProfileFormatOptions {
                    functions: None,
                    function_tree: Some(t::FunctionTreeOptions {
                        direction: t::FunctionTreeDirection::Callees as i32,
                        selection: t::FunctionTreeSelection::RootPath as i32,
                        max_depth: Some(8),
                    }),
                }),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        _ => (
            "SelectMergeSpanProfile",
            q::SelectMergeSpanProfileRequest {
                profile_type_id: ty.into(),
                label_selector: selector.into(),
                span_selector: vec!["0000000000000001".into()],
                start,
                end,
                ..Default::default()
            }
            .encode_to_vec(),
        ),
    }
}

/// One runtime and one world for every case: the storage's writer tasks live on the runtime.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Runtime::new().unwrap())
}

static WORLD: std::sync::OnceLock<World> = std::sync::OnceLock::new();

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn no_answer_crosses_tenants(
        caller in 0usize..TENANTS.len(),
        target in 0usize..TENANTS.len(),
        method in 0u8..10,
        ty in 0usize..TYPES.len(),
        op in 0u8..5,
        label in prop::sample::select(vec!["service_name", "env", "shared", "__name__", "__profile_type__"]),
    ) {
        let rt = runtime();
        let w = WORLD.get_or_init(|| rt.block_on(world(0x5eed_1234)));
        rt.block_on(async {
            // The selector aims at another tenant's data (or at everything).
            let target_name = TENANTS[target];
            let selector = match op {
                0 => "{}".to_string(),
                1 => format!("{{service_name=~\"{target_name}.*\"}}"),
                2 => format!("{{env=\"{target_name}-env1\"}}"),
                3 => format!("{{shared=\"same\",env!~\"{target_name}.*\"}}"),
                _ => format!("{{__profile_type__=\"{}\"}}", TYPES[ty]),
            };
            let (name, body) = request(method, TYPES[ty], &selector, label);
            let (status, resp) = send(&w.router, &w.tokens[caller], &format!("/querier.v1.QuerierService/{name}"), body).await;
            prop_assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&resp));
            let me = TENANTS[caller];
            let strings = strings_of(method, &resp);
            // Not a vacuous pass: unfiltered, a tenant sees its own marks.
            let sees_own = ([4, 8, 9].contains(&method) && ty == 0) || (method == 2 && label == "service_name");
            if op == 0 && sees_own {
                prop_assert!(strings.iter().any(|s| s.contains(me)), "{me} sees nothing of its own via {name}: {strings:?}");
            }
            for s in strings {
                for other in TENANTS.iter().filter(|t| **t != me) {
                    prop_assert!(!s.contains(other), "tenant {me} saw {s:?} of tenant {other} via {name} {selector}");
                }
            }
            Ok(())
        })?;
    }
}
