//! Rollups (ADR 0007): flame graphs and series read through the pre-aggregated levels equal
//! what the samples alone give, for aligned and unaligned ranges, and are really used.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use kiln_otel::model::Labels;
use kiln_storage::format::meta::PROFILE_TOTALS;
use kiln_storage::metastore::BlockQuery;
use kiln_storage::query::{Aggregation, Exemplars, SampleFilter};
use kiln_storage::testing::{
    config, filter, frames, now_ms, profile_with_labels, tenant_rows, wide_profile,
};
use kiln_storage::{Storage, StorageConfig};

const SEC: i64 = 1_000_000_000;
const MIN: i64 = 60 * SEC;
const HOUR: i64 = 60 * MIN;
/// A day boundary, so every resolution's buckets start with the data.
const T0: i64 = 1_700_000_000_000_000_000 - 1_700_000_000_000_000_000 % (24 * HOUR);
/// Profiles every 30 s for 3 h 37 min.
const STEPS: i64 = 3 * 120 + 74;
const STACKS: [&str; 6] = [
    "main;serve;parse",
    "main;serve;parse;lex",
    "main;serve;query",
    "main;gc",
    "main;serve;query;scan",
    "run;idle",
];

type Stacks = BTreeMap<Vec<String>, i64>;

fn pod_profile(service: &str, pod: usize, step: i64) -> kiln_otel::model::NormalizedProfile {
    let pod_name = format!("{service}-{pod}");
    let labels = Labels::from_pairs([
        ("__name__", "process_cpu"),
        ("service_name", service),
        ("pod", pod_name.as_str()),
    ]);
    let stacks: Vec<(Vec<String>, i64)> = (0..4)
        .map(|k| {
            let i = (step as usize * 7 + pod * 3 + k * 5) % STACKS.len();
            (
                frames(STACKS[i]),
                1 + (step * 13 + k as i64 * 29 + pod as i64) % 97,
            )
        })
        .collect();
    // Some stacks appear twice in a profile: the samples keep both rows.
    let mut stacks = stacks;
    stacks.push(stacks[0].clone());
    profile_with_labels(labels, &stacks, T0 + step * 30 * SEC + pod as i64 * SEC)
}

async fn ingest(s: &Storage) {
    // 16 steps of every pod written at once: they share segments, as live traffic does.
    for chunk in (0..STEPS).collect::<Vec<_>>().chunks(16) {
        let mut writes = Vec::new();
        for &step in chunk {
            for pod in 0..3 {
                writes.push(s.write("a", pod_profile("api", pod, step)));
            }
            writes.push(s.write("b", pod_profile("db", 0, step)));
        }
        for r in futures::future::join_all(writes).await {
            r.unwrap();
        }
        s.flush().await;
    }
}

/// Windows: aligned to hours and 10 minutes, unaligned, shorter than a bucket, past the data.
fn windows() -> Vec<(i64, i64)> {
    let mut w = vec![
        (T0, T0 + HOUR),
        (T0 + HOUR, T0 + 3 * HOUR),
        (T0 + 20 * MIN, T0 + 3 * HOUR + 10 * MIN),
        (T0 + 7 * MIN + 3 * SEC, T0 + 2 * HOUR + 53 * MIN + 1),
        (T0 + HOUR + 1, T0 + HOUR + 4 * MIN),
        (T0 - 30 * 24 * HOUR, T0 + 30 * 24 * HOUR),
        (T0 + 2 * HOUR + 15 * MIN, T0 + 30 * 24 * HOUR),
        (T0 - HOUR, T0 + 1),
        (T0 + 10 * HOUR, T0 + 11 * HOUR),
    ];
    // A few more unaligned ones, deterministic.
    let mut x = 0x9e37_79b9_u64;
    for _ in 0..8 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let start = T0 - HOUR + (x % (5 * HOUR as u64)) as i64;
        let len = 1 + (x.rotate_left(17) % (4 * HOUR as u64)) as i64;
        w.push((start, start + len));
    }
    w
}

fn window_filter(tenant: &str, selector: &str, (start, end): (i64, i64)) -> SampleFilter {
    filter(tenant, selector, start, end)
}

#[derive(Debug, PartialEq)]
struct Answers {
    flames: Vec<Stacks>,
    series: Vec<Vec<(Vec<(String, String)>, Vec<(i64, f64)>)>>,
}

async fn answers(s: &Storage, tenant: &str, selector: &str) -> Answers {
    let mut flames = Vec::new();
    let mut series = Vec::new();
    for w in windows() {
        let f = window_filter(tenant, selector, w);
        flames.push(s.query().merge_tree(&f).await.unwrap().stacks());
        for aggregation in [Aggregation::Sum, Aggregation::Average] {
            let got = s
                .query()
                .select_series(
                    &f,
                    &["pod".to_string()],
                    60 * SEC,
                    aggregation,
                    None,
                    Exemplars::None,
                )
                .await
                .unwrap()
                .into_iter()
                .map(|p| (p.labels, p.points))
                .collect();
            series.push(got);
        }
    }
    Answers { flames, series }
}

fn rollup_config(dir: &std::path::Path) -> StorageConfig {
    let mut c = config(dir);
    c.compaction.batch_rows = 100;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollups_answer_exactly_what_the_samples_do() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(rollup_config(dir.path())).await.unwrap();
    ingest(&s).await;
    // Before compaction every block is an L0 segment: the samples alone answer.
    let blocks = s
        .metastore()
        .query_blocks(BlockQuery::all("a"))
        .await
        .unwrap();
    assert!(blocks.iter().all(|b| b.rollups.is_empty()));
    let raw_a = answers(&s, "a", "{}").await;
    let raw_pod = answers(&s, "a", r#"{pod="api-1"}"#).await;
    let raw_b = answers(&s, "b", "{}").await;
    assert!(raw_a.flames.iter().filter(|f| !f.is_empty()).count() >= 10);

    s.compactor().compact_all(now_ms()).await.unwrap();
    let blocks = s
        .metastore()
        .query_blocks(BlockQuery::all("a"))
        .await
        .unwrap();
    let resolutions: std::collections::BTreeSet<i64> = blocks
        .iter()
        .flat_map(|b| b.rollups.iter().map(|r| r.resolution_nanos))
        .collect();
    for r in [PROFILE_TOTALS, 10 * MIN, HOUR] {
        assert!(
            resolutions.contains(&r),
            "rollup {r} written: {resolutions:?}"
        );
    }
    let reads = || s.query().counters().rollup_reads.load(Ordering::Relaxed);
    let before = reads();
    assert_eq!(answers(&s, "a", "{}").await, raw_a);
    assert!(reads() > before, "the rollups were read");
    assert_eq!(answers(&s, "a", r#"{pod="api-1"}"#).await, raw_pod);
    assert_eq!(answers(&s, "b", "{}").await, raw_b, "tenant b");
    // Tenant wall: b sees none of a's series, a none of b's.
    let b_flames = answers(&s, "b", r#"{service_name="api"}"#).await;
    assert!(b_flames.flames.iter().all(|f| f.is_empty()));
    assert!(b_flames.series.iter().all(|s| s.is_empty()));
    let a_db = answers(&s, "a", r#"{service_name="db"}"#).await;
    assert!(a_db.flames.iter().all(|f| f.is_empty()));

    // The same after a restart (rollups are in the footer and the metastore entry).
    s.close().await;
    drop(s);
    let s = Storage::open(rollup_config(dir.path())).await.unwrap();
    assert_eq!(answers(&s, "a", "{}").await, raw_a);
}

/// A span filter cannot be answered from rollups, which drop span ids: the samples answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_span_filter_reads_the_samples() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(rollup_config(dir.path())).await.unwrap();
    ingest(&s).await;
    s.compactor().compact_all(now_ms()).await.unwrap();
    let mut f = filter("a", "{}", T0, T0 + 3 * HOUR);
    f.span_ids = vec![42];
    let before = s.query().counters().rollup_reads.load(Ordering::Relaxed);
    let tree = s.query().merge_tree(&f).await.unwrap();
    assert!(tree.stacks().is_empty(), "no sample carries span 42");
    assert_eq!(
        s.query().counters().rollup_reads.load(Ordering::Relaxed),
        before
    );
}

/// Per-query stats make pruning and caching visible: a short range reads fewer bytes than a long
/// one, and blocks a range covers whole are summed once, then answered from the partial-result
/// cache with the same tree and no rows read. Tenant b never gets a's cached results.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_stats_show_pruning_and_the_partial_result_cache() {
    use kiln_storage::query::{QueryStats, with_report};
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(rollup_config(dir.path())).await.unwrap();
    ingest(&s).await;
    s.compactor().compact_all(now_ms()).await.unwrap();
    s.close().await;
    drop(s);

    let all = (T0 - 24 * HOUR, T0 + 24 * HOUR);
    let short = (T0 + HOUR + 7 * MIN, T0 + HOUR + 9 * MIN);
    let flame = |s: &Storage, tenant: &'static str, selector: &'static str, w: (i64, i64)| {
        let q = s.query().clone();
        async move {
            let (tree, report) =
                with_report(q.merge_tree(&window_filter(tenant, selector, w))).await;
            assert!(report.warnings.is_empty(), "{:?}", report.warnings);
            (tree.unwrap().stacks(), report.stats)
        }
    };

    // Pruning, on fresh caches: a two-minute range reads a few pages of the samples, the whole
    // range reads rollups; both far fewer rows than tenant a holds, and less than its objects.
    let s = Storage::open(rollup_config(dir.path())).await.unwrap();
    let rows = tenant_rows(&s, "a").await;
    let blocks = s
        .metastore()
        .query_blocks(BlockQuery::all("a"))
        .await
        .unwrap();
    let object_bytes: u64 = blocks.iter().map(|b| b.object_size).sum();
    let (short_tree, short_stats) = flame(&s, "a", "{}", short).await;
    assert!(!short_tree.is_empty());
    assert!(
        short_stats.rows_read > 0 && short_stats.rows_read * 4 < rows,
        "{short_stats:?} of {rows} rows"
    );
    assert!(short_stats.bytes_read > 0 && short_stats.bytes_read < object_bytes);
    assert_eq!(
        short_stats.rollup_ranges, 0,
        "a range within one bucket reads samples"
    );
    s.close().await;
    drop(s);
    let s = Storage::open(rollup_config(dir.path())).await.unwrap();
    let (all_tree, cold) = flame(&s, "a", "{}", all).await;
    assert_eq!(cold.blocks, blocks.len() as u64);
    assert_eq!(cold.blocks_cached, 0);
    assert!(cold.rollup_ranges > 0 && cold.rows_read > 0 && cold.rows_read * 4 < rows);
    assert!(
        cold.bytes_read > 0 && cold.bytes_read < object_bytes,
        "{cold:?}"
    );

    // Again: every block is covered whole, so every one comes from the cache.
    let (again, warm) = flame(&s, "a", "{}", all).await;
    assert_eq!(again, all_tree);
    assert_eq!(
        warm,
        QueryStats {
            blocks: cold.blocks,
            blocks_cached: cold.blocks,
            ..QueryStats::default()
        }
    );
    let c = s.query().counters();
    assert_eq!(
        c.results_lookups.load(Ordering::Relaxed),
        2 * cold.blocks,
        "one lookup per block and query"
    );
    assert_eq!(c.results_misses.load(Ordering::Relaxed), cold.blocks);

    // Another selection of the same blocks is its own entry, and equals what the samples say.
    let (pod, pod_stats) = flame(&s, "a", r#"{pod="api-1"}"#, all).await;
    assert_eq!(pod_stats.blocks_cached, 0);
    assert!(!pod.is_empty() && pod != all_tree);

    // Tenant wall: b's query over the same range reads b's blocks only, none of a's results.
    let (b_api, b_stats) = flame(&s, "b", r#"{service_name="api"}"#, all).await;
    assert!(b_api.is_empty());
    assert_eq!(b_stats.blocks_cached, 0);
    let (b_all, _) = flame(&s, "b", "{}", all).await;
    let (b_again, b_warm) = flame(&s, "b", "{}", all).await;
    assert_eq!(b_all, b_again);
    assert!(b_warm.blocks_cached > 0);
    assert_ne!(b_all, all_tree);

    // A range that cuts a block is computed each time, not cached.
    let (_, cut) = flame(&s, "a", "{}", short).await;
    assert_eq!(cut.blocks_cached, 0);
    assert!(cut.rows_read > 0);
    s.close().await;
    drop(s);

    // With the cache off, nothing is kept.
    let mut c = rollup_config(dir.path());
    c.results_cache_bytes = 0;
    let s = Storage::open(c).await.unwrap();
    let _ = flame(&s, "a", "{}", all).await;
    let (off, off_stats) = flame(&s, "a", "{}", all).await;
    assert_eq!(off, all_tree);
    assert_eq!(off_stats.blocks_cached, 0);
    assert!(off_stats.rows_read > 0);
}

/// The edges of a range that end inside a rollup bucket read their own samples only: the
/// profile totals say where each time's rows begin (block format 4), so two minutes at an edge
/// read those minutes' rows, not the 8 Ki-row pages holding them. Every range answers what
/// the samples say, edges on a profile's time or between two, within a block or across two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_edge_reads_only_its_own_samples() {
    use kiln_storage::query::with_report;
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    // Pages of 8 Ki rows, as outside the tests.
    c.compaction.row_group_rows = StorageConfig::new(dir.path()).compaction.row_group_rows;
    let s = Storage::open(c).await.unwrap();
    // A profile every 10 s for 2 h, 60 stacks each: 43,200 rows of one series, in segments
    // of 15 minutes.
    const STEP: i64 = 10 * SEC;
    for chunk in (0..720i64).collect::<Vec<_>>().chunks(90) {
        for &i in chunk {
            s.write("a", wide_profile("api", 60, i, T0 + i * STEP))
                .await
                .unwrap();
        }
        s.write("b", wide_profile("db", 3, 0, T0 + chunk[0] * STEP))
            .await
            .unwrap();
        s.flush().await;
    }
    let windows = [
        (T0 + 25 * MIN + 5 * SEC, T0 + 27 * MIN + 3 * SEC),
        (T0 + 7 * MIN + 3 * SEC, T0 + HOUR + 53 * MIN + 1),
        (T0 + 30 * SEC, T0 + 90 * MIN + 20 * SEC),
        (T0 + 55 * MIN, T0 + 65 * MIN + 1),
        (T0 + HOUR + 55 * MIN + 1, T0 + 3 * HOUR),
        (T0 - HOUR, T0 + 2 * MIN + 1),
        (T0 + 43 * MIN + 20 * SEC, T0 + 43 * MIN + 21 * SEC),
    ];
    let flames = |s: &Storage, tenant: &'static str, selector: &'static str| {
        let q = s.query().clone();
        async move {
            let mut out = Vec::new();
            for w in windows {
                let tree = q.merge_tree(&window_filter(tenant, selector, w)).await;
                out.push(tree.unwrap().stacks());
            }
            out
        }
    };
    let raw = flames(&s, "a", "{}").await;
    assert!(raw.iter().filter(|f| !f.is_empty()).count() >= 6);

    s.compactor().compact_all(now_ms()).await.unwrap();
    let blocks = s
        .metastore()
        .query_blocks(BlockQuery::all("a"))
        .await
        .unwrap();
    assert!(
        blocks.iter().all(|b| b.level >= 1
            && b.format_version == kiln_storage::format::meta::BLOCK_FORMAT_VERSION
            && b.rollups
                .iter()
                .any(|r| r.resolution_nanos == PROFILE_TOTALS)),
        "compacted, with profile totals"
    );
    assert_eq!(flames(&s, "a", "{}").await, raw);

    // Two minutes inside one block and one 10-minute bucket: 12 profiles, 720 rows, read with
    // the block's totals (at most its 720 profiles). The pages holding them are 8 Ki rows.
    let short = window_filter("a", "{}", windows[0]);
    let (tree, report) = with_report(s.query().merge_tree(&short)).await;
    assert_eq!(tree.unwrap().stacks(), raw[0]);
    let rows = report.stats.rows_read;
    assert!(
        (720..=720 + 721).contains(&rows),
        "read {rows} rows for 720 samples"
    );

    // Tenant wall: b's data is b's alone.
    assert!(
        flames(&s, "b", r#"{service_name="api"}"#)
            .await
            .iter()
            .all(|f| f.is_empty())
    );
    assert!(
        flames(&s, "a", r#"{service_name="db"}"#)
            .await
            .iter()
            .all(|f| f.is_empty())
    );
    let b = s
        .query()
        .merge_tree(&window_filter("b", "{}", (T0, T0 + 2 * HOUR)))
        .await
        .unwrap()
        .stacks();
    assert_eq!(b.len(), 3, "{b:?}");
}
