//! The spool: with the object store unreachable, writes are acknowledged into the local spool
//! within its budget (refused past it), nothing acknowledged is lost — across a restart too —
//! and the data becomes queryable once the store answers again.

use std::collections::BTreeMap;

use kiln_storage::testing::{config, faulty_storage, frames, profile, stacks_around};
use kiln_storage::{ErrorKind, Storage};

const T0: i64 = 1_700_000_000_000_000_000;
const SEC: i64 = 1_000_000_000;

fn spooled(s: &Storage) -> u64 {
    s.metrics().spool_bytes.get() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_wait_in_the_spool_while_the_store_is_down() {
    let dir = tempfile::tempdir().unwrap();
    let (s, store) = faulty_storage(config(dir.path())).await;
    s.write("a", profile("api", &[(frames("main;up"), 1)], T0))
        .await
        .unwrap();
    store.set_down(true);
    // Acknowledged while the store is down: into the spool.
    for i in 1..=3 {
        s.write(
            "a",
            profile("api", &[(frames("main;down"), i)], T0 + i * SEC),
        )
        .await
        .unwrap();
    }
    s.write("b", profile("api", &[(frames("main;b_only"), 5)], T0))
        .await
        .unwrap();
    assert!(spooled(&s) > 0);
    // The drainer cannot drain yet.
    s.drain_spool().await;
    assert!(spooled(&s) > 0);
    store.set_down(false);
    s.drain_spool().await;
    assert_eq!(spooled(&s), 0);
    let want: BTreeMap<Vec<String>, i64> = [(frames("main;up"), 1), (frames("main;down"), 6)]
        .into_iter()
        .collect();
    assert_eq!(stacks_around(&s, "a", T0).await, want);
    assert_eq!(
        stacks_around(&s, "b", T0).await,
        [(frames("main;b_only"), 5)].into_iter().collect()
    );
    assert!(
        !stacks_around(&s, "c", T0)
            .await
            .contains_key(&frames("main;down"))
    );
    s.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_budget_writes_are_refused_and_nothing_acknowledged_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.spool_max_bytes = 64 * 1024;
    let (s, store) = faulty_storage(c.clone()).await;
    store.set_down(true);
    let mut acknowledged = 0i64;
    let mut refused = 0;
    for i in 0..200 {
        // Distinct stacks, so every segment is a few KiB.
        let stacks: Vec<(Vec<String>, i64)> = (0..20)
            .map(|k| (frames(&format!("main;f{i};g{k}")), 1))
            .collect();
        match s.write("a", profile("api", &stacks, T0 + i * SEC)).await {
            Ok(()) => acknowledged += 20,
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
                assert!(e.to_string().contains("spool is full"), "{e}");
                refused += 1;
            }
        }
    }
    assert!(acknowledged > 0 && refused > 0, "{acknowledged} {refused}");
    assert!(spooled(&s) <= 64 * 1024);
    // A restart while the store is still down: the spool is on disk.
    s.close().await;
    drop(s);
    let (s, store) = faulty_storage(c).await;
    assert!(spooled(&s) > 0, "the reopened spool counts its files");
    store.set_down(false);
    s.drain_spool().await;
    let total: i64 = stacks_around(&s, "a", T0).await.values().sum();
    assert_eq!(total, acknowledged, "exactly what was acknowledged");
    assert!(stacks_around(&s, "b", T0).await.is_empty());
    s.close().await;
}

/// A tenant deleted while its writes wait in the spool (by another process, say: this one
/// cannot reach the store) does not come back when they drain; other tenants' writes do, and
/// the tenant's later writes are stored as a new tenant's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_deleted_while_its_writes_are_spooled_stays_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let (s, store) = faulty_storage(config(dir.path())).await;
    s.write("a", profile("api", &[(frames("main;up"), 1)], T0))
        .await
        .unwrap();
    store.set_down(true);
    for i in 1..=3 {
        s.write(
            "a",
            profile("api", &[(frames("main;down"), i)], T0 + i * SEC),
        )
        .await
        .unwrap();
    }
    s.write("b", profile("api", &[(frames("main;b_only"), 5)], T0))
        .await
        .unwrap();
    assert!(spooled(&s) > 0);
    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    s.metastore()
        .delete_tenant("a", kiln_storage::clock::now_ms(), 0)
        .await
        .unwrap();
    store.set_down(false);
    s.drain_spool().await;
    assert_eq!(spooled(&s), 0);
    assert!(stacks_around(&s, "a", T0).await.is_empty());
    assert_eq!(
        stacks_around(&s, "b", T0).await,
        [(frames("main;b_only"), 5)].into_iter().collect()
    );
    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    s.write("a", profile("api", &[(frames("main;again"), 7)], T0))
        .await
        .unwrap();
    assert_eq!(
        stacks_around(&s, "a", T0).await,
        [(frames("main;again"), 7)].into_iter().collect()
    );
    s.close().await;
}
