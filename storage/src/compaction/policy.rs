//! When blocks are merged: the level policies, the top level's size tiers and packing, and the
//! compactor's settings.

use crate::format::meta::TOP_LEVEL;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// When blocks of one level are merged into the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LevelPolicy {
    /// Merge as soon as this many blocks wait (and at most this many at once).
    pub blocks: usize,
    /// Merge what waits once the oldest block is this old.
    pub age: Duration,
}

/// How blocks of the top level are merged with each other: by size, so the number of blocks
/// follows the volume of data rather than the number of flushes.
///
/// A top-level block below `target_bytes` (and with a stack tree below half of
/// [`CompactionConfig::max_output_stack_nodes`], so a merge cannot just cut it again) is
/// *open*. Open blocks fall in size tiers (`tier_bytes`, then × `fanout` each tier up); as soon
/// as `fanout` of them share a tier they are merged, as a size-tiered LSM does, so each row is
/// rewritten about log_fanout(target / first size) times. Once no block of any level has come
/// to the (tenant, partition, shard) for `age` (as the planner saw them come: [`BlockArrivals`]),
/// its open blocks are packed together up to
/// `target_bytes`, and with them any block still waiting below the top (other than an L0
/// segment), which no other block of its level would ever join. While blocks keep coming (a
/// tenant sending, or the last merges of the levels) they merge by tier: packing each into the
/// partition's packed block as it came would rewrite that block once per newcomer.
///
/// Partitions are of ingestion time, so once its six hours are over a partition only gets its
/// levels' merges, and an hour later it is packed. A tenant that pauses for `age` within the
/// six hours has what it sent so far packed too; what it sends next is packed with it at the
/// next pause.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopPolicy {
    /// Open blocks of one tier merged at once.
    pub fanout: usize,
    /// Size of the first tier's upper bound.
    pub tier_bytes: u64,
    /// A top-level block this large is done.
    pub target_bytes: u64,
    /// How long after its newest block a partition's open blocks are packed.
    pub age: Duration,
}

impl Default for TopPolicy {
    /// Eight of a tier at a time: on `kiln bench`'s `small` preset a row is written 4.7 times
    /// by compaction against 5.5–6.1 with four, for the same blocks once a partition is packed;
    /// an open partition holds up to seven blocks per tier meanwhile (docs/performance.md,
    /// "Top-level fan-out").
    fn default() -> Self {
        Self {
            fanout: 8,
            tier_bytes: 1 << 20,
            target_bytes: 256 << 20,
            age: Duration::from_secs(3600),
        }
    }
}

impl TopPolicy {
    /// Whether the newest block came `age` ago: what is below the target is packed.
    pub(super) fn quiet(&self, newest_ms: u64, now_ms: u64) -> bool {
        now_ms >= newest_ms.saturating_add(self.age.as_millis() as u64)
    }

    /// The size tier of an open block.
    pub(super) fn tier(&self, bytes: u64) -> u32 {
        let (mut tier, mut bound) = (0, self.tier_bytes.max(1));
        while bytes >= bound {
            tier += 1;
            bound = bound.saturating_mul(self.fanout as u64);
        }
        tier
    }
}

/// Compaction settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactionConfig {
    pub enabled: bool,
    /// Policies of levels 0 .. [`TOP_LEVEL`] - 1.
    pub levels: Vec<LevelPolicy>,
    /// How top-level blocks merge with each other.
    pub top: TopPolicy,
    /// Rollups written with each output, finest first (ADR 0007): bucket widths in
    /// nanoseconds, [`crate::format::meta::PROFILE_TOTALS`] for profile totals.
    pub rollups: Vec<i64>,
    /// How long a leased job is a compactor's alone.
    pub lease: Duration,
    /// Rows decoded at once per source.
    pub batch_rows: usize,
    /// Rows per Parquet row group of an output block.
    pub row_group_rows: usize,
    /// An output block is closed, and another started, once its stack tree has this many nodes.
    pub max_output_stack_nodes: usize,
    /// Jobs one upkeep round runs at most.
    pub jobs_per_round: usize,
}

impl Default for CompactionConfig {
    fn default() -> Self {
        let p = |blocks, secs| LevelPolicy {
            blocks,
            age: Duration::from_secs(secs),
        };
        Self {
            enabled: true,
            levels: vec![p(20, 30), p(10, 12 * 60), p(10, 3 * 3600)],
            top: TopPolicy::default(),
            rollups: crate::format::rollup::DEFAULT_RESOLUTIONS.to_vec(),
            lease: Duration::from_secs(60),
            batch_rows: 8192,
            row_group_rows: 128 * 1024,
            max_output_stack_nodes: 4 << 20,
            jobs_per_round: 16,
        }
    }
}

impl CompactionConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<()> {
        if self.levels.len() != TOP_LEVEL as usize {
            return Err(Error::Config(format!(
                "compaction needs a policy for each of levels 0..{TOP_LEVEL}"
            )));
        }
        if self.levels.iter().any(|l| l.blocks < 2) {
            return Err(Error::Config(
                "a compaction level must merge at least 2 blocks".into(),
            ));
        }
        if self.rollups.windows(2).any(|w| w[0] >= w[1]) || self.rollups.iter().any(|&r| r < 0) {
            return Err(Error::Config(
                "rollup resolutions must be increasing and not negative".into(),
            ));
        }
        if self.top.fanout < 2 {
            return Err(Error::Config(
                "top-level blocks must merge at least 2 at once".into(),
            ));
        }
        if self.batch_rows == 0 || self.row_group_rows == 0 || self.max_output_stack_nodes == 0 {
            return Err(Error::Config("compaction sizes must be positive".into()));
        }
        Ok(())
    }
}
