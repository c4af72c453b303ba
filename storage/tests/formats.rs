//! Blocks of older formats stay readable and compact with new ones: symbols sections of format
//! version 1 (uncompressed), 2 (zstd, rows holding tree nodes) and 3 (stack ids apart from
//! nodes, functions as messages) beside version 4 (functions as columns), read before and after
//! a merge.
//!
//! One test in its own binary: it flips the process-wide switch that makes the writer emit
//! older sections.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use kiln_storage::symbols::SYMBOLS_VERSION;

use kiln_storage::Storage;
use kiln_storage::meta::PARTITION_NANOS;
use kiln_storage::metastore::BlockQuery;
use kiln_storage::symbols::testing::WRITE_VERSION;
use kiln_storage::testing::{config, filter, frames, now_ms, profile};

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
