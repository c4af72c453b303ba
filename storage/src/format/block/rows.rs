//! Sample rows: one row as a compaction merges it, the batches built from rows, and per-sample
//! labels as stored.

use crate::Result;
use arrow::array::{
    ArrayRef, FixedSizeBinaryArray, Int64Array, NullBufferBuilder, RecordBatch, StringBuilder,
    UInt32Array, UInt64Array,
};
use arrow::buffer::Buffer;
use std::sync::Arc;

use super::*;

/// One sample row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub series: u32,
    pub timestamp: i64,
    pub stack: u32,
    pub value: i64,
    pub span_id: u64,
    pub trace_id: Option<[u8; 16]>,
    /// Encoded per-sample labels ([`encode_sample_labels`]), if any.
    pub labels: Option<Arc<str>>,
    /// The ingested profile the sample came from (none: rollups, version 2 blocks).
    pub profile_id: Option<[u8; 16]>,
}

/// `rows` stably sorted by (series, timestamp), each row moved once. Rows come profile by
/// profile, a profile's rows of a series sharing its timestamp: the runs of one key are sorted
/// (a few thousand a segment), not the rows (a stable sort of the rows merged those runs,
/// moving every row once per merge pass).
pub(super) fn sort_by_series_and_time(rows: Vec<Row>) -> Vec<Row> {
    // (series, timestamp, first row, rows) of each run of one key, in the order they came.
    let mut runs: Vec<(u32, i64, usize, usize)> = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        match runs.last_mut() {
            Some(run) if (run.0, run.1) == (r.series, r.timestamp) => run.3 += 1,
            _ => runs.push((r.series, r.timestamp, i, 1)),
        }
    }
    if runs.is_sorted_by_key(|&(series, time, _, _)| (series, time)) {
        return rows;
    }
    runs.sort_by_key(|&(series, time, _, _)| (series, time));
    let mut slots: Vec<Option<Row>> = rows.into_iter().map(Some).collect();
    let mut sorted = Vec::with_capacity(slots.len());
    for (_, _, first, len) in runs {
        sorted.extend(
            slots[first..first + len]
                .iter_mut()
                .map(|r| r.take().expect("each row is in one run")),
        );
    }
    sorted
}

/// The sort key of a row within its series.
pub type RowKey<'a> = (
    i64,
    u32,
    u64,
    Option<[u8; 16]>,
    Option<&'a str>,
    Option<[u8; 16]>,
);

impl Row {
    /// The sort key within a series.
    pub fn key(&self) -> RowKey<'_> {
        (
            self.timestamp,
            self.stack,
            self.span_id,
            self.trace_id,
            self.labels.as_deref(),
            self.profile_id,
        )
    }
}

/// A column of optional 16-byte ids (trace ids, profile ids): each row's bytes pushed whole,
/// where arrow's `FixedSizeBinaryBuilder` appends a null's zeros a byte at a time.
struct IdColumn {
    ids: Vec<[u8; 16]>,
    nulls: NullBufferBuilder,
}

impl IdColumn {
    fn with_capacity(rows: usize) -> Self {
        Self {
            ids: Vec::with_capacity(rows),
            nulls: NullBufferBuilder::new(rows),
        }
    }

    fn push(&mut self, id: Option<[u8; 16]>) {
        match id {
            Some(id) => {
                self.ids.push(id);
                self.nulls.append_non_null();
            }
            None => {
                self.ids.push([0; 16]);
                self.nulls.append_null();
            }
        }
    }

    /// The column; the builder is left empty with room for `rows`.
    fn take(&mut self, rows: usize) -> Result<FixedSizeBinaryArray> {
        let ids = std::mem::replace(&mut self.ids, Vec::with_capacity(rows));
        let nulls = std::mem::replace(&mut self.nulls, NullBufferBuilder::new(rows)).finish();
        Ok(FixedSizeBinaryArray::try_new(
            16,
            Buffer::from_vec(ids.into_flattened()),
            nulls,
        )?)
    }
}

/// Builds Arrow batches of sample rows.
pub struct RowBatchBuilder {
    series: Vec<u32>,
    timestamps: Vec<i64>,
    stacks: Vec<u32>,
    values: Vec<i64>,
    spans: Vec<u64>,
    traces: IdColumn,
    labels: StringBuilder,
    profiles: IdColumn,
    /// Profile totals' `sample_row`s ([`RowBatchBuilder::profile_totals`]); `None`: samples.
    sample_rows: Option<Vec<u64>>,
}

impl Default for RowBatchBuilder {
    fn default() -> Self {
        Self::with_capacity(0)
    }
}

impl RowBatchBuilder {
    /// A builder of profile totals' batches ([`profile_totals_schema`]): rows come with
    /// [`RowBatchBuilder::push_total`].
    pub fn profile_totals() -> Self {
        Self {
            sample_rows: Some(Vec::new()),
            ..Self::default()
        }
    }

    /// Appends a profile total whose (series, timestamp)'s samples begin at `sample_row`.
    pub fn push_total(&mut self, r: &Row, sample_row: u64) {
        self.push_row(r);
        self.sample_rows
            .as_mut()
            .expect("a profile totals builder")
            .push(sample_row);
    }

    /// Appends a row.
    pub fn push(&mut self, r: &Row) {
        debug_assert!(self.sample_rows.is_none(), "profile totals take push_total");
        self.push_row(r);
    }

    fn push_row(&mut self, r: &Row) {
        self.series.push(r.series);
        self.timestamps.push(r.timestamp);
        self.stacks.push(r.stack);
        self.values.push(r.value);
        self.spans.push(r.span_id);
        self.traces.push(r.trace_id);
        self.labels.append_option(r.labels.as_deref());
        self.profiles.push(r.profile_id);
    }

    /// Rows appended since the last batch.
    pub fn len(&self) -> usize {
        self.series.len()
    }

    /// True when no row is waiting.
    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }

    /// An empty builder with room for `rows` rows, as a writer that knows its row count
    /// (a segment's, a batch's) takes it: its columns are allocated once rather than grown by
    /// doubling, each doubling a copy.
    pub fn with_capacity(rows: usize) -> Self {
        Self {
            series: Vec::with_capacity(rows),
            timestamps: Vec::with_capacity(rows),
            stacks: Vec::with_capacity(rows),
            values: Vec::with_capacity(rows),
            spans: Vec::with_capacity(rows),
            traces: IdColumn::with_capacity(rows),
            labels: StringBuilder::new(),
            profiles: IdColumn::with_capacity(rows),
            sample_rows: None,
        }
    }

    /// The rows as a batch. The builder is empty afterwards, with room for as many rows as
    /// the batch held: a writer's batches are mostly of one size.
    pub fn finish(&mut self) -> Result<RecordBatch> {
        self.take(self.len())
    }

    /// The rows as the last batch of this builder.
    pub fn into_batch(mut self) -> Result<RecordBatch> {
        self.take(0)
    }

    /// The rows as a batch, the builder left empty with room for `n` rows.
    fn take(&mut self, n: usize) -> Result<RecordBatch> {
        fn refill<T>(column: &mut Vec<T>, n: usize) -> Vec<T> {
            std::mem::replace(column, Vec::with_capacity(n))
        }
        let mut cols: Vec<ArrayRef> = vec![
            Arc::new(UInt32Array::from(refill(&mut self.series, n))),
            Arc::new(Int64Array::from(refill(&mut self.timestamps, n))),
            Arc::new(UInt32Array::from(refill(&mut self.stacks, n))),
            Arc::new(Int64Array::from(refill(&mut self.values, n))),
            Arc::new(UInt64Array::from(refill(&mut self.spans, n))),
            Arc::new(self.traces.take(n)?),
            Arc::new(self.labels.finish()),
            Arc::new(self.profiles.take(n)?),
        ];
        let schema = match &mut self.sample_rows {
            Some(rows) => {
                cols.push(Arc::new(UInt64Array::from(refill(rows, n))));
                profile_totals_schema()
            }
            None => samples_schema(),
        };
        Ok(RecordBatch::try_new(schema, cols)?)
    }
}

/// Per-sample labels as stored in the `sample_labels` column: `name=value` pairs, sorted by name,
/// joined by the ASCII unit separator (U+001F).
pub fn encode_sample_labels(labels: &[(String, String)]) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("\u{1f}")
}

/// The inverse of [`encode_sample_labels`].
pub fn decode_sample_labels(s: &str) -> Vec<(String, String)> {
    s.split('\u{1f}')
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}
