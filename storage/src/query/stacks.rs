//! Stage 3a, stack merges: each selected block's values summed by stack id (from the block's
//! rollups where whole buckets fit the range), then merged across blocks by frame name into a
//! flame tree ([`QueryEngine::merge_tree`]) or a pprof profile ([`QueryEngine::merge_pprof`]).

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, TryLockError};

use arrow::array::{Array, AsArray};
use arrow::datatypes::{Int64Type, UInt32Type, UInt64Type};
use futures::StreamExt;
use kiln_otel::model::ProfileType;
use tracing::Instrument;

use super::scan::retrying;
use super::{FlameTree, QueryEngine, SCAN_CONCURRENCY, SampleFilter, pprof};
use crate::caches::cache::unshare;
use crate::caches::report::{count, options, spawned};
use crate::format::block::col;
use crate::format::meta::{EntryKey, PROFILE_TOTALS};
use crate::format::rollup::{Source, plan_series};
use crate::format::symbols::SymbolTable;
use crate::metastore::BlockMeta;
use crate::{Error, Result};

/// The summed value of one stack (and per-sample label set) of a block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackValue {
    pub stack: u32,
    /// Encoded per-sample labels (`block::encode_sample_labels`), when asked for.
    pub labels: Option<String>,
    pub value: i64,
}

impl QueryEngine {
    /// Scans each selected block for the summed value of every selected stack (and per-sample
    /// label set, with `with_labels`), each block on a task of its own so the runtime's workers
    /// decode blocks in parallel. `per_block` runs on that task with the block's symbols and
    /// values; `on_block` gets its result on this one, as scans complete. At most
    /// [`SCAN_CONCURRENCY`] blocks are held at once.
    async fn scan_block_stacks<T: Send + 'static>(
        &self,
        filter: &SampleFilter,
        with_labels: bool,
        per_block: impl Fn(Arc<SymbolTable>, Arc<[StackValue]>) -> T + Send + Sync + 'static,
        mut on_block: impl FnMut(T),
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
        let columns: Arc<[usize]> = columns.into();
        let shared = Arc::new(filter.clone());
        let per_block = Arc::new(per_block);
        let mut scans = futures::stream::iter(blocks)
            .map(|(block, series)| {
                let (engine, filter, columns, per_block) = (
                    self.clone(),
                    Arc::clone(&shared),
                    Arc::clone(&columns),
                    Arc::clone(&per_block),
                );
                let scan = async move {
                    count(|s| s.blocks += 1);
                    let result = async {
                        let symbols = engine.caches.named_symbols(&block).await?;
                        let values = engine
                            .cached_block_stacks(&block, series, &filter, &columns, with_labels)
                            .await?;
                        Ok::<_, Error>((symbols, values))
                    }
                    .await;
                    match result {
                        Ok((symbols, values)) => Ok(Some(per_block(symbols, values))),
                        Err(e) => engine.quarantine_or_fail(&block, e).await.map(|()| None),
                    }
                };
                async move {
                    spawned(scan)
                        .await
                        .map_err(|e| Error::Task(e.to_string()))?
                }
            })
            .buffer_unordered(SCAN_CONCURRENCY);
        async {
            while let Some(scan) = scans.next().await {
                if let Some(out) = scan? {
                    on_block(out);
                }
            }
            Ok(())
        }
        .instrument(scan)
        .await
    }

    pub(crate) async fn block_stacks(
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
        let mut dense = DenseSums::new(block, if with_labels { 0 } else { block.stack_nodes });
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
                    dense.add(stack, value)?;
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
        Ok(dense.finish())
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
        let mut dense = DenseSums::new(block, block.stack_nodes);
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
                        dense.add(stacks.value(r), values.value(r))?;
                    }
                }
                Ok(())
            })
            .await?;
        }
        Ok(Some(dense.finish()))
    }

    /// The merged stack tree of the selected samples.
    #[tracing::instrument(name = "query.merge_tree", skip_all, fields(tenant = %filter.tenant, profile_type = %filter.profile_type))]
    pub async fn merge_tree(&self, filter: &SampleFilter) -> Result<FlameTree> {
        retrying(|| async {
            // Blocks are added to the tree on the scans' tasks, into one tree per worker thread
            // (the fleet-wide flame graph spent half its time adding blocks on this one task),
            // and the few trees merged at the end.
            let folds = Arc::new(Folds::<FlameTree>::per_worker());
            let into = Arc::clone(&folds);
            self.scan_block_stacks(
                filter,
                false,
                move |symbols, values| {
                    // Made (once per cached table) before a tree is taken.
                    symbols.name_trie();
                    into.fold(|tree| add_block_stacks(tree, &symbols, &values))
                },
                |()| {},
            )
            .await?;
            Ok(FlameTree::merged(folds.take()))
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
        self.merge_pprof_selected(filter, call_site, None).await
    }

    /// [`Self::merge_pprof_at`] of the stacks `frame_filter` keeps, too.
    pub async fn merge_pprof_selected(
        &self,
        filter: &SampleFilter,
        call_site: &[String],
        frame_filter: Option<std::sync::Arc<super::frame_filter::FrameFilter>>,
    ) -> Result<kiln_proto::google::v1::Profile> {
        let profile_type = ProfileType::parse(&filter.profile_type).ok_or_else(|| {
            Error::InvalidQuery(format!("invalid profile type {:?}", filter.profile_type))
        })?;
        retrying(|| async {
            let mut builder = pprof::PprofBuilder::new(&profile_type)
                .with_call_site(call_site.to_vec())
                .with_frame_filter(frame_filter.clone());
            self.scan_block_stacks(
                filter,
                true,
                |symbols, values| (symbols, values),
                |(symbols, values)| builder.add_block(&symbols, &values),
            )
            .await?;
            Ok(builder.finish(filter.start_nanos, filter.end_nanos))
        })
        .await
    }
}

/// Accumulators that tasks running on the runtime's workers fold into at once: one per worker
/// thread, each taken by whichever task finds it free.
struct Folds<A> {
    slots: Box<[Mutex<A>]>,
    next: AtomicUsize,
}

impl<A: Default> Folds<A> {
    /// One accumulator per worker thread of the current runtime.
    fn per_worker() -> Self {
        let workers = tokio::runtime::Handle::try_current()
            .map(|h| h.metrics().num_workers())
            .unwrap_or(1)
            .max(1);
        Self {
            slots: (0..workers).map(|_| Mutex::default()).collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// Runs `f` on a free accumulator, or waits for one when every one is taken.
    fn fold(&self, f: impl FnOnce(&mut A)) {
        let n = self.slots.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        for i in 0..n {
            match self.slots[(start + i) % n].try_lock() {
                Ok(mut a) => return f(&mut a),
                Err(TryLockError::Poisoned(p)) => return f(&mut p.into_inner()),
                Err(TryLockError::WouldBlock) => {}
            }
        }
        f(&mut self.slots[start]
            .lock()
            .unwrap_or_else(PoisonError::into_inner))
    }

    /// The accumulators, each left empty.
    fn take(&self) -> Vec<A> {
        self.slots
            .iter()
            .map(|s| std::mem::take(&mut *s.lock().unwrap_or_else(PoisonError::into_inner)))
            .collect()
    }
}

/// Arrays of [`DenseSums`] kept for the next scans, all zero: at most this many entries in all
/// (16 MiB), none of a block of more nodes than that.
const POOLED_ENTRIES: usize = 2 << 20;

static DENSE_POOL: Mutex<Vec<Vec<i64>>> = Mutex::new(Vec::new());

/// One block's values summed by stack id: an array indexed by stack id, taken from (and given
/// back to) a pool of zeroed arrays, and the ids written. A query selecting a few of a large
/// block's series neither zeroes nor reads the block's whole stack tree: a packed `day`
/// block's array was a tenth of the unaligned hour's CPU (its allocation's zeroing and page
/// faults, and the scan for non-zero sums).
struct DenseSums<'a> {
    block: &'a BlockMeta,
    values: Vec<i64>,
    /// Ids whose sum was zero when written (so each written id at least once).
    touched: Vec<u32>,
    nodes: usize,
}

impl<'a> DenseSums<'a> {
    /// Sums for `block`'s stack ids below `nodes`.
    fn new(block: &'a BlockMeta, nodes: u64) -> Self {
        let nodes = nodes as usize;
        let pooled = if nodes > 0 && nodes <= POOLED_ENTRIES {
            let mut pool = DENSE_POOL.lock().unwrap_or_else(PoisonError::into_inner);
            // The smallest array that fits, else the largest (grown below).
            let best = (0..pool.len())
                .filter(|&i| pool[i].len() >= nodes)
                .min_by_key(|&i| pool[i].len())
                .or_else(|| (0..pool.len()).max_by_key(|&i| pool[i].len()));
            best.map(|i| pool.swap_remove(i))
        } else {
            None
        };
        let mut values = pooled.unwrap_or_default();
        if values.len() < nodes {
            values.resize(nodes, 0);
        }
        Self {
            block,
            values,
            touched: Vec::new(),
            nodes,
        }
    }

    fn add(&mut self, stack: u32, value: i64) -> Result<()> {
        let Some(slot) = self.values[..self.nodes].get_mut(stack as usize) else {
            return Err(Error::Corrupt {
                tenant: self.block.tenant.clone(),
                block: self.block.id.clone(),
                reason: format!("stack id {stack} beyond the stack tree"),
            });
        };
        if *slot == 0 {
            self.touched.push(stack);
        }
        *slot = slot.saturating_add(value);
        Ok(())
    }

    /// The non-zero sums, by stack id; the array goes back to the pool zeroed.
    fn finish(mut self) -> Vec<StackValue> {
        let value = |stack: u32, value: i64| StackValue {
            stack,
            labels: None,
            value,
        };
        let out: Vec<StackValue> = if self.touched.len().saturating_mul(8) < self.nodes {
            self.touched.sort_unstable();
            self.touched.dedup();
            self.touched
                .iter()
                .filter_map(|&s| {
                    let v = std::mem::take(&mut self.values[s as usize]);
                    (v != 0).then(|| value(s, v))
                })
                .collect()
        } else {
            let written = &mut self.values[..self.nodes];
            let out = written
                .iter()
                .enumerate()
                .filter(|(_, v)| **v != 0)
                .map(|(s, &v)| value(s as u32, v))
                .collect();
            written.fill(0);
            out
        };
        let mut pool = DENSE_POOL.lock().unwrap_or_else(PoisonError::into_inner);
        let held: usize = pool.iter().map(Vec::len).sum();
        if held + self.values.len() <= POOLED_ENTRIES {
            pool.push(std::mem::take(&mut self.values));
        }
        out
    }
}

/// Adds one block's stack values to a name-keyed tree, through the block's [`NameTrie`]
/// (made once per table): each value goes to its stack's trie node, the trie is summed from
/// its leaves (a parent's index is below its children's), and each trie node with values below
/// it is resolved once to its tree node and adds its self value and total there: O(values +
/// trie nodes), with a name looked up once per distinct name of the block.
///
/// [`NameTrie`]: crate::format::symbols::NameTrie
fn add_block_stacks(tree: &mut FlameTree, symbols: &SymbolTable, values: &[StackValue]) {
    const UNSEEN: u32 = u32::MAX;
    let trie = symbols.name_trie();
    let m = trie.len();
    let mut self_values = vec![0i64; m];
    for &StackValue { stack, value, .. } in values {
        if let Some(&node) = trie.of_stack.get(stack as usize) {
            let slot = &mut self_values[node as usize];
            *slot = slot.saturating_add(value);
        }
    }
    // Totals, and whether a node's subtree holds any value (a total can be zero when values of
    // both signs cancel).
    let mut totals = self_values.clone();
    let mut live: Vec<bool> = self_values.iter().map(|v| *v != 0).collect();
    for j in (1..m).rev() {
        let p = trie.parents[j] as usize;
        totals[p] = totals[p].saturating_add(totals[j]);
        live[p] |= live[j];
    }
    // Trie node -> tree node, and trie name -> tree name id, each resolved once.
    let mut memo = vec![UNSEEN; m];
    memo[0] = FlameTree::ROOT;
    tree.add_counts(FlameTree::ROOT, self_values[0], totals[0]);
    let mut name_ids = vec![UNSEEN; trie.names.len()];
    for j in 1..m {
        if !live[j] {
            continue;
        }
        // The parent's subtree holds this one's, so it is live and resolved.
        let parent = memo[trie.parents[j] as usize];
        let name = trie.names_of[j] as usize;
        if name_ids[name] == UNSEEN {
            name_ids[name] =
                tree.name_id_hashed(symbols.string(trie.names[name]), trie.name_hashes[name]);
        }
        let node = tree.child_by_id(parent, name_ids[name]);
        memo[j] = node;
        tree.add_counts(node, self_values[j], totals[j]);
    }
}

/// Key of a block's cached partial result: the block and the selected series (indices into its
/// series list). Blocks never change, so an entry stays true until it is evicted.
pub(crate) type ResultKey = (EntryKey, Arc<[u32]>);

impl QueryEngine {
    /// [`Self::block_stacks`], from the partial-result cache when the query takes every sample
    /// of the selected series (its range covers them, no span, trace or label split).
    pub(crate) async fn cached_block_stacks(
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
        self.caches
            .counters
            .results_lookups
            .fetch_add(1, Ordering::Relaxed);
        let computed = std::sync::atomic::AtomicBool::new(false);
        let key: ResultKey = (block.key(), series.into());
        let values = self
            .results
            .try_get_with_by_ref(&key, async {
                computed.store(true, Ordering::Relaxed);
                self.caches
                    .counters
                    .results_misses
                    .fetch_add(1, Ordering::Relaxed);
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
}

#[cfg(test)]
mod tests {
    use kiln_otel::model::{Function, Line, Location, Symbols as ProfileSymbols};
    use proptest::prelude::*;

    use super::*;
    use crate::format::symbols::SymbolsBuilder;

    proptest! {
        /// Sums through pooled arrays equal plain sums, block after block of other sizes: an
        /// array comes back zeroed whatever cancelled out and whichever way it was read.
        #[test]
        fn dense_sums_reused_across_blocks_equal_plain_sums(
            blocks in prop::collection::vec(
                (1u64..3000, prop::collection::vec((0u32..3200, -5i64..20), 0..400)),
                1..6,
            ),
        ) {
            let block = crate::testing::synthetic_block("t", 1, 0);
            for (nodes, adds) in blocks {
                let mut dense = DenseSums::new(&block, nodes);
                let mut want = BTreeMap::<u32, i64>::new();
                for (stack, value) in adds {
                    let added = dense.add(stack, value);
                    if u64::from(stack) < nodes {
                        prop_assert!(added.is_ok());
                        *want.entry(stack).or_default() += value;
                    } else {
                        prop_assert!(added.is_err(), "stack {} of {} nodes", stack, nodes);
                    }
                }
                let got: Vec<(u32, i64)> =
                    dense.finish().into_iter().map(|v| (v.stack, v.value)).collect();
                let want: Vec<(u32, i64)> = want.into_iter().filter(|(_, v)| *v != 0).collect();
                prop_assert_eq!(got, want);
            }
        }
    }

    /// Locations of a block: one per name; `ab` holds `b` inlined into `a` (lines innermost
    /// first) and `none` has no line at all, as an unsymbolized frame can.
    fn locations() -> (ProfileSymbols, Vec<Vec<&'static str>>) {
        let names = ["main", "a", "b", "c"];
        let mut s = ProfileSymbols::default();
        for n in names {
            s.functions.push(Function {
                name: n.into(),
                ..Default::default()
            });
        }
        let mut frames: Vec<Vec<&str>> = Vec::new();
        for (i, n) in names.iter().enumerate() {
            s.locations.push(Location {
                lines: kiln_otel::model::smallvec![Line {
                    function: i as u32,
                    line: 1,
                }],
                ..Default::default()
            });
            frames.push(vec![n]);
        }
        s.locations.push(Location {
            lines: kiln_otel::model::smallvec![
                Line {
                    function: 2,
                    line: 2,
                },
                Line {
                    function: 1,
                    line: 3,
                },
            ],
            ..Default::default()
        });
        frames.push(vec!["a", "b"]);
        s.locations.push(Location {
            address: 0x1234,
            ..Default::default()
        });
        frames.push(vec![]);
        (s, frames)
    }

    proptest! {
        /// Summing a block up its trie gives every tree node the self value and total of adding
        /// each stack on its own, walking to the root.
        #[test]
        fn block_stacks_agree_with_a_walk_per_stack(
            stacks in prop::collection::vec(
                (prop::collection::vec(0usize..6, 0..6), -50i64..100), 1..30),
            other_block in prop::collection::vec(
                (prop::collection::vec(0usize..6, 0..6), 1i64..100), 0..10),
        ) {
            let (symbols, frames) = locations();
            let mut tree = FlameTree::default();
            let mut naive = FlameTree::default();
            for input in [&stacks, &other_block] {
                let mut b = SymbolsBuilder::default();
                let map = b.add_locations(&symbols);
                let mut values = Vec::new();
                for (root_first, value) in input.iter() {
                    let stack = b.add_stack(root_first.iter().rev().map(|&l| map[l]));
                    values.push(StackValue { stack, labels: None, value: *value });
                    let names = root_first.iter().flat_map(|&l| frames[l].iter().copied());
                    naive.add_stack(names, *value);
                }
                let table = SymbolTable::decode(&b.encode().unwrap()).unwrap();
                add_block_stacks(&mut tree, &table, &values);
            }
            prop_assert_eq!(tree.total(), naive.total());
            let mut nodes = vec![(FlameTree::ROOT, FlameTree::ROOT)];
            while let Some((t, n)) = nodes.pop() {
                prop_assert_eq!(tree.node_total(t), naive.node_total(n));
                prop_assert_eq!(tree.self_value(t), naive.self_value(n));
                for &c in naive.children(n) {
                    let name = naive.name_str(naive.node_name(c));
                    let id = tree.find_name(name);
                    match id.and_then(|id| tree.find_child(t, id)) {
                        Some(tc) => nodes.push((tc, c)),
                        // A subtree whose values cancel need not exist.
                        None => prop_assert_eq!(naive.node_total(c), 0),
                    }
                }
            }
        }
    }
}
