//! Every fuzz entry over its seeds and seeded mutations of them (`kiln_otel::mutate`): none may
//! panic. The real corpus (`../shared/corpus`) adds seeds when present. `KILN_FUZZ_ITERATIONS`
//! sets the mutations per entry (default 2,000); a failure names the seed to replay it.

use kiln_otel::fuzz::{ENTRIES, seeds::seeds};
use kiln_otel::mutate::{Rng, mutate};

fn corpus() -> Option<std::path::PathBuf> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!("{} is absent: built-in seeds only", dir.display());
        None
    }
}

fn iterations() -> u64 {
    std::env::var("KILN_FUZZ_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000)
}

/// Runs `entry` over its seeds, then over `iterations` mutations, on a thread with the
/// runtime's stack size (what a request's decoding gets).
fn run(name: &str) {
    let entry = ENTRIES.iter().find(|(n, _)| *n == name).unwrap().1;
    let seeds = seeds(name, corpus().as_deref());
    // JFR has no built-in seed (its writer is the reader's unit tests'); the corpus has one.
    if seeds.is_empty() {
        // Only the corpus has seeds for it; under CI, with ../shared present, this is a failure.
        let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus");
        assert!(
            !corpus.is_dir(),
            "no seeds for {name}, though {} is present",
            corpus.display()
        );
        kiln_otel::skip::shared_absent(&corpus);
        return;
    }
    let n = iterations();
    let name = name.to_owned();
    std::thread::Builder::new()
        .stack_size(8 << 20)
        .spawn(move || {
            for s in &seeds {
                entry(s);
            }
            for i in 0..n {
                let mut rng = Rng::new(i);
                let seed = &seeds[rng.below(seeds.len())];
                let other = &seeds[rng.below(seeds.len())];
                let (input, what) = mutate(&mut rng, seed, other);
                let result = std::panic::catch_unwind(|| entry(&input));
                assert!(
                    result.is_ok(),
                    "{name}: mutation seed {i} ({what}) panicked"
                );
            }
        })
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn pprof() {
    run("pprof");
}

#[test]
fn otlp_protobuf() {
    run("otlp_protobuf");
}

#[test]
fn otlp_json() {
    run("otlp_json");
}

#[test]
fn jfr() {
    run("jfr");
}

#[test]
fn speedscope() {
    run("speedscope");
}

#[test]
fn folded() {
    run("folded");
}

#[test]
fn parca_arrow() {
    run("parca_arrow");
}

#[test]
fn push() {
    run("push");
}

#[test]
fn parca_raw() {
    run("parca_raw");
}

#[test]
fn record() {
    run("record");
}

#[test]
fn every_entry_is_tested() {
    let names: Vec<&str> = ENTRIES.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        [
            "pprof",
            "otlp_protobuf",
            "otlp_json",
            "jfr",
            "speedscope",
            "folded",
            "parca_arrow",
            "push",
            "parca_raw",
            "record"
        ]
    );
}
