//! Stage 3b, series merges: the selected samples summed per cell (a series at a time, split by
//! span or profile when exemplars are asked for), then bucketed into time series
//! ([`QueryEngine::select_series`]) or one point per profile or span for heatmaps
//! ([`QueryEngine::profile_points`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{Array, AsArray};
use arrow::datatypes::{Int64Type, UInt32Type, UInt64Type};
use futures::{StreamExt, TryStreamExt};

use super::frame_filter::{FrameFilter, StackVerdicts};
use super::scan::retrying;
use super::{QueryEngine, SCAN_CONCURRENCY, SampleFilter, series_label};
use crate::caches::report::{count, spawned};
use crate::format::block::col;
use crate::format::meta::PROFILE_TOTALS;
use crate::format::rollup::Source;
use crate::format::series_labels::SeriesLabels;
use crate::metastore::BlockMeta;
use crate::{Error, Result};

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

impl QueryEngine {
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
        self.select_series_of_stacks(
            filter,
            group_by,
            step_nanos,
            aggregation,
            limit,
            exemplars,
            None,
        )
        .await
    }

    /// [`Self::select_series`] of the stacks `frames` keeps (all: `None`): a recording rule's
    /// function filter, Pyroscope's `stack_trace_selector.frame_filter`. Stacks are judged by
    /// their functions' names in each block's symbols, so rows are read from the samples
    /// rather than from the profile totals.
    #[allow(clippy::too_many_arguments)]
    pub async fn select_series_of_stacks(
        &self,
        filter: &SampleFilter,
        group_by: &[String],
        step_nanos: i64,
        aggregation: Aggregation,
        limit: Option<usize>,
        exemplars: Exemplars,
        frames: Option<Arc<FrameFilter>>,
    ) -> Result<Vec<SeriesPoints>> {
        if step_nanos <= 0 {
            return Err(Error::InvalidQuery("step must be positive".into()));
        }
        retrying(|| {
            self.select_series_once(
                filter,
                group_by,
                step_nanos,
                aggregation,
                limit,
                exemplars,
                frames.as_ref(),
            )
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
        let per_block = retrying(|| self.scan_cells(filter, kind, None)).await?;
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
        frames: Option<&Arc<FrameFilter>>,
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
        if frames.is_some() {
            columns.push(col::STACK_ID);
        }
        columns.sort_unstable();
        let columns: Arc<[usize]> = columns.into();
        let shared = Arc::new(filter.clone());
        // Per block: cells and their sums. Rows come in the block's sort order (series, then
        // time), so equal keys are mostly adjacent: they are summed as they come, without
        // hashing; repeats that are not adjacent stay separate cells and are summed into their
        // bucket below. Each block's scan is a task of its own, so blocks decode on every worker.
        let per_block: Vec<Option<(Arc<BlockMeta>, Vec<(Cell, i64)>)>> =
            futures::stream::iter(blocks)
                .map(|(block, series)| {
                    let (engine, filter, columns, frames) = (
                        self.clone(),
                        Arc::clone(&shared),
                        Arc::clone(&columns),
                        frames.cloned(),
                    );
                    let scan = async move {
                        let (engine, filter) = (&engine, &*filter);
                        let window = filter.start_nanos..filter.end_nanos;
                        let window = std::slice::from_ref(&window);
                        count(|s| s.blocks += 1);
                        let mut cells: Vec<(Cell, i64)> = Vec::new();
                        let pos = |c: usize| columns.iter().position(|&x| x == c);
                        // With a frame filter: the block's symbols, native frames named as
                        // flame graphs show them, and whether each stack is kept, judged once
                        // per stack.
                        let judged = match frames.as_deref() {
                            Some(f) => match engine.caches.named_symbols(&block).await {
                                Ok(symbols) => Some((f, symbols, StackVerdicts::default())),
                                Err(e) => {
                                    return engine
                                        .quarantine_or_fail(&block, e)
                                        .await
                                        .map(|()| None);
                                }
                            },
                            None => None,
                        };
                        let mut judged = judged;
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
                                    && frames.is_none()
                            });
                        let source = totals.map_or(Source::Samples, Source::Rollup);
                        let result = engine
                            .read_series(&block, source, &series, window, &columns, |batch| {
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
                                let traces = pos(col::TRACE_ID)
                                    .map(|i| batch.column(i).as_fixed_size_binary());
                                let profiles = pos(col::PROFILE_ID)
                                    .map(|i| batch.column(i).as_fixed_size_binary());
                                let stacks = pos(col::STACK_ID)
                                    .map(|i| batch.column(i).as_primitive::<UInt32Type>());
                                for r in 0..batch.num_rows() {
                                    if let (Some((f, symbols, verdicts)), Some(stacks)) =
                                        (judged.as_mut(), stacks)
                                        && !verdicts.keeps(f, symbols, stacks.value(r))
                                    {
                                        continue;
                                    }
                                    let trace =
                                        traces.filter(|t| !t.is_null(r)).map(|t| t.value(r));
                                    let profile =
                                        profiles.filter(|p| !p.is_null(r)).map(|p| p.value(r));
                                    let span = spans.map(|s| s.value(r));
                                    if !filter.keeps(ts.value(r), span, trace, profile) {
                                        continue;
                                    }
                                    let id = |b: Option<&[u8]>| {
                                        b.and_then(|b| <[u8; 16]>::try_from(b).ok())
                                    };
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
                            Err(e) => engine.quarantine_or_fail(&block, e).await.map(|()| None),
                        }
                    };
                    async move {
                        spawned(scan)
                            .await
                            .map_err(|e| Error::Task(e.to_string()))?
                    }
                })
                .buffer_unordered(SCAN_CONCURRENCY)
                .try_collect()
                .await?;
        Ok(per_block.into_iter().flatten().collect())
    }

    #[allow(clippy::too_many_arguments)]
    async fn select_series_once(
        &self,
        filter: &SampleFilter,
        group_by: &[String],
        step_nanos: i64,
        aggregation: Aggregation,
        limit: Option<usize>,
        exemplars: Exemplars,
        frames: Option<&Arc<FrameFilter>>,
    ) -> Result<Vec<SeriesPoints>> {
        // Averages count profiles: cells per profile id where blocks keep them.
        let scan = if exemplars == Exemplars::None && aggregation == Aggregation::Average {
            Exemplars::Profiles
        } else {
            exemplars
        };
        let per_block = self.scan_cells(filter, scan, frames).await?;
        // group labels -> bucket -> (sum, profiles, span or profile -> exemplar)
        type Bucket = (
            i64,
            HashSet<(SeriesLabels, i64, Option<[u8; 16]>)>,
            HashMap<ExemplarKey, Exemplar>,
        );
        let mut group_of: HashMap<Vec<(String, String)>, usize> = HashMap::new();
        let mut groups: Vec<(Vec<(String, String)>, BTreeMap<i64, Bucket>)> = Vec::new();
        let (start, step) = (i128::from(filter.start_nanos), i128::from(step_nanos));
        for (block, cells) in per_block {
            // Each series' group, once per block rather than once per cell, and only for the
            // series the cells name: a block holds every series of its tenant's partition
            // (thousands in a fleet), a query selects a few.
            let mut series_group: Vec<usize> = vec![usize::MAX; block.series.len()];
            for (cell, value) in cells {
                let Some(s) = block.series.get(cell.series as usize) else {
                    continue;
                };
                let g = match series_group[cell.series as usize] {
                    usize::MAX => {
                        let key: Vec<(String, String)> = group_by
                            .iter()
                            .filter_map(|g| series_label(s, g).map(|v| (g.clone(), v.to_owned())))
                            .collect();
                        let g = match group_of.get(&key) {
                            Some(&g) => g,
                            None => {
                                groups.push((key.clone(), BTreeMap::new()));
                                group_of.insert(key, groups.len() - 1);
                                groups.len() - 1
                            }
                        };
                        series_group[cell.series as usize] = g;
                        g
                    }
                    g => g,
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
                        s.labels.to_vec()
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

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum PointKey {
    Profile(SeriesLabels, i64, Option<[u8; 16]>),
    Span(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum ExemplarKey {
    Span(u64),
    Profile([u8; 16]),
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
