//! `kiln bench --load-seconds N`: fresh data under load. After the main run, the workload goes
//! on (the steps after its end) at 80 % of the rate the main run reached, paced, while a
//! dashboard asks for the queried service's flame graph of the last 5 minutes of data over and
//! over; measured: that query's latency, the acks', and the server's peak memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use anyhow::ensure;
use kiln_proto::querier::v1 as q;
use prost::Message;
use serde::Serialize;
use tokio::sync::Semaphore;

use super::deployment::Deployment;
use super::queries::fresh_flame;
use super::workload::Workload;
use super::{Timing, connect, metric_samples, metrics_text, timing};

/// How far back the dashboard looks.
const WINDOW_NANOS: i64 = 5 * 60 * 1_000_000_000;
/// Its refresh interval (a hurried user; Grafana's fastest auto-refresh is 5 s).
const QUERY_INTERVAL: Duration = Duration::from_millis(100);

/// What the load phase measured.
#[derive(Debug, Clone, Serialize)]
pub struct LoadResults {
    pub seconds: f64,
    /// The rate asked for: 80 % of the main run's profiles/s, or `--load-rate`.
    pub target_profiles_per_s: f64,
    pub profiles_per_s: f64,
    pub ack: Timing,
    /// The flame graph of the last 5 minutes of data, while ingesting.
    pub flame_5m: Timing,
    pub queries: usize,
    /// The same, of the queries that read nothing from the object store, and how many did.
    pub flame_5m_unread: Timing,
    pub queries_reading: usize,
    /// Object store reads (GETs, ranged or whole) the query process made a query.
    pub store_reads_per_query: f64,
    /// The server's peak resident memory over the whole bench, MiB.
    pub peak_rss_mib: f64,
}

/// Runs the load phase for `seconds` at `target` profiles/s.
pub async fn run(
    server: &Deployment,
    workload: &mut Workload,
    target: f64,
    seconds: u64,
    concurrency: usize,
) -> anyhow::Result<LoadResults> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()?;
    let shape = workload.shape;
    let per_step = (shape.services * shape.pods) as f64;
    let interval = Duration::from_secs_f64(per_step / target.max(1e-9));
    // The end of the newest data acknowledged (exclusive), Unix nanoseconds.
    let newest = Arc::new(AtomicI64::new(shape.end_nanos()));
    let stop = Arc::new(AtomicBool::new(false));
    let reads_before = store_reads(&metrics_text(&http, &server.query).await?);
    // The dashboard is a client of its own (a browser elsewhere), not a task queued behind the
    // senders': it runs on a thread and runtime of its own.
    let querier = {
        let url = format!(
            "{}/querier.v1.QuerierService/SelectMergeStacktraces",
            server.query
        );
        let (newest, stop) = (Arc::clone(&newest), Arc::clone(&stop));
        let lag = server.query_lag();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let http = reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()?;
            rt.block_on(async move {
                let mut ms = Vec::new();
                // The newest data acknowledged, as it was over the last `lag`: a query process
                // sees a write once its segment is registered, up to `lag` after its ack.
                let mut seen = std::collections::VecDeque::new();
                while !stop.load(Ordering::Relaxed) {
                    seen.push_back((Instant::now(), newest.load(Ordering::Relaxed)));
                    while seen.len() > 1 && seen[1].0.elapsed() >= lag {
                        seen.pop_front();
                    }
                    let end = seen[0].1;
                    let (_, body) = fresh_flame(&shape, end, WINDOW_NANOS).request();
                    let t = Instant::now();
                    let resp = connect(&http, &url, body, false).send().await?;
                    let status = resp.status();
                    let read = super::bytes_read(&resp);
                    let answer = resp.bytes().await?;
                    ms.push((t.elapsed().as_secs_f64() * 1000.0, read));
                    ensure!(status.is_success(), "fresh flame graph: {status}");
                    let total = q::SelectMergeStacktracesResponse::decode(answer)?
                        .flamegraph
                        .unwrap_or_default()
                        .total;
                    ensure!(total > 0, "the last 5 minutes' flame graph is empty");
                    tokio::time::sleep(QUERY_INTERVAL).await;
                }
                Ok::<_, anyhow::Error>(ms)
            })
        })
    };
    let slots = Arc::new(Semaphore::new(concurrency.max(1)));
    let started = Instant::now();
    let mut sends = tokio::task::JoinSet::new();
    let mut step = shape.steps();
    let mut sent = 0u64;
    while started.elapsed() < Duration::from_secs(seconds) {
        let due = started + interval.mul_f64((step - shape.steps()) as f64);
        tokio::time::sleep_until(due.into()).await;
        let profiles = workload.step(step);
        let step_end = profiles.first().map_or(0, |p| p.time_nanos) + shape.step_nanos;
        for p in &profiles {
            let permit = Arc::clone(&slots).acquire_owned().await?;
            let url = format!(
                "{}/ingest?{}",
                server.next_ingest(),
                workload.ingest_query(p)
            );
            let (http, body, newest) = (http.clone(), workload.pprof(p), Arc::clone(&newest));
            sends.spawn(async move {
                let t = Instant::now();
                let resp = http.post(url).body(body).send().await?;
                ensure!(resp.status().is_success(), "ingest: {}", resp.status());
                drop(permit);
                newest.fetch_max(step_end, Ordering::Relaxed);
                Ok::<_, anyhow::Error>(t.elapsed().as_secs_f64() * 1000.0)
            });
            sent += 1;
        }
        step += 1;
    }
    let mut acks = Vec::with_capacity(sent as usize);
    while let Some(ack) = sends.join_next().await {
        acks.push(ack??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let flame = querier
        .join()
        .map_err(|_| anyhow::anyhow!("the querier thread panicked"))??;
    ensure!(!flame.is_empty(), "no query ran under load");
    let reads = store_reads(&metrics_text(&http, &server.query).await?) - reads_before;
    Ok(LoadResults {
        seconds: elapsed,
        target_profiles_per_s: target,
        profiles_per_s: sent as f64 / elapsed,
        ack: timing(acks),
        queries: flame.len(),
        store_reads_per_query: reads / flame.len() as f64,
        queries_reading: flame.iter().filter(|(_, read)| *read > 0).count(),
        flame_5m_unread: {
            let unread: Vec<f64> = flame
                .iter()
                .filter(|(_, read)| *read == 0)
                .map(|(ms, _)| *ms)
                .collect();
            if unread.is_empty() {
                Timing::default()
            } else {
                timing(unread)
            }
        },
        flame_5m: timing(flame.iter().map(|(ms, _)| *ms).collect()),
        peak_rss_mib: server.peak_rss_mib(),
    })
}

/// The object store reads a process made (`kiln_object_store_requests_total`, `get` and
/// `get_ranges`).
fn store_reads(exposition: &str) -> f64 {
    metric_samples(exposition, "kiln_object_store_requests_total")
        .filter(|(labels, _)| labels.contains("op=\"get\"") || labels.contains("op=\"get_ranges\""))
        .map(|(_, v)| v)
        .sum()
}
