//! Byte sources: a dataset's samples section (or one of its rollups) read as a Parquet file by
//! ranges of its object, from what is held in memory of a fresh object, the page cache of a
//! remote store, or the store.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::arrow::async_reader::{
    AsyncFileReader, ParquetRecordBatchStream, ParquetRecordBatchStreamBuilder,
};
use parquet::errors::ParquetError;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader};

use super::Caches;
use super::cache::{FreshObject, reader_options, unshare};
use super::report::{QueryCounters, read_bytes};
use crate::format::rollup::Source;
use crate::metastore::BlockMeta;
use crate::store::ObjectStorage;
use crate::{Error, Result};

/// Byte ranges of objects read before (object path, start, end): a remote store's pages are
/// kept in memory, as the local file system's are in the OS page cache. Objects never change.
pub(crate) type PageCache = moka::future::Cache<(Arc<str>, u64, u64), Bytes>;

/// A dataset's samples section as a Parquet file, read by ranges from its object.
pub(crate) struct SectionReader {
    store: ObjectStorage,
    path: Arc<str>,
    section: Range<u64>,
    counters: Arc<QueryCounters>,
    /// The engine's page cache, for queries (the compactor reads each block once: uncached).
    pages: Option<PageCache>,
    /// What the engine holds in memory of the block's object (a fresh segment's, a small
    /// compaction output's): ranges it holds are sliced from it, not read.
    fresh: Option<FreshObject>,
}

impl SectionReader {
    /// A reader of `block`'s samples or one of its rollups.
    pub(crate) fn new(caches: &Caches, block: &BlockMeta, source: Source) -> Self {
        let section = match source {
            Source::Samples => block.samples.range(),
            Source::Rollup(i) => block.rollups[i].section.range(),
        };
        Self {
            store: caches.store.clone(),
            path: block.path().into(),
            section,
            counters: Arc::clone(&caches.counters),
            pages: caches.pages.clone(),
            fresh: caches.fresh_object(block),
        }
    }

    /// The same reader without the page cache.
    pub(crate) fn uncached(mut self) -> Self {
        self.pages = None;
        self
    }

    fn page_key(&self, r: &Range<u64>) -> (Arc<str>, u64, u64) {
        (Arc::clone(&self.path), r.start, r.end)
    }

    fn shift(&self, r: Range<u64>) -> Range<u64> {
        self.section.start + r.start..self.section.start + r.end
    }
}

fn external(e: Error) -> ParquetError {
    ParquetError::External(Box::new(e))
}

impl AsyncFileReader for SectionReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        let r = self.shift(range);
        if let Some(bytes) = self.fresh.as_ref().and_then(|f| f.slice(&r)) {
            return futures::future::ready(Ok(bytes)).boxed();
        }
        async move {
            let fetch = async {
                let b = self.store.get_range(&self.path, r.clone()).await?;
                read_bytes(&self.counters, b.len() as u64);
                Ok::<_, Error>(b)
            };
            match &self.pages {
                Some(pages) => pages
                    .try_get_with(self.page_key(&r), fetch)
                    .await
                    .map_err(|e| external(crate::caches::cache::unshare(e))),
                None => fetch.await.map_err(external),
            }
        }
        .boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        let ranges: Vec<Range<u64>> = ranges.into_iter().map(|r| self.shift(r)).collect();
        if let Some(f) = &self.fresh
            && let Some(held) = ranges
                .iter()
                .map(|r| f.slice(r))
                .collect::<Option<Vec<_>>>()
        {
            return futures::future::ready(Ok(held)).boxed();
        }
        async move {
            // Pages read before come from the cache; the others in one request.
            let mut out: Vec<Option<Bytes>> = vec![None; ranges.len()];
            if let Some(pages) = &self.pages {
                for (slot, r) in out.iter_mut().zip(&ranges) {
                    *slot = pages.get(&self.page_key(r)).await;
                }
            }
            let missing: Vec<usize> = (0..ranges.len()).filter(|&i| out[i].is_none()).collect();
            if !missing.is_empty() {
                let location = object_store::path::Path::from(&*self.path);
                let wanted: Vec<Range<u64>> = missing.iter().map(|&i| ranges[i].clone()).collect();
                let got = self
                    .store
                    .inner()
                    .get_ranges(&location, &wanted)
                    .await
                    .map_err(|source| {
                        external(Error::ObjectStore {
                            path: self.path.to_string(),
                            source,
                        })
                    })?;
                let n: usize = got.iter().map(Bytes::len).sum();
                read_bytes(&self.counters, n as u64);
                for (i, b) in missing.into_iter().zip(got) {
                    if let Some(pages) = &self.pages {
                        // A copy: the store may hand out slices of one coalesced read, which
                        // would keep all of it alive under a page's weight.
                        let page = Bytes::copy_from_slice(&b);
                        pages.insert(self.page_key(&ranges[i]), page).await;
                    }
                    out[i] = Some(b);
                }
            }
            Ok(out.into_iter().map(Option::unwrap_or_default).collect())
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            let size = self.section.end - self.section.start;
            let metadata = ParquetMetaDataReader::new()
                .with_page_index_policy(PageIndexPolicy::Optional)
                .with_prefetch_hint(Some(64 * 1024))
                .load_and_finish(self, size)
                .await?;
            Ok(Arc::new(metadata))
        }
        .boxed()
    }
}

impl Caches {
    /// Every row of a block, every column, in its sort order (the compactor's input), and the
    /// columns its samples section left blank.
    pub(crate) async fn read_all(
        &self,
        block: &BlockMeta,
        batch_rows: usize,
    ) -> Result<(
        ParquetRecordBatchStream<SectionReader>,
        crate::format::block::Blank,
    )> {
        let metadata = self.parquet_metadata(block, Source::Samples).await?;
        let blank = crate::format::block::Blank::of_parquet(metadata.metadata());
        let stream = ParquetRecordBatchStreamBuilder::new_with_metadata(
            SectionReader::new(self, block, Source::Samples).uncached(),
            metadata,
        )
        .with_batch_size(batch_rows)
        .build()?;
        Ok((stream, blank))
    }

    /// The Parquet metadata of a block's samples or one of its rollups, cached.
    pub(crate) async fn parquet_metadata(
        &self,
        block: &BlockMeta,
        source: Source,
    ) -> Result<ArrowReaderMetadata> {
        let mut reader = SectionReader::new(self, block, source);
        self.counters
            .parquet_lookups
            .fetch_add(1, Ordering::Relaxed);
        let counters = Arc::clone(&self.counters);
        self.parquet
            .try_get_with((block.key(), source), async move {
                counters.parquet_misses.fetch_add(1, Ordering::Relaxed);
                Ok::<_, Error>(
                    ArrowReaderMetadata::load_async(&mut reader, reader_options()).await?,
                )
            })
            .await
            .map_err(unshare)
    }
}
