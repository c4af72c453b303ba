//! Writes acknowledged from the write-ahead log (ADR 0018): a query sees every acknowledged
//! write at once, and after a crash every acknowledged write is stored exactly once — whether
//! the crash came before its segment, after the segment was registered but before the log was
//! released, or while the object store was refusing segments.
//!
//! Also here: a write shard that panics (a bug) is started again, and with a log replays it.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use kiln_storage::Storage;
use kiln_storage::testing::{
    faulty_storage, frames, logged_config, profile, rebuild_lost_metastore, stacks_around,
    text_record,
};

const T0: i64 = 1_700_000_000_000_000_000;
const SEC: i64 = 1_000_000_000;
/// Long enough that no segment is cut by time within a test.
const NEVER: Duration = Duration::from_secs(3600);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `f` on a runtime of its own, then drops the runtime's tasks where they stand, as a
/// SIGKILL would: no flush, no close.
fn then_crash<T>(f: impl std::future::Future<Output = T>) -> T {
    let rt = runtime();
    let out = rt.block_on(f);
    rt.shutdown_timeout(Duration::from_secs(10));
    out
}

/// Writes `n` one-sample writes of `tenant` (values 1..=n at `T0 + i s`), each acknowledged.
async fn write_logged(s: &Storage, tenant: &str, stack: &str, from: i64, n: i64) {
    for i in from..from + n {
        let record = text_record(tenant, "api", stack, i, T0 + i * SEC);
        let p = profile("api", &[(frames(stack), i)], T0 + i * SEC);
        s.write_logged(tenant, vec![p], Some(record), None)
            .await
            .unwrap();
    }
}

fn sum(from: i64, n: i64) -> i64 {
    (from..from + n).sum()
}

fn wal_files(dir: &Path) -> usize {
    walkdir(dir.join("wal").as_path())
}

fn walkdir(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|e| {
            let p = e.path();
            if p.is_dir() {
                walkdir(&p)
            } else {
                usize::from(p.extension().is_some_and(|x| x == "kwal"))
            }
        })
        .sum()
}

async fn stacks(s: &Storage, tenant: &str) -> BTreeMap<Vec<String>, i64> {
    stacks_around(s, tenant, T0).await
}

#[test]
fn acknowledged_writes_are_read_at_once_and_survive_a_crash_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = logged_config(dir.path(), NEVER);
    then_crash(async {
        let s = Storage::open(config.clone()).await.unwrap();
        assert!(s.logs_writes());
        write_logged(&s, "a", "main;first", 1, 10).await;
        // No segment was cut by time: the query's barrier cuts one, so it reads them all.
        assert_eq!(
            stacks(&s, "a").await,
            [(frames("main;first"), sum(1, 10))].into_iter().collect()
        );
        // Registered (the query reads them before): their log files are gone.
        s.barrier().await;
        assert_eq!(wal_files(dir.path()), 0);
        // Acknowledged from the log only, then the crash.
        write_logged(&s, "a", "main;second", 11, 5).await;
        write_logged(&s, "b", "main;b_only", 1, 3).await;
        assert!(wal_files(dir.path()) > 0);
    });
    then_crash(async {
        let s = Storage::open(config.clone()).await.unwrap();
        assert_eq!(s.metrics().log_replayed_records.get(), 8);
        let want: BTreeMap<Vec<String>, i64> = [
            (frames("main;first"), sum(1, 10)),
            (frames("main;second"), sum(11, 5)),
        ]
        .into_iter()
        .collect();
        assert_eq!(stacks(&s, "a").await, want);
        assert_eq!(
            stacks(&s, "b").await,
            [(frames("main;b_only"), sum(1, 3))].into_iter().collect()
        );
        // Tenants are walls, after a replay too.
        assert!(stacks(&s, "c").await.is_empty());
        // The replayed writes are registered and their files deleted: a second crash replays
        // nothing.
        assert_eq!(wal_files(dir.path()), 0);
    });
    then_crash(async {
        let s = Storage::open(config.clone()).await.unwrap();
        assert_eq!(s.metrics().log_replayed_records.get(), 0);
        assert_eq!(
            stacks(&s, "a").await.get(&frames("main;second")),
            Some(&sum(11, 5))
        );
        s.close().await;
    });
}

/// A crash after a segment was registered but before its log files were deleted: the
/// checkpoint, recorded with the segment, keeps its records from being replayed.
#[test]
fn records_a_registered_segment_holds_are_not_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let config = logged_config(dir.path(), NEVER);
    let saved = tempfile::tempdir().unwrap();
    then_crash(async {
        let s = Storage::open(config.clone()).await.unwrap();
        write_logged(&s, "a", "main;x", 1, 6).await;
        // The log as it stood before the segment: put back after the crash, as if its deletion
        // never happened.
        copy_dir(&dir.path().join("wal"), saved.path());
        s.flush().await;
        assert_eq!(wal_files(dir.path()), 0);
        write_logged(&s, "a", "main;y", 7, 2).await;
    });
    copy_dir(saved.path(), &dir.path().join("wal"));
    then_crash(async {
        let s = Storage::open(config.clone()).await.unwrap();
        assert_eq!(s.metrics().log_replayed_records.get(), 2);
        let want: BTreeMap<Vec<String>, i64> =
            [(frames("main;x"), sum(1, 6)), (frames("main;y"), sum(7, 2))]
                .into_iter()
                .collect();
        assert_eq!(stacks(&s, "a").await, want);
        s.close().await;
    });
}

/// The metastore lost after a crash: `kiln metastore rebuild` restores the log's checkpoint
/// from the objects' footers (here a compacted block's, which took it from the segments it
/// merged), so the log's records the objects hold are not replayed again, and those they do
/// not hold are.
#[test]
fn a_rebuilt_index_replays_only_the_records_no_object_holds() {
    let dir = tempfile::tempdir().unwrap();
    let config = logged_config(dir.path(), NEVER);
    let saved = tempfile::tempdir().unwrap();
    then_crash(async {
        let s = Storage::open(config.clone()).await.unwrap();
        // Four segments, merged into one block (the first level merges by fours); each
        // segment's log file saved before its deletion, as if a crash had kept it.
        for i in 0..4 {
            write_logged(&s, "a", "main;x", 1 + 2 * i, 2).await;
            copy_dir(&dir.path().join("wal"), saved.path());
            s.flush().await;
        }
        s.compactor()
            .compact_all(kiln_storage::testing::now_ms())
            .await
            .unwrap();
        s.collect_garbage(u64::MAX).await.unwrap();
        assert!(s.store().list("segments").await.unwrap().is_empty());
        // Acknowledged from the log only, then the crash (the storage is not dropped: its
        // shards would close and cut a segment of what they hold).
        write_logged(&s, "a", "main;y", 9, 2).await;
        write_logged(&s, "b", "main;b_only", 1, 1).await;
        std::mem::forget(s);
    });
    copy_dir(saved.path(), &dir.path().join("wal"));
    assert_eq!(wal_files(dir.path()), 5);
    // The index is lost and rebuilt from the objects.
    then_crash(async {
        let rebuilt = rebuild_lost_metastore(dir.path()).await;
        assert_eq!(rebuilt.entries, 1, "{rebuilt:?}");
        assert_eq!(
            rebuilt
                .checkpoints
                .iter()
                .map(|c| c.seq)
                .collect::<Vec<_>>(),
            [8]
        );
    });
    then_crash(async {
        let s = Storage::open(config.clone()).await.unwrap();
        assert_eq!(s.metrics().log_replayed_records.get(), 3);
        let want: BTreeMap<Vec<String>, i64> =
            [(frames("main;x"), sum(1, 8)), (frames("main;y"), sum(9, 2))]
                .into_iter()
                .collect();
        assert_eq!(stacks(&s, "a").await, want);
        assert_eq!(
            stacks(&s, "b").await,
            [(frames("main;b_only"), 1)].into_iter().collect()
        );
        assert_eq!(
            wal_files(dir.path()),
            0,
            "the replayed records are registered"
        );
        s.close().await;
    });
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// While the object store refuses segments, writes are still acknowledged from the log; the
/// segments are kept and registered once it answers, and a crash meanwhile loses nothing.
#[test]
fn segments_the_store_refuses_are_tried_again_and_a_crash_meanwhile_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = logged_config(dir.path(), Duration::from_millis(20));
    then_crash(async {
        let (s, store) = faulty_storage(config.clone()).await;
        write_logged(&s, "a", "main;up", 1, 3).await;
        s.flush().await;
        store.set_down(true);
        write_logged(&s, "a", "main;down", 4, 4).await;
        // Cut and refused, more than once.
        tokio::time::sleep(Duration::from_millis(100)).await;
        store.set_down(false);
        // Tried again within a second; the query's barrier cuts nothing new.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let want: BTreeMap<Vec<String>, i64> = [
            (frames("main;up"), sum(1, 3)),
            (frames("main;down"), sum(4, 4)),
        ]
        .into_iter()
        .collect();
        assert_eq!(stacks(&s, "a").await, want);
        store.set_down(true);
        write_logged(&s, "a", "main;lost?", 8, 2).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    });
    then_crash(async {
        let s = Storage::open(config.clone()).await.unwrap();
        let want: BTreeMap<Vec<String>, i64> = [
            (frames("main;up"), sum(1, 3)),
            (frames("main;down"), sum(4, 4)),
            (frames("main;lost?"), sum(8, 2)),
        ]
        .into_iter()
        .collect();
        assert_eq!(stacks(&s, "a").await, want);
        assert!(stacks(&s, "b").await.is_empty());
        s.close().await;
    });
}

/// Deletes `tenant` as another process would: in the metastore, without this process's barrier.
async fn deleted_elsewhere(s: &Storage, tenant: &str) {
    tokio::time::sleep(Duration::from_millis(2)).await;
    s.metastore()
        .delete_tenant(tenant, kiln_storage::clock::now_ms(), 0)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2)).await;
}

/// A tenant deleted while its writes are acknowledged from a log only does not come back when
/// the log is replayed after a crash; the log is released all the same, other tenants' writes
/// are stored, and the tenant's later writes are stored as a new tenant's.
#[test]
fn a_deleted_tenant_does_not_come_back_from_a_replay() {
    let dir = tempfile::tempdir().unwrap();
    let config = logged_config(dir.path(), NEVER);
    then_crash(async {
        let s = Storage::open(config.clone()).await.unwrap();
        write_logged(&s, "a", "main;logged", 1, 4).await;
        write_logged(&s, "b", "main;b_only", 1, 3).await;
        deleted_elsewhere(&s, "a").await;
    });
    then_crash(async {
        let s = Storage::open(config.clone()).await.unwrap();
        assert_eq!(s.metrics().log_replayed_records.get(), 7);
        assert!(stacks(&s, "a").await.is_empty());
        assert_eq!(
            stacks(&s, "b").await,
            [(frames("main;b_only"), sum(1, 3))].into_iter().collect()
        );
        assert_eq!(
            wal_files(dir.path()),
            0,
            "the replayed records are released"
        );
        write_logged(&s, "a", "main;again", 5, 2).await;
        s.close().await;
    });
    then_crash(async {
        let s = Storage::open(config.clone()).await.unwrap();
        assert_eq!(
            stacks(&s, "a").await,
            [(frames("main;again"), sum(5, 2))].into_iter().collect()
        );
        s.close().await;
    });
}

/// A tenant deleted elsewhere while this process holds its writes, buffered or cut into
/// segments the store refuses (the retry backlog): they are not registered when the store
/// answers again; other tenants' writes are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_tenant_does_not_come_back_from_a_buffer_or_the_retry_backlog() {
    let dir = tempfile::tempdir().unwrap();
    let (s, store) = faulty_storage(logged_config(dir.path(), Duration::from_millis(20))).await;
    store.set_down(true);
    write_logged(&s, "a", "main;waiting", 1, 3).await;
    write_logged(&s, "b", "main;b_only", 1, 2).await;
    // Cut and refused, more than once: the segments wait in the backlog.
    tokio::time::sleep(Duration::from_millis(100)).await;
    deleted_elsewhere(&s, "a").await;
    store.set_down(false);
    // Buffered only, then registered by the flush.
    write_logged(&s, "c", "main;c_only", 1, 1).await;
    // Tried again within a second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    s.flush().await;
    assert!(stacks(&s, "a").await.is_empty());
    assert_eq!(
        stacks(&s, "b").await,
        [(frames("main;b_only"), sum(1, 2))].into_iter().collect()
    );
    assert_eq!(
        stacks(&s, "c").await,
        [(frames("main;c_only"), 1)].into_iter().collect()
    );
    s.close().await;
    // Buffered (no segment is cut by time) when the deletion comes.
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(logged_config(dir.path(), NEVER))
        .await
        .unwrap();
    write_logged(&s, "a", "main;buffered", 1, 2).await;
    write_logged(&s, "b", "main;b_only", 1, 2).await;
    deleted_elsewhere(&s, "a").await;
    s.flush().await;
    assert!(stacks(&s, "a").await.is_empty());
    assert_eq!(
        stacks(&s, "b").await,
        [(frames("main;b_only"), sum(1, 2))].into_iter().collect()
    );
    assert_eq!(wal_files(dir.path()), 0);
    s.close().await;
}

/// A record that does not decode is skipped and counted at replay; the others are stored.
#[test]
fn an_undecodable_record_is_skipped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let config = logged_config(dir.path(), NEVER);
    then_crash(async {
        let s = Storage::open(config.clone()).await.unwrap();
        write_logged(&s, "a", "main;ok", 1, 2).await;
        let p = profile("api", &[(frames("main;bad"), 100)], T0);
        s.write_logged("a", vec![p], Some(b"not a record".to_vec()), None)
            .await
            .unwrap();
        write_logged(&s, "a", "main;ok", 3, 1).await;
    });
    then_crash(async {
        let s = Storage::open(config.clone()).await.unwrap();
        assert_eq!(s.metrics().log_replayed_records.get(), 4);
        assert_eq!(s.metrics().log_undecodable_records.get(), 1);
        assert_eq!(
            stacks(&s, "a").await,
            [(frames("main;ok"), sum(1, 3))].into_iter().collect()
        );
        s.close().await;
    });
    // Kept, by itself, though the log's files are gone.
    let kept = files_named(&dir.path().join("wal"), |p| {
        p.extension().is_some_and(|x| x == "record")
    });
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(std::fs::read(&kept[0]).unwrap(), b"not a record");
    assert_eq!(wal_files(dir.path()), 0);
}

/// A segment that cannot be made does not drop the writes it held that were acknowledged from
/// the log: their records are kept aside, and counted, before a later segment's checkpoint
/// passes them. The writes after it are stored as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_that_cannot_be_made_keeps_its_records() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(logged_config(dir.path(), NEVER))
        .await
        .unwrap();
    write_logged(&s, "a", "main;unmade", 1, 2).await;
    s.metrics()
        .fail_segment_builds
        .store(1, std::sync::atomic::Ordering::SeqCst);
    // A query of a's writes cuts them; the segment fails.
    assert!(stacks(&s, "a").await.is_empty());
    assert_eq!(s.metrics().log_records_set_aside.get(), 2);
    write_logged(&s, "a", "main;next", 3, 1).await;
    s.barrier().await;
    assert_eq!(
        stacks(&s, "a").await,
        [(frames("main;next"), 3)].into_iter().collect()
    );
    assert!(stacks(&s, "b").await.is_empty());
    s.close().await;
    let kept = files_named(&dir.path().join("wal"), |p| {
        p.extension().is_some_and(|x| x == "record")
    });
    let read: Vec<Vec<u8>> = kept.iter().map(|p| std::fs::read(p).unwrap()).collect();
    let want: Vec<Vec<u8>> = (1..=2)
        .map(|i| text_record("a", "api", "main;unmade", i, T0 + i * SEC))
        .collect();
    assert_eq!(read, want);
}

/// Every file under `dir` that `keep` takes, sorted.
fn files_named(dir: &Path, keep: impl Fn(&Path) -> bool + Copy) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_named(&p, keep));
        } else if keep(&p) {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// A log file damaged before its end (a flipped byte in an older file) is kept whole under
/// `aside/` and counted; the other files' records are replayed.
#[test]
fn a_damaged_log_file_is_set_aside_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = logged_config(dir.path(), NEVER);
    // A file a group: each write's record in a file of its own.
    config.writer.log.as_mut().unwrap().max_file_bytes = 1;
    then_crash(async {
        let s = Storage::open(config.clone()).await.unwrap();
        write_logged(&s, "a", "main;ok", 1, 5).await;
    });
    let kwal = |p: &Path| p.extension().is_some_and(|x| x == "kwal");
    let files = files_named(&dir.path().join("wal"), kwal);
    assert_eq!(files.len(), 5, "{files:?}");
    // The last byte of the second file's record: its CRC fails.
    let mut bytes = std::fs::read(&files[1]).unwrap();
    *bytes.last_mut().unwrap() ^= 0xff;
    std::fs::write(&files[1], &bytes).unwrap();
    then_crash(async {
        let s = Storage::open(config.clone()).await.unwrap();
        assert_eq!(s.metrics().log_files_set_aside.get(), 1);
        assert_eq!(s.metrics().log_replayed_records.get(), 4);
        assert_eq!(
            stacks(&s, "a").await,
            [(frames("main;ok"), sum(1, 5) - 2)].into_iter().collect()
        );
        s.close().await;
    });
    let aside: Vec<_> = files_named(&dir.path().join("wal"), kwal)
        .into_iter()
        .filter(|p| p.parent().is_some_and(|d| d.ends_with("aside")))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(std::fs::read(&aside[0]).unwrap(), bytes);
    assert_eq!(wal_files(dir.path()), 1, "only the copy set aside is left");
}

/// Writes without a record (formats the gateway does not log) wait for their segment, which
/// is cut within the flush interval, not the segment interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_without_a_record_wait_for_their_segment() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(logged_config(dir.path(), NEVER))
        .await
        .unwrap();
    s.write("a", profile("api", &[(frames("main;plain"), 4)], T0))
        .await
        .unwrap();
    // Acknowledged once registered: visible to a process with no barrier (a query process).
    let blocks = s
        .metastore()
        .query_blocks(kiln_storage::metastore::BlockQuery::all("a"))
        .await
        .unwrap();
    assert_eq!(blocks.len(), 1);
    assert_eq!(wal_files(dir.path()), 0);
    // The shard goes on taking both kinds.
    s.write("a", profile("api", &[(frames("main;plain"), 1)], T0))
        .await
        .unwrap();
    write_logged(&s, "a", "main;logged", 1, 2).await;
    assert_eq!(
        stacks(&s, "a").await,
        [(frames("main;plain"), 5), (frames("main;logged"), 3)]
            .into_iter()
            .collect()
    );
    assert!(stacks(&s, "b").await.is_empty());
    s.close().await;
}

/// With N ingest processes sharing the writes, a shard cuts a segment every N intervals
/// (capped), so the cluster cuts about as many segments as one process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_cuts_less_often_when_ingest_processes_share_the_writes() {
    use kiln_storage::writer::{MAX_SCALED_SEGMENT_INTERVAL, scaled_segment_interval};
    let second = Duration::from_secs(1);
    assert_eq!(scaled_segment_interval(second, 0), second);
    assert_eq!(scaled_segment_interval(second, 3), 3 * second);
    assert_eq!(
        scaled_segment_interval(second, 50),
        MAX_SCALED_SEGMENT_INTERVAL
    );
    assert_eq!(scaled_segment_interval(9 * second, 3), 9 * second);

    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(logged_config(dir.path(), Duration::from_millis(300)))
        .await
        .unwrap();
    let registered = || async {
        s.metastore()
            .query_blocks(kiln_storage::metastore::BlockQuery::all("a"))
            .await
            .unwrap()
            .len()
    };
    s.scale_segment_interval(10);
    write_logged(&s, "a", "main;scaled", 1, 1).await;
    // Unscaled, the segment would be cut at 300 ms; scaled, at 3 s.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(registered().await, 0, "cut at the unscaled interval");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while registered().await == 0 {
        assert!(std::time::Instant::now() < deadline, "never cut");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Back to one process: the next write's segment comes at the interval again.
    s.scale_segment_interval(1);
    let started = std::time::Instant::now();
    write_logged(&s, "a", "main;alone", 2, 1).await;
    while registered().await < 2 {
        assert!(started.elapsed() < Duration::from_secs(20), "never cut");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        started.elapsed() < Duration::from_millis(2900),
        "{:?}",
        started.elapsed()
    );
    assert!(stacks(&s, "b").await.is_empty());
    s.close().await;
}

/// A group of records waits for the writes announced when their requests started
/// ([`Storage::expect_write`]), and a write is not acknowledged before its group is appended.
/// When the last announced write ends without arriving (its request refused), a lone write's
/// group goes at once; two writes that met share one `fdatasync`. After a group of several
/// writes (a concurrent load), the next group waits for company though none is announced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_waits_for_the_writes_under_way_and_goes_when_none_is() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = logged_config(dir.path(), NEVER);
    config.writer.log.as_mut().unwrap().group_linger = NEVER;
    let s = Storage::open(config).await.unwrap();
    let logged = |s: &Storage, stack: &str, value: i64, expected| {
        let s = s.clone();
        let (record, p) = (
            text_record("a", "api", stack, value, T0),
            profile("api", &[(frames(stack), value)], T0),
        );
        tokio::spawn(async move { s.write_logged("a", vec![p], Some(record), expected).await })
    };
    let appends = |s: &Storage| s.metrics().log_appends.get();
    let settle = || tokio::time::sleep(Duration::from_millis(100));

    // A lone write goes at once.
    logged(&s, "main;alone", 1, None).await.unwrap().unwrap();
    assert_eq!(appends(&s), 1);

    // An announced write that never arrives: the group goes when its announcement ends.
    let refused = s.expect_write();
    let second = logged(&s, "main;second", 2, None);
    settle().await;
    assert!(
        !second.is_finished(),
        "acknowledged before its group was appended"
    );
    assert_eq!(appends(&s), 1);
    drop(refused);
    tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("the group goes once no write is under way")
        .unwrap()
        .unwrap();
    assert_eq!(appends(&s), 2);

    // An announced write that arrives joins the group: one append for both.
    let coming = s.expect_write();
    let third = logged(&s, "main;third", 3, None);
    settle().await;
    assert!(!third.is_finished());
    logged(&s, "main;fourth", 4, Some(coming))
        .await
        .unwrap()
        .unwrap();
    third.await.unwrap().unwrap();
    assert_eq!(appends(&s), 3, "one group for both writes");

    // After that group of two, a lone write waits for company (here, for ever: a flush
    // appends it).
    let fifth = logged(&s, "main;fifth", 5, None);
    settle().await;
    assert!(!fifth.is_finished());
    assert_eq!(appends(&s), 3);
    s.flush().await;
    fifth.await.unwrap().unwrap();
    assert_eq!(appends(&s), 4);

    assert_eq!(
        stacks(&s, "a").await,
        (1..=5)
            .zip(["alone", "second", "third", "fourth", "fifth"])
            .map(|(v, name)| (frames(&format!("main;{name}")), v))
            .collect()
    );
    assert!(stacks(&s, "b").await.is_empty());
    s.close().await;
}

/// A group waits for an announced write at most the group linger: a write whose announced
/// neighbour never arrives is still acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_waits_no_longer_than_its_linger() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = logged_config(dir.path(), NEVER);
    config.writer.log.as_mut().unwrap().group_linger = Duration::from_millis(50);
    let s = Storage::open(config).await.unwrap();
    let _never = s.expect_write();
    tokio::time::timeout(
        Duration::from_secs(10),
        write_logged(&s, "a", "main;alone", 1, 2),
    )
    .await
    .expect("acknowledged after the linger");
    assert_eq!(s.metrics().log_appends.get(), 2);
    assert_eq!(
        stacks(&s, "a").await,
        [(frames("main;alone"), 3)].into_iter().collect()
    );
    assert!(stacks(&s, "b").await.is_empty());
    s.close().await;
}

/// The log refuses to start with fewer shards than it holds records of.
#[test]
fn a_log_of_more_shards_than_configured_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = logged_config(dir.path(), NEVER);
    config.writer.shards = 2;
    then_crash(async {
        let s = Storage::open(config.clone()).await.unwrap();
        for i in 0..20 {
            let service = format!("svc{i}");
            let record = text_record("a", &service, "main", 1, T0);
            let p = profile(&service, &[(frames("main"), 1)], T0);
            s.write_logged("a", vec![p], Some(record), None)
                .await
                .unwrap();
        }
    });
    config.writer.shards = 1;
    let err = runtime()
        .block_on(Storage::open(config.clone()))
        .map(|_| ())
        .unwrap_err();
    assert!(err.to_string().contains("at least 2 shards"), "{err}");
    // What the gateway's default shard count follows when `--shards` is not given.
    assert_eq!(kiln_storage::writer::log_shards(&dir.path().join("wal")), 2);
    assert_eq!(
        kiln_storage::writer::log_shards(&dir.path().join("none")),
        0
    );
    config.writer.shards = 2;
    then_crash(async {
        let s = Storage::open(config.clone()).await.unwrap();
        assert_eq!(s.metrics().log_replayed_records.get(), 20);
        assert_eq!(
            stacks(&s, "a").await,
            [(frames("main"), 20)].into_iter().collect()
        );
        s.close().await;
    });
}

/// A query reads a segment its barrier cut before it is registered, from memory: while the
/// store refuses it, and while the store holds its put. Once it is registered the query reads
/// it from the store, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_reads_a_segment_cut_but_not_registered() {
    let dir = tempfile::tempdir().unwrap();
    let (s, store) = faulty_storage(logged_config(dir.path(), Duration::from_millis(10))).await;
    store.set_down(true);
    write_logged(&s, "a", "main;late", 1, 3).await;
    // Cut and refused; the next try is a second away.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let late: BTreeMap<Vec<String>, i64> = [(frames("main;late"), sum(1, 3))].into_iter().collect();
    assert_eq!(stacks(&s, "a").await, late);
    assert!(stacks(&s, "b").await.is_empty());
    store.set_down(false);
    s.barrier().await;
    assert_eq!(wal_files(dir.path()), 0);
    assert_eq!(stacks(&s, "a").await, late);

    // A put that hangs (the segment cut within 10 ms): the shard waits on it, its queries
    // do not.
    store
        .hold_puts
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let s2 = s.clone();
    let more = tokio::spawn(async move { write_logged(&s2, "a", "main;held", 1, 1).await });
    tokio::time::timeout(Duration::from_secs(10), more)
        .await
        .expect("acknowledged from the log while the store holds the put")
        .unwrap();
    let want: BTreeMap<Vec<String>, i64> =
        [(frames("main;late"), sum(1, 3)), (frames("main;held"), 1)]
            .into_iter()
            .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(store.held_puts.load(std::sync::atomic::Ordering::SeqCst) > 0);
    let read = tokio::time::timeout(Duration::from_secs(10), stacks(&s, "a"))
        .await
        .expect("a query does not wait for a held put");
    assert_eq!(read, want);
    assert!(stacks(&s, "b").await.is_empty());
    store
        .hold_puts
        .store(false, std::sync::atomic::Ordering::SeqCst);
    s.barrier().await;
    assert_eq!(stacks(&s, "a").await, want);
    s.close().await;
}

/// A query's barrier is scoped: it cuts a shard's buffered writes only when they hold its tenant
/// in its time range. Another tenant's queries, or this tenant's outside the range it wrote,
/// leave the writes buffered; a query that reads them cuts once and sees them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_cuts_only_writes_of_its_tenant_and_range() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(logged_config(dir.path(), NEVER))
        .await
        .unwrap();
    write_logged(&s, "b", "main;b", 1, 1).await;
    s.barrier().await;
    let cuts = || s.metrics().barrier_cuts.get();
    write_logged(&s, "a", "main;a", 1, 3).await;
    // Tenant b at 50 Hz: its own data, never a's.
    for _ in 0..50 {
        let b = stacks(&s, "b").await;
        assert_eq!(b, [(frames("main;b"), 1)].into_iter().collect());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(cuts(), 0, "b's queries cut a's writes");
    // Tenant a, a day later than it wrote.
    const DAY: i64 = 86_400 * SEC;
    let later = stacks_around(&s, "a", T0 + DAY).await;
    assert!(later.is_empty());
    assert_eq!(cuts(), 0, "a query outside the range written cut");
    let want: BTreeMap<Vec<String>, i64> = [(frames("main;a"), sum(1, 3))].into_iter().collect();
    assert_eq!(stacks(&s, "a").await, want);
    assert_eq!(cuts(), 1);
    // Cut: nothing of a is buffered any more.
    assert_eq!(stacks(&s, "a").await, want);
    assert_eq!(cuts(), 1);
    s.close().await;
}

/// Queries racing a stream of writes, their segments' cuts and registrations: each sees every
/// write acknowledged before it began, and none twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_racing_cuts_and_registrations_see_each_write_once() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(logged_config(dir.path(), Duration::from_millis(3)))
        .await
        .unwrap();
    let (sent, acked, done) = (
        Arc::new(AtomicI64::new(0)),
        Arc::new(AtomicI64::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let writer = {
        let (s, sent, acked, done) = (s.clone(), sent.clone(), acked.clone(), done.clone());
        tokio::spawn(async move {
            for i in 1..=400 {
                sent.fetch_add(i, Ordering::SeqCst);
                write_logged(&s, "a", "main;w", i, 1).await;
                acked.fetch_add(i, Ordering::SeqCst);
            }
            done.store(true, Ordering::SeqCst);
        })
    };
    let mut queries = 0;
    while !done.load(Ordering::SeqCst) {
        let floor = acked.load(Ordering::SeqCst);
        let got = stacks(&s, "a").await.values().sum::<i64>();
        let ceiling = sent.load(Ordering::SeqCst);
        assert!(
            (floor..=ceiling).contains(&got),
            "read {got}, acknowledged {floor}, sent {ceiling}"
        );
        queries += 1;
    }
    writer.await.unwrap();
    assert!(queries > 10, "{queries} queries");
    assert_eq!(stacks(&s, "a").await.values().sum::<i64>(), sum(1, 400));
    assert!(stacks(&s, "b").await.is_empty());
    s.close().await;
}

/// A shard that panics (a bug) is started again: the writes it had acknowledged from its log
/// are replayed and read once, the write it was taking is refused, and later writes are taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_that_panics_is_started_again_and_replays_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(logged_config(dir.path(), NEVER))
        .await
        .unwrap();
    // Acknowledged from the log and buffered: no segment is cut by time.
    write_logged(&s, "a", "main;before", 1, 3).await;
    let tenant = kiln_storage::writer::testing::PANICKING_TENANT;
    let record = text_record(tenant, "api", "main", 1, T0);
    let p = profile("api", &[(frames("main"), 1)], T0);
    let refused = s.write_logged(tenant, vec![p], Some(record), None).await;
    assert!(
        matches!(refused, Err(kiln_storage::Error::Unanswered)),
        "{refused:?}"
    );
    write_logged(&s, "a", "main;after", 1, 2).await;
    assert_eq!(s.metrics().shard_panics.get(), 1);
    assert_eq!(s.metrics().log_replayed_records.get(), 3);
    assert_eq!(
        stacks(&s, "a").await,
        [
            (frames("main;before"), sum(1, 3)),
            (frames("main;after"), sum(1, 2)),
        ]
        .into_iter()
        .collect()
    );
    assert!(stacks(&s, "b").await.is_empty());
    assert!(stacks(&s, tenant).await.is_empty());
    s.close().await;
}

/// Without a log too: the write that panicked its shard is refused, the shard's earlier writes
/// (registered before they were acknowledged) stay, and later writes are taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_without_a_log_is_started_again_after_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(kiln_storage::testing::config(dir.path()))
        .await
        .unwrap();
    assert!(!s.logs_writes());
    let write = |tenant: &'static str, stack: &'static str| {
        let s = s.clone();
        async move {
            s.write(tenant, profile("api", &[(frames(stack), 1)], T0))
                .await
        }
    };
    write("a", "main;before").await.unwrap();
    let tenant = kiln_storage::writer::testing::PANICKING_TENANT;
    let refused = write(tenant, "main").await;
    assert!(
        matches!(refused, Err(kiln_storage::Error::Unanswered)),
        "{refused:?}"
    );
    write("a", "main;after").await.unwrap();
    assert_eq!(s.metrics().shard_panics.get(), 1);
    assert_eq!(
        stacks(&s, "a").await,
        [(frames("main;before"), 1), (frames("main;after"), 1)]
            .into_iter()
            .collect()
    );
    assert!(stacks(&s, tenant).await.is_empty());
    s.close().await;
}
