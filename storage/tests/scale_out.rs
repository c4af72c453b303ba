//! Scale-out in process: storages sharing one PostgreSQL metastore and one S3 bucket (the test
//! command's servers), as separate ingest/query and compactor processes would.

use std::collections::BTreeMap;

use kiln_storage::format::meta::PARTITION_NANOS;
use kiln_storage::metastore::BlockQuery;
use kiln_storage::testing::{
    config, frames, merged_stacks, now_ms, postgres_database, profile, s3_location, shared_storage,
    tenant_rows,
};
use kiln_storage::{Storage, StorageConfig};

const T0: i64 = 1_700_000_000_000_000_000 - 1_700_000_000_000_000_000 % PARTITION_NANOS;
const SEC: i64 = 1_000_000_000;

type Stacks = BTreeMap<Vec<String>, i64>;

async fn stacks(s: &Storage, tenant: &str) -> Stacks {
    merged_stacks(s, tenant, T0 - PARTITION_NANOS, T0 + PARTITION_NANOS).await
}

/// The flame graph `n` flushes of [`ingest`] must give tenant `a`.
fn expected_a(n: i64) -> Stacks {
    let mut want = Stacks::new();
    for i in 0..n {
        *want
            .entry(frames(&format!("main;handle;parse{}", i % 5)))
            .or_default() += 10 + i;
        *want.entry(frames("main;idle")).or_default() += 1;
    }
    want
}

/// Writes `n` flushes, each its own L0 segment holding tenants a and b.
async fn ingest(s: &Storage, n: i64) {
    for i in 0..n {
        let t = T0 + i * 10 * SEC;
        let (x, y) = tokio::join!(
            s.write(
                "a",
                profile(
                    "api",
                    &[
                        (frames(&format!("main;handle;parse{}", i % 5)), 10 + i),
                        (frames("main;idle"), 1),
                    ],
                    t
                )
            ),
            s.write("b", profile("db", &[(frames("main;b_only"), 2)], t)),
        );
        x.unwrap();
        y.unwrap();
        s.flush().await;
    }
}

fn role(dir: &std::path::Path, compaction: bool) -> StorageConfig {
    let mut c = config(dir);
    c.compaction.enabled = compaction;
    // One shard, so both tenants of a flush share its one segment.
    c.writer.shards = 1;
    c
}

/// An ingest/query storage and a compactor storage share PostgreSQL and S3: the compactor
/// merges what the other wrote, the other's answers stay the same, a fresh process on the
/// same metastore and bucket answers the same, and other tenants see nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_separate_compactor_shares_postgres_and_s3() {
    let (pg, s3) = (postgres_database().await, s3_location());
    let (d1, d2, d3) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let front = shared_storage(role(d1.path(), false), &pg, &s3).await;
    let compactor = shared_storage(role(d2.path(), true), &pg, &s3).await;

    ingest(&front, 24).await;
    assert_eq!(stacks(&front, "a").await, expected_a(24));
    let l0 = front
        .metastore()
        .query_blocks(BlockQuery::all("a"))
        .await
        .unwrap();
    assert!(l0.len() >= 24, "{}", l0.len());
    let l0_b = front
        .metastore()
        .query_blocks(BlockQuery::all("b"))
        .await
        .unwrap()
        .len();
    let segments = front.store().list("segments").await.unwrap().len();
    assert!(
        segments < l0.len() + l0_b,
        "one object per flush, shared by the tenants flushed together: {segments} objects for \
         {} + {l0_b} entries",
        l0.len()
    );

    // The front end never compacts; the compactor does.
    assert_eq!(front.compactor().compact_all(now_ms()).await.unwrap(), 0);
    let jobs = compactor.compactor().compact_all(now_ms()).await.unwrap();
    assert!(jobs > 0);
    compactor.collect_garbage(u64::MAX).await.unwrap();
    let after = front
        .metastore()
        .query_blocks(BlockQuery::all("a"))
        .await
        .unwrap();
    assert!(
        after.len() < 6 && after.iter().all(|b| b.level > 0),
        "{after:?}"
    );
    assert!(
        front.store().list("segments").await.unwrap().is_empty(),
        "L0 segments deleted once both tenants' entries were compacted"
    );
    assert_eq!(stacks(&front, "a").await, expected_a(24));
    assert_eq!(stacks(&compactor, "a").await, expected_a(24));
    let b_total: i64 = stacks(&front, "b").await.values().sum();
    assert_eq!(b_total, 2 * 24);

    front.close().await;
    compactor.close().await;
    let fresh = shared_storage(role(d3.path(), false), &pg, &s3).await;
    assert_eq!(stacks(&fresh, "a").await, expected_a(24));
    assert!(stacks(&fresh, "other").await.is_empty());
    assert!(!stacks(&fresh, "b").await.contains_key(&frames("main;idle")));
}

/// Two compactors working one queue at once never compact the same blocks twice: every row
/// is in exactly one block afterwards and the totals are those ingested.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_compactors_at_once_never_compact_the_same_blocks() {
    let (pg, s3) = (postgres_database().await, s3_location());
    let (d1, d2, d3) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let front = shared_storage(role(d1.path(), false), &pg, &s3).await;
    ingest(&front, 48).await;
    let rows_before = tenant_rows(&front, "a").await;
    let c1 = shared_storage(role(d2.path(), true), &pg, &s3).await;
    let c2 = shared_storage(role(d3.path(), true), &pg, &s3).await;
    let (j1, j2) = tokio::join!(
        c1.compactor().compact_all(now_ms()),
        c2.compactor().compact_all(now_ms())
    );
    let (j1, j2) = (j1.unwrap(), j2.unwrap());
    assert!(j1 + j2 > 0, "{j1} + {j2} jobs");
    let blocks = front
        .metastore()
        .query_blocks(BlockQuery::all("a"))
        .await
        .unwrap();
    let rows_after: u64 = blocks.iter().map(|b| b.rows).sum();
    assert_eq!(rows_after, rows_before, "no row lost or merged twice");
    let mut ids: Vec<&str> = blocks.iter().map(|b| b.id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), blocks.len());
    assert!(front.metastore().jobs().await.unwrap().is_empty());
    assert_eq!(stacks(&front, "a").await, expected_a(48));
    assert!(stacks(&front, "other").await.is_empty());
}

/// Over S3, the pages a query read come from memory the next time (a dashboard refreshing the
/// same range), with the same answer; with the page cache off they are read again. The
/// compactor's reads never enter it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_read_from_s3_are_read_once() {
    use kiln_storage::query::with_report;
    use kiln_storage::testing::filter;

    let (pg, s3) = (postgres_database().await, s3_location());
    let (d1, d2, d3) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let front = shared_storage(role(d1.path(), true), &pg, &s3).await;
    ingest(&front, 12).await;
    front.compactor().compact_all(now_ms()).await.unwrap();
    // No partial results: every run reads pages.
    let uncached = |dir: &std::path::Path, pages: u64| {
        let mut c = role(dir, false);
        c.results_cache_bytes = 0;
        c.pages_cache_bytes = pages;
        c
    };
    let reader = shared_storage(uncached(d2.path(), 64 << 20), &pg, &s3).await;
    let no_pages = shared_storage(uncached(d3.path(), 0), &pg, &s3).await;
    let f = filter("a", "{}", T0 - PARTITION_NANOS, T0 + PARTITION_NANOS);
    let run = |s: &Storage| {
        let (q, f) = (s.query().clone(), f.clone());
        async move {
            let (tree, report) = with_report(q.merge_tree(&f)).await;
            (tree.unwrap().stacks(), report.stats.bytes_read)
        }
    };
    let (first, cold) = run(&reader).await;
    assert_eq!(first, expected_a(12));
    assert!(cold > 0);
    let (again, warm) = run(&reader).await;
    assert_eq!(again, first);
    assert_eq!(warm, 0, "every page from the cache");
    let _ = run(&no_pages).await;
    let (without, read) = run(&no_pages).await;
    assert_eq!(without, first);
    assert!(read > 0, "no page cache: read again");
    // Another tenant's query reads nothing of a's.
    let (other, _) = with_report(reader.query().merge_tree(&filter(
        "b",
        r#"{service_name="api"}"#,
        T0 - PARTITION_NANOS,
        T0 + PARTITION_NANOS,
    )))
    .await;
    assert!(other.unwrap().stacks().is_empty());
    for s in [front, reader, no_pages] {
        s.close().await;
    }
}

/// A query process reads ahead the blocks another process writes for a tenant it queried:
/// new segments and compaction outputs are in its memory before the next query, which reads
/// nothing from the store. A tenant it never queried is not followed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_process_reads_ahead_what_other_processes_write() {
    use kiln_storage::query::with_report;
    use kiln_storage::testing::filter;

    let (pg, s3) = (postgres_database().await, s3_location());
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let front = shared_storage(role(d1.path(), true), &pg, &s3).await;
    let mut c = role(d2.path(), false);
    c.results_cache_bytes = 0;
    let reader = shared_storage(c, &pg, &s3).await;
    let follower = reader
        .spawn_fresh_follower()
        .expect("PostgreSQL and S3: followed");
    let f = filter("a", "{}", T0 - 60 * SEC, T0 + 600 * SEC);
    let run = |f: kiln_storage::query::SampleFilter| {
        let q = reader.query().clone();
        async move {
            let (tree, report) = with_report(q.merge_tree(&f)).await;
            (tree.unwrap().stacks(), report.stats.bytes_read)
        }
    };
    ingest(&front, 2).await;
    let (first, cold) = run(f.clone()).await;
    assert_eq!(first, expected_a(2));
    assert!(cold > 0, "the first query reads the segments");
    let held = reader.query().caches().fresh_blocks();
    let ids = |blocks: &[std::sync::Arc<kiln_storage::format::meta::BlockMeta>]| {
        blocks
            .iter()
            .map(|b| b.id.clone())
            .collect::<std::collections::HashSet<_>>()
    };
    let before = ids(&reader
        .metastore()
        .query_blocks(BlockQuery::all("a"))
        .await
        .unwrap());

    // Written and compacted elsewhere after that query: read ahead within a few intervals.
    ingest(&front, 6).await;
    front.compactor().compact_all(now_ms()).await.unwrap();
    let blocks = reader
        .metastore()
        .query_blocks(BlockQuery::all("a"))
        .await
        .unwrap();
    assert!(blocks.iter().any(|b| b.level > 0), "{blocks:?}");
    assert!(blocks.iter().any(|b| !before.contains(&b.id)));
    // Each block the tenant has now is held (the new ones read ahead): counting entries is
    // not enough, as the follower may hold segments that compaction replaced meanwhile.
    let new = blocks;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !new
        .iter()
        .all(|b| reader.query().caches().holds_fresh_object(b))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "{} blocks held, {held} before; {} of the {} listed held",
            reader.query().caches().fresh_blocks(),
            new.iter()
                .filter(|b| reader.query().caches().holds_fresh_object(b))
                .count(),
            new.len(),
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let (next, read) = run(f.clone()).await;
    let mut want = expected_a(6);
    for (stack, v) in expected_a(2) {
        *want.entry(stack).or_default() += v;
    }
    assert_eq!(next, want);
    assert_eq!(read, 0, "every block was in memory before the query");

    // Tenant b was never queried here: its blocks were not read ahead, and a's never show.
    let (b, b_read) = run(filter("b", "{}", T0 - 60 * SEC, T0 + 600 * SEC)).await;
    assert!(b_read > 0, "b's blocks are read by its own first query");
    assert_eq!(b.values().sum::<i64>(), 2 * 8);
    assert!(!b.contains_key(&frames("main;idle")));
    follower.abort();
    front.close().await;
    reader.close().await;
}

/// Rows compaction wrote, over every level, as `s`'s metrics count them.
fn rows_rewritten(s: &Storage) -> u64 {
    use kiln_storage::metrics::LevelLabels;
    (0..=kiln_storage::format::meta::TOP_LEVEL)
        .map(|level| {
            s.metrics()
                .compaction_output_rows
                .get_or_create(&LevelLabels { level })
                .get()
        })
        .sum()
}

/// Runs upkeep rounds on every compactor at once until a round in which none planned or ran
/// a job.
async fn upkeep_until_idle(compactors: &[&Storage]) {
    for _ in 0..100 {
        let rounds = futures::future::join_all(compactors.iter().map(|c| c.upkeep(false))).await;
        let busy = rounds
            .into_iter()
            .map(|r| r.unwrap())
            .any(|r| r.jobs_planned > 0 || r.jobs_done > 0);
        if !busy {
            return;
        }
    }
    panic!("compaction never went idle");
}

/// Compaction planned under the cluster's lease (ADR 0020): two compactors running upkeep at
/// once rewrite what one alone does, leave the same layout and the same answers, and a
/// compactor started afresh plans nothing more (quietness comes from the metastore, not from
/// a planner's memory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_compactors_rewrite_what_one_does() {
    let s3 = s3_location();
    let mut rewritten = Vec::new();
    let mut layouts = Vec::new();
    for n in [1, 2] {
        let pg = postgres_database().await;
        let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
        let front = shared_storage(role(dirs[0].path(), false), &pg, &s3).await;
        ingest(&front, 48).await;
        let mut compactors = Vec::new();
        for d in &dirs[1..=n] {
            compactors.push(shared_storage(role(d.path(), true), &pg, &s3).await);
        }
        upkeep_until_idle(&compactors.iter().collect::<Vec<_>>()).await;
        rewritten.push(compactors.iter().map(rows_rewritten).sum::<u64>());
        let restarted = shared_storage(role(dirs[3].path(), true), &pg, &s3).await;
        let again = restarted.upkeep(false).await.unwrap();
        assert_eq!(
            (again.jobs_planned, again.jobs_done),
            (0, 0),
            "a fresh planner sees the partition as the first did"
        );
        let blocks = front
            .metastore()
            .query_blocks(BlockQuery::all("a"))
            .await
            .unwrap();
        let mut levels: Vec<u32> = blocks.iter().map(|b| b.level).collect();
        levels.sort_unstable();
        layouts.push(levels);
        assert_eq!(stacks(&front, "a").await, expected_a(48));
        assert!(stacks(&front, "other").await.is_empty());
    }
    eprintln!("rows rewritten by one compactor and by two: {rewritten:?}");
    assert!(rewritten[0] > 0, "{rewritten:?}");
    assert!(
        rewritten[1] as f64 <= rewritten[0] as f64 * 1.05,
        "two compactors rewrote {} rows, one {}",
        rewritten[1],
        rewritten[0]
    );
    assert_eq!(layouts[0], layouts[1]);
}
