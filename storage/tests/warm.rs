//! The blocks a process writes reach its query caches as they are registered: a fresh
//! segment's symbols and Parquet metadata, a compaction output's symbols. The first query of
//! fresh data (a live dashboard's) then reads and decodes neither from the store; a process that
//! answers no queries (`warm_query_cache` off) keeps nothing.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use kiln_storage::meta::PARTITION_NANOS;
use kiln_storage::testing::{config, filter, frames, now_ms, profile};
use kiln_storage::{Storage, StorageConfig};

const T0: i64 = 1_700_000_000_000_000_000 - 1_700_000_000_000_000_000 % PARTITION_NANOS;
const SEC: i64 = 1_000_000_000;

/// Misses of the symbols and Parquet metadata caches so far.
fn misses(s: &Storage) -> (u64, u64) {
    let c = s.query().counters();
    (
        c.symbols_misses.load(Ordering::Relaxed),
        c.parquet_misses.load(Ordering::Relaxed),
    )
}

async fn stacks(s: &Storage, tenant: &str) -> BTreeMap<Vec<String>, i64> {
    s.query()
        .merge_tree(&filter(tenant, "{}", T0 - SEC, T0 + PARTITION_NANOS))
        .await
        .unwrap()
        .stacks()
}

/// Writes `n` profiles of service `api` to tenant `a`, one flush each.
async fn write(s: &Storage, n: i64) {
    for i in 0..n {
        let stack = frames(&format!("main;handler{i}"));
        s.write("a", profile("api", &[(stack, 10 + i)], T0 + i * SEC))
            .await
            .unwrap();
        s.flush().await;
    }
}

fn expected(n: i64) -> BTreeMap<Vec<String>, i64> {
    (0..n)
        .map(|i| (frames(&format!("main;handler{i}")), 10 + i))
        .collect()
}

fn without_compaction(dir: &std::path::Path, warm: bool) -> StorageConfig {
    let mut c = config(dir);
    c.compaction.enabled = false;
    c.warm_query_cache = warm;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_segment_is_queried_without_reading_its_symbols_or_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(without_compaction(dir.path(), true))
        .await
        .unwrap();
    write(&s, 3).await;
    assert_eq!(stacks(&s, "a").await, expected(3));
    assert_eq!(
        misses(&s),
        (0, 0),
        "every block's symbols and metadata were cached"
    );
    // The cached table is the one the store holds: a process that reads it from the store
    // (a fresh open) answers the same.
    s.close().await;
    drop(s);
    let reopened = Storage::open(without_compaction(dir.path(), true))
        .await
        .unwrap();
    assert_eq!(stacks(&reopened, "a").await, expected(3));
    assert_eq!(
        misses(&reopened),
        (3, 3),
        "read from the store, one of each per segment"
    );
    assert!(
        stacks(&reopened, "b").await.is_empty(),
        "tenant b sees nothing"
    );
    reopened.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_answers_no_queries_keeps_nothing_of_what_it_writes() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(without_compaction(dir.path(), false))
        .await
        .unwrap();
    write(&s, 2).await;
    assert_eq!(stacks(&s, "a").await, expected(2));
    assert_eq!(misses(&s), (2, 2));
    assert!(stacks(&s, "b").await.is_empty(), "tenant b sees nothing");
    s.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_output_is_queried_without_reading_its_symbols() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(config(dir.path())).await.unwrap();
    // Four segments: one level-0 job (`config`'s fan-in).
    write(&s, 4).await;
    assert!(s.compactor().compact_all(now_ms()).await.unwrap() > 0);
    let before = misses(&s).0;
    assert_eq!(stacks(&s, "a").await, expected(4));
    assert_eq!(misses(&s).0, before, "the output's symbols were cached");
    assert!(stacks(&s, "b").await.is_empty(), "tenant b sees nothing");
    s.close().await;
}
