//! The samples section's Parquet schema: its columns, the profile totals' schema, and how its
//! pages are written (compression by level, blank columns).

use crate::Result;
use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt64Type};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding};
use parquet::file::metadata::SortingColumn;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use std::sync::Arc;

use super::*;

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
