//! The Parca agent's write API against a served router: `Write` (the stack-id round trip and the
//! known-stack cache), `WriteArrow` and `WriteRaw` over gRPC and Connect, tenants and auth.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use kiln_gateway::app::App;
use kiln_gateway::auth::Authenticator;
use kiln_gateway::server::router;
use kiln_gateway::tenants::Tenants;
use kiln_otel::parca::testing::*;
use kiln_otel::parca::{StackId, read_unknown_ids};
use kiln_proto::parca::profilestore::v1alpha1 as pb;
use kiln_proto::parca::profilestore::v1alpha1::profile_store_service_client::ProfileStoreServiceClient;
use kiln_proto::querier::v1 as q;
use kiln_storage::{Storage, StorageConfig};
use prost::Message;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tower::ServiceExt;

const CPU: &str = "parca_agent:samples:count:cpu:nanoseconds";

struct Served {
    app: Arc<App>,
    router: axum::Router,
    client: ProfileStoreServiceClient<Channel>,
    _dir: tempfile::TempDir,
}

async fn serve() -> Served {
    let dir = tempfile::tempdir().unwrap();
    let mut config = StorageConfig::new(dir.path());
    config.writer.flush_interval = std::time::Duration::from_millis(10);
    let storage = Storage::open(config).await.unwrap();
    let app = Arc::new(App::new(
        storage,
        Authenticator::trusted_header(),
        Tenants::defaults(),
    ));
    let router = router(Arc::clone(&app));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(axum::serve(listener, router.clone()).into_future());
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    Served {
        app,
        router,
        client: ProfileStoreServiceClient::new(channel),
        _dir: dir,
    }
}

fn sample(comm: &str, thread: &str, stack: &[&str], value: i64) -> TestSample {
    TestSample {
        labels: vec![
            ("comm".into(), comm.into()),
            ("thread_id".into(), thread.into()),
        ],
        stack: stack.iter().map(|n| TestFrame::function(n)).collect(),
        value,
        timestamp: 1_700_000_000_000_000_000,
    }
}

/// Five rows over three stacks: `api` 5, `db` 12.
fn samples() -> Vec<TestSample> {
    vec![
        sample("api", "1", &["leaf", "main"], 1),
        sample("api", "2", &["leaf", "main"], 1),
        sample("api", "1", &["other", "main"], 3),
        sample("db", "9", &["leaf", "main"], 5),
        sample("db", "9", &["query", "db_main"], 7),
    ]
}

fn stacks() -> Vec<Vec<TestFrame>> {
    let mut out: Vec<Vec<TestFrame>> = Vec::new();
    for s in samples() {
        if !out.contains(&s.stack) {
            out.push(s.stack);
        }
    }
    out
}

fn with_tenant<T>(msg: T, tenant: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut()
        .insert("x-scope-orgid", tenant.parse().unwrap());
    req
}

/// One `Write` stream as the agent runs it; returns the ids asked for and the bytes of stack
/// bodies sent.
async fn write(served: &Served, tenant: &str) -> (Vec<StackId>, usize) {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(pb::WriteRequest {
        record: ipc(&v1_sample_record(&samples(), &TestType::default()), false).into(),
    })
    .await
    .unwrap();
    let mut client = served.client.clone();
    let mut inbound = client
        .write(with_tenant(ReceiverStream::new(rx), tenant))
        .await
        .unwrap()
        .into_inner();
    let mut asked = Vec::new();
    let mut sent = 0;
    if let Some(resp) = inbound.message().await.unwrap() {
        asked = read_unknown_ids(&resp.record).unwrap();
        let wanted: Vec<Vec<TestFrame>> = stacks()
            .into_iter()
            .filter(|s| asked.contains(&stack_id(s)))
            .collect();
        let record = ipc(&v1_locations_record(&wanted), false);
        sent = record.len();
        tx.send(pb::WriteRequest {
            record: record.into(),
        })
        .await
        .unwrap();
    }
    drop(tx);
    // The stream ends with OK once the profile is stored.
    if let Some(r) = inbound.message().await.unwrap() {
        panic!("an unexpected answer of {} bytes", r.record.len());
    }
    (asked, sent)
}

async fn send(router: &axum::Router, req: Request<Body>) -> (StatusCode, Vec<u8>) {
    let resp = router.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, body)
}

async fn total(router: &axum::Router, tenant: &str, profile_type: &str, selector: &str) -> i64 {
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
    q::SelectMergeStacktracesResponse::decode(body.as_slice())
        .unwrap()
        .flamegraph
        .map_or(0, |f| f.total)
}

async fn totals(router: &axum::Router, tenant: &str, profile_type: &str) -> (i64, i64) {
    (
        total(router, tenant, profile_type, r#"{comm="api"}"#).await,
        total(router, tenant, profile_type, r#"{comm="db"}"#).await,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parca_write_stream_sends_each_stack_once() {
    let served = serve().await;
    let (asked, sent) = write(&served, "team-a").await;
    assert_eq!(asked.len(), 3, "a new tenant's stacks are all asked for");
    assert!(sent > 0);
    let (asked, sent) = write(&served, "team-a").await;
    assert!(asked.is_empty(), "known stacks are not asked for again");
    assert_eq!(sent, 0, "the second upload transfers no stack bodies");
    // Another tenant's agent sends its own stacks: ids never cross tenants.
    let (asked, _) = write(&served, "team-b").await;
    assert_eq!(asked.len(), 3);

    assert_eq!(served.app.metrics.parca_stack_cache_hits.get(), 3);
    assert_eq!(served.app.metrics.parca_stack_cache_misses.get(), 6);
    assert_eq!(totals(&served.router, "team-a", CPU).await, (10, 24));
    assert_eq!(totals(&served.router, "team-b", CPU).await, (5, 12));
    assert_eq!(totals(&served.router, "team-c", CPU).await, (0, 0));
    let metrics = served.app.metrics.encode();
    assert!(
        metrics.contains("kiln_parca_stack_cache_hits_total 3"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parca_write_stream_asks_again_after_the_cache_forgot() {
    let served = serve().await;
    let (asked, _) = write(&served, "team-a").await;
    assert_eq!(asked.len(), 3);
    served.app.stacks.clear();
    let (asked, sent) = write(&served, "team-a").await;
    assert_eq!(asked.len(), 3, "evicted stacks are asked for again");
    assert!(sent > 0);
    assert_eq!(totals(&served.router, "team-a", CPU).await, (10, 24));
    // The flame graph has the stacks' frames, not placeholders.
    let req = q::SelectMergeStacktracesRequest {
        profile_type_id: CPU.into(),
        label_selector: r#"{comm="db"}"#.into(),
        start: 1_699_999_000_000,
        end: 1_700_001_000_000,
        ..Default::default()
    };
    let (_, body) = send(
        &served.router,
        Request::post("/querier.v1.QuerierService/SelectMergeStacktraces")
            .header("content-type", "application/proto")
            .header("x-scope-orgid", "team-a")
            .body(Body::from(req.encode_to_vec()))
            .unwrap(),
    )
    .await;
    let names = q::SelectMergeStacktracesResponse::decode(body.as_slice())
        .unwrap()
        .flamegraph
        .unwrap()
        .names;
    for n in ["main", "leaf", "db_main", "query"] {
        assert!(names.iter().any(|x| x == n), "{n} in {names:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parca_write_stream_refuses_missing_stacks() {
    let served = serve().await;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(pb::WriteRequest {
        record: ipc(&v1_sample_record(&samples(), &TestType::default()), false).into(),
    })
    .await
    .unwrap();
    let mut client = served.client.clone();
    let mut inbound = client
        .write(with_tenant(ReceiverStream::new(rx), "team-a"))
        .await
        .unwrap()
        .into_inner();
    assert!(inbound.message().await.unwrap().is_some());
    // Only one of the three stacks, then the end.
    let record = ipc(&v1_locations_record(&stacks()[..1]), false);
    tx.send(pb::WriteRequest {
        record: record.into(),
    })
    .await
    .unwrap();
    drop(tx);
    let err = loop {
        match inbound.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("accepted without the stacks"),
            Err(e) => break e,
        }
    };
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("did not send 2"),
        "{}",
        err.message()
    );
    assert_eq!(totals(&served.router, "team-a", CPU).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parca_write_stream_takes_only_the_stacks_it_asked_for() {
    let served = serve().await;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(pb::WriteRequest {
        record: ipc(&v1_sample_record(&samples(), &TestType::default()), false).into(),
    })
    .await
    .unwrap();
    let mut client = served.client.clone();
    let mut inbound = client
        .write(with_tenant(ReceiverStream::new(rx), "team-a"))
        .await
        .unwrap()
        .into_inner();
    let asked = read_unknown_ids(&inbound.message().await.unwrap().unwrap().record).unwrap();
    assert_eq!(asked.len(), 3);
    // The three stacks asked for, and one more that no sample names: it is left out, so a
    // stream cannot fill the tenant's stack cache (and the process's memory) with anything.
    let mut sent = stacks();
    sent.push(
        ["unasked", "main"]
            .iter()
            .map(|n| TestFrame::function(n))
            .collect(),
    );
    tx.send(pb::WriteRequest {
        record: ipc(&v1_locations_record(&sent), false).into(),
    })
    .await
    .unwrap();
    drop(tx);
    // The stream ends with OK once the profile is stored.
    if let Some(r) = inbound.message().await.unwrap() {
        panic!("an unexpected answer of {} bytes", r.record.len());
    }
    assert_eq!(totals(&served.router, "team-a", CPU).await, (5, 12));
    // The cache holds the three, as a stream that sent only them leaves it.
    let three = served.app.stacks.weighted_size();
    let other = serve().await;
    write(&other, "team-a").await;
    assert_eq!(three, other.app.stacks.weighted_size());
    let (asked, _) = write(&served, "team-a").await;
    assert!(asked.is_empty(), "all three known: {asked:?}");
    assert_eq!(totals(&served.router, "team-b", CPU).await, (0, 0));
}

/// A locations record may hold, beside the stacks asked for, stacks the samples name that this
/// process knows already: `kiln upload` sends the agent's recorded frames whole, and another
/// batch (perhaps through another process) taught this one some of their stacks. Those are
/// taken as known; the profile is stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parca_write_stream_takes_known_stacks_the_samples_name() {
    let served = serve().await;
    write(&served, "team-a").await;
    let mut more = samples();
    more.push(sample("api", "3", &["fresh", "main"], 2));
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(pb::WriteRequest {
        record: ipc(&v1_sample_record(&more, &TestType::default()), false).into(),
    })
    .await
    .unwrap();
    let mut client = served.client.clone();
    let mut inbound = client
        .write(with_tenant(ReceiverStream::new(rx), "team-a"))
        .await
        .unwrap()
        .into_inner();
    let asked = read_unknown_ids(&inbound.message().await.unwrap().unwrap().record).unwrap();
    assert_eq!(asked.len(), 1, "only the fresh stack");
    // Every stack the samples name, the known three among them.
    let all: Vec<Vec<TestFrame>> = more.iter().map(|s| s.stack.clone()).collect();
    tx.send(pb::WriteRequest {
        record: ipc(&v1_locations_record(&all), false).into(),
    })
    .await
    .unwrap();
    drop(tx);
    // The stream ends with OK once the profile is stored.
    if let Some(r) = inbound.message().await.unwrap() {
        panic!("an unexpected answer of {} bytes", r.record.len());
    }
    assert_eq!(
        totals(&served.router, "team-a", CPU).await,
        (2 * 5 + 2, 2 * 12)
    );
    assert_eq!(totals(&served.router, "team-b", CPU).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_id_is_a_batch_of_one_tenant_and_one_content() {
    let served = serve().await;
    let cpu = ipc(&v2_sample_record(&samples(), &TestType::default()), true);
    let memory = ipc(&v2_sample_record(&samples(), &memory_type()), true);
    let upload = |tenant: &'static str, batch: Vec<u8>| {
        let mut client = served.client.clone();
        async move {
            let mut req = with_tenant(
                pb::WriteArrowRequest {
                    ipc_buffer: batch.into(),
                },
                tenant,
            );
            req.metadata_mut()
                .insert("kiln-upload-id", "batch-1".parse().unwrap());
            client.write_arrow(req).await.unwrap();
        }
    };
    const MEMORY: &str = "memory:alloc_space:bytes:space:bytes";
    upload("team-a", cpu.clone()).await;
    // Sent again (a resumed upload): stored once.
    upload("team-a", cpu.clone()).await;
    assert_eq!(totals(&served.router, "team-a", CPU).await, (5, 12));
    // The same id with other content is another batch, stored.
    upload("team-a", memory.clone()).await;
    assert_eq!(totals(&served.router, "team-a", MEMORY).await, (5, 12));
    assert_eq!(totals(&served.router, "team-a", CPU).await, (5, 12));
    // Another tenant's batch of the same id and content is its own.
    upload("team-b", cpu.clone()).await;
    assert_eq!(totals(&served.router, "team-b", CPU).await, (5, 12));
    assert_eq!(totals(&served.router, "team-b", MEMORY).await, (0, 0));
    assert_eq!(totals(&served.router, "team-c", CPU).await, (0, 0));
}

fn memory_type() -> TestType {
    TestType {
        producer: "memory".into(),
        sample_type: "alloc_space".into(),
        sample_unit: "bytes".into(),
        period_type: "space".into(),
        period_unit: "bytes".into(),
        period: 512 * 1024,
        duration: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parca_write_arrow_over_grpc_and_connect() {
    let served = serve().await;
    let v2 = ipc(&v2_sample_record(&samples(), &TestType::default()), true);
    // gRPC, as the agent sends it (LZ4 IPC, stacks inline).
    let mut client = served.client.clone();
    client
        .write_arrow(with_tenant(
            pb::WriteArrowRequest {
                ipc_buffer: v2.clone().into(),
            },
            "grpc",
        ))
        .await
        .unwrap();
    // Connect, binary and JSON.
    let path = "/parca.profilestore.v1alpha1.ProfileStoreService/WriteArrow";
    let req = pb::WriteArrowRequest {
        ipc_buffer: v2.clone().into(),
    };
    let (status, body) = send(
        &served.router,
        Request::post(path)
            .header("content-type", "application/proto")
            .header("x-scope-orgid", "connect")
            .body(Body::from(req.encode_to_vec()))
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let json_req = pb::WriteArrowRequest {
        ipc_buffer: ipc(&v2_sample_record(&samples(), &memory_type()), false).into(),
    };
    let (status, body) = send(
        &served.router,
        Request::post(path)
            .header("content-type", "application/json")
            .header("x-scope-orgid", "json")
            .body(Body::from(serde_json::to_vec(&json_req).unwrap()))
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert_eq!(totals(&served.router, "grpc", CPU).await, (5, 12));
    assert_eq!(totals(&served.router, "connect", CPU).await, (5, 12));
    assert_eq!(
        totals(
            &served.router,
            "json",
            "memory:alloc_space:bytes:space:bytes"
        )
        .await,
        (5, 12)
    );
    assert_eq!(totals(&served.router, "json", CPU).await, (0, 0));
    assert_eq!(totals(&served.router, "nobody", CPU).await, (0, 0));

    // Bad input: a clear 400-class answer, never a panic.
    let mut client = served.client.clone();
    let err = client
        .write_arrow(with_tenant(
            pb::WriteArrowRequest {
                ipc_buffer: b"not arrow".to_vec().into(),
            },
            "grpc",
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    // No credentials: refused before anything is read.
    let err = client
        .write_arrow(tonic::Request::new(pb::WriteArrowRequest {
            ipc_buffer: v2.clone().into(),
        }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
    let (status, _) = send(
        &served.router,
        Request::post(path)
            .header("content-type", "application/proto")
            .body(Body::from(req.encode_to_vec()))
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

fn pprof(function: &str, value: i64) -> Vec<u8> {
    use kiln_proto::google::v1 as p;
    p::Profile {
        string_table: [
            "",
            "samples",
            "count",
            "cpu",
            "nanoseconds",
            "main",
            function,
        ]
        .map(String::from)
        .to_vec(),
        sample_type: vec![p::ValueType { r#type: 1, unit: 2 }],
        period_type: Some(p::ValueType { r#type: 3, unit: 4 }),
        period: 52_631_578,
        function: vec![
            p::Function {
                id: 1,
                name: 5,
                ..Default::default()
            },
            p::Function {
                id: 2,
                name: 6,
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
        duration_nanos: 10_000_000_000,
        ..Default::default()
    }
    .encode_to_vec()
}

fn write_raw_request(comm: &str, value: i64) -> pb::WriteRawRequest {
    pb::WriteRawRequest {
        series: vec![pb::RawProfileSeries {
            labels: Some(pb::LabelSet {
                labels: vec![
                    pb::Label {
                        name: "__name__".into(),
                        value: "parca_agent".into(),
                    },
                    pb::Label {
                        name: "comm".into(),
                        value: comm.into(),
                    },
                ],
            }),
            samples: vec![pb::RawSample {
                raw_profile: pprof("work", value).into(),
                executable_info: vec![],
            }],
        }],
        normalized: true,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parca_write_raw_over_grpc_and_connect() {
    let served = serve().await;
    let mut client = served.client.clone();
    client
        .write_raw(with_tenant(write_raw_request("api", 5), "grpc"))
        .await
        .unwrap();
    let path = "/parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw";
    let (status, body) = send(
        &served.router,
        Request::post(path)
            .header("content-type", "application/proto")
            .header("x-scope-orgid", "connect")
            .body(Body::from(write_raw_request("db", 12).encode_to_vec()))
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let (status, body) = send(
        &served.router,
        Request::post(path)
            .header("content-type", "application/json")
            .header("x-scope-orgid", "json")
            .body(Body::from(
                serde_json::to_vec(&write_raw_request("api", 7)).unwrap(),
            ))
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert_eq!(totals(&served.router, "grpc", CPU).await, (5, 0));
    assert_eq!(totals(&served.router, "connect", CPU).await, (0, 12));
    assert_eq!(totals(&served.router, "json", CPU).await, (7, 0));
    assert_eq!(totals(&served.router, "nobody", CPU).await, (0, 0));
    let err = client
        .write_raw(tonic::Request::new(write_raw_request("api", 1)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
}

/// A counter's value in the app's metrics (0 when it has no sample).
fn counter(app: &App, sample: &str) -> f64 {
    app.metrics
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(sample)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The telemetry layer counts every refusal once, by tenant and reason after authentication and
/// by reason before, whatever the transport: a gRPC unary call's trailers-only status, a gRPC
/// stream's status in its trailers, a Connect error, a plain HTTP error. Successes count none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_is_counted_once_whatever_the_transport() {
    let served = serve().await;
    let refused = |tenant: &str, reason: &str| {
        counter(
            &served.app,
            &format!(
                "kiln_tenant_refused_requests_total{{tenant=\"{tenant}\",reason=\"{reason}\"}}"
            ),
        )
    };
    let mut client = served.client.clone();
    // A success: nothing counted.
    write(&served, "team-a").await;
    assert_eq!(
        served
            .app
            .metrics
            .encode()
            .matches("kiln_tenant_refused_requests_total{")
            .count(),
        0
    );
    // gRPC unary: trailers-only.
    let err = client
        .write_arrow(with_tenant(
            pb::WriteArrowRequest {
                ipc_buffer: b"not arrow".to_vec().into(),
            },
            "team-a",
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(refused("team-a", "invalid"), 1.0);
    // A gRPC stream: the status comes in the trailers, after a message.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(pb::WriteRequest {
        record: ipc(&v1_sample_record(&samples(), &TestType::default()), false).into(),
    })
    .await
    .unwrap();
    let mut inbound = client
        .write(with_tenant(ReceiverStream::new(rx), "team-b"))
        .await
        .unwrap()
        .into_inner();
    assert!(inbound.message().await.unwrap().is_some());
    drop(tx);
    while inbound.message().await.is_ok_and(|m| m.is_some()) {}
    assert_eq!(refused("team-b", "invalid"), 1.0);
    assert_eq!(
        refused("team-a", "invalid"),
        1.0,
        "another tenant's refusal"
    );
    // Connect: an unsupported codec.
    let (status, _) = send(
        &served.router,
        Request::post("/parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw")
            .header("content-type", "text/xml")
            .header("x-scope-orgid", "team-a")
            .body(Body::from("<x/>"))
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(refused("team-a", "unsupported_media_type"), 1.0);
    // Plain HTTP: an unknown format.
    let (status, _) = send(
        &served.router,
        Request::post("/ingest?name=x&format=pdf")
            .header("x-scope-orgid", "team-a")
            .body(Body::from("x"))
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(refused("team-a", "invalid"), 2.0);
    // Before a tenant is known: by reason only, on each transport.
    let err = client
        .write_raw(tonic::Request::new(write_raw_request("x", 1)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    let (status, _) = send(
        &served.router,
        Request::post("/ingest?name=x")
            .body(Body::from("main 1\n"))
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let auth = |reason: &str| {
        counter(
            &served.app,
            &format!("kiln_auth_refusals_total{{reason=\"{reason}\"}}"),
        )
    };
    assert_eq!(auth("unauthenticated"), 2.0);
    // An admin call of a tenant without the admin scope.
    let (status, _) = send(
        &served.router,
        Request::get("/api/v1/tenants")
            .header("x-scope-orgid", "team-a")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(auth("forbidden"), 1.0);
    assert_eq!(refused("team-a", "forbidden"), 0.0);
}
