//! Profile ids (block format 3): every ingested profile of a series gets an id, exemplars name
//! it, a filter by ids selects exactly those profiles' samples, before and after compaction,
//! and version 2 blocks (without the column) stay readable.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::RecordBatch;
use bytes::Bytes;
use kiln_storage::Storage;
use kiln_storage::format::block::{
    DatasetBuilder, assemble_object, col, samples_schema, writer_properties,
};
use kiln_storage::format::meta::PARTITION_NANOS;
use kiln_storage::query::{Aggregation, Exemplars, SampleFilter};
use kiln_storage::testing::{config, filter, frames, now_ms, profile};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

const T0: i64 = 1_700_000_000_000_000_000 - 1_700_000_000_000_000_000 % PARTITION_NANOS;
const SEC: i64 = 1_000_000_000;

type Stacks = BTreeMap<Vec<String>, i64>;

fn window(tenant: &str) -> SampleFilter {
    filter(tenant, "{}", T0 - PARTITION_NANOS, T0 + 2 * PARTITION_NANOS)
}

fn with_ids(tenant: &str, ids: &[[u8; 16]]) -> SampleFilter {
    SampleFilter {
        profile_ids: ids.to_vec(),
        ..window(tenant)
    }
}

async fn stacks(s: &Storage, f: &SampleFilter) -> Stacks {
    s.query().merge_tree(f).await.unwrap().stacks()
}

/// The profiles of tenant `a`: (time, stacks). Two share a timestamp (written apart, so they are
/// two profiles of one series at one time). Each has a few more stacks, so compaction keeps a
/// profile totals rollup (it must halve the rows).
fn profiles() -> Vec<(i64, Vec<(Vec<String>, i64)>)> {
    let pad = |mut stacks: Vec<(Vec<String>, i64)>| {
        stacks.extend((0..4).map(|k| (frames(&format!("main;pad{k}")), 1)));
        stacks
    };
    vec![
        (T0, pad(vec![(frames("main;a"), 10), (frames("main;b"), 5)])),
        (T0 + 10 * SEC, pad(vec![(frames("main;a"), 7)])),
        (T0 + 10 * SEC, pad(vec![(frames("main;c"), 30)])),
        (T0 + 20 * SEC, pad(vec![(frames("main;b;d"), 3)])),
    ]
}

/// The profile exemplars of a 1 s step series, with their values and times (ns).
async fn exemplars(s: &Storage, tenant: &str) -> Vec<([u8; 16], i64, i64, Vec<(String, String)>)> {
    let series = s
        .query()
        .select_series(
            &window(tenant),
            &[],
            SEC,
            Aggregation::Sum,
            None,
            Exemplars::Profiles,
        )
        .await
        .unwrap();
    series
        .into_iter()
        .flat_map(|s| s.exemplars.into_iter().flatten())
        .map(|e| {
            (
                e.profile_id.expect("a profile exemplar has an id"),
                e.value,
                e.timestamp_ms * 1_000_000,
                e.labels,
            )
        })
        .collect()
}

/// Checks every ingested profile has its own id and selecting it gives exactly its stacks.
async fn check_ids(s: &Storage) {
    let found = exemplars(s, "a").await;
    assert_eq!(
        found.len(),
        profiles().len(),
        "one exemplar per profile: {found:?}"
    );
    let ids: std::collections::HashSet<[u8; 16]> = found.iter().map(|e| e.0).collect();
    assert_eq!(ids.len(), found.len(), "ids are distinct");
    for (time, want) in profiles() {
        let want: Stacks = want.into_iter().collect();
        let total: i64 = want.values().sum();
        // The exemplar of this profile: same time and total (the two at T0+10s differ).
        let (id, _, _, labels) = found
            .iter()
            .find(|e| e.2 == time && e.1 == total)
            .unwrap_or_else(|| panic!("no exemplar for the profile at {time}: {found:?}"));
        assert!(labels.contains(&("service_name".to_string(), "api".to_string())));
        assert_eq!(stacks(s, &with_ids("a", &[*id])).await, want);
        // Another tenant cannot read it by id.
        assert!(stacks(s, &with_ids("b", &[*id])).await.is_empty());
        // Its series point, from the same filter.
        let points = s
            .query()
            .select_series(
                &with_ids("a", &[*id]),
                &[],
                SEC,
                Aggregation::Sum,
                None,
                Exemplars::None,
            )
            .await
            .unwrap();
        let sum: f64 = points
            .iter()
            .flat_map(|p| p.points.iter().map(|x| x.1))
            .sum();
        assert_eq!(sum, total as f64);
    }
    // Two ids select both profiles; an unknown id nothing.
    let both = [found[0].0, found[1].0];
    let sum: i64 = stacks(s, &with_ids("a", &both)).await.values().sum();
    assert_eq!(sum, found[0].1 + found[1].1);
    assert!(stacks(s, &with_ids("a", &[[7; 16]])).await.is_empty());
    // Heatmap points are per profile: the two at one time stay two points.
    let groups = s
        .query()
        .profile_points(&window("a"), &[], false)
        .await
        .unwrap();
    let points: Vec<_> = groups.iter().flat_map(|g| g.points.iter()).collect();
    assert_eq!(points.len(), profiles().len());
    assert!(
        points
            .iter()
            .all(|p| p.profile_id.is_some_and(|id| ids.contains(&id)))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profile_ids_select_profiles_before_and_after_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(config(dir.path())).await.unwrap();
    for (time, stacks) in profiles() {
        s.write("a", profile("api", &stacks, time)).await.unwrap();
        s.write("b", profile("api", &stacks, time)).await.unwrap();
        s.flush().await;
    }
    check_ids(&s).await;
    let before = exemplars(&s, "a").await;
    assert!(s.compactor().compact_all(now_ms()).await.unwrap() > 0);
    check_ids(&s).await;
    // Compaction keeps the ids (and the profile totals rollup answers with them).
    let mut after = exemplars(&s, "a").await;
    let mut before = before;
    before.sort();
    after.sort();
    assert_eq!(before, after);
    // Average counts the two profiles at one time as two.
    let avg = s
        .query()
        .select_series(
            &window("a"),
            &[],
            60 * SEC,
            Aggregation::Average,
            None,
            Exemplars::None,
        )
        .await
        .unwrap();
    let totals: i64 = profiles()
        .iter()
        .flat_map(|p| p.1.iter().map(|s| s.1))
        .sum();
    assert_eq!(avg[0].points[0].1, totals as f64 / 4.0);
    // The profile totals rollup answered (not the samples).
    let blocks = s
        .metastore()
        .query_blocks(kiln_storage::metastore::BlockQuery {
            tenant: "a",
            start_nanos: i64::MIN,
            end_nanos: i64::MAX,
            service_name: None,
            profile_type: None,
        })
        .await
        .unwrap();
    assert!(
        blocks.iter().all(|b| b
            .rollups
            .iter()
            .any(|r| r.resolution_nanos == kiln_storage::format::meta::PROFILE_TOTALS)),
        "every compacted block keeps profile totals"
    );
    s.close().await;
}

/// A version 2 object: the dataset of `p` written without the `profile_id` column.
fn version_2_object(
    tenant: &str,
    p: &kiln_otel::model::NormalizedProfile,
) -> (Bytes, String, kiln_storage::format::meta::BlockMeta) {
    let mut builder = DatasetBuilder::new(tenant);
    builder.add(p);
    let mut built = builder.finish().unwrap();
    let reader = ParquetRecordBatchReaderBuilder::try_new(built.samples.clone())
        .unwrap()
        .build()
        .unwrap();
    let old_schema = Arc::new(arrow::datatypes::Schema::new(
        samples_schema().fields()[..col::PROFILE_ID].to_vec(),
    ));
    let mut out = Vec::new();
    let mut w = ArrowWriter::try_new(
        &mut out,
        old_schema.clone(),
        Some(
            writer_properties(
                1024,
                kiln_storage::format::block::Pages::Kept,
                kiln_storage::format::block::Blank::NONE,
            )
            .unwrap(),
        ),
    )
    .unwrap();
    for batch in reader {
        let batch = batch.unwrap();
        let cols = batch.columns()[..col::PROFILE_ID].to_vec();
        w.write(&RecordBatch::try_new(old_schema.clone(), cols).unwrap())
            .unwrap();
    }
    w.close().unwrap();
    built.samples = Bytes::from(out);
    built.meta.format_version = 2;
    let id = ulid::Ulid::from_parts(now_ms(), 1).to_string();
    let (object, metas) = assemble_object(&id, 0, 0, vec![built]);
    let meta = metas.into_iter().next().unwrap();
    (object, meta.path(), meta)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_2_blocks_stay_readable_and_compact() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(config(dir.path())).await.unwrap();
    let old = profile("api", &[(frames("main;old"), 4)], T0);
    let (object, path, meta) = version_2_object("a", &old);
    s.store().put_durable(&path, object).await.unwrap();
    s.metastore().add_blocks(vec![meta]).await.unwrap();
    // Three new profiles, each its own segment: four blocks, enough to compact.
    for i in 1..=3 {
        s.write(
            "a",
            profile("api", &[(frames(&format!("main;new{i}")), i)], T0 + i * SEC),
        )
        .await
        .unwrap();
        s.flush().await;
    }
    let want: Stacks = [
        (frames("main;old"), 4),
        (frames("main;new1"), 1),
        (frames("main;new2"), 2),
        (frames("main;new3"), 3),
    ]
    .into_iter()
    .collect();
    for round in ["before compaction", "after compaction"] {
        assert_eq!(stacks(&s, &window("a")).await, want, "{round}");
        assert!(stacks(&s, &window("b")).await.is_empty(), "{round}");
        // Only the new profiles have ids.
        let found = exemplars(&s, "a").await;
        assert_eq!(found.len(), 3, "{round}: {found:?}");
        for (id, value, _, _) in found {
            let only: Stacks = [(frames(&format!("main;new{value}")), value)]
                .into_iter()
                .collect();
            assert_eq!(stacks(&s, &with_ids("a", &[id])).await, only, "{round}");
        }
        if round == "before compaction" {
            assert!(s.compactor().compact_all(now_ms()).await.unwrap() > 0);
        }
    }
    s.close().await;
}
