//! The storage engine with the real symbolizer as its frame namer: a block's native frames are
//! named at query time from a debug file uploaded after the profiles, for their tenant only;
//! compaction writes the names into the blocks it makes, so they outlive the upload.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kiln_otel::model::Labels;
use kiln_otel::normalize::{IngestMeta, NormalizeLimits, normalize_pprof};
use kiln_proto::google::v1 as pb;
use kiln_storage::Storage;
use kiln_storage::testing::{config, filter};
use kiln_symbolize::debuginfod::DebuginfodConfig;
use kiln_symbolize::store::UploadLimits;
use kiln_symbolize::testing::{self, Program};
use kiln_symbolize::{Metrics, Symbolizer, SymbolizerConfig, identify_file};

const T0: i64 = 1_700_000_000_000_000_000;

/// A pprof of one sample per address (value i + 1), the mapping naming the program by build id.
fn profile(build_id: &str, addrs: &[u64], t: i64) -> kiln_otel::NormalizedProfile {
    let mut p = pb::Profile {
        string_table: ["", "cpu", "nanoseconds", "/usr/bin/c", build_id]
            .map(String::from)
            .to_vec(),
        sample_type: vec![pb::ValueType { r#type: 1, unit: 2 }],
        period_type: Some(pb::ValueType { r#type: 1, unit: 2 }),
        period: 1,
        mapping: vec![pb::Mapping {
            id: 1,
            filename: 3,
            build_id: 4,
            ..Default::default()
        }],
        time_nanos: t,
        ..Default::default()
    };
    for (i, &a) in addrs.iter().enumerate() {
        p.location.push(pb::Location {
            id: i as u64 + 1,
            mapping_id: 1,
            address: a,
            ..Default::default()
        });
        p.sample.push(pb::Sample {
            location_id: vec![i as u64 + 1],
            value: vec![i as i64 + 1],
            label: vec![],
        });
    }
    let bytes = prost::Message::encode_to_vec(&p);
    let decoded = kiln_otel::pprof::decode(&bytes, 1 << 20).unwrap();
    let meta = IngestMeta {
        labels: Labels::from_pairs([("service_name", "native"), ("__name__", "process_cpu")]),
        time_nanos: t,
        duration_nanos: 10_000_000_000,
        ..Default::default()
    };
    normalize_pprof(&decoded, &meta, &NormalizeLimits::default()).unwrap()
}

async fn stacks(s: &Storage, tenant: &str) -> BTreeMap<Vec<String>, i64> {
    s.query()
        .merge_tree(&filter(
            tenant,
            "{}",
            T0 - 3_600_000_000_000,
            T0 + 3_600_000_000_000,
        ))
        .await
        .unwrap()
        .stacks()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_are_named_at_read_time_and_kept_by_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let built = testing::build(Program::C, dir.path()).unwrap();
    let id = identify_file(&built.debug).unwrap().gnu_build_id.unwrap();
    let addrs = testing::addresses_in(&built.full, &built.functions, 6);
    let oracle = testing::addr2line(&built.debug, &addrs).unwrap();
    let mut named = BTreeMap::new();
    let mut unnamed = BTreeMap::new();
    for (i, (frames, a)) in oracle.iter().zip(&addrs).enumerate() {
        let stack: Vec<String> = frames.iter().rev().map(|f| f.function.clone()).collect();
        *named.entry(stack).or_insert(0) += i as i64 + 1;
        *unnamed.entry(vec![format!("c 0x{a:x}")]).or_insert(0) += i as i64 + 1;
    }

    let storage = Storage::open(config(&dir.path().join("data")))
        .await
        .unwrap();
    let symbolizer = Symbolizer::new(
        storage.store().clone(),
        SymbolizerConfig {
            cache_dir: dir.path().join("cache"),
            cache_bytes: 1 << 30,
            open_bytes: 1 << 30,
            resolved_bytes: 64 << 20,
            max_inflated_bytes: 512 << 20,
            debuginfod: DebuginfodConfig {
                urls: vec![],
                timeout: Duration::from_secs(5),
                concurrency: 1,
                tenant_concurrency: 1,
                missing_ttl: Duration::from_secs(60),
                retry_after: Duration::from_secs(1),
                max_file_bytes: 1 << 30,
                max_stored_bytes: 0,
                attempts: 1,
                scratch_dir: dir.path().join("scratch"),
            },
        },
        Arc::new(Metrics::default()),
    )
    .unwrap();
    storage.set_frame_namer(Arc::new(symbolizer.clone()), Duration::from_secs(5));
    // Four flushes of each tenant: four segments, which compaction merges.
    for i in 0..4 {
        for tenant in ["t", "u"] {
            storage
                .write(tenant, profile(&id, &addrs, T0 + i * 1_000_000_000))
                .await
                .unwrap();
        }
        storage.flush().await;
    }
    let times4 = |m: &BTreeMap<Vec<String>, i64>| -> BTreeMap<Vec<String>, i64> {
        m.iter().map(|(k, v)| (k.clone(), v * 4)).collect()
    };
    assert_eq!(stacks(&storage, "t").await, times4(&unnamed));

    // The debug file arrives after the profiles: they are named at the next read.
    let limits = UploadLimits {
        max_file_bytes: 1 << 30,
        max_tenant_bytes: 1 << 30,
        max_inflated_bytes: 512 << 20,
    };
    symbolizer
        .store()
        .add("t", "c.debug", &built.debug, &[], limits)
        .await
        .unwrap();
    symbolizer.changed("t");
    assert_eq!(stacks(&storage, "t").await, times4(&named));
    assert_eq!(
        stacks(&storage, "u").await,
        times4(&unnamed),
        "another tenant's file"
    );

    // Compacted while the file is there, then the file deleted: the names stay.
    let report = storage.upkeep(false).await.unwrap();
    assert!(report.jobs_done > 0, "{report:?}");
    let gone = symbolizer.store().delete("t", &id).await.unwrap().unwrap();
    symbolizer.forget("t", &gone).await;
    assert_eq!(stacks(&storage, "t").await, times4(&named));
    assert_eq!(stacks(&storage, "u").await, times4(&unnamed));
}
