//! A long outage's log replays in bounded memory: a file's records and one segment's buffer at
//! a time, not the whole log (ADR 0018). Its own test binary: the heap is counted for the whole
//! process. Measured: a peak of 22 MB for a 79 MB log (21 MB for half of it); reading the whole
//! log first took 83 MB.

use std::time::Duration;

use kiln_storage::Storage;
use kiln_storage::testing::{frames, logged_config, profile, stacks_around, text_record};
use peak_alloc::PeakAlloc;

#[global_allocator]
static HEAP: PeakAlloc = PeakAlloc;

const T0: i64 = 1_700_000_000_000_000_000;
const SEC: i64 = 1_000_000_000;
/// Records of about 64 KiB, each naming a frame of its own.
const RECORDS: i64 = 1200;
const NAME_BYTES: usize = 64 << 10;

fn stack(i: i64) -> String {
    format!("main;f{i}_{}", "x".repeat(NAME_BYTES))
}

#[test]
fn a_long_log_replays_a_file_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = logged_config(dir.path(), Duration::from_secs(3600));
    let log = config.writer.log.as_mut().unwrap();
    log.max_file_bytes = 1 << 20;
    // Written without a cut: every record stays in the log, about 78 MiB of it.
    config.writer.flush_bytes = 1 << 30;
    let rt = runtime();
    rt.block_on(async {
        let s = Storage::open(config.clone()).await.unwrap();
        for i in 0..RECORDS {
            let stack = stack(i);
            let record = text_record("a", "api", &stack, 1, T0 + i * SEC);
            let p = profile("api", &[(frames(&stack), 1)], T0 + i * SEC);
            s.write_logged("a", vec![p], Some(record), None)
                .await
                .unwrap();
        }
    });
    // The crash: no flush, no close.
    rt.shutdown_timeout(Duration::from_secs(10));
    let logged: u64 = walk(&dir.path().join("wal"));
    assert!(logged > 60 << 20, "{logged} bytes logged");

    // Replayed in segments of about 1 MiB, with caches too small to keep the log's names.
    config.writer.flush_bytes = 1 << 20;
    config.symbols_cache_bytes = 4 << 20;
    config.fresh_cache_bytes = 4 << 20;
    let rt = runtime();
    rt.block_on(async {
        let before = HEAP.current_usage();
        HEAP.reset_peak_usage();
        let s = Storage::open(config.clone()).await.unwrap();
        let peak = HEAP.peak_usage().saturating_sub(before);
        assert_eq!(s.metrics().log_replayed_records.get(), RECORDS as u64);
        eprintln!("replayed {logged} bytes of log in a peak of {peak} bytes of heap");
        assert!(
            peak < (logged / 3) as usize,
            "the replay took {peak} bytes of heap for {logged} bytes of log"
        );
        let stacks = stacks_around(&s, "a", T0).await;
        assert_eq!(stacks.len(), RECORDS as usize);
        assert!(stacks_around(&s, "b", T0).await.is_empty());
        s.close().await;
    });
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Bytes of the files under `dir`.
fn walk(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|e| {
            let p = e.path();
            if p.is_dir() {
                walk(&p)
            } else {
                e.metadata().map_or(0, |m| m.len())
            }
        })
        .sum()
}
