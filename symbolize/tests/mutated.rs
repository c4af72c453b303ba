//! Damaged ELF files: seeded mutations of real debug files and programs (bit flips, truncation,
//! repeated and deleted ranges, forged lengths) through the reader's fuzz entry. None may panic.

use kiln_symbolize::testing::{self, Program};

#[test]
fn mutated_elf_files_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let mut seeds = Vec::new();
    for program in [Program::C, Program::Rust] {
        let built = testing::build(program, dir.path()).unwrap();
        seeds.push(std::fs::read(&built.debug).unwrap());
        seeds.push(std::fs::read(&built.stripped).unwrap());
    }
    if testing::have("go") {
        let built = testing::build(Program::GoNoDwarf, dir.path()).unwrap();
        seeds.push(std::fs::read(&built.full).unwrap());
    }
    let iterations: u64 = std::env::var("KILN_FUZZ_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    for i in 0..iterations {
        let mut rng = kiln_otel::mutate::Rng::new(i);
        let seed = &seeds[rng.below(seeds.len())];
        let (bad, what) = kiln_otel::mutate::mutate(&mut rng, seed, seed);
        let result = std::panic::catch_unwind(|| kiln_symbolize::fuzz::elf(&bad));
        assert!(result.is_ok(), "mutation {i} ({what}) panicked");
    }
}
