//! The blocks a process writes reach its query caches as they are registered: a fresh
//! segment's symbols, Parquet metadata and whole object, a compaction output's symbols and,
//! when it is small, its object. The
//! first query of fresh data (a live dashboard's) then reads and decodes nothing from the store;
//! a process that answers no queries (`warm_query_cache` off) keeps nothing.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use kiln_storage::format::meta::PARTITION_NANOS;
use kiln_storage::testing::{config, filter, frames, now_ms, profile};
use kiln_storage::{Storage, StorageConfig};

const T0: i64 = 1_700_000_000_000_000_000 - 1_700_000_000_000_000_000 % PARTITION_NANOS;
const SEC: i64 = 1_000_000_000;

/// Bytes queries have read from the object store so far.
fn bytes_read(s: &Storage) -> u64 {
    s.query().counters().bytes_read.load(Ordering::Relaxed)
}

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
    assert_eq!(
        bytes_read(&s),
        0,
        "every page came from the segments in memory"
    );
    assert_eq!(s.query().fresh_blocks(), 3);
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
    assert!(bytes_read(&reopened) > 0);
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
    assert!(bytes_read(&s) > 0);
    assert_eq!(s.query().fresh_blocks(), 0);
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

/// With no memory for fresh objects, a fresh segment's pages are read from the store (its
/// symbols and metadata still cached), with the same answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_room_for_fresh_objects_pages_are_read_from_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = without_compaction(dir.path(), true);
    c.fresh_cache_bytes = 0;
    let s = Storage::open(c).await.unwrap();
    write(&s, 2).await;
    assert_eq!(stacks(&s, "a").await, expected(2));
    assert_eq!(misses(&s), (0, 0));
    assert!(bytes_read(&s) > 0, "the pages were read");
    assert_eq!(s.query().fresh_blocks(), 0);
    assert!(stacks(&s, "b").await.is_empty(), "tenant b sees nothing");
    s.close().await;
}

/// A compaction reads its level-0 sources from memory and, once its outputs replace them,
/// lets them go; a segment of two tenants is held for each, and the query of one reads
/// nothing of the other's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compacted_segments_leave_memory() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(config(dir.path())).await.unwrap();
    // Tenant b's profile in the same flush as a's first: one object, two blocks.
    s.write("b", profile("web", &[(frames("main;b"), 5)], T0))
        .await
        .unwrap();
    write(&s, 4).await;
    assert_eq!(s.query().fresh_blocks(), 5);
    assert!(s.compactor().compact_all(now_ms()).await.unwrap() > 0);
    assert_eq!(
        bytes_read(&s),
        0,
        "the compaction read its sources from memory"
    );
    // a's four segments were merged into one output, held in their place (small next to the
    // room); b's lone block (no job of its own) stays.
    assert_eq!(s.query().fresh_blocks(), 2);
    assert_eq!(stacks(&s, "a").await, expected(4));
    assert_eq!(bytes_read(&s), 0, "the output is read from memory too");
    let before = bytes_read(&s);
    assert_eq!(
        stacks(&s, "b").await,
        BTreeMap::from([(frames("main;b"), 5)]),
        "b sees its own profile only"
    );
    assert_eq!(
        bytes_read(&s),
        before,
        "b's fresh block is read from memory"
    );
    s.close().await;
}

/// An output larger than an eighth of the room for fresh objects is not held (one large merge
/// would push out the small blocks dashboards read): it is read from the store, and the
/// sources it replaced leave memory all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_compaction_output_is_read_from_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    // Room for each segment, not for eight outputs.
    c.fresh_cache_bytes = 16 << 10;
    let s = Storage::open(c).await.unwrap();
    write(&s, 4).await;
    assert_eq!(s.query().fresh_blocks(), 4);
    assert!(s.compactor().compact_all(now_ms()).await.unwrap() > 0);
    assert_eq!(bytes_read(&s), 0, "the sources were read from memory");
    assert_eq!(
        s.query().fresh_blocks(),
        0,
        "the sources left, the output was not kept"
    );
    assert_eq!(stacks(&s, "a").await, expected(4));
    assert!(bytes_read(&s) > 0, "the output is read from the store");
    assert!(stacks(&s, "b").await.is_empty(), "tenant b sees nothing");
    s.close().await;
}

/// With no room for symbols and metadata, a fresh segment's are decoded again per query, from
/// its object in memory: still nothing read from the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_room_for_symbols_a_fresh_segment_is_still_read_from_memory() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = without_compaction(dir.path(), true);
    c.symbols_cache_bytes = 0;
    let s = Storage::open(c).await.unwrap();
    write(&s, 2).await;
    assert_eq!(stacks(&s, "a").await, expected(2));
    assert_eq!(misses(&s), (2, 2), "decoded, not cached");
    assert_eq!(bytes_read(&s), 0, "from the objects in memory");
    assert!(stacks(&s, "b").await.is_empty(), "tenant b sees nothing");
    s.close().await;
}

/// A fresh segment held in memory is answered while the object store is down; a block that is
/// not (written before a restart, or pushed out of memory) is answered "unavailable".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_data_is_answered_through_a_store_outage() {
    use kiln_storage::ErrorKind;
    let dir = tempfile::tempdir().unwrap();
    let mut c = without_compaction(dir.path(), true);
    c.spool_max_bytes = 0;
    let (s, faulty) = kiln_storage::testing::faulty_storage(c).await;
    write(&s, 2).await;
    faulty.set_down(true);
    assert_eq!(stacks(&s, "a").await, expected(2), "from memory");
    assert!(stacks(&s, "b").await.is_empty(), "tenant b sees nothing");
    faulty.set_down(false);
    s.close().await;
    drop(s);

    let (reopened, faulty) =
        kiln_storage::testing::faulty_storage(without_compaction(dir.path(), true)).await;
    faulty.set_down(true);
    let e = reopened
        .query()
        .merge_tree(&filter("a", "{}", T0 - SEC, T0 + PARTITION_NANOS))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    faulty.set_down(false);
    // The failed query's block scans are aborted when it returns, but one may still be
    // loading a range when the store comes back, and a query that asks for the same range
    // then shares that load's error (the caches coalesce loads): answered once they are done.
    let f = filter("a", "{}", T0 - SEC, T0 + PARTITION_NANOS);
    let mut answer = reopened.query().merge_tree(&f).await;
    for _ in 0..50 {
        match &answer {
            Err(e) if e.kind() == ErrorKind::Unavailable => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                answer = reopened.query().merge_tree(&f).await;
            }
            _ => break,
        }
    }
    assert_eq!(answer.unwrap().stacks(), expected(2));
    assert!(
        stacks(&reopened, "b").await.is_empty(),
        "tenant b sees nothing"
    );
    reopened.close().await;
}
