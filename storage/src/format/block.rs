//! Block format, version 4 (`docs/adr/0002-block-format.md`): one tenant's dataset of an object.
//! Version 4 changed only the profile totals rollup ([`profile_totals_schema`]).
//!
//! A dataset is two sections of an object (see [`crate::format::meta`] for the object's layout):
//!
//! - samples, Parquet: one row per (series, timestamp, stack, span, trace, per-sample labels),
//!   sorted by series (in series order: profile type, service name, labels), then timestamp,
//!   then stack. Columns: `series_id`, `timestamp` (ns), `stack_id`, `value`, `span_id`
//!   (0 = none), `trace_id` (16 bytes, null = none), `sample_labels` (null = none) and
//!   `profile_id` (the UUID given to each ingested profile of a series; version 2 blocks lack
//!   the column, read as null). Label
//!   selectors are answered from the series list in the metadata, which gives every series' row
//!   range, so a query reads only the rows of the series it selects.
//! - symbols: the [`crate::format::symbols`] section the stack ids point into.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeBinaryArray, Int64Array, NullBufferBuilder, RecordBatch,
    StringBuilder, UInt32Array, UInt64Array,
};
use arrow::buffer::Buffer;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt64Type};
use bytes::Bytes;
use kiln_otel::model::{LABEL_SERVICE_NAME, Labels, NormalizedProfile};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::metadata::SortingColumn;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

use crate::Result;
use crate::format::meta::{BLOCK_FORMAT_VERSION, BlockMeta, Section, SeriesMeta, encode_footer};
use crate::format::symbols::SymbolsBuilder;

/// A new profile id: a version 7 UUID (RFC 9562) of the time in milliseconds, then 34 bits
/// drawn at random once per process, then a process-wide 40-bit counter (from a random start).
/// Unique without random bits of its own, so the ids one process writes differ only in the
/// time's and the counter's low bytes, which the column's zstd pages squeeze: with
/// 74 random bits an id (`Uuid::now_v7`) the column cost 0.28 B a sample row, and the profile
/// totals' rollup 0.13 B more, on `kiln bench`'s small preset; with these ids 0.09 and 0.04
/// (docs/performance.md).
pub fn new_profile_id() -> [u8; 16] {
    // The process's bits, and where its counter starts (so an id does not tell how many
    // profiles the process took in before it).
    static PROCESS: std::sync::LazyLock<([u8; 5], u64)> = std::sync::LazyLock::new(|| {
        let r = uuid::Uuid::new_v4().into_bytes();
        let start = u64::from_be_bytes([0, 0, 0, r[8], r[9], r[10], r[11], r[12]]);
        ([r[0], r[1], r[2], r[3], r[4]], start)
    });
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let (bits, start) = &*PROCESS;
    let n = start.wrapping_add(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut tail = [0u8; 10];
    tail[..5].copy_from_slice(bits);
    // 40 bits of counter: it wraps after 10^12 profiles, and only ids of the same millisecond
    // could then meet.
    tail[5..].copy_from_slice(&n.to_be_bytes()[3..]);
    uuid::Builder::from_unix_timestamp_millis(ms, &tail)
        .into_uuid()
        .into_bytes()
}

/// Column names of the samples section.
pub mod columns {
    pub const SERIES_ID: &str = "series_id";
    pub const TIMESTAMP: &str = "timestamp";
    pub const STACK_ID: &str = "stack_id";
    pub const VALUE: &str = "value";
    pub const SPAN_ID: &str = "span_id";
    pub const TRACE_ID: &str = "trace_id";
    pub const SAMPLE_LABELS: &str = "sample_labels";
    pub const PROFILE_ID: &str = "profile_id";
    /// Profile totals only (version 4): where the samples of the row's (series, timestamp)
    /// begin in the samples section.
    pub const SAMPLE_ROW: &str = "sample_row";
}

/// Column indices of the samples section, in schema order.
pub mod col {
    pub const SERIES_ID: usize = 0;
    pub const TIMESTAMP: usize = 1;
    pub const STACK_ID: usize = 2;
    pub const VALUE: usize = 3;
    pub const SPAN_ID: usize = 4;
    pub const TRACE_ID: usize = 5;
    pub const SAMPLE_LABELS: usize = 6;
    /// Absent from version 2 blocks (the last column, so the others keep their indices).
    pub const PROFILE_ID: usize = 7;
    /// Profile totals of version 4 blocks only ([`super::profile_totals_schema`]).
    pub const SAMPLE_ROW: usize = 8;
}

/// The samples schema.
pub fn samples_schema() -> SchemaRef {
    use columns::*;
    Arc::new(Schema::new(vec![
        Field::new(SERIES_ID, DataType::UInt32, false),
        Field::new(TIMESTAMP, DataType::Int64, false),
        Field::new(STACK_ID, DataType::UInt32, false),
        Field::new(VALUE, DataType::Int64, false),
        Field::new(SPAN_ID, DataType::UInt64, false),
        Field::new(TRACE_ID, DataType::FixedSizeBinary(16), true),
        Field::new(SAMPLE_LABELS, DataType::Utf8, true),
        Field::new(PROFILE_ID, DataType::FixedSizeBinary(16), true),
    ]))
}

/// The profile totals' schema (version 4): the samples' columns, then `sample_row`, the first
/// row of the samples section holding the row's (series, timestamp). The samples of a series
/// at `[a, b)` are then the rows from the `sample_row` of its first total at or after `a` to
/// that of its first total at or after `b` (or the series' end), found without decoding a
/// page of samples (`query::scan`). Null where a reader lacks it (older blocks).
pub fn profile_totals_schema() -> SchemaRef {
    let samples = samples_schema();
    let mut fields: Vec<Field> = samples
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new(columns::SAMPLE_ROW, DataType::UInt64, true));
    Arc::new(Schema::new(fields))
}

/// How hard a samples section's pages are compressed: by what stays and what a later merge
/// replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pages {
    /// LZ4 (raw): L0 segments, a flush's few thousand rows, which the first merge replaces
    /// within seconds. Parquet's zstd codec makes a compression and a decompression context
    /// for every column chunk it writes or reads, and each context asks the CPU for its
    /// features (`cpuid`, which a virtual machine traps); LZ4 keeps no context. On the `small`
    /// bench the zstd codecs' making was 3.4 % of the server's CPU, most of it for the
    /// segments' chunks, written once and read by the L0 merge and the queries of fresh data.
    Segment,
    /// zstd level 1: the L1 and L2 blocks merged from segments, which later merges replace
    /// within minutes. zstd resets its tables for every page it compresses, a level 3
    /// context's several times larger than a level 1 one's: on the `small` bench those resets
    /// were 1.4 % of the server's instructions, most of them for the segments' pages (zstd
    /// then), where a segment's few hundred rows make pages of a few KiB.
    Fresh,
    /// zstd level 3: top-level blocks, which stay.
    Kept,
}

impl Pages {
    /// The pages of a block of `level`.
    pub fn of_level(level: u32) -> Self {
        if level >= crate::format::meta::TOP_LEVEL {
            Self::Kept
        } else {
            Self::Fresh
        }
    }

    fn compression(self) -> Result<Compression> {
        Ok(match self {
            Self::Segment => Compression::LZ4_RAW,
            Self::Fresh => Compression::ZSTD(ZstdLevel::try_new(1)?),
            Self::Kept => Compression::ZSTD(ZstdLevel::try_new(3)?),
        })
    }
}

/// The optional columns of a samples section that hold nothing in a file (spans all 0; trace
/// ids, per-sample labels, profile ids all null), written without compression.
///
/// Parquet's zstd codec makes a compression and a decompression context for every column chunk
/// it writes or reads, and each context asks the CPU for its features (`cpuid`, which a virtual
/// machine traps): on the `small` bench that was 5 % of the server's CPU, most of it for the
/// segments' few hundred rows and the L0 merges reading them. A blank column's pages are a
/// run of one definition level (or one dictionary index), a few bytes that zstd would not make
/// smaller, and a column chunk written uncompressed is read without a codec.
///
/// A compaction output's column is blank when it is in every source, as told by the sources'
/// column chunks ([`Blank::of_parquet`]): only this rule writes a chunk uncompressed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Blank(u16);

impl Blank {
    /// Columns that may be blank.
    const OPTIONAL: [usize; 4] = [
        col::SPAN_ID,
        col::TRACE_ID,
        col::SAMPLE_LABELS,
        col::PROFILE_ID,
    ];

    /// Nothing blank (every column compressed).
    pub const NONE: Self = Self(0);

    /// What a rollup never stores: spans, trace ids and per-sample labels, and for stack
    /// rollups profile ids.
    pub fn rollup(profile_totals: bool) -> Self {
        let mut b = Self::NONE;
        for c in [col::SPAN_ID, col::TRACE_ID, col::SAMPLE_LABELS] {
            b.0 |= 1 << c;
        }
        if !profile_totals {
            b.0 |= 1 << col::PROFILE_ID;
        }
        b
    }

    /// The optional columns of `batch` that hold nothing.
    pub fn of_batch(batch: &RecordBatch) -> Self {
        let mut b = Self::NONE;
        for c in Self::OPTIONAL {
            let Some(a) = batch.columns().get(c) else {
                continue;
            };
            let blank = match a.as_primitive_opt::<UInt64Type>() {
                Some(spans) => spans.null_count() == 0 && spans.values().iter().all(|&v| v == 0),
                None => a.null_count() == a.len(),
            };
            if blank {
                b.0 |= 1 << c;
            }
        }
        b
    }

    /// The optional columns whose every column chunk in `metadata` is uncompressed: written
    /// blank by this rule (files written before it compress every column, so none).
    pub fn of_parquet(metadata: &parquet::file::metadata::ParquetMetaData) -> Self {
        let mut b = Self::NONE;
        for c in Self::OPTIONAL {
            let uncompressed = metadata.row_groups().iter().all(|rg| {
                rg.columns()
                    .get(c)
                    .is_some_and(|chunk| chunk.compression() == Compression::UNCOMPRESSED)
            });
            if uncompressed {
                b.0 |= 1 << c;
            }
        }
        b
    }

    /// Blank in both.
    pub fn and(self, other: Self) -> Self {
        Self(self.0 & other.0)
    }

    fn columns(self) -> impl Iterator<Item = &'static str> {
        let names = [
            columns::SPAN_ID,
            columns::TRACE_ID,
            columns::SAMPLE_LABELS,
            columns::PROFILE_ID,
        ];
        Self::OPTIONAL
            .into_iter()
            .zip(names)
            .filter(move |(c, _)| self.0 & (1 << c) != 0)
            .map(|(_, name)| name)
    }
}

/// Parquet settings of every samples section: compressed as `pages` says, an offset index
/// (so row ranges map to pages), page statistics of the timestamps alone (the only ones a
/// reader uses, to narrow a series to the pages of a time range: `query::scan`), delta
/// encoding for the sorted integer columns; `blank` columns uncompressed.
pub fn writer_properties(
    max_row_group_rows: usize,
    pages: Pages,
    blank: Blank,
) -> Result<WriterProperties> {
    let sort_col = |idx: usize| SortingColumn {
        column_idx: idx as i32,
        descending: false,
        nulls_first: false,
    };
    let delta = |name: &str| ColumnPath::from(name);
    let mut props = WriterProperties::builder();
    for name in blank.columns() {
        props = props.set_column_compression(ColumnPath::from(name), Compression::UNCOMPRESSED);
    }
    Ok(props
        .set_compression(pages.compression()?)
        .set_statistics_enabled(EnabledStatistics::None)
        .set_column_statistics_enabled(delta(columns::TIMESTAMP), EnabledStatistics::Page)
        .set_max_row_group_row_count(Some(max_row_group_rows))
        .set_data_page_row_count_limit(8 * 1024)
        // Runs of one value: delta-coded as cheaply as dictionary-coded, without hashing
        // every row into a dictionary.
        .set_column_dictionary_enabled(delta(columns::SERIES_ID), false)
        .set_column_encoding(delta(columns::SERIES_ID), Encoding::DELTA_BINARY_PACKED)
        .set_column_dictionary_enabled(delta(columns::TIMESTAMP), false)
        .set_column_encoding(delta(columns::TIMESTAMP), Encoding::DELTA_BINARY_PACKED)
        .set_column_dictionary_enabled(delta(columns::STACK_ID), false)
        .set_column_encoding(delta(columns::STACK_ID), Encoding::DELTA_BINARY_PACKED)
        .set_column_dictionary_enabled(delta(columns::SAMPLE_ROW), false)
        .set_column_encoding(delta(columns::SAMPLE_ROW), Encoding::DELTA_BINARY_PACKED)
        // A profile's rows repeat its id, and the ids of one process differ in a few bytes
        // ([`new_profile_id`]): zstd over plain pages squeezes both (0.09 B a row on the small
        // preset, against 0.17 prefix-delta encoded; parquet-rs's writer version 1.0 keeps no
        // dictionary for fixed-size binary columns).
        .set_column_dictionary_enabled(delta(columns::PROFILE_ID), false)
        .set_column_encoding(delta(columns::PROFILE_ID), Encoding::PLAIN)
        .set_sorting_columns(Some(vec![
            sort_col(col::SERIES_ID),
            sort_col(col::TIMESTAMP),
            sort_col(col::STACK_ID),
        ]))
        .build())
}

/// A Parquet writer of samples (or rollup) rows of `schema` ([`samples_schema`] or
/// [`profile_totals_schema`]) into a new local file at `path`.
pub(crate) fn samples_file_writer(
    path: &std::path::Path,
    schema: SchemaRef,
    row_group_rows: usize,
    pages: Pages,
    blank: Blank,
) -> Result<ArrowWriter<std::fs::File>> {
    let file = std::fs::File::create(path).map_err(|source| crate::Error::Io {
        path: path.display().to_string(),
        source,
    })?;
    Ok(ArrowWriter::try_new(
        file,
        schema,
        Some(writer_properties(row_group_rows, pages, blank)?),
    )?)
}

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
fn sort_by_series_and_time(rows: Vec<Row>) -> Vec<Row> {
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

struct SeriesEntry {
    profile_type: String,
    labels: Labels,
    min: i64,
    max: i64,
}

/// How many rows, series and symbols a [`DatasetBuilder`] held
/// ([`DatasetBuilder::capacity_hint`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DatasetCapacity {
    rows: usize,
    series: usize,
    symbols: crate::format::symbols::SymbolsCapacity,
}

/// Accumulates one tenant's profiles into a dataset.
pub struct DatasetBuilder {
    tenant: String,
    symbols: SymbolsBuilder,
    /// Indices into `series`, by the hash of their profile type id and labels
    /// (`series_hasher`): a known series is found without cloning its labels.
    series_index: hashbrown::HashTable<u32>,
    series_hasher: hashbrown::DefaultHashBuilder,
    series: Vec<SeriesEntry>,
    rows: Vec<Row>,
    profiles: u64,
    sample_labels: HashMap<String, Arc<str>>,
}

/// A finished dataset: its sections and its metadata (offsets relative to the samples section
/// until [`assemble_object`] places it).
#[derive(Debug)]
pub struct BuiltDataset {
    pub meta: BlockMeta,
    pub samples: Bytes,
    pub symbols: Bytes,
    /// The symbols as a query reads them ([`crate::format::symbols::SymbolsBuilder::encode_with_table`]).
    pub table: std::sync::Arc<crate::format::symbols::SymbolTable>,
}

impl DatasetBuilder {
    /// An empty dataset for `tenant`.
    pub fn new(tenant: impl Into<String>) -> Self {
        Self::with_capacity(tenant, DatasetCapacity::default())
    }

    /// An empty dataset for `tenant` with room for `c` ([`Self::capacity_hint`] of the
    /// tenant's last dataset: a shard's segments of a tenant are alike in size).
    pub fn with_capacity(tenant: impl Into<String>, c: DatasetCapacity) -> Self {
        Self {
            tenant: tenant.into(),
            symbols: SymbolsBuilder::with_capacity(c.symbols),
            series_index: hashbrown::HashTable::with_capacity(c.series),
            series_hasher: hashbrown::DefaultHashBuilder::default(),
            series: Vec::with_capacity(c.series),
            rows: Vec::with_capacity(c.rows),
            profiles: 0,
            sample_labels: HashMap::new(),
        }
    }

    /// What this dataset holds, as [`Self::with_capacity`] takes it.
    pub fn capacity_hint(&self) -> DatasetCapacity {
        DatasetCapacity {
            rows: self.rows.len(),
            series: self.series.len(),
            symbols: self.symbols.capacity_hint(),
        }
    }

    /// The dataset's tenant.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// True when nothing was added.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Rough memory use, for flush decisions.
    pub fn estimated_bytes(&self) -> usize {
        self.rows.len() * std::mem::size_of::<Row>()
            + self.series.len() * 256
            + self.symbols.estimated_bytes()
    }

    /// Adds a normalized profile.
    pub fn add(&mut self, profile: &NormalizedProfile) {
        if profile.series.is_empty() {
            return;
        }
        let locations = self.symbols.add_locations(&profile.symbols);
        // A profile's series (one per sample type: two for Go's CPU profile, four for its heap
        // profile) share their stacks: each distinct stack is walked into the tree once, the
        // other series' samples find its stack id here.
        let shared = profile.series.len() > 1;
        let mut ids: hashbrown::HashMap<&[u32], u32> = hashbrown::HashMap::new();
        // A sample's stack as block location indices, leaf first (reused).
        let mut path: Vec<u32> = Vec::new();
        for series in &profile.series {
            if series.samples.is_empty() {
                continue;
            }
            // Every ingested profile of a series gets its own id, as Pyroscope's distributor
            // gives one: exemplars name it and `profile_id_selector` selects by it.
            let profile_id = Some(new_profile_id());
            let id = self.series_id(series.profile_type.id(), &series.labels);
            for sample in &series.samples {
                let timestamp = if sample.timestamp_nanos != 0 {
                    sample.timestamp_nanos
                } else {
                    series.time_nanos
                };
                let entry = &mut self.series[id as usize];
                entry.min = entry.min.min(timestamp);
                entry.max = entry.max.max(timestamp);
                let symbols = &mut self.symbols;
                let mut walk = || {
                    path.clear();
                    path.extend(sample.stack.iter().map(|&l| locations[l as usize]));
                    symbols.add_stack_path(&path)
                };
                let stack = if shared {
                    *ids.entry(sample.stack.as_slice()).or_insert_with(walk)
                } else {
                    walk()
                };
                let labels = (!sample.labels.is_empty()).then(|| {
                    let encoded = encode_sample_labels(&sample.labels);
                    Arc::clone(
                        self.sample_labels
                            .entry(encoded.clone())
                            .or_insert_with(|| Arc::from(encoded)),
                    )
                });
                self.rows.push(Row {
                    series: id,
                    timestamp,
                    stack,
                    value: sample.value,
                    span_id: sample.span_id,
                    trace_id: sample.trace_id,
                    labels,
                    profile_id,
                });
            }
            self.profiles += 1;
        }
    }

    /// The index in `series` of the series of `profile_type` (its id) and `labels`, added if
    /// it is new.
    fn series_id(&mut self, profile_type: String, labels: &Labels) -> u32 {
        use std::hash::BuildHasher;
        let hash = self.series_hasher.hash_one((profile_type.as_str(), labels));
        let series = &self.series;
        if let Some(&id) = self.series_index.find(hash, |&i| {
            let s = &series[i as usize];
            s.profile_type == profile_type && s.labels == *labels
        }) {
            return id;
        }
        let id = self.series.len() as u32;
        self.series.push(SeriesEntry {
            profile_type,
            labels: labels.clone(),
            min: i64::MAX,
            max: i64::MIN,
        });
        let (series, hasher) = (&self.series, &self.series_hasher);
        self.series_index.insert_unique(hash, id, |&i| {
            let s = &series[i as usize];
            hasher.hash_one((s.profile_type.as_str(), &s.labels))
        });
        id
    }

    /// Sorts and encodes the dataset.
    pub fn finish(self) -> Result<BuiltDataset> {
        let Self {
            tenant,
            mut symbols,
            series,
            mut rows,
            profiles,
            ..
        } = self;
        let order = series_order(series.iter().map(|s| (s.profile_type.as_str(), &s.labels)));
        let mut new_id = vec![0u32; series.len()];
        for (new, &old) in order.iter().enumerate() {
            new_id[old as usize] = new as u32;
        }
        for row in &mut rows {
            row.series = new_id[row.series as usize];
        }
        let mut rows = sort_by_series_and_time(rows);
        // Stack ids numbered as the rows meet them, so a series' stacks have neighbouring ids;
        // then each (series, timestamp)'s rows sorted by their whole key.
        let renumbered = symbols.renumber_stacks(rows.iter().map(|r| r.stack));
        for row in &mut rows {
            row.stack = renumbered[row.stack as usize];
        }
        #[cfg(feature = "testing")]
        if crate::format::symbols::testing::legacy_version().is_some_and(|v| v < 3) {
            // Older formats have no stack ids: rows hold the tree's nodes.
            for row in &mut rows {
                row.stack = symbols.stack_node(row.stack);
            }
        }
        for group in rows.chunk_by_mut(|a, b| (a.series, a.timestamp) == (b.series, b.timestamp)) {
            group.sort_unstable_by(|a, b| a.key().cmp(&b.key()));
        }
        let mut table = crate::format::series_labels::LabelTableBuilder::default();
        for &old in &order {
            table.add(series[old as usize].labels.iter());
        }
        let mut series_meta: Vec<SeriesMeta> = order
            .iter()
            .zip(table.finish())
            .map(|(&old, labels)| {
                let s = &series[old as usize];
                SeriesMeta {
                    labels,
                    profile_type: s.profile_type.as_str().into(),
                    min_time_nanos: s.min,
                    max_time_nanos: s.max,
                    first_row: 0,
                    rows: 0,
                }
            })
            .collect();
        for (i, r) in rows.iter().enumerate() {
            let s = &mut series_meta[r.series as usize];
            if s.rows == 0 {
                s.first_row = i as u64;
            }
            s.rows += 1;
        }
        // Series without rows (every sample dropped) would have no range: keep none of them.
        debug_assert!(series_meta.iter().all(|s| s.rows > 0));

        let mut batch = RowBatchBuilder::with_capacity(rows.len());
        for r in &rows {
            batch.push(r);
        }
        let samples = write_parquet(&batch.into_batch()?)?;
        let stack_nodes = symbols.stack_nodes() as u64;
        let (path_lookups, path_hits) = symbols.path_lookups();
        tracing::debug!(
            rows = rows.len(),
            stack_nodes,
            path_lookups,
            path_hits,
            "segment stacks"
        );
        let (symbols, table) = symbols.encode_with_table(segment_pages())?;
        let meta = BlockMeta {
            format_version: BLOCK_FORMAT_VERSION,
            id: String::new(),
            tenant,
            shard: 0,
            level: 0,
            min_time_nanos: series_meta
                .iter()
                .map(|s| s.min_time_nanos)
                .min()
                .unwrap_or(0),
            max_time_nanos: series_meta
                .iter()
                .map(|s| s.max_time_nanos)
                .max()
                .unwrap_or(0),
            object_size: 0,
            samples: Section {
                offset: 0,
                size: samples.len() as u64,
            },
            symbols: Section {
                offset: samples.len() as u64,
                size: symbols.len() as u64,
            },
            series: series_meta,
            rows: rows.len() as u64,
            profiles,
            stack_nodes,
            compacted_from: Vec::new(),
            rollups: Vec::new(),
            index: Default::default(),
            logs: Vec::new(),
        };
        Ok(BuiltDataset {
            meta,
            samples,
            symbols,
            table: std::sync::Arc::new(table),
        })
    }
}

/// Series order = sort order: profile type, service name, then the whole label set. Returns the
/// indices of `series` in that order.
pub fn series_order<'a>(series: impl Iterator<Item = (&'a str, &'a Labels)>) -> Vec<u32> {
    let keys: Vec<(&str, Option<&str>, &Labels)> = series
        .map(|(pt, labels)| (pt, labels.get(LABEL_SERVICE_NAME), labels))
        .collect();
    let mut order: Vec<u32> = (0..keys.len() as u32).collect();
    order.sort_by(|&a, &b| keys[a as usize].cmp(&keys[b as usize]));
    order
}

/// The sort key of a series in [`series_order`], from its metadata.
pub fn series_sort_key(s: &SeriesMeta) -> (&str, Option<&str>, Vec<(&str, &str)>) {
    let mut labels: Vec<(&str, &str)> = s.labels.iter().collect();
    labels.sort_unstable();
    (&s.profile_type, s.label(LABEL_SERVICE_NAME), labels)
}

/// Places datasets in one object with its footer: returns the object and each dataset's
/// metadata with its offsets, id, shard, level and object size set.
pub fn assemble_object(
    id: &str,
    shard: u32,
    level: u32,
    datasets: Vec<BuiltDataset>,
) -> (Bytes, Vec<BlockMeta>) {
    let mut out = Vec::with_capacity(
        datasets
            .iter()
            .map(|d| d.samples.len() + d.symbols.len())
            .sum::<usize>()
            + 4096,
    );
    let mut metas = Vec::with_capacity(datasets.len());
    for d in datasets {
        let mut m = d.meta;
        m.id = id.to_owned();
        m.shard = shard;
        m.level = level;
        m.samples = Section {
            offset: out.len() as u64,
            size: d.samples.len() as u64,
        };
        out.extend_from_slice(&d.samples);
        m.symbols = Section {
            offset: out.len() as u64,
            size: d.symbols.len() as u64,
        };
        out.extend_from_slice(&d.symbols);
        metas.push(m);
    }
    out.extend_from_slice(&encode_footer(&metas));
    for m in &mut metas {
        m.object_size = out.len() as u64;
    }
    (Bytes::from(out), metas)
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

/// Rows per row group of an L0 dataset (small: one flush).
const L0_ROW_GROUP_ROWS: usize = 256 * 1024;

/// Switches for the tests of old formats.
#[cfg(feature = "testing")]
pub mod testing {
    /// While set, segments' samples are written with zstd level 1, as builds before LZ4
    /// segments wrote them: for the tests that read and compact old and new together.
    pub static SEGMENT_ZSTD: std::sync::atomic::AtomicBool =
        std::sync::atomic::AtomicBool::new(false);
}

/// How a segment's pages are compressed.
fn segment_pages() -> Pages {
    #[cfg(feature = "testing")]
    if testing::SEGMENT_ZSTD.load(std::sync::atomic::Ordering::Relaxed) {
        return Pages::Fresh;
    }
    Pages::Segment
}

fn write_parquet(batch: &RecordBatch) -> Result<Bytes> {
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(
        &mut out,
        batch.schema(),
        Some(writer_properties(
            L0_ROW_GROUP_ROWS,
            segment_pages(),
            Blank::of_batch(batch),
        )?),
    )?;
    writer.write(batch)?;
    writer.close()?;
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use arrow::array::AsArray;
    use arrow::datatypes::{Int64Type, UInt32Type};
    use kiln_otel::model::ProfileType;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    use super::*;
    use crate::format::symbols::SymbolTable;
    use crate::testing::{frames, profile};

    proptest::proptest! {
        /// Sorting the runs of one (series, timestamp) is the stable sort of the rows.
        #[test]
        fn rows_sorted_by_their_runs_as_a_stable_sort_sorts_them(
            keys in proptest::collection::vec((0u32..4, 0i64..3, 1usize..4), 0..40),
        ) {
            let mut rows = Vec::new();
            for (series, timestamp, n) in keys {
                for _ in 0..n {
                    rows.push(Row {
                        series,
                        timestamp,
                        stack: rows.len() as u32,
                        value: 1,
                        span_id: 0,
                        trace_id: None,
                        labels: None,
                        profile_id: None,
                    });
                }
            }
            let mut expected = rows.clone();
            expected.sort_by_key(|r| (r.series, r.timestamp));
            proptest::prop_assert_eq!(sort_by_series_and_time(rows), expected);
        }
    }

    /// A segment's optional columns that hold nothing are written uncompressed, the rest with
    /// LZ4 (no codec context to make per column chunk); the file reads back the same, and
    /// tells which columns it left blank.
    #[test]
    fn blank_columns_are_written_uncompressed() {
        use parquet::file::reader::FileReader;
        let row = |i: u32, span: u64, labels: bool| Row {
            series: 0,
            timestamp: i64::from(i),
            stack: i,
            value: 1,
            span_id: span,
            trace_id: None,
            labels: labels.then(|| Arc::from("thread=1")),
            profile_id: Some([i as u8; 16]),
        };
        let blank_of = |rows: &[Row]| {
            let mut b = RowBatchBuilder::default();
            rows.iter().for_each(|r| b.push(r));
            let batch = b.finish().expect("a batch");
            let file = write_parquet(&batch).unwrap();
            let reader =
                parquet::file::serialized_reader::SerializedFileReader::new(file.clone()).unwrap();
            let compressed: Vec<bool> = reader.metadata().row_groups()[0]
                .columns()
                .iter()
                .map(|c| match c.compression() {
                    Compression::UNCOMPRESSED => false,
                    Compression::LZ4_RAW => true,
                    other => panic!("a segment's column chunk in {other:?}"),
                })
                .collect();
            let back: Vec<RecordBatch> = ParquetRecordBatchReaderBuilder::try_new(file)
                .unwrap()
                .build()
                .unwrap()
                .map(|b| b.unwrap())
                .collect();
            assert_eq!(back, std::slice::from_ref(&batch));
            let blank = Blank::of_parquet(reader.metadata());
            assert_eq!(blank, Blank::of_batch(&batch));
            (blank, compressed)
        };
        // Spans 0, no trace ids, no labels: those three blank, profile ids not.
        let (blank, compressed) = blank_of(&(0..50).map(|i| row(i, 0, false)).collect::<Vec<_>>());
        assert_eq!(blank, Blank::rollup(true));
        assert_eq!(
            compressed,
            [true, true, true, true, false, false, false, true]
        );
        // One span and one row's labels: only trace ids blank.
        let mut rows: Vec<Row> = (0..50).map(|i| row(i, 0, false)).collect();
        rows[7].span_id = 42;
        rows[9].labels = Some(Arc::from("thread=2"));
        let (blank, compressed) = blank_of(&rows);
        assert_eq!(
            compressed,
            [true, true, true, true, true, false, true, true]
        );
        assert_eq!(blank.and(Blank::rollup(false)), blank);
        assert_eq!(Blank::rollup(true).and(blank), blank);
        // A file written with every column compressed (as before this rule) leaves none blank.
        let mut b = RowBatchBuilder::default();
        (0..10).for_each(|i| b.push(&row(i, 0, false)));
        let batch = b.finish().expect("a batch");
        let mut out = Vec::new();
        let props = writer_properties(1024, Pages::Fresh, Blank::NONE).unwrap();
        let mut w = ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let reader =
            parquet::file::serialized_reader::SerializedFileReader::new(Bytes::from(out)).unwrap();
        assert_eq!(Blank::of_parquet(reader.metadata()), Blank::NONE);
        // Merged blocks' pages stay zstd.
        for c in reader.metadata().row_groups()[0].columns() {
            assert!(matches!(c.compression(), Compression::ZSTD(_)));
        }
    }

    /// A batch builder used again after `finish` (as a compaction output or a rollup uses
    /// one, its room kept) makes the batches fresh builders make, in either mode.
    #[test]
    fn a_batch_builder_used_again_makes_the_same_batches() {
        let row = |i: u32| Row {
            series: i % 3,
            timestamp: 1_000 + i64::from(i),
            stack: i * 7,
            value: i64::from(i) * 10 + 1,
            span_id: u64::from(i % 2) * 99,
            trace_id: i.is_multiple_of(3).then_some([i as u8; 16]),
            labels: (i % 4 == 1).then(|| Arc::from(format!("thread={i}").as_str())),
            profile_id: (!i.is_multiple_of(5)).then_some([7; 16]),
        };
        let rows: Vec<Row> = (0..40).map(row).collect();
        // Batches of 17, 17 and 6 rows: the second fills the room the first left, the third
        // stays within it.
        let parts: Vec<&[Row]> = rows.chunks(17).collect();
        for totals in [false, true] {
            let fresh = || {
                if totals {
                    RowBatchBuilder::profile_totals()
                } else {
                    RowBatchBuilder::default()
                }
            };
            let push = |b: &mut RowBatchBuilder, part: &[Row]| {
                for (i, r) in part.iter().enumerate() {
                    if totals {
                        b.push_total(r, i as u64 * 3);
                    } else {
                        b.push(r);
                    }
                }
            };
            let mut reused = fresh();
            for (i, part) in parts.iter().enumerate() {
                push(&mut reused, part);
                let got = if i + 1 == parts.len() {
                    std::mem::take(&mut reused).into_batch().expect("a batch")
                } else {
                    reused.finish().expect("a batch")
                };
                assert!(reused.is_empty());
                let mut once = fresh();
                push(&mut once, part);
                let want = once.finish().expect("a batch");
                assert_eq!(got, want, "batch {i}, profile totals: {totals}");
                assert_eq!(got.num_rows(), part.len());
                // The id columns are arrow's own array of those ids, nulls where none.
                for (column, id) in [
                    (
                        col::TRACE_ID,
                        (|r: &Row| r.trace_id) as fn(&Row) -> Option<[u8; 16]>,
                    ),
                    (col::PROFILE_ID, |r: &Row| r.profile_id),
                ] {
                    let ids = FixedSizeBinaryArray::try_from_sparse_iter_with_size(
                        part.iter().map(id),
                        16,
                    )
                    .expect("16-byte ids");
                    assert_eq!(got.column(column).as_fixed_size_binary(), &ids);
                }
            }
        }
    }

    /// A dataset started with room for another's contents (as a shard starts a tenant's next
    /// segment) holds and writes the same.
    #[test]
    fn a_dataset_with_room_reserved_builds_the_same() {
        let stacks = [(frames("main;a;b"), 1), (frames("main;c"), 2)];
        let profiles: Vec<NormalizedProfile> = (0..6)
            .map(|i| profile(&format!("svc{}", i % 2), &stacks, 1_000 * (i + 1)))
            .collect();
        let build = |mut b: DatasetBuilder| {
            for p in &profiles {
                b.add(p);
            }
            b
        };
        let first = build(DatasetBuilder::new("t"));
        let hint = first.capacity_hint();
        assert_ne!(hint, DatasetCapacity::default());
        let again = build(DatasetBuilder::with_capacity("t", hint));
        assert_eq!(again.capacity_hint(), hint);
        assert_eq!(again.estimated_bytes(), first.estimated_bytes());
        let (a, b) = (
            first.finish().expect("built"),
            again.finish().expect("built"),
        );
        assert_eq!(a.symbols, b.symbols);
        assert_eq!(a.meta.series, b.meta.series);
        assert_eq!(a.meta.rows, b.meta.rows);
        // A block's table, read back, asks for the room its writer held (a compaction output
        // starts with the largest of its sources').
        let table = SymbolTable::decode(&a.symbols).expect("decodes");
        assert_eq!(table.capacity_hint(), hint.symbols);
    }

    /// A series met again, in the same profile or a later one, is the same series; one that
    /// differs in a label or in its profile type is another.
    #[test]
    fn a_series_met_again_is_found_by_its_type_and_labels() {
        let stacks = [(frames("main;a"), 1), (frames("main;b"), 2)];
        let mut builder = DatasetBuilder::new("t");
        let first = profile("svc", &stacks, 1_000);
        builder.add(&first);
        builder.add(&profile("svc", &stacks, 2_000));
        builder.add(&profile("other", &stacks, 3_000));
        let mut labelled = profile("svc", &stacks, 4_000);
        labelled.series[0].labels.set("pod".into(), "p1".into());
        builder.add(&labelled);
        let mut typed = profile("svc", &stacks, 5_000);
        typed.series[0].profile_type =
            ProfileType::parse("process_cpu:samples:count:cpu:nanoseconds").expect("a type");
        builder.add(&typed);
        builder.add(&profile("svc", &stacks, 6_000));
        let built = builder.finish().expect("built");
        let mut got: Vec<(String, String, String, u64, i64, i64)> = built
            .meta
            .series
            .iter()
            .map(|s| {
                (
                    s.profile_type.to_string(),
                    s.label("service_name").unwrap_or_default().to_owned(),
                    s.label("pod").unwrap_or_default().to_owned(),
                    s.rows,
                    s.min_time_nanos,
                    s.max_time_nanos,
                )
            })
            .collect();
        got.sort();
        let cpu = first.series[0].profile_type.id();
        let samples = typed.series[0].profile_type.id();
        let row = |t: &str, svc: &str, pod: &str, rows, min, max| {
            (t.to_owned(), svc.to_owned(), pod.to_owned(), rows, min, max)
        };
        let mut want = vec![
            row(&cpu, "svc", "", 6, 1_000, 6_000),
            row(&cpu, "other", "", 2, 3_000, 3_000),
            row(&cpu, "svc", "p1", 2, 4_000, 4_000),
            row(&samples, "svc", "", 2, 5_000, 5_000),
        ];
        want.sort();
        assert_eq!(got, want);
    }

    /// A profile's series share their stacks (the walk of each distinct stack is reused across
    /// series): every row still names its own sample's stack, in every series, including a
    /// stack only one series has and a series whose samples come in another order.
    #[test]
    fn series_of_one_profile_share_stacks_and_each_row_keeps_its_own() {
        let stacks = [
            (frames("main;a;b"), 1),
            (frames("main;a;c"), 2),
            (frames("main;d"), 3),
        ];
        let mut p = profile("svc", &stacks, 1_000);
        let mut second = p.series[0].clone();
        second.profile_type = ProfileType::parse("process_cpu:samples:count:cpu:nanoseconds")
            .expect("a profile type");
        second.samples.reverse();
        for s in &mut second.samples {
            s.value *= 10;
        }
        // Only this series has the root alone (a prefix of the others' stacks).
        let mut root = second.samples[0].clone();
        root.stack = vec![*root.stack.last().expect("a frame")];
        root.value = 70;
        second.samples.push(root);
        p.series.push(second);

        let mut builder = DatasetBuilder::new("t");
        builder.add(&p);
        let built = builder.finish().expect("built");
        let symbols = SymbolTable::decode(&built.symbols).expect("symbols");
        let mut got = HashSet::new();
        let mut locations = Vec::new();
        let reader = ParquetRecordBatchReaderBuilder::try_new(built.samples.clone())
            .expect("parquet")
            .build()
            .expect("reader");
        for batch in reader {
            let batch = batch.expect("batch");
            let series = batch.column(0).as_primitive::<UInt32Type>();
            let stack = batch.column(2).as_primitive::<UInt32Type>();
            let value = batch.column(3).as_primitive::<Int64Type>();
            for r in 0..batch.num_rows() {
                symbols.stack_locations(stack.value(r), &mut locations);
                let names: Vec<&str> = locations
                    .iter()
                    .rev()
                    .flat_map(|&l| symbols.location_function_names(l))
                    .collect();
                let id = &built.meta.series[series.value(r) as usize].profile_type;
                let sample_type = id.split(':').nth(1).expect("a profile type id");
                got.insert((sample_type.to_owned(), names.join(";"), value.value(r)));
            }
        }
        let want: HashSet<(String, String, i64)> = [
            ("cpu", "main;a;b", 1),
            ("cpu", "main;a;c", 2),
            ("cpu", "main;d", 3),
            ("samples", "main;a;b", 10),
            ("samples", "main;a;c", 20),
            ("samples", "main;d", 30),
            ("samples", "main", 70),
        ]
        .into_iter()
        .map(|(t, s, v)| (t.to_owned(), s.to_owned(), v))
        .collect();
        assert_eq!(got, want);
    }

    /// Profile ids are version 7 UUIDs, distinct across threads, with the process's bits the
    /// same in each and the counter in the last five bytes.
    #[test]
    fn profile_ids_are_distinct_version_7_uuids() {
        let ids: Vec<[u8; 16]> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..10_000).map(|_| new_profile_id()).collect::<Vec<_>>()))
                .collect();
            threads
                .into_iter()
                .flat_map(|t| t.join().unwrap())
                .collect()
        });
        assert_eq!(ids.iter().collect::<HashSet<_>>().len(), ids.len());
        for id in &ids {
            let uuid = uuid::Uuid::from_bytes(*id);
            assert_eq!(uuid.get_version_num(), 7);
            assert_eq!(uuid.get_variant(), uuid::Variant::RFC4122);
            assert_eq!(id[6] & 0x0f, ids[0][6] & 0x0f, "the process's bits");
            assert_eq!(id[7..11], ids[0][7..11], "the process's bits");
        }
        let counter = |id: &[u8; 16]| {
            let mut n = [0u8; 8];
            n[3..].copy_from_slice(&id[11..]);
            u64::from_be_bytes(n)
        };
        let (a, b) = (new_profile_id(), new_profile_id());
        let step = counter(&b).wrapping_sub(counter(&a)) & ((1 << 40) - 1);
        assert!((1..1 << 30).contains(&step), "one process counts up");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let (secs, _) = uuid::Uuid::from_bytes(b).get_timestamp().unwrap().to_unix();
        assert!(secs.abs_diff(now / 1000) <= 1, "the time comes first");
    }
}
