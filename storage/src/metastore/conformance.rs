//! The metastore contract as tests any backend runs (Quickwit's `metastore_test_suite!` is the
//! model): each check is an `async fn` over `&dyn Metastore`, and [`metastore_conformance_suite!`]
//! stamps one `#[tokio::test]` per check onto a backend, given an expression that opens a fresh,
//! empty metastore (and whatever guard keeps it alive).
//!
//! ```ignore
//! kiln_storage::metastore_conformance_suite!({
//!     let dir = tempfile::tempdir().unwrap();
//!     let m = Embedded::open(&dir.path().join("m.redb")).unwrap();
//!     (m, dir)
//! });
//! ```

use std::collections::BTreeSet;

use super::{BlockMeta, BlockQuery, Job, Metastore, PARTITION_NANOS, QueuedBlock};
use crate::Error;
use crate::format::meta::{BLOCK_FORMAT_VERSION, Section, SeriesMeta};
use crate::format::series_labels::SeriesLabels;
use crate::format::tiers::{ALL_LEVELS, BULK_LEVELS, FRESH_LEVELS};

/// Stamps the conformance tests onto a backend.
#[macro_export]
macro_rules! metastore_conformance_suite {
    ($open:expr) => {
        $crate::metastore_conformance_suite!(@tests $open;
            lookups_follow_partitions_tenants_and_filters,
            batches_are_atomic_and_duplicates_refused,
            shared_segments_are_tombstoned_with_their_last_entry,
            jobs_are_leased_completed_and_never_readded,
            jobs_are_leased_by_lane_lowest_level_first,
            job_leases_are_renewed_and_fenced_by_epoch,
            cancelled_jobs_return_their_sources,
            top_level_blocks_are_queued_and_merge_among_themselves,
            retention_and_tenant_deletion_leave_others_untouched,
            quarantine_takes_blocks_out_of_lookups,
            log_checkpoints_go_with_their_blocks,
            a_deleted_tenant_stays_deleted,
        );
    };
    (@tests $open:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let (metastore, _guard) = $open;
                $crate::metastore::conformance::$name(&metastore).await;
            }
        )*
    };
}

const T0: i64 = 1_700_000_000_000_000_000 - 1_700_000_000_000_000_000 % PARTITION_NANOS;
const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
const MEM: &str = "memory:alloc_space:bytes:space:bytes";

/// A block id (ULID) made at `ms`, distinct per `n`.
pub fn block_id(ms: u64, n: u128) -> String {
    ulid::Ulid::from_parts(ms, n).to_string()
}

/// A block id made at data time `t` (nanoseconds): its partition is `t`'s.
pub fn id_at(t: i64, n: u128) -> String {
    block_id((t / 1_000_000) as u64, n)
}

/// A test entry of `tenant` for object `id` with one series per (service, profile type).
pub fn entry(
    tenant: &str,
    id: &str,
    level: u32,
    shard: u32,
    min: i64,
    max: i64,
    series: &[(&str, &str)],
) -> BlockMeta {
    let series: Vec<SeriesMeta> = series
        .iter()
        .enumerate()
        .map(|(i, (service, pt))| SeriesMeta {
            labels: SeriesLabels::new([("__name__", "process_cpu"), ("service_name", *service)]),
            profile_type: (*pt).into(),
            min_time_nanos: min,
            max_time_nanos: max,
            first_row: i as u64 * 10,
            rows: 10,
        })
        .collect();
    BlockMeta {
        format_version: BLOCK_FORMAT_VERSION,
        id: id.into(),
        tenant: tenant.into(),
        shard,
        level,
        min_time_nanos: min,
        max_time_nanos: max,
        object_size: 1000,
        samples: Section {
            offset: 0,
            size: 600,
        },
        symbols: Section {
            offset: 600,
            size: 100,
        },
        rows: series.len() as u64 * 10,
        series,
        profiles: 1,
        stack_nodes: 5,
        compacted_from: vec![],
        rollups: vec![],
        index: Default::default(),
        logs: Vec::new(),
        received_ms: 0,
    }
}

fn ids(v: &[std::sync::Arc<BlockMeta>]) -> BTreeSet<String> {
    v.iter().map(|b| b.id.clone()).collect()
}

fn set(v: &[&String]) -> BTreeSet<String> {
    v.iter().map(|s| (*s).clone()).collect()
}

const HOUR: i64 = 3_600_000_000_000;

/// Lookups read the partitions of their range and filter by tenant, service and profile type.
pub async fn lookups_follow_partitions_tenants_and_filters(m: &dyn Metastore) {
    let (a, b, c, d) = (
        id_at(T0, 1),
        id_at(T0 + 7 * HOUR, 2),
        id_at(T0 + 30 * HOUR, 3),
        id_at(T0, 4),
    );
    m.add_blocks(vec![
        entry("acme", &a, 0, 0, T0, T0 + HOUR, &[("api", CPU)]),
        entry(
            "acme",
            &b,
            0,
            1,
            T0 + 7 * HOUR,
            T0 + 8 * HOUR,
            &[("db", MEM)],
        ),
        entry(
            "acme",
            &c,
            1,
            0,
            T0 + 30 * HOUR,
            T0 + 31 * HOUR,
            &[("api", CPU), ("db", CPU)],
        ),
        entry("globex", &d, 0, 0, T0, T0 + HOUR, &[("api", CPU)]),
    ])
    .await
    .unwrap();
    let q = |start, end| BlockQuery::new("acme", start, end);
    assert_eq!(
        ids(&m.query_blocks(BlockQuery::all("acme")).await.unwrap()),
        set(&[&a, &b, &c])
    );
    assert_eq!(
        ids(&m.query_blocks(q(T0, T0 + 2 * HOUR)).await.unwrap()),
        set(&[&a])
    );
    assert_eq!(
        ids(&m
            .query_blocks(q(T0 + HOUR + 1, T0 + 7 * HOUR))
            .await
            .unwrap()),
        set(&[])
    );
    assert_eq!(
        ids(&m
            .query_blocks(q(T0 + HOUR, T0 + 7 * HOUR + 1))
            .await
            .unwrap()),
        set(&[&a, &b])
    );
    let mut by_service = BlockQuery::all("acme");
    by_service.service_name = Some("db");
    assert_eq!(
        ids(&m.query_blocks(by_service).await.unwrap()),
        set(&[&b, &c])
    );
    by_service.profile_type = Some(CPU);
    assert_eq!(ids(&m.query_blocks(by_service).await.unwrap()), set(&[&c]));
    assert_eq!(
        ids(&m.query_blocks(BlockQuery::all("globex")).await.unwrap()),
        set(&[&d])
    );
    assert!(
        m.query_blocks(BlockQuery::all("nobody"))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(m.tenants().await.unwrap(), ["acme", "globex"]);
    let parts = m.partitions("acme").await.unwrap();
    assert_eq!(parts.len(), 3, "{parts:?}");
    assert_eq!(parts[0].blocks, 1);
    assert_eq!(parts[0].bytes, 700);
    assert!(parts.windows(2).all(|w| w[0].partition < w[1].partition));
    let got = m.get_blocks("acme", &[a.clone(), d.clone()]).await.unwrap();
    assert_eq!(
        ids(&got),
        set(&[&a]),
        "another tenant's block is not found by id"
    );
    assert_eq!(
        *got[0],
        entry("acme", &a, 0, 0, T0, T0 + HOUR, &[("api", CPU)])
    );
}

/// A batch is added whole or not at all; an entry cannot be added twice.
pub async fn batches_are_atomic_and_duplicates_refused(m: &dyn Metastore) {
    let (a, b) = (block_id(1, 1), block_id(1, 2));
    m.add_blocks(vec![entry("t", &a, 0, 0, T0, T0, &[("s", CPU)])])
        .await
        .unwrap();
    let err = m
        .add_blocks(vec![
            entry("t", &b, 0, 0, T0, T0, &[("s", CPU)]),
            entry("t", &a, 0, 0, T0, T0, &[("s", CPU)]),
        ])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::BlockExists { .. }), "{err}");
    assert_eq!(
        ids(&m.query_blocks(BlockQuery::all("t")).await.unwrap()),
        set(&[&a])
    );
    // The same object may hold another tenant's dataset.
    m.add_blocks(vec![entry("u", &a, 0, 0, T0, T0, &[("s", CPU)])])
        .await
        .unwrap();
    assert_eq!(m.queued_blocks().await.unwrap().len(), 2);
}

fn queued(m: &[QueuedBlock], tenant: &str) -> Vec<QueuedBlock> {
    m.iter().filter(|b| b.tenant == tenant).cloned().collect()
}

/// A job of `sources`, as a planner makes it.
pub fn job(tenant: &str, sources: Vec<QueuedBlock>) -> Job {
    Job {
        id: 0,
        tenant: tenant.into(),
        partition: sources[0].partition,
        shard: sources[0].shard,
        level: sources[0].level,
        sources,
        owner: String::new(),
        lease_expires_ms: 0,
        attempts: 0,
    }
}

/// An L0 segment shared by two tenants is tombstoned only when both entries are gone.
pub async fn shared_segments_are_tombstoned_with_their_last_entry(m: &dyn Metastore) {
    let seg = block_id(1, 1);
    m.add_blocks(vec![
        entry("a", &seg, 0, 0, T0, T0, &[("s", CPU)]),
        entry("b", &seg, 0, 0, T0, T0, &[("s", CPU)]),
    ])
    .await
    .unwrap();
    assert!(m.known_objects().await.unwrap().contains(&seg));
    let q = m.queued_blocks().await.unwrap();
    assert_eq!(
        m.add_jobs(vec![job("a", queued(&q, "a"))]).await.unwrap(),
        1
    );
    let leased = m
        .lease_job("w", 1000, 60_000, ALL_LEVELS)
        .await
        .unwrap()
        .unwrap();
    let out = block_id(2, 9);
    m.complete_job(
        &leased,
        "w",
        vec![entry("a", &out, 1, 0, T0, T0, &[("s", CPU)])],
        1000,
        5000,
    )
    .await
    .unwrap();
    assert!(
        m.due_tombstones(u64::MAX, 100).await.unwrap().is_empty(),
        "b still reads it"
    );
    let never = block_id(3, 3);
    let asked = [seg.clone(), out.clone(), never];
    assert_eq!(
        m.known_among(&asked).await.unwrap(),
        [seg.clone(), out.clone()].into_iter().collect(),
        "the segment and the output, not an id never added"
    );
    assert_eq!(
        ids(&m.query_blocks(BlockQuery::all("b")).await.unwrap()),
        set(&[&seg])
    );
    assert_eq!(
        ids(&m.query_blocks(BlockQuery::all("a")).await.unwrap()),
        set(&[&out])
    );
    let removed = m.delete_tenant("b", 2000, 0).await.unwrap();
    assert_eq!((removed.entries, removed.objects), (1, 1));
    let due = m.due_tombstones(2000, 100).await.unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].id, seg);
    assert_eq!(due[0].path, format!("segments/0/{seg}.kblk"));
    assert!(
        m.known_objects().await.unwrap().contains(&seg),
        "known until forgotten"
    );
    m.forget_tombstones(std::slice::from_ref(&seg))
        .await
        .unwrap();
    let known = m.known_objects().await.unwrap();
    assert!(!known.contains(&seg) && known.contains(&out));
    assert_eq!(
        m.known_among(&asked).await.unwrap(),
        [out.clone()].into_iter().collect(),
        "a forgotten tombstone's object is deleted"
    );
    assert!(m.known_among(&[]).await.unwrap().is_empty());
}

/// Jobs claim their sources, are leased to one owner at a time, and replace their sources in
/// one step; a compacted entry cannot come back.
pub async fn jobs_are_leased_completed_and_never_readded(m: &dyn Metastore) {
    let srcs: Vec<String> = (1..=3).map(|n| block_id(1, n)).collect();
    m.add_blocks(
        srcs.iter()
            .map(|id| entry("t", id, 0, 1, T0, T0 + HOUR, &[("s", CPU)]))
            .collect(),
    )
    .await
    .unwrap();
    let q = m.queued_blocks().await.unwrap();
    assert_eq!(q.len(), 3);
    assert_eq!(
        m.add_jobs(vec![job("t", q[..2].to_vec()), job("t", q[1..].to_vec())])
            .await
            .unwrap(),
        1,
        "the second job's source is claimed by the first"
    );
    assert_eq!(m.queued_blocks().await.unwrap().len(), 1);
    let leased = m
        .lease_job("w1", 1000, 10_000, ALL_LEVELS)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(leased.owner, "w1");
    assert_eq!(leased.sources.len(), 2);
    assert!(
        m.lease_job("w2", 5000, 10_000, ALL_LEVELS)
            .await
            .unwrap()
            .is_none(),
        "leased"
    );
    let taken = m
        .lease_job("w2", 11_001, 10_000, ALL_LEVELS)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (taken.id, taken.owner.as_str(), taken.attempts),
        (leased.id, "w2", 2)
    );
    let out = block_id(2, 7);
    let output = entry("t", &out, 1, 1, T0, T0 + HOUR, &[("s", CPU)]);
    let err = m
        .complete_job(&leased, "w1", vec![output.clone()], 12_000, 1000)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::LeaseLost { .. }), "{err}");
    m.complete_job(&taken, "w2", vec![output.clone()], 12_000, 1000)
        .await
        .unwrap();
    assert!(m.jobs().await.unwrap().is_empty());
    let all = m.query_blocks(BlockQuery::all("t")).await.unwrap();
    assert_eq!(ids(&all), set(&[&out, &srcs[2]]));
    assert_eq!(m.partitions("t").await.unwrap()[0].blocks, 2);
    assert!(
        m.due_tombstones(12_999, 10).await.unwrap().is_empty(),
        "not due yet"
    );
    let due: BTreeSet<String> = m
        .due_tombstones(13_000, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(due, set(&[&srcs[0], &srcs[1]]));
    let err = m
        .add_blocks(vec![entry(
            "t",
            &srcs[0],
            0,
            1,
            T0,
            T0 + HOUR,
            &[("s", CPU)],
        )])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::BlockExists { .. }), "compacted: {err}");
    let q = m.queued_blocks().await.unwrap();
    assert_eq!(q.iter().map(|b| b.level).collect::<Vec<_>>(), [0, 1]);
}

/// A lane leases only jobs of its levels, the lowest level first and the oldest of a level
/// first, whatever order the jobs were made in; a held job is nobody else's until its lease
/// expires.
pub async fn jobs_are_leased_by_lane_lowest_level_first(m: &dyn Metastore) {
    use crate::format::meta::TOP_LEVEL;
    // Made in this order: top, L2, L0, L1, L0 (two blocks each).
    let levels = [TOP_LEVEL, 2, 0, 1, 0];
    let mut blocks = Vec::new();
    for (j, &level) in levels.iter().enumerate() {
        for n in 0..2 {
            let id = block_id(1, (j * 2 + n) as u128 + 1);
            blocks.push(entry("t", &id, level, 0, T0, T0, &[("s", CPU)]));
        }
    }
    m.add_blocks(blocks).await.unwrap();
    let q = m.queued_blocks().await.unwrap();
    let mut made = Vec::new();
    for (j, &level) in levels.iter().enumerate() {
        let ids = [
            block_id(1, (j * 2) as u128 + 1),
            block_id(1, (j * 2) as u128 + 2),
        ];
        let sources: Vec<QueuedBlock> = q.iter().filter(|b| ids.contains(&b.id)).cloned().collect();
        assert_eq!(sources.len(), 2);
        assert!(sources.iter().all(|b| b.level == level));
        assert_eq!(m.add_jobs(vec![job("t", sources)]).await.unwrap(), 1);
        let all = m.jobs().await.unwrap();
        made.push(all.iter().map(|j| j.id).max().unwrap());
    }
    let lease = |owner: &'static str, levels: std::ops::Range<u32>| async move {
        m.lease_job(owner, 1000, 10_000, levels)
            .await
            .unwrap()
            .map(|j| (j.id, j.level))
    };
    // The fresh lane: both L0 jobs, the older first, then the L1 job, then nothing.
    assert_eq!(lease("fresh", FRESH_LEVELS).await, Some((made[2], 0)));
    assert_eq!(lease("fresh", FRESH_LEVELS).await, Some((made[4], 0)));
    assert_eq!(lease("fresh", FRESH_LEVELS).await, Some((made[3], 1)));
    assert_eq!(lease("fresh", FRESH_LEVELS).await, None);
    // The bulk lane: L2 before the older top-level job.
    assert_eq!(lease("bulk", BULK_LEVELS).await, Some((made[1], 2)));
    assert_eq!(lease("bulk", BULK_LEVELS).await, Some((made[0], TOP_LEVEL)));
    assert_eq!(lease("bulk", BULK_LEVELS).await, None);
    // Every job is held: nothing for anyone until the leases expire, then the lowest again.
    assert_eq!(lease("any", ALL_LEVELS).await, None);
    let again = m
        .lease_job("any", 11_000, 10_000, ALL_LEVELS)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((again.id, again.level, again.attempts), (made[2], 0, 2));
}

/// A held job's lease is renewed by its holder only; once it expired and was leased again,
/// even by the same owner, the older lease can neither renew nor complete (the epoch fences it).
/// Queued blocks say when they were registered.
pub async fn job_leases_are_renewed_and_fenced_by_epoch(m: &dyn Metastore) {
    let before = crate::clock::now_ms();
    let srcs: Vec<String> = (1..=2).map(|n| block_id(1, n)).collect();
    m.add_blocks(
        srcs.iter()
            .map(|id| entry("t", id, 0, 1, T0, T0 + HOUR, &[("s", CPU)]))
            .collect(),
    )
    .await
    .unwrap();
    let q = m.queued_blocks().await.unwrap();
    // The metastore's clock may be another machine's: allow it a minute either way.
    assert!(
        q.iter()
            .all(|b| b.arrived_ms + 60_000 >= before && b.arrived_ms <= before + 60_000),
        "arrivals {:?} against {before}",
        q.iter().map(|b| b.arrived_ms).collect::<Vec<_>>()
    );
    assert_eq!(m.add_jobs(vec![job("t", q)]).await.unwrap(), 1);
    let first = m
        .lease_job("w1", 1000, 10_000, ALL_LEVELS)
        .await
        .unwrap()
        .unwrap();
    assert!(m.renew_job(&first, "w1", 9000, 10_000).await.unwrap());
    assert!(
        !m.renew_job(&first, "w2", 9000, 10_000).await.unwrap(),
        "another owner renews nothing"
    );
    assert!(
        m.lease_job("w2", 12_000, 10_000, ALL_LEVELS)
            .await
            .unwrap()
            .is_none(),
        "renewed until 19,000"
    );
    // w1 stalls past its lease; it takes the job again under a new epoch.
    let second = m
        .lease_job("w1", 19_001, 10_000, ALL_LEVELS)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((second.id, second.attempts), (first.id, first.attempts + 1));
    assert!(
        !m.renew_job(&first, "w1", 19_002, 10_000).await.unwrap(),
        "the stale epoch renews nothing"
    );
    let output = entry("t", &block_id(2, 1), 1, 1, T0, T0 + HOUR, &[("s", CPU)]);
    let err = m
        .complete_job(&first, "w1", vec![output.clone()], 19_003, 1000)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::LeaseLost { .. }), "{err}");
    assert!(m.renew_job(&second, "w1", 19_004, 10_000).await.unwrap());
    m.complete_job(&second, "w1", vec![output], 19_005, 1000)
        .await
        .unwrap();
    assert!(m.jobs().await.unwrap().is_empty());
    assert!(!m.renew_job(&second, "w1", 19_006, 10_000).await.unwrap());
}

/// Top-level blocks wait in the queue too: they merge with each other (by size), and a job's
/// top-level output waits there in turn.
pub async fn top_level_blocks_are_queued_and_merge_among_themselves(m: &dyn Metastore) {
    use crate::format::meta::TOP_LEVEL;
    let (a, b) = (block_id(1, 1), block_id(1, 2));
    m.add_blocks(vec![
        entry("t", &a, TOP_LEVEL, 0, T0, T0, &[("s", CPU)]),
        entry("t", &b, TOP_LEVEL, 0, T0, T0 + HOUR, &[("s", CPU)]),
    ])
    .await
    .unwrap();
    let q = m.queued_blocks().await.unwrap();
    assert_eq!(q.len(), 2);
    assert!(q.iter().all(|b| b.level == TOP_LEVEL && b.bytes > 0));
    assert_eq!(m.add_jobs(vec![job("t", q)]).await.unwrap(), 1);
    assert!(m.queued_blocks().await.unwrap().is_empty());
    let leased = m
        .lease_job("w", 0, 1000, ALL_LEVELS)
        .await
        .unwrap()
        .unwrap();
    let out = block_id(1, 3);
    m.complete_job(
        &leased,
        "w",
        vec![entry("t", &out, TOP_LEVEL, 0, T0, T0 + HOUR, &[("s", CPU)])],
        10,
        0,
    )
    .await
    .unwrap();
    let q = m.queued_blocks().await.unwrap();
    assert_eq!(
        q.iter()
            .map(|b| (b.id.as_str(), b.level))
            .collect::<Vec<_>>(),
        [(out.as_str(), TOP_LEVEL)]
    );
    let ids: Vec<String> = m
        .query_blocks(BlockQuery::all("t"))
        .await
        .unwrap()
        .iter()
        .map(|b| b.id.clone())
        .collect();
    assert_eq!(ids, [out]);
}

/// A cancelled job gives its sources back to the queue.
pub async fn cancelled_jobs_return_their_sources(m: &dyn Metastore) {
    let (a, b) = (block_id(1, 1), block_id(1, 2));
    m.add_blocks(vec![
        entry("t", &a, 0, 0, T0, T0, &[("s", CPU)]),
        entry("t", &b, 0, 0, T0, T0, &[("s", CPU)]),
    ])
    .await
    .unwrap();
    let q = m.queued_blocks().await.unwrap();
    m.add_jobs(vec![job("t", q.clone())]).await.unwrap();
    assert!(m.queued_blocks().await.unwrap().is_empty());
    let leased = m
        .lease_job("w", 0, 1000, ALL_LEVELS)
        .await
        .unwrap()
        .unwrap();
    m.cancel_job(&leased).await.unwrap();
    assert!(m.jobs().await.unwrap().is_empty());
    assert_eq!(m.queued_blocks().await.unwrap().len(), 2);
    assert_eq!(
        m.add_jobs(vec![job("t", q)]).await.unwrap(),
        1,
        "claimable again"
    );
}

/// Retention drops whole partitions of one tenant; deleting a tenant removes everything of it.
pub async fn retention_and_tenant_deletion_leave_others_untouched(m: &dyn Metastore) {
    let day = 24 * HOUR;
    let ids_a: Vec<String> = (0..4).map(|n| id_at(T0 + n as i64 * day, n)).collect();
    let b_id = block_id(1, 10);
    m.add_blocks(
        ids_a
            .iter()
            .enumerate()
            .map(|(i, id)| {
                entry(
                    "a",
                    id,
                    1,
                    0,
                    T0 + i as i64 * day,
                    T0 + i as i64 * day + HOUR,
                    &[("s", CPU)],
                )
            })
            .chain([entry("b", &b_id, 1, 0, T0, T0 + HOUR, &[("s", CPU)])])
            .collect(),
    )
    .await
    .unwrap();
    let cut = crate::format::meta::partition_of(T0 + 2 * day);
    let removed = m.drop_partitions("a", cut, 0, 0).await.unwrap();
    assert_eq!((removed.entries, removed.objects), (2, 2));
    assert_eq!(
        ids(&m.query_blocks(BlockQuery::all("a")).await.unwrap()),
        set(&[&ids_a[2], &ids_a[3]])
    );
    assert_eq!(m.partitions("a").await.unwrap().len(), 2);
    assert_eq!(
        ids(&m.query_blocks(BlockQuery::all("b")).await.unwrap()),
        set(&[&b_id])
    );
    m.delete_tenant("a", 0, 0).await.unwrap();
    assert!(
        m.query_blocks(BlockQuery::all("a"))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(m.partitions("a").await.unwrap().is_empty());
    assert_eq!(m.tenants().await.unwrap(), ["b"]);
    assert_eq!(m.due_tombstones(0, 100).await.unwrap().len(), 4);
    m.shrink().await.unwrap();
    assert_eq!(
        ids(&m.query_blocks(BlockQuery::all("b")).await.unwrap()),
        set(&[&b_id])
    );
}

/// A quarantined block leaves lookups and the queue, is listed, and its object stays known.
pub async fn quarantine_takes_blocks_out_of_lookups(m: &dyn Metastore) {
    let (a, b) = (block_id(1, 1), block_id(1, 2));
    m.add_blocks(vec![
        entry("t", &a, 0, 0, T0, T0, &[("s", CPU)]),
        entry("t", &b, 0, 0, T0, T0, &[("s", CPU)]),
    ])
    .await
    .unwrap();
    assert!(
        m.quarantine("t", &a, "symbols checksum mismatch", 7)
            .await
            .unwrap()
    );
    assert!(!m.quarantine("t", &a, "again", 8).await.unwrap());
    assert!(!m.quarantine("other", &b, "not theirs", 8).await.unwrap());
    assert_eq!(
        ids(&m.query_blocks(BlockQuery::all("t")).await.unwrap()),
        set(&[&b])
    );
    assert_eq!(m.queued_blocks().await.unwrap().len(), 1);
    let q = m.quarantined(Some("t")).await.unwrap();
    assert_eq!(q.len(), 1);
    assert_eq!(
        (q[0].id.as_str(), q[0].reason.as_str(), q[0].at_ms),
        (a.as_str(), "symbols checksum mismatch", 7)
    );
    assert!(m.quarantined(Some("other")).await.unwrap().is_empty());
    assert!(m.known_objects().await.unwrap().contains(&a));
    m.delete_tenant("t", 0, 0).await.unwrap();
    assert!(m.quarantined(None).await.unwrap().is_empty());
}

/// A log's checkpoint is recorded with the blocks it names, in their transaction: refused with
/// them, never moved back, and one log's does not touch another's.
pub async fn log_checkpoints_go_with_their_blocks(m: &dyn Metastore) {
    use crate::metastore::LogCheckpoint;
    let at = |log: &str, seq| LogCheckpoint {
        log: log.into(),
        seq,
    };
    assert_eq!(m.log_checkpoint("a/0").await.unwrap(), 0);
    let (x, y) = (block_id(1, 1), block_id(1, 2));
    m.add_blocks_checkpointed(
        vec![entry("t", &x, 0, 0, T0, T0, &[("s", CPU)])],
        &at("a/0", 7),
    )
    .await
    .unwrap();
    assert_eq!(m.log_checkpoint("a/0").await.unwrap(), 7);
    assert_eq!(m.log_checkpoint("a/1").await.unwrap(), 0);
    // A batch refused (a duplicate) leaves the checkpoint where it was.
    let err = m
        .add_blocks_checkpointed(
            vec![
                entry("t", &y, 0, 0, T0, T0, &[("s", CPU)]),
                entry("t", &x, 0, 0, T0, T0, &[("s", CPU)]),
            ],
            &at("a/0", 9),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::BlockExists { .. }), "{err}");
    assert_eq!(m.log_checkpoint("a/0").await.unwrap(), 7);
    assert_eq!(
        ids(&m.query_blocks(BlockQuery::all("t")).await.unwrap()),
        set(&[&x])
    );
    // Records that held no samples move it with no blocks; it never moves back.
    m.add_blocks_checkpointed(Vec::new(), &at("a/0", 12))
        .await
        .unwrap();
    m.add_blocks_checkpointed(
        vec![entry("t", &y, 0, 0, T0, T0, &[("s", CPU)])],
        &at("a/0", 10),
    )
    .await
    .unwrap();
    assert_eq!(m.log_checkpoint("a/0").await.unwrap(), 12);
    m.add_blocks_checkpointed(Vec::new(), &at("a/1", 3))
        .await
        .unwrap();
    assert_eq!(m.log_checkpoint("a/1").await.unwrap(), 3);
    assert_eq!(m.log_checkpoint("a/0").await.unwrap(), 12);
}

/// A deletion refuses the tenant's entries registered after it whose writes were all received
/// by then (their newest write's time, else their object's), in a batch with other tenants'
/// and with a log checkpoint that still moves; later writes register as a new tenant's.
pub async fn a_deleted_tenant_stays_deleted(m: &dyn Metastore) {
    use crate::metastore::LogCheckpoint;
    const AT: u64 = 1_700_000_100_000;
    let received = |mut b: BlockMeta, ms: u64| {
        b.received_ms = ms;
        b
    };
    m.add_blocks(vec![entry(
        "t",
        &block_id(AT - 50, 1),
        0,
        0,
        T0,
        T0,
        &[("s", CPU)],
    )])
    .await
    .unwrap();
    m.delete_tenant("t", AT, 0).await.unwrap();
    // An older deletion does not move the mark back.
    m.delete_tenant("t", AT - 1_000, 0).await.unwrap();
    let (early, late, early_id, late_id, other) = (
        block_id(AT + 10, 2),
        block_id(AT + 10, 3),
        block_id(AT - 5, 4),
        block_id(AT + 5, 5),
        block_id(AT + 10, 6),
    );
    m.add_blocks_checkpointed(
        vec![
            // Built after the deletion from writes received before it (a replay, say).
            received(entry("t", &early, 0, 0, T0, T0, &[("s", CPU)]), AT),
            received(entry("t", &late, 0, 0, T0, T0, &[("s", CPU)]), AT + 1),
            // No time of receipt: the object's id stands for it.
            entry("t", &early_id, 0, 0, T0, T0, &[("s", CPU)]),
            entry("t", &late_id, 0, 0, T0, T0, &[("s", CPU)]),
            received(entry("u", &other, 0, 0, T0, T0, &[("s", CPU)]), AT - 100),
        ],
        &LogCheckpoint {
            log: "a/0".into(),
            seq: 4,
        },
    )
    .await
    .unwrap();
    assert_eq!(
        ids(&m.query_blocks(BlockQuery::all("t")).await.unwrap()),
        set(&[&late, &late_id])
    );
    let kept = m.query_blocks(BlockQuery::all("u")).await.unwrap();
    assert_eq!(ids(&kept), set(&[&other]), "another tenant's entry");
    assert_eq!(kept[0].received_ms, 0, "the time of receipt is not stored");
    assert_eq!(m.log_checkpoint("a/0").await.unwrap(), 4);
    // The refused objects are no one's: the orphan sweep may take them.
    let known = m.known_objects().await.unwrap();
    assert!(!known.contains(&early) && !known.contains(&early_id));
    assert!(known.contains(&late) && known.contains(&other));
}
