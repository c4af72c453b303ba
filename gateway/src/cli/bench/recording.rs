//! `kiln bench --recording-rules N`: rules made before ingest, and a remote-write receiver on
//! loopback that counts what they send (requests, bytes as sent, samples), so the bench states
//! what rules cost at ingest and what they send (ADR 0015).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, ensure};
use prost::Message;
use serde::Serialize;
use serde_json::json;

use super::workload::service_name;

/// What the receiver took.
#[derive(Debug, Default)]
pub struct Received {
    pub requests: AtomicU64,
    pub bytes: AtomicU64,
    pub samples: AtomicU64,
}

/// The receiver's counts at the end, with the rules they came from.
#[derive(Debug, Clone, Serialize)]
pub struct RecordingResults {
    pub rules: usize,
    pub requests: u64,
    pub bytes: u64,
    pub samples: u64,
    /// Points sealed by the server (`kiln_recording_points_sealed_total`).
    pub points_sealed: f64,
}

/// A remote-write receiver on a free loopback port: its write URL and its counts.
pub async fn receiver() -> anyhow::Result<(String, Arc<Received>)> {
    let received = Arc::new(Received::default());
    let counts = Arc::clone(&received);
    let app = axum::Router::new().route(
        "/api/v1/write",
        axum::routing::post(move |body: bytes::Bytes| {
            let counts = Arc::clone(&counts);
            async move {
                counts.requests.fetch_add(1, Ordering::Relaxed);
                counts.bytes.fetch_add(body.len() as u64, Ordering::Relaxed);
                let samples = snap::raw::Decoder::new()
                    .decompress_vec(&body)
                    .ok()
                    .and_then(|raw| {
                        kiln_proto::prometheus::WriteRequest::decode(raw.as_slice()).ok()
                    })
                    .map_or(0, |w| {
                        w.timeseries.iter().map(|t| t.samples.len() as u64).sum()
                    });
                counts.samples.fetch_add(samples, Ordering::Relaxed);
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/api/v1/write", listener.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((url, received))
}

/// `n` rules of the bench's tenant, made as the Drilldown app makes them: rule `i` is the CPU
/// of service `i mod services` by pod; every fourth counts only the stacks through
/// `runtime.mallocgc`.
pub async fn make_rules(
    http: &reqwest::Client,
    server: &str,
    n: usize,
    services: usize,
) -> anyhow::Result<()> {
    for i in 0..n {
        let mut body = json!({
            "metricName": format!("profiles_recorded_bench_{i}"),
            "matchers": [
                format!("{{ service_name=\"{}\" }}", service_name(i % services.max(1))),
                "{ __profile_type__=\"process_cpu:cpu:nanoseconds:cpu:nanoseconds\"}",
            ],
            "groupBy": ["pod"],
        });
        if i % 4 == 3 {
            body["stacktraceFilter"] =
                json!({"functionName": {"functionName": "runtime.mallocgc"}});
        }
        let resp = http
            .post(format!(
                "{server}/settings.v1.RecordingRulesService/UpsertRecordingRule"
            ))
            .header("Content-Type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .context("making a recording rule")?;
        let status = resp.status();
        ensure!(
            status.is_success(),
            "making recording rule {i}: {status} {}",
            resp.text().await.unwrap_or_default()
        );
    }
    Ok(())
}
