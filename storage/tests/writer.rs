//! The shard writer's flushes against a slow object store: one flush at a time per shard, the
//! writes that arrive meanwhile flushed together right after it (group commit), those sent just
//! after it sharing a segment without waiting a new interval, no buffer
//! taking writes past its size limit, and a close waiting for the flush it interrupts. Nothing
//! is acknowledged before its segment is stored, and nothing acknowledged is lost.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kiln_storage::store::faulty::FaultyStore;
use kiln_storage::testing::{config, faulty_storage, frames, profile, stacks_around};
use kiln_storage::{Storage, StorageConfig};

const T0: i64 = 1_700_000_000_000_000_000;

fn one_shard(dir: &std::path::Path) -> StorageConfig {
    let mut c = config(dir);
    c.writer.shards = 1;
    // Only the writer's PUTs are counted.
    c.compaction.enabled = false;
    c
}

/// A storage on `c` whose PUTs are held, and a write of `main;<first>` (value 1) to tenant `a`
/// whose flush is waiting in its PUT.
async fn first_write_held(
    c: StorageConfig,
    first: &str,
) -> (
    Arc<Storage>,
    Arc<FaultyStore>,
    tokio::task::JoinHandle<kiln_storage::Result<()>>,
) {
    let (s, store) = faulty_storage(c).await;
    let s = Arc::new(s);
    store.hold_puts.store(true, Ordering::SeqCst);
    let write = write(&s, "a", first, 1);
    for _ in 0..5000 {
        if store.held_puts.load(Ordering::SeqCst) == 1 {
            return (s, store, write);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("the first write's PUT was never held");
}

/// The stacks `main;<name>` with their values, as [`stacks_around`] answers them.
fn stacks(named: &[(&str, i64)]) -> BTreeMap<Vec<String>, i64> {
    named
        .iter()
        .map(|&(name, value)| (frames(&format!("main;{name}")), value))
        .collect()
}

/// Writes `value` of the stack `main;<name>` to `tenant` on a task of its own.
fn write(
    s: &Arc<Storage>,
    tenant: &'static str,
    name: &str,
    value: i64,
) -> tokio::task::JoinHandle<kiln_storage::Result<()>> {
    let (s, p) = (
        Arc::clone(s),
        profile("api", &[(frames(&format!("main;{name}")), value)], T0),
    );
    tokio::spawn(async move { s.write(tenant, p).await })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_during_a_flush_are_flushed_together_right_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let (s, store, first) = first_write_held(one_shard(dir.path()), "first").await;
    let later = [
        write(&s, "a", "second", 2),
        write(&s, "a", "third", 3),
        write(&s, "b", "other", 4),
    ];
    // Many flush intervals later, the first flush still runs and no other has started: the
    // later writes wait, unacknowledged.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(store.held_puts.load(Ordering::SeqCst), 1);
    assert_eq!(store.puts.load(Ordering::SeqCst), 0);
    assert!(!first.is_finished() && later.iter().all(|w| !w.is_finished()));
    store.hold_puts.store(false, Ordering::SeqCst);
    first.await.unwrap().unwrap();
    for w in later {
        w.await.unwrap().unwrap();
    }
    // The first segment, then one for everything that came while it was written.
    assert_eq!(store.puts.load(Ordering::SeqCst), 2);
    assert_eq!(
        stacks_around(&s, "a", T0).await,
        stacks(&[("first", 1), ("second", 2), ("third", 3)])
    );
    assert_eq!(stacks_around(&s, "b", T0).await, stacks(&[("other", 4)]));
    assert!(stacks_around(&s, "c", T0).await.is_empty());
    s.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_sent_right_after_a_flush_share_a_segment_without_waiting_an_interval() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = one_shard(dir.path());
    c.writer.flush_interval = Duration::from_secs(3);
    c.writer.flush_linger = Duration::from_millis(300);
    let (s, store) = faulty_storage(c).await;
    let s = Arc::new(s);
    // The first write waits out the interval: nothing else shares it.
    write(&s, "a", "first", 1).await.unwrap().unwrap();
    assert_eq!(store.puts.load(Ordering::SeqCst), 1);
    // A sender answering the acknowledgement, then another a moment later: both within the
    // linger of the write before them.
    let answered = std::time::Instant::now();
    let second = write(&s, "a", "second", 2);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let third = write(&s, "a", "third", 3);
    second.await.unwrap().unwrap();
    third.await.unwrap().unwrap();
    // Flushed once the writes paused, long before a new interval would have ended.
    let waited = answered.elapsed();
    assert!(waited < Duration::from_secs(2), "waited {waited:?}");
    assert_eq!(store.puts.load(Ordering::SeqCst), 2);
    assert_eq!(
        stacks_around(&s, "a", T0).await,
        stacks(&[("first", 1), ("second", 2), ("third", 3)])
    );
    assert!(stacks_around(&s, "b", T0).await.is_empty());
    s.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_buffer_holds_later_writes_back_until_the_flush_before_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = one_shard(dir.path());
    // Every write fills the buffer.
    c.writer.flush_bytes = 1;
    let (s, store, first) = first_write_held(c, "f0").await;
    let later: Vec<_> = (1..=5)
        .map(|i| write(&s, "a", &format!("f{i}"), 1 + i))
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(store.held_puts.load(Ordering::SeqCst), 1);
    store.hold_puts.store(false, Ordering::SeqCst);
    first.await.unwrap().unwrap();
    for w in later {
        w.await.unwrap().unwrap();
    }
    // No buffer took a write past its limit: a segment each.
    assert_eq!(store.puts.load(Ordering::SeqCst), 6);
    let want: BTreeMap<Vec<String>, i64> = (0..=5)
        .map(|i| (frames(&format!("main;f{i}")), 1 + i))
        .collect();
    assert_eq!(stacks_around(&s, "a", T0).await, want);
    assert!(stacks_around(&s, "b", T0).await.is_empty());
    s.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_waits_for_the_running_flush_and_flushes_what_waits_behind_it() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (s, store, first) = first_write_held(one_shard(dir.path()), "first").await;
        let second = write(&s, "a", "second", 2);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let closing = {
            let s = Arc::clone(&s);
            tokio::spawn(async move { s.close().await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!closing.is_finished(), "close returned during a flush");
        store.hold_puts.store(false, Ordering::SeqCst);
        closing.await.unwrap();
        first.await.unwrap().unwrap();
        second.await.unwrap().unwrap();
        assert_eq!(store.puts.load(Ordering::SeqCst), 2);
    }
    // Both are durable: a new process reads them.
    let s = Storage::open(one_shard(dir.path())).await.unwrap();
    assert_eq!(
        stacks_around(&s, "a", T0).await,
        stacks(&[("first", 1), ("second", 2)])
    );
    assert!(stacks_around(&s, "b", T0).await.is_empty());
    s.close().await;
}
