use crate::store::ObjectStorage;
use bytes::Bytes;
use std::io::Write;
use std::path::Path;

use super::*;

fn spool(dir: &Path, max_bytes: u64) -> std::sync::Arc<Spool> {
    std::sync::Arc::new(
        Spool::open(SpoolConfig {
            dir: dir.to_owned(),
            max_bytes,
        })
        .unwrap(),
    )
}

#[tokio::test]
async fn records_are_counted_and_a_torn_tail_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let s = spool(dir.path(), 1 << 20);
    s.append(Bytes::from_static(b"one")).await.unwrap();
    s.append(Bytes::from_static(b"two!")).await.unwrap();
    let files = spool_files(dir.path()).unwrap();
    assert_eq!(files.len(), 1);
    assert_eq!(s.bytes(), HEADER_BYTES + 4 + 3 + 4 + 4);
    // A crash mid-append: bytes past the count.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&files[0])
        .unwrap()
        .write_all(&[0, 0, 0, 9, 1, 2])
        .unwrap();
    let records = read_file(&files[0]).unwrap().records;
    assert_eq!(
        records,
        [Bytes::from_static(b"one"), Bytes::from_static(b"two!")]
    );
    // A reopened spool counts what is on disk.
    assert_eq!(spool(dir.path(), 1 << 20).bytes(), HEADER_BYTES + 15 + 6);
}

#[tokio::test]
async fn a_drain_leaves_files_opened_after_it_sealed_the_spool() {
    let dir = tempfile::tempdir().unwrap();
    let s = spool(dir.path(), 1 << 20);
    s.append(Bytes::from_static(b"before")).await.unwrap();
    // What a drain does first.
    let sealed = s.seal().unwrap();
    s.append(Bytes::from_static(b"after")).await.unwrap();
    let all = spool_files(dir.path()).unwrap();
    assert_eq!(sealed.len(), 1);
    assert_eq!(all.len(), 2, "the append after sealing went to a new file");
    assert_eq!(
        read_file(&all[1]).unwrap().records,
        [Bytes::from_static(b"after")]
    );
}

/// A segment object of one profile of `tenant`.
fn segment(tenant: &str, leaf: &str) -> (Bytes, String) {
    use crate::testing::{frames, profile};
    let mut b = crate::format::block::DatasetBuilder::new(tenant);
    b.add(&profile(
        "api",
        &[(frames(&format!("main;{leaf}")), 1)],
        1_700_000_000_000_000_000,
    ));
    let id = ulid::Ulid::generate().to_string();
    let (object, metas) =
        crate::format::block::assemble_object(&id, 0, 0, vec![b.finish().unwrap()]);
    (object, metas[0].path())
}

#[tokio::test]
async fn a_drain_resumes_after_its_last_record_and_sets_bad_files_aside() {
    use crate::metastore::embedded::Embedded;
    let dir = tempfile::tempdir().unwrap();
    let store = ObjectStorage::local(&dir.path().join("objects")).unwrap();
    let metastore = Embedded::open(&dir.path().join("m.redb")).unwrap();
    let spool_dir = dir.path().join("spool");
    // A file left by a crash while it was created, and one whose counted record is torn.
    std::fs::create_dir_all(&spool_dir).unwrap();
    std::fs::write(
        spool_dir.join(format!("{}.kspool", ulid::Ulid::generate())),
        b"KSP",
    )
    .unwrap();
    let mut torn = Vec::from(*MAGIC);
    torn.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 50, 1, 2]);
    let torn_path = spool_dir.join(format!("{}.kspool", ulid::Ulid::generate()));
    std::fs::write(&torn_path, torn).unwrap();
    let s = spool(&spool_dir, 1 << 20);
    let segments: Vec<(Bytes, String)> = ["a", "b", "c"].iter().map(|l| segment("t", l)).collect();
    for (object, _) in &segments {
        s.append(object.clone()).await.unwrap();
    }
    // A drain that stopped after the first record.
    let files = s.seal().unwrap();
    mark_drained(files.last().unwrap(), 1).unwrap();
    assert_eq!(s.drain(&store, &metastore).await.unwrap(), 2);
    assert!(
        store.get(&segments[0].1).await.is_err(),
        "the drained record is not put again"
    );
    for (_, path) in &segments[1..] {
        assert!(store.get(path).await.is_ok(), "{path}");
    }
    assert!(s.is_empty());
    assert!(spool_files(&spool_dir).unwrap().is_empty());
    assert!(
        torn_path.with_extension("corrupt").exists(),
        "set aside, not lost"
    );
}

#[tokio::test]
async fn an_undecodable_record_is_counted_and_its_file_kept_aside() {
    use crate::metastore::embedded::Embedded;
    let dir = tempfile::tempdir().unwrap();
    let store = ObjectStorage::local(&dir.path().join("objects")).unwrap();
    let metastore = Embedded::open(&dir.path().join("m.redb")).unwrap();
    let spool_dir = dir.path().join("spool");
    let s = spool(&spool_dir, 1 << 20);
    let (good, good_path) = segment("t", "a");
    s.append(good).await.unwrap();
    // Acknowledged bytes that are not a segment (a bug, or a disk that lied).
    s.append(Bytes::from_static(b"not a segment object"))
        .await
        .unwrap();
    let (later, later_path) = segment("t", "b");
    s.append(later).await.unwrap();
    let file = spool_files(&spool_dir).unwrap().remove(0);
    assert_eq!(s.drain(&store, &metastore).await.unwrap(), 2);
    for path in [&good_path, &later_path] {
        assert!(store.get(path).await.is_ok(), "{path}: the others drained");
    }
    assert_eq!(store.metrics().spool_undecodable_records.get(), 1);
    assert_eq!(store.metrics().spool_files_set_aside.get(), 1);
    // The file is kept aside with the record in it, not deleted; the spool is empty.
    let aside = file.with_extension("corrupt");
    let kept = read_file(&aside).unwrap();
    assert_eq!(kept.records[1], Bytes::from_static(b"not a segment object"));
    assert!(spool_files(&spool_dir).unwrap().is_empty());
    assert!(s.is_empty());
    // A second drain finds nothing to do.
    assert_eq!(s.drain(&store, &metastore).await.unwrap(), 0);
    assert_eq!(store.metrics().spool_undecodable_records.get(), 1);
}

#[tokio::test]
async fn the_budget_refuses_what_does_not_fit() {
    let dir = tempfile::tempdir().unwrap();
    let s = spool(dir.path(), HEADER_BYTES + 4 + 10);
    s.append(Bytes::from(vec![1u8; 10])).await.unwrap();
    let err = s.append(Bytes::from(vec![1u8; 1])).await.unwrap_err();
    assert_eq!(err.kind(), crate::ErrorKind::Unavailable, "{err}");
    assert_eq!(
        read_file(&spool_files(dir.path()).unwrap()[0])
            .unwrap()
            .records
            .len(),
        1
    );
}
