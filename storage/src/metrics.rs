//! The storage engine's metrics, in one place (names in `docs/instrumentation.md`): object store
//! operations (counted by a decorator around the store, so no call site can forget them),
//! segment flushes, compaction, blocks per level. The query path's counters live in
//! [`crate::query::QueryCounters`] and are read at scrape time.
//!
//! The engine owns them; the process registers them in its registry with [`StorageMetrics::register`].

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, UploadPart,
};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// An object store operation.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    /// `get`, `get_ranges`, `put`, `put_multipart`, `delete`, `list`, `copy`, `rename`.
    pub op: &'static str,
}

/// An outcome: `ok` or `error`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
}

/// A block level (0: segments, 1–2: merged, 3: top).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LevelLabels {
    pub level: u32,
}

/// A compaction job's level and outcome.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CompactionLabels {
    /// The level merged: its sources' (an L0 merge writes L1 blocks), [`crate::format::meta::TOP_LEVEL`]
    /// for merges among top-level blocks and the packing of a quiet partition.
    pub level: u32,
    /// `ok`, `lost` (another compactor took the job), `quarantined` (a source was unreadable),
    /// `error`.
    pub outcome: &'static str,
}

fn seconds() -> Histogram {
    // 1 ms to about 4.4 min.
    Histogram::new(exponential_buckets(0.001, 2.0, 19))
}

/// The storage engine's metrics.
#[derive(Debug)]
pub struct StorageMetrics {
    pub object_store_requests: Family<OpLabels, Counter>,
    pub object_store_errors: Family<OpLabels, Counter>,
    /// Bytes read (`get`, `get_ranges`) and written (`put`, `put_multipart`).
    pub object_store_bytes: Family<OpLabels, Counter>,
    /// Until the store answered (the first byte, for reads).
    pub object_store_duration: Family<OpLabels, Histogram>,
    pub flushes: Family<OutcomeLabels, Counter>,
    pub flush_bytes: Histogram,
    pub flush_duration: Histogram,
    pub flush_rows: Counter,
    pub compaction_jobs: Family<CompactionLabels, Counter>,
    /// The next four by the level merged (as [`CompactionLabels::level`]): where the
    /// rewrites of a row go.
    pub compaction_duration: Family<LevelLabels, Histogram>,
    pub compaction_input_bytes: Family<LevelLabels, Counter>,
    pub compaction_output_bytes: Family<LevelLabels, Counter>,
    pub compaction_output_rows: Family<LevelLabels, Counter>,
    /// Blocks waiting in the compaction queue when it was last planned.
    pub compaction_queued_blocks: Gauge,
    /// Blocks per level, all tenants (refreshed in the background).
    pub blocks: Family<LevelLabels, Gauge>,
    /// Bytes of segments waiting in the spool for the object store.
    pub spool_bytes: Gauge,
    /// Spooled (acknowledged) segments the drain could not decode: kept in a file set aside.
    pub spool_undecodable_records: Counter,
    /// Spool files set aside as `*.corrupt` (unreadable, or holding undecodable records).
    pub spool_files_set_aside: Counter,
    /// Groups of records appended (and synced) to the write-ahead log, and their bytes.
    pub log_appends: Counter,
    pub log_bytes: Counter,
    /// Write-ahead log records replayed at start, and those that did not decode (skipped).
    pub log_replayed_records: Counter,
    pub log_undecodable_records: Counter,
    /// Log files a replay found damaged before their end, kept under the log's `aside/`.
    pub log_files_set_aside: Counter,
    /// Records of writes acknowledged from the log whose segment could not be made, kept under
    /// the log's `aside/`.
    pub log_records_set_aside: Counter,
    /// Segment builds a test asks to fail (fault injection; 0 in production).
    pub fail_segment_builds: std::sync::atomic::AtomicU32,
    /// Write shards that panicked (and were started again, up to five times).
    pub shard_panics: Counter,
    /// Cuts of a shard's buffered writes a query's barrier asked for.
    pub barrier_cuts: Counter,
}

/// Every `op` label value.
pub const OPS: [&str; 8] = [
    "get",
    "get_ranges",
    "put",
    "put_multipart",
    "delete",
    "list",
    "copy",
    "rename",
];

impl Default for StorageMetrics {
    fn default() -> Self {
        let m = Self::empty();
        // Errors exist at zero from the start, so a rate over them is 0, not absent.
        for op in OPS {
            let _ = m.object_store_errors.get_or_create(&OpLabels { op });
        }
        m
    }
}

impl StorageMetrics {
    fn empty() -> Self {
        Self {
            object_store_requests: Family::default(),
            object_store_errors: Family::default(),
            object_store_bytes: Family::default(),
            object_store_duration: Family::new_with_constructor(seconds),
            flushes: Family::default(),
            // 1 KiB to 256 MiB.
            flush_bytes: Histogram::new(exponential_buckets(1024.0, 4.0, 10)),
            flush_duration: seconds(),
            flush_rows: Counter::default(),
            compaction_jobs: Family::default(),
            compaction_duration: Family::new_with_constructor(seconds),
            compaction_input_bytes: Family::default(),
            compaction_output_bytes: Family::default(),
            compaction_output_rows: Family::default(),
            compaction_queued_blocks: Gauge::default(),
            blocks: Family::default(),
            spool_bytes: Gauge::default(),
            spool_undecodable_records: Counter::default(),
            spool_files_set_aside: Counter::default(),
            log_appends: Counter::default(),
            log_bytes: Counter::default(),
            log_replayed_records: Counter::default(),
            log_undecodable_records: Counter::default(),
            log_files_set_aside: Counter::default(),
            log_records_set_aside: Counter::default(),
            fail_segment_builds: std::sync::atomic::AtomicU32::new(0),
            shard_panics: Counter::default(),
            barrier_cuts: Counter::default(),
        }
    }
}

impl StorageMetrics {
    /// Registers every metric under `registry` (whose prefix, `kiln`, they take).
    pub fn register(&self, registry: &mut Registry) {
        let r = registry;
        r.register(
            "object_store_requests",
            "Object store requests by operation",
            self.object_store_requests.clone(),
        );
        r.register(
            "object_store_errors",
            "Object store requests that failed (not-found excepted), by operation",
            self.object_store_errors.clone(),
        );
        r.register(
            "object_store_bytes",
            "Bytes read from and written to the object store, by operation",
            self.object_store_bytes.clone(),
        );
        r.register(
            "object_store_request_duration_seconds",
            "Time until the object store answered, by operation",
            self.object_store_duration.clone(),
        );
        r.register(
            "storage_flushes",
            "Segment flushes by outcome",
            self.flushes.clone(),
        );
        r.register(
            "storage_flush_size_bytes",
            "Size of each flushed segment",
            self.flush_bytes.clone(),
        );
        r.register(
            "storage_flush_duration_seconds",
            "Time to build, upload and register a segment",
            self.flush_duration.clone(),
        );
        r.register(
            "storage_log_appends",
            "Groups of writes appended and synced to the write-ahead log (one fdatasync each)",
            self.log_appends.clone(),
        );
        r.register(
            "storage_log_bytes",
            "Bytes of records appended to the write-ahead log",
            self.log_bytes.clone(),
        );
        r.register(
            "storage_log_replayed_records",
            "Write-ahead log records replayed at start",
            self.log_replayed_records.clone(),
        );
        r.register(
            "storage_log_undecodable_records",
            "Write-ahead log records replayed at start that did not decode (their writes not replayed; each kept under the log's aside/)",
            self.log_undecodable_records.clone(),
        );
        r.register(
            "storage_log_records_set_aside",
            "Records of writes acknowledged from the write-ahead log whose segment could not be made (not stored; each kept under the log's aside/)",
            self.log_records_set_aside.clone(),
        );
        r.register(
            "storage_log_files_set_aside",
            "Write-ahead log files a replay found damaged before their end (the records after the damage not replayed; the file kept under the log's aside/)",
            self.log_files_set_aside.clone(),
        );
        r.register(
            "storage_shard_panics",
            "Write shards that panicked (a bug; each started again, up to five times)",
            self.shard_panics.clone(),
        );
        r.register(
            "storage_barrier_cuts",
            "Cuts of a write shard's buffered writes into a segment that a query asked for (it reads a buffered tenant and time range)",
            self.barrier_cuts.clone(),
        );
        r.register(
            "storage_spool_bytes",
            "Bytes of acknowledged segments waiting in the spool for the object store",
            self.spool_bytes.clone(),
        );
        r.register(
            "storage_spool_undecodable_records",
            "Acknowledged segments in the spool the drain could not decode (their file is set aside)",
            self.spool_undecodable_records.clone(),
        );
        r.register(
            "storage_spool_files_set_aside",
            "Spool files set aside as *.corrupt: unreadable, or holding undecodable segments",
            self.spool_files_set_aside.clone(),
        );
        r.register(
            "storage_flush_rows",
            "Sample rows flushed in segments",
            self.flush_rows.clone(),
        );
        r.register(
            "storage_compaction_jobs",
            "Compaction jobs by the level merged and outcome",
            self.compaction_jobs.clone(),
        );
        r.register(
            "storage_compaction_duration_seconds",
            "Time to run one compaction job, by the level merged",
            self.compaction_duration.clone(),
        );
        r.register(
            "storage_compaction_input_bytes",
            "Bytes of source blocks compaction merged, by their level",
            self.compaction_input_bytes.clone(),
        );
        r.register(
            "storage_compaction_output_bytes",
            "Bytes of blocks compaction wrote, by the level merged",
            self.compaction_output_bytes.clone(),
        );
        r.register(
            "storage_compaction_output_rows",
            "Sample rows of blocks compaction wrote, by the level merged",
            self.compaction_output_rows.clone(),
        );
        r.register(
            "storage_compaction_queued_blocks",
            "Blocks waiting in the compaction queue when it was last planned",
            self.compaction_queued_blocks.clone(),
        );
        r.register(
            "storage_blocks",
            "Blocks in the metastore by level, all tenants (refreshed every 30 s)",
            self.blocks.clone(),
        );
    }

    fn op(&self, op: &'static str) -> OpLabels {
        self.object_store_requests
            .get_or_create(&OpLabels { op })
            .inc();
        OpLabels { op }
    }

    fn done<T>(
        &self,
        labels: &OpLabels,
        started: Instant,
        result: &object_store::Result<T>,
        bytes: impl FnOnce(&T) -> u64,
    ) {
        self.object_store_duration
            .get_or_create(labels)
            .observe(started.elapsed().as_secs_f64());
        match result {
            Ok(v) => {
                let n = bytes(v);
                if n > 0 {
                    self.object_store_bytes.get_or_create(labels).inc_by(n);
                }
            }
            Err(object_store::Error::NotFound { .. }) => {}
            Err(_) => {
                self.object_store_errors.get_or_create(labels).inc();
            }
        }
    }
}

/// An [`ObjectStore`] that counts, times and sizes every operation of the store it wraps.
#[derive(Debug)]
pub struct InstrumentedStore {
    inner: Arc<dyn ObjectStore>,
    metrics: Arc<StorageMetrics>,
}

impl InstrumentedStore {
    pub fn new(inner: Arc<dyn ObjectStore>, metrics: Arc<StorageMetrics>) -> Self {
        Self { inner, metrics }
    }
}

impl std::fmt::Display for InstrumentedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Instrumented({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for InstrumentedStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let labels = self.metrics.op("put");
        let len = payload.content_length() as u64;
        let started = Instant::now();
        let result = self.inner.put_opts(location, payload, opts).await;
        self.metrics.done(&labels, started, &result, |_| len);
        result
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        let labels = self.metrics.op("put_multipart");
        let started = Instant::now();
        let result = self.inner.put_multipart_opts(location, opts).await;
        self.metrics.done(&labels, started, &result, |_| 0);
        result.map(|upload| {
            Box::new(InstrumentedUpload {
                inner: upload,
                metrics: Arc::clone(&self.metrics),
            }) as Box<dyn MultipartUpload>
        })
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let labels = self.metrics.op("get");
        let started = Instant::now();
        let head = options.head;
        let result = self.inner.get_opts(location, options).await;
        self.metrics.done(&labels, started, &result, |r| {
            if head { 0 } else { r.range.end - r.range.start }
        });
        result
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        let labels = self.metrics.op("get_ranges");
        let started = Instant::now();
        let result = self.inner.get_ranges(location, ranges).await;
        self.metrics.done(&labels, started, &result, |parts| {
            parts.iter().map(|b| b.len() as u64).sum()
        });
        result
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let metrics = Arc::clone(&self.metrics);
        self.inner
            .delete_stream(locations)
            .inspect(move |result| {
                let labels = metrics.op("delete");
                if let Err(e) = result
                    && !matches!(e, object_store::Error::NotFound { .. })
                {
                    metrics.object_store_errors.get_or_create(&labels).inc();
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.metrics.op("list");
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.metrics.op("list");
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let labels = self.metrics.op("list");
        let started = Instant::now();
        let result = self.inner.list_with_delimiter(prefix).await;
        self.metrics.done(&labels, started, &result, |_| 0);
        result
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        let labels = self.metrics.op("copy");
        let started = Instant::now();
        let result = self.inner.copy_opts(from, to, options).await;
        self.metrics.done(&labels, started, &result, |_| 0);
        result
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        let labels = self.metrics.op("rename");
        let started = Instant::now();
        let result = self.inner.rename_opts(from, to, options).await;
        self.metrics.done(&labels, started, &result, |_| 0);
        result
    }
}

/// A multipart upload whose parts' bytes are counted as `put_multipart` bytes.
#[derive(Debug)]
struct InstrumentedUpload {
    inner: Box<dyn MultipartUpload>,
    metrics: Arc<StorageMetrics>,
}

#[async_trait]
impl MultipartUpload for InstrumentedUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let len = data.content_length() as u64;
        let metrics = Arc::clone(&self.metrics);
        let part = self.inner.put_part(data);
        Box::pin(async move {
            let labels = OpLabels {
                op: "put_multipart",
            };
            let result = part.await;
            match &result {
                Ok(()) => {
                    metrics
                        .object_store_bytes
                        .get_or_create(&labels)
                        .inc_by(len);
                }
                Err(_) => {
                    metrics.object_store_errors.get_or_create(&labels).inc();
                }
            }
            result
        })
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        self.inner.complete().await
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.inner.abort().await
    }
}

#[cfg(test)]
mod tests {
    use object_store::memory::InMemory;
    use object_store::{ObjectStoreExt, PutPayload};

    use super::*;

    #[tokio::test]
    async fn every_operation_is_counted_sized_and_timed() {
        let metrics = Arc::new(StorageMetrics::default());
        let store = InstrumentedStore::new(Arc::new(InMemory::new()), Arc::clone(&metrics));
        let path = Path::from("a/b");
        store
            .put(&path, PutPayload::from_static(b"0123456789"))
            .await
            .unwrap();
        let got = store.get_range(&path, 2..6).await.unwrap();
        assert_eq!(&got[..], b"2345");
        assert!(store.get(&Path::from("missing")).await.is_err());
        store.delete(&path).await.unwrap();
        let get = |f: &Family<OpLabels, Counter>, op| f.get_or_create(&OpLabels { op }).get();
        assert_eq!(get(&metrics.object_store_requests, "put"), 1);
        assert_eq!(get(&metrics.object_store_bytes, "put"), 10);
        assert!(
            get(&metrics.object_store_requests, "get")
                + get(&metrics.object_store_requests, "get_ranges")
                >= 2
        );
        assert_eq!(
            get(&metrics.object_store_bytes, "get")
                + get(&metrics.object_store_bytes, "get_ranges"),
            4
        );
        // Not found is an answer, not an error.
        assert_eq!(get(&metrics.object_store_errors, "get"), 0);
        assert_eq!(get(&metrics.object_store_requests, "delete"), 1);
        let mut registry = Registry::with_prefix("kiln");
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("kiln_object_store_requests_total{op=\"put\"} 1"),
            "{text}"
        );
        assert!(text.contains("kiln_object_store_request_duration_seconds_bucket"));
    }
}
