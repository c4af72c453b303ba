//! Input built to exhaust a decoder's stack: nested protobuf groups and messages, sent through
//! the router in process (a stack overflow here aborts the test binary, as it aborted the
//! server), and the decoders run on a thread of the runtime's stack size with the deepest input
//! each admits. The saved fuzz crashers of `../shared/fuzz-findings` are replayed when present.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use kiln_gateway::app::App;
use kiln_gateway::auth::Authenticator;
use kiln_gateway::server::lifecycle::THREAD_STACK_BYTES;
use kiln_gateway::server::router;
use kiln_gateway::tenants::Tenants;
use kiln_proto::google::v1 as pb;
use kiln_proto::wire::MAX_DEPTH;
use kiln_storage::{Storage, StorageConfig};
use prost::Message;
use tower::ServiceExt;

async fn app(dir: &std::path::Path) -> axum::Router {
    let mut config = StorageConfig::new(dir);
    config.writer.flush_interval = std::time::Duration::from_millis(10);
    let storage = Storage::open(config).await.unwrap();
    router(Arc::new(App::new(
        storage,
        Authenticator::trusted_header(),
        Tenants::defaults(),
    )))
}

async fn send(router: &axum::Router, req: Request<Body>) -> (StatusCode, String) {
    let resp = router.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// `n` start-group tags of field 100, which no message here defines (so prost skips the groups
/// by recursion), closed when `closed`.
fn nested_groups(n: usize, closed: bool) -> Vec<u8> {
    let mut out = [0xa3, 0x06].repeat(n);
    if closed {
        out.extend([0xa4, 0x06].repeat(n));
    }
    out
}

/// A length-delimited field `field` holding `inner`.
fn delimited(field: u32, inner: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    prost::encoding::encode_key(field, prost::encoding::WireType::LengthDelimited, &mut out);
    prost::encoding::encode_varint(inner.len() as u64, &mut out);
    out.extend_from_slice(inner);
    out
}

/// An OTLP export request whose resource has one attribute: an `AnyValue` holding arrays nested
/// `levels` deep around a string (two messages a level: `AnyValue.array_value`,
/// `ArrayValue.values`), written by hand so that building it does not recurse.
fn otlp_nested_any_value(levels: usize) -> Vec<u8> {
    let mut value = delimited(1, b"x"); // AnyValue.string_value
    for _ in 0..levels {
        value = delimited(5, &delimited(1, &value)); // AnyValue.array_value(ArrayValue.values)
    }
    let key_value = [delimited(1, b"deep"), delimited(2, &value)].concat();
    let resource = delimited(1, &key_value); // Resource.attributes
    let resource_profiles = delimited(1, &resource); // ResourceProfiles.resource
    // ExportProfilesServiceRequest.resource_profiles and an empty dictionary.
    [delimited(1, &resource_profiles), delimited(2, b"")].concat()
}

/// A small valid pprof with `suffix` appended (protobuf fields may follow in any order).
fn pprof_with(suffix: &[u8]) -> Vec<u8> {
    let mut bytes = pb::Profile {
        string_table: ["", "cpu", "nanoseconds", "main"]
            .map(String::from)
            .to_vec(),
        sample_type: vec![pb::ValueType { r#type: 1, unit: 2 }],
        function: vec![pb::Function {
            id: 1,
            name: 3,
            ..Default::default()
        }],
        location: vec![pb::Location {
            id: 1,
            line: vec![pb::Line {
                function_id: 1,
                line: 1,
            }],
            ..Default::default()
        }],
        sample: vec![pb::Sample {
            location_id: vec![1],
            value: vec![10],
            label: vec![],
        }],
        time_nanos: 1_700_000_000_000_000_000,
        ..Default::default()
    }
    .encode_to_vec();
    bytes.extend_from_slice(suffix);
    bytes
}

fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

/// prost's own recursion limit is on: it fails when a dependency switches on prost's
/// `no-recursion-limit` feature (Cargo unifies features across the build), as `pprof_util` did.
#[test]
fn prost_keeps_its_recursion_limit() {
    let err = pb::Profile::decode(pprof_with(&nested_groups(150, true)).as_slice()).unwrap_err();
    assert!(err.to_string().contains("recursion limit"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_protobuf_is_refused_with_400_on_every_write_api() {
    let dir = tempfile::tempdir().unwrap();
    let router = app(dir.path()).await;
    let deep_groups = nested_groups(100_000, true);
    let unclosed = nested_groups(100_000, false);
    let cases: Vec<(&str, &str, &str, Option<&str>, Vec<u8>)> = vec![
        (
            "pprof, groups",
            "/ingest?name=deep&format=pprof",
            "application/octet-stream",
            None,
            pprof_with(&deep_groups),
        ),
        (
            "pprof gzip, unclosed groups",
            "/ingest?name=deep&format=pprof",
            "application/octet-stream",
            None,
            gzip(&pprof_with(&unclosed)),
        ),
        (
            "OTLP, groups",
            "/v1development/profiles",
            "application/x-protobuf",
            None,
            deep_groups.clone(),
        ),
        (
            "OTLP gzip, unclosed groups",
            "/v1development/profiles",
            "application/x-protobuf",
            Some("gzip"),
            gzip(&unclosed),
        ),
        (
            "OTLP, AnyValue arrays 1000 deep",
            "/v1development/profiles",
            "application/x-protobuf",
            None,
            otlp_nested_any_value(1000),
        ),
        (
            "OTLP, AnyValue arrays 50 deep",
            "/v1development/profiles",
            "application/x-protobuf",
            None,
            otlp_nested_any_value(50),
        ),
        (
            "push.v1 Connect, groups",
            "/push.v1.PusherService/Push",
            "application/proto",
            None,
            deep_groups.clone(),
        ),
        (
            "querier Connect, groups",
            "/querier.v1.QuerierService/LabelNames",
            "application/proto",
            None,
            deep_groups.clone(),
        ),
    ];
    for (what, path, content_type, encoding, body) in cases {
        let mut req = Request::post(path)
            .header("content-type", content_type)
            .header("x-scope-orgid", "team-a");
        if let Some(e) = encoding {
            req = req.header("content-encoding", e);
        }
        let (status, body) = send(&router, req.body(Body::from(body)).unwrap()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{what}: {body}");
        assert!(
            body.contains(&format!("deeper than {MAX_DEPTH} levels")),
            "{what}: {body}"
        );
    }
    // Within the limit, the same shapes are read: unknown groups are skipped, as protobuf does.
    let (status, body) = send(
        &router,
        Request::post("/ingest?name=shallow&format=pprof")
            .header("x-scope-orgid", "team-a")
            .body(Body::from(pprof_with(&nested_groups(8, true))))
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = send(
        &router,
        Request::post("/v1development/profiles")
            .header("content-type", "application/x-protobuf")
            .header("x-scope-orgid", "team-a")
            .body(Body::from(otlp_nested_any_value(4)))
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// The deepest input each decoder admits, decoded on a thread with the runtime's stack (debug
/// builds use more stack than release ones, so this holds with margin where it runs in CI).
#[test]
fn the_deepest_admitted_input_fits_the_runtime_stack() {
    let run = std::thread::Builder::new()
        .stack_size(THREAD_STACK_BYTES)
        .spawn(|| {
            // pprof: unknown groups at the limit, which prost skips by recursion.
            let bytes = pprof_with(&nested_groups(MAX_DEPTH, true));
            let p = kiln_otel::pprof::decode(&bytes, 1 << 20).unwrap();
            assert_eq!(p.sample.len(), 1);
            // OTLP: attribute values as deep as the check admits, decoded and converted.
            let levels = (0..100)
                .rev()
                .find(|&l| {
                    kiln_proto::wire::check_depth(&otlp_nested_any_value(l), MAX_DEPTH).is_ok()
                })
                .unwrap();
            assert!(levels >= 10, "{levels}");
            let req =
                kiln_gateway::api::otlp::decode_request(&otlp_nested_any_value(levels)).unwrap();
            let limits = kiln_otel::normalize::NormalizeLimits::default();
            kiln_otel::otlp::convert(&req, 1_700_000_000_000_000_000, &limits).unwrap();
            drop(req);
            // A sandwich as deep as a response may be: encoded, serialized and dropped by
            // recursion on the async worker that answers.
            let mut node = kiln_proto::querier::v1::SandwichNode::default();
            for _ in 0..=kiln_storage::query::functions::MAX_SANDWICH_DEPTH {
                node = kiln_proto::querier::v1::SandwichNode {
                    total: 1,
                    children: vec![node],
                    ..Default::default()
                };
            }
            let report = kiln_proto::querier::v1::SandwichReport {
                callees: Some(node),
                ..Default::default()
            };
            assert!(!report.encode_to_vec().is_empty());
            assert!(!serde_json::to_vec(&report).unwrap().is_empty());
            drop(report);
        })
        .unwrap();
    run.join().unwrap();
}

/// The crashers the fuzzer saved (`../shared/fuzz-findings`: a body and a note of its path and
/// headers each), replayed in sequence through one router: each is answered with a 4xx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saved_fuzz_crashers_are_answered_not_fatal() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fuzz-findings");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        kiln_otel::skip::shared_absent(&dir);
        return;
    };
    let mut notes: Vec<_> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    notes.sort();
    assert!(!notes.is_empty());
    let data = tempfile::tempdir().unwrap();
    let router = app(data.path()).await;
    for note in &notes {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(note).unwrap()).unwrap();
        let body = std::fs::read(note.with_extension("bin")).unwrap();
        let mut req = Request::post(v["path"].as_str().unwrap()).header("x-scope-orgid", "fuzz");
        for (k, value) in v["headers"].as_object().unwrap() {
            req = req.header(k.as_str(), value.as_str().unwrap());
        }
        let (status, answer) = send(&router, req.body(Body::from(body)).unwrap()).await;
        assert!(
            status.is_success() || status.is_client_error(),
            "{}: {status} {answer}",
            note.display()
        );
    }
}
