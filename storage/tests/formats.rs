//! Blocks of older formats stay readable and compact with new ones: symbols sections of format
//! version 1 (uncompressed), 2 (zstd, rows holding tree nodes) and 3 (stack ids apart from
//! nodes, functions as messages) beside version 4 (functions as columns), read before and after
//! a merge; blocks of block format version 3 (profile totals without `sample_row`) beside
//! version 4; and segments whose samples are zstd (before LZ4 segments) beside LZ4 ones.
//!
//! Its own binary: the tests flip process-wide switches that make the writer emit older
//! formats (nextest runs each test in a process of its own).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use kiln_storage::format::symbols::SYMBOLS_VERSION;

use kiln_storage::Storage;
use kiln_storage::format::meta::PARTITION_NANOS;
use kiln_storage::format::symbols::testing::WRITE_VERSION;
use kiln_storage::metastore::BlockQuery;
use kiln_storage::testing::{config, filter, frames, now_ms, profile, wide_profile};

const T0: i64 = 1_700_000_000_000_000_000 - 1_700_000_000_000_000_000 % PARTITION_NANOS;
const SEC: i64 = 1_000_000_000;

async fn stacks(s: &Storage, tenant: &str) -> BTreeMap<Vec<String>, i64> {
    s.query()
        .merge_tree(&filter(
            tenant,
            "{}",
            T0 - PARTITION_NANOS,
            T0 + PARTITION_NANOS,
        ))
        .await
        .unwrap()
        .stacks()
}

/// The symbols format version of each of a tenant's blocks, read from the objects.
async fn symbol_versions(s: &Storage, tenant: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for b in s
        .metastore()
        .query_blocks(BlockQuery::all(tenant))
        .await
        .unwrap()
    {
        let data = s.store().get(&b.path()).await.unwrap();
        let at = b.symbols.offset as usize;
        out.push(u32::from_le_bytes(data[at + 4..at + 8].try_into().unwrap()));
    }
    out.sort_unstable();
    out
}

/// Step `i` of a test: tenant a's profile of `stacks` (added to `want`) and tenant b's own
/// stack, at second `i`, flushed into a segment of each.
async fn write_step<const N: usize>(
    s: &Storage,
    i: i64,
    stacks: [(Vec<String>, i64); N],
    want: &mut BTreeMap<Vec<String>, i64>,
) {
    s.write("a", profile("api", &stacks, T0 + i * SEC))
        .await
        .unwrap();
    for (f, v) in stacks {
        *want.entry(f).or_default() += v;
    }
    s.write(
        "b",
        profile("api", &[(frames("main;b_only"), 1)], T0 + i * SEC),
    )
    .await
    .unwrap();
    s.flush().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symbols_of_versions_1_to_4_read_and_compact_together() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(config(dir.path())).await.unwrap();
    let mut want: BTreeMap<Vec<String>, i64> = BTreeMap::new();
    for i in 0..12i64 {
        // The first quarter as a build before format version 2 wrote it, the second as one before
        // version 3 did, the third as one before version 4.
        WRITE_VERSION.store([1, 2, 3, 0][i as usize / 3], Ordering::Relaxed);
        let stack = format!("main;serve;handler{}", i % 5);
        // A stack that is a prefix of another (a node inside the tree) and one that is not.
        let stacks = [(frames(&stack), 10 + i), (frames("main;serve"), 100 + i)];
        write_step(&s, i, stacks, &mut want).await;
    }
    WRITE_VERSION.store(0, Ordering::Relaxed);
    let versions = symbol_versions(&s, "a").await;
    assert!(
        [1, 2, 3, SYMBOLS_VERSION]
            .iter()
            .all(|v| versions.contains(v)),
        "{versions:?}"
    );
    assert_eq!(stacks(&s, "a").await, want, "every format reads");

    assert!(s.compactor().compact_all(now_ms()).await.unwrap() > 0);
    let versions = symbol_versions(&s, "a").await;
    assert!(
        versions.iter().all(|&v| v == SYMBOLS_VERSION) && versions.len() < 12,
        "merged into version {SYMBOLS_VERSION}: {versions:?}"
    );
    assert_eq!(stacks(&s, "a").await, want, "the merge keeps every value");
    let b = stacks(&s, "b").await;
    assert_eq!(b.len(), 1, "tenant b sees only its own stack: {b:?}");
    assert_eq!(b.values().sum::<i64>(), 12);
}

/// The codecs of the column chunks of `block`'s samples section that are compressed.
async fn codecs(s: &Storage, block: &kiln_storage::format::meta::BlockMeta) -> Vec<String> {
    use parquet::file::reader::FileReader;
    let object = s.store().get(&block.path()).await.unwrap();
    let (start, size) = (block.samples.offset as usize, block.samples.size as usize);
    let reader = parquet::file::serialized_reader::SerializedFileReader::new(
        object.slice(start..start + size),
    )
    .unwrap();
    let mut out: Vec<String> = reader
        .metadata()
        .row_groups()
        .iter()
        .flat_map(|rg| rg.columns())
        .map(|c| c.compression())
        .filter(|&c| c != parquet::basic::Compression::UNCOMPRESSED)
        .map(|c| match c {
            parquet::basic::Compression::ZSTD(_) => "zstd".to_owned(),
            other => format!("{other:?}"),
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Segments written with zstd pages (before LZ4 segments) and with LZ4 ones read the same,
/// side by side, and merge into a zstd block that answers the same; another tenant sees none
/// of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zstd_and_lz4_segments_read_and_compact_together() {
    use kiln_storage::format::block::testing::SEGMENT_ZSTD;
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(config(dir.path())).await.unwrap();
    let mut want: BTreeMap<Vec<String>, i64> = BTreeMap::new();
    for i in 0..8i64 {
        SEGMENT_ZSTD.store(i % 2 == 0, Ordering::Relaxed);
        let stacks = [
            (frames(&format!("main;serve;handler{}", i % 3)), 10 + i),
            (frames("main;serve"), 100 + i),
        ];
        write_step(&s, i, stacks, &mut want).await;
    }
    SEGMENT_ZSTD.store(false, Ordering::Relaxed);
    let blocks = |s: &Storage| {
        let m = s.metastore().clone();
        async move { m.query_blocks(BlockQuery::all("a")).await.unwrap() }
    };
    let mut seen = Vec::new();
    for b in blocks(&s).await {
        assert_eq!(b.level, 0);
        seen.push(codecs(&s, &b).await);
    }
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen, [vec!["LZ4_RAW".to_owned()], vec!["zstd".to_owned()]]);
    assert_eq!(stacks(&s, "a").await, want, "both codecs read");

    assert!(s.compactor().compact_all(now_ms()).await.unwrap() > 0);
    let merged = blocks(&s).await;
    assert!(merged.iter().all(|b| b.level > 0) && merged.len() < 8);
    for b in &merged {
        assert_eq!(codecs(&s, b).await, ["zstd"], "block {}", b.id);
    }
    assert_eq!(stacks(&s, "a").await, want, "the merge keeps every value");
    let b = stacks(&s, "b").await;
    assert_eq!(b.len(), 1, "tenant b sees only its own stack: {b:?}");
    assert_eq!(b.values().sum::<i64>(), 8);
}

/// A compacted block of format version 3 (profile totals without the samples' rows) answers
/// ranges as before, through the samples' page index, and merges with version 4 blocks into a
/// version 4 block that answers the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_format_3_reads_and_compacts_with_4() {
    use kiln_storage::format::meta::BLOCK_FORMAT_VERSION;
    use kiln_storage::format::meta::testing::WRITE_VERSION as BLOCK_WRITE_VERSION;
    use kiln_storage::query::with_report;
    const MIN: i64 = 60 * SEC;
    const HOUR: i64 = 60 * MIN;
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    // Pages of 8 Ki rows, as outside the tests, so an edge could be read from the totals.
    c.compaction.row_group_rows = kiln_storage::StorageConfig::new(dir.path())
        .compaction
        .row_group_rows;
    // Top-level blocks merged four at a time: the first four segments' blocks then fold into
    // one block, and the later merge takes that block with the new ones.
    c.compaction.top.fanout = 4;
    let s = Storage::open(c).await.unwrap();
    // Twelve segments of 60 profiles (10 s apart, 40 stacks each): four compacted into one
    // block of version 3, then eight more compacted with it into version 4 blocks.
    let s = &s;
    let segment = |k: i64| async move {
        for i in k * 60..(k + 1) * 60 {
            s.write("a", wide_profile("api", 40, i, T0 + i * 10 * SEC))
                .await
                .unwrap();
        }
        s.write(
            "b",
            profile("db", &[(frames("main;b_only"), 1)], T0 + k * 10 * MIN),
        )
        .await
        .unwrap();
        s.flush().await;
    };
    let windows = [
        (T0 + 3 * MIN + 5 * SEC, T0 + 7 * MIN + 1),
        (T0 + 12 * MIN + 30 * SEC, T0 + HOUR + 41 * MIN + 3),
        (T0 + 95 * MIN, T0 + 3 * HOUR),
        (T0 - HOUR, T0 + 3 * HOUR),
    ];
    let flames = |s: &Storage| {
        let q = s.query().clone();
        async move {
            let mut out = Vec::new();
            for (start, end) in windows {
                let tree = q.merge_tree(&filter("a", "{}", start, end)).await;
                out.push(tree.unwrap().stacks());
            }
            out
        }
    };
    // What the windows hold of the first `profiles` profiles, summed here.
    let want = |profiles: i64| {
        let mut out = vec![BTreeMap::<Vec<String>, i64>::new(); windows.len()];
        for i in 0..profiles {
            let t = T0 + i * 10 * SEC;
            for (w, &(start, end)) in out.iter_mut().zip(&windows) {
                if (start..end).contains(&t) {
                    for k in 0..40 {
                        *w.entry(frames(&format!("main;work;f{k}"))).or_default() += 1 + k + i % 7;
                    }
                }
            }
        }
        out
    };
    let versions = |s: &Storage| {
        let m = s.metastore().clone();
        async move {
            let blocks = m.query_blocks(BlockQuery::all("a")).await.unwrap();
            assert!(blocks.iter().all(|b| b.level >= 1), "compacted");
            let mut v: Vec<u32> = blocks.iter().map(|b| b.format_version).collect();
            v.sort_unstable();
            v
        }
    };

    BLOCK_WRITE_VERSION.store(3, Ordering::Relaxed);
    for k in 0..4 {
        segment(k).await;
    }
    s.compactor().compact_all(now_ms()).await.unwrap();
    BLOCK_WRITE_VERSION.store(0, Ordering::Relaxed);
    assert_eq!(versions(s).await, [3]);
    assert_eq!(flames(s).await, want(240), "a version 3 block alone");
    // Its first window's 23 profiles (920 rows) come from the page holding them.
    let first_window = |s: &Storage| {
        let q = s.query().clone();
        async move {
            let (start, end) = windows[0];
            let (tree, report) = with_report(q.merge_tree(&filter("a", "{}", start, end))).await;
            assert_eq!(tree.unwrap().stacks(), want(720)[0]);
            report.stats.rows_read
        }
    };
    assert_eq!(first_window(s).await, 8192, "one page of samples");
    for k in 4..12 {
        segment(k).await;
    }
    assert_eq!(flames(s).await, want(720), "beside version 4 segments");
    s.compactor().compact_all(now_ms()).await.unwrap();
    let merged = versions(s).await;
    assert!(
        merged.iter().all(|&v| v == BLOCK_FORMAT_VERSION),
        "the version 3 block merged into version 4 ones: {merged:?}"
    );
    assert_eq!(flames(s).await, want(720), "the merge keeps every value");
    // Now the profile totals say where those rows are: they and the totals are read.
    let rows = first_window(s).await;
    assert!(
        (920..=920 + 721).contains(&rows),
        "{rows} rows read for 920"
    );
    let b = stacks(s, "b").await;
    assert_eq!(b.len(), 1, "tenant b sees only its own stack: {b:?}");
    assert_eq!(b.values().sum::<i64>(), 12);
}
