//! Storage v2 end to end, in process: segments, compaction, garbage collection, retention,
//! quarantine, store failures and rebuilding the index from footers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kiln_storage::format::meta::{BlockMeta, PARTITION_NANOS, TOP_LEVEL, object_id_of_path};
use kiln_storage::metastore::BlockQuery;
use kiln_storage::query::{Aggregation, Exemplars};
use kiln_storage::testing::{
    config, config_with_clock, faulty_storage, filter, frames, now_ms, profile,
    rebuild_lost_metastore, tenant_rows,
};
use kiln_storage::{ErrorKind, Storage};

const T0: i64 = 1_700_000_000_000_000_000 - 1_700_000_000_000_000_000 % PARTITION_NANOS;
const SEC: i64 = 1_000_000_000;

type Stacks = BTreeMap<Vec<String>, i64>;

async fn stacks(s: &Storage, tenant: &str, selector: &str) -> Stacks {
    s.query()
        .merge_tree(&filter(
            tenant,
            selector,
            T0 - PARTITION_NANOS,
            T0 + 16 * PARTITION_NANOS,
        ))
        .await
        .unwrap()
        .stacks()
}

async fn series(s: &Storage, tenant: &str) -> Vec<(Vec<(String, String)>, Vec<(i64, f64)>)> {
    s.query()
        .select_series(
            &filter(tenant, "{}", T0 - PARTITION_NANOS, T0 + 4 * PARTITION_NANOS),
            &["service_name".to_string()],
            60 * SEC,
            Aggregation::Sum,
            None,
            Exemplars::None,
        )
        .await
        .unwrap()
        .into_iter()
        .map(|s| (s.labels, s.points))
        .collect()
}

/// The blocks of `tenant`, as the metastore lists them.
async fn blocks(s: &Storage, tenant: &str) -> Vec<Arc<BlockMeta>> {
    s.metastore()
        .query_blocks(BlockQuery::all(tenant))
        .await
        .unwrap()
}

/// The ids of the segments in the store.
async fn segment_ids(s: &Storage) -> Vec<String> {
    s.store()
        .list("segments")
        .await
        .unwrap()
        .iter()
        .filter_map(|o| object_id_of_path(o.location.as_ref()).map(str::to_owned))
        .collect()
}

async fn objects(s: &Storage) -> usize {
    let mut n = s.store().list("segments").await.unwrap().len();
    n += s.store().list("blocks").await.unwrap().len();
    n
}

/// Tenant b's answers are what they were, and hold none of tenant a's frames.
async fn assert_b_untouched_and_walled(s: &Storage, before_b: &Stacks) {
    let b = stacks(s, "b", "{}").await;
    assert_eq!(&b, before_b, "tenant b is untouched");
    assert!(
        !b.keys().flatten().any(|f| f.starts_with("parse")),
        "tenant wall"
    );
}

/// Writes `n` flushes for tenants a and b (services api and db), each its own segment.
async fn ingest(s: &Storage, n: i64) {
    for i in 0..n {
        let t = T0 + i * 10 * SEC;
        let stack = |leaf: &str| frames(&format!("main;handle;{leaf}{}", i % 7));
        let (x, y) = tokio::join!(
            s.write(
                "a",
                profile(
                    "api",
                    &[(stack("parse"), 10 + i), (frames("main;idle"), 1)],
                    t
                )
            ),
            s.write(
                "b",
                profile("db", &[(stack("query"), 5), (frames("main;b_only"), 2)], t)
            ),
        );
        x.unwrap();
        y.unwrap();
        s.write("a", profile("db", &[(stack("scan"), 3)], t + SEC))
            .await
            .unwrap();
        s.flush().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_merges_levels_and_keeps_every_answer() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(config(dir.path())).await.unwrap();
    ingest(&s, 24).await;
    let before_a = stacks(&s, "a", "{}").await;
    let before_api = stacks(&s, "a", r#"{service_name="api"}"#).await;
    let before_b = stacks(&s, "b", "{}").await;
    let series_a = series(&s, "a").await;
    let pprof_total: i64 = s
        .query()
        .merge_pprof(&filter("a", "{}", i64::MIN, i64::MAX))
        .await
        .unwrap()
        .sample
        .iter()
        .map(|x| x.value[0])
        .sum();
    let l0 = blocks(&s, "a").await;
    assert!(
        l0.len() >= 24 && l0.iter().all(|b| b.level == 0),
        "{}",
        l0.len()
    );
    let segments_before = objects(&s).await;

    let done = s.compactor().compact_all(now_ms()).await.unwrap();
    assert!(done > 0);
    let after = blocks(&s, "a").await;
    assert!(
        after.len() * 3 < l0.len(),
        "blocks left: {} of {}",
        after.len(),
        l0.len()
    );
    assert!(after.iter().any(|b| b.level >= 2), "levels climbed");
    assert_eq!(stacks(&s, "a", "{}").await, before_a);
    assert_eq!(stacks(&s, "a", r#"{service_name="api"}"#).await, before_api);
    assert_eq!(series(&s, "a").await, series_a);
    assert_b_untouched_and_walled(&s, &before_b).await;
    let pprof_after: i64 = s
        .query()
        .merge_pprof(&filter("a", "{}", i64::MIN, i64::MAX))
        .await
        .unwrap()
        .sample
        .iter()
        .map(|x| x.value[0])
        .sum();
    assert_eq!(pprof_after, pprof_total);
    // One symbol table per compacted block: its size is what the block carries, once.
    let symbols: u64 = after.iter().map(|b| b.symbols.size).sum();
    let symbols_before: u64 = l0.iter().map(|b| b.symbols.size).sum();
    assert!(
        symbols * 4 < symbols_before,
        "{symbols} vs {symbols_before}"
    );

    // Sources are deleted once due; the answers stay.
    let deleted = s.collect_garbage(u64::MAX).await.unwrap();
    assert!(deleted >= 24, "{deleted}");
    assert!(objects(&s).await < segments_before);
    assert_eq!(stacks(&s, "a", "{}").await, before_a);
    assert_eq!(stacks(&s, "b", "{}").await, before_b);

    // After a restart, the same.
    s.close().await;
    drop(s);
    let s = Storage::open(config(dir.path())).await.unwrap();
    assert_eq!(stacks(&s, "a", "{}").await, before_a);
    assert_eq!(series(&s, "a").await, series_a);
}

/// A compaction whose commit went through but whose answer was lost keeps its outputs: they
/// are what the metastore lists, so queries read them and nothing is quarantined, and the
/// sources are deleted when due. A commit the metastore refused deletes them (covered by the
/// lease tests); the orphan sweep leaves registered outputs alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_answer_was_lost_keeps_its_outputs() {
    use kiln_storage::metastore::Metastore;
    use kiln_storage::testing::CountingMetastore;
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let metastore = Arc::new(CountingMetastore::new(c.open_metastore().await.unwrap()));
    let s = Storage::with_parts(
        c.clone(),
        c.open_object_store().unwrap(),
        Arc::clone(&metastore) as Arc<dyn Metastore>,
    )
    .unwrap();
    ingest(&s, 24).await;
    let before_a = stacks(&s, "a", "{}").await;
    let before_b = stacks(&s, "b", "{}").await;
    metastore.lose_job_answers.store(true, Ordering::SeqCst);
    let err = s.compactor().compact_all(now_ms()).await.unwrap_err();
    assert!(err.to_string().contains("answer"), "{err}");
    metastore.lose_job_answers.store(false, Ordering::SeqCst);
    let listed = blocks(&s, "a").await;
    assert!(
        listed.iter().any(|b| b.level > 0),
        "the commit went through"
    );
    for b in &listed {
        assert!(
            s.store().get(&b.path()).await.is_ok(),
            "{} is listed but gone",
            b.path()
        );
    }
    s.collect_garbage(u64::MAX).await.unwrap();
    s.sweep_orphans(u64::MAX).await.unwrap();
    assert_eq!(stacks(&s, "a", "{}").await, before_a);
    assert_b_untouched_and_walled(&s, &before_b).await;
    assert_eq!(s.query().counters().quarantined.load(Ordering::Relaxed), 0);
}

/// Top-level blocks merge with each other by size, so the block count follows the volume of
/// data, not the number of flushes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_level_blocks_merge_with_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    let p = |blocks| kiln_storage::compaction::LevelPolicy {
        blocks,
        age: std::time::Duration::from_secs(365 * 24 * 3600),
    };
    c.compaction.levels = vec![p(2), p(2), p(2)];
    c.compaction.top.fanout = 2;
    let shards = c.writer.shards as usize;
    let s = Storage::open(c).await.unwrap();
    ingest(&s, 40).await;
    let rows_before = tenant_rows(&s, "a").await;
    let before_a = stacks(&s, "a", "{}").await;
    let before_b = stacks(&s, "b", "{}").await;
    let series_a = series(&s, "a").await;
    s.compactor().compact_all(now_ms()).await.unwrap();
    let after = blocks(&s, "a").await;
    let top: Vec<_> = after
        .iter()
        .filter(|b| b.level == kiln_storage::format::meta::TOP_LEVEL)
        .collect();
    // 40 flushes make 5 L3 blocks per shard; merged two by two in size tiers, at most one
    // block per tier (of 1 MiB, 2 MiB, …) is left, and these are all far below 1 MiB.
    assert!(!top.is_empty());
    assert!(top.len() <= shards, "top-level blocks: {}", top.len());
    assert!(after.len() <= 4 * shards, "blocks: {}", after.len());
    assert_eq!(
        tenant_rows(&s, "a").await,
        rows_before,
        "every row kept once"
    );
    assert!(
        top.iter()
            .any(|b| b.compacted_from.len() >= 2 && b.rows > 0),
        "a top-level block replaced others"
    );
    assert_eq!(stacks(&s, "a", "{}").await, before_a);
    assert_eq!(series(&s, "a").await, series_a);
    assert_b_untouched_and_walled(&s, &before_b).await;
}

/// Once a partition has been quiet for the top level's age, the blocks left below the top (a
/// lone L1 or L2 that no other of its level will join) are packed with the top level's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_partition_leaves_no_block_below_the_top() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(config(dir.path())).await.unwrap();
    ingest(&s, 23).await;
    let rows_before = tenant_rows(&s, "a").await;
    let before_a = stacks(&s, "a", "{}").await;
    let before_b = stacks(&s, "b", "{}").await;
    let series_a = series(&s, "a").await;
    let levels = || {
        let s = s.clone();
        async move {
            let mut levels: Vec<u32> = blocks(&s, "a").await.iter().map(|b| b.level).collect();
            levels.sort();
            levels
        }
    };
    // Blocks that have just come: the levels merge by count, and some are left over.
    s.compactor().compact_all(now_ms()).await.unwrap();
    let fresh = levels().await;
    assert!(
        fresh.iter().any(|&l| l > 0 && l < TOP_LEVEL),
        "lone blocks below the top: {fresh:?}"
    );
    // Once nothing new has come for the top level's age (an hour): all of it is packed at the
    // top. (L0 segments merge by their own level's age, a year in these tests.)
    s.compactor()
        .compact_all(now_ms() + 3_600_000)
        .await
        .unwrap();
    let settled = levels().await;
    assert!(
        settled.contains(&TOP_LEVEL) && !settled.iter().any(|&l| l > 0 && l < TOP_LEVEL),
        "{settled:?} (was {fresh:?})"
    );
    assert_eq!(
        tenant_rows(&s, "a").await,
        rows_before,
        "every row kept once"
    );
    assert_eq!(stacks(&s, "a", "{}").await, before_a);
    assert_eq!(series(&s, "a").await, series_a);
    assert_b_untouched_and_walled(&s, &before_b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_store_is_unavailable_and_ingest_recovers_without_restart() {
    let dir = tempfile::tempdir().unwrap();
    // Without a spool (with one, writes wait in it: `tests/spool.rs`).
    let mut c = config(dir.path());
    c.spool_max_bytes = 0;
    let (s, faulty) = faulty_storage(c).await;
    s.write("t", profile("api", &[(frames("main;ok"), 1)], T0))
        .await
        .unwrap();
    faulty.fail_puts.store(true, Ordering::SeqCst);
    let err = s
        .write("t", profile("api", &[(frames("main;lost"), 5)], T0))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(faulty.refused_puts.load(Ordering::SeqCst) > 0);
    faulty.fail_puts.store(false, Ordering::SeqCst);
    s.write("t", profile("api", &[(frames("main;after"), 2)], T0))
        .await
        .unwrap();
    let got = stacks(&s, "t", "{}").await;
    assert_eq!(
        got,
        Stacks::from([(frames("main;after"), 2), (frames("main;ok"), 1)]),
        "nothing refused was stored"
    );
    // Reads fail as unavailable too, and are not mistaken for corruption.
    s.close().await;
    drop(s);
    let s2 = {
        let (s2, f2) = faulty_storage(config(dir.path())).await;
        f2.fail_gets.store(true, Ordering::SeqCst);
        let err = s2
            .query()
            .merge_tree(&filter("t", "{}", i64::MIN, i64::MAX))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
        f2.fail_gets.store(false, Ordering::SeqCst);
        s2
    };
    assert!(s2.metastore().quarantined(None).await.unwrap().is_empty());
    assert_eq!(stacks(&s2, "t", "{}").await, got);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_is_quarantined_and_queries_answer_from_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let bad_path;
    {
        let s = Storage::open(config(dir.path())).await.unwrap();
        s.write("t", profile("api", &[(frames("main;first"), 3)], T0))
            .await
            .unwrap();
        s.write("t", profile("api", &[(frames("main;second"), 4)], T0 + SEC))
            .await
            .unwrap();
        s.write("u", profile("api", &[(frames("main;other"), 4)], T0))
            .await
            .unwrap();
        let found = blocks(&s, "t").await;
        assert_eq!(found.len(), 2);
        let first = found.iter().min_by_key(|b| b.min_time_nanos).unwrap();
        bad_path = first.path();
        let file = dir.path().join("objects").join(&bad_path);
        let mut bytes = std::fs::read(&file).unwrap();
        let at = (first.symbols.offset + first.symbols.size / 2) as usize;
        bytes[at] ^= 0x5a;
        std::fs::write(&file, bytes).unwrap();
        s.close().await;
    }
    let s = Storage::open(config(dir.path())).await.unwrap();
    let got = stacks(&s, "t", "{}").await;
    assert_eq!(got, Stacks::from([(frames("main;second"), 4)]));
    assert_eq!(s.query().counters().quarantined.load(Ordering::Relaxed), 1);
    let q = s.metastore().quarantined(Some("t")).await.unwrap();
    assert_eq!(q.len(), 1);
    assert_eq!(q[0].path, bad_path);
    assert!(q[0].reason.contains("checksum"), "{}", q[0].reason);
    // The next query does not even look at it; the other tenant never did.
    assert_eq!(stacks(&s, "t", "{}").await, got);
    assert_eq!(
        stacks(&s, "u", "{}").await,
        Stacks::from([(frames("main;other"), 4)])
    );
    assert!(
        s.metastore()
            .quarantined(Some("u"))
            .await
            .unwrap()
            .is_empty()
    );
    // A quarantined object is known: the sweeper keeps it for inspection.
    assert_eq!(s.sweep_orphans(u64::MAX).await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_drops_partitions_by_ingestion_time_for_one_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(AtomicU64::new(0));
    let mut cfg = config_with_clock(dir.path(), clock.clone());
    cfg.writer.shards = 1;
    let s = Storage::open(cfg).await.unwrap();
    let ms = |t: i64| (t / 1_000_000) as u64;
    for day in 0..3 {
        let t = T0 + day * 4 * PARTITION_NANOS;
        clock.store(ms(t), Ordering::SeqCst);
        // Written together, so both tenants usually share the day's segment.
        let (x, y) = tokio::join!(
            s.write("t", profile("api", &[(frames(&format!("day{day}")), 1)], t)),
            s.write("u", profile("api", &[(frames(&format!("u{day}")), 1)], t)),
        );
        x.unwrap();
        y.unwrap();
    }
    // A backfilled profile (data from day 0, ingested on day 2) lives as long as its ingestion.
    s.write("t", profile("api", &[(frames("backfill"), 1)], T0))
        .await
        .unwrap();
    let ids = |tenant: &'static str| {
        let s = s.clone();
        async move {
            blocks(&s, tenant)
                .await
                .iter()
                .map(|b| (b.id.clone(), b.partition()))
                .collect::<Vec<_>>()
        }
    };
    let day0 = kiln_storage::format::meta::partition_of(T0);
    let t_day0: Vec<String> = ids("t")
        .await
        .into_iter()
        .filter(|(_, p)| *p == day0)
        .map(|(id, _)| id)
        .collect();
    let removed = s
        .apply_retention("t", T0 + 4 * PARTITION_NANOS)
        .await
        .unwrap();
    assert_eq!(removed, t_day0.len(), "day 0's entries");
    let got = stacks(&s, "t", "{}").await;
    assert_eq!(
        got.keys().map(|k| k[0].as_str()).collect::<Vec<_>>(),
        ["backfill", "day1", "day2"]
    );
    assert_eq!(
        stacks(&s, "u", "{}").await.len(),
        3,
        "the other tenant keeps everything"
    );
    // A day-0 segment that also holds u's data stays until u's entry goes too.
    let u_ids: Vec<String> = ids("u").await.into_iter().map(|(id, _)| id).collect();
    let unshared = t_day0.iter().filter(|id| !u_ids.contains(id)).count();
    assert_eq!(s.collect_garbage(u64::MAX).await.unwrap(), unshared);
    assert_eq!(s.delete_tenant("t").await.unwrap(), 3);
    assert!(stacks(&s, "t", "{}").await.is_empty());
    assert_eq!(stacks(&s, "u", "{}").await.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_are_swept_and_the_index_rebuilds_from_footers() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(config(dir.path())).await.unwrap();
    ingest(&s, 6).await;
    s.compactor().compact_all(now_ms()).await.unwrap();
    ingest(&s, 2).await;
    let want_a = stacks(&s, "a", "{}").await;
    let want_b = stacks(&s, "b", "{}").await;
    // An object no entry names, as a crash between PUT and commit leaves it.
    let orphan = format!("segments/0/{}.kblk", ulid::Ulid::generate());
    s.store()
        .put_durable(&orphan, bytes::Bytes::from_static(b"half written"))
        .await
        .unwrap();
    assert_eq!(s.sweep_orphans(now_ms()).await.unwrap(), 1);
    let orphan_id = object_id_of_path(&orphan).unwrap();
    assert!(!segment_ids(&s).await.iter().any(|id| id == orphan_id));
    s.close().await;
    drop(s);

    // Lose the index; rebuild it from the objects (compacted sources not yet deleted included).
    let rebuilt = rebuild_lost_metastore(dir.path()).await;
    assert!(
        rebuilt.entries > 0 && rebuilt.unreadable.is_empty(),
        "{rebuilt:?}"
    );
    let s = Storage::open(config(dir.path())).await.unwrap();
    assert_eq!(
        stacks(&s, "a", "{}").await,
        want_a,
        "no duplicates, nothing lost"
    );
    assert_eq!(stacks(&s, "b", "{}").await, want_b);
}

/// Polls `check` every 10 ms for up to 30 s; whether it held.
async fn eventually<F, Fut>(mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..3000 {
        if check().await {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    false
}

/// A long merge of upper levels holds back neither the merges of fresh segments nor their
/// answers: the background compaction's two lanes run side by side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_segments_merge_while_a_long_merge_runs() {
    use kiln_storage::compaction::LevelPolicy;
    let dir = tempfile::tempdir().unwrap();
    let levels = |blocks: [usize; 3]| {
        blocks
            .map(|blocks| LevelPolicy {
                blocks,
                age: std::time::Duration::from_secs(365 * 24 * 3600),
            })
            .to_vec()
    };
    let count = |s: &Storage, tenant: &'static str, level: u32| {
        let s = s.clone();
        async move {
            blocks(&s, tenant)
                .await
                .iter()
                .filter(|b| b.level == level)
                .count()
        }
    };
    // L2 blocks that wait: L0 and L1 merge by twos, L2 by a hundred.
    let mut c = config(dir.path());
    c.compaction.levels = levels([2, 2, 100]);
    let s = Storage::open(c).await.unwrap();
    ingest(&s, 8).await;
    s.compactor().compact_all(now_ms()).await.unwrap();
    assert!(count(&s, "a", 2).await >= 2, "L2 blocks to merge");
    let before_a = stacks(&s, "a", "{}").await;
    let before_b = stacks(&s, "b", "{}").await;
    s.close().await;
    drop(s);

    // Reopened with L2 merging by twos, on a store whose reads of blocks hang: the L2 merge
    // starts and waits. L1 blocks no longer merge, so the fresh lane reads only segments.
    let mut c = config(dir.path());
    c.compaction.levels = levels([2, 100, 2]);
    let (s, faulty) = faulty_storage(c).await;
    faulty.hold_gets_under(Some("blocks/"));
    let upkeep = s.spawn_upkeep(
        std::time::Duration::from_millis(20),
        std::time::Duration::from_secs(3600),
    );
    let held = eventually(|| async { faulty.held_gets.load(Ordering::SeqCst) > 0 }).await;
    assert!(held, "the L2 merge reads a block");
    let fresh_l1 = count(&s, "a", 1).await;
    for i in 0..2 {
        s.write(
            "a",
            profile("api", &[(frames("main;fresh"), 7)], T0 + (100 + i) * SEC),
        )
        .await
        .unwrap();
        s.flush().await;
    }
    let merged = eventually(|| async { count(&s, "a", 1).await > fresh_l1 }).await;
    assert!(merged, "the fresh segments merged while the L2 merge waits");
    assert_eq!(count(&s, "a", 0).await, 0, "no segment left");
    assert!(
        faulty.held_gets.load(Ordering::SeqCst) > 0,
        "the L2 merge still waits"
    );

    // Released, the L2 merges finish; every answer holds, and tenant b saw nothing of a's.
    faulty.hold_gets_under(None);
    let done =
        eventually(|| async { count(&s, "a", 2).await == 0 && count(&s, "b", 2).await == 0 }).await;
    assert!(done, "the L2 merges finished");
    upkeep.abort();
    let mut want_a = before_a.clone();
    *want_a.entry(frames("main;fresh")).or_default() += 14;
    assert_eq!(stacks(&s, "a", "{}").await, want_a);
    assert_b_untouched_and_walled(&s, &before_b).await;
    assert!(
        !stacks(&s, "b", "{}")
            .await
            .contains_key(&frames("main;fresh"))
    );
}

/// Whether each column of `block`'s samples section is compressed (LZ4 or zstd), in schema
/// order.
async fn compressed_columns(s: &Storage, block: &BlockMeta) -> Vec<bool> {
    use parquet::file::reader::FileReader;
    let object = s.store().get(&block.path()).await.unwrap();
    let (start, size) = (block.samples.offset as usize, block.samples.size as usize);
    let samples = object.slice(start..start + size);
    let reader = parquet::file::serialized_reader::SerializedFileReader::new(samples).unwrap();
    let columns = reader.metadata().row_groups()[0].columns();
    columns
        .iter()
        .map(|c| c.compression() != parquet::basic::Compression::UNCOMPRESSED)
        .collect()
}

/// Columns that hold nothing (spans, trace ids, per-sample labels here) are written without
/// compression in segments and in the blocks merged from them, as long as every source left
/// them so: one source with spans makes its output compress them. Answers are unchanged, and
/// another tenant sees none of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blank_columns_stay_uncompressed_through_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(config(dir.path())).await.unwrap();
    // (span, trace, labels, profile id): blank but the profile ids.
    const BLANK: [bool; 8] = [true, true, true, true, false, false, false, true];
    for i in 0..4 {
        s.write(
            "a",
            profile(
                "api",
                &[(frames(&format!("main;f{i}")), 1 + i)],
                T0 + i * SEC,
            ),
        )
        .await
        .unwrap();
        s.flush().await;
    }
    for b in blocks(&s, "a").await {
        assert_eq!(compressed_columns(&s, &b).await, BLANK, "segment {}", b.id);
    }
    let before = stacks(&s, "a", "{}").await;
    assert!(s.compactor().compact_all(now_ms()).await.unwrap() > 0);
    let merged = blocks(&s, "a").await;
    assert!(merged.iter().all(|b| b.level > 0), "every segment merged");
    for b in &merged {
        assert_eq!(compressed_columns(&s, b).await, BLANK, "output {}", b.id);
    }
    assert_eq!(stacks(&s, "a", "{}").await, before);

    // Tenant b: one profile of four carries a span id.
    for i in 0..4 {
        let mut p = profile(
            "api",
            &[(frames(&format!("main;g{i}")), 1 + i)],
            T0 + i * SEC,
        );
        if i == 2 {
            p.series[0].samples[0].span_id = 0x1234;
        }
        s.write("b", p).await.unwrap();
        s.flush().await;
    }
    let spans: Vec<bool> = {
        let mut v = Vec::new();
        for b in blocks(&s, "b").await {
            v.push(compressed_columns(&s, &b).await[4]);
        }
        v
    };
    assert_eq!(spans.iter().filter(|&&c| c).count(), 1, "{spans:?}");
    assert!(s.compactor().compact_all(now_ms()).await.unwrap() > 0);
    for b in blocks(&s, "b").await {
        let mut want = BLANK;
        want[4] = true;
        assert_eq!(compressed_columns(&s, &b).await, want, "output {}", b.id);
    }
    let b_stacks = stacks(&s, "b", "{}").await;
    assert_eq!(b_stacks.values().sum::<i64>(), 1 + 2 + 3 + 4);
    assert!(
        !b_stacks.contains_key(&frames("main;f0")),
        "b sees none of a"
    );
    assert!(!stacks(&s, "a", "{}").await.contains_key(&frames("main;g0")));
    s.close().await;
}

/// A segment holds every tenant of its flush, so it outlives a tenant's entry in it while
/// another tenant's stays. Once that tenant's data has been compacted two levels up and the
/// level between deleted, the rebuild must still know the segment's part as replaced: a
/// compacted block names the sources of its sources that still exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_skips_a_shared_segment_compacted_two_levels_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.writer.shards = 1;
    let s = Storage::open(cfg).await.unwrap();
    // The first flush holds both tenants: b's only data, so b's entry never merges.
    let (x, y) = tokio::join!(
        s.write("a", profile("api", &[(frames("main;first"), 1)], T0)),
        s.write("b", profile("db", &[(frames("main;b_only"), 2)], T0)),
    );
    x.unwrap();
    y.unwrap();
    s.flush().await;
    let shared = blocks(&s, "b").await[0].id.clone();
    assert!(blocks(&s, "a").await.iter().any(|b| b.id == shared));
    // a's: 12 segments, merged by fours into L1 and the three L1 blocks into one L2.
    for i in 1..12 {
        s.write(
            "a",
            profile("api", &[(frames(&format!("main;f{i}")), 1)], T0 + i * SEC),
        )
        .await
        .unwrap();
        s.flush().await;
    }
    s.compactor().compact_all(now_ms()).await.unwrap();
    let levels: Vec<u32> = blocks(&s, "a").await.iter().map(|b| b.level).collect();
    assert_eq!(levels, [2], "a compacted to one L2 block");
    s.collect_garbage(u64::MAX).await.unwrap();
    assert!(
        segment_ids(&s).await.contains(&shared),
        "the shared segment stays for b"
    );
    assert!(
        s.store().list("blocks/a").await.unwrap().len() == 1,
        "a's L1 blocks are gone"
    );
    let want_a = stacks(&s, "a", "{}").await;
    let want_b = stacks(&s, "b", "{}").await;
    s.close().await;
    drop(s);

    let rebuilt = rebuild_lost_metastore(dir.path()).await;
    assert_eq!(
        (rebuilt.entries, rebuilt.unreadable.len()),
        (2, 0),
        "a's L2 block and b's entry"
    );
    let s = Storage::open(config(dir.path())).await.unwrap();
    assert_eq!(stacks(&s, "a", "{}").await, want_a, "no duplicates");
    assert_eq!(stacks(&s, "b", "{}").await, want_b);
    assert!(
        !stacks(&s, "b", "{}")
            .await
            .keys()
            .flatten()
            .any(|f| f.starts_with('f')),
        "tenant wall"
    );
}
