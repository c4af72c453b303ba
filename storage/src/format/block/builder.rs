//! The dataset builder: one tenant's profiles of a segment gathered into sorted rows, series
//! and symbols, then written as the sections of one object.

use crate::Result;
use crate::format::meta::{BLOCK_FORMAT_VERSION, BlockMeta, Section, SeriesMeta, encode_footer};
use crate::format::symbols::SymbolsBuilder;
use arrow::array::RecordBatch;
use bytes::Bytes;
use kiln_otel::model::{LABEL_SERVICE_NAME, Labels, NormalizedProfile};
use parquet::arrow::ArrowWriter;
use std::collections::HashMap;
use std::sync::Arc;

use super::rows::sort_by_series_and_time;
use super::*;

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
    pub(super) symbols: crate::format::symbols::SymbolsCapacity,
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
    /// When its newest write was received ([`BlockMeta::received_ms`]).
    received_ms: u64,
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
            received_ms: 0,
        }
    }

    /// Notes that a write this dataset holds was received at `ms` (Unix ms).
    pub fn received(&mut self, ms: u64) {
        self.received_ms = self.received_ms.max(ms);
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
            received_ms: self.received_ms,
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

/// Rows per row group of an L0 dataset (small: one flush).
const L0_ROW_GROUP_ROWS: usize = 256 * 1024;

/// How a segment's pages are compressed.
fn segment_pages() -> Pages {
    #[cfg(feature = "testing")]
    if testing::SEGMENT_ZSTD.load(std::sync::atomic::Ordering::Relaxed) {
        return Pages::Fresh;
    }
    Pages::Segment
}

pub(super) fn write_parquet(batch: &RecordBatch) -> Result<Bytes> {
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
