//! The merge: the sources' sorted rows read in batches and merged on a heap into output blocks
//! one level up, their symbols, series and rollups written beside the rows.

use crate::format::block::{Row, RowBatchBuilder, col, series_sort_key};
use crate::format::meta::{BlockMeta, Rollup, Section, SeriesMeta, TOP_LEVEL, encode_footer};
use crate::format::rollup::{FinishedRollup, RollupWriter, Rollups};
use crate::format::series_labels::LabelTableBuilder;
use crate::format::symbols::{SymbolTable, SymbolsBuilder, SymbolsCapacity};
use crate::metastore::{Job, LogCheckpoint};
use crate::{Error, Result};
use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Int64Type, UInt32Type, UInt64Type};
use futures::TryStreamExt;
use parquet::arrow::ArrowWriter;
use parquet::arrow::async_reader::ParquetRecordBatchStream;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::PathBuf;
use std::sync::Arc;

use super::*;

/// One source being merged.
struct Source {
    meta: Arc<BlockMeta>,
    symbols: Arc<SymbolTable>,
    stream: ParquetRecordBatchStream<crate::caches::source::SectionReader>,
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
        let pages = crate::format::tiers::Pages::of_level(level);
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
            .encode_with_table(crate::format::tiers::Pages::of_level(level))?;
        file.write_all(&symbols).map_err(io)?;
        let mut meta = BlockMeta {
            rollups,
            index: Default::default(),
            logs: lineage.logs.clone(),
            received_ms: 0,
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
pub(super) struct Lineage {
    /// The entries the outputs replace ([`BlockMeta::compacted_from`]).
    pub(super) replaced: Vec<String>,
    /// The latest checkpoint of each write-ahead log among the sources'
    /// ([`BlockMeta::logs`]).
    pub(super) logs: Vec<LogCheckpoint>,
}

/// A merge's output file, written and synced, not yet in the store.
pub(super) struct Written {
    pub(super) path: PathBuf,
    pub(super) meta: BlockMeta,
    /// Its symbols as a query reads them: the query engine's cache gets them once the block
    /// is registered.
    pub(super) symbols: Arc<SymbolTable>,
}

impl Compactor {
    /// Merges a job's sources into output files. On failure, names the source that failed when
    /// one did.
    pub(super) async fn merge(
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
                .caches
                .load_named_symbols(meta, NAMING_DEADLINE)
                .await
                .map_err(fail)?;
            let (stream, source_blank) = self
                .caches
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
