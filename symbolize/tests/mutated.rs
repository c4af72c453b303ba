//! Damaged ELF files: seeded mutations of real debug files and programs, plain and with their
//! debug sections compressed (bit flips, truncation, repeated and deleted ranges, forged
//! lengths), through the reader's fuzz entry. None may panic, and none may take more of the
//! heap than the entry's inflation bound allows for its size (counted by the allocator).

use std::path::Path;

use kiln_symbolize::debug_file::MAX_INFLATION_RATIO;
use kiln_symbolize::testing::{self, Compression, Program};
use peak_alloc::PeakAlloc;

#[global_allocator]
static HEAP: PeakAlloc = PeakAlloc;

/// The last panic's message, while the entry runs.
static PANIC: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// The heap one run of the entry may take: what its file may inflate to
/// ([`kiln_symbolize::fuzz::LIMITS`]), the reader's own copies of the file's tables (a few
/// times its size), and a constant.
fn heap_bound(len: usize) -> usize {
    let inflated = kiln_symbolize::fuzz::LIMITS.limit_for(len as u64) as usize;
    inflated + 8 * len + (16 << 20)
}

#[test]
fn mutated_elf_files_never_panic_nor_take_more_heap_than_their_bound() {
    let dir = tempfile::tempdir().unwrap();
    let mut seeds = Vec::new();
    for program in [Program::C, Program::Rust] {
        let built = testing::build(program, dir.path()).unwrap();
        seeds.push(std::fs::read(&built.debug).unwrap());
        seeds.push(std::fs::read(&built.stripped).unwrap());
        for how in [Compression::Zlib, Compression::Zstd] {
            let compressed = testing::compress(&built.full, how).unwrap();
            seeds.push(std::fs::read(&compressed).unwrap());
        }
    }
    if testing::have("go") {
        let built = testing::build(Program::GoNoDwarf, dir.path()).unwrap();
        seeds.push(std::fs::read(&built.full).unwrap());
    }
    // Go 1.15's program carries the Go 1.2 table layout.
    if let Some(go) = std::env::var_os("KILN_TEST_GO115").filter(|g| Path::new(g).is_file()) {
        let old = dir.path().join("go1.15");
        std::fs::create_dir_all(&old).unwrap();
        let built = testing::build_with_go(Program::GoNoDwarf, &old, Path::new(&go)).unwrap();
        seeds.push(std::fs::read(&built.full).unwrap());
    }
    let iterations: u64 = std::env::var("KILN_FUZZ_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let mut worst = (0usize, 0usize);
    for i in 0..iterations {
        let mut rng = kiln_otel::mutate::Rng::new(i);
        let seed = &seeds[rng.below(seeds.len())];
        let (bad, what) = kiln_otel::mutate::mutate(&mut rng, seed, seed);
        // The reader contains the panics of a damaged file's DWARF (an overflow in a debug
        // build): a quiet hook keeps the default one's backtrace, tens of MB of the test
        // binary's own debug information, out of the count.
        let default_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|info| {
            *PANIC.lock().unwrap_or_else(|e| e.into_inner()) = Some(info.to_string());
        }));
        let before = HEAP.current_usage();
        HEAP.reset_peak_usage();
        let result = std::panic::catch_unwind(|| kiln_symbolize::fuzz::elf(&bad));
        let peak = HEAP.peak_usage().saturating_sub(before);
        std::panic::set_hook(default_hook);
        let panic = PANIC.lock().unwrap_or_else(|e| e.into_inner()).take();
        assert!(result.is_ok(), "mutation {i} ({what}) panicked: {panic:?}");
        let bound = heap_bound(bad.len());
        assert!(
            peak <= bound,
            "mutation {i} ({what}) of {} bytes took {peak} bytes of heap, past its bound of \
             {bound} ({MAX_INFLATION_RATIO}× inflation)",
            bad.len()
        );
        if peak > worst.0 {
            worst = (peak, bad.len());
        }
    }
    eprintln!(
        "{iterations} mutations; the most heap one took: {} bytes, for a file of {}",
        worst.0, worst.1
    );
}
