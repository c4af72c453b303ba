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
pub(crate) mod report;
pub(crate) mod scan;
mod series;
pub(crate) mod stacks;
pub mod tree;

use std::sync::Arc;

use kiln_otel::model::LABEL_SERVICE_NAME;
use parquet::arrow::arrow_reader::ArrowReaderMetadata;

use crate::format::meta::{BlockMeta, EntryKey};
use crate::format::rollup::Source;
use crate::format::symbols::SymbolTable;
use crate::metastore::{BlockQuery, Metastore, SeriesMeta};
use crate::selector::{MatchOp, Selector};
use crate::store::ObjectStorage;

pub use plan::{ProfileStats, QueryAnalysis};
pub use report::{
    QueryCounters, QueryOptions, QueryReport, QueryStats, QueryStatsError, with_options,
    with_report,
};
pub(crate) use scan::{SectionReaderHandle, is_corruption};
pub use series::{
    Aggregation, Exemplar, Exemplars, MAX_EXEMPLARS_PER_POINT, PointGroup, ProfilePoint,
    SeriesPoints,
};
pub use stacks::StackValue;
pub use tree::FlameTree;

use crate::caches::cache::{self, ResultKey};

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
    pub(crate) store: ObjectStorage,
    pub(crate) metastore: Arc<dyn Metastore>,
    pub(crate) symbols: moka::future::Cache<EntryKey, Arc<SymbolTable>>,
    /// Parquet metadata by entry and section ([`Source`]).
    pub(crate) parquet: moka::future::Cache<(EntryKey, Source), ArrowReaderMetadata>,
    /// Stack totals of whole series of a block (every sample of them), for queries whose range
    /// covers them: the inner blocks of a long range are summed once, not per query.
    pub(crate) results: moka::future::Cache<ResultKey, Arc<[StackValue]>>,
    /// What names native frames, set once the process has built it ([`Self::set_frame_namer`]);
    /// shared by every clone of the engine (the compactor's too).
    pub(crate) naming: Arc<std::sync::OnceLock<cache::Naming>>,
    /// Block symbols with their native frames named, by block and the tenant's naming
    /// generation ([`crate::caches::names`]).
    pub(crate) named: moka::future::Cache<(EntryKey, u64), Arc<SymbolTable>>,
    /// Pages read from a remote object store (none for the local file system).
    pub(crate) pages: Option<scan::PageCache>,
    /// The objects of fresh segments as the writer made them, and of small compaction outputs,
    /// by block: a query of the last minutes reads their pages from memory, not from the store
    /// ([`Self::warm_object`]).
    pub(crate) fresh: cache::FreshObjects,
    pub(crate) counters: Arc<QueryCounters>,
    /// The writer of this process, where it acknowledges writes from a log: a query first cuts
    /// what it buffers ([`crate::writer::Writer::barrier`]).
    pub(crate) barrier: Arc<std::sync::OnceLock<crate::writer::WriteBarrier>>,
}

impl std::fmt::Debug for QueryEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryEngine").finish_non_exhaustive()
    }
}

impl QueryEngine {
    /// A query engine over `store`, with caches of about `cache_bytes` for symbols (and a quarter
    /// of it for Parquet metadata), `results_bytes` for partial results (0: none kept),
    /// when the store is remote, `pages_bytes` for the byte ranges queries read (0: none), and
    /// `fresh_bytes` for the objects of fresh segments (0: none kept).
    pub fn new(
        store: ObjectStorage,
        metastore: Arc<dyn Metastore>,
        cache_bytes: u64,
        results_bytes: u64,
        pages_bytes: u64,
        fresh_bytes: u64,
    ) -> Self {
        let pages = (!store.is_local() && pages_bytes > 0).then(|| {
            moka::future::Cache::builder()
                .weigher(|_: &(Arc<str>, u64, u64), b: &bytes::Bytes| {
                    u32::try_from(b.len() + 64).unwrap_or(u32::MAX)
                })
                .max_capacity(pages_bytes)
                .build()
        });
        let symbols = moka::future::Cache::builder()
            .weigher(|_: &EntryKey, t: &Arc<SymbolTable>| {
                u32::try_from(t.estimated_bytes()).unwrap_or(u32::MAX)
            })
            .max_capacity(cache_bytes)
            .build();
        let parquet = moka::future::Cache::builder()
            .weigher(|_: &(EntryKey, Source), m: &ArrowReaderMetadata| {
                u32::try_from(m.metadata().memory_size()).unwrap_or(u32::MAX)
            })
            .max_capacity(cache_bytes / 4)
            .build();
        let results = moka::future::Cache::builder()
            .weigher(|k: &ResultKey, v: &Arc<[StackValue]>| {
                let bytes = std::mem::size_of_val(&**v) + 4 * k.1.len() + 128;
                u32::try_from(bytes).unwrap_or(u32::MAX)
            })
            .max_capacity(results_bytes)
            .build();
        // A process sees another's uploads through its namer's caches, which expire; these
        // entries expire alike, so a named table is at most a minute behind.
        let named = moka::future::Cache::builder()
            .weigher(|_: &(EntryKey, u64), t: &Arc<SymbolTable>| {
                u32::try_from(t.estimated_bytes()).unwrap_or(u32::MAX)
            })
            .max_capacity(cache_bytes / 2)
            .time_to_live(std::time::Duration::from_secs(60))
            .build();
        Self {
            store,
            metastore,
            symbols,
            parquet,
            results,
            naming: Arc::default(),
            named,
            pages,
            fresh: cache::fresh_objects(fresh_bytes),
            counters: Arc::new(QueryCounters::default()),
            barrier: Arc::default(),
        }
    }

    /// Counters of the read path.
    pub fn counters(&self) -> &QueryCounters {
        &self.counters
    }

    /// Has every query of this engine (and its clones) first cut what the writer of this
    /// process acknowledged from its log and buffers, and read what it has not registered yet.
    pub(crate) fn set_write_barrier(&self, barrier: crate::writer::WriteBarrier) {
        let _ = self.barrier.set(barrier);
    }

    /// The blocks matching `query`: after the writer's barrier, where there is one, the
    /// metastore's and those the writer built and has not registered yet (every write
    /// acknowledged before this call is in one of them).
    pub(crate) async fn query_blocks(
        &self,
        query: BlockQuery<'_>,
    ) -> crate::Result<Vec<Arc<BlockMeta>>> {
        match self.barrier.get() {
            None => self.metastore.query_blocks(query).await,
            Some(b) => {
                b.wait().await;
                b.unregistered()
                    .query_blocks(self.metastore.as_ref(), query)
                    .await
            }
        }
    }
}

/// Unix milliseconds now.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
