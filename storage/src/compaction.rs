//! Compaction: L0 segments are split per tenant and merged, then levels are merged by count and
//! age, so a tenant's data ends up in a few blocks per partition and shard.
//!
//! ```text
//!  planner: queued blocks (metastore) grouped by (tenant, partition, shard, level)
//!           → a job per `blocks` of them, or for what is left once the oldest is `age` old;
//!           top-level blocks merge by size tier, and a quiet partition's blocks below the
//!           target (L1 and up) are packed together
//!  worker:  lease a job → k-way merge of the sources' sorted rows → output block(s) one level
//!           up → metastore.complete_job (sources out, tombstoned; outputs in; one transaction)
//! ```
//!
//! A compacting process runs two lanes side by side, each leasing the lowest level's oldest job
//! of its levels: the fresh lane ([`FRESH_LEVELS`]) merges L0 segments and L1 blocks, small
//! merges every few seconds that hold the last minutes a dashboard reads; the bulk lane
//! ([`BULK_LEVELS`]) merges L2 and top-level blocks, which can take minutes. With one lane, a
//! top-level merge held every new segment back until it finished (over the `month` bench, 2.6×
//! the rows waiting in L0 segments), and a query of the last minutes read each of them.
//!
//! The merge streams: each source is read in batches of [`CompactionConfig::batch_rows`] rows in
//! its sort order (series, timestamp, …); series are mapped to the output's series order, which
//! is the same total order, so every source stays sorted and a heap on (series, timestamp)
//! merges them. Rows of one (series, timestamp) are re-sorted after their stacks are remapped.
//! Symbols are merged into one table per output block: each source's locations are interned
//! once, and each source stack node is mapped to an output node once (a memo array), walking the
//! output's stack trie. The output is written to a local file, then uploaded in parts.
//!
//! Memory bound (stated, and measured by the high-cardinality test): rows take at most
//! `sources × batch_rows` decoded rows plus one Parquet row group being encoded; symbols take
//! the sources' decoded tables plus the output's table, and the output is cut into another block
//! once its stack tree passes [`CompactionConfig::max_output_stack_nodes`]. Nothing grows with
//! the number of rows. Each lane runs one merge at a time, so a process holds at most two.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kiln_otel::model::Labels;

use crate::caches::Caches;
use crate::format::meta::{BlockMeta, SeriesMeta};
use crate::metastore::Metastore;
use crate::store::ObjectStorage;

/// Series in a compaction output from which its series index is built by the compactor (with
/// `warm`), before any query asks: below it the first query builds it in a few milliseconds.
const WARM_INDEX_SERIES: usize = 10_000;

pub use crate::format::tiers::{ALL_LEVELS, BULK_LEVELS, FRESH_LEVELS};

mod compactor;
mod merge;
mod plan;
mod policy;

#[cfg(test)]
mod tests;

pub use plan::{Arrivals, plan_jobs};
pub use policy::{CompactionConfig, LevelPolicy, TopPolicy};

/// How long a compaction waits for native frames to be named (a debuginfod fetch); what is not
/// named by then stays as it was, and is named at query time later.
const NAMING_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// Plans and runs compaction jobs through the metastore's queue and leases.
#[derive(Debug)]
pub struct Compactor {
    config: CompactionConfig,
    store: ObjectStorage,
    metastore: Arc<dyn Metastore>,
    caches: Caches,
    scratch: PathBuf,
    delete_delay: Duration,
    /// Whether the outputs' symbols go into `query`'s cache as they are registered (this
    /// process answers queries).
    warm: bool,
    /// This compactor's name in leases.
    owner: String,
    /// Evaluates the recording rules on level-0 jobs, in a cluster ([`JobRecorder`]).
    recorder: std::sync::OnceLock<Arc<dyn JobRecorder>>,
}

/// Evaluates a tenant's recording rules on the outputs of a level-0 job, before they are
/// registered: the sums are committed with the job ([`Metastore::complete_job_recorded`]), so
/// each L0 segment's profiles are counted once, whichever process wrote them (ADR 0021).
#[async_trait::async_trait]
pub trait JobRecorder: Send + Sync + std::fmt::Debug {
    /// The sums of `outputs` (objects already in the store, not yet in the metastore).
    async fn sums(
        &self,
        tenant: &str,
        outputs: &[Arc<BlockMeta>],
    ) -> crate::Result<Vec<crate::metastore::RecordedSum>>;
}

/// The cluster-wide lease whose holder plans compaction jobs ([`Compactor::plan`]).
pub const PLANNER_LEASE: &str = "planner";

/// Labels of a series as a `Labels` set (for tests comparing series).
pub fn series_labels(s: &SeriesMeta) -> Labels {
    Labels::from_pairs(s.labels.to_vec())
}
