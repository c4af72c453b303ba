//! What the gateway does to a pprof request before the storage engine sees it: the shape walk
//! ([`pprof::check`]), the decode ([`pprof::decode_checked`]) and the normalization
//! ([`normalize::normalize_pprof`]).
//!
//! `cargo bench -p kiln-otel --bench decode`. One profile shaped as `kiln bench` sends them
//! (65 samples of 24-deep stacks, a function and a location per frame), and the real profiles of
//! `../shared/corpus/pprof` that are there (none when the directory is absent).

use std::collections::HashMap;
use std::hint::black_box;
use std::path::Path;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kiln_otel::model::Labels;
use kiln_otel::normalize::{self, IngestMeta, NormalizeLimits};
use kiln_otel::pprof;
use kiln_proto::google::v1 as pb;
use prost::Message;
use prost::bytes::Bytes;

const MAX_BYTES: usize = 64 << 20;

// The server's allocator (gateway/src/main.rs): decode and normalize allocate per string,
// sample and table, and glibc's malloc would weigh those differently.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// A CPU profile as `kiln bench` sends one: 65 samples whose stacks are 24 frames drawn from a
/// pool of 300 Go-style function names, one function and one location per name.
fn bench_shaped() -> Vec<u8> {
    let names: Vec<String> = (0..300)
        .map(|i| {
            format!(
                "github.com/example/service{}/internal/pkg{}.(*Handler).Method{i}",
                i % 7,
                i % 13
            )
        })
        .collect();
    let mut strings = vec![String::new(), "cpu".into(), "nanoseconds".into()];
    let mut ids: HashMap<usize, u64> = HashMap::new();
    let mut profile = pb::Profile {
        sample_type: vec![pb::ValueType { r#type: 1, unit: 2 }],
        period_type: Some(pb::ValueType { r#type: 1, unit: 2 }),
        period: 10_000_000,
        time_nanos: 1_700_000_000_000_000_000,
        duration_nanos: 10_000_000_000,
        ..Default::default()
    };
    let mut x = 0x5eedu64;
    for s in 0..65u64 {
        let mut location_id = Vec::with_capacity(24);
        for depth in 0..24usize {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            // Roots shared, leaves spread: the first frames come from a few names.
            let pick = if depth < 6 {
                depth
            } else {
                (x >> 33) as usize % names.len()
            };
            let next = ids.len() as u64 + 1;
            let id = *ids.entry(pick).or_insert_with(|| {
                strings.push(names[pick].clone());
                let s = strings.len() as i64 - 1;
                profile.function.push(pb::Function {
                    id: next,
                    name: s,
                    system_name: s,
                    ..Default::default()
                });
                profile.location.push(pb::Location {
                    id: next,
                    line: vec![pb::Line {
                        function_id: next,
                        line: 0,
                    }],
                    ..Default::default()
                });
                next
            });
            location_id.push(id);
        }
        location_id.reverse(); // leaf first
        profile.sample.push(pb::Sample {
            location_id,
            value: vec![(1 + s % 20) as i64 * 10_000_000],
            label: vec![],
        });
    }
    profile.string_table = strings;
    profile.encode_to_vec()
}

fn meta() -> IngestMeta {
    IngestMeta {
        labels: Labels::from_pairs([("service_name", "bench"), ("pod", "pod-1")]),
        time_nanos: 1_700_000_000_000_000_000,
        duration_nanos: 10_000_000_000,
        display_names: HashMap::new(),
    }
}

fn inputs() -> Vec<(String, Vec<u8>)> {
    let mut out = vec![("bench_shaped".to_owned(), bench_shaped())];
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus/pprof");
    for name in [
        "pyroscope__go.cpu.labels.pprof",
        "parca__profile-with-labels.pb.gz",
        "pyroscope__dotnet.labels.pprof",
    ] {
        let Ok(data) = std::fs::read(dir.join(name)) else {
            continue;
        };
        // Plain protobuf, as the gateway holds a body once it is inflated.
        let Ok(plain) = kiln_otel::compress::maybe_inflate(&data, MAX_BYTES) else {
            continue;
        };
        out.push((name.to_owned(), plain.into_owned()));
    }
    out
}

fn decode_normalize(c: &mut Criterion) {
    let meta = meta();
    let limits = NormalizeLimits::default();
    let mut g = c.benchmark_group("pprof_decode_normalize");
    for (name, data) in inputs() {
        let data = Bytes::from(data);
        g.throughput(Throughput::Bytes(data.len() as u64));
        g.bench_with_input(BenchmarkId::from_parameter(&name), &data, |b, data| {
            b.iter(|| {
                let checked = pprof::check(data.clone()).unwrap();
                let (p, _) = pprof::decode_checked(checked, MAX_BYTES).unwrap();
                black_box(normalize::normalize_pprof(&p, &meta, &limits).unwrap())
            })
        });
    }
    g.finish();
}

criterion_group!(benches, decode_normalize);
criterion_main!(benches);
