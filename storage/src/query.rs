//! The query engine: metastore lookup, series pruning on block metadata, DataFusion scans of
//! the samples Parquet with the label selector, time range and span ids pushed down, and merging
//! of stack trees by frame name.

pub mod pprof;
pub mod tree;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Int64Type, UInt32Type, UInt64Type};
use datafusion::common::ScalarValue;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::functions_aggregate::expr_fn::sum;
use datafusion::logical_expr::{BinaryExpr, Operator};
use datafusion::prelude::{
    Expr, ParquetReadOptions, SessionConfig, SessionContext, col, ident, lit,
};
use futures::{StreamExt, TryStreamExt};
use kiln_otel::model::{Labels, ProfileType};

use crate::block::{columns, label_column};
use crate::metastore::{BlockMeta, Metastore, SeriesMeta};
use crate::selector::{MatchOp, Matcher, Selector};
use crate::store::ObjectStorage;
use crate::symbols::SymbolTable;
use crate::{Error, Result};

pub use tree::FlameTree;

/// Synthetic label that holds a series' profile type id.
pub const PROFILE_TYPE_LABEL: &str = kiln_otel::model::LABEL_PROFILE_TYPE;

const STORE_URL: &str = "kiln://store";
/// Blocks scanned at once by one query.
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
}

impl SampleFilter {
    fn series_matches(&self, s: &SeriesMeta) -> bool {
        s.profile_type == self.profile_type
            && s.min_time_nanos < self.end_nanos
            && s.max_time_nanos >= self.start_nanos
            && self.selector.matches(|name| series_label(s, name))
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
    /// Span exemplars of each point (same order as `points`), largest first; empty unless asked.
    pub exemplars: Vec<Vec<SpanExemplar>>,
}

/// The span that contributed most to a point, for traces-to-profiles links from a graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanExemplar {
    pub span_id: u64,
    pub trace_id: Option<[u8; 16]>,
    /// Unix milliseconds of the latest sample of the span in the step.
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

/// Reads blocks. Cheap to clone.
#[derive(Clone)]
pub struct QueryEngine {
    store: ObjectStorage,
    metastore: Arc<dyn Metastore>,
    ctx: SessionContext,
    symbols: moka::future::Cache<String, Arc<SymbolTable>>,
}

impl std::fmt::Debug for QueryEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryEngine").finish_non_exhaustive()
    }
}

impl QueryEngine {
    /// A query engine over `store`, with a symbols cache of about `cache_bytes`.
    pub fn new(
        store: ObjectStorage,
        metastore: Arc<dyn Metastore>,
        cache_bytes: u64,
    ) -> Result<Self> {
        let mut config = SessionConfig::new()
            .with_target_partitions(2)
            .with_parquet_pruning(true);
        let parquet = &mut config.options_mut().execution.parquet;
        parquet.pushdown_filters = true;
        parquet.reorder_filters = true;
        parquet.enable_page_index = true;
        let ctx = SessionContext::new_with_config(config);
        let url = ObjectStoreUrl::parse(STORE_URL)?;
        ctx.register_object_store(url.as_ref(), Arc::clone(store.inner()));
        let symbols = moka::future::Cache::builder()
            .weigher(|_: &String, t: &Arc<SymbolTable>| {
                u32::try_from(t.estimated_bytes()).unwrap_or(u32::MAX)
            })
            .max_capacity(cache_bytes)
            .build();
        Ok(Self {
            store,
            metastore,
            ctx,
            symbols,
        })
    }

    async fn blocks(&self, tenant: &str, start: i64, end: i64) -> Result<Vec<Arc<BlockMeta>>> {
        self.metastore.query_blocks(tenant, start, end).await
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
        for block in self.blocks(tenant, start, end).await? {
            for s in &block.series {
                if s.min_time_nanos >= end || s.max_time_nanos < start {
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
        for block in self.blocks(tenant, start, end).await? {
            for s in &block.series {
                if s.min_time_nanos < end && s.max_time_nanos >= start {
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
    pub async fn profile_stats(&self, tenant: &str) -> Result<ProfileStats> {
        let blocks = self.blocks(tenant, i64::MIN, i64::MAX).await?;
        if blocks.is_empty() {
            return Ok(ProfileStats::default());
        }
        Ok(ProfileStats {
            data_ingested: true,
            oldest_nanos: blocks.iter().map(|b| b.min_time_nanos).min().unwrap_or(0),
            newest_nanos: blocks.iter().map(|b| b.max_time_nanos).max().unwrap_or(0),
        })
    }

    /// Blocks with at least one series the filter selects.
    async fn candidate_blocks(&self, filter: &SampleFilter) -> Result<Vec<Arc<BlockMeta>>> {
        let blocks = self
            .blocks(&filter.tenant, filter.start_nanos, filter.end_nanos)
            .await?;
        Ok(blocks
            .into_iter()
            .filter(|b| b.series.iter().any(|s| filter.series_matches(s)))
            .collect())
    }

    /// The DataFusion predicate of `filter` for a block; `None` when no row can match.
    fn predicate(block: &BlockMeta, filter: &SampleFilter) -> Option<Expr> {
        let mut expr = col(columns::PROFILE_TYPE)
            .eq(lit(filter.profile_type.clone()))
            .and(col(columns::TIMESTAMP).gt_eq(lit(filter.start_nanos)))
            .and(col(columns::TIMESTAMP).lt(lit(filter.end_nanos)));
        for m in &filter.selector.matchers {
            if m.name == PROFILE_TYPE_LABEL {
                if !m.matches(&filter.profile_type) {
                    return None;
                }
                continue;
            }
            let present = block.series.iter().any(|s| s.label(&m.name).is_some());
            if !present {
                if m.matches("") {
                    continue;
                }
                return None;
            }
            expr = expr.and(matcher_expr(m));
        }
        if !filter.span_ids.is_empty() {
            let spans = filter.span_ids.iter().map(|&s| lit(s)).collect();
            expr = expr.and(col(columns::SPAN_ID).in_list(spans, false));
        }
        if !filter.trace_ids.is_empty() {
            let traces = filter
                .trace_ids
                .iter()
                .map(|t| lit(ScalarValue::FixedSizeBinary(16, Some(t.to_vec()))))
                .collect();
            expr = expr.and(col(columns::TRACE_ID).in_list(traces, false));
        }
        Some(expr)
    }

    /// Scans one block: filter, then `SUM(value)` grouped by `group`.
    async fn scan(
        &self,
        block: &BlockMeta,
        filter: &SampleFilter,
        group: &[&str],
    ) -> Result<Vec<RecordBatch>> {
        let Some(predicate) = Self::predicate(block, filter) else {
            return Ok(Vec::new());
        };
        let path = format!("{STORE_URL}/{}", block.samples_path);
        let df = self
            .ctx
            .read_parquet(path, ParquetReadOptions::default().parquet_pruning(true))
            .await?;
        let df = df.filter(predicate)?.aggregate(
            group.iter().map(|g| col(*g)).collect(),
            vec![sum(col(columns::VALUE))],
        )?;
        Ok(df.collect().await?)
    }

    async fn symbols(&self, block: &BlockMeta) -> Result<Arc<SymbolTable>> {
        let store = self.store.clone();
        let path = block.symbols_path.clone();
        let (tenant, id) = (block.tenant.clone(), block.id.clone());
        self.symbols
            .try_get_with(block.symbols_path.clone(), async move {
                let data = store.get(&path).await?;
                SymbolTable::decode(&data)
                    .map(Arc::new)
                    .map_err(|reason| Error::Corrupt {
                        tenant,
                        block: id,
                        reason,
                    })
            })
            .await
            .map_err(|e: Arc<Error>| match Arc::try_unwrap(e) {
                Ok(e) => e,
                Err(e) => Error::Flush(e.to_string()),
            })
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
        let blocks = self.candidate_blocks(filter).await?;
        let group: &[&str] = if with_labels {
            &[columns::STACK_ID, columns::SAMPLE_LABELS]
        } else {
            &[columns::STACK_ID]
        };
        let mut scans = futures::stream::iter(blocks)
            .map(|block| async move {
                let batches = self.scan(&block, filter, group).await?;
                let mut values = Vec::new();
                for batch in &batches {
                    let stacks = batch.column(0).as_primitive::<UInt32Type>();
                    // DataFusion may read Utf8 as Utf8View: normalize before reading.
                    let labels = match with_labels {
                        true => Some(arrow::compute::cast(batch.column(1), &DataType::Utf8)?),
                        false => None,
                    };
                    let labels = labels.as_ref().map(|l| l.as_string::<i32>());
                    let sums = batch.column(group.len()).as_primitive::<Int64Type>();
                    for i in 0..batch.num_rows() {
                        if sums.is_null(i) {
                            continue;
                        }
                        values.push(StackValue {
                            stack: stacks.value(i),
                            labels: labels
                                .filter(|l| !l.is_null(i))
                                .map(|l| l.value(i).to_owned()),
                            value: sums.value(i),
                        });
                    }
                }
                let symbols = self.symbols(&block).await?;
                Ok::<_, Error>((symbols, values))
            })
            .buffer_unordered(SCAN_CONCURRENCY);
        while let Some(scan) = scans.next().await {
            let (symbols, values) = scan?;
            f(&symbols, &values);
        }
        Ok(())
    }

    /// The merged stack tree of the selected samples.
    pub async fn merge_tree(&self, filter: &SampleFilter) -> Result<FlameTree> {
        let mut tree = FlameTree::default();
        self.for_each_block_stacks(filter, false, |symbols, values| {
            add_block_stacks(&mut tree, symbols, values)
        })
        .await?;
        Ok(tree)
    }

    /// The selected samples merged into one pprof profile.
    pub async fn merge_pprof(
        &self,
        filter: &SampleFilter,
    ) -> Result<kiln_proto::google::v1::Profile> {
        let profile_type = ProfileType::parse(&filter.profile_type).ok_or_else(|| {
            Error::InvalidQuery(format!("invalid profile type {:?}", filter.profile_type))
        })?;
        let mut builder = pprof::PprofBuilder::new(&profile_type);
        self.for_each_block_stacks(filter, true, |symbols, values| {
            builder.add_block(symbols, values)
        })
        .await?;
        Ok(builder.finish(filter.start_nanos, filter.end_nanos))
    }

    /// Time series of the selected samples: one series per distinct value set of `group_by`,
    /// points every `step_nanos`, aligned to `start`.
    pub async fn select_series(
        &self,
        filter: &SampleFilter,
        group_by: &[String],
        step_nanos: i64,
        aggregation: Aggregation,
        limit: Option<usize>,
        span_exemplars: bool,
    ) -> Result<Vec<SeriesPoints>> {
        if step_nanos <= 0 {
            return Err(Error::InvalidQuery("step must be positive".into()));
        }
        let blocks = self.candidate_blocks(filter).await?;
        let per_block: Vec<(Arc<BlockMeta>, Vec<RecordBatch>)> = futures::stream::iter(blocks)
            .map(|block| async move {
                let group: &[&str] = if span_exemplars {
                    &[
                        columns::SERIES_ID,
                        columns::TIMESTAMP,
                        columns::SPAN_ID,
                        columns::TRACE_ID,
                    ]
                } else {
                    &[columns::SERIES_ID, columns::TIMESTAMP]
                };
                let batches = self.scan(&block, filter, group).await?;
                Ok::<_, Error>((block, batches))
            })
            .buffer_unordered(SCAN_CONCURRENCY)
            .try_collect()
            .await?;
        // group labels -> bucket -> (sum, profile count, span -> exemplar)
        type Bucket = (i64, HashSet<(usize, u32, i64)>, HashMap<u64, SpanExemplar>);
        let mut groups: BTreeMap<Vec<(String, String)>, BTreeMap<i64, Bucket>> = BTreeMap::new();
        for (b, (block, batches)) in per_block.iter().enumerate() {
            for batch in batches {
                let series = batch.column(0).as_primitive::<UInt32Type>();
                let times = batch.column(1).as_primitive::<Int64Type>();
                let spans = span_exemplars.then(|| batch.column(2).as_primitive::<UInt64Type>());
                let traces = span_exemplars.then(|| batch.column(3).as_fixed_size_binary());
                let sums = batch
                    .column(batch.num_columns() - 1)
                    .as_primitive::<Int64Type>();
                for i in 0..batch.num_rows() {
                    let Some(s) = block.series.get(series.value(i) as usize) else {
                        continue;
                    };
                    let key: Vec<(String, String)> = group_by
                        .iter()
                        .filter_map(|g| series_label(s, g).map(|v| (g.clone(), v.to_owned())))
                        .collect();
                    let t = i128::from(times.value(i));
                    let (start, step) = (i128::from(filter.start_nanos), i128::from(step_nanos));
                    let bucket = (start + (t - start).div_euclid(step) * step) as i64;
                    let slot = groups.entry(key).or_default().entry(bucket).or_default();
                    let value = sums.value(i);
                    slot.0 = slot.0.saturating_add(value);
                    // One profile = one (block, series, timestamp); averages divide by these.
                    slot.1.insert((b, series.value(i), times.value(i)));
                    if let Some(span) = spans.map(|s| s.value(i)).filter(|s| *s != 0) {
                        let trace = traces
                            .filter(|t| !t.is_null(i))
                            .and_then(|t| <[u8; 16]>::try_from(t.value(i)).ok());
                        let e = slot.2.entry(span).or_insert(SpanExemplar {
                            span_id: span,
                            trace_id: trace,
                            timestamp_ms: 0,
                            value: 0,
                        });
                        e.value = e.value.saturating_add(value);
                        e.timestamp_ms = e.timestamp_ms.max(times.value(i).div_euclid(1_000_000));
                    }
                }
            }
        }
        let mut out: Vec<(i64, SeriesPoints)> = groups
            .into_iter()
            .map(|(labels, buckets)| {
                let total = buckets
                    .values()
                    .fold(0i64, |a, (s, _, _)| a.saturating_add(*s));
                let mut points = Vec::with_capacity(buckets.len());
                let mut exemplars = Vec::new();
                for (t, (s, n, spans)) in buckets {
                    let v = match aggregation {
                        Aggregation::Sum => s as f64,
                        Aggregation::Average => s as f64 / n.len().max(1) as f64,
                    };
                    points.push((t.div_euclid(1_000_000), v));
                    if span_exemplars {
                        let mut e: Vec<SpanExemplar> = spans.into_values().collect();
                        e.sort_by(|a, b| b.value.cmp(&a.value).then(a.span_id.cmp(&b.span_id)));
                        e.truncate(MAX_EXEMPLARS_PER_POINT);
                        exemplars.push(e);
                    }
                }
                (
                    total,
                    SeriesPoints {
                        labels,
                        points,
                        exemplars,
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

    /// Label sets of `tenant`, for tests and the admin API.
    pub async fn all_labels(&self, tenant: &str) -> Result<Vec<Labels>> {
        let series = self
            .matching_series(tenant, &[], i64::MIN, i64::MAX)
            .await?;
        Ok(series.into_iter().map(Labels::from_pairs).collect())
    }
}

/// DataFusion predicate for one matcher over a label column (null = absent = "").
fn matcher_expr(m: &Matcher) -> Expr {
    let column = ident(label_column(&m.name));
    let matches_empty = m.matches("");
    let positive = match m.op {
        MatchOp::Equal if m.value.is_empty() => return column.is_null(),
        MatchOp::Equal => column.clone().eq(lit(m.value.clone())),
        MatchOp::NotEqual if m.value.is_empty() => return column.is_not_null(),
        MatchOp::NotEqual => column.clone().not_eq(lit(m.value.clone())),
        MatchOp::Regex => Expr::BinaryExpr(BinaryExpr::new(
            Box::new(column.clone()),
            Operator::RegexMatch,
            Box::new(lit(m.anchored_pattern())),
        )),
        MatchOp::NotRegex => Expr::BinaryExpr(BinaryExpr::new(
            Box::new(column.clone()),
            Operator::RegexNotMatch,
            Box::new(lit(m.anchored_pattern())),
        )),
    };
    if matches_empty {
        column.is_null().or(positive)
    } else {
        positive
    }
}

/// The summed value of one stack (and per-sample label set) of a block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackValue {
    pub stack: u32,
    /// Encoded per-sample labels (`block::encode_sample_labels`), when asked for.
    pub labels: Option<String>,
    pub value: i64,
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
