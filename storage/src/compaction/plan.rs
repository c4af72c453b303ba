//! Planning: the queued blocks of each (tenant, partition, shard) grouped into jobs by the
//! policies, judging quietness from when the metastore registered them.

use crate::format::meta::TOP_LEVEL;
use crate::metastore::{Job, QueuedBlock};
use std::collections::HashMap;

use super::*;

/// The last arrival in each (tenant, partition, shard), by a hash of the three: what decides
/// that a partition is quiet ([`TopPolicy`]).
///
/// A block's ULID time does not say when it came: a merge's output carries its oldest source's
/// time (so that it stays in its partition). Judged by those times, a partition whose fresh
/// blocks had all just been merged up looked quiet while its tenant was sending, and its open
/// blocks were packed again and again: on the `month` bench with 1 s segments, 8.09 rows
/// written a row by the top level's merges against 2.65 (docs/performance.md, "Quiet
/// partitions"). So the metastore records when each block was registered, and the planner
/// reads it for the blocks queued and those that jobs hold: every planner, restarted or not,
/// on any process, judges the same (ADR 0020).
#[derive(Debug, Default)]
pub struct Arrivals(HashMap<u64, u64>);

impl Arrivals {
    /// The last arrivals among `blocks` (queued, or held by jobs).
    pub fn of<'a>(blocks: impl IntoIterator<Item = &'a QueuedBlock>) -> Self {
        let mut last: HashMap<u64, u64> = HashMap::new();
        for b in blocks {
            let at = last.entry(group_of(b)).or_default();
            *at = (*at).max(b.arrived_ms());
        }
        Self(last)
    }

    /// When the last block came to `b`'s (tenant, partition, shard).
    fn last(&self, b: &QueuedBlock) -> u64 {
        self.0
            .get(&group_of(b))
            .copied()
            .unwrap_or(b.arrived_ms())
            .max(b.arrived_ms())
    }
}

/// A hash of byte strings, each ended by a 0 byte.
fn hash_of(parts: &[&[u8]]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for part in parts {
        h.update(part);
        h.update(&[0]);
    }
    h.digest()
}

/// A hash of a block's (tenant, partition, shard).
fn group_of(b: &QueuedBlock) -> u64 {
    hash_of(&[
        b.tenant.as_bytes(),
        &b.partition.to_le_bytes(),
        &b.shard.to_le_bytes(),
    ])
}

/// Groups of queued blocks that should be merged now, per the policies; `arrivals` holds when
/// blocks last came to each partition (queued ones and those jobs hold).
///
/// A (tenant, partition, shard) that is quiet (see [`TopPolicy`]) hands the blocks still
/// waiting below the top, other than L0 segments, to the top level's packing: a lone L1 or L2
/// block would otherwise never meet another of its level and stay there, larger per row, for
/// good.
pub fn plan_jobs(
    config: &CompactionConfig,
    queued: Vec<QueuedBlock>,
    arrivals: &Arrivals,
    now_ms: u64,
) -> Vec<Job> {
    let quiet: Vec<bool> = queued
        .iter()
        .map(|b| config.top.quiet(arrivals.last(b), now_ms))
        .collect();
    // Per group: whether its (tenant, partition, shard) is quiet, and its blocks.
    let mut groups: HashMap<(String, i64, u32, u32), (bool, Vec<QueuedBlock>)> = HashMap::new();
    for (b, quiet) in queued.into_iter().zip(quiet) {
        let mut level = b.level.min(TOP_LEVEL);
        if level > 0 && quiet {
            level = TOP_LEVEL;
        }
        let group = groups
            .entry((b.tenant.clone(), b.partition, b.shard, level))
            .or_default();
        group.0 = quiet;
        group.1.push(b);
    }
    let mut jobs = Vec::new();
    let mut keys: Vec<_> = groups.keys().cloned().collect();
    keys.sort();
    for key in keys {
        let (quiet, mut blocks) = groups.remove(&key).expect("key from the map");
        let (tenant, partition, shard, level) = key;
        blocks.sort_by(|a, b| (a.created_ms, &a.id).cmp(&(b.created_ms, &b.id)));
        let job = |sources: Vec<QueuedBlock>| Job {
            id: 0,
            tenant: tenant.clone(),
            partition,
            shard,
            level,
            sources,
            owner: String::new(),
            lease_expires_ms: 0,
            attempts: 0,
        };
        if level == TOP_LEVEL {
            jobs.extend(plan_top(config, blocks, quiet).into_iter().map(job));
            continue;
        }
        let policy = config.levels[level as usize];
        while blocks.len() >= policy.blocks {
            let rest = blocks.split_off(policy.blocks);
            jobs.push(job(std::mem::replace(&mut blocks, rest)));
        }
        let Some(oldest) = blocks.first() else {
            continue;
        };
        let old = now_ms.saturating_sub(oldest.created_ms) >= policy.age.as_millis() as u64;
        // An L0 segment is split per tenant even alone: the segment is freed sooner.
        if old && (blocks.len() >= 2 || level == 0) {
            jobs.push(job(blocks));
        }
    }
    jobs
}

/// Source lists of merges among the top-level blocks of one (tenant, partition, shard), oldest
/// first (see [`TopPolicy`]); `quiet` when no block of any level has come to it for the top
/// level's age.
fn plan_top(
    config: &CompactionConfig,
    blocks: Vec<QueuedBlock>,
    quiet: bool,
) -> Vec<Vec<QueuedBlock>> {
    let top = &config.top;
    let open: Vec<QueuedBlock> = blocks
        .into_iter()
        .filter(|b| {
            b.bytes < top.target_bytes && b.stack_nodes < (config.max_output_stack_nodes / 2) as u64
        })
        .collect();
    let mut out = Vec::new();
    if quiet {
        // Pack what is left, smallest first, each merge up to the target size.
        let mut open = open;
        open.sort_by_key(|b| b.bytes);
        let mut current: Vec<QueuedBlock> = Vec::new();
        let mut bytes = 0;
        for b in open {
            if !current.is_empty() && bytes + b.bytes > top.target_bytes {
                if current.len() >= 2 {
                    out.push(std::mem::take(&mut current));
                }
                current.clear();
                bytes = 0;
            }
            bytes += b.bytes;
            current.push(b);
        }
        if current.len() >= 2 {
            out.push(current);
        }
        return out;
    }
    let mut tiers: HashMap<u32, Vec<QueuedBlock>> = HashMap::new();
    for b in open {
        tiers.entry(top.tier(b.bytes)).or_default().push(b);
    }
    let mut tiers: Vec<_> = tiers.into_iter().collect();
    tiers.sort_by_key(|(t, _)| *t);
    for (_, mut blocks) in tiers {
        while blocks.len() >= top.fanout {
            let rest = blocks.split_off(top.fanout);
            out.push(std::mem::replace(&mut blocks, rest));
        }
    }
    out
}
