//! Rollups: pre-aggregated copies of a compacted block's samples at coarser time resolutions
//! (the segment trees of the Pyroscope storage seed, ADR 0007), so a flame graph or a series
//! over a long range reads a few rows per series and bucket instead of every sample.
//!
//! ```text
//!  compaction output rows (series, timestamp, stack, value), in sort order
//!      ├─► samples section (every row)
//!      ├─► rollup "profile totals": Σ value per (series, timestamp, profile id) → series queries
//!      ├─► rollup 10 min: Σ value per (series, 10-min bucket, stack)           ┐
//!      │     └─► rollup 1 h:    Σ value per (series, hour, stack)               ├─► flame graphs
//!      │           └─► rollup 1 d:    Σ value per (series, day, stack)         ┘
//! ```
//!
//! A stack rollup whose resolution is a multiple of the one before it is summed from that one's
//! rows as they are written, not from every sample again ([`Rollups`]): an hour's buckets are
//! whole 10-minute buckets, so the sums are the same and the hour reads a fraction of the rows.
//!
//! A query splits each series' time range: the buckets of the coarsest resolution that lie
//! wholly inside it come from that rollup, what is left at the edges from the next finer one,
//! and the rest from the samples ([`plan_series`]). Buckets are aligned to the Unix epoch, so a
//! bucket is either wholly inside a range or not; as far as a series' own data goes, a range
//! reaching past the series' first or last sample covers the bucket holding it. The answer is
//! exactly the samples' (asserted by `storage/tests/rollups.rs`).
//!
//! A resolution is kept only where it halves the rows of the next finer level (a block of
//! mostly distinct stacks would gain nothing from it), so rollups never cost more than half
//! of what they save a query from reading.

use std::ops::Range;
use std::path::{Path, PathBuf};

use parquet::arrow::ArrowWriter;

use crate::Result;
use crate::format::block::{
    Blank, Pages, Row, RowBatchBuilder, profile_totals_schema, samples_file_writer, samples_schema,
};
use crate::format::meta::{PROFILE_TOTALS, SeriesMeta};

#[cfg(test)]
mod tests;

const MINUTE: i64 = 60 * 1_000_000_000;

/// Resolutions compaction writes, finest first: profile totals, 10 minutes, 1 hour, 1 day.
pub const DEFAULT_RESOLUTIONS: [i64; 4] = [PROFILE_TOTALS, 10 * MINUTE, 60 * MINUTE, 1440 * MINUTE];

/// Where rows for one time interval of a series are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    Samples,
    /// Index into the block's rollups.
    Rollup(usize),
}

/// Splits `[start, end)` of `series` into intervals, each read from `Source`: the coarsest of
/// `levels` (rollup index and resolution, coarsest first, stacks only) whose buckets lie wholly
/// inside what is left, the samples for the rest. A rollup interval is a range of bucket starts.
pub fn plan_series(
    levels: &[(usize, i64)],
    series: &SeriesMeta,
    start: i64,
    end: i64,
) -> Vec<(Source, Range<i64>)> {
    let mut out = Vec::new();
    split(
        levels,
        series.min_time_nanos,
        series.max_time_nanos,
        start,
        end,
        &mut out,
    );
    out
}

fn split(
    levels: &[(usize, i64)],
    min: i64,
    max: i64,
    start: i64,
    end: i64,
    out: &mut Vec<(Source, Range<i64>)>,
) {
    if start >= end || start > max || end <= min {
        return;
    }
    let Some((&(index, r), finer)) = levels.split_first() else {
        out.push((Source::Samples, start..end));
        return;
    };
    // Buckets wholly inside [start, end), as far as the series' data [min, max] goes.
    let first = if start <= min {
        floor(min, r)
    } else {
        floor(start, r).saturating_add(if start.rem_euclid(r) == 0 { 0 } else { r })
    };
    let last = if end > max {
        floor(max, r).saturating_add(r)
    } else {
        floor(end, r)
    };
    if first < last {
        split(finer, min, max, start, first, out);
        out.push((Source::Rollup(index), first..last));
        split(finer, min, max, last, end, out);
    } else {
        split(finer, min, max, start, end, out);
    }
}

/// A stack with no entry in the current bucket's sums ([`RollupWriter`]'s `slots`).
const NO_SLOT: u32 = u32::MAX;

/// Entries a bucket's sums reach before they are first collapsed (2 MiB).
const MIN_COLLAPSE: usize = 64 << 10;

/// Sorts `sums` by key (stably: values are added in the order they came) and sums each key's
/// values into one entry.
fn collapse(sums: &mut Vec<((u32, Option<[u8; 16]>), i64)>) {
    sums.sort_by_key(|(key, _)| *key);
    sums.dedup_by(|next, kept| {
        let same = next.0 == kept.0;
        if same {
            kept.1 = kept.1.saturating_add(next.1);
        }
        same
    });
}

fn floor(t: i64, r: i64) -> i64 {
    t.div_euclid(r).saturating_mul(r)
}

/// Writes one rollup of a compaction output while its rows stream by, to a scratch file.
pub(crate) struct RollupWriter {
    resolution: i64,
    path: PathBuf,
    writer: ArrowWriter<std::fs::File>,
    batch: RowBatchBuilder,
    batch_rows: usize,
    /// The (series, bucket) being summed, and its values: for a stack rollup one entry per
    /// stack, found through `slots` and summed in place, the stacks sorted when the bucket is
    /// written; for profile totals (keyed by profile id), as they came, sorted and summed when
    /// the bucket is written and whenever they reach `collapse_at` entries, so they hold about
    /// twice the bucket's distinct keys at most, however many rows it has.
    current: Option<(u32, i64)>,
    sums: Vec<((u32, Option<[u8; 16]>), i64)>,
    /// A stack rollup's entry in `sums` of each stack of the current bucket ([`NO_SLOT`]:
    /// none), by stack id: as long as the output's stack ids, so four bytes a stack (an
    /// output's tree is cut at `max_output_stack_nodes`). A bucket's rows come sorted by
    /// timestamp, then stack: sorting them all to sum them cost a tenth of a compaction's
    /// instructions, where a bucket has a few times fewer stacks than rows.
    slots: Vec<u32>,
    collapse_at: usize,
    rows: u64,
    series_rows: Vec<Range<u64>>,
    /// Sample rows pushed so far: the next one's row in the samples section (profile totals
    /// are fed every sample row, in order).
    pushed: u64,
    /// The samples section's row where the current (series, bucket) began.
    bucket_first: u64,
    /// Whether rows carry `bucket_first` as their `sample_row` (profile totals).
    sample_rows: bool,
    /// Rows of the (series, bucket)s written so far, as fed to it.
    summed: u64,
    /// For a stack rollup of a short-lived block: once this many fed rows are summed, it gives
    /// up if it wrote more than half as many ([`RollupWriter::give_up_after`]).
    give_up_after: Option<u64>,
    /// Given up: it sums and writes nothing more, and is not kept.
    abandoned: bool,
}

impl RollupWriter {
    /// A writer for `resolution` into `path`.
    pub(crate) fn new(
        resolution: i64,
        path: PathBuf,
        row_group_rows: usize,
        batch_rows: usize,
        pages: Pages,
    ) -> Result<Self> {
        // Profile totals carry their samples' first rows since block format version 4.
        let totals = resolution == PROFILE_TOTALS && crate::format::meta::write_version() >= 4;
        let schema = if totals {
            profile_totals_schema()
        } else {
            samples_schema()
        };
        let blank = Blank::rollup(resolution == PROFILE_TOTALS);
        let writer = samples_file_writer(&path, schema, row_group_rows, pages, blank)?;
        Ok(Self {
            resolution,
            path,
            writer,
            batch: if totals {
                RowBatchBuilder::profile_totals()
            } else {
                RowBatchBuilder::default()
            },
            batch_rows,
            current: None,
            sums: Vec::new(),
            slots: Vec::new(),
            collapse_at: MIN_COLLAPSE,
            rows: 0,
            series_rows: Vec::new(),
            pushed: 0,
            bucket_first: 0,
            sample_rows: totals,
            summed: 0,
            give_up_after: None,
            abandoned: false,
        })
    }

    /// Lets a stack rollup give up once `rows` of what it is fed are summed, if by then it
    /// wrote more than half as many rows: it would not be kept ([`worth_keeping`]) unless the
    /// rest of the block folded far better. Only for a block that a later merge replaces, which
    /// computes its rollups again: a guess here costs nothing that lasts. Profile totals
    /// never give up (queries find their sample rows through them).
    pub(crate) fn give_up_after(&mut self, rows: u64) {
        if self.resolution != PROFILE_TOTALS {
            self.give_up_after = Some(rows);
        }
    }

    /// Stops summing and writing: the rollup will not be kept.
    fn abandon(&mut self) {
        self.abandoned = true;
        self.current = None;
        self.sums = Vec::new();
        self.slots = Vec::new();
        self.batch = RowBatchBuilder::default();
    }

    /// Adds a sample row (of its output series; series come in order, each once). The rows of
    /// a (series, bucket) it finishes are written, and given to `sink`.
    fn push(&mut self, row: &Row, sink: Sink<'_>) -> Result<()> {
        if self.abandoned {
            return Ok(());
        }
        let (series, timestamp, value) = (row.series, row.timestamp, row.value);
        let (bucket, key) = if self.resolution == PROFILE_TOTALS {
            (timestamp, (0, row.profile_id))
        } else {
            (floor(timestamp, self.resolution), (row.stack, None))
        };
        if self.current != Some((series, bucket)) {
            self.emit(sink)?;
            if self.abandoned {
                return Ok(());
            }
            while self.series_rows.len() <= series as usize {
                self.series_rows.push(self.rows..self.rows);
            }
            self.current = Some((series, bucket));
            self.bucket_first = self.pushed;
        }
        self.pushed += 1;
        if self.resolution == PROFILE_TOTALS {
            self.sums.push((key, value));
            if self.sums.len() >= self.collapse_at {
                collapse(&mut self.sums);
                self.collapse_at = (self.sums.len() * 2).max(MIN_COLLAPSE);
            }
        } else {
            // Summed in the order the values come, as `collapse` sums them.
            let stack = row.stack as usize;
            if stack >= self.slots.len() {
                self.slots.resize(stack + 1, NO_SLOT);
            }
            match self.slots[stack] {
                NO_SLOT => {
                    self.slots[stack] = self.sums.len() as u32;
                    self.sums.push((key, value));
                }
                slot => {
                    let sum = &mut self.sums[slot as usize].1;
                    *sum = sum.saturating_add(value);
                }
            }
        }
        Ok(())
    }

    /// Writes the sums of the current (series, bucket), in key order, and gives each row to
    /// `sink`.
    fn emit(&mut self, sink: Sink<'_>) -> Result<()> {
        let Some((series, bucket)) = self.current.take() else {
            return Ok(());
        };
        self.summed += self.pushed - self.bucket_first;
        let mut sums = std::mem::take(&mut self.sums);
        if self.resolution == PROFILE_TOTALS {
            collapse(&mut sums);
            self.collapse_at = MIN_COLLAPSE;
        } else {
            // One entry per stack already.
            for &((stack, _), _) in &sums {
                self.slots[stack as usize] = NO_SLOT;
            }
            sums.sort_unstable_by_key(|(key, _)| *key);
        }
        for &((stack, profile_id), value) in &sums {
            let row = Row {
                series,
                timestamp: bucket,
                stack,
                value,
                span_id: 0,
                trace_id: None,
                labels: None,
                profile_id,
            };
            if self.sample_rows {
                self.batch.push_total(&row, self.bucket_first);
            } else {
                self.batch.push(&row);
            }
            sink(&row)?;
            self.rows += 1;
            if self.batch.len() >= self.batch_rows {
                self.writer.write(&self.batch.finish()?)?;
            }
        }
        sums.clear();
        self.sums = sums;
        if let Some(r) = self.series_rows.get_mut(series as usize) {
            r.end = self.rows;
        }
        if let Some(after) = self.give_up_after
            && self.summed >= after
            && self.rows.saturating_mul(2) > self.summed
        {
            self.abandon();
        }
        Ok(())
    }

    /// The scratch file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Closes the Parquet file: its path, rows, resolution and per-series row ranges (one per
    /// of `series` output series). What is left to write is written ([`RollupWriter::emit`]
    /// to a sink first, for a chain).
    fn finish(mut self, series: usize) -> Result<FinishedRollup> {
        self.emit(&mut |_| Ok(()))?;
        if !self.abandoned {
            if !self.batch.is_empty() {
                self.writer
                    .write(&std::mem::take(&mut self.batch).into_batch()?)?;
            }
            self.writer.close()?;
        }
        while self.series_rows.len() < series {
            self.series_rows.push(self.rows..self.rows);
        }
        Ok(FinishedRollup {
            resolution: self.resolution,
            path: self.path,
            rows: self.rows,
            series_rows: self.series_rows,
            abandoned: self.abandoned,
        })
    }
}

/// Where a rollup's written rows go besides its file: the next rollup of its chain.
type Sink<'a> = &'a mut dyn FnMut(&Row) -> Result<()>;

/// The rollups of one compaction output, finest first. A stack rollup whose resolution is a
/// multiple of the stack rollup before it is chained to it: it is fed that rollup's rows as they
/// are written, not the samples (its buckets are whole buckets of the finer one, both aligned
/// to the epoch, so the sums are the same).
pub(crate) struct Rollups {
    writers: Vec<RollupWriter>,
    /// Per writer: whether it is fed by the one before it.
    chained: Vec<bool>,
    /// Whether a rollup may give up ([`Rollups::give_up_after`]): only then are the chains
    /// looked at for one that did, as rows are pushed.
    trial: bool,
}

impl Rollups {
    pub(crate) fn new(writers: Vec<RollupWriter>) -> Self {
        let chained = (0..writers.len())
            .map(|i| {
                i > 0 && {
                    let (finer, r) = (writers[i - 1].resolution, writers[i].resolution);
                    finer != PROFILE_TOTALS && r != PROFILE_TOTALS && r % finer == 0
                }
            })
            .collect();
        Self {
            writers,
            chained,
            trial: false,
        }
    }

    /// Adds a sample row to every rollup not chained, and what they write down their chains.
    pub(crate) fn push(&mut self, row: &Row) -> Result<()> {
        for i in 0..self.writers.len() {
            if !self.chained[i] {
                push_chain(&mut self.writers[i..], &self.chained[i..], row)?;
            }
        }
        if self.trial {
            self.abandon_chains();
        }
        Ok(())
    }

    /// Lets the stack rollups give up ([`RollupWriter::give_up_after`]) once `rows` sample rows
    /// are summed; a rollup chained to one that gives up gives up with it.
    pub(crate) fn give_up_after(&mut self, rows: u64) {
        self.trial = true;
        for (w, &chained) in self.writers.iter_mut().zip(&self.chained) {
            if !chained {
                w.give_up_after(rows);
            }
        }
    }

    /// Abandons each rollup fed by one abandoned: it would miss the rest of its rows.
    fn abandon_chains(&mut self) {
        for i in 1..self.writers.len() {
            if self.chained[i] && self.writers[i - 1].abandoned && !self.writers[i].abandoned {
                self.writers[i].abandon();
            }
        }
    }

    /// The scratch files.
    pub(crate) fn paths(&self) -> impl Iterator<Item = &Path> {
        self.writers.iter().map(RollupWriter::path)
    }

    /// Writes what each rollup has left, finest first (so it reaches its chain before the
    /// next one closes), and closes them: one [`FinishedRollup`] per rollup, in order.
    pub(crate) fn finish(mut self, series: usize) -> Result<Vec<FinishedRollup>> {
        for i in 0..self.writers.len() {
            let (head, tail) = self.writers.split_at_mut(i + 1);
            let chained = &self.chained[i + 1..];
            if chained.first() == Some(&true) {
                head[i].emit(&mut |row| push_chain(tail, chained, row))?;
            }
            self.abandon_chains();
        }
        self.writers.into_iter().map(|w| w.finish(series)).collect()
    }
}

/// Pushes `row` into `writers[0]`, and what it writes into the rest of its chain.
fn push_chain(writers: &mut [RollupWriter], chained: &[bool], row: &Row) -> Result<()> {
    let Some((first, rest)) = writers.split_first_mut() else {
        return Ok(());
    };
    if chained.get(1) == Some(&true) {
        let rest_chained = &chained[1..];
        first.push(row, &mut |r| push_chain(rest, rest_chained, r))
    } else {
        first.push(row, &mut |_| Ok(()))
    }
}

/// A rollup file ready to be appended to its block.
pub(crate) struct FinishedRollup {
    pub resolution: i64,
    pub path: PathBuf,
    pub rows: u64,
    pub series_rows: Vec<Range<u64>>,
    /// Given up while written ([`RollupWriter::give_up_after`]): never kept.
    pub abandoned: bool,
}

/// Which of `rollups` (finest first) are worth keeping for a block of `sample_rows` rows: each
/// at most half the rows of the next finer level kept (the samples for the finest).
pub(crate) fn worth_keeping(rollups: &[FinishedRollup], sample_rows: u64) -> Vec<bool> {
    let mut finer = sample_rows;
    let mut keep = Vec::with_capacity(rollups.len());
    for r in rollups {
        // Profile totals are compared with the samples: they drop the stacks, not time.
        let base = if r.resolution == PROFILE_TOTALS {
            sample_rows
        } else {
            finer
        };
        let k = !r.abandoned && r.rows > 0 && r.rows.saturating_mul(2) <= base;
        if k && r.resolution != PROFILE_TOTALS {
            finer = r.rows;
        }
        keep.push(k);
    }
    keep
}

/// Of `resolutions` (finest first), those worth computing for a block whose rows lie in
/// `[min_time, max_time]`: a stack resolution is skipped when the whole block lies in one
/// bucket of the finer stack resolution computed before it (buckets are epoch-aligned and each
/// resolution a multiple of the finer, so its rows would be that rollup's rows again, which
/// [`worth_keeping`] never keeps). A block inside one 10-minute bucket computes one stack
/// rollup instead of three; what is kept is the same.
pub(crate) fn worth_computing(resolutions: &[i64], min_time: i64, max_time: i64) -> Vec<i64> {
    let mut finer: Option<i64> = None;
    let mut out = Vec::with_capacity(resolutions.len());
    for &r in resolutions {
        if r == PROFILE_TOTALS {
            out.push(r);
            continue;
        }
        if let Some(f) = finer
            && r % f == 0
            && floor(min_time, f) == floor(max_time, f)
        {
            continue;
        }
        out.push(r);
        finer = Some(r);
    }
    out
}

/// Removes scratch files.
pub(crate) fn remove_files(paths: impl IntoIterator<Item = impl AsRef<Path>>) {
    for p in paths {
        let _ = std::fs::remove_file(p);
    }
}
