//! What naming native frames costs a query: a profile of `N` distinct addresses (default
//! 100 000) of a large debug file, stored in a real storage engine with the real symbolizer as
//! its frame namer, its flame graph merged:
//!
//! 1. before the debug file is uploaded (every frame unnamed; the second such query, its block's
//!    symbols cached, is the baseline),
//! 2. the first query after the upload (the file opened, its DWARF read, every address looked
//!    up),
//! 3. the second query (the named symbols cached),
//! 4. a query after the tenant's files changed (names rebuilt from the named-address cache),
//!
//! with the process's peak resident memory after each.
//!
//! ```sh
//! objcopy --only-keep-debug target/debug/kiln /tmp/kiln.debug
//! cargo run --release -p kiln-symbolize --example cost -- /tmp/kiln.debug [N]
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_otel::model::Labels;
use kiln_otel::normalize::{IngestMeta, NormalizeLimits, normalize_pprof};
use kiln_proto::google::v1 as pb;
use kiln_storage::Storage;
use kiln_storage::testing::{config, filter};
use kiln_symbolize::store::UploadLimits;
use kiln_symbolize::{Metrics, Symbolizer, SymbolizerConfig, identify_file};
use object::{Object, ObjectSymbol};

const T0: i64 = 1_700_000_000_000_000_000;

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// `n` distinct addresses inside the functions of the file's symbol table, spread over them.
fn addresses(path: &std::path::Path, n: usize) -> Vec<u64> {
    let data = std::fs::read(path).expect("the debug file");
    let file = object::File::parse(&*data).expect("an ELF file");
    let mut functions: Vec<(u64, u64)> = file
        .symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text && s.size() >= 16)
        .map(|s| (s.address(), s.size()))
        .collect();
    functions.sort_unstable();
    functions.dedup();
    let per = n.div_ceil(functions.len().max(1)).max(1) as u64;
    let mut out = Vec::with_capacity(n);
    'all: for (start, size) in functions {
        for k in 0..per.min(size / 4) {
            out.push(start + k * 4);
            if out.len() == n {
                break 'all;
            }
        }
    }
    out
}

fn profile(build_id: &str, addrs: &[u64]) -> kiln_otel::NormalizedProfile {
    let mut p = pb::Profile {
        string_table: ["", "cpu", "nanoseconds", "/usr/bin/big", build_id]
            .map(String::from)
            .to_vec(),
        sample_type: vec![pb::ValueType { r#type: 1, unit: 2 }],
        period_type: Some(pb::ValueType { r#type: 1, unit: 2 }),
        period: 1,
        mapping: vec![pb::Mapping {
            id: 1,
            filename: 3,
            build_id: 4,
            ..Default::default()
        }],
        time_nanos: T0,
        ..Default::default()
    };
    for (i, &a) in addrs.iter().enumerate() {
        p.location.push(pb::Location {
            id: i as u64 + 1,
            mapping_id: 1,
            address: a,
            ..Default::default()
        });
        p.sample.push(pb::Sample {
            location_id: vec![i as u64 + 1],
            value: vec![1],
            label: vec![],
        });
    }
    let decoded = kiln_otel::pprof::decode(&prost::Message::encode_to_vec(&p), 1 << 30).unwrap();
    let meta = IngestMeta {
        labels: Labels::from_pairs([("service_name", "big"), ("__name__", "process_cpu")]),
        time_nanos: T0,
        duration_nanos: 10_000_000_000,
        ..Default::default()
    };
    let limits = NormalizeLimits {
        max_samples: 0,
        ..Default::default()
    };
    normalize_pprof(&decoded, &meta, &limits).unwrap()
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let path = std::path::PathBuf::from(args.next().expect("a debug file"));
    let n: usize = args.next().map_or(100_000, |v| v.parse().expect("a count"));
    let info = identify_file(&path).expect("an ELF file");
    let id = info.gnu_build_id.clone().unwrap_or(info.file_id.clone());
    let addrs = addresses(&path, n);
    println!(
        "debug file {} ({:.0} MiB, DWARF: {}), {} distinct addresses",
        path.display(),
        info.size as f64 / (1 << 20) as f64,
        info.has_dwarf,
        addrs.len()
    );

    let dir = tempfile::tempdir().unwrap();
    let mut c = config(&dir.path().join("data"));
    c.compaction.enabled = false;
    let storage = Storage::open(c).await.unwrap();
    let symbolizer = Symbolizer::new(
        storage.store().clone(),
        SymbolizerConfig::without_debuginfod(&dir.path().join("data")),
        Arc::new(Metrics::default()),
    )
    .unwrap();
    storage.set_frame_namer(Arc::new(symbolizer.clone()), Duration::from_secs(60));
    storage.write("t", profile(&id, &addrs)).await.unwrap();
    storage.flush().await;
    let f = filter("t", "{}", T0 - 1_000_000_000, T0 + 1_000_000_000);
    let query = |label: &'static str| {
        let (storage, f) = (storage.clone(), f.clone());
        async move {
            let started = Instant::now();
            let tree = storage.query().merge_tree(&f).await.unwrap();
            let took = started.elapsed();
            let stacks = tree.stacks();
            let unnamed = stacks
                .keys()
                .filter(|s| s.iter().any(|n| n.starts_with("big 0x")))
                .count();
            println!(
                "{label:<34} {:>9.1} ms  {:>7} stacks, {:>6} unnamed  peak RSS {:>5.0} MiB",
                took.as_secs_f64() * 1e3,
                stacks.len(),
                unnamed,
                peak_rss_mib()
            );
            took
        }
    };
    query("unnamed, first (cold symbols)").await;
    let baseline = query("unnamed, again: the baseline").await;
    let limits = UploadLimits {
        max_file_bytes: u64::MAX,
        max_tenant_bytes: u64::MAX,
        max_inflated_bytes: 512 << 20,
    };
    let started = Instant::now();
    symbolizer
        .store()
        .add("t", "big.debug", &path, &[], limits)
        .await
        .unwrap();
    symbolizer.changed("t");
    println!(
        "{:<34} {:>9.1} ms",
        "upload (identify, probe, hash, store)",
        started.elapsed().as_secs_f64() * 1e3
    );
    let first = query("first query after the upload").await;
    let second = query("second query").await;
    symbolizer.changed("t");
    let rebuilt = query("after a change (addresses cached)").await;
    let ratio = |d: Duration| d.as_secs_f64() / baseline.as_secs_f64();
    println!(
        "ratios to the baseline: first {:.1}x, second {:.2}x, after a change {:.1}x",
        ratio(first),
        ratio(second),
        ratio(rebuilt)
    );
}
