//! Block format, version 1 (`docs/adr/0002-block-format.md`).
//!
//! A block is two objects under `blocks/{shard}/{tenant}/{ulid}/`:
//!
//! - `samples.parquet`: one row per (series, timestamp, stack, span, trace), sorted by
//!   (profile type, service name, series labels, timestamp, stack). Columns: `series_id`,
//!   `profile_type`, one nullable `labels.<name>` column per label name of the block (FrostDB's
//!   dynamic columns, so a label selector is a Parquet predicate), `timestamp` (ns), `stack_id`,
//!   `value`, `span_id` (0 = none) and `trace_id` (16 bytes, null = none).
//! - `symbols.bin`: the [`crate::symbols`] section the stack ids point into.
//!
//! Its metadata (series list, time range, sizes) lives in the metastore.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use arrow::array::{
    ArrayRef, FixedSizeBinaryBuilder, Int64Array, RecordBatch, StringBuilder, UInt32Array,
    UInt64Array,
};
use arrow::datatypes::{DataType, Field, Schema};
use bytes::Bytes;
use kiln_otel::model::{LABEL_SERVICE_NAME, Labels, NormalizedProfile};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::SortingColumn;
use parquet::file::properties::{EnabledStatistics, WriterProperties};

use crate::Result;
use crate::metastore::{BLOCK_FORMAT_VERSION, BlockMeta, SeriesMeta};
use crate::symbols::SymbolsBuilder;

/// Column names of the samples file.
pub mod columns {
    pub const SERIES_ID: &str = "series_id";
    pub const PROFILE_TYPE: &str = "profile_type";
    pub const TIMESTAMP: &str = "timestamp";
    pub const STACK_ID: &str = "stack_id";
    pub const VALUE: &str = "value";
    pub const SPAN_ID: &str = "span_id";
    pub const TRACE_ID: &str = "trace_id";
    pub const SAMPLE_LABELS: &str = "sample_labels";
    /// Prefix of the per-label columns.
    pub const LABEL_PREFIX: &str = "labels.";
}

/// The column holding label `name`.
pub fn label_column(name: &str) -> String {
    format!("{}{name}", columns::LABEL_PREFIX)
}

/// Object path of a block's directory. The tenant is escaped so that every object store, URL
/// and glob treats it literally.
pub fn block_dir(shard: u32, tenant: &str, id: &str) -> String {
    format!("blocks/{shard}/{}/{id}", escape_tenant(tenant))
}

/// A tenant id as a path segment: letters, digits, `_`, `.` and `-` as they are, every other
/// byte as `+HH` (`+` is not a tenant character, so the mapping is one to one; object stores
/// percent-encode `~`, so it cannot serve).
pub fn escape_tenant(tenant: &str) -> String {
    let mut out = String::with_capacity(tenant.len());
    for b in tenant.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-') {
            out.push(b as char);
        } else {
            out.push_str(&format!("+{b:02X}"));
        }
    }
    out
}

#[derive(Debug, Clone, Copy)]
struct Row {
    series: u32,
    timestamp: i64,
    stack: u32,
    value: i64,
    span_id: u64,
    trace_id: Option<[u8; 16]>,
    /// Index into the block's per-sample label sets, plus one; 0 = none.
    labels: u32,
}

struct SeriesEntry {
    profile_type: String,
    labels: Labels,
    min: i64,
    max: i64,
}

/// Accumulates one tenant's profiles into a block.
pub struct BlockBuilder {
    tenant: String,
    symbols: SymbolsBuilder,
    series_index: HashMap<(String, Labels), u32>,
    series: Vec<SeriesEntry>,
    rows: Vec<Row>,
    profiles: u64,
    label_names: std::collections::HashSet<String>,
    sample_labels: Vec<String>,
    sample_label_index: HashMap<String, u32>,
}

/// A finished block, ready to upload.
#[derive(Debug)]
pub struct BuiltBlock {
    pub meta: BlockMeta,
    pub samples: Bytes,
    pub symbols: Bytes,
}

impl BlockBuilder {
    /// An empty block for `tenant`.
    pub fn new(tenant: impl Into<String>) -> Self {
        Self {
            tenant: tenant.into(),
            symbols: SymbolsBuilder::default(),
            series_index: HashMap::new(),
            series: Vec::new(),
            rows: Vec::new(),
            profiles: 0,
            label_names: std::collections::HashSet::new(),
            sample_labels: Vec::new(),
            sample_label_index: HashMap::new(),
        }
    }

    /// The block's tenant.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// True when nothing was added.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Rough memory use of the block once encoded, for flush decisions: rows, symbols, and one
    /// label column entry per row and label name (the columns are dense).
    pub fn estimated_bytes(&self) -> usize {
        let label_names = self.label_names.len().max(1);
        self.rows.len() * (std::mem::size_of::<Row>() + 16 * label_names)
            + self.symbols.estimated_bytes()
    }

    /// Adds a normalized profile.
    pub fn add(&mut self, profile: &NormalizedProfile) {
        if profile.series.is_empty() {
            return;
        }
        let locations = self.symbols.add_locations(&profile.symbols);
        for series in &profile.series {
            let key = (series.profile_type.id(), series.labels.clone());
            let next = self.series.len() as u32;
            let id = *self.series_index.entry(key.clone()).or_insert(next);
            if id == next {
                for (name, _) in key.1.iter() {
                    if !self.label_names.contains(name) {
                        self.label_names.insert(name.to_owned());
                    }
                }
                self.series.push(SeriesEntry {
                    profile_type: key.0,
                    labels: key.1,
                    min: i64::MAX,
                    max: i64::MIN,
                });
            }
            for sample in &series.samples {
                let timestamp = if sample.timestamp_nanos != 0 {
                    sample.timestamp_nanos
                } else {
                    series.time_nanos
                };
                let entry = &mut self.series[id as usize];
                entry.min = entry.min.min(timestamp);
                entry.max = entry.max.max(timestamp);
                let stack = self
                    .symbols
                    .add_stack(sample.stack.iter().map(|&l| locations[l as usize]));
                let labels = if sample.labels.is_empty() {
                    0
                } else {
                    let encoded = encode_sample_labels(&sample.labels);
                    let next = self.sample_labels.len() as u32 + 1;
                    let i = *self
                        .sample_label_index
                        .entry(encoded.clone())
                        .or_insert(next);
                    if i == next {
                        self.sample_labels.push(encoded);
                    }
                    i
                };
                self.rows.push(Row {
                    series: id,
                    timestamp,
                    stack,
                    value: sample.value,
                    span_id: sample.span_id,
                    trace_id: sample.trace_id,
                    labels,
                });
            }
            self.profiles += 1;
        }
    }

    /// Sorts, encodes and describes the block. `id` is its ULID.
    pub fn finish(self, shard: u32, id: &str) -> Result<BuiltBlock> {
        let Self {
            tenant,
            symbols,
            series,
            mut rows,
            profiles,
            sample_labels,
            ..
        } = self;

        // Series order = sort order: profile type, service name, then the whole label set.
        let mut order: Vec<u32> = (0..series.len() as u32).collect();
        order.sort_by(|&a, &b| {
            let (a, b) = (&series[a as usize], &series[b as usize]);
            (&a.profile_type, a.labels.get(LABEL_SERVICE_NAME), &a.labels).cmp(&(
                &b.profile_type,
                b.labels.get(LABEL_SERVICE_NAME),
                &b.labels,
            ))
        });
        let mut new_id = vec![0u32; series.len()];
        for (new, &old) in order.iter().enumerate() {
            new_id[old as usize] = new as u32;
        }
        for row in &mut rows {
            row.series = new_id[row.series as usize];
        }
        rows.sort_unstable_by_key(|r| {
            (
                r.series,
                r.timestamp,
                r.stack,
                r.span_id,
                r.trace_id,
                r.labels,
            )
        });

        let series_meta: Vec<SeriesMeta> = order
            .iter()
            .map(|&old| {
                let s = &series[old as usize];
                SeriesMeta {
                    labels: s
                        .labels
                        .iter()
                        .map(|(k, v)| (k.to_owned(), v.to_owned()))
                        .collect(),
                    profile_type: s.profile_type.clone(),
                    min_time_nanos: s.min,
                    max_time_nanos: s.max,
                }
            })
            .collect();
        let label_names: BTreeSet<&str> = series_meta
            .iter()
            .flat_map(|s| s.labels.iter().map(|(k, _)| k.as_str()))
            .collect();

        let batch = samples_batch(&rows, &series_meta, &label_names, &sample_labels)?;
        let samples = write_parquet(&batch)?;
        let symbols = symbols.encode();
        let dir = block_dir(shard, &tenant, id);
        let meta = BlockMeta {
            format_version: BLOCK_FORMAT_VERSION,
            id: id.to_owned(),
            tenant,
            shard,
            compaction_level: 0,
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
            series: series_meta,
            samples_path: format!("{dir}/samples.parquet"),
            samples_bytes: samples.len() as u64,
            symbols_path: format!("{dir}/symbols.bin"),
            symbols_bytes: symbols.len() as u64,
            rows: rows.len() as u64,
            profiles,
        };
        Ok(BuiltBlock {
            meta,
            samples,
            symbols,
        })
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

fn samples_batch(
    rows: &[Row],
    series: &[SeriesMeta],
    label_names: &BTreeSet<&str>,
    sample_labels: &[String],
) -> Result<RecordBatch> {
    use columns::*;
    let mut fields = vec![
        Field::new(SERIES_ID, DataType::UInt32, false),
        Field::new(PROFILE_TYPE, DataType::Utf8, false),
    ];
    let mut cols: Vec<ArrayRef> = vec![
        Arc::new(UInt32Array::from_iter_values(rows.iter().map(|r| r.series))),
        {
            let mut b = StringBuilder::new();
            for r in rows {
                b.append_value(&series[r.series as usize].profile_type);
            }
            Arc::new(b.finish())
        },
    ];
    for name in label_names {
        fields.push(Field::new(label_column(name), DataType::Utf8, true));
        let mut b = StringBuilder::new();
        for r in rows {
            b.append_option(series[r.series as usize].label(name));
        }
        cols.push(Arc::new(b.finish()));
    }
    fields.extend([
        Field::new(TIMESTAMP, DataType::Int64, false),
        Field::new(STACK_ID, DataType::UInt32, false),
        Field::new(VALUE, DataType::Int64, false),
        Field::new(SPAN_ID, DataType::UInt64, false),
        Field::new(TRACE_ID, DataType::FixedSizeBinary(16), true),
        Field::new(SAMPLE_LABELS, DataType::Utf8, true),
    ]);
    cols.push(Arc::new(Int64Array::from_iter_values(
        rows.iter().map(|r| r.timestamp),
    )));
    cols.push(Arc::new(UInt32Array::from_iter_values(
        rows.iter().map(|r| r.stack),
    )));
    cols.push(Arc::new(Int64Array::from_iter_values(
        rows.iter().map(|r| r.value),
    )));
    cols.push(Arc::new(UInt64Array::from_iter_values(
        rows.iter().map(|r| r.span_id),
    )));
    let mut traces = FixedSizeBinaryBuilder::with_capacity(rows.len(), 16);
    for r in rows {
        match &r.trace_id {
            Some(t) => traces.append_value(t)?,
            None => traces.append_null(),
        }
    }
    cols.push(Arc::new(traces.finish()));
    let mut labels = StringBuilder::new();
    for r in rows {
        match r.labels {
            0 => labels.append_null(),
            i => labels.append_value(&sample_labels[i as usize - 1]),
        }
    }
    cols.push(Arc::new(labels.finish()));
    Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), cols)?)
}

fn write_parquet(batch: &RecordBatch) -> Result<Bytes> {
    let schema = batch.schema();
    let sort_col = |name: &str| SortingColumn {
        column_idx: schema.index_of(name).expect("column exists") as i32,
        descending: false,
        nulls_first: false,
    };
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_max_row_group_row_count(Some(256 * 1024))
        .set_data_page_row_count_limit(8 * 1024)
        .set_sorting_columns(Some(vec![
            sort_col(columns::SERIES_ID),
            sort_col(columns::TIMESTAMP),
            sort_col(columns::STACK_ID),
        ]))
        .build();
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, schema, Some(props))?;
    writer.write(batch)?;
    writer.close()?;
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_escaping_is_literal_and_one_to_one() {
        assert_eq!(escape_tenant("team-a_1.x"), "team-a_1.x");
        assert_eq!(escape_tenant("team*(1)!'"), "team+2A+281+29+21+27");
        assert_ne!(escape_tenant("a*"), escape_tenant("a+2A"));
    }
}
