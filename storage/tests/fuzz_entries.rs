//! Every fuzz entry of Kiln's own files (`kiln_storage::fuzz`) over its seeds and seeded
//! mutations of them (`kiln_otel::mutate`): none may panic, and one mutation in a hundred must
//! decode, so the code behind the checksums and checks is reached. `KILN_FUZZ_ITERATIONS` sets the
//! mutations per entry (default 2,000); a failure names the seed to replay it.
//! `KILN_FUZZ_WRITE_SEEDS=<dir>` also writes each entry's seeds to `<dir>/<entry>/`, the corpus to
//! start a `cargo fuzz` run from (`fuzz/README.md`).

use kiln_otel::mutate::{Rng, mutate};
use kiln_storage::fuzz::{ENTRIES, seeds::seeds};

fn iterations() -> u64 {
    std::env::var("KILN_FUZZ_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000)
}

/// Runs `name` over its seeds (each must decode) and `iterations` mutations; returns how many
/// mutations decoded.
fn run(name: &str) -> u64 {
    let entry = ENTRIES.iter().find(|(n, _)| *n == name).unwrap().1;
    let seeds = seeds(name);
    for (i, s) in seeds.iter().enumerate() {
        assert!(entry(s) > 0, "{name}: seed {i} does not decode");
    }
    if let Some(dir) = std::env::var_os("KILN_FUZZ_WRITE_SEEDS") {
        let dir = std::path::Path::new(&dir).join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for (i, s) in seeds.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i}")), s).unwrap();
        }
    }
    let mut decoded = 0;
    for i in 0..iterations() {
        let mut rng = Rng::new(i);
        let seed = &seeds[rng.below(seeds.len())];
        let other = &seeds[rng.below(seeds.len())];
        let (input, what) = mutate(&mut rng, seed, other);
        match std::panic::catch_unwind(|| entry(&input)) {
            Ok(n) => decoded += u64::from(n > 0),
            Err(_) => panic!("{name}: mutation seed {i} ({what}) panicked"),
        }
    }
    decoded
}

/// At least one mutation in a hundred decodes: the code behind the checks is reached.
fn reaches(name: &str) {
    let decoded = run(name);
    let n = iterations();
    eprintln!("{name}: {decoded} of {n} mutations decoded");
    assert!(
        decoded * 100 >= n,
        "{name}: only {decoded} of {n} mutations decoded"
    );
}

#[test]
fn block_meta() {
    reaches("block_meta");
}

#[test]
fn symbols() {
    reaches("symbols");
}

#[test]
fn wal_file() {
    reaches("wal_file");
}

#[test]
fn every_entry_is_tested() {
    let names: Vec<&str> = ENTRIES.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["block_meta", "symbols", "wal_file"]);
}
