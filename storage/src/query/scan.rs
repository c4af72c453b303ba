//! Stage 2, block scans: a dataset's samples (or one of its rollups) read as a Parquet file by
//! ranges of its object ([`SectionReader`]): only the row ranges of the selected series, only
//! the pages whose times the query reaches. A block that fails its checks is quarantined and
//! the query answers without it; a block compacted away under a query sends it back to the
//! metastore ([`retrying`]).

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Int64Type, UInt32Type, UInt64Type};
use futures::TryStreamExt;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, RowSelection, RowSelector};
use parquet::arrow::async_reader::ParquetRecordBatchStreamBuilder;
use parquet::errors::ParquetError;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::page_index::column_index::ColumnIndexMetaData;

use super::QueryEngine;
use crate::caches::report::{count, warn};
use crate::caches::source::SectionReader;
use crate::clock::now_ms;
use crate::error::is_corruption;
use crate::format::block::col;
use crate::format::meta::PROFILE_TOTALS;
use crate::format::rollup::Source;
use crate::metastore::BlockMeta;
use crate::{Error, Result};

/// Rows per decoded batch.
const BATCH_ROWS: usize = 8192;

/// Fewer sample rows than this (half a batch) are read as the page index narrows them: a read
/// of the profile totals first would cost about what it could save.
const MIN_EXACT_ROWS: u64 = BATCH_ROWS as u64 / 2;

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

/// The sample rows at `times` of the series of `totals` ((series, timestamp, sample_row) rows
/// of the profile totals, in their order): per series and time range, from the `sample_row` of
/// its first total in the range to that of the first total after it, or `series_end` of the
/// series when none follows. `totals` may skip totals, but not one in `times`, nor the one after
/// the last of those.
fn rows_from_totals(
    totals: &[(u32, i64, u64)],
    times: &[Range<i64>],
    series_end: impl Fn(u32) -> Option<u64>,
) -> Vec<Range<u64>> {
    let mut out = Vec::new();
    for group in totals.chunk_by(|a, b| a.0 == b.0) {
        let Some(end_of_series) = series_end(group[0].0) else {
            continue;
        };
        for t in times {
            let lo = group.partition_point(|x| x.1 < t.start);
            let hi = group.partition_point(|x| x.1 < t.end);
            if lo < hi {
                let end = group.get(hi).map_or(end_of_series, |x| x.2);
                out.push(group[lo].2..end);
            }
        }
    }
    coalesce(out)
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
    /// Reads the given columns of the rows of `series` (indices into the block's series list)
    /// in the samples or a rollup, calling `f` with each batch; columns come in schema order.
    ///
    /// Only pages whose timestamps may fall in `times` are read (the Parquet page index of the
    /// timestamp column; rows of a series are in time order), so a short range over a block
    /// holding hours of a series reads a few pages of it.
    pub(super) async fn read_series(
        &self,
        block: &BlockMeta,
        source: Source,
        series: &[u32],
        times: &[Range<i64>],
        columns: &[usize],
        f: impl FnMut(&RecordBatch) -> Result<()>,
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
            self.caches
                .counters
                .rollup_reads
                .fetch_add(n, Ordering::Relaxed);
            count(|s| s.rollup_ranges += n);
        }
        let metadata = self.caches.parquet_metadata(block, source).await?;
        let mut ranges = coalesce(
            ranges
                .into_iter()
                .flat_map(|r| rows_in_times(metadata.metadata(), r, times))
                .collect(),
        );
        if source == Source::Samples
            && let Some(exact) = self
                .exact_sample_rows(block, series, times, &ranges)
                .await?
        {
            ranges = exact;
        }
        if ranges.is_empty() {
            return Ok(());
        }
        self.read_rows(block, source, metadata, &ranges, columns, f)
            .await
    }

    /// The rows of the samples of `series` at `times`, exactly, from the profile totals'
    /// `sample_row`s (version 4 blocks): the pages of the samples that `narrowed` (what the
    /// page index gives) names hold rows of other times too, each page 8 Ki rows, where a few
    /// minutes at the edge of a range are a few hundred. `None` where the block has no such
    /// column, or reading the totals would cost about what it saves (few rows to narrow, or
    /// totals to read half as many as the sample rows or more).
    async fn exact_sample_rows(
        &self,
        block: &BlockMeta,
        series: &[u32],
        times: &[Range<i64>],
        narrowed: &[Range<u64>],
    ) -> Result<Option<Vec<Range<u64>>>> {
        let narrowed_rows: u64 = narrowed.iter().map(|r| r.end - r.start).sum();
        if narrowed_rows < MIN_EXACT_ROWS {
            return Ok(None);
        }
        let Some(index) = block
            .rollups
            .iter()
            .position(|r| r.resolution_nanos == PROFILE_TOTALS)
        else {
            return Ok(None);
        };
        let source = Source::Rollup(index);
        let metadata = self.caches.parquet_metadata(block, source).await?;
        if metadata.schema().fields().len() <= col::SAMPLE_ROW {
            return Ok(None);
        }
        // Each series' totals at `times`, and the one after the last of them (where the
        // samples of the last one end), which may be the first row of the next page.
        let rollup = &block.rollups[index];
        let mut ranges = Vec::new();
        for &i in series {
            let Some(rows) = rollup.series_rows.get(i as usize) else {
                continue;
            };
            for r in rows_in_times(metadata.metadata(), rows.clone(), times) {
                ranges.push(r.start..(r.end + 1).min(rows.end));
            }
        }
        let ranges = coalesce(ranges);
        let totals_rows: u64 = ranges.iter().map(|r| r.end - r.start).sum();
        if totals_rows.saturating_mul(2) >= narrowed_rows {
            return Ok(None);
        }
        // (series, timestamp, sample_row), in the section's order: by series, then time.
        let mut totals: Vec<(u32, i64, u64)> = Vec::with_capacity(totals_rows as usize);
        let mut complete = true;
        let columns = [col::SERIES_ID, col::TIMESTAMP, col::SAMPLE_ROW];
        self.read_rows(block, source, metadata, &ranges, &columns, |batch| {
            let sid = batch.column(0).as_primitive::<UInt32Type>();
            let ts = batch.column(1).as_primitive::<Int64Type>();
            let first = batch.column(2).as_primitive::<UInt64Type>();
            if first.null_count() > 0 {
                complete = false;
                return Ok(());
            }
            totals
                .extend((0..batch.num_rows()).map(|r| (sid.value(r), ts.value(r), first.value(r))));
            Ok(())
        })
        .await?;
        if !complete {
            return Ok(None);
        }
        Ok(Some(rows_from_totals(&totals, times, |s| {
            block.series.get(s as usize).map(|m| m.row_range().end)
        })))
    }

    /// Reads `columns` of the rows `ranges` (sorted, disjoint) of the samples or a rollup.
    async fn read_rows(
        &self,
        block: &BlockMeta,
        source: Source,
        metadata: ArrowReaderMetadata,
        ranges: &[Range<u64>],
        columns: &[usize],
        mut f: impl FnMut(&RecordBatch) -> Result<()>,
    ) -> Result<()> {
        let (groups, selection) = row_selection(metadata.metadata(), ranges);
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
            SectionReader::new(&self.caches, block, source),
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

    /// Quarantines a block that failed to read; other errors pass through.
    pub(super) async fn quarantine_or_fail(&self, block: &BlockMeta, e: Error) -> Result<()> {
        if !is_corruption(&e) {
            return Err(e);
        }
        // A block compacted away (and deleted) after this query looked it up is not corrupt:
        // the query starts again from a fresh lookup.
        if is_missing(&e) {
            let live = self
                .caches
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
        self.caches
            .counters
            .quarantined
            .fetch_add(1, Ordering::Relaxed);
        warn(format!(
            "block {} is unreadable and was quarantined; the answer leaves its data out",
            block.id
        ));
        let now = now_ms();
        self.caches
            .metastore
            .quarantine(&block.tenant, &block.id, &reason, now)
            .await?;
        self.caches.symbols.invalidate(&block.key()).await;
        let key = block.key();
        // Partial results of the block name it by key; it is out of the index now, so they are
        // never looked up again and age out.
        self.caches
            .parquet
            .invalidate(&(key.clone(), Source::Samples))
            .await;
        for i in 0..block.rollups.len() {
            self.caches
                .parquet
                .invalidate(&(key.clone(), Source::Rollup(i)))
                .await;
        }
        Ok(())
    }
}

/// `batch` with null columns of the profile totals schema's (the samples' and more) `missing`
/// columns appended.
fn with_null_columns(batch: RecordBatch, missing: &[usize]) -> Result<RecordBatch> {
    let schema = crate::format::block::profile_totals_schema();
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
pub(super) async fn retrying<T, F, Fut>(mut f: F) -> Result<T>
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

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use parquet::file::metadata::{PageIndexPolicy, ParquetMetaDataReader};

    #[test]
    fn a_newer_format_is_not_corruption() {
        let decode = |source| Error::Decode {
            tenant: "t".into(),
            block: "b".into(),
            what: "symbols section",
            source,
        };
        use crate::error::DecodeError;
        assert!(!is_corruption(&decode(DecodeError::Version {
            what: "symbols",
            version: 3,
            supported: 2,
        })));
        assert!(is_corruption(&decode(DecodeError::Checksum("symbols"))));
    }

    proptest::proptest! {
        /// The rows the profile totals point at are exactly the samples at the times asked,
        /// whatever else of the totals a read of their pages brings along.
        #[test]
        fn totals_give_exactly_the_rows_of_the_times(
            // Per series: (time step, profiles at that time, rows per profile).
            series in proptest::collection::vec(
                proptest::collection::vec((1i64..4, 1usize..3, 1u64..4), 0..12),
                1..4,
            ),
            times in proptest::collection::vec((0i64..40, 0i64..15), 1..4),
            extra in proptest::collection::vec(proptest::bool::ANY, 64),
        ) {
            let times: Vec<Range<i64>> = times.iter().map(|&(a, n)| a..a + n).collect();
            // The samples, in order: (series, time); and the totals.
            let mut samples: Vec<(u32, i64)> = Vec::new();
            let mut totals: Vec<(u32, i64, u64)> = Vec::new();
            let mut ends = Vec::new();
            for (s, steps) in series.iter().enumerate() {
                let mut t = 0;
                for &(step, profiles, rows) in steps {
                    t += step;
                    let first = samples.len() as u64;
                    for _ in 0..profiles as u64 * rows {
                        samples.push((s as u32, t));
                    }
                    for _ in 0..profiles {
                        totals.push((s as u32, t, first));
                    }
                }
                ends.push(samples.len() as u64);
            }
            let want = coalesce(
                samples
                    .iter()
                    .enumerate()
                    .filter(|(_, (_, t))| times.iter().any(|r| r.contains(t)))
                    .map(|(i, _)| i as u64..i as u64 + 1)
                    .collect(),
            );
            // A read keeps every total in `times` and the one after each run of them; others
            // at random.
            let here = |j: usize| times.iter().any(|r| r.contains(&totals[j].1));
            let needed = |i: usize| here(i) || (i > 0 && totals[i - 1].0 == totals[i].0 && here(i - 1));
            let read: Vec<(u32, i64, u64)> = (0..totals.len())
                .filter(|&i| needed(i) || extra[i % extra.len()])
                .map(|i| totals[i])
                .collect();
            let got = rows_from_totals(&read, &times, |s| ends.get(s as usize).copied());
            proptest::prop_assert_eq!(got, want);
        }
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
        use crate::format::block::{Row, RowBatchBuilder, samples_schema};
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
