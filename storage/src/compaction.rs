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

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Int64Type, UInt32Type, UInt64Type};
use futures::TryStreamExt;
use kiln_otel::model::Labels;
use parquet::arrow::ArrowWriter;
use parquet::arrow::async_reader::ParquetRecordBatchStream;
use serde::{Deserialize, Serialize};

use crate::format::block::{Row, RowBatchBuilder, col, series_sort_key};
use crate::format::meta::{
    BlockMeta, EntryKey, Rollup, Section, SeriesMeta, TOP_LEVEL, encode_footer,
};
use crate::format::rollup::{FinishedRollup, RollupWriter, Rollups};
use crate::format::series_labels::LabelTableBuilder;
use crate::format::symbols::{SymbolTable, SymbolsBuilder, SymbolsCapacity};
use crate::metastore::{Job, LogCheckpoint, Metastore, QueuedBlock};
use crate::metrics::{CompactionLabels, LevelLabels};
use crate::query::{QueryEngine, now_ms};
use crate::store::ObjectStorage;
use crate::{Error, Result};

/// Series in a compaction output from which its series index is built by the compactor (with
/// `warm`), before any query asks: below it the first query builds it in a few milliseconds.
const WARM_INDEX_SERIES: usize = 10_000;

/// Levels whose jobs a compactor's fresh lane runs (L0 segments and L1 blocks merged).
pub const FRESH_LEVELS: Range<u32> = 0..2;
/// Levels whose jobs its bulk lane runs (L2 and top-level blocks merged).
pub const BULK_LEVELS: Range<u32> = 2..u32::MAX;
/// Every level: [`Compactor::compact_all`] and a direct [`crate::Storage::upkeep`].
pub const ALL_LEVELS: Range<u32> = 0..u32::MAX;

/// How long a compaction waits for native frames to be named (a debuginfod fetch); what is not
/// named by then stays as it was, and is named at query time later.
const NAMING_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

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
    /// 2026-11-28).
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
    fn quiet(&self, newest_ms: u64, now_ms: u64) -> bool {
        now_ms >= newest_ms.saturating_add(self.age.as_millis() as u64)
    }

    /// The size tier of an open block.
    fn tier(&self, bytes: u64) -> u32 {
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
            lease: Duration::from_secs(600),
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

/// Plans and runs compaction jobs through the metastore's queue and leases.
#[derive(Debug)]
pub struct Compactor {
    config: CompactionConfig,
    store: ObjectStorage,
    metastore: Arc<dyn Metastore>,
    query: QueryEngine,
    scratch: PathBuf,
    delete_delay: Duration,
    /// Whether the outputs' symbols go into `query`'s cache as they are registered (this
    /// process answers queries).
    warm: bool,
    /// This compactor's name in leases.
    owner: String,
    /// When its planner saw blocks come.
    arrivals: std::sync::Mutex<BlockArrivals>,
}

/// When blocks came to each (tenant, partition, shard), as one planner saw its queue: what
/// decides that a partition is quiet ([`TopPolicy`]).
///
/// A block's ULID time does not say when it came: a merge's output carries its oldest source's
/// time (so that it stays in its partition). Judged by those times, a partition whose fresh
/// blocks had all just been merged up (none left below the top for a moment) looked quiet
/// while its tenant was sending, and its open blocks were packed again and again: on the
/// `month` bench with 1 s segments, 8.09 rows written a row by the top level's merges against
/// 2.65 (docs/performance.md, 2026-11-30). So a block first seen by a planner that has planned
/// before came when it was seen; the blocks of a planner's first queue (a process that just
/// started) came at their ULID time, as far as it can tell.
#[derive(Debug, Default)]
pub struct BlockArrivals {
    /// Whether a queue was seen before.
    primed: bool,
    /// The blocks queued at the last planning, by a hash of (tenant, id).
    seen: std::collections::HashSet<u64>,
    /// The last arrival in each (tenant, partition, shard) with blocks queued, by a hash of
    /// the three.
    last: HashMap<u64, u64>,
}

impl BlockArrivals {
    /// Notes the queue as seen at `now_ms`.
    fn update(&mut self, queued: &[QueuedBlock], now_ms: u64) {
        let mut seen = std::collections::HashSet::with_capacity(queued.len());
        let mut last: HashMap<u64, u64> = HashMap::new();
        for b in queued {
            let hash = hash_of(&[b.tenant.as_bytes(), b.id.as_bytes()]);
            seen.insert(hash);
            let came = if !self.primed || self.seen.contains(&hash) {
                b.created_ms
            } else {
                now_ms
            };
            let at = last.entry(group_of(b)).or_insert(came);
            *at = (*at).max(came);
        }
        // A group with nothing queued is forgotten: whatever it gets next is an arrival.
        for (group, at) in &mut last {
            if let Some(&before) = self.last.get(group) {
                *at = (*at).max(before);
            }
        }
        (self.primed, self.seen, self.last) = (true, seen, last);
    }

    /// When the last block came to `b`'s (tenant, partition, shard).
    fn last(&self, b: &QueuedBlock) -> u64 {
        self.last.get(&group_of(b)).copied().unwrap_or(b.created_ms)
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

/// Groups of queued blocks that should be merged now, per the policies; `arrivals` is the
/// planner's record of when blocks came, updated with `queued`.
///
/// A (tenant, partition, shard) that is quiet (see [`TopPolicy`]) hands the blocks still
/// waiting below the top, other than L0 segments, to the top level's packing: a lone L1 or L2
/// block would otherwise never meet another of its level and stay there, larger per row, for
/// good.
pub fn plan_jobs(
    config: &CompactionConfig,
    queued: Vec<QueuedBlock>,
    arrivals: &mut BlockArrivals,
    now_ms: u64,
) -> Vec<Job> {
    arrivals.update(&queued, now_ms);
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

/// One source being merged.
struct Source {
    meta: Arc<BlockMeta>,
    symbols: Arc<SymbolTable>,
    stream: ParquetRecordBatchStream<crate::query::SectionReaderHandle>,
    rows: Vec<Row>,
    pos: usize,
    /// Source series index -> output series index.
    series_map: Vec<u32>,
}

impl Source {
    /// The current row, loading the next batch when this one is used up.
    async fn peek(&mut self) -> Result<Option<&Row>> {
        while self.pos >= self.rows.len() {
            let Some(batch) = self.stream.try_next().await? else {
                return Ok(None);
            };
            self.rows = batch_rows(&batch, &self.meta)?;
            self.pos = 0;
        }
        Ok(self.rows.get(self.pos))
    }

    /// The (output series, timestamp) key of the current row.
    async fn key(&mut self) -> Result<Option<(u32, i64)>> {
        let Some((series, timestamp)) = self.peek().await?.map(|r| (r.series, r.timestamp)) else {
            return Ok(None);
        };
        Ok(Some((self.series_map[series as usize], timestamp)))
    }
}

fn batch_rows(batch: &RecordBatch, meta: &BlockMeta) -> Result<Vec<Row>> {
    let series = batch.column(col::SERIES_ID).as_primitive::<UInt32Type>();
    let ts = batch.column(col::TIMESTAMP).as_primitive::<Int64Type>();
    let stacks = batch.column(col::STACK_ID).as_primitive::<UInt32Type>();
    let values = batch.column(col::VALUE).as_primitive::<Int64Type>();
    let spans = batch.column(col::SPAN_ID).as_primitive::<UInt64Type>();
    let traces = batch.column(col::TRACE_ID).as_fixed_size_binary();
    let labels = batch.column(col::SAMPLE_LABELS).as_string::<i32>();
    // Version 2 blocks have no profile ids.
    let profiles = (batch.num_columns() > col::PROFILE_ID)
        .then(|| batch.column(col::PROFILE_ID).as_fixed_size_binary());
    // Columns all null (labels and trace ids, mostly) are left out rather than asked row by row.
    let some = |c: &dyn Array| c.null_count() < c.len();
    let labels = some(labels).then_some(labels);
    let traces = some(traces).then_some(traces);
    let profiles = profiles.filter(|&p| some(p));
    let mut out = Vec::with_capacity(batch.num_rows());
    let mut last_labels: Option<Arc<str>> = None;
    for r in 0..batch.num_rows() {
        let s = series.value(r);
        if s as usize >= meta.series.len() || stacks.value(r) as u64 >= meta.stack_nodes {
            return Err(Error::Corrupt {
                tenant: meta.tenant.clone(),
                block: meta.id.clone(),
                reason: "a row points outside the series list or the stack tree".into(),
            });
        }
        let l = labels.filter(|c| !c.is_null(r)).map(|c| {
            let v = c.value(r);
            match &last_labels {
                Some(prev) if &**prev == v => Arc::clone(prev),
                _ => {
                    let a: Arc<str> = Arc::from(v);
                    last_labels = Some(Arc::clone(&a));
                    a
                }
            }
        });
        out.push(Row {
            series: s,
            timestamp: ts.value(r),
            stack: stacks.value(r),
            value: values.value(r),
            span_id: spans.value(r),
            trace_id: traces
                .filter(|c| !c.is_null(r))
                .and_then(|c| <[u8; 16]>::try_from(c.value(r)).ok()),
            labels: l,
            profile_id: profiles
                .filter(|p| !p.is_null(r))
                .and_then(|p| <[u8; 16]>::try_from(p.value(r)).ok()),
        });
    }
    Ok(out)
}

/// One output block being written.
struct Output {
    id: String,
    file_path: PathBuf,
    writer: ArrowWriter<std::fs::File>,
    batch: RowBatchBuilder,
    symbols: SymbolsBuilder,
    /// Per source: source location -> output location.
    locations: Vec<Option<Vec<u32>>>,
    /// Per source: source stack node -> output node (`u32::MAX` = not yet mapped).
    stacks: Vec<Vec<u32>>,
    /// [`Output::map_stack`]'s nodes not yet mapped, kept between calls.
    path: Vec<u32>,
    series: Vec<SeriesMeta>,
    /// Output (job-wide) series index of the last series in `series`.
    last_series: Option<u32>,
    rows: u64,
    rollups: Rollups,
}

const UNMAPPED: u32 = u32::MAX;

/// The stack rollups of a merge of L0 segments judge whether they pay after this fraction
/// (1/N) of the merge's rows ([`crate::format::rollup::RollupWriter::give_up_after`]).
const FRESH_ROLLUP_TRIAL_PARTS: u64 = 8;

impl Output {
    /// A new output whose id carries `created_ms` (the oldest source's time, so the output
    /// stays in its sources' partition).
    /// `resolutions`: the rollups to compute (`rollup::worth_computing` of the job's span);
    /// `symbols`: room to reserve for the output's symbol tables; `level`: the output's;
    /// `blank`: the columns every source left blank.
    #[allow(clippy::too_many_arguments)]
    fn new(
        dir: &std::path::Path,
        sources: usize,
        symbols: SymbolsCapacity,
        config: &CompactionConfig,
        resolutions: &[i64],
        created_ms: u64,
        level: u32,
        blank: crate::format::block::Blank,
    ) -> Result<Self> {
        let pages = crate::format::block::Pages::of_level(level);
        let row_group_rows = config.row_group_rows;
        let id = ulid::Ulid::from_parts(created_ms, ulid::Ulid::generate().random()).to_string();
        let mut rollups = Vec::with_capacity(resolutions.len());
        for (i, &r) in resolutions.iter().enumerate() {
            let path = dir.join(format!("{id}.rollup{i}.part"));
            match RollupWriter::new(r, path, row_group_rows, config.batch_rows, pages) {
                Ok(w) => rollups.push(w),
                Err(e) => {
                    crate::format::rollup::remove_files(rollups.iter().map(RollupWriter::path));
                    return Err(e);
                }
            }
        }
        let file_path = dir.join(format!("{id}.kblk.part"));
        let writer = match crate::format::block::samples_file_writer(
            &file_path,
            crate::format::block::samples_schema(),
            row_group_rows,
            pages,
            blank,
        ) {
            Ok(w) => w,
            Err(e) => {
                crate::format::rollup::remove_files(rollups.iter().map(RollupWriter::path));
                return Err(e);
            }
        };
        Ok(Self {
            id,
            file_path,
            writer,
            batch: RowBatchBuilder::default(),
            symbols: SymbolsBuilder::with_capacity(symbols),
            locations: vec![None; sources],
            stacks: vec![Vec::new(); sources],
            path: Vec::new(),
            series: Vec::new(),
            last_series: None,
            rows: 0,
            rollups: Rollups::new(rollups),
        })
    }

    /// The output stack id of source `src`'s stack id `id` (`None`: the source has no such
    /// stack).
    fn map_stack(&mut self, src: usize, symbols: &SymbolTable, id: u32) -> Option<u32> {
        let node = symbols.stack_node(id)?;
        if self.locations[src].is_none() {
            self.locations[src] = Some(self.symbols.add_table_locations(symbols));
            let mut memo = vec![UNMAPPED; symbols.node_count()];
            if let Some(root) = memo.first_mut() {
                *root = 0;
            }
            self.stacks[src] = memo;
        }
        let s = &symbols.symbols;
        let mut path = std::mem::take(&mut self.path);
        path.clear();
        let mut n = node;
        while self.stacks[src][n as usize] == UNMAPPED {
            path.push(n);
            n = s.stack_parents[n as usize];
        }
        let mut out = self.stacks[src][n as usize];
        let locations = self.locations[src].as_ref().expect("set above");
        for &x in path.iter().rev() {
            out = self
                .symbols
                .child(out, locations[s.stack_locations[x as usize] as usize]);
            self.stacks[src][x as usize] = out;
        }
        self.path = path;
        Some(self.symbols.stack_id(out))
    }

    fn push(
        &mut self,
        job_series: u32,
        series: &SeriesMeta,
        mut row: Row,
        batch_rows: usize,
    ) -> Result<()> {
        if self.last_series != Some(job_series) {
            self.last_series = Some(job_series);
            self.series.push(SeriesMeta {
                labels: series.labels.clone(),
                profile_type: series.profile_type.clone(),
                min_time_nanos: i64::MAX,
                max_time_nanos: i64::MIN,
                first_row: self.rows,
                rows: 0,
            });
        }
        let s = self.series.last_mut().expect("pushed above");
        s.rows += 1;
        s.min_time_nanos = s.min_time_nanos.min(row.timestamp);
        s.max_time_nanos = s.max_time_nanos.max(row.timestamp);
        row.series = (self.series.len() - 1) as u32;
        self.rollups.push(&row)?;
        self.batch.push(&row);
        self.rows += 1;
        if self.batch.len() >= batch_rows {
            self.writer.write(&self.batch.finish()?)?;
        }
        Ok(())
    }

    /// Closes the output: appends symbols and footer to the file. Returns its metadata and its
    /// symbols as a query reads them.
    fn finish(
        mut self,
        template: &BlockMeta,
        level: u32,
        lineage: &Lineage,
        profiles: u64,
    ) -> Result<Written> {
        use std::io::Write;
        if !self.batch.is_empty() {
            self.writer
                .write(&std::mem::take(&mut self.batch).into_batch()?)?;
        }
        let mut file = self.writer.into_inner()?;
        let io = |source| Error::Io {
            path: self.file_path.display().to_string(),
            source,
        };
        let samples_size = file.metadata().map_err(io)?.len();
        // Rollups worth keeping follow the samples.
        let finished: Vec<FinishedRollup> = self.rollups.finish(self.series.len())?;
        let keep = crate::format::rollup::worth_keeping(&finished, self.rows);
        for (r, kept) in finished.iter().zip(&keep) {
            tracing::debug!(
                level,
                resolution = r.resolution,
                rows = r.rows,
                sample_rows = self.rows,
                kept,
                abandoned = r.abandoned,
                "compaction rollup"
            );
        }
        let mut rollups = Vec::new();
        let mut offset = samples_size;
        let appended = (|| {
            for (r, keep) in finished.iter().zip(keep) {
                if !keep {
                    continue;
                }
                let mut part = std::fs::File::open(&r.path)?;
                let size = std::io::copy(&mut part, &mut file)?;
                rollups.push(Rollup {
                    resolution_nanos: r.resolution,
                    section: Section { offset, size },
                    series_rows: r.series_rows.clone(),
                });
                offset += size;
            }
            Ok(())
        })();
        crate::format::rollup::remove_files(finished.iter().map(|r| &r.path));
        appended.map_err(io)?;
        let rollup_end = offset;
        // The series' labels still live in their sources' tables: the output gets one table of
        // its own, each string once, as its decoded entry would hold, and written by id.
        let mut labels = LabelTableBuilder::default();
        for s in &self.series {
            labels.add_labels(&s.labels);
        }
        for (s, l) in self.series.iter_mut().zip(labels.finish()) {
            s.labels = l;
        }
        self.series.shrink_to_fit();
        let stack_nodes = self.symbols.stack_nodes() as u64;
        let (symbols, table) = self
            .symbols
            .encode_with_table(crate::format::block::Pages::of_level(level))?;
        file.write_all(&symbols).map_err(io)?;
        let mut meta = BlockMeta {
            rollups,
            index: Default::default(),
            logs: lineage.logs.clone(),
            format_version: crate::format::meta::write_version(),
            id: self.id.clone(),
            tenant: template.tenant.clone(),
            shard: template.shard,
            level,
            min_time_nanos: self
                .series
                .iter()
                .map(|s| s.min_time_nanos)
                .min()
                .unwrap_or(0),
            max_time_nanos: self
                .series
                .iter()
                .map(|s| s.max_time_nanos)
                .max()
                .unwrap_or(0),
            object_size: 0,
            samples: Section {
                offset: 0,
                size: samples_size,
            },
            symbols: Section {
                offset: rollup_end,
                size: symbols.len() as u64,
            },
            rows: self.rows,
            profiles,
            series: self.series,
            stack_nodes,
            compacted_from: lineage.replaced.clone(),
        };
        let footer = encode_footer(std::slice::from_ref(&meta));
        file.write_all(&footer).map_err(io)?;
        file.sync_all().map_err(io)?;
        meta.object_size = rollup_end + symbols.len() as u64 + footer.len() as u64;
        Ok(Written {
            path: self.file_path,
            meta,
            symbols: Arc::new(table),
        })
    }
}

/// What a merge's outputs say in their footers of where their data came from, for
/// `kiln metastore rebuild`.
struct Lineage {
    /// The entries the outputs replace ([`BlockMeta::compacted_from`]).
    replaced: Vec<String>,
    /// The latest checkpoint of each write-ahead log among the sources'
    /// ([`BlockMeta::logs`]).
    logs: Vec<LogCheckpoint>,
}

/// A merge's output file, written and synced, not yet in the store.
struct Written {
    path: PathBuf,
    meta: BlockMeta,
    /// Its symbols as a query reads them: the query engine's cache gets them once the block
    /// is registered.
    symbols: Arc<SymbolTable>,
}

impl Compactor {
    /// A compactor writing its scratch files under `scratch`; with `warm`, the symbols of what
    /// it writes go into `query`'s cache.
    pub fn new(
        config: CompactionConfig,
        store: ObjectStorage,
        metastore: Arc<dyn Metastore>,
        query: QueryEngine,
        scratch: PathBuf,
        delete_delay: Duration,
        warm: bool,
    ) -> Self {
        Self {
            config,
            store,
            metastore,
            query,
            scratch,
            delete_delay,
            warm,
            owner: format!("compactor-{}", ulid::Ulid::generate()),
            arrivals: std::sync::Mutex::default(),
        }
    }

    /// Plans jobs for what waits in the queue. Returns how many were created.
    pub async fn plan(&self, now_ms: u64) -> Result<usize> {
        self.plan_as(now_ms, false).await
    }

    /// [`Self::plan`]; `first_sight` judges when blocks came by their times alone, as a
    /// planner's first queue is.
    async fn plan_as(&self, now_ms: u64, first_sight: bool) -> Result<usize> {
        if !self.config.enabled {
            return Ok(0);
        }
        let queued = self.metastore.queued_blocks().await?;
        self.store
            .metrics()
            .compaction_queued_blocks
            .set(queued.len() as i64);
        let jobs = if first_sight {
            plan_jobs(&self.config, queued, &mut BlockArrivals::default(), now_ms)
        } else {
            let mut arrivals = self.arrivals.lock().unwrap_or_else(|e| e.into_inner());
            plan_jobs(&self.config, queued, &mut arrivals, now_ms)
        };
        if jobs.is_empty() {
            return Ok(0);
        }
        self.metastore.add_jobs(jobs).await
    }

    /// Leases and runs jobs of `levels` (one lane, see the module's documentation), the
    /// lowest level first, until none is left or the round's budget is spent. Returns how many
    /// completed.
    pub async fn run_pending(&self, levels: Range<u32>) -> Result<usize> {
        if !self.config.enabled {
            return Ok(0);
        }
        let mut done = 0;
        for _ in 0..self.config.jobs_per_round {
            let lease = self.config.lease.as_millis() as u64;
            let Some(job) = self
                .metastore
                .lease_job(&self.owner, now_ms(), lease, levels.clone())
                .await?
            else {
                break;
            };
            if self.run(&job).await? {
                done += 1;
            }
        }
        Ok(done)
    }

    /// Plans and runs jobs until the queue holds nothing due at `now_ms` (tests and `kiln
    /// bench`), judging when blocks came by their times: a merge's output does not hold its
    /// partition's packing back.
    pub async fn compact_all(&self, now_ms: u64) -> Result<usize> {
        let mut done = 0;
        loop {
            let planned = self.plan_as(now_ms, true).await?;
            let ran = self.run_pending(ALL_LEVELS).await?;
            done += ran;
            if planned == 0 && ran == 0 {
                return Ok(done);
            }
        }
    }

    /// Runs one leased job. Returns whether it completed; a corrupt source is quarantined and
    /// the job given up (its other sources go back to the queue).
    #[tracing::instrument(name = "compaction.job", skip_all, fields(job = job.id, tenant = %job.tenant, level = job.level, sources = job.sources.len()))]
    pub async fn run(&self, job: &Job) -> Result<bool> {
        let started = std::time::Instant::now();
        let metrics = self.store.metrics();
        let outcome = |outcome: &'static str| {
            metrics
                .compaction_jobs
                .get_or_create(&CompactionLabels {
                    level: job.level,
                    outcome,
                })
                .inc();
        };
        match self.merge_off_the_workers(job).await {
            Ok(outputs) => {
                let rows: u64 = outputs.iter().map(|o| o.meta.rows).sum();
                let bytes: u64 = outputs.iter().map(|o| o.meta.object_size).sum();
                for o in &outputs {
                    let result = self.store.put_file_durable(&o.meta.path(), &o.path).await;
                    if result.is_ok() && self.warm {
                        self.warm_object(o).await;
                    }
                    let _ = std::fs::remove_file(&o.path);
                    result?;
                }
                // Before the outputs are visible: a query that finds them finds their symbols.
                if self.warm {
                    for o in &outputs {
                        self.query
                            .warm_symbols(&o.meta, Arc::clone(&o.symbols))
                            .await;
                        // And, for a block of many series, its series index, which the entry
                        // carries into the metastore's cache: built here rather than by the
                        // first query after the merge (half a second at a million series).
                        // Small blocks' are left to their first query: building every output's
                        // cost the `small` bench 5 % of its ingest CPU.
                        if o.meta.series.len() >= WARM_INDEX_SERIES {
                            o.meta.series_index();
                        }
                    }
                }
                let delay = self.delete_delay.as_millis() as u64;
                // The outputs' entries go to the metastore, not copies: a million-series
                // entry is a hundred megabytes.
                let written: Vec<(EntryKey, String)> = outputs
                    .iter()
                    .map(|o| (o.meta.key(), o.meta.path()))
                    .collect();
                let metas: Vec<BlockMeta> = outputs.into_iter().map(|o| o.meta).collect();
                match self
                    .metastore
                    .complete_job(job, &self.owner, metas, now_ms(), delay)
                    .await
                {
                    Ok(()) => {
                        outcome("ok");
                        // Their blocks are read from the outputs now.
                        for source in &job.sources {
                            self.query
                                .forget_block(&(
                                    job.tenant.clone(),
                                    source.id.clone(),
                                    source.partition,
                                ))
                                .await;
                        }
                        let level = LevelLabels { level: job.level };
                        metrics
                            .compaction_duration
                            .get_or_create(&level)
                            .observe(started.elapsed().as_secs_f64());
                        metrics
                            .compaction_input_bytes
                            .get_or_create(&level)
                            .inc_by(job.sources.iter().map(|b| b.bytes).sum());
                        metrics
                            .compaction_output_bytes
                            .get_or_create(&level)
                            .inc_by(bytes);
                        metrics
                            .compaction_output_rows
                            .get_or_create(&level)
                            .inc_by(rows);
                        tracing::debug!(tenant = %job.tenant, job = job.id, level = job.level,
                            sources = job.sources.len(), outputs = written.len(), rows, bytes,
                            elapsed_ms = started.elapsed().as_millis() as u64, "compaction job done");
                        Ok(true)
                    }
                    Err(e) => {
                        // Not registered: the outputs are garbage.
                        for (key, path) in &written {
                            self.query.forget_block(key).await;
                            let _ = self.store.delete(path).await;
                        }
                        match e {
                            Error::LeaseLost { .. } => {
                                outcome("lost");
                                Ok(false)
                            }
                            e => {
                                outcome("error");
                                Err(e)
                            }
                        }
                    }
                }
            }
            Err((Some(bad), e)) if crate::query::is_corruption(&e) => {
                tracing::error!(tenant = %bad.tenant, block = %bad.id, error = %e,
                    "compaction source quarantined: it cannot be read");
                outcome("quarantined");
                self.query
                    .counters()
                    .quarantined
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.metastore
                    .quarantine(&bad.tenant, &bad.id, &e.to_string(), now_ms())
                    .await?;
                self.metastore.cancel_job(job).await?;
                Ok(false)
            }
            Err((_, e)) => {
                tracing::warn!(tenant = %job.tenant, job = job.id, error = %e,
                    "compaction job failed; it is retried when its lease expires");
                outcome("error");
                Err(e)
            }
        }
    }

    /// Keeps a small output's object in the query engine's memory, as the writer does with
    /// its segments: the outputs of the first levels hold the last minutes that dashboards
    /// read, and would otherwise be read back from the store by every query of them.
    async fn warm_object(&self, o: &Written) {
        if !self.query.holds_fresh(o.meta.object_size) {
            return;
        }
        match tokio::fs::read(&o.path).await {
            Ok(bytes) => self.query.warm_object(&o.meta, &bytes::Bytes::from(bytes)),
            Err(e) => tracing::debug!(error = %e, "compaction output not kept in memory"),
        }
    }

    /// [`Compactor::merge`] on a thread the runtime has handed its worker's other tasks away
    /// from (`block_in_place`): a merge computes for long stretches between the points where
    /// it yields, and the queries and writes queued on its worker would wait that long; the
    /// operating system shares the cores among threads instead. On a current-thread runtime
    /// (tests) it runs in place.
    async fn merge_off_the_workers(
        &self,
        job: &Job,
    ) -> std::result::Result<Vec<Written>, (Option<Arc<BlockMeta>>, Error)> {
        match tokio::runtime::Handle::try_current() {
            Ok(rt) if rt.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(|| rt.block_on(self.merge(job)))
            }
            _ => self.merge(job).await,
        }
    }

    /// What the outputs' footers say of where their data came from ([`Lineage`]). Replaced:
    /// the job's sources, and the sources' own replaced entries whose objects may still exist.
    /// A source's source outlives it when it is an L0 segment another tenant's entry keeps, or
    /// when deletions run out of order (a crash between two): named here, it is not read back
    /// beside the data it was merged into once the source between has gone.
    async fn lineage(
        &self,
        job: &Job,
        ids: &[String],
        metas: &[Arc<BlockMeta>],
    ) -> Result<Lineage> {
        let logs = crate::format::meta::latest_checkpoints(metas.iter().flat_map(|m| &m.logs));
        let replaced = self.replaced(job, ids, metas).await?;
        Ok(Lineage { replaced, logs })
    }

    async fn replaced(
        &self,
        job: &Job,
        ids: &[String],
        metas: &[Arc<BlockMeta>],
    ) -> Result<Vec<String>> {
        let mut out: Vec<String> = ids
            .iter()
            .map(|id| crate::format::meta::compacted_source(id, job.partition))
            .collect();
        let inherited: Vec<&String> = metas.iter().flat_map(|m| &m.compacted_from).collect();
        if inherited.is_empty() {
            return Ok(out);
        }
        let object = |source: &str| {
            source
                .split_once('@')
                .map_or(source, |(id, _)| id)
                .to_owned()
        };
        let mut objects: Vec<String> = inherited.iter().map(|s| object(s)).collect();
        objects.sort_unstable();
        objects.dedup();
        let alive = self.metastore.known_among(&objects).await?;
        out.extend(
            inherited
                .into_iter()
                .filter(|s| alive.contains(&object(s)))
                .cloned(),
        );
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    /// Merges a job's sources into output files. On failure, names the source that failed when
    /// one did.
    async fn merge(
        &self,
        job: &Job,
    ) -> std::result::Result<Vec<Written>, (Option<Arc<BlockMeta>>, Error)> {
        let ids = job.source_ids();
        let metas: Vec<Arc<BlockMeta>> = self
            .metastore
            .get_blocks(&job.tenant, &ids)
            .await
            .map_err(|e| (None, e))?
            .into_iter()
            .filter(|b| b.partition() == job.partition)
            .collect();
        if metas.len() != ids.len() {
            return Err((
                None,
                Error::Metastore(format!("a source of job {} is gone", job.id)),
            ));
        }
        let lineage = self
            .lineage(job, &ids, &metas)
            .await
            .map_err(|e| (None, e))?;
        std::fs::create_dir_all(&self.scratch).map_err(|source| {
            (
                None,
                Error::Io {
                    path: self.scratch.display().to_string(),
                    source,
                },
            )
        })?;
        // Output series: the union of the sources', in sort order.
        // Each series' sort key made once (it collects and sorts the labels), not per
        // comparison.
        let mut keyed: Vec<_> = metas
            .iter()
            .enumerate()
            .flat_map(|(b, m)| {
                m.series
                    .iter()
                    .enumerate()
                    .map(move |(s, series)| (series_sort_key(series), (b, s)))
            })
            .collect();
        keyed.sort_by(|x, y| x.0.cmp(&y.0));
        let mut series_maps: Vec<Vec<u32>> =
            metas.iter().map(|m| vec![0; m.series.len()]).collect();
        let mut out_series: Vec<SeriesMeta> = Vec::new();
        let mut last: Option<usize> = None;
        for (i, (key, (b, s))) in keyed.iter().enumerate() {
            if last.is_none_or(|l| keyed[l].0 != *key) {
                out_series.push(metas[*b].series[*s].clone());
                last = Some(i);
            }
            series_maps[*b][*s] = (out_series.len() - 1) as u32;
        }
        drop(keyed);
        let mut sources = Vec::with_capacity(metas.len());
        // The columns every source left blank, blank in the outputs too.
        let mut blank = None;
        for (meta, series_map) in metas.iter().zip(series_maps) {
            let fail = |e| (Some(Arc::clone(meta)), e);
            let symbols = self
                .query
                .load_named_symbols(meta, NAMING_DEADLINE)
                .await
                .map_err(fail)?;
            let (stream, source_blank) = self
                .query
                .read_all(meta, self.config.batch_rows)
                .await
                .map_err(fail)?;
            blank = Some(
                blank.map_or(source_blank, |b: crate::format::block::Blank| {
                    b.and(source_blank)
                }),
            );
            sources.push(Source {
                meta: Arc::clone(meta),
                symbols,
                stream,
                rows: Vec::new(),
                pos: 0,
                series_map,
            });
        }
        let mut heap: BinaryHeap<Reverse<(u32, i64, usize)>> = BinaryHeap::new();
        for (i, s) in sources.iter_mut().enumerate() {
            if let Some((series, t)) = s.key().await.map_err(|e| (Some(Arc::clone(&s.meta)), e))? {
                heap.push(Reverse((series, t, i)));
            }
        }
        let local = |e| (None, e);
        let created_ms = metas.iter().map(|m| m.created_ms()).min().unwrap_or(0);
        let profiles: u64 = metas.iter().map(|m| m.profiles).sum();
        let mut outputs: Vec<Written> = Vec::new();
        let resolutions = crate::format::rollup::worth_computing(
            &self.config.rollups,
            metas.iter().map(|m| m.min_time_nanos).min().unwrap_or(0),
            metas.iter().map(|m| m.max_time_nanos).max().unwrap_or(0),
        );
        let n_sources = sources.len();
        let blank = blank.unwrap_or(crate::format::block::Blank::NONE);
        // The output's tables hold at least the largest source's.
        let symbols_room = sources
            .iter()
            .map(|s| s.symbols.capacity_hint())
            .fold(SymbolsCapacity::default(), SymbolsCapacity::max);
        // A merge of L0 segments writes a block that the next level's merge soon replaces, and
        // its stack rollups rarely halve its rows (a series has a profile or two in it): they
        // give up an eighth of the way in where they would not be kept (on `kiln bench`'s
        // `small` preset, none of the L1 blocks' ten-minute rollups was).
        let give_up = (job.level == 0)
            .then(|| metas.iter().map(|m| m.rows).sum::<u64>() / FRESH_ROLLUP_TRIAL_PARTS);
        let new_output = || {
            let mut out = Output::new(
                &self.scratch,
                n_sources,
                symbols_room,
                &self.config,
                &resolutions,
                created_ms,
                (job.level + 1).min(TOP_LEVEL),
                blank,
            )
            .map_err(local)?;
            if let Some(rows) = give_up {
                out.rollups.give_up_after(rows.max(1));
            }
            Ok(out)
        };
        let mut out = new_output()?;
        let mut group: Vec<Row> = Vec::new();
        while let Some(Reverse((series, t, _))) = heap.peek().copied() {
            // Every source's rows of this (series, timestamp), stacks remapped.
            group.clear();
            while let Some(&Reverse((s2, t2, i))) = heap.peek() {
                if (s2, t2) != (series, t) {
                    break;
                }
                heap.pop();
                let src = &mut sources[i];
                let meta = Arc::clone(&src.meta);
                let fail = |e| (Some(Arc::clone(&meta)), e);
                loop {
                    let Some((row_series, row_time)) = src
                        .peek()
                        .await
                        .map_err(fail)?
                        .map(|r| (r.series, r.timestamp))
                    else {
                        break;
                    };
                    if row_time != t || src.series_map[row_series as usize] != series {
                        break;
                    }
                    let mut row = src.rows[src.pos].clone();
                    src.pos += 1;
                    row.stack = out.map_stack(i, &src.symbols, row.stack).ok_or_else(|| {
                        fail(Error::Corrupt {
                            tenant: meta.tenant.clone(),
                            block: meta.id.clone(),
                            reason: format!("a row's stack id {} is not in its symbols", row.stack),
                        })
                    })?;
                    group.push(row);
                }
                if let Some(key) = src.key().await.map_err(fail)? {
                    heap.push(Reverse((key.0, key.1, i)));
                }
            }
            // The group's rows share their timestamp: their order is their stacks', the rest
            // of the key only between rows of one stack.
            group.sort_by(|a, b| a.stack.cmp(&b.stack).then_with(|| a.key().cmp(&b.key())));
            for row in group.drain(..) {
                out.push(
                    series,
                    &out_series[series as usize],
                    row,
                    self.config.batch_rows,
                )
                .map_err(local)?;
            }
            // Cut the output at a series boundary once its symbols are large.
            if out.symbols.stack_nodes() >= self.config.max_output_stack_nodes {
                let next_series = heap.peek().map(|Reverse((s, _, _))| *s);
                if next_series != Some(series) {
                    let next = new_output()?;
                    let done = std::mem::replace(&mut out, next);
                    let p = if outputs.is_empty() { profiles } else { 0 };
                    outputs.push(
                        done.finish(&metas[0], (job.level + 1).min(TOP_LEVEL), &lineage, p)
                            .map_err(local)?,
                    );
                }
            }
        }
        if out.rows > 0 || outputs.is_empty() {
            let p = if outputs.is_empty() { profiles } else { 0 };
            outputs.push(
                out.finish(&metas[0], (job.level + 1).min(TOP_LEVEL), &lineage, p)
                    .map_err(local)?,
            );
        } else {
            let _ = std::fs::remove_file(&out.file_path);
            crate::format::rollup::remove_files(out.rollups.paths());
        }
        if self.warm {
            // Made here, off the query path, for the cache: a block's first flame graph would
            // make it otherwise.
            for o in &outputs {
                o.symbols.name_trie();
            }
        }
        Ok(outputs)
    }
}

/// Labels of a series as a `Labels` set (for tests comparing series).
pub fn series_labels(s: &SeriesMeta) -> Labels {
    Labels::from_pairs(s.labels.to_vec())
}

#[cfg(test)]
mod tests {
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
        }
    }

    /// [`plan_jobs`] by a planner that has not planned before: blocks came at their ULID time.
    fn plan(c: &CompactionConfig, queued: Vec<QueuedBlock>, now_ms: u64) -> Vec<Job> {
        plan_jobs(c, queued, &mut BlockArrivals::default(), now_ms)
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
        let block = |id: u32, level: u32, bytes: u64, created_ms: u64| QueuedBlock {
            level,
            created_ms,
            ..top(id, 1, bytes)
        };
        let mut arrivals = BlockArrivals::default();
        // Two open top-level blocks, and a segment that has just come.
        let open = vec![
            block(0, TOP_LEVEL, 40 * MIB, now - 3 * hour),
            block(1, TOP_LEVEL, 2 * MIB, now - 2 * hour),
        ];
        let mut queued = open.clone();
        queued.push(block(2, 0, 1 << 10, now));
        assert!(plan_jobs(&c, queued, &mut arrivals, now).is_empty());
        // Half an hour on, the segment's rows have gone up the levels into a top-level block
        // that carries its oldest source's time: nothing below the top is queued for now, but
        // the partition got a block, and is not packed.
        let later = now + hour / 2;
        let mut queued = open.clone();
        queued.push(block(3, TOP_LEVEL, 2 * MIB, now - 90 * 60_000));
        assert!(plan_jobs(&c, queued.clone(), &mut arrivals, later).is_empty());
        // Judged by the blocks' times alone (a planner's first queue), it would have been.
        assert_eq!(plan(&c, queued.clone(), later).len(), 1);
        // An hour after that block came, it is.
        let jobs = plan_jobs(&c, queued, &mut arrivals, later + hour);
        assert_eq!(sources(&jobs), [vec!["0001", "0003", "0000"]]);
        // A planner forgets a (tenant, partition, shard) with nothing queued (its blocks all
        // in jobs): what comes to it next came then.
        assert!(plan_jobs(&c, Vec::new(), &mut arrivals, later + hour).is_empty());
        let packed = block(4, TOP_LEVEL, 44 * MIB, now - 3 * hour);
        let late = block(5, TOP_LEVEL, MIB, now);
        let at = later + 2 * hour;
        assert!(plan_jobs(&c, vec![packed.clone(), late.clone()], &mut arrivals, at).is_empty());
        let jobs = plan_jobs(&c, vec![packed, late], &mut arrivals, at + hour);
        assert_eq!(sources(&jobs), [vec!["0005", "0004"]]);
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
}
