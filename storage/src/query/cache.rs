//! What is remembered across queries: blocks' symbol tables, their Parquet metadata, and the
//! stack totals of whole series of a block (the partial-result cache), which answer the inner
//! blocks of a long range once rather than per query. Blocks never change, so an entry stays
//! true until it is evicted.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::file::metadata::PageIndexPolicy;

use super::report::{count, options, read_bytes};
use super::scan::{SectionReader, is_corruption};
use super::stacks::StackValue;
use super::{QueryEngine, SampleFilter};
use crate::meta::EntryKey;
use crate::metastore::BlockMeta;
use crate::rollup::Source;
use crate::symbols::SymbolTable;
use crate::{Error, ErrorKind, Result};

/// Key of a block's cached partial result: the block and the selected series (indices into its
/// series list). Blocks never change, so an entry stays true until it is evicted.
pub(super) type ResultKey = (EntryKey, Arc<[u32]>);

impl QueryEngine {
    /// The symbols of a block, read and checked without the cache (the compactor reads each
    /// block once; keeping them would crowd out what queries use).
    pub async fn load_symbols(&self, block: &BlockMeta) -> Result<Arc<SymbolTable>> {
        if let Some(t) = self.symbols.get(&block.key()).await {
            return Ok(t);
        }
        let data = self
            .store
            .get_range(&block.path(), block.symbols.range())
            .await?;
        read_bytes(&self.counters, data.len() as u64);
        SymbolTable::decode(&data)
            .map(Arc::new)
            .map_err(|source| Error::Decode {
                tenant: block.tenant.clone(),
                block: block.id.clone(),
                what: "symbols section",
                source,
            })
    }

    /// The symbols of a block, cached.
    pub async fn symbols(&self, block: &BlockMeta) -> Result<Arc<SymbolTable>> {
        let store = self.store.clone();
        let path = block.path();
        let range = block.symbols.range();
        let (tenant, id) = (block.tenant.clone(), block.id.clone());
        let counters = Arc::clone(&self.counters);
        counters.symbols_lookups.fetch_add(1, Ordering::Relaxed);
        self.symbols
            .try_get_with(block.key(), async move {
                counters.symbols_misses.fetch_add(1, Ordering::Relaxed);
                let data = store.get_range(&path, range).await?;
                read_bytes(&counters, data.len() as u64);
                SymbolTable::decode(&data)
                    .map(Arc::new)
                    .map_err(|source| Error::Decode {
                        tenant,
                        block: id,
                        what: "symbols section",
                        source,
                    })
            })
            .await
            .map_err(unshare)
    }

    pub(super) async fn parquet_metadata(
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
                let options =
                    ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional);
                Ok::<_, Error>(ArrowReaderMetadata::load_async(&mut reader, options).await?)
            })
            .await
            .map_err(unshare)
    }

    /// [`Self::block_stacks`], from the partial-result cache when the query takes every sample
    /// of the selected series (its range covers them, no span, trace or label split).
    pub(super) async fn cached_block_stacks(
        &self,
        block: &BlockMeta,
        series: Vec<u32>,
        filter: &SampleFilter,
        columns: &[usize],
        with_labels: bool,
    ) -> Result<Arc<[StackValue]>> {
        let whole = !with_labels
            && !filter.narrows_rows()
            && self.results.policy().max_capacity() != Some(0)
            && options().results_cache
            && series.iter().all(|&i| {
                let s = &block.series[i as usize];
                filter.start_nanos <= s.min_time_nanos && s.max_time_nanos < filter.end_nanos
            });
        if !whole {
            return Ok(self
                .block_stacks(block, &series, filter, columns, with_labels)
                .await?
                .into());
        }
        self.counters
            .results_lookups
            .fetch_add(1, Ordering::Relaxed);
        let computed = std::sync::atomic::AtomicBool::new(false);
        let key: ResultKey = (block.key(), series.into());
        let values = self
            .results
            .try_get_with_by_ref(&key, async {
                computed.store(true, Ordering::Relaxed);
                self.counters.results_misses.fetch_add(1, Ordering::Relaxed);
                self.block_stacks(block, &key.1, filter, columns, with_labels)
                    .await
                    .map(Arc::from)
            })
            .await
            .map_err(unshare)?;
        if !computed.load(Ordering::Relaxed) {
            count(|s| s.blocks_cached += 1);
        }
        Ok(values)
    }
}

/// An error shared by a cache's waiters, as an owned one of the same kind (corruption stays
/// corruption, so the block is still quarantined).
fn unshare(e: Arc<Error>) -> Error {
    match Arc::try_unwrap(e) {
        Ok(e) => e,
        Err(e) if is_corruption(&e) => Error::Corrupt {
            tenant: String::new(),
            block: String::new(),
            reason: e.to_string(),
        },
        Err(e) => Error::Flush {
            kind: match e.kind() {
                ErrorKind::InvalidInput => ErrorKind::Internal,
                k => k,
            },
            message: e.to_string(),
        },
    }
}
