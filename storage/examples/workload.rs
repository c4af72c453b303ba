//! The storage engine under the 12-hour workload of the storage and performance issues, in
//! process: 20 services × 8 pods, one profile per pod every 10 s, stacks from the real corpus
//! (`../shared/corpus/pprof`, synthetic stacks when it is absent), ingested with the segment
//! clock following the data as live agents would.
//!
//! ```text
//! cargo run --release -p kiln-storage --example workload -- ingest  DIR [--hours 12 | --minutes N]
//! cargo run --release -p kiln-storage --example workload -- compact DIR
//! cargo run --release -p kiln-storage --example workload -- report  DIR
//! cargo run --release -p kiln-storage --example workload -- lookup  DIR [--days 30]
//! ```
//!
//! Each phase runs in its own process so `compact` reports the compactor's own peak RSS.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kiln_otel::model::{Labels, NormalizedProfile};
use kiln_storage::clock::Clock;
use kiln_storage::metastore::embedded::Embedded;
use kiln_storage::metastore::{BlockMeta, BlockQuery, Metastore};
use kiln_storage::query::{Aggregation, SampleFilter};
use kiln_storage::selector::parse_selector;
use kiln_storage::{Storage, StorageConfig};

const TENANT: &str = "bench";
const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
const SERVICES: usize = 20;
const PODS: usize = 8;
const STEP: i64 = 10_000_000_000;
const SAMPLES_PER_PROFILE: usize = 90;
/// The workload's first profile (aligned to a partition, so 12 h span three partitions).
const T0: i64 = 1_767_225_600_000_000_000;

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Root-first stacks of function names from every corpus pprof file, one pool per file.
fn corpus_pools() -> Vec<Vec<Vec<String>>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus/pprof");
    let mut pools = kiln_otel::pprof::stack_pools(&dir, 20);
    if pools.is_empty() {
        eprintln!("../shared/corpus is absent: synthetic stacks");
        let mut rng = Rng(7);
        for svc in 0..SERVICES {
            pools.push(
                (0..400)
                    .map(|_| {
                        let depth = 8 + rng.below(16) as usize;
                        (0..depth)
                            .map(|d| format!("svc{svc}.pkg{}.fn{}", d % 7, rng.below(40)))
                            .collect()
                    })
                    .collect(),
            );
        }
    }
    pools
}

fn profile(
    pool: &[Vec<String>],
    svc: usize,
    pod: usize,
    t: i64,
    rng: &mut Rng,
) -> NormalizedProfile {
    let start = rng.below(pool.len() as u64) as usize;
    let stacks: Vec<(Vec<String>, i64)> = (0..SAMPLES_PER_PROFILE.min(pool.len()))
        .map(|k| {
            let frames = pool[(start + k * 7) % pool.len()].clone();
            (frames, (1 + rng.below(20) as i64) * 10_000_000)
        })
        .collect();
    let labels = Labels::from_pairs([
        ("__name__".to_string(), "process_cpu".to_string()),
        ("service_name".to_string(), format!("service-{svc:02}")),
        ("pod".to_string(), format!("service-{svc:02}-pod-{pod}")),
    ]);
    kiln_storage::testing::profile_with_labels(labels, &stacks, t)
}

fn config(dir: &str, clock: Option<Arc<AtomicU64>>, compaction: bool) -> StorageConfig {
    let mut c = StorageConfig::new(dir);
    if let Some(ms) = clock {
        c.writer.clock = Clock::manual(ms);
    }
    c.compaction.enabled = compaction;
    c.delete_delay = Duration::ZERO;
    c
}

fn peak_rss_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
            })
        })
        .unwrap_or(0)
        / 1024
}

async fn ingest(dir: &str, minutes: i64) {
    let pools = corpus_pools();
    let clock = Arc::new(AtomicU64::new((T0 / 1_000_000) as u64));
    let s = Storage::open(config(dir, Some(clock.clone()), false))
        .await
        .unwrap();
    let steps = minutes * 60 * 1_000_000_000 / STEP;
    let started = Instant::now();
    let mut rng = Rng(0x5eed);
    let mut rows = 0u64;
    for step in 0..steps {
        let t = T0 + step * STEP;
        clock.store((t / 1_000_000) as u64, Ordering::SeqCst);
        let profiles: Vec<NormalizedProfile> = (0..SERVICES * PODS)
            .map(|i| {
                let svc = i / PODS;
                profile(&pools[svc % pools.len()], svc, i % PODS, t, &mut rng)
            })
            .collect();
        rows += profiles
            .iter()
            .map(|p| p.sample_count() as u64)
            .sum::<u64>();
        // One request per pod, as agents send them, all in flight at once.
        let results: Vec<_> = futures::stream::iter(profiles)
            .map(|p| s.write(TENANT, p))
            .buffer_unordered(SERVICES * PODS)
            .collect()
            .await;
        for r in results {
            r.unwrap();
        }
        if step % 360 == 0 {
            eprintln!(
                "{} h ingested, {rows} rows, {:.0} s",
                step / 360,
                started.elapsed().as_secs_f64()
            );
        }
    }
    s.close().await;
    let blocks = s
        .metastore()
        .query_blocks(BlockQuery::all(TENANT))
        .await
        .unwrap();
    println!(
        "ingest: {rows} rows, {} profiles in {:.1} s ({:.2} M rows/s); {} L0 segments; peak RSS {} MiB",
        steps * (SERVICES * PODS) as i64,
        started.elapsed().as_secs_f64(),
        rows as f64 / started.elapsed().as_secs_f64() / 1e6,
        blocks.len(),
        peak_rss_mib()
    );
}

async fn compact(dir: &str) {
    let s = Storage::open(config(dir, None, true)).await.unwrap();
    let before = s
        .metastore()
        .query_blocks(BlockQuery::all(TENANT))
        .await
        .unwrap();
    let bytes_in: u64 = before.iter().map(|b| b.dataset_bytes()).sum();
    let rows: u64 = before.iter().map(|b| b.rows).sum();
    let started = Instant::now();
    let jobs = s.compactor().compact_all(u64::MAX / 2).await.unwrap();
    let secs = started.elapsed().as_secs_f64();
    s.collect_garbage(u64::MAX).await.unwrap();
    let after = s
        .metastore()
        .query_blocks(BlockQuery::all(TENANT))
        .await
        .unwrap();
    println!(
        "compact: {jobs} jobs, {} → {} blocks, {rows} rows, {:.1} MB read in {secs:.1} s = {:.1} MB/s, \
         {:.2} M rows/s; peak RSS {} MiB",
        before.len(),
        after.len(),
        bytes_in as f64 / 1e6,
        bytes_in as f64 / 1e6 / secs,
        rows as f64 / secs / 1e6,
        peak_rss_mib()
    );
}

fn filter(selector: &str, start: i64, end: i64) -> SampleFilter {
    SampleFilter {
        tenant: TENANT.into(),
        profile_type: CPU.into(),
        selector: parse_selector(selector).unwrap(),
        start_nanos: start,
        end_nanos: end,
        span_ids: vec![],
        trace_ids: vec![],
        profile_ids: vec![],
    }
}

async fn timed<F, Fut, T>(runs: usize, mut f: F) -> (f64, f64)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let mut ms: Vec<f64> = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        f().await;
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (ms[runs / 2], ms[(runs * 99 / 100).min(runs - 1)])
}

async fn report(dir: &str) {
    let s = Storage::open(config(dir, None, false)).await.unwrap();
    let blocks = s
        .metastore()
        .query_blocks(BlockQuery::all(TENANT))
        .await
        .unwrap();
    let rows: u64 = blocks.iter().map(|b| b.rows).sum();
    let symbols: u64 = blocks.iter().map(|b| b.symbols.size).sum();
    let samples: u64 = blocks.iter().map(|b| b.samples.size).sum();
    let rollups: u64 = blocks.iter().map(|b| b.rollup_bytes()).sum();
    let mut objects = s.store().list("segments").await.unwrap();
    objects.extend(s.store().list("blocks").await.unwrap());
    let at_rest: u64 = objects.iter().map(|o| o.size).sum();
    let mut levels: HashMap<u32, usize> = HashMap::new();
    for b in &blocks {
        *levels.entry(b.level).or_default() += 1;
    }
    let mut levels: Vec<_> = levels.into_iter().collect();
    levels.sort();
    println!(
        "at rest: {} blocks (by level {levels:?}), {} objects, {rows} rows, {at_rest} bytes = {:.2} B/row \
         (samples {:.2}, symbols {:.2}, rollups {:.2}, footers and metadata {:.2})",
        blocks.len(),
        objects.len(),
        at_rest as f64 / rows as f64,
        samples as f64 / rows as f64,
        symbols as f64 / rows as f64,
        rollups as f64 / rows as f64,
        (at_rest - samples - symbols - rollups) as f64 / rows as f64,
    );
    let mut by_resolution: std::collections::BTreeMap<i64, (u64, usize)> = Default::default();
    for r in blocks.iter().flat_map(|b| &b.rollups) {
        let e = by_resolution.entry(r.resolution_nanos).or_default();
        e.0 += r.section.size;
        e.1 += 1;
    }
    for (resolution, (bytes, n)) in by_resolution {
        println!(
            "rollup {} s: {n} blocks, {:.3} B/row",
            resolution / 1_000_000_000,
            bytes as f64 / rows as f64
        );
    }
    let end = blocks.iter().map(|b| b.max_time_nanos).max().unwrap_or(T0) + 1;
    let hour = 3600 * 1_000_000_000;
    let one = r#"{service_name="service-03"}"#;
    let q = s.query();
    for (name, start) in [("1 h", end - hour), ("12 h", end - 12 * hour)] {
        let f = filter(one, start, end);
        let (p50, p99) = timed(20, || q.merge_tree(&f)).await;
        println!("flame graph, 1 service, {name}: p50 {p50:.1} ms, p99 {p99:.1} ms");
    }
    let f = filter(one, end - 12 * hour, end);
    let (p50, p99) = timed(20, || {
        q.select_series(
            &f,
            &[],
            60_000_000_000,
            Aggregation::Sum,
            None,
            kiln_storage::query::Exemplars::None,
        )
    })
    .await;
    println!("per-minute series, 1 service, 12 h: p50 {p50:.1} ms, p99 {p99:.1} ms");
}

/// Metastore lookups for a 1 h query with `days` of blocks, shaped like the compacted workload.
async fn lookup(dir: &str, days: i64) {
    let s = Storage::open(config(dir, None, false)).await.unwrap();
    let blocks = s
        .metastore()
        .query_blocks(BlockQuery::all(TENANT))
        .await
        .unwrap();
    let span = blocks.iter().map(|b| b.max_time_nanos).max().unwrap_or(T0)
        - blocks.iter().map(|b| b.min_time_nanos).min().unwrap_or(T0);
    let copies = (days * 24 * 3600 * 1_000_000_000 / span.max(1)).max(1);
    let tmp = tempfile::tempdir().unwrap();
    let m = Embedded::open(&tmp.path().join("m.redb")).unwrap();
    let mut n = 0u64;
    for c in 0..copies {
        let shift = c * span;
        let batch: Vec<BlockMeta> = blocks
            .iter()
            .map(|b| {
                let mut b = (**b).clone();
                let ms = b.created_ms() + (shift / 1_000_000) as u64;
                b.id = ulid::Ulid::from_parts(ms, n as u128).to_string();
                n += 1;
                b.min_time_nanos += shift;
                b.max_time_nanos += shift;
                for x in &mut b.series {
                    x.min_time_nanos += shift;
                    x.max_time_nanos += shift;
                }
                b
            })
            .collect();
        m.add_blocks(batch).await.unwrap();
    }
    // An hour ending in the middle of the simulated days.
    let end = T0 + copies / 2 * span + span / 2 + 1800 * 1_000_000_000;
    let hour = 3600 * 1_000_000_000;
    let m = &m;
    let (p50, p99) = timed(1000, || async move {
        let mut q = BlockQuery::new(TENANT, end - hour, end);
        q.service_name = Some("service-03");
        m.query_blocks(q).await.unwrap().len()
    })
    .await;
    let mut q = BlockQuery::new(TENANT, end - hour, end);
    q.service_name = Some("service-03");
    let found = m.query_blocks(q).await.unwrap().len();
    println!(
        "metastore lookup, 1 h of one service among {n} blocks ({days} days): p50 {:.3} ms, p99 {:.3} ms, {found} blocks found",
        p50, p99
    );
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: workload ingest|compact|report|lookup DIR [--hours N] [--days N]";
    let (phase, dir) = match (args.get(1), args.get(2)) {
        (Some(p), Some(d)) => (p.as_str(), d.as_str()),
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    let flag = |name: &str, default: i64| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    match phase {
        "ingest" => ingest(dir, flag("--minutes", flag("--hours", 12) * 60)).await,
        "compact" => compact(dir).await,
        "report" => report(dir).await,
        "lookup" => lookup(dir, flag("--days", 30)).await,
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    }
}
