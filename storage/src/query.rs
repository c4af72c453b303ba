//! The query engine: metastore lookup (tenant, time range, service and profile type), series
//! selection on the blocks' metadata (label selectors are answered there), then Parquet reads of
//! exactly the selected series' row ranges, summed by stack id per block and merged across
//! blocks through each block's symbol table.
//!
//! A block that cannot be read (footer, Parquet or symbols fail their checks, or its object is
//! gone) is quarantined: taken out of the index, logged, counted, and the query answers from the
//! other blocks. A store that cannot be reached fails the query as unavailable instead.

pub mod functions;
pub mod pprof;
pub mod tree;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Int64Type, UInt32Type, UInt64Type};
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt, TryStreamExt};
use kiln_otel::model::{LABEL_SERVICE_NAME, ProfileType};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, RowSelection, RowSelector,
};
use parquet::arrow::async_reader::{AsyncFileReader, ParquetRecordBatchStreamBuilder};
use parquet::errors::ParquetError;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader};
use parquet::file::page_index::column_index::ColumnIndexMetaData;
use tracing::Instrument;

use crate::block::col;
use crate::meta::{EntryKey, PROFILE_TOTALS};
use crate::metastore::{BlockMeta, BlockQuery, Metastore, SeriesMeta};
use crate::rollup::{Source, plan_series};
use crate::selector::{MatchOp, Selector};
use crate::store::ObjectStorage;
use crate::symbols::SymbolTable;
use crate::{Error, ErrorKind, Result};

pub use tree::FlameTree;

/// Synthetic label that holds a series' profile type id.
pub const PROFILE_TYPE_LABEL: &str = kiln_otel::model::LABEL_PROFILE_TYPE;

/// Blocks read at once by one query.
const SCAN_CONCURRENCY: usize = 4;
/// Rows per decoded batch.
const BATCH_ROWS: usize = 8192;

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
    fn series_matches(&self, s: &SeriesMeta) -> bool {
        s.profile_type == self.profile_type
            && s.overlaps(self.start_nanos, self.end_nanos)
            && self.selector.matches(|name| series_label(s, name))
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
    fn narrows_rows(&self) -> bool {
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

/// Time-series aggregation across the profiles of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aggregation {
    Sum,
    Average,
}

/// One output series of [`QueryEngine::select_series`].
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesPoints {
    pub labels: Vec<(String, String)>,
    /// (Unix milliseconds, value), in time order.
    pub points: Vec<(i64, f64)>,
    /// Exemplars of each point (same order as `points`), largest first; empty unless asked.
    pub exemplars: Vec<Vec<Exemplar>>,
}

/// Which exemplars a time series carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exemplars {
    None,
    /// The spans that contributed most to a point (traces-to-profiles links from a graph).
    Spans,
    /// The ingested profiles that contributed most to a point (`profile_id_selector` opens one).
    Profiles,
}

/// A span or an ingested profile that contributed to a point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exemplar {
    /// The span (0: a profile exemplar).
    pub span_id: u64,
    pub trace_id: Option<[u8; 16]>,
    /// The profile (a profile exemplar).
    pub profile_id: Option<[u8; 16]>,
    /// The profile's series labels (a profile exemplar).
    pub labels: Vec<(String, String)>,
    /// Unix milliseconds of the latest sample of the span or profile in the step.
    pub timestamp_ms: i64,
    pub value: i64,
}

/// Exemplars kept per point.
pub const MAX_EXEMPLARS_PER_POINT: usize = 5;

/// Stats of a tenant's data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProfileStats {
    pub data_ingested: bool,
    pub oldest_nanos: i64,
    pub newest_nanos: i64,
}

/// The summed value of one stack (and per-sample label set) of a block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackValue {
    pub stack: u32,
    /// Encoded per-sample labels (`block::encode_sample_labels`), when asked for.
    pub labels: Option<String>,
    pub value: i64,
}

/// What one query did: the figures that make pruning and caching visible (returned by
/// [`with_report`], and summed into the engine-wide [`QueryCounters`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct QueryStats {
    /// Blocks the query read (from the store or the caches).
    pub blocks: u64,
    /// Blocks answered from the partial-result cache, without reading their rows.
    pub blocks_cached: u64,
    /// Bytes read from the object store: Parquet pages and footers, symbols.
    pub bytes_read: u64,
    /// Rows decoded from samples and rollups.
    pub rows_read: u64,
    /// Series row ranges read from rollups rather than samples (ADR 0007).
    pub rollup_ranges: u64,
}

impl std::fmt::Display for QueryStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "blocks={} blocks_cached={} bytes_read={} rows_read={} rollup_ranges={}",
            self.blocks, self.blocks_cached, self.bytes_read, self.rows_read, self.rollup_ranges
        )
    }
}

/// Why a `kiln-query-stats` header does not read as [`QueryStats`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryStatsError {
    #[error("{0:?} is not name=value")]
    NotNameValue(String),
    #[error("{name}: {value:?}: {source}")]
    Value {
        name: String,
        value: String,
        #[source]
        source: std::num::ParseIntError,
    },
}

impl std::str::FromStr for QueryStats {
    type Err = QueryStatsError;

    /// Reads what [`Display`](std::fmt::Display) writes (the `kiln-query-stats` header); names
    /// it does not know are skipped, so a newer server's header still reads.
    fn from_str(s: &str) -> std::result::Result<Self, QueryStatsError> {
        let mut out = Self::default();
        for pair in s.split_whitespace() {
            let (name, value) = pair
                .split_once('=')
                .ok_or_else(|| QueryStatsError::NotNameValue(pair.to_owned()))?;
            let value: u64 = value.parse().map_err(|source| QueryStatsError::Value {
                name: name.to_owned(),
                value: value.to_owned(),
                source,
            })?;
            match name {
                "blocks" => out.blocks = value,
                "blocks_cached" => out.blocks_cached = value,
                "bytes_read" => out.bytes_read = value,
                "rows_read" => out.rows_read = value,
                "rollup_ranges" => out.rollup_ranges = value,
                _ => {}
            }
        }
        Ok(out)
    }
}

/// What a query reported besides its answer.
#[derive(Debug, Default, Clone)]
pub struct QueryReport {
    /// Partial answers say so: a block quarantined and left out of the answer, say.
    pub warnings: Vec<String>,
    pub stats: QueryStats,
}

/// How a query may be answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueryOptions {
    /// Whether blocks the range covers whole may be answered from the partial-result cache
    /// (and their results kept there). A client sending `Cache-Control: no-store` turns it off.
    pub results_cache: bool,
}

impl Default for QueryOptions {
    fn default() -> Self {
        Self {
            results_cache: true,
        }
    }
}

tokio::task_local! {
    /// The options and report of the query running in this task (see [`with_report`]).
    static REPORT: std::cell::RefCell<(QueryOptions, QueryReport)>;
}

/// Runs a query, collecting its warnings and [`QueryStats`] so the caller can hand them to the
/// client. Reads outside such a scope (the compactor's) are counted only engine-wide.
pub async fn with_report<F: std::future::Future>(f: F) -> (F::Output, QueryReport) {
    with_options(QueryOptions::default(), f).await
}

/// [`with_report`] with `options`.
pub async fn with_options<F: std::future::Future>(
    options: QueryOptions,
    f: F,
) -> (F::Output, QueryReport) {
    let context = (options, QueryReport::default());
    REPORT
        .scope(std::cell::RefCell::new(context), async move {
            let out = f.await;
            let report = REPORT.with(|r| std::mem::take(&mut r.borrow_mut().1));
            (out, report)
        })
        .await
}

fn options() -> QueryOptions {
    REPORT.try_with(|r| r.borrow().0).unwrap_or_default()
}

fn warn(message: String) {
    let _ = REPORT.try_with(|r| r.borrow_mut().1.warnings.push(message));
}

fn count(f: impl FnOnce(&mut QueryStats)) {
    let _ = REPORT.try_with(|r| f(&mut r.borrow_mut().1.stats));
}

/// Counts bytes read from the store, for the engine and for the query running in this task.
fn read_bytes(counters: &QueryCounters, n: u64) {
    counters.bytes_read.fetch_add(n, Ordering::Relaxed);
    count(|s| s.bytes_read += n);
}

/// Counters of the read path.
#[derive(Debug, Default)]
pub struct QueryCounters {
    /// Blocks quarantined because they could not be read.
    pub quarantined: AtomicU64,
    /// Bytes read from the object store by queries.
    pub bytes_read: AtomicU64,
    /// Series row ranges read from rollups rather than samples (ADR 0007).
    pub rollup_reads: AtomicU64,
    /// Symbol table cache lookups and misses (hit rate = 1 − misses ÷ lookups).
    pub symbols_lookups: AtomicU64,
    pub symbols_misses: AtomicU64,
    /// Parquet metadata cache lookups and misses.
    pub parquet_lookups: AtomicU64,
    pub parquet_misses: AtomicU64,
    /// Partial-result cache lookups and misses (a block's stack totals for a set of series).
    pub results_lookups: AtomicU64,
    pub results_misses: AtomicU64,
}

/// Key of a block's cached partial result: the block and the selected series (indices into its
/// series list). Blocks never change, so an entry stays true until it is evicted.
type ResultKey = (EntryKey, Arc<[u32]>);

/// Reads blocks. Cheap to clone.
#[derive(Clone)]
pub struct QueryEngine {
    store: ObjectStorage,
    metastore: Arc<dyn Metastore>,
    symbols: moka::future::Cache<EntryKey, Arc<SymbolTable>>,
    /// Parquet metadata by entry and section ([`Source`]).
    parquet: moka::future::Cache<(EntryKey, Source), ArrowReaderMetadata>,
    /// Stack totals of whole series of a block (every sample of them), for queries whose range
    /// covers them: the inner blocks of a long range are summed once, not per query.
    results: moka::future::Cache<ResultKey, Arc<[StackValue]>>,
    counters: Arc<QueryCounters>,
}

impl std::fmt::Debug for QueryEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryEngine").finish_non_exhaustive()
    }
}

/// A dataset's samples section as a Parquet file, read by ranges from its object.
pub(crate) struct SectionReader {
    store: ObjectStorage,
    path: String,
    section: Range<u64>,
    counters: Arc<QueryCounters>,
}

impl SectionReader {
    /// A reader of `block`'s samples or one of its rollups.
    fn new(engine: &QueryEngine, block: &BlockMeta, source: Source) -> Self {
        let section = match source {
            Source::Samples => block.samples.range(),
            Source::Rollup(i) => block.rollups[i].section.range(),
        };
        Self {
            store: engine.store.clone(),
            path: block.path(),
            section,
            counters: Arc::clone(&engine.counters),
        }
    }

    fn shift(&self, r: Range<u64>) -> Range<u64> {
        self.section.start + r.start..self.section.start + r.end
    }
}

fn external(e: Error) -> ParquetError {
    ParquetError::External(Box::new(e))
}

impl AsyncFileReader for SectionReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        let r = self.shift(range);
        async move {
            let b = self
                .store
                .get_range(&self.path, r)
                .await
                .map_err(external)?;
            read_bytes(&self.counters, b.len() as u64);
            Ok(b)
        }
        .boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        let ranges: Vec<Range<u64>> = ranges.into_iter().map(|r| self.shift(r)).collect();
        async move {
            let location = object_store::path::Path::from(self.path.as_str());
            let out = self
                .store
                .inner()
                .get_ranges(&location, &ranges)
                .await
                .map_err(|source| {
                    external(Error::ObjectStore {
                        path: self.path.clone(),
                        source,
                    })
                })?;
            let n: usize = out.iter().map(Bytes::len).sum();
            read_bytes(&self.counters, n as u64);
            Ok(out)
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            let size = self.section.end - self.section.start;
            let metadata = ParquetMetaDataReader::new()
                .with_page_index_policy(PageIndexPolicy::Optional)
                .with_prefetch_hint(Some(64 * 1024))
                .load_and_finish(self, size)
                .await?;
            Ok(Arc::new(metadata))
        }
        .boxed()
    }
}

/// The reader type of a block's samples, for the compactor.
pub(crate) type SectionReaderHandle = SectionReader;

/// Whether an error means the block itself is bad (as opposed to the store being unreachable).
pub(crate) fn is_corruption(e: &Error) -> bool {
    match e {
        Error::Corrupt { .. } | Error::Decode { .. } => true,
        Error::ObjectStore { source, .. } => matches!(source, object_store::Error::NotFound { .. }),
        Error::Parquet(ParquetError::External(inner)) => {
            inner.downcast_ref::<Error>().is_some_and(is_corruption)
        }
        Error::Parquet(_) | Error::Arrow(_) => true,
        _ => false,
    }
}

/// The row groups of `meta` that meet `ranges` (sorted, disjoint) and the selection of exactly
/// those rows within them.
fn row_selection(meta: &ParquetMetaData, ranges: &[Range<u64>]) -> (Vec<usize>, RowSelection) {
    let mut groups = Vec::new();
    let mut selectors = Vec::new();
    let mut group_start = 0u64;
    let mut next = 0usize;
    for (i, rg) in meta.row_groups().iter().enumerate() {
        let group_end = group_start + rg.num_rows() as u64;
        let mut pos = group_start;
        let mut any = false;
        let mut j = next;
        while j < ranges.len() && ranges[j].start < group_end {
            let r = &ranges[j];
            let (s, e) = (r.start.max(group_start), r.end.min(group_end));
            if s < e {
                if !any {
                    any = true;
                }
                if s > pos {
                    selectors.push(RowSelector::skip((s - pos) as usize));
                }
                selectors.push(RowSelector::select((e - s) as usize));
                pos = e;
            }
            if r.end <= group_end {
                j += 1;
            } else {
                break;
            }
        }
        next = j;
        if any {
            if pos < group_end {
                selectors.push(RowSelector::skip((group_end - pos) as usize));
            }
            groups.push(i);
        }
        group_start = group_end;
    }
    (groups, RowSelection::from(selectors))
}

/// The parts of `rows` (one series' rows, in time order) on pages of the timestamp column whose
/// bounds meet one of `times`, from the page index; all of `rows` where there is none. Pages
/// hold other series' rows too, so their bounds may be wider than this series' times: never
/// narrower, so no row in `times` is left out.
fn rows_in_times(
    meta: &ParquetMetaData,
    rows: Range<u64>,
    times: &[Range<i64>],
) -> Vec<Range<u64>> {
    let (Some(column_index), Some(offset_index)) = (meta.column_index(), meta.offset_index())
    else {
        return vec![rows];
    };
    let mut out = Vec::new();
    let mut group_start = 0u64;
    for (g, rg) in meta.row_groups().iter().enumerate() {
        let group_end = group_start + rg.num_rows() as u64;
        let (start, end) = (rows.start.max(group_start), rows.end.min(group_end));
        if start < end {
            let index = column_index.get(g).and_then(|c| c.get(col::TIMESTAMP));
            let pages = offset_index.get(g).and_then(|o| o.get(col::TIMESTAMP));
            match (index, pages) {
                (Some(ColumnIndexMetaData::INT64(index)), Some(pages)) => {
                    let pages = pages.page_locations();
                    for (p, page) in pages.iter().enumerate() {
                        let page_start = group_start + page.first_row_index as u64;
                        let page_end = pages
                            .get(p + 1)
                            .map_or(group_end, |n| group_start + n.first_row_index as u64);
                        let (s, e) = (page_start.max(start), page_end.min(end));
                        if s >= e {
                            continue;
                        }
                        let meets = match (index.min_value(p), index.max_value(p)) {
                            (Some(&lo), Some(&hi)) => {
                                times.iter().any(|t| lo < t.end && hi >= t.start)
                            }
                            _ => true,
                        };
                        if meets {
                            out.push(s..e);
                        }
                    }
                }
                _ => out.push(start..end),
            }
        }
        group_start = group_end;
    }
    out
}

/// Adds `value` to stack `stack` of a block's dense sums.
fn add_dense(dense: &mut [i64], block: &BlockMeta, stack: u32, value: i64) -> Result<()> {
    let Some(slot) = dense.get_mut(stack as usize) else {
        return Err(Error::Corrupt {
            tenant: block.tenant.clone(),
            block: block.id.clone(),
            reason: format!("stack id {stack} beyond the stack tree"),
        });
    };
    *slot = slot.saturating_add(value);
    Ok(())
}

/// The non-zero sums of a block's dense array.
fn dense_values(dense: Vec<i64>) -> Vec<StackValue> {
    dense
        .into_iter()
        .enumerate()
        .filter(|(_, v)| *v != 0)
        .map(|(stack, value)| StackValue {
            stack: stack as u32,
            labels: None,
            value,
        })
        .collect()
}

/// Merges sorted row ranges that touch.
fn coalesce(mut ranges: Vec<Range<u64>>) -> Vec<Range<u64>> {
    ranges.sort_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for r in ranges.into_iter().filter(|r| r.start < r.end) {
        match out.last_mut() {
            Some(last) if last.end >= r.start => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

impl QueryEngine {
    /// A query engine over `store`, with caches of about `cache_bytes` for symbols (and a quarter
    /// of it for Parquet metadata) and `results_bytes` for partial results (0: none kept).
    pub fn new(
        store: ObjectStorage,
        metastore: Arc<dyn Metastore>,
        cache_bytes: u64,
        results_bytes: u64,
    ) -> Self {
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
        Self {
            store,
            metastore,
            symbols,
            parquet,
            results,
            counters: Arc::new(QueryCounters::default()),
        }
    }

    /// Counters of the read path.
    pub fn counters(&self) -> &QueryCounters {
        &self.counters
    }

    /// Series (label sets with the synthetic `__profile_type__`) of `tenant` in `[start, end)` that
    /// match any of `selectors` (all series when there is none).
    async fn matching_series(
        &self,
        tenant: &str,
        selectors: &[Selector],
        start: i64,
        end: i64,
    ) -> Result<BTreeSet<Vec<(String, String)>>> {
        let mut out = BTreeSet::new();
        let blocks = self
            .metastore
            .query_blocks(BlockQuery::new(tenant, start, end))
            .await?;
        for block in blocks {
            for s in &block.series {
                if !s.overlaps(start, end) {
                    continue;
                }
                let hit = selectors.is_empty()
                    || selectors
                        .iter()
                        .any(|sel| sel.matches(|n| series_label(s, n)));
                if hit {
                    let mut labels = s.labels.clone();
                    labels.push((PROFILE_TYPE_LABEL.to_owned(), s.profile_type.clone()));
                    labels.sort();
                    out.insert(labels);
                }
            }
        }
        Ok(out)
    }

    /// Profile types with data in `[start, end)`.
    pub async fn profile_types(
        &self,
        tenant: &str,
        start: i64,
        end: i64,
    ) -> Result<Vec<ProfileType>> {
        let mut ids = BTreeSet::new();
        let blocks = self
            .metastore
            .query_blocks(BlockQuery::new(tenant, start, end))
            .await?;
        for block in blocks {
            for s in &block.series {
                if s.overlaps(start, end) {
                    ids.insert(s.profile_type.clone());
                }
            }
        }
        Ok(ids.iter().filter_map(|id| ProfileType::parse(id)).collect())
    }

    /// Label names of the matching series, sorted.
    pub async fn label_names(
        &self,
        tenant: &str,
        selectors: &[Selector],
        start: i64,
        end: i64,
    ) -> Result<Vec<String>> {
        let series = self.matching_series(tenant, selectors, start, end).await?;
        let names: BTreeSet<String> = series.into_iter().flatten().map(|(k, _)| k).collect();
        Ok(names.into_iter().collect())
    }

    /// Values of label `name` in the matching series, sorted.
    pub async fn label_values(
        &self,
        tenant: &str,
        name: &str,
        selectors: &[Selector],
        start: i64,
        end: i64,
    ) -> Result<Vec<String>> {
        let series = self.matching_series(tenant, selectors, start, end).await?;
        let values: BTreeSet<String> = series
            .into_iter()
            .flatten()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v)
            .collect();
        Ok(values.into_iter().collect())
    }

    /// Label sets of the matching series; with `label_names`, only those labels, de-duplicated.
    pub async fn series(
        &self,
        tenant: &str,
        selectors: &[Selector],
        label_names: &[String],
        start: i64,
        end: i64,
    ) -> Result<Vec<Vec<(String, String)>>> {
        let series = self.matching_series(tenant, selectors, start, end).await?;
        if label_names.is_empty() {
            return Ok(series.into_iter().collect());
        }
        let projected: BTreeSet<Vec<(String, String)>> = series
            .into_iter()
            .map(|s| {
                s.into_iter()
                    .filter(|(k, _)| label_names.contains(k))
                    .collect()
            })
            .collect();
        Ok(projected.into_iter().collect())
    }

    /// Oldest and newest sample time of a tenant.
    /// From the metastore's partition summaries, so it costs the same whatever the data's age.
    pub async fn profile_stats(&self, tenant: &str) -> Result<ProfileStats> {
        let parts = self.metastore.partitions(tenant).await?;
        if parts.is_empty() {
            return Ok(ProfileStats::default());
        }
        Ok(ProfileStats {
            data_ingested: true,
            oldest_nanos: parts.iter().map(|p| p.min_time_nanos).min().unwrap_or(0),
            newest_nanos: parts.iter().map(|p| p.max_time_nanos).max().unwrap_or(0),
        })
    }

    /// Blocks with at least one series the filter selects, with those series' indices.
    async fn candidate_blocks(
        &self,
        filter: &SampleFilter,
    ) -> Result<Vec<(Arc<BlockMeta>, Vec<u32>)>> {
        let blocks = self.metastore.query_blocks(filter.block_query()).await?;
        Ok(blocks
            .into_iter()
            .filter_map(|b| {
                let series: Vec<u32> = b
                    .series
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| filter.series_matches(s))
                    .map(|(i, _)| i as u32)
                    .collect();
                (!series.is_empty()).then_some((b, series))
            })
            .collect())
    }

    /// What a query would read, from the index alone (nothing is read from the object store):
    /// the blocks its range and selector reach, the series and sample rows it selects in them,
    /// and their bytes. Row and byte counts of the samples are the selected series' share of
    /// each block's.
    pub async fn analyze(&self, filter: &SampleFilter) -> Result<QueryAnalysis> {
        let mut a = QueryAnalysis::default();
        let mut series = BTreeSet::new();
        for (block, selected) in self.candidate_blocks(filter).await? {
            a.blocks += 1;
            a.bytes_in_range += block.object_size;
            a.symbol_bytes += block.symbols.size;
            let rows: u64 = selected
                .iter()
                .map(|&i| block.series[i as usize].rows)
                .sum();
            a.rows += rows;
            if block.rows > 0 {
                a.sample_bytes +=
                    (block.samples.size as u128 * rows as u128 / block.rows as u128) as u64;
                a.profiles += (block.profiles as u128 * rows as u128 / block.rows as u128) as u64;
            }
            for i in selected {
                let s = &block.series[i as usize];
                series.insert((s.profile_type.clone(), s.labels.clone()));
            }
        }
        a.series = series.len() as u64;
        Ok(a)
    }

    /// The symbols of a block, read and checked without the cache (the compactor reads each
    /// block once; keeping them would crowd out what queries use).
    pub async fn load_symbols(&self, block: &BlockMeta) -> Result<Arc<SymbolTable>> {
        if let Some(t) = self.symbols.get(&block.key()).await {
            return Ok(t);
        }
        let data = self
            .store
            .get_range(&block.path(), block.symbols.range())
            .await?;
        read_bytes(&self.counters, data.len() as u64);
        SymbolTable::decode(&data)
            .map(Arc::new)
            .map_err(|source| Error::Decode {
                tenant: block.tenant.clone(),
                block: block.id.clone(),
                what: "symbols section",
                source,
            })
    }

    /// The symbols of a block, cached.
    pub async fn symbols(&self, block: &BlockMeta) -> Result<Arc<SymbolTable>> {
        let store = self.store.clone();
        let path = block.path();
        let range = block.symbols.range();
        let (tenant, id) = (block.tenant.clone(), block.id.clone());
        let counters = Arc::clone(&self.counters);
        counters.symbols_lookups.fetch_add(1, Ordering::Relaxed);
        self.symbols
            .try_get_with(block.key(), async move {
                counters.symbols_misses.fetch_add(1, Ordering::Relaxed);
                let data = store.get_range(&path, range).await?;
                read_bytes(&counters, data.len() as u64);
                SymbolTable::decode(&data)
                    .map(Arc::new)
                    .map_err(|source| Error::Decode {
                        tenant,
                        block: id,
                        what: "symbols section",
                        source,
                    })
            })
            .await
            .map_err(unshare)
    }

    async fn parquet_metadata(
        &self,
        block: &BlockMeta,
        source: Source,
    ) -> Result<ArrowReaderMetadata> {
        let mut reader = SectionReader::new(self, block, source);
        self.counters
            .parquet_lookups
            .fetch_add(1, Ordering::Relaxed);
        let counters = Arc::clone(&self.counters);
        self.parquet
            .try_get_with((block.key(), source), async move {
                counters.parquet_misses.fetch_add(1, Ordering::Relaxed);
                let options =
                    ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional);
                Ok::<_, Error>(ArrowReaderMetadata::load_async(&mut reader, options).await?)
            })
            .await
            .map_err(unshare)
    }

    /// Reads the given columns of the rows of `series` (indices into the block's series list)
    /// in the samples or a rollup, calling `f` with each batch; columns come in schema order.
    ///
    /// Only pages whose timestamps may fall in `times` are read (the Parquet page index of the
    /// timestamp column; rows of a series are in time order), so a short range over a block
    /// holding hours of a series reads a few pages of it.
    async fn read_series(
        &self,
        block: &BlockMeta,
        source: Source,
        series: &[u32],
        times: &[Range<i64>],
        columns: &[usize],
        mut f: impl FnMut(&RecordBatch) -> Result<()>,
    ) -> Result<()> {
        let ranges: Vec<Range<u64>> = series
            .iter()
            .map(|&i| match source {
                Source::Samples => block.series[i as usize].row_range(),
                Source::Rollup(r) => block.rollups[r].series_rows[i as usize].clone(),
            })
            .filter(|r| r.start < r.end)
            .collect();
        if ranges.is_empty() {
            return Ok(());
        }
        if source != Source::Samples {
            let n = ranges.len() as u64;
            self.counters.rollup_reads.fetch_add(n, Ordering::Relaxed);
            count(|s| s.rollup_ranges += n);
        }
        let metadata = self.parquet_metadata(block, source).await?;
        let ranges = coalesce(
            ranges
                .into_iter()
                .flat_map(|r| rows_in_times(metadata.metadata(), r, times))
                .collect(),
        );
        if ranges.is_empty() {
            return Ok(());
        }
        let (groups, selection) = row_selection(metadata.metadata(), &ranges);
        if groups.is_empty() {
            return Ok(());
        }
        // Columns newer than the block's format (`profile_id` of version 2 blocks) are read as
        // nulls; they are the last ones, so the others keep their positions in a batch.
        let present = metadata.schema().fields().len();
        let missing: Vec<usize> = columns.iter().copied().filter(|&c| c >= present).collect();
        let mask = ProjectionMask::roots(
            metadata.parquet_schema(),
            columns.iter().copied().filter(|&c| c < present),
        );
        let mut stream = ParquetRecordBatchStreamBuilder::new_with_metadata(
            SectionReader::new(self, block, source),
            metadata,
        )
        .with_row_groups(groups)
        .with_row_selection(selection)
        .with_projection(mask)
        .with_batch_size(BATCH_ROWS)
        .build()?;
        while let Some(batch) = stream.try_next().await? {
            count(|s| s.rows_read += batch.num_rows() as u64);
            if missing.is_empty() {
                f(&batch)?;
            } else {
                f(&with_null_columns(batch, &missing)?)?;
            }
        }
        Ok(())
    }

    /// Every row of a block, every column, in its sort order (the compactor's input).
    pub(crate) async fn read_all(
        &self,
        block: &BlockMeta,
        batch_rows: usize,
    ) -> Result<parquet::arrow::async_reader::ParquetRecordBatchStream<SectionReader>> {
        let metadata = self.parquet_metadata(block, Source::Samples).await?;
        Ok(ParquetRecordBatchStreamBuilder::new_with_metadata(
            SectionReader::new(self, block, Source::Samples),
            metadata,
        )
        .with_batch_size(batch_rows)
        .build()?)
    }

    /// Quarantines a block that failed to read; other errors pass through.
    async fn quarantine_or_fail(&self, block: &BlockMeta, e: Error) -> Result<()> {
        if !is_corruption(&e) {
            return Err(e);
        }
        // A block compacted away (and deleted) after this query looked it up is not corrupt:
        // the query starts again from a fresh lookup.
        if is_missing(&e) {
            let live = self
                .metastore
                .get_blocks(&block.tenant, std::slice::from_ref(&block.id))
                .await?;
            if !live.iter().any(|b| b.key() == block.key()) {
                return Err(Error::BlockGone {
                    tenant: block.tenant.clone(),
                    block: block.id.clone(),
                });
            }
        }
        let reason = e.to_string();
        tracing::error!(tenant = %block.tenant, block = %block.id, path = %block.path(),
            reason = %reason, "block quarantined: it cannot be read; queries answer without it");
        self.counters.quarantined.fetch_add(1, Ordering::Relaxed);
        warn(format!(
            "block {} is unreadable and was quarantined; the answer leaves its data out",
            block.id
        ));
        let now = now_ms();
        self.metastore
            .quarantine(&block.tenant, &block.id, &reason, now)
            .await?;
        self.symbols.invalidate(&block.key()).await;
        let key = block.key();
        // Partial results of the block name it by key; it is out of the index now, so they are
        // never looked up again and age out.
        self.parquet
            .invalidate(&(key.clone(), Source::Samples))
            .await;
        for i in 0..block.rollups.len() {
            self.parquet
                .invalidate(&(key.clone(), Source::Rollup(i)))
                .await;
        }
        Ok(())
    }

    /// Calls `f` with each selected block's symbols and the summed value of every selected stack
    /// (and per-sample label set, with `with_labels`), as scans complete. At most
    /// [`SCAN_CONCURRENCY`] blocks are held at once.
    async fn for_each_block_stacks(
        &self,
        filter: &SampleFilter,
        with_labels: bool,
        mut f: impl FnMut(&SymbolTable, &[StackValue]),
    ) -> Result<()> {
        let blocks = self
            .candidate_blocks(filter)
            .instrument(tracing::info_span!("query.plan"))
            .await?;
        let scan = tracing::info_span!("query.scan", blocks = blocks.len());
        let mut columns = vec![col::TIMESTAMP, col::STACK_ID, col::VALUE];
        if !filter.span_ids.is_empty() {
            columns.push(col::SPAN_ID);
        }
        if !filter.trace_ids.is_empty() {
            columns.push(col::TRACE_ID);
        }
        if with_labels {
            columns.push(col::SAMPLE_LABELS);
        }
        if !filter.profile_ids.is_empty() {
            columns.push(col::PROFILE_ID);
        }
        columns.sort_unstable();
        let columns = &columns;
        let mut scans = futures::stream::iter(blocks)
            .map(|(block, series)| async move {
                count(|s| s.blocks += 1);
                let result = async {
                    let symbols = self.symbols(&block).await?;
                    let values = self
                        .cached_block_stacks(&block, series, filter, columns, with_labels)
                        .await?;
                    Ok::<_, Error>((symbols, values))
                }
                .await;
                match result {
                    Ok(v) => Ok(Some(v)),
                    Err(e) => self.quarantine_or_fail(&block, e).await.map(|()| None),
                }
            })
            .buffer_unordered(SCAN_CONCURRENCY);
        async {
            while let Some(scan) = scans.next().await {
                if let Some((symbols, values)) = scan? {
                    f(&symbols, &values);
                }
            }
            Ok(())
        }
        .instrument(scan)
        .await
    }

    /// [`Self::block_stacks`], from the partial-result cache when the query takes every sample
    /// of the selected series (its range covers them, no span, trace or label split).
    async fn cached_block_stacks(
        &self,
        block: &BlockMeta,
        series: Vec<u32>,
        filter: &SampleFilter,
        columns: &[usize],
        with_labels: bool,
    ) -> Result<Arc<[StackValue]>> {
        let whole = !with_labels
            && !filter.narrows_rows()
            && self.results.policy().max_capacity() != Some(0)
            && options().results_cache
            && series.iter().all(|&i| {
                let s = &block.series[i as usize];
                filter.start_nanos <= s.min_time_nanos && s.max_time_nanos < filter.end_nanos
            });
        if !whole {
            return Ok(self
                .block_stacks(block, &series, filter, columns, with_labels)
                .await?
                .into());
        }
        self.counters
            .results_lookups
            .fetch_add(1, Ordering::Relaxed);
        let computed = std::sync::atomic::AtomicBool::new(false);
        let key: ResultKey = (block.key(), series.into());
        let values = self
            .results
            .try_get_with_by_ref(&key, async {
                computed.store(true, Ordering::Relaxed);
                self.counters.results_misses.fetch_add(1, Ordering::Relaxed);
                self.block_stacks(block, &key.1, filter, columns, with_labels)
                    .await
                    .map(Arc::from)
            })
            .await
            .map_err(unshare)?;
        if !computed.load(Ordering::Relaxed) {
            count(|s| s.blocks_cached += 1);
        }
        Ok(values)
    }

    async fn block_stacks(
        &self,
        block: &BlockMeta,
        series: &[u32],
        filter: &SampleFilter,
        columns: &[usize],
        with_labels: bool,
    ) -> Result<Vec<StackValue>> {
        let pos = |c: usize| columns.iter().position(|&x| x == c);
        let (ts_i, stack_i, value_i) = (
            pos(col::TIMESTAMP).expect("projected"),
            pos(col::STACK_ID).expect("projected"),
            pos(col::VALUE).expect("projected"),
        );
        let (span_i, trace_i, labels_i, profile_i) = (
            pos(col::SPAN_ID),
            pos(col::TRACE_ID),
            pos(col::SAMPLE_LABELS),
            pos(col::PROFILE_ID),
        );
        if !with_labels
            && !filter.narrows_rows()
            && let Some(values) = self
                .block_stacks_from_rollups(block, series, filter)
                .await?
        {
            return Ok(values);
        }
        let nodes = block.stack_nodes as usize;
        let mut dense = vec![0i64; if with_labels { 0 } else { nodes }];
        let mut keyed: HashMap<(u32, Option<String>), i64> = HashMap::new();
        let window = filter.start_nanos..filter.end_nanos;
        let times = std::slice::from_ref(&window);
        self.read_series(block, Source::Samples, series, times, columns, |batch| {
            let ts = batch.column(ts_i).as_primitive::<Int64Type>();
            let stacks = batch.column(stack_i).as_primitive::<UInt32Type>();
            let values = batch.column(value_i).as_primitive::<Int64Type>();
            let spans = span_i.map(|i| batch.column(i).as_primitive::<UInt64Type>());
            let traces = trace_i.map(|i| batch.column(i).as_fixed_size_binary());
            let labels = labels_i.map(|i| batch.column(i).as_string::<i32>());
            let profiles = profile_i.map(|i| batch.column(i).as_fixed_size_binary());
            for r in 0..batch.num_rows() {
                let trace = traces.filter(|t| !t.is_null(r)).map(|t| t.value(r));
                let profile = profiles.filter(|p| !p.is_null(r)).map(|p| p.value(r));
                if !filter.keeps(ts.value(r), spans.map(|s| s.value(r)), trace, profile) {
                    continue;
                }
                let (stack, value) = (stacks.value(r), values.value(r));
                if with_labels {
                    let l = labels
                        .filter(|l| !l.is_null(r))
                        .map(|l| l.value(r).to_owned());
                    let slot = keyed.entry((stack, l)).or_insert(0);
                    *slot = slot.saturating_add(value);
                } else {
                    add_dense(&mut dense, block, stack, value)?;
                }
            }
            Ok(())
        })
        .await?;
        if with_labels {
            let mut v: Vec<StackValue> = keyed
                .into_iter()
                .map(|((stack, labels), value)| StackValue {
                    stack,
                    labels,
                    value,
                })
                .collect();
            v.sort_by(|a, b| (a.stack, &a.labels).cmp(&(b.stack, &b.labels)));
            return Ok(v);
        }
        Ok(dense_values(dense))
    }

    /// [`Self::block_stacks`] through the block's rollups (ADR 0007): each selected series'
    /// range split by [`plan_series`] into whole buckets of the coarsest rollup that fits and
    /// samples at the edges. `None` when the block has no stack rollup or none would be read.
    async fn block_stacks_from_rollups(
        &self,
        block: &BlockMeta,
        series: &[u32],
        filter: &SampleFilter,
    ) -> Result<Option<Vec<StackValue>>> {
        let mut levels: Vec<(usize, i64)> = block
            .rollups
            .iter()
            .enumerate()
            .filter(|(_, r)| r.resolution_nanos != PROFILE_TOTALS)
            .map(|(i, r)| (i, r.resolution_nanos))
            .collect();
        if levels.is_empty() {
            return Ok(None);
        }
        levels.sort_by_key(|&(_, r)| std::cmp::Reverse(r));
        // Per source, per series: the intervals (timestamps, or bucket starts) it contributes.
        let mut plan: BTreeMap<Source, BTreeMap<u32, Vec<Range<i64>>>> = BTreeMap::new();
        for &i in series {
            let s = &block.series[i as usize];
            for (source, range) in plan_series(&levels, s, filter.start_nanos, filter.end_nanos) {
                plan.entry(source)
                    .or_default()
                    .entry(i)
                    .or_default()
                    .push(range);
            }
        }
        if plan.keys().all(|s| *s == Source::Samples) {
            return Ok(None);
        }
        let mut dense = vec![0i64; block.stack_nodes as usize];
        let columns = [col::SERIES_ID, col::TIMESTAMP, col::STACK_ID, col::VALUE];
        for (source, pieces) in &plan {
            let ids: Vec<u32> = pieces.keys().copied().collect();
            let times: Vec<Range<i64>> = pieces.values().flatten().cloned().collect();
            self.read_series(block, *source, &ids, &times, &columns, |batch| {
                let sid = batch.column(0).as_primitive::<UInt32Type>();
                let ts = batch.column(1).as_primitive::<Int64Type>();
                let stacks = batch.column(2).as_primitive::<UInt32Type>();
                let values = batch.column(3).as_primitive::<Int64Type>();
                let mut current: Option<(u32, &[Range<i64>])> = None;
                for r in 0..batch.num_rows() {
                    let s = sid.value(r);
                    let ranges = match current {
                        Some((c, ranges)) if c == s => ranges,
                        _ => {
                            let ranges = pieces.get(&s).map_or(&[][..], Vec::as_slice);
                            current = Some((s, ranges));
                            ranges
                        }
                    };
                    let t = ts.value(r);
                    if ranges.iter().any(|x| x.contains(&t)) {
                        add_dense(&mut dense, block, stacks.value(r), values.value(r))?;
                    }
                }
                Ok(())
            })
            .await?;
        }
        Ok(Some(dense_values(dense)))
    }

    /// The merged stack tree of the selected samples.
    #[tracing::instrument(name = "query.merge_tree", skip_all, fields(tenant = %filter.tenant, profile_type = %filter.profile_type))]
    pub async fn merge_tree(&self, filter: &SampleFilter) -> Result<FlameTree> {
        retrying(|| async {
            let mut tree = FlameTree::default();
            self.for_each_block_stacks(filter, false, |symbols, values| {
                add_block_stacks(&mut tree, symbols, values)
            })
            .await?;
            Ok(tree)
        })
        .await
    }

    /// The selected samples merged into one pprof profile.
    pub async fn merge_pprof(
        &self,
        filter: &SampleFilter,
    ) -> Result<kiln_proto::google::v1::Profile> {
        self.merge_pprof_at(filter, &[]).await
    }

    /// [`Self::merge_pprof`] of the stacks that start with `call_site` (function names, root
    /// first; empty: all).
    #[tracing::instrument(name = "query.merge_pprof", skip_all, fields(tenant = %filter.tenant, profile_type = %filter.profile_type))]
    pub async fn merge_pprof_at(
        &self,
        filter: &SampleFilter,
        call_site: &[String],
    ) -> Result<kiln_proto::google::v1::Profile> {
        let profile_type = ProfileType::parse(&filter.profile_type).ok_or_else(|| {
            Error::InvalidQuery(format!("invalid profile type {:?}", filter.profile_type))
        })?;
        retrying(|| async {
            let mut builder =
                pprof::PprofBuilder::new(&profile_type).with_call_site(call_site.to_vec());
            self.for_each_block_stacks(filter, true, |symbols, values| {
                builder.add_block(symbols, values)
            })
            .await?;
            Ok(builder.finish(filter.start_nanos, filter.end_nanos))
        })
        .await
    }

    /// Time series of the selected samples: one series per distinct value set of `group_by`,
    /// points every `step_nanos`, aligned to `start`. An average divides a step's sum by the
    /// number of profiles in it: distinct (series, timestamp, profile id) cells.
    #[tracing::instrument(name = "query.select_series", skip_all, fields(tenant = %filter.tenant, profile_type = %filter.profile_type, step_nanos))]
    pub async fn select_series(
        &self,
        filter: &SampleFilter,
        group_by: &[String],
        step_nanos: i64,
        aggregation: Aggregation,
        limit: Option<usize>,
        exemplars: Exemplars,
    ) -> Result<Vec<SeriesPoints>> {
        if step_nanos <= 0 {
            return Err(Error::InvalidQuery("step must be positive".into()));
        }
        retrying(|| {
            self.select_series_once(filter, group_by, step_nanos, aggregation, limit, exemplars)
        })
        .await
    }

    /// The selected profiles' totals, or the selected spans' (`spans`), one point each, in
    /// groups of the `group_by` labels: what a heatmap counts. A profile is one ingested
    /// profile of a series (one series at one time for blocks written before profile ids); a
    /// span's point is the sum of its samples, at the time of its latest one.
    #[tracing::instrument(name = "query.profile_points", skip_all, fields(tenant = %filter.tenant, profile_type = %filter.profile_type, spans))]
    pub async fn profile_points(
        &self,
        filter: &SampleFilter,
        group_by: &[String],
        spans: bool,
    ) -> Result<Vec<PointGroup>> {
        let kind = if spans {
            Exemplars::Spans
        } else {
            Exemplars::Profiles
        };
        let per_block = retrying(|| self.scan_cells(filter, kind)).await?;
        // (group, series labels or span) -> (time, value, trace)
        let mut groups: BTreeMap<Vec<(String, String)>, HashMap<PointKey, ProfilePoint>> =
            BTreeMap::new();
        for (block, cells) in per_block {
            for (cell, value) in cells {
                let Some(s) = block.series.get(cell.series as usize) else {
                    continue;
                };
                if spans && cell.span == 0 {
                    continue;
                }
                let group: Vec<(String, String)> = group_by
                    .iter()
                    .filter_map(|g| series_label(s, g).map(|v| (g.clone(), v.to_owned())))
                    .collect();
                let key = if spans {
                    PointKey::Span(cell.span)
                } else {
                    PointKey::Profile(s.labels.clone(), cell.timestamp, cell.profile)
                };
                let point = groups
                    .entry(group)
                    .or_default()
                    .entry(key)
                    .or_insert(ProfilePoint {
                        timestamp_nanos: cell.timestamp,
                        value: 0,
                        span_id: cell.span,
                        trace_id: cell.trace,
                        profile_id: cell.profile,
                    });
                point.value = point.value.saturating_add(value);
                point.timestamp_nanos = point.timestamp_nanos.max(cell.timestamp);
                if point.trace_id.is_none() {
                    point.trace_id = cell.trace;
                }
            }
        }
        Ok(groups
            .into_iter()
            .map(|(labels, points)| {
                let mut points: Vec<ProfilePoint> = points.into_values().collect();
                points.sort_by_key(|p| (p.timestamp_nanos, p.span_id, p.profile_id));
                PointGroup { labels, points }
            })
            .collect())
    }

    /// Per block, the sums of the selected samples by (series index, timestamp), and by span
    /// and trace too for span exemplars, or by profile id for profile exemplars: what series,
    /// heatmaps and exemplars are made of. Profile totals answer when no span or trace is asked
    /// about (they are kept per profile id).
    async fn scan_cells(
        &self,
        filter: &SampleFilter,
        exemplars: Exemplars,
    ) -> Result<Vec<(Arc<BlockMeta>, Vec<(Cell, i64)>)>> {
        let blocks = self.candidate_blocks(filter).await?;
        let spans_asked = exemplars == Exemplars::Spans;
        let mut columns = vec![col::SERIES_ID, col::TIMESTAMP, col::VALUE];
        if spans_asked || !filter.span_ids.is_empty() {
            columns.push(col::SPAN_ID);
        }
        if spans_asked || !filter.trace_ids.is_empty() {
            columns.push(col::TRACE_ID);
        }
        if exemplars == Exemplars::Profiles || !filter.profile_ids.is_empty() {
            columns.push(col::PROFILE_ID);
        }
        columns.sort_unstable();
        let columns = &columns;
        let window = filter.start_nanos..filter.end_nanos;
        let window = std::slice::from_ref(&window);
        // Per block: cells and their sums. Rows come in the block's sort order (series, then
        // time), so equal keys are mostly adjacent: they are summed as they come, without
        // hashing; repeats that are not adjacent stay separate cells and are summed into their
        // bucket below.
        let per_block: Vec<Option<(Arc<BlockMeta>, Vec<(Cell, i64)>)>> =
            futures::stream::iter(blocks)
                .map(|(block, series)| async move {
                    count(|s| s.blocks += 1);
                    let mut cells: Vec<(Cell, i64)> = Vec::new();
                    let pos = |c: usize| columns.iter().position(|&x| x == c);
                    // Profile totals (kept per profile id) answer exactly when no span or
                    // trace is asked about.
                    let totals = block
                        .rollups
                        .iter()
                        .position(|r| r.resolution_nanos == PROFILE_TOTALS)
                        .filter(|_| {
                            !spans_asked
                                && filter.span_ids.is_empty()
                                && filter.trace_ids.is_empty()
                        });
                    let source = totals.map_or(Source::Samples, Source::Rollup);
                    let result = self
                        .read_series(&block, source, &series, window, columns, |batch| {
                            let sid = batch
                                .column(pos(col::SERIES_ID).expect("projected"))
                                .as_primitive::<UInt32Type>();
                            let ts = batch
                                .column(pos(col::TIMESTAMP).expect("projected"))
                                .as_primitive::<Int64Type>();
                            let values = batch
                                .column(pos(col::VALUE).expect("projected"))
                                .as_primitive::<Int64Type>();
                            let spans = pos(col::SPAN_ID)
                                .map(|i| batch.column(i).as_primitive::<UInt64Type>());
                            let traces =
                                pos(col::TRACE_ID).map(|i| batch.column(i).as_fixed_size_binary());
                            let profiles = pos(col::PROFILE_ID)
                                .map(|i| batch.column(i).as_fixed_size_binary());
                            for r in 0..batch.num_rows() {
                                let trace = traces.filter(|t| !t.is_null(r)).map(|t| t.value(r));
                                let profile =
                                    profiles.filter(|p| !p.is_null(r)).map(|p| p.value(r));
                                let span = spans.map(|s| s.value(r));
                                if !filter.keeps(ts.value(r), span, trace, profile) {
                                    continue;
                                }
                                let id =
                                    |b: Option<&[u8]>| b.and_then(|b| <[u8; 16]>::try_from(b).ok());
                                let mut key = Cell {
                                    series: sid.value(r),
                                    timestamp: ts.value(r),
                                    span: 0,
                                    trace: None,
                                    profile: None,
                                };
                                match exemplars {
                                    Exemplars::None => {}
                                    Exemplars::Spans => {
                                        key.span = span.unwrap_or(0);
                                        key.trace = id(trace);
                                    }
                                    Exemplars::Profiles => key.profile = id(profile),
                                }
                                match cells.last_mut() {
                                    Some((last, sum)) if *last == key => {
                                        *sum = sum.saturating_add(values.value(r));
                                    }
                                    _ => cells.push((key, values.value(r))),
                                }
                            }
                            Ok(())
                        })
                        .await;
                    match result {
                        Ok(()) => Ok(Some((block, cells))),
                        Err(e) => self.quarantine_or_fail(&block, e).await.map(|()| None),
                    }
                })
                .buffer_unordered(SCAN_CONCURRENCY)
                .try_collect()
                .await?;
        Ok(per_block.into_iter().flatten().collect())
    }

    async fn select_series_once(
        &self,
        filter: &SampleFilter,
        group_by: &[String],
        step_nanos: i64,
        aggregation: Aggregation,
        limit: Option<usize>,
        exemplars: Exemplars,
    ) -> Result<Vec<SeriesPoints>> {
        // Averages count profiles: cells per profile id where blocks keep them.
        let scan = if exemplars == Exemplars::None && aggregation == Aggregation::Average {
            Exemplars::Profiles
        } else {
            exemplars
        };
        let per_block = self.scan_cells(filter, scan).await?;
        // group labels -> bucket -> (sum, profiles, span or profile -> exemplar)
        type Bucket = (
            i64,
            HashSet<(Vec<(String, String)>, i64, Option<[u8; 16]>)>,
            HashMap<ExemplarKey, Exemplar>,
        );
        let mut group_of: HashMap<Vec<(String, String)>, usize> = HashMap::new();
        let mut groups: Vec<(Vec<(String, String)>, BTreeMap<i64, Bucket>)> = Vec::new();
        let (start, step) = (i128::from(filter.start_nanos), i128::from(step_nanos));
        for (block, cells) in per_block {
            // Each series' group, once per block rather than once per cell.
            let series_group: Vec<usize> = block
                .series
                .iter()
                .map(|s| {
                    let key: Vec<(String, String)> = group_by
                        .iter()
                        .filter_map(|g| series_label(s, g).map(|v| (g.clone(), v.to_owned())))
                        .collect();
                    *group_of.entry(key.clone()).or_insert_with(|| {
                        groups.push((key, BTreeMap::new()));
                        groups.len() - 1
                    })
                })
                .collect();
            for (cell, value) in cells {
                let (Some(s), Some(&g)) = (
                    block.series.get(cell.series as usize),
                    series_group.get(cell.series as usize),
                ) else {
                    continue;
                };
                let t = cell.timestamp;
                let bucket = (start + (i128::from(t) - start).div_euclid(step) * step) as i64;
                let slot = groups[g].1.entry(bucket).or_default();
                slot.0 = slot.0.saturating_add(value);
                if aggregation == Aggregation::Average {
                    slot.1.insert((s.labels.clone(), t, cell.profile));
                }
                let key = match exemplars {
                    Exemplars::Spans if cell.span != 0 => ExemplarKey::Span(cell.span),
                    Exemplars::Profiles => match cell.profile {
                        Some(id) => ExemplarKey::Profile(id),
                        None => continue,
                    },
                    _ => continue,
                };
                let e = slot.2.entry(key).or_insert_with(|| Exemplar {
                    span_id: cell.span,
                    trace_id: cell.trace,
                    profile_id: cell.profile,
                    labels: if cell.profile.is_some() {
                        s.labels.clone()
                    } else {
                        Vec::new()
                    },
                    timestamp_ms: 0,
                    value: 0,
                });
                e.value = e.value.saturating_add(value);
                e.timestamp_ms = e.timestamp_ms.max(t.div_euclid(1_000_000));
            }
        }
        groups.retain(|(_, buckets)| !buckets.is_empty());
        groups.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out: Vec<(i64, SeriesPoints)> = groups
            .into_iter()
            .map(|(labels, buckets)| {
                let total = buckets
                    .values()
                    .fold(0i64, |a, (s, _, _)| a.saturating_add(*s));
                let mut points = Vec::with_capacity(buckets.len());
                let mut point_exemplars = Vec::new();
                for (t, (s, n, found)) in buckets {
                    let v = match aggregation {
                        Aggregation::Sum => s as f64,
                        Aggregation::Average => s as f64 / n.len().max(1) as f64,
                    };
                    points.push((t.div_euclid(1_000_000), v));
                    if exemplars != Exemplars::None {
                        let mut e: Vec<Exemplar> = found.into_values().collect();
                        e.sort_by(|a, b| {
                            b.value
                                .cmp(&a.value)
                                .then(a.span_id.cmp(&b.span_id))
                                .then(a.profile_id.cmp(&b.profile_id))
                        });
                        e.truncate(MAX_EXEMPLARS_PER_POINT);
                        point_exemplars.push(e);
                    }
                }
                (
                    total,
                    SeriesPoints {
                        labels,
                        points,
                        exemplars: point_exemplars,
                    },
                )
            })
            .collect();
        if let Some(limit) = limit.filter(|l| *l > 0 && *l < out.len()) {
            out.sort_by_key(|s| std::cmp::Reverse(s.0));
            out.truncate(limit);
            out.sort_by(|a, b| a.1.labels.cmp(&b.1.labels));
        }
        Ok(out.into_iter().map(|(_, s)| s).collect())
    }
}

/// One profile's (or one span's) total ([`QueryEngine::profile_points`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProfilePoint {
    pub timestamp_nanos: i64,
    pub value: i64,
    /// The span (0: a profile's point).
    pub span_id: u64,
    pub trace_id: Option<[u8; 16]>,
    /// The profile (a profile's point, in blocks that keep profile ids).
    pub profile_id: Option<[u8; 16]>,
}

/// The points of one group of `group_by` label values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PointGroup {
    pub labels: Vec<(String, String)>,
    pub points: Vec<ProfilePoint>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum PointKey {
    Profile(Vec<(String, String)>, i64, Option<[u8; 16]>),
    Span(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum ExemplarKey {
    Span(u64),
    Profile([u8; 16]),
}

/// `batch` with null columns of the samples schema's `missing` columns appended.
fn with_null_columns(batch: RecordBatch, missing: &[usize]) -> Result<RecordBatch> {
    let schema = crate::block::samples_schema();
    let (mut fields, mut arrays): (Vec<_>, Vec<_>) = batch
        .schema()
        .fields()
        .iter()
        .cloned()
        .zip(batch.columns().iter().cloned())
        .unzip();
    for &c in missing {
        let field = schema.field(c);
        arrays.push(arrow::array::new_null_array(
            field.data_type(),
            batch.num_rows(),
        ));
        fields.push(Arc::new(field.clone()));
    }
    Ok(RecordBatch::try_new(
        Arc::new(arrow::datatypes::Schema::new(fields)),
        arrays,
    )?)
}

/// A block's cell of selected samples: a series at a time, split by span and trace or by
/// profile id when exemplars of those are asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cell {
    /// Index into the block's series.
    series: u32,
    timestamp: i64,
    span: u64,
    trace: Option<[u8; 16]>,
    profile: Option<[u8; 16]>,
}

/// What a query would read ([`QueryEngine::analyze`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueryAnalysis {
    pub blocks: u64,
    /// Distinct series selected.
    pub series: u64,
    /// Profiles of the selected series (estimated per block from its share of rows).
    pub profiles: u64,
    /// Sample rows of the selected series.
    pub rows: u64,
    /// Bytes of the selected series' samples, and of the blocks' symbols.
    pub sample_bytes: u64,
    pub symbol_bytes: u64,
    /// Bytes of every block the range and selector reach.
    pub bytes_in_range: u64,
}

/// An error shared by a cache's waiters, as an owned one of the same kind (corruption stays
/// corruption, so the block is still quarantined).
fn unshare(e: Arc<Error>) -> Error {
    match Arc::try_unwrap(e) {
        Ok(e) => e,
        Err(e) if is_corruption(&e) => Error::Corrupt {
            tenant: String::new(),
            block: String::new(),
            reason: e.to_string(),
        },
        Err(e) => Error::Flush {
            kind: match e.kind() {
                ErrorKind::InvalidInput => ErrorKind::Internal,
                k => k,
            },
            message: e.to_string(),
        },
    }
}

/// Whether an error says the object is not there.
fn is_missing(e: &Error) -> bool {
    match e {
        Error::ObjectStore { source, .. } => matches!(source, object_store::Error::NotFound { .. }),
        Error::Parquet(ParquetError::External(inner)) => {
            inner.downcast_ref::<Error>().is_some_and(is_missing)
        }
        Error::Corrupt { reason, .. } => reason.contains("not found"),
        _ => false,
    }
}

/// Runs a read up to three times while the blocks it looked up are compacted away under it.
async fn retrying<T, F, Fut>(mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut attempt = 0;
    loop {
        match f().await {
            Err(Error::BlockGone { .. }) if attempt < 2 => attempt += 1,
            other => return other,
        }
    }
}

/// Unix milliseconds now.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Adds one block's stack values to a name-keyed tree, resolving each stack node once.
fn add_block_stacks(tree: &mut FlameTree, symbols: &SymbolTable, values: &[StackValue]) {
    const UNSEEN: u32 = u32::MAX;
    let s = &symbols.symbols;
    // Block stack node -> tree node, and block function -> tree name id, each resolved once.
    let mut memo = vec![UNSEEN; s.stack_parents.len()];
    if let Some(root) = memo.first_mut() {
        *root = FlameTree::ROOT;
    }
    let mut name_ids = vec![UNSEEN; s.functions.len()];
    let mut path = Vec::new();
    for &StackValue { stack, value, .. } in values {
        if stack as usize >= memo.len() {
            continue;
        }
        // Walk up to the first resolved ancestor, then resolve down.
        path.clear();
        let mut n = stack;
        while memo[n as usize] == UNSEEN {
            path.push(n);
            n = s.stack_parents[n as usize];
        }
        let mut tree_node = memo[n as usize];
        for &node in path.iter().rev() {
            let loc = &s.locations[s.stack_locations[node as usize] as usize];
            // Lines are innermost first; the tree goes root (outermost) first.
            for &f in loc.line_functions.iter().rev() {
                let id = &mut name_ids[f as usize];
                if *id == UNSEEN {
                    *id = tree.name_id(symbols.string(s.functions[f as usize].name));
                }
                tree_node = tree.child_by_id(tree_node, *id);
            }
            memo[node as usize] = tree_node;
        }
        tree.add_value(tree_node, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_stats_read_back_what_they_write() {
        let stats = QueryStats {
            blocks: 3,
            blocks_cached: 2,
            bytes_read: 48_211,
            rows_read: 9_000,
            rollup_ranges: 16,
        };
        assert_eq!(stats.to_string().parse::<QueryStats>(), Ok(stats));
        assert_eq!(
            "blocks=1 newer_field=7".parse::<QueryStats>(),
            Ok(QueryStats {
                blocks: 1,
                ..QueryStats::default()
            })
        );
        assert!("blocks".parse::<QueryStats>().is_err());
        assert!("blocks=x".parse::<QueryStats>().is_err());
        assert_eq!(
            "blocks".parse::<QueryStats>(),
            Err(QueryStatsError::NotNameValue("blocks".into()))
        );
        assert!(matches!(
            "blocks=x".parse::<QueryStats>(),
            Err(QueryStatsError::Value { name, .. }) if name == "blocks"
        ));
    }

    #[test]
    fn coalesce_merges_touching_ranges() {
        assert_eq!(
            coalesce(vec![5..7, 0..2, 2..3, 7..7, 6..9]),
            vec![0..3, 5..9]
        );
    }

    /// 1,000 rows of two series (times 0, 10, 20, … per series) in pages of 10 rows.
    fn paged_metadata() -> ParquetMetaData {
        use crate::block::{Row, RowBatchBuilder, samples_schema};
        let mut batch = RowBatchBuilder::default();
        for series in 0..2u32 {
            for i in 0..500i64 {
                batch.push(&Row {
                    series,
                    timestamp: i * 10,
                    stack: 1,
                    value: 1,
                    span_id: 0,
                    trace_id: None,
                    labels: None,
                    profile_id: None,
                });
            }
        }
        let props = parquet::file::properties::WriterProperties::builder()
            .set_statistics_enabled(parquet::file::properties::EnabledStatistics::Page)
            .set_write_batch_size(10)
            .set_data_page_row_count_limit(10)
            .set_max_row_group_row_count(Some(300))
            .build();
        let mut out = Vec::new();
        let mut w =
            parquet::arrow::ArrowWriter::try_new(&mut out, samples_schema(), Some(props)).unwrap();
        w.write(&batch.finish().unwrap()).unwrap();
        w.close().unwrap();
        ParquetMetaDataReader::new()
            .with_page_index_policy(PageIndexPolicy::Required)
            .parse_and_finish(&Bytes::from(out))
            .unwrap()
    }

    #[test]
    #[allow(clippy::single_range_in_vec_init)] // one time range among the list the reader takes
    fn page_index_narrows_a_series_to_the_pages_of_its_times() {
        let meta = paged_metadata();
        let rows_of =
            |ranges: &[Range<u64>]| -> u64 { ranges.iter().map(|r| r.end - r.start).sum() };
        // Series 1 is rows 500..1000 with times (row - 500) × 10.
        let got = rows_in_times(&meta, 500..1000, &[2500..2600]);
        assert!(got.iter().any(|r| r.contains(&750)) && got.iter().any(|r| r.contains(&759)));
        assert!(rows_of(&got) <= 30, "{got:?}");
        // Two ranges, one of them past the data.
        let got = rows_in_times(&meta, 500..1000, &[0..15, 4990..9000]);
        assert!(got.iter().any(|r| r.contains(&500)) && got.iter().any(|r| r.contains(&999)));
        assert!(rows_of(&got) <= 40, "{got:?}");
        // Every row whose time is in range is kept, whatever the range.
        for (lo, hi) in [(0, 1), (333, 1777), (4995, 5000), (-50, 10_000), (123, 124)] {
            let got = rows_in_times(&meta, 500..1000, &[lo..hi]);
            for row in 500..1000u64 {
                let t = (row as i64 - 500) * 10;
                if (lo..hi).contains(&t) {
                    assert!(
                        got.iter().any(|r| r.contains(&row)),
                        "row {row} of {lo}..{hi}"
                    );
                }
            }
            assert!(got.iter().all(|r| r.start >= 500 && r.end <= 1000));
        }
        // Nothing in range: nothing read.
        assert!(rows_in_times(&meta, 500..1000, &[6000..7000]).is_empty());
    }
}
