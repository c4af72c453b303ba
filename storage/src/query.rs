//! The query engine: metastore lookup (tenant, time range, service and profile type), series
//! selection on the blocks' metadata (label selectors are answered there), then Parquet reads of
//! exactly the selected series' row ranges, summed by stack id per block and merged across
//! blocks through each block's symbol table.
//!
//! A block that cannot be read (footer, Parquet or symbols fail their checks, or its object is
//! gone) is quarantined: taken out of the index, logged, counted, and the query answers from the
//! other blocks. A store that cannot be reached fails the query as unavailable instead.
//!
//! The stages, a file each (`query/<stage>.rs`), in the order a query runs them:
//!
//! ```text
//!  SampleFilter
//!   ─► plan     metastore.query_blocks → the blocks reached, the series selected in each
//!   ─► scan     the Parquet row ranges of those series, only the pages of the range's times
//!               (cache: symbols, Parquet metadata, stack totals of whole series)
//!   ─► stacks   summed by stack id per block, merged by frame name → FlameTree, pprof
//!    or series  summed per (series, time) cell → time series, exemplars, heatmap points
//! ```
//!
//! `report` holds what a query is asked and what it read. Output formats: [`tree`] (flame
//! graphs), [`pprof`], [`functions`] (function projections).

pub mod frame_filter;
pub mod functions;
mod plan;
pub mod pprof;
pub(crate) mod scan;
mod series;
pub(crate) mod stacks;
pub mod tree;

use std::sync::Arc;

use kiln_otel::model::LABEL_SERVICE_NAME;

use crate::metastore::{BlockMeta, BlockQuery, SeriesMeta};
use crate::selector::{MatchOp, Selector};

pub use crate::caches::report::{
    QueryCounters, QueryOptions, QueryReport, QueryStats, QueryStatsError, with_options,
    with_report,
};
pub use plan::{ProfileStats, QueryAnalysis};
pub use series::{
    Aggregation, Exemplar, Exemplars, MAX_EXEMPLARS_PER_POINT, PointGroup, ProfilePoint,
    SeriesPoints,
};
pub use stacks::StackValue;
pub use tree::FlameTree;

use crate::caches::Caches;
use stacks::ResultKey;

/// Synthetic label that holds a series' profile type id.
pub const PROFILE_TYPE_LABEL: &str = kiln_otel::model::LABEL_PROFILE_TYPE;

/// Blocks read at once by one query.
const SCAN_CONCURRENCY: usize = 4;

/// Which samples a query reads.
#[derive(Debug, Clone)]
pub struct SampleFilter {
    pub tenant: String,
    pub profile_type: String,
    pub selector: Selector,
    /// Inclusive start, Unix nanoseconds.
    pub start_nanos: i64,
    /// Exclusive end, Unix nanoseconds.
    pub end_nanos: i64,
    /// When not empty, only samples of these spans.
    pub span_ids: Vec<u64>,
    /// When not empty, only samples of these traces.
    pub trace_ids: Vec<[u8; 16]>,
    /// When not empty, only samples of these ingested profiles (their UUIDs' bytes).
    pub profile_ids: Vec<[u8; 16]>,
}

impl SampleFilter {
    /// The series of a block this filter selects: of its profile type, in its range, matched
    /// by its selector.
    fn select(&self, index: &crate::format::series_index::SeriesIndex) -> fixedbitset::FixedBitSet {
        let mut set = index.select(
            std::slice::from_ref(&self.selector),
            self.start_nanos,
            self.end_nanos,
        );
        if !set.is_clear() {
            set.intersect_with(&index.with_value(PROFILE_TYPE_LABEL, &self.profile_type));
        }
        set
    }

    /// The metastore lookup: an equality matcher on `service_name` narrows it.
    fn block_query(&self) -> BlockQuery<'_> {
        let service_name = self
            .selector
            .matchers
            .iter()
            .find(|m| m.name == LABEL_SERVICE_NAME && m.op == MatchOp::Equal && !m.value.is_empty())
            .map(|m| m.value.as_str());
        BlockQuery {
            tenant: &self.tenant,
            start_nanos: self.start_nanos,
            end_nanos: self.end_nanos,
            service_name,
            profile_type: Some(&self.profile_type),
        }
    }

    /// True when a span, trace or profile filter narrows the rows of a series (so neither
    /// rollups nor cached whole-series results answer).
    pub(crate) fn narrows_rows(&self) -> bool {
        !self.span_ids.is_empty() || !self.trace_ids.is_empty() || !self.profile_ids.is_empty()
    }

    /// Whether the row-level filters (time within the series, spans, traces, profiles) keep a
    /// row.
    fn keeps(
        &self,
        t: i64,
        span: Option<u64>,
        trace: Option<&[u8]>,
        profile: Option<&[u8]>,
    ) -> bool {
        if t < self.start_nanos || t >= self.end_nanos {
            return false;
        }
        if !self.profile_ids.is_empty()
            && !profile.is_some_and(|p| self.profile_ids.iter().any(|x| x.as_slice() == p))
        {
            return false;
        }
        if !self.span_ids.is_empty() && !span.is_some_and(|s| self.span_ids.contains(&s)) {
            return false;
        }
        if !self.trace_ids.is_empty()
            && !trace.is_some_and(|t| self.trace_ids.iter().any(|x| x.as_slice() == t))
        {
            return false;
        }
        true
    }
}

/// A series label, including the synthetic `__profile_type__`.
fn series_label<'a>(s: &'a SeriesMeta, name: &str) -> Option<&'a str> {
    if name == PROFILE_TYPE_LABEL {
        return Some(&s.profile_type);
    }
    s.label(name)
}

/// Reads blocks. Cheap to clone. Symbols are read with their native frames named when the
/// process gave the engine a [`crate::caches::names::FrameNamer`].
#[derive(Clone)]
pub struct QueryEngine {
    /// What the writer, the compactor and this engine share in the process.
    pub(crate) caches: Caches,
    /// Stack totals of whole series of a block (every sample of them), for queries whose range
    /// covers them: the inner blocks of a long range are summed once, not per query.
    pub(crate) results: moka::future::Cache<ResultKey, Arc<[StackValue]>>,
    /// When set, queries read these blocks only, not the metastore's ([`Self::over_blocks`]).
    only: Option<Arc<[Arc<BlockMeta>]>>,
}

impl std::fmt::Debug for QueryEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryEngine").finish_non_exhaustive()
    }
}

impl QueryEngine {
    /// A query engine over `caches`, with `results_bytes` for partial results (0: none kept).
    pub fn new(caches: Caches, results_bytes: u64) -> Self {
        let results = moka::future::Cache::builder()
            .weigher(|k: &ResultKey, v: &Arc<[StackValue]>| {
                let bytes = std::mem::size_of_val(&**v) + 4 * k.1.len() + 128;
                u32::try_from(bytes).unwrap_or(u32::MAX)
            })
            .max_capacity(results_bytes)
            .build();
        Self {
            caches,
            results,
            only: None,
        }
    }

    /// This engine reading `blocks` only, whether registered or not: a compaction's outputs
    /// before they are (recording rules, ADR 0021).
    pub fn over_blocks(&self, blocks: Vec<Arc<BlockMeta>>) -> Self {
        Self {
            caches: self.caches.clone(),
            results: self.results.clone(),
            only: Some(blocks.into()),
        }
    }

    /// What this engine shares with the writer and the compactor.
    pub fn caches(&self) -> &Caches {
        &self.caches
    }

    /// Counters of the read path.
    pub fn counters(&self) -> &QueryCounters {
        self.caches.counters()
    }

    /// How many blocks' fresh objects are held in memory.
    pub fn fresh_blocks(&self) -> u64 {
        self.caches.fresh_blocks()
    }
}
