//! The object stores users run, exercised as Kiln uses them: moto's S3 server, s3rver (a second,
//! independent S3 implementation) and Microsoft's Azurite (the Azure blob emulator), all started
//! by the test command. On each: the object operations the engine relies on (durable put,
//! multipart upload, whole and ranged reads, listing, deletion of present and absent objects),
//! then a storage on it ingests, compacts, collects garbage and answers the same before and
//! after, and a fresh process on the same store and metastore answers the same; another tenant
//! sees nothing. GCS is not here: see docs/configuration.md ("Object stores: what is tested").

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kiln_storage::format::meta::PARTITION_NANOS;
use kiln_storage::metastore::BlockQuery;
use kiln_storage::metastore::embedded::Embedded;
use kiln_storage::store::ObjectStorage;
use kiln_storage::testing::{config, frames, merged_stacks, now_ms, profile, store_locations};
use kiln_storage::{Storage, StorageConfig};

const T0: i64 = 1_700_000_000_000_000_000 - 1_700_000_000_000_000_000 % PARTITION_NANOS;
const SEC: i64 = 1_000_000_000;

type Stacks = BTreeMap<Vec<String>, i64>;

async fn stacks(s: &Storage, tenant: &str) -> Stacks {
    merged_stacks(s, tenant, T0 - PARTITION_NANOS, T0 + PARTITION_NANOS).await
}

fn store(location: &(String, Vec<(String, String)>)) -> ObjectStorage {
    ObjectStorage::from_url_with(&location.0, Duration::from_secs(5), &location.1)
        .unwrap_or_else(|e| panic!("{}: {e}", location.0))
}

/// The operations the engine performs on a store, with the answers it relies on.
async fn object_operations(name: &str, s: &ObjectStorage) {
    let small = Bytes::from_static(b"0123456789abcdef");
    s.put_durable("ops/small", small.clone()).await.unwrap();
    assert_eq!(s.get("ops/small").await.unwrap(), small, "{name}");
    assert_eq!(
        s.get_range("ops/small", 4..10).await.unwrap(),
        small.slice(4..10),
        "{name}"
    );
    // Larger than one part (8 MiB): a multipart upload, as blocks are uploaded.
    let big: Vec<u8> = (0..(9 << 20) as u32).map(|i| (i % 251) as u8).collect();
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &big).unwrap();
    s.put_file_durable("ops/big", file.path()).await.unwrap();
    assert_eq!(s.get("ops/big").await.unwrap().len(), big.len(), "{name}");
    let tail = (big.len() - 100) as u64..big.len() as u64;
    assert_eq!(
        s.get_range("ops/big", tail.clone()).await.unwrap(),
        big[tail.start as usize..],
        "{name}"
    );
    let mut listed: Vec<String> = s
        .list("ops")
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.location.to_string())
        .collect();
    listed.sort();
    assert_eq!(listed, ["ops/big", "ops/small"], "{name}");
    s.delete("ops/small").await.unwrap();
    s.delete("ops/small").await.unwrap(); // absent: not an error
    s.delete("ops/big").await.unwrap();
    assert!(s.list("ops").await.unwrap().is_empty(), "{name}");
    assert!(s.get("ops/small").await.is_err(), "{name}");
}

fn storage_config(dir: &std::path::Path) -> StorageConfig {
    let mut c = config(dir);
    c.writer.shards = 1;
    c
}

async fn storage_on(dir: &std::path::Path, s: ObjectStorage) -> Storage {
    let metastore = Embedded::open(&dir.join("metastore.redb")).unwrap();
    Storage::with_parts(storage_config(dir), s, Arc::new(metastore)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_store_users_run_holds_kilns_data() {
    for (name, location) in store_locations() {
        object_operations(name, &store(&location)).await;

        let dir = tempfile::tempdir().unwrap();
        let s = storage_on(dir.path(), store(&location)).await;
        let mut want = Stacks::new();
        for i in 0..12 {
            let t = T0 + i * 10 * SEC;
            let leaf = format!("main;handle;parse{}", i % 3);
            s.write("a", profile("api", &[(frames(&leaf), 10 + i)], t))
                .await
                .unwrap();
            s.write("b", profile("db", &[(frames("main;b_only"), 2)], t))
                .await
                .unwrap();
            *want.entry(frames(&leaf)).or_default() += 10 + i;
            s.flush().await;
        }
        assert_eq!(stacks(&s, "a").await, want, "{name}: before compaction");
        let segments = s.store().list("segments").await.unwrap().len();
        assert!(segments >= 12, "{name}: {segments} segments");
        let jobs = s.compactor().compact_all(now_ms()).await.unwrap();
        assert!(jobs > 0, "{name}");
        s.collect_garbage(u64::MAX).await.unwrap();
        assert!(
            s.store().list("segments").await.unwrap().is_empty(),
            "{name}: compacted segments deleted from the store"
        );
        let blocks = s
            .metastore()
            .query_blocks(BlockQuery::all("a"))
            .await
            .unwrap();
        assert!(blocks.iter().all(|b| b.level > 0), "{name}: {blocks:?}");
        assert_eq!(stacks(&s, "a").await, want, "{name}: after compaction");
        s.close().await;
        drop(s);

        // A fresh process on the same store and metastore.
        let again = storage_on(dir.path(), store(&location)).await;
        assert_eq!(stacks(&again, "a").await, want, "{name}: reopened");
        let b: i64 = stacks(&again, "b").await.values().sum();
        assert_eq!(b, 2 * 12, "{name}");
        assert!(stacks(&again, "other").await.is_empty(), "{name}");
        assert!(
            !stacks(&again, "b")
                .await
                .contains_key(&frames("main;handle;parse0")),
            "{name}"
        );
        again.close().await;
    }
}
