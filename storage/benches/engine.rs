//! Storage engine benchmarks on seeded synthetic profiles.
//!
//! - `block_build/<rows>`: interning symbols, sorting and encoding one block (Parquet + symbols).
//! - `dataset_add_four_types_2000_samples`: adding a four-type profile whose symbols and stacks
//!   the dataset holds already (the writer's cost per sample).
//! - `flamegraph/<nodes>`: merging stacks into a tree and encoding Pyroscope's FlameGraph.
//! - `compaction/l0_merge_20_segments_100_pods`: merging 20 fresh segments of 10 profiles
//!   (100 samples each) into one L1 block holding two profiles per pod, as the fresh lane does
//!   every few seconds under load: symbols remapped, samples and rollups written.
//! - `query/*`: a flame graph over 20 blocks × 10 services, unfiltered (the baseline) and with a
//!   selector matching one service — the ratio shows what pushdown and block pruning save.
//!
//! Run: `cargo bench -p kiln-storage --bench engine`.

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use kiln_otel::model::{
    Function, Labels, Line, Location, NormalizedProfile, ProfileType, Sample, Series, Symbols,
};
use kiln_storage::format::block::DatasetBuilder;
use kiln_storage::format::symbols::SymbolsBuilder;
use kiln_storage::query::{FlameTree, SampleFilter};
use kiln_storage::selector::parse_selector;
use kiln_storage::{Storage, StorageConfig};

const T0: i64 = 1_700_000_000_000_000_000;
const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

/// xorshift: deterministic inputs.
struct Rng(u64);
impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// A profile of `samples` stacks (depth 8–24) over `functions` functions, service `svc`.
fn profile(
    rng: &mut Rng,
    svc: &str,
    samples: usize,
    functions: usize,
    time: i64,
) -> NormalizedProfile {
    let mut symbols = Symbols::default();
    for i in 0..functions {
        symbols.functions.push(Function {
            name: format!("pkg{}.fn{i}", i % 17).into(),
            ..Default::default()
        });
        symbols.locations.push(Location {
            lines: kiln_otel::model::smallvec![Line {
                function: i as u32,
                line: 1 + i as i64,
            }],
            ..Default::default()
        });
    }
    let samples = (0..samples)
        .map(|_| {
            let depth = 8 + rng.next(17) as usize;
            // Shared roots, varied leaves, like real programs.
            let stack = (0..depth)
                .map(|d| {
                    if d < 4 {
                        d as u32
                    } else {
                        rng.next(functions as u64) as u32
                    }
                })
                .rev()
                .collect();
            Sample {
                stack,
                value: 1 + rng.next(100) as i64 * 10_000_000,
                ..Default::default()
            }
        })
        .collect();
    NormalizedProfile {
        symbols,
        series: vec![Series {
            labels: Labels::from_pairs([
                ("__name__", "process_cpu"),
                ("service_name", svc),
                ("env", "prod"),
            ]),
            profile_type: ProfileType::parse(CPU).unwrap(),
            time_nanos: time,
            duration_nanos: 10_000_000_000,
            samples,
        }],
    }
}

fn block_build(c: &mut Criterion) {
    let mut g = c.benchmark_group("block_build");
    for rows in [1_000usize, 10_000] {
        let p = profile(&mut Rng(7), "svc", rows, 2_000, T0);
        g.bench_with_input(BenchmarkId::from_parameter(rows), &p, |b, p| {
            b.iter(|| {
                let mut builder = DatasetBuilder::new("bench");
                builder.add(p);
                builder.finish().unwrap()
            })
        });
    }
    g.finish();
}

/// Adding a profile of four sample types (Go's heap profile: four series over the same
/// samples' stacks) to a dataset that holds its symbols and stacks already, as every request
/// after a service's first in a flush window does: what a sample costs the writer.
fn dataset_add(c: &mut Criterion) {
    let mut p = profile(&mut Rng(5), "svc", 2_000, 2_000, T0);
    let first = p.series[0].clone();
    for t in [
        "inuse_objects:count",
        "inuse_space:bytes",
        "alloc_objects:count",
    ] {
        let (sample, unit) = t.split_once(':').unwrap();
        let mut s = first.clone();
        s.profile_type =
            ProfileType::parse(&format!("memory:{sample}:{unit}:space:bytes")).unwrap();
        p.series.push(s);
    }
    let mut builder = DatasetBuilder::new("bench");
    builder.add(&p);
    c.bench_function("dataset_add_four_types_2000_samples", |b| {
        b.iter(|| builder.add(&p))
    });
}

/// Interning a profile's symbols into a dataset that holds them already: what every request
/// after a service's first one in a flush window does (each string, function and location a
/// hit).
fn symbols_interning(c: &mut Criterion) {
    // Names and files as long as Go's: module path, package, receiver, method.
    let mut symbols = Symbols::default();
    for i in 0..2_000u32 {
        let pkg = i % 17;
        symbols.functions.push(Function {
            name: format!("github.com/example/service/internal/pkg{pkg}.(*Handler).Method{i}")
                .into(),
            system_name: format!(
                "github.com/example/service/internal/pkg{pkg}.(*Handler).Method{i}"
            )
            .into(),
            filename: format!(
                "/src/github.com/example/service/internal/pkg{pkg}/file{}.go",
                i % 40
            )
            .into(),
            ..Default::default()
        });
        symbols.locations.push(Location {
            lines: kiln_otel::model::smallvec![Line {
                function: i,
                line: 1 + i64::from(i),
            }],
            ..Default::default()
        });
    }
    let mut builder = SymbolsBuilder::default();
    builder.add_locations(&symbols);
    c.bench_function("symbols_add_locations_hits_2000", |b| {
        b.iter(|| builder.add_locations(&symbols))
    });
    // The same hits in a block that holds 200,000 other locations (a segment of many
    // services): a table larger than the caches, where a lookup waits on memory.
    let mut other = symbols.clone();
    for round in 0..100 {
        for (i, l) in other.locations.iter_mut().enumerate() {
            l.address = (round * 2_000 + i as u64) + 1;
        }
        builder.add_locations(&other);
    }
    c.bench_function("symbols_add_locations_hits_2000_of_200000", |b| {
        b.iter(|| builder.add_locations(&symbols))
    });
}

fn flamegraph(c: &mut Criterion) {
    let mut g = c.benchmark_group("flamegraph");
    let mut rng = Rng(11);
    let names: Vec<String> = (0..5_000).map(|i| format!("fn{i}")).collect();
    let stacks: Vec<Vec<&str>> = (0..20_000)
        .map(|_| {
            (0..(4 + rng.next(20)))
                .map(|_| names[rng.next(5_000) as usize].as_str())
                .collect()
        })
        .collect();
    let mut tree = FlameTree::default();
    for s in &stacks {
        tree.add_stack(s.iter().copied(), 1);
    }
    let nodes = tree.node_count();
    g.bench_function(BenchmarkId::new("build", nodes), |b| {
        b.iter(|| {
            let mut t = FlameTree::default();
            for s in &stacks {
                t.add_stack(s.iter().copied(), 1);
            }
            t
        })
    });
    g.bench_function(BenchmarkId::new("encode_max_nodes_8192", nodes), |b| {
        b.iter(|| tree.to_flamegraph(8192))
    });
    g.bench_function(BenchmarkId::new("encode_all", nodes), |b| {
        b.iter(|| tree.to_flamegraph(usize::MAX))
    });
    g.finish();
}

fn query(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let storage = rt.block_on(async {
        let mut config = StorageConfig::new(dir.path());
        config.writer.flush_interval = Duration::from_millis(5);
        let s = Storage::open(config).await.unwrap();
        let mut rng = Rng(3);
        for block in 0..20 {
            let profiles: Vec<NormalizedProfile> = (0..10)
                .map(|svc| {
                    profile(
                        &mut rng,
                        &format!("svc{svc}"),
                        2_000,
                        1_000,
                        T0 + block * 10_000_000_000,
                    )
                })
                .collect();
            s.write_all("bench", profiles).await.unwrap();
        }
        s
    });
    let filter = |selector: &str| SampleFilter {
        tenant: "bench".into(),
        profile_type: CPU.into(),
        selector: parse_selector(selector).unwrap(),
        start_nanos: T0 - 1,
        end_nanos: T0 + 1_000_000_000_000,
        span_ids: vec![],
        trace_ids: vec![],
        profile_ids: vec![],
    };
    let mut g = c.benchmark_group("query_20_blocks_10_services_400k_rows");
    g.sample_size(20);
    let all = filter("{}");
    g.bench_function("flamegraph_all_services", |b| {
        b.iter(|| rt.block_on(storage.query().merge_tree(&all)).unwrap())
    });
    let one = filter(r#"{service_name="svc3"}"#);
    g.bench_function("flamegraph_one_service", |b| {
        b.iter(|| rt.block_on(storage.query().merge_tree(&one)).unwrap())
    });
    let regex = filter(r#"{service_name=~"svc[12]"}"#);
    g.bench_function("flamegraph_regex_two_services", |b| {
        b.iter(|| rt.block_on(storage.query().merge_tree(&regex)).unwrap())
    });
    g.finish();
}

/// One L0 merge: 20 segments, each of 10 pods' profiles of 100 samples, merged into one L1
/// block of about 20,000 rows with two profiles per pod, as the fresh lane's jobs hold on
/// `kiln bench`'s `small` preset. A pod's samples are drawn from 400 stacks of its own over
/// 1,000 functions, so its profiles repeat stacks as a running program's do. Each iteration
/// writes its segments into a new storage first, outside the measurement.
fn compaction(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut rng = Rng(13);
    let pools: Vec<NormalizedProfile> = (0..100)
        .map(|pod| profile(&mut rng, &format!("svc{pod}"), 400, 1_000, T0))
        .collect();
    // Segments s and s + 10 hold the same ten pods' profiles, 100 s apart.
    let data: Vec<Vec<NormalizedProfile>> = (0..20)
        .map(|segment| {
            pools[(segment as usize % 10) * 10..][..10]
                .iter()
                .map(|pool| {
                    let mut p = pool.clone();
                    let series = &mut p.series[0];
                    series.time_nanos = T0 + segment * 10_000_000_000;
                    series.samples = (0..100)
                        .map(|_| {
                            let n = series.samples.len() as u64;
                            series.samples[rng.next(n) as usize].clone()
                        })
                        .collect();
                    p
                })
                .collect()
        })
        .collect();
    let mut g = c.benchmark_group("compaction");
    g.sample_size(30);
    g.measurement_time(Duration::from_secs(15));
    g.bench_function("l0_merge_20_segments_100_pods", |b| {
        b.iter_batched(
            || {
                let dir = tempfile::tempdir().unwrap();
                let storage = rt.block_on(async {
                    let mut config = StorageConfig::new(dir.path());
                    config.writer.flush_interval = Duration::from_millis(1);
                    // Every segment on one shard: one job merges all 20.
                    config.writer.shards = 1;
                    let s = Storage::open(config).await.unwrap();
                    for profiles in &data {
                        s.write_all("bench", profiles.clone()).await.unwrap();
                    }
                    s
                });
                (dir, storage)
            },
            |(dir, storage)| {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_millis() as u64;
                let merged = rt.block_on(storage.compactor().compact_all(now)).unwrap();
                assert_eq!(merged, 1, "one L0 merge");
                (dir, storage)
            },
            criterion::BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(
    benches,
    compaction,
    block_build,
    dataset_add,
    symbols_interning,
    flamegraph,
    query
);
criterion_main!(benches);
