use crate::Result;
use crate::format::block::{Pages, Row};
use crate::format::meta::{PROFILE_TOTALS, SeriesMeta};
use std::path::{Path, PathBuf};

use arrow::array::AsArray;
use arrow::datatypes::{Int64Type, UInt32Type};
use proptest::prelude::*;

use super::*;

/// The batches of a finished rollup file.
fn batches_of(r: &FinishedRollup) -> Vec<arrow::array::RecordBatch> {
    let file = std::fs::File::open(&r.path).unwrap();
    parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// The (series, bucket, stack, value) rows of a finished rollup file.
fn rows_of(r: &FinishedRollup) -> Vec<(u32, i64, u32, i64)> {
    let mut out = Vec::new();
    for batch in batches_of(r) {
        let c = |i| batch.column(i);
        let (series, ts) = (
            c(crate::format::block::col::SERIES_ID).as_primitive::<UInt32Type>(),
            c(crate::format::block::col::TIMESTAMP).as_primitive::<Int64Type>(),
        );
        let (stack, value) = (
            c(crate::format::block::col::STACK_ID).as_primitive::<UInt32Type>(),
            c(crate::format::block::col::VALUE).as_primitive::<Int64Type>(),
        );
        for i in 0..batch.num_rows() {
            out.push((series.value(i), ts.value(i), stack.value(i), value.value(i)));
        }
    }
    out
}

/// Writes `rows` through [`Rollups`] of `resolutions`, chained where they divide.
fn write(
    dir: &Path,
    name: &str,
    resolutions: &[i64],
    rows: &[Row],
    series: usize,
) -> Vec<FinishedRollup> {
    let writers = resolutions
        .iter()
        .enumerate()
        .map(|(i, &r)| {
            RollupWriter::new(r, dir.join(format!("{name}{i}")), 64, 16, Pages::Kept).unwrap()
        })
        .collect();
    let mut rollups = Rollups::new(writers);
    for row in rows {
        rollups.push(row).unwrap();
    }
    rollups.finish(series).unwrap()
}

/// Rows of `series` series, each with `profiles` profiles 10 s apart of `stacks` stacks,
/// the same stacks in every profile of a series when `repeat`, all different otherwise.
fn profiles(series: u32, profiles: u32, stacks: u32, repeat: bool) -> Vec<Row> {
    let mut rows = Vec::new();
    for s in 0..series {
        for p in 0..profiles {
            for k in 0..stacks {
                rows.push(Row {
                    series: s,
                    timestamp: i64::from(p) * 10_000_000_000,
                    stack: if repeat { k } else { p * stacks + k },
                    value: 1,
                    span_id: 0,
                    trace_id: None,
                    labels: None,
                    profile_id: Some([(s * profiles + p) as u8; 16]),
                });
            }
        }
    }
    rows
}

/// Writes `rows` through profile totals, 10 minutes and a chained hour, the stack rollups
/// giving up after `give_up_after` rows when set.
fn write_giving_up(dir: &Path, rows: &[Row], give_up_after: Option<u64>) -> Vec<FinishedRollup> {
    let writers = [PROFILE_TOTALS, 10 * MINUTE, 60 * MINUTE]
        .iter()
        .enumerate()
        .map(|(i, &r)| RollupWriter::new(r, dir.join(i.to_string()), 64, 16, Pages::Kept).unwrap())
        .collect();
    let mut rollups = Rollups::new(writers);
    if let Some(n) = give_up_after {
        rollups.give_up_after(n);
    }
    for row in rows {
        rollups.push(row).unwrap();
    }
    let series = rows.last().map_or(0, |r| r.series as usize + 1);
    rollups.finish(series).unwrap()
}

/// Stack rollups that do not fold give up once they have seen their share of the rows,
/// the hour chained to the ten minutes with them; the profile totals go on and are kept.
#[test]
fn stack_rollups_that_do_not_fold_give_up() {
    let dir = tempfile::tempdir().unwrap();
    // 40 series of one profile of 10 stacks each: the rollups have every sample's row.
    let rows = profiles(40, 1, 10, false);
    let finished = write_giving_up(dir.path(), &rows, Some(50));
    let abandoned: Vec<bool> = finished.iter().map(|r| r.abandoned).collect();
    assert_eq!(abandoned, [false, true, true]);
    // The ten minutes gave up after the 50 rows of its first five series.
    assert_eq!(finished[1].rows, 50);
    assert_eq!(
        worth_keeping(&finished, rows.len() as u64),
        [true, false, false]
    );
    assert_eq!(finished[0].rows, 40);
    assert_eq!(finished[0].series_rows.len(), 40);
    // Without a trial the same rollups run to the end, and are not kept either.
    let dir = tempfile::tempdir().unwrap();
    let full = write_giving_up(dir.path(), &rows, None);
    assert_eq!(full[1].rows, 400);
    assert_eq!(worth_keeping(&full, 400), [true, false, false]);
}

/// Stack rollups that fold carry on through their trial, and write what they would
/// without one.
#[test]
fn stack_rollups_that_fold_carry_on() {
    let rows = profiles(40, 4, 10, true);
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let tried = write_giving_up(a.path(), &rows, Some(50));
    let full = write_giving_up(b.path(), &rows, None);
    for (t, f) in tried.iter().zip(&full) {
        assert!(!t.abandoned);
        assert_eq!(rows_of(t), rows_of(f));
    }
    assert_eq!(
        worth_keeping(&tried, rows.len() as u64),
        [true, true, false]
    );
}

#[test]
fn multiples_of_the_finer_resolution_are_chained() {
    let chain = |resolutions: &[i64]| {
        let dir = tempfile::tempdir().unwrap();
        let writers = resolutions
            .iter()
            .enumerate()
            .map(|(i, &r)| {
                RollupWriter::new(r, dir.path().join(i.to_string()), 64, 16, Pages::Kept)
            })
            .collect::<Result<Vec<_>>>()
            .unwrap();
        Rollups::new(writers).chained
    };
    assert_eq!(chain(&DEFAULT_RESOLUTIONS), [false, false, true, true]);
    // 15 minutes are not whole 10-minute buckets; the hour is whole 15-minute ones.
    assert_eq!(
        chain(&[PROFILE_TOTALS, 10 * MINUTE, 15 * MINUTE, 60 * MINUTE]),
        [false, false, false, true]
    );
}

/// Each profile total carries the samples section's row where its (series, timestamp)
/// begins: the index, among the rows pushed, of the first row of that time.
#[test]
fn profile_totals_point_at_their_first_sample_row() {
    use arrow::array::Array;
    let dir = tempfile::tempdir().unwrap();
    // Series 0: times 5 (two profiles, three rows), 9 (one row); series 1: time 5 (two).
    let p = |n: u8| Some([n; 16]);
    let row = |series, timestamp, stack, profile_id| Row {
        series,
        timestamp,
        stack,
        value: 1,
        span_id: 0,
        trace_id: None,
        labels: None,
        profile_id,
    };
    let rows = [
        row(0, 5, 1, p(1)),
        row(0, 5, 2, p(2)),
        row(0, 5, 3, p(1)),
        row(0, 9, 1, p(3)),
        row(1, 5, 1, p(4)),
        row(1, 5, 2, p(4)),
    ];
    let finished = write(dir.path(), "t", &[PROFILE_TOTALS], &rows, 2);
    let mut got = Vec::new();
    for batch in batches_of(&finished[0]) {
        let first = batch
            .column(crate::format::block::col::SAMPLE_ROW)
            .as_primitive::<arrow::datatypes::UInt64Type>();
        assert_eq!(first.null_count(), 0);
        got.extend(first.values().iter().copied());
    }
    // Totals: (0, 5, p1), (0, 5, p2), (0, 9, p3), (1, 5, p4).
    assert_eq!(got, [0, 0, 3, 4]);
    assert_eq!(finished[0].series_rows, [0..3, 3..4]);
}

/// A bucket of many rows over few stacks is summed as it fills: the writer holds about
/// twice its distinct stacks, not its rows, and writes the same sums.
#[test]
fn a_long_bucket_is_summed_as_it_fills() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = RollupWriter::new(60 * MINUTE, dir.path().join("r"), 64, 16, Pages::Kept).unwrap();
    let rows = 5 * MIN_COLLAPSE as u32;
    let mut most = 0;
    for i in 0..rows {
        let row = Row {
            series: 0,
            timestamp: i64::from(i),
            stack: i % 7,
            value: 1,
            span_id: 0,
            trace_id: None,
            labels: None,
            profile_id: None,
        };
        w.push(&row, &mut |_| Ok(())).unwrap();
        most = most.max(w.sums.len());
    }
    assert!(most <= MIN_COLLAPSE, "held {most} entries for 7 stacks");
    let finished = w.finish(1).unwrap();
    let want: Vec<_> = (0..7)
        .map(|s| (0, 0, s, i64::from((rows - s).div_ceil(7))))
        .collect();
    assert_eq!(rows_of(&finished), want);
}

proptest! {
    /// A chained rollup holds exactly the rows it would summed from the samples alone.
    #[test]
    fn chained_rollups_are_the_samples_rollups(
        series in prop::collection::vec(
            prop::collection::vec((0i64..3000, 0u32..5, -20i64..100), 1..40), 1..4),
        shuffled in any::<bool>(),
    ) {
        let resolutions = [PROFILE_TOTALS, 10 * MINUTE, 15 * MINUTE, 60 * MINUTE, 1440 * MINUTE];
        let mut rows = Vec::new();
        for (s, samples) in series.iter().enumerate() {
            let mut samples = samples.clone();
            if !shuffled {
                samples.sort();
            }
            for &(minute, stack, value) in &samples {
                rows.push(Row {
                    series: s as u32,
                    timestamp: 1_700_000_000_000_000_000 + minute * MINUTE / 7,
                    stack,
                    value,
                    span_id: 0,
                    trace_id: None,
                    labels: None,
                    profile_id: None,
                });
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let chained = write(dir.path(), "chained", &resolutions, &rows, series.len());
        for (i, &r) in resolutions.iter().enumerate() {
            let alone = write(dir.path(), &format!("alone{i}-"), &[r], &rows, series.len());
            let (want, got) = (rows_of(&alone[0]), rows_of(&chained[i]));
            // Unsorted input can split a bucket into runs; the sums per key are the same.
            let sum = |rows: &[(u32, i64, u32, i64)]| {
                let mut m = std::collections::BTreeMap::new();
                for &(s, t, k, v) in rows.iter() {
                    *m.entry((s, t, k)).or_insert(0i64) += v;
                }
                m
            };
            if shuffled {
                prop_assert_eq!(sum(&want), sum(&got));
            } else {
                prop_assert_eq!(&want, &got);
                prop_assert_eq!(&alone[0].series_rows, &chained[i].series_rows);
            }
        }
    }
}

#[test]
fn resolutions_a_block_fits_in_one_bucket_of_are_not_computed() {
    let all = DEFAULT_RESOLUTIONS;
    let t = 1_700_000_400 * 1_000_000_000; // a 10-min boundary
    let m = MINUTE;
    // Inside one 10-min bucket: only profile totals and 10 min.
    assert_eq!(
        worth_computing(&all, t, t + 9 * m),
        [PROFILE_TOTALS, 10 * m]
    );
    // Across 10-min buckets inside one hour: 10 min and 1 h, not 1 d.
    let hour = floor(t, 60 * m);
    assert_eq!(
        worth_computing(&all, hour, hour + 59 * m),
        [PROFILE_TOTALS, 10 * m, 60 * m]
    );
    // Across hours: all of them.
    assert_eq!(worth_computing(&all, hour, hour + 61 * m), all);
    // A resolution that is not a multiple of the finer one is computed.
    assert_eq!(
        worth_computing(&[PROFILE_TOTALS, 10 * m, 25 * m], t, t + m),
        [PROFILE_TOTALS, 10 * m, 25 * m]
    );
    // Totals alone, or none.
    assert_eq!(worth_computing(&[PROFILE_TOTALS], t, t), [PROFILE_TOTALS]);
    assert!(worth_computing(&[], t, t).is_empty());
}

const H: i64 = 60 * MINUTE;

fn series(min: i64, max: i64) -> SeriesMeta {
    SeriesMeta {
        labels: Default::default(),
        profile_type: "".into(),
        min_time_nanos: min,
        max_time_nanos: max,
        first_row: 0,
        rows: 1,
    }
}

#[test]
fn ranges_split_into_the_coarsest_whole_buckets() {
    let levels = [(2, H), (1, 10 * MINUTE)];
    let s = series(0, 24 * H);
    // Aligned: whole hours only.
    assert_eq!(
        plan_series(&levels, &s, 2 * H, 5 * H),
        [(Source::Rollup(2), 2 * H..5 * H)]
    );
    // Unaligned: 10-minute buckets, then samples at the edges.
    let start = 2 * H + 15 * MINUTE;
    let end = 5 * H + 25 * MINUTE + 1;
    assert_eq!(
        plan_series(&levels, &s, start, end),
        [
            (Source::Samples, start..2 * H + 20 * MINUTE),
            (Source::Rollup(1), 2 * H + 20 * MINUTE..3 * H),
            (Source::Rollup(2), 3 * H..5 * H),
            (Source::Rollup(1), 5 * H..5 * H + 20 * MINUTE),
            (Source::Samples, 5 * H + 20 * MINUTE..end),
        ]
    );
    // Less than a bucket: samples only.
    assert_eq!(
        plan_series(&levels, &s, H + 1, H + 5 * MINUTE),
        [(Source::Samples, H + 1..H + 5 * MINUTE)]
    );
    // No rollups: samples only.
    assert_eq!(
        plan_series(&[], &s, 2 * H, 5 * H),
        [(Source::Samples, 2 * H..5 * H)]
    );
}

#[test]
fn a_range_past_the_data_covers_the_buckets_holding_it() {
    let levels = [(0, H)];
    // Data from 1:17 to 3:42; a range from before to after it reads whole hours only.
    let s = series(H + 17 * MINUTE, 3 * H + 42 * MINUTE);
    assert_eq!(
        plan_series(&levels, &s, 0, 100 * H),
        [(Source::Rollup(0), H..4 * H)]
    );
    // Starting inside the data at 2:30: the rest of hour 2 from the samples.
    assert_eq!(
        plan_series(&levels, &s, 2 * H + 30 * MINUTE, 100 * H),
        [
            (Source::Samples, 2 * H + 30 * MINUTE..3 * H),
            (Source::Rollup(0), 3 * H..4 * H)
        ]
    );
    // Outside the data: nothing.
    assert!(plan_series(&levels, &s, 5 * H, 6 * H).is_empty());
}

#[test]
fn a_level_is_kept_where_it_halves_the_rows() {
    let r = |resolution, rows| FinishedRollup {
        resolution,
        path: PathBuf::new(),
        rows,
        series_rows: vec![],
        abandoned: false,
    };
    let levels = [r(0, 10), r(10, 600), r(60, 500), r(1440, 100)];
    // Totals (10 of 1000) kept; 10 min (600 of 1000) not; 1 h (500 of 1000) kept; 1 d kept.
    assert_eq!(worth_keeping(&levels, 1000), [true, false, true, true]);
    assert_eq!(worth_keeping(&[r(60, 0)], 1000), [false]);
}
