use crate::metastore::{BlockMeta, BlockQuery, Metastore};
use std::sync::Arc;

use super::*;

use std::sync::atomic::{AtomicBool, Ordering};

use crate::metastore::conformance::{block_id, entry};

crate::metastore_conformance_suite!({
    let dir = tempfile::tempdir().unwrap();
    let m = Embedded::open(&dir.path().join("m.redb")).unwrap();
    (m, dir)
});

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    let id = block_id(1, 1);
    let written = entry("t", &id, 0, 0, 5, 9, &[("s", CPU)]);
    {
        let m = Embedded::open(&path).unwrap();
        m.add_blocks(vec![written.clone()]).await.unwrap();
        // Kept as written (not decoded) by the process that wrote it.
        let got = m.query_blocks(BlockQuery::all("t")).await.unwrap();
        assert_eq!(*got[0], written);
    }
    // Decoded from the file by the next: the same entry.
    let m = Embedded::open(&path).unwrap();
    let got = m.query_blocks(BlockQuery::all("t")).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(*got[0], written);
    assert!(
        m.query_blocks(BlockQuery::all("u"))
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn written_entries_are_kept_decoded_only_where_asked() {
    let dir = tempfile::tempdir().unwrap();
    let m = Embedded::open(&dir.path().join("m.redb")).unwrap();
    let kept = entry("t", &block_id(1, 1), 0, 0, 5, 9, &[("s", CPU)]);
    m.add_blocks(vec![kept.clone()]).await.unwrap();
    assert!(m.0.cache.contains_key(&kept.key()));
    m.keep_written(false);
    let not_kept = entry("t", &block_id(1, 2), 0, 0, 5, 9, &[("s", CPU)]);
    m.add_blocks(vec![not_kept.clone()]).await.unwrap();
    assert!(!m.0.cache.contains_key(&not_kept.key()));
    // Read, it is decoded (and cached then), the same either way.
    let mut got: Vec<BlockMeta> = m
        .query_blocks(BlockQuery::all("t"))
        .await
        .unwrap()
        .iter()
        .map(|b| (**b).clone())
        .collect();
    got.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(got, [kept, not_kept]);
    assert!(
        m.query_blocks(BlockQuery::all("u"))
            .await
            .unwrap()
            .is_empty()
    );
}

/// Retention and tenant deletion give the file's space back (redb compaction), unlike
/// BoltDB's file under Pyroscope's metastore.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_shrinks_after_removals() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    let m = Embedded::open(&path).unwrap();
    let services: Vec<(String, &str)> = (0..40).map(|i| (format!("svc-{i}"), CPU)).collect();
    let series: Vec<(&str, &str)> = services.iter().map(|(s, p)| (s.as_str(), *p)).collect();
    for batch in 0..20u128 {
        let blocks = (0..100u128)
            .map(|n| entry("t", &block_id(1, batch * 100 + n), 1, 0, 5, 9, &series))
            .collect();
        m.add_blocks(blocks).await.unwrap();
    }
    let full = std::fs::metadata(&path).unwrap().len();
    m.delete_tenant("t", 0, 0).await.unwrap();
    let ids: Vec<String> = m
        .due_tombstones(u64::MAX, 10_000)
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.id)
        .collect();
    m.forget_tombstones(&ids).await.unwrap();
    m.shrink().await.unwrap();
    let shrunk = std::fs::metadata(&path).unwrap().len();
    assert!(shrunk * 4 < full, "{full} bytes before, {shrunk} after");
    m.add_blocks(vec![entry("t", &block_id(2, 1), 0, 0, 5, 9, &series)])
        .await
        .expect("usable after shrinking");
}

/// A full disk refuses writes as unavailable; once there is room again, writes succeed
/// without a restart and nothing refused was registered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_disk_is_unavailable_then_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let full = Arc::new(AtomicBool::new(false));
    let m = Embedded::open_with_backend(
        &dir.path().join("m.redb"),
        DiskFault::factory(Arc::clone(&full)),
    )
    .unwrap();
    let (a, b, c) = (block_id(1, 1), block_id(1, 2), block_id(1, 3));
    m.add_blocks(vec![entry("t", &a, 0, 0, 5, 9, &[("s", CPU)])])
        .await
        .unwrap();
    full.store(true, Ordering::SeqCst);
    for id in [&b, &c] {
        let err = m
            .add_blocks(vec![entry("t", id, 0, 0, 5, 9, &[("s", CPU)])])
            .await
            .unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Unavailable, "{err}");
    }
    full.store(false, Ordering::SeqCst);
    m.add_blocks(vec![entry("t", &c, 0, 0, 5, 9, &[("s", CPU)])])
        .await
        .expect("writes recover once the disk has room");
    let got: Vec<String> = m
        .query_blocks(BlockQuery::all("t"))
        .await
        .unwrap()
        .iter()
        .map(|b| b.id.clone())
        .collect();
    assert_eq!(got.len(), 2);
    assert!(
        got.contains(&a) && got.contains(&c) && !got.contains(&b),
        "{got:?}"
    );
}
