//! `kiln bench --series N`: one tenant with N series, as a service that labels each sample with
//! a request id makes them. N / 16,000 pprof requests (the default `max_samples_per_profile`),
//! ten services, each sample with its own `request_id`, so each sample is a series of its own;
//! the tenant's `max_series` raised to fit. Measured once compaction has caught up: label names,
//! label values, the series of one service and the per-minute series of one service, each over
//! the last hour as Grafana asks; the server's resident memory at rest and at its peak.

use std::time::{Duration, Instant};

use anyhow::ensure;
use futures::StreamExt;
use kiln_proto::google::v1 as pprof;
use kiln_proto::querier::v1 as q;
use kiln_proto::types::v1 as t;
use prost::Message;
use serde::Serialize;

use super::queries::CPU;
use super::{BenchArgs, Server, Timing, progress, timing, wait_compacted};

/// Samples (so series) per request.
const PER_REQUEST: usize = 16_000;
const SERVICES: usize = 10;
/// Distinct stacks the samples draw from.
const STACKS: usize = 64;
const VALUE_NANOS: i64 = 10_000_000;

/// What `kiln bench --series N` measured.
#[derive(Debug, Clone, Serialize)]
pub struct CardinalityResults {
    pub series: usize,
    pub requests: usize,
    pub ingest_seconds: f64,
    pub server_cpu_seconds: f64,
    pub compaction_seconds: f64,
    pub blocks: u64,
    pub bytes_at_rest: u64,
    pub label_names: Timing,
    pub label_values_service: Timing,
    pub label_values_pod: Timing,
    /// `Series` of one service (every label set).
    pub series_one_service: Timing,
    pub series_one_service_count: usize,
    /// `SelectSeries` of one service, per minute, no grouping.
    pub select_series_one_service: Timing,
    pub rss_at_rest_mib: f64,
    pub peak_rss_mib: f64,
}

fn service(i: usize) -> String {
    format!("card-svc-{i}")
}

/// Request `r`'s pprof: `PER_REQUEST` samples (fewer for the last request), sample `i` labelled
/// `request_id=r<r>-<i>`.
fn request(r: usize, samples: usize, time_nanos: i64) -> Vec<u8> {
    let mut strings: Vec<String> = vec![
        String::new(),
        "cpu".into(),
        "nanoseconds".into(),
        "request_id".into(),
        "main".into(),
        "handle".into(),
    ];
    let fixed = strings.len() as i64;
    let mut p = pprof::Profile {
        sample_type: vec![pprof::ValueType { r#type: 1, unit: 2 }],
        period_type: Some(pprof::ValueType { r#type: 1, unit: 2 }),
        period: VALUE_NANOS,
        time_nanos,
        duration_nanos: 10_000_000_000,
        ..Default::default()
    };
    // Functions 1 (main), 2 (handle) and 3.. (leaf k), a location each.
    let mut function = |name: i64| {
        let id = p.function.len() as u64 + 1;
        p.function.push(pprof::Function {
            id,
            name,
            system_name: name,
            ..Default::default()
        });
        p.location.push(pprof::Location {
            id,
            line: vec![pprof::Line {
                function_id: id,
                line: 0,
            }],
            ..Default::default()
        });
    };
    function(4);
    function(5);
    for k in 0..STACKS {
        strings.push(format!("leaf_{k}"));
        function(fixed + k as i64);
    }
    for i in 0..samples {
        strings.push(format!("r{r}-{i}"));
        p.sample.push(pprof::Sample {
            location_id: vec![3 + ((r + i) % STACKS) as u64, 2, 1],
            value: vec![VALUE_NANOS],
            label: vec![pprof::Label {
                key: 3,
                str: strings.len() as i64 - 1,
                ..Default::default()
            }],
        });
    }
    p.string_table = strings;
    p.encode_to_vec()
}

/// Runs the high-cardinality bench in `dir`.
pub async fn run(
    args: &BenchArgs,
    series: usize,
    dir: &std::path::Path,
) -> anyhow::Result<CardinalityResults> {
    ensure!(series > 0, "--series must be positive");
    let requests = series.div_ceil(PER_REQUEST);
    let tenants = dir.join("tenants.toml");
    std::fs::write(
        &tenants,
        format!("[defaults]\nmax_series = {}\n", series + 1000),
    )?;
    let server = Server::start(
        &dir.join("data"),
        &["--tenants".into(), tenants.display().to_string()],
    )?;
    let http = reqwest::Client::new();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs() as i64;
    // Within the last half hour, so "the last hour" holds every series.
    let base = now - 1800;
    let cpu_before = server.cpu_seconds();
    let started = Instant::now();
    let bar = progress(requests as u64, "ingest");
    let sent: Vec<anyhow::Result<()>> = futures::stream::iter(0..requests)
        .map(|r| {
            let (http, url) = (http.clone(), server.url.clone());
            let samples = PER_REQUEST.min(series - r * PER_REQUEST);
            let from = base + r as i64;
            let body = request(r, samples, from * 1_000_000_000);
            let bar = bar.clone();
            async move {
                let resp = http
                    .post(format!(
                        "{url}/ingest?name={}%7Bpod%3Dpod-{r}%7D&from={from}&until={}\
                         &format=pprof&sampleRate=100",
                        service(r % SERVICES),
                        from + 10
                    ))
                    .body(body)
                    .send()
                    .await?;
                let status = resp.status();
                let text = resp.text().await?;
                ensure!(status.is_success(), "ingest: {status}: {text}");
                bar.inc(1);
                Ok(())
            }
        })
        .buffer_unordered(args.concurrency.clamp(1, 8))
        .collect()
        .await;
    bar.finish_and_clear();
    sent.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    let ingest_seconds = started.elapsed().as_secs_f64();
    let server_cpu_seconds = server.cpu_seconds() - cpu_before;
    let started = Instant::now();
    let (blocks, caught_up) = wait_compacted(&http, &server.url).await?;
    let compaction_seconds = caught_up.duration_since(started).as_secs_f64();
    let bytes_at_rest = super::dir_bytes(&server.data.join("objects"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_at_rest_mib = server.rss_mib();

    let end_ms = (now + 60) * 1000;
    let start_ms = end_ms - 3_600_000;
    let one = format!(r#"{{service_name="{}"}}"#, service(3));
    let call = |path: &'static str, body: Vec<u8>| {
        let (http, url) = (http.clone(), format!("{}{path}", server.url));
        async move {
            let resp = super::connect(&http, url, body, false).send().await?;
            let status = resp.status();
            let body = resp.bytes().await?;
            ensure!(
                status.is_success(),
                "{path}: {status}: {}",
                String::from_utf8_lossy(&body)
            );
            Ok::<_, anyhow::Error>(body)
        }
    };
    let type_matcher = format!(r#"{{__profile_type__="{CPU}"}}"#);
    let queries: Vec<(&str, &'static str, Vec<u8>)> = vec![
        (
            "label names",
            "/querier.v1.QuerierService/LabelNames",
            t::LabelNamesRequest {
                matchers: vec![type_matcher.clone()],
                start: start_ms,
                end: end_ms,
            }
            .encode_to_vec(),
        ),
        (
            "label values (service_name)",
            "/querier.v1.QuerierService/LabelValues",
            t::LabelValuesRequest {
                name: "service_name".into(),
                matchers: vec![type_matcher.clone()],
                start: start_ms,
                end: end_ms,
            }
            .encode_to_vec(),
        ),
        (
            "label values (pod)",
            "/querier.v1.QuerierService/LabelValues",
            t::LabelValuesRequest {
                name: "pod".into(),
                matchers: vec![one.clone()],
                start: start_ms,
                end: end_ms,
            }
            .encode_to_vec(),
        ),
        (
            "series of one service",
            "/querier.v1.QuerierService/Series",
            q::SeriesRequest {
                matchers: vec![one.clone()],
                start: start_ms,
                end: end_ms,
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "SelectSeries of one service",
            "/querier.v1.QuerierService/SelectSeries",
            q::SelectSeriesRequest {
                profile_type_id: CPU.into(),
                label_selector: one.clone(),
                start: start_ms,
                end: end_ms,
                step: 60.0,
                ..Default::default()
            }
            .encode_to_vec(),
        ),
    ];
    // What one service was sent: its requests' samples.
    let one_series: usize = (0..requests)
        .filter(|r| r % SERVICES == 3)
        .map(|r| PER_REQUEST.min(series - r * PER_REQUEST))
        .sum();
    let bar = progress((queries.len() * args.runs) as u64, "queries");
    let mut timings = Vec::new();
    let mut series_count = 0;
    for (name, path, body) in &queries {
        let mut runs = Vec::with_capacity(args.runs);
        for _ in 0..args.runs {
            let t0 = Instant::now();
            let answer = call(path, body.clone()).await?;
            runs.push(t0.elapsed().as_secs_f64() * 1000.0);
            match *name {
                "series of one service" => {
                    series_count = q::SeriesResponse::decode(answer)?.labels_set.len();
                    ensure!(
                        series_count == one_series,
                        "Series of one service: {series_count} label sets, {one_series} sent"
                    );
                }
                "SelectSeries of one service" => {
                    let total: f64 = q::SelectSeriesResponse::decode(answer)?
                        .series
                        .iter()
                        .flat_map(|s| &s.points)
                        .map(|p| p.value)
                        .sum();
                    let want = one_series as f64 * VALUE_NANOS as f64;
                    ensure!(
                        total == want,
                        "SelectSeries of one service: total {total}, {want} sent"
                    );
                }
                "label values (service_name)" => {
                    let n = t::LabelValuesResponse::decode(answer)?.names.len();
                    ensure!(n == SERVICES.min(requests), "{n} services");
                }
                _ => {}
            }
            bar.inc(1);
        }
        timings.push(timing(runs));
    }
    bar.finish_and_clear();
    let r = CardinalityResults {
        series,
        requests,
        ingest_seconds,
        server_cpu_seconds,
        compaction_seconds,
        blocks: blocks["blocks"].as_u64().unwrap_or(0),
        bytes_at_rest,
        label_names: timings[0],
        label_values_service: timings[1],
        label_values_pod: timings[2],
        series_one_service: timings[3],
        series_one_service_count: series_count,
        select_series_one_service: timings[4],
        rss_at_rest_mib,
        peak_rss_mib: server.peak_rss_mib(),
    };
    print(&r, &queries);
    Ok(r)
}

fn print(r: &CardinalityResults, queries: &[(&str, &'static str, Vec<u8>)]) {
    println!(
        "{} series in {} requests: ingest {:.1} s ({:.1} s of server CPU), compaction caught \
         up in {:.1} s, {} blocks, {:.1} MB at rest",
        r.series,
        r.requests,
        r.ingest_seconds,
        r.server_cpu_seconds,
        r.compaction_seconds,
        r.blocks,
        r.bytes_at_rest as f64 / 1e6
    );
    println!();
    println!("| query (last 1 h) | p50 | p99 |");
    println!("|---|---|---|");
    let t = [
        r.label_names,
        r.label_values_service,
        r.label_values_pod,
        r.series_one_service,
        r.select_series_one_service,
    ];
    for ((name, _, _), t) in queries.iter().zip(t) {
        println!("| {name} | {:.1} ms | {:.1} ms |", t.p50_ms, t.p99_ms);
    }
    println!();
    println!(
        "series of one service: {} label sets; server RSS at rest {:.0} MiB, peak {:.0} MiB",
        r.series_one_service_count, r.rss_at_rest_mib, r.peak_rss_mib
    );
}
