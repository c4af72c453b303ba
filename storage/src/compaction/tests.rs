use crate::format::meta::TOP_LEVEL;
use crate::metastore::{Job, QueuedBlock};

use super::*;

const MIB: u64 = 1 << 20;

fn top(id: u32, partition: i64, bytes: u64) -> QueuedBlock {
    QueuedBlock {
        tenant: "t".into(),
        id: format!("{id:04}"),
        partition,
        shard: 0,
        level: TOP_LEVEL,
        created_ms: u64::from(id),
        bytes,
        rows: 1,
        stack_nodes: 1,
        arrived_ms: 0,
    }
}

/// [`plan_jobs`] judging arrivals from the queued blocks alone (as registered, or at their
/// ULID time where `arrived_ms` is 0).
fn plan(c: &CompactionConfig, queued: Vec<QueuedBlock>, now_ms: u64) -> Vec<Job> {
    let arrivals = Arrivals::of(&queued);
    plan_jobs(c, queued, &arrivals, now_ms)
}

fn sources(jobs: &[Job]) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = jobs.iter().map(|j| j.source_ids()).collect();
    out.sort();
    out
}

/// The default settings with four top-level blocks merged at once: the tier tests below
/// count in fours, whatever the default fanout.
fn tiers_of_four() -> CompactionConfig {
    let mut c = CompactionConfig::default();
    c.top.fanout = 4;
    c
}

#[test]
fn top_level_blocks_merge_by_size_tier() {
    let c = tiers_of_four();
    assert_eq!(
        (c.top.tier(0), c.top.tier(MIB - 1), c.top.tier(MIB)),
        (0, 0, 1)
    );
    assert_eq!((c.top.tier(4 * MIB - 1), c.top.tier(4 * MIB)), (1, 2));
    // Five small blocks and three of 2 MiB: four small ones merge; the fifth and the 2 MiB
    // ones wait for a fourth of their tier. A block at the target size is done.
    let mut queued: Vec<QueuedBlock> = (0..5).map(|i| top(i, 7, 100 << 10)).collect();
    queued.extend((10..13).map(|i| top(i, 7, 2 * MIB)));
    queued.push(top(20, 7, 300 * MIB));
    let jobs = plan(&c, queued.clone(), 0);
    assert_eq!(sources(&jobs), [vec!["0000", "0001", "0002", "0003"]]);
    assert!(jobs.iter().all(|j| j.level == TOP_LEVEL));
    queued.push(top(13, 7, 3 * MIB));
    let jobs = plan(&c, queued.clone(), 0);
    assert_eq!(
        sources(&jobs),
        [
            vec!["0000", "0001", "0002", "0003"],
            vec!["0010", "0011", "0012", "0013"]
        ]
    );
    // A block whose stack tree is near the cut is done too, whatever its size.
    let mut big_tree = top(30, 7, 100 << 10);
    big_tree.stack_nodes = c.max_output_stack_nodes as u64;
    let jobs = plan(&c, vec![big_tree, top(31, 7, 1), top(32, 7, 1)], 0);
    assert!(jobs.is_empty());
}

#[test]
fn by_default_eight_blocks_of_a_tier_merge() {
    let c = CompactionConfig::default();
    assert_eq!((c.top.tier(MIB - 1), c.top.tier(MIB)), (0, 1));
    assert_eq!((c.top.tier(8 * MIB - 1), c.top.tier(8 * MIB)), (1, 2));
    // Seven small blocks and seven of 2 MiB wait; an eighth small one makes a merge.
    let mut queued: Vec<QueuedBlock> = (0..7).map(|i| top(i, 7, 100 << 10)).collect();
    queued.extend((10..17).map(|i| top(i, 7, 2 * MIB)));
    assert!(plan(&c, queued.clone(), 0).is_empty());
    queued.push(top(7, 7, 100 << 10));
    let jobs = plan(&c, queued, 0);
    let small: Vec<String> = (0..8).map(|i| format!("{i:04}")).collect();
    assert_eq!(sources(&jobs), [small]);
}

#[test]
fn a_quiet_partition_packs_its_open_blocks_up_to_the_target() {
    let c = tiers_of_four();
    let created = 10 * 3_600_000;
    let queued: Vec<QueuedBlock> = [100, 100, 100, 10, 300]
        .into_iter()
        .enumerate()
        .map(|(id, mib)| QueuedBlock {
            created_ms: created + id as u64,
            ..top(id as u32, 1, mib * MIB)
        })
        .collect();
    // The newest came less than an hour ago: tiers only, and none has four.
    assert!(plan(&c, queued.clone(), created + 3_600_000).is_empty());
    let jobs = plan(&c, queued, created + 4 + 3_600_000);
    assert_eq!(sources(&jobs), [vec!["0003", "0000", "0001"]]);
}

#[test]
fn a_partition_that_still_gets_blocks_merges_them_by_tier() {
    let c = tiers_of_four();
    let now = 10 * 3_600_000;
    let arrived = |id: u32, bytes: u64, ago_ms: u64| QueuedBlock {
        created_ms: now - ago_ms,
        ..top(id, 1, bytes)
    };
    // A packed block and a newcomer that came a minute ago: not rewritten for it.
    let mut queued = vec![
        arrived(0, 40 * MIB, 3_600_000),
        arrived(1, 300 << 10, 60_000),
    ];
    assert!(plan(&c, queued.clone(), now).is_empty());
    // Four newcomers of one tier merge with each other, not with the packed block.
    queued.extend((2..5).map(|i| arrived(i, 300 << 10, 30_000)));
    let jobs = plan(&c, queued.clone(), now);
    assert_eq!(sources(&jobs), [vec!["0001", "0002", "0003", "0004"]]);
    // Once nothing has come for the policy's age, what is open is packed.
    let jobs = plan(&c, queued, now + 3_600_000);
    assert_eq!(
        sources(&jobs),
        [vec!["0001", "0002", "0003", "0004", "0000"]]
    );
}

#[test]
fn a_partition_whose_fresh_blocks_were_all_merged_up_is_not_quiet() {
    let c = tiers_of_four();
    let hour = 3_600_000;
    let now = 10 * hour;
    let block = |id: u32, level: u32, bytes: u64, created_ms: u64, arrived_ms: u64| QueuedBlock {
        level,
        created_ms,
        arrived_ms,
        ..top(id, 1, bytes)
    };
    // Two open top-level blocks, and a segment that has just come.
    let open = vec![
        block(0, TOP_LEVEL, 40 * MIB, now - 3 * hour, now - 3 * hour),
        block(1, TOP_LEVEL, 2 * MIB, now - 2 * hour, now - 2 * hour),
    ];
    let segment = block(2, 0, 1 << 10, now, now);
    let mut queued = open.clone();
    queued.push(segment.clone());
    assert!(plan(&c, queued, now).is_empty());
    // While a job holds the segment, the queue has the old blocks alone; the segment held
    // still counts as an arrival.
    let later = now + hour / 2;
    let held = Arrivals::of(open.iter().chain([&segment]));
    assert!(plan_jobs(&c, open.clone(), &held, later + hour / 4).is_empty());
    // Half an hour on, the segment's rows have gone up the levels into a top-level block
    // that carries its oldest source's time but was registered just now: the partition got
    // a block, and is not packed.
    let mut queued = open.clone();
    queued.push(block(3, TOP_LEVEL, 2 * MIB, now - 90 * 60_000, later));
    assert!(plan(&c, queued.clone(), later).is_empty());
    // Judged by the blocks' times alone (as before arrivals were registered), it would have
    // been.
    let by_time: Vec<QueuedBlock> = queued
        .iter()
        .map(|b| QueuedBlock {
            arrived_ms: 0,
            ..b.clone()
        })
        .collect();
    assert_eq!(plan(&c, by_time, later).len(), 1);
    // An hour after that block came, it is.
    let jobs = plan(&c, queued, later + hour);
    assert_eq!(sources(&jobs), [vec!["0001", "0003", "0000"]]);
}

#[test]
fn a_quiet_partition_packs_its_lone_blocks_below_the_top_too() {
    let c = CompactionConfig::default();
    let now = 10 * 3_600_000;
    let block = |id: u32, level: u32, bytes: u64, ago_ms: u64| QueuedBlock {
        level,
        created_ms: now - ago_ms,
        ..top(id, 1, bytes)
    };
    // A packed block, and one lone block of L1 and of L2 that no other of their level
    // will ever join.
    let mut queued = vec![
        block(0, TOP_LEVEL, 40 * MIB, 3_600_000),
        block(1, 1, 300 << 10, 3_700_000),
        block(2, 2, 2 * MIB, 3_650_000),
    ];
    let jobs = plan(&c, queued.clone(), now);
    assert_eq!(sources(&jobs), [vec!["0001", "0002", "0000"]]);
    assert!(jobs.iter().all(|j| j.level == TOP_LEVEL));
    // Not while the partition still gets blocks, of any level: L1's merge waits its own
    // age, and the top-level blocks are not packed either.
    queued.push(block(3, 0, 1 << 10, 60_000));
    let jobs = plan(&c, queued.clone(), now);
    assert_eq!(sources(&jobs), [vec!["0003"]]);
    assert_eq!(jobs[0].level, 0);
    // Another shard's or tenant's blocks are their own: this one's quiet blocks pack.
    let elsewhere = |b: &QueuedBlock| QueuedBlock {
        shard: 1,
        ..b.clone()
    };
    let mut two_shards = queued[..3].to_vec();
    two_shards.push(elsewhere(&queued[3]));
    let jobs = plan(&c, two_shards, now);
    assert_eq!(sources(&jobs), [vec!["0001", "0002", "0000"], vec!["0003"]]);
    // An L0 segment is left to its own level even when quiet.
    let jobs = plan(&c, vec![block(4, 0, 1 << 10, 3_700_000)], now);
    assert_eq!(jobs[0].level, 0);
}
