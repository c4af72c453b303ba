//! Kiln's own traces (`--otlp-traces-endpoint`): a collector receives a span per API call, named
//! by its method (tracing's `request` span), with its method, transport, tenant and status, and the stages of the request under it
//! (`ingest.decode`, `storage.write`, `query.*`), plus the writer's `storage.flush`; the
//! resource is `service.name=kiln`, the service name of Kiln's own profiles.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use kiln_e2e::{Kiln, free_port};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;

/// A span as received, with the service of its resource.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    span: Span,
}

impl Received {
    fn attr(&self, key: &str) -> Option<String> {
        attribute(&self.span.attributes, key)
    }

    /// An API call's span: a root, named by its method.
    fn is_request(&self) -> bool {
        self.span.parent_span_id.is_empty()
            && self.attr("method").is_some_and(|m| m == self.span.name)
    }
}

fn attribute(kvs: &[KeyValue], key: &str) -> Option<String> {
    kvs.iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
        .map(|v| match v {
            Value::StringValue(s) => s.clone(),
            Value::IntValue(i) => i.to_string(),
            other => format!("{other:?}"),
        })
}

/// An OTLP trace collector on a loopback port, keeping what it receives.
#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<Received>>>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.0.lock().expect("collector lock");
        for rs in request.into_inner().resource_spans {
            let service = rs
                .resource
                .as_ref()
                .and_then(|r| attribute(&r.attributes, "service.name"))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                spans.extend(ss.spans.into_iter().map(|span| Received {
                    service: service.clone(),
                    span,
                }));
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn start_collector() -> Result<(Collector, u16, tokio::runtime::Runtime)> {
    let collector = Collector::default();
    let port = free_port();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let service = TraceServiceServer::new(collector.clone());
    runtime.spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve(([127, 0, 0, 1], port).into())
            .await
    });
    Ok((collector, port, runtime))
}

#[test]
fn kiln_exports_its_own_spans_over_otlp() -> Result<()> {
    let (collector, port, _runtime) = start_collector()?;
    let endpoint = format!("http://127.0.0.1:{port}");
    let mut kiln = Kiln::start(&["--otlp-traces-endpoint", &endpoint])?;
    let (status, text) = kiln.ingest(
        "team-a",
        "name=shop.cpu&from=1700000000",
        b"main;handle;work 7\nmain;idle 3\n".to_vec(),
        &[],
    )?;
    ensure!(status == 200, "{status} {text}");
    let cpu = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
    let fg = kiln.flamegraph("team-a", cpu, r#"{service_name="shop"}"#)?;
    // 10 samples at the default 100 Hz: 10 ms each.
    ensure!(fg.total == 100_000_000, "total {}", fg.total);
    kiln.assert_tenant_empty("team-b")?;
    // SIGTERM sends what is still queued.
    kiln.stop()?;

    let deadline = Instant::now() + Duration::from_secs(20);
    let spans = loop {
        let spans = collector.0.lock().expect("collector lock").clone();
        let names: Vec<&str> = spans.iter().map(|r| r.span.name.as_str()).collect();
        if ["ingest", "storage.flush", "query.merge_tree"]
            .iter()
            .all(|n| names.contains(n))
            || Instant::now() > deadline
        {
            break spans;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let names: Vec<&str> = spans.iter().map(|r| r.span.name.as_str()).collect();
    ensure!(
        spans.iter().all(|r| r.service == "kiln"),
        "every span is of service.name=kiln, the service of Kiln's own profiles"
    );

    let by_id: HashMap<&[u8], &Received> = spans
        .iter()
        .map(|r| (r.span.span_id.as_slice(), r))
        .collect();
    let request_of = |r: &Received| -> Option<Received> {
        let mut at = r;
        while !at.is_request() {
            at = by_id.get(at.span.parent_span_id.as_slice())?;
        }
        Some(at.clone())
    };

    // The ingest request, its tenant and status, with decoding and the durable write under it.
    let ingest = spans
        .iter()
        .find(|r| r.is_request() && r.span.name == "ingest")
        .with_context(|| format!("no ingest request span among {names:?}"))?;
    ensure!(
        ingest.attr("tenant").as_deref() == Some("team-a"),
        "{ingest:?}"
    );
    ensure!(
        ingest.attr("transport").as_deref() == Some("http"),
        "{ingest:?}"
    );
    ensure!(
        ingest.attr("status").as_deref() == Some("2xx"),
        "{ingest:?}"
    );
    for stage in ["ingest.decode", "storage.write"] {
        let span = spans
            .iter()
            .find(|r| r.span.name == stage)
            .with_context(|| format!("no {stage} span among {names:?}"))?;
        let parent = request_of(span).with_context(|| format!("{stage} has no request"))?;
        ensure!(
            parent.span.span_id == ingest.span.span_id,
            "{stage} belongs to the ingest request"
        );
        ensure!(span.span.trace_id == ingest.span.trace_id);
    }
    if let Some(write) = spans.iter().find(|r| r.span.name == "storage.write") {
        ensure!(
            write.attr("tenant").as_deref() == Some("team-a"),
            "{write:?}"
        );
    }

    // The flush that made it durable.
    let flush = spans
        .iter()
        .find(|r| r.span.name == "storage.flush")
        .context("no storage.flush span")?;
    ensure!(flush.attr("rows").is_some(), "{flush:?}");

    // The flame graph query, with its plan and scan, under a querier request of the tenant.
    let query = spans
        .iter()
        .find(|r| r.span.name == "query.merge_tree")
        .with_context(|| format!("no query.merge_tree span among {names:?}"))?;
    let request = request_of(query).context("the query has no request")?;
    ensure!(
        request.attr("method").as_deref()
            == Some("querier.v1.QuerierService/SelectMergeStacktraces"),
        "{request:?}"
    );
    ensure!(request.attr("tenant").as_deref() == Some("team-a"));
    for stage in ["query.plan", "query.scan"] {
        let span = spans
            .iter()
            .find(|r| r.span.name == stage && r.span.parent_span_id == query.span.span_id)
            .with_context(|| format!("no {stage} under query.merge_tree among {names:?}"))?;
        ensure!(span.span.trace_id == query.span.trace_id);
    }
    // The other tenant's check made requests of its own, never ones carrying team-a's data.
    ensure!(
        spans
            .iter()
            .filter(|r| r.attr("tenant").as_deref() == Some("team-b"))
            .all(Received::is_request),
        "team-b's requests touched no storage stage"
    );
    Ok(())
}
