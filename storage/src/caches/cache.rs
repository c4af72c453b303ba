//! What is remembered across queries: blocks' symbol tables, their Parquet metadata, and the
//! stack totals of whole series of a block (the partial-result cache), which answer the inner
//! blocks of a long range once rather than per query. Blocks never change, so an entry stays
//! true until it is evicted.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::file::metadata::PageIndexPolicy;

use super::Caches;
use super::report::{read_bytes, warn};
use crate::caches::names::{FrameNamer, unnamed_locations, with_names};
use crate::error::is_corruption;
use crate::format::meta::EntryKey;
use crate::format::rollup::Source;
use crate::format::symbols::SymbolTable;
use crate::metastore::BlockMeta;
use crate::{Error, ErrorKind, Result};

/// The engine's frame namer and how long a query waits for it.
pub(crate) struct Naming {
    namer: Arc<dyn FrameNamer>,
    deadline: Duration,
}

/// The objects of fresh segments and small compaction outputs by block
/// ([`Caches::warm_object`]).
pub(crate) type FreshObjects = moka::sync::Cache<EntryKey, FreshObject>;

/// What the engine holds of a fresh object for one of its blocks: the bytes from the
/// block's first section to the end of its last, and where they start in the object.
#[derive(Clone)]
pub(crate) struct FreshObject {
    base: u64,
    bytes: bytes::Bytes,
}

impl FreshObject {
    /// A whole object.
    pub(crate) fn whole(bytes: bytes::Bytes) -> Self {
        Self { base: 0, bytes }
    }

    /// `r` (a range of the object) when it is held.
    pub(crate) fn slice(&self, r: &std::ops::Range<u64>) -> Option<bytes::Bytes> {
        let (start, end) = (
            r.start.checked_sub(self.base)?,
            r.end.checked_sub(self.base)?,
        );
        (start <= end && end <= self.bytes.len() as u64)
            .then(|| self.bytes.slice(start as usize..end as usize))
    }
}

/// Fresh blocks [`Caches::read_fresh`] reads at once.
const FRESH_READS: usize = 16;

/// The part of its object a block's sections span (samples, symbols, rollups).
fn block_region(block: &BlockMeta) -> Option<std::ops::Range<u64>> {
    let sections = [block.samples.range(), block.symbols.range()]
        .into_iter()
        .chain(block.rollups.iter().map(|r| r.section.range()));
    let (lo, hi) = sections.fold((u64::MAX, 0), |(lo, hi), r| {
        (lo.min(r.start), hi.max(r.end))
    });
    (lo < hi).then_some(lo..hi)
}

/// A cache of fresh objects of about `bytes` (0: none kept).
pub(crate) fn fresh_objects(bytes: u64) -> FreshObjects {
    moka::sync::Cache::builder()
        .weigher(|_: &EntryKey, f: &FreshObject| {
            u32::try_from(f.bytes.len() + 64).unwrap_or(u32::MAX)
        })
        .max_capacity(bytes)
        // What is newest is what dashboards read: a block just written must get in even
        // though nothing has asked for it yet (the default policy admits by frequency).
        .eviction_policy(moka::policy::EvictionPolicy::lru())
        .build()
}

/// How blocks' Parquet metadata is read: with the page index where there is one.
pub(crate) fn reader_options() -> ArrowReaderOptions {
    ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional)
}

impl Caches {
    /// The symbols of a block, read and checked without the cache (the compactor reads each
    /// block once; keeping them would crowd out what queries use).
    pub async fn load_symbols(&self, block: &BlockMeta) -> Result<Arc<SymbolTable>> {
        if let Some(t) = self.symbols.get(&block.key()).await {
            return Ok(t);
        }
        let data = read_section(
            &self.store,
            self.fresh_object(block),
            &block.path(),
            block.symbols.range(),
            &self.counters,
        )
        .await?;
        SymbolTable::decode(&data)
            .map(Arc::new)
            .map_err(|source| Error::Decode {
                tenant: block.tenant.clone(),
                block: block.id.clone(),
                what: "symbols section",
                source,
            })
    }

    /// Gives the engine what names native frames; a query waits for it `deadline` at most,
    /// then answers with the frames it could name and a warning. Once per process.
    pub fn set_frame_namer(&self, namer: Arc<dyn FrameNamer>, deadline: Duration) {
        let _ = self.naming.set(Naming { namer, deadline });
    }

    /// A block's symbols with their native frames named ([`crate::caches::names`]), cached per block
    /// and naming generation; the raw symbols when no namer is set or none is unnamed. An answer
    /// that may still change (a debug file still being fetched) is used but not cached, and its
    /// warnings go to the query's report.
    pub async fn named_symbols(&self, block: &BlockMeta) -> Result<Arc<SymbolTable>> {
        let raw = self.symbols(block).await?;
        let Some(naming) = self.naming.get() else {
            return Ok(raw);
        };
        let key = (block.key(), naming.namer.generation(&block.tenant));
        if let Some(named) = self.named.get(&key).await {
            return Ok(named);
        }
        let (table, complete) = self
            .name_table(
                naming,
                &block.tenant,
                Arc::clone(&raw),
                naming.deadline,
                true,
            )
            .await?;
        if complete {
            self.named.insert(key, Arc::clone(&table)).await;
        }
        Ok(table)
    }

    /// The symbols a compaction writes: read as [`Self::load_symbols`] does, their native
    /// frames named as far as the namer can within `deadline` (nothing waits on a compaction
    /// but its own pace), so the blocks it makes keep names their debug files give now.
    pub async fn load_named_symbols(
        &self,
        block: &BlockMeta,
        deadline: Duration,
    ) -> Result<Arc<SymbolTable>> {
        let raw = self.load_symbols(block).await?;
        match self.naming.get() {
            Some(naming) => Ok(self
                .name_table(naming, &block.tenant, raw, deadline, false)
                .await?
                .0),
            None => Ok(raw),
        }
    }

    /// `raw` with the native frames the namer names; whether that answer is final.
    async fn name_table(
        &self,
        naming: &Naming,
        tenant: &str,
        raw: Arc<SymbolTable>,
        deadline: Duration,
        report: bool,
    ) -> Result<(Arc<SymbolTable>, bool)> {
        let unnamed = unnamed_locations(&raw);
        if unnamed.is_empty() {
            return Ok((raw, true));
        }
        let (at, frames): (Vec<usize>, Vec<_>) = unnamed.into_iter().unzip();
        let named = naming
            .namer
            .name(tenant, frames, Instant::now() + deadline)
            .await;
        if report {
            for w in &named.warnings {
                warn(w.clone());
            }
        }
        let complete = !named.incomplete;
        if named.lines.iter().all(Option::is_none) {
            return Ok((raw, complete));
        }
        let table = tokio::task::spawn_blocking(move || with_names(&raw, &at, &named))
            .await
            .map_err(|e| Error::Task(e.to_string()))?;
        Ok((Arc::new(table), complete))
    }

    /// Puts the symbols of a block just written into the cache (the writer and the compactor
    /// hold them as a query would read them), so a dashboard's first query of a fresh block
    /// does not read and decode them.
    pub async fn warm_symbols(&self, block: &BlockMeta, table: Arc<SymbolTable>) {
        self.symbols.insert(block.key(), table).await;
    }

    /// The Parquet metadata of a samples section in memory, as [`Self::parquet_metadata`] reads
    /// it from the store (the writer's, for [`Self::warm_samples_metadata`]).
    pub fn samples_metadata(section: &bytes::Bytes) -> Result<ArrowReaderMetadata> {
        Ok(ArrowReaderMetadata::load(section, reader_options())?)
    }

    /// Puts the Parquet metadata of a block's samples, just written, into the cache.
    pub async fn warm_samples_metadata(&self, block: &BlockMeta, metadata: ArrowReaderMetadata) {
        self.parquet
            .insert((block.key(), Source::Samples), metadata)
            .await;
    }

    /// Keeps what `block` has of an `object` just written (a segment, a small compaction
    /// output) in memory while the cache of fresh objects has room: queries of the last minutes
    /// (and the compaction that merges the block) read its pages and symbols from it rather
    /// than from the store. A block that is most of its object shares the object's bytes; one
    /// of a segment of many tenants gets a copy of its own, so an entry never keeps alive more
    /// than twice what it weighs.
    pub fn warm_object(&self, block: &BlockMeta, object: &bytes::Bytes) {
        if self.fresh.policy().max_capacity() == Some(0) {
            return;
        }
        let Some(r) = block_region(block).filter(|r| r.end <= object.len() as u64) else {
            return;
        };
        let (lo, hi) = (r.start, r.end);
        let region = lo as usize..hi as usize;
        let bytes = if 2 * region.len() >= object.len() {
            object.slice(region)
        } else {
            bytes::Bytes::copy_from_slice(&object[region])
        };
        self.fresh
            .insert(block.key(), FreshObject { base: lo, bytes });
    }

    /// Reads the fresh blocks among `blocks` that this process did not write into memory, one
    /// ranged GET each, all at once: a query process reads the last minutes' segments of
    /// ingest processes that way (ADR 0019). Without it each block's first query reads its
    /// symbols, metadata and pages one after another, three to five GETs in turn. Fresh blocks
    /// are L0 segments' that [`Self::holds_fresh`] takes; only a remote store's (with a page
    /// cache) are read ahead. A failed read is left to the query.
    pub async fn read_fresh(&self, blocks: &[Arc<BlockMeta>]) {
        self.read_whole(blocks, false).await;
    }

    /// Reads each of `blocks` (L0 only unless `any_level`) that is missing from memory and
    /// small enough to hold whole, with one ranged GET each, 16 at once.
    pub(crate) async fn read_whole(&self, blocks: &[Arc<BlockMeta>], any_level: bool) {
        use futures::StreamExt;
        if self.pages.is_none() {
            return;
        }
        let wanted: Vec<(&Arc<BlockMeta>, std::ops::Range<u64>)> = blocks
            .iter()
            .filter(|b| any_level || b.level == 0)
            .filter_map(|b| Some((b, block_region(b)?)))
            .filter(|(b, r)| self.holds_fresh(r.end - r.start) && self.fresh_object(b).is_none())
            .collect();
        futures::stream::iter(wanted)
            .for_each_concurrent(FRESH_READS, |(block, region)| async move {
                match self.store.get_range(&block.path(), region.clone()).await {
                    Ok(bytes) if bytes.len() as u64 == region.end - region.start => {
                        read_bytes(&self.counters, bytes.len() as u64);
                        self.fresh.insert(
                            block.key(),
                            FreshObject {
                                base: region.start,
                                bytes,
                            },
                        );
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(block = %block.id, error = %e, "fresh block not read ahead")
                    }
                }
            })
            .await;
    }

    /// Whether an object of `bytes` is worth holding among the fresh objects: a compaction
    /// output is kept when it is small next to the cache (an eighth of it), so one large merge
    /// cannot push out the many small blocks of the last minutes that dashboards read.
    pub fn holds_fresh(&self, bytes: u64) -> bool {
        self.fresh
            .policy()
            .max_capacity()
            .is_some_and(|cap| bytes.saturating_mul(8) <= cap)
    }

    /// Drops what is cached of a block the engine will not read again (a compaction has
    /// replaced it): its symbols and its fresh object.
    pub async fn forget_block(&self, key: &EntryKey) {
        self.symbols.invalidate(key).await;
        self.fresh.invalidate(key);
    }

    /// Whether a block's fresh object is held in memory.
    pub fn holds_fresh_object(&self, block: &BlockMeta) -> bool {
        self.fresh_object(block).is_some()
    }

    /// How many blocks' fresh objects are held in memory.
    pub fn fresh_blocks(&self) -> u64 {
        self.fresh.run_pending_tasks();
        self.fresh.entry_count()
    }

    /// What is held in memory of the object a block was written in, if anything: the whole
    /// object while the block is not yet registered.
    pub(crate) fn fresh_object(&self, block: &BlockMeta) -> Option<FreshObject> {
        let key = block.key();
        if let Some(b) = self.barrier.get()
            && let Some(object) = b.unregistered().object(&key)
        {
            return Some(object);
        }
        self.fresh.get(&key)
    }

    /// The symbols of a block, cached (as stored: [`Self::named_symbols`] names their native
    /// frames).
    pub async fn symbols(&self, block: &BlockMeta) -> Result<Arc<SymbolTable>> {
        let store = self.store.clone();
        let path = block.path();
        let range = block.symbols.range();
        let (tenant, id) = (block.tenant.clone(), block.id.clone());
        let counters = Arc::clone(&self.counters);
        let fresh = self.fresh_object(block);
        counters.symbols_lookups.fetch_add(1, Ordering::Relaxed);
        self.symbols
            .try_get_with(block.key(), async move {
                counters.symbols_misses.fetch_add(1, Ordering::Relaxed);
                let data = read_section(&store, fresh, &path, range, &counters).await?;
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
}

/// `range` of the object at `path`: sliced from `fresh` (what is held of the object in memory)
/// when it holds the range, else read from the store.
async fn read_section(
    store: &crate::store::ObjectStorage,
    fresh: Option<FreshObject>,
    path: &str,
    range: std::ops::Range<u64>,
    counters: &super::report::QueryCounters,
) -> Result<bytes::Bytes> {
    if let Some(bytes) = fresh.and_then(|f| f.slice(&range)) {
        return Ok(bytes);
    }
    let data = store.get_range(path, range).await?;
    read_bytes(counters, data.len() as u64);
    Ok(data)
}

/// An error shared by a cache's waiters, as an owned one of the same kind (corruption stays
/// corruption, so the block is still quarantined).
pub(crate) fn unshare(e: Arc<Error>) -> Error {
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

#[cfg(test)]
mod tests {
    use super::FreshObject;

    /// A held region answers the ranges inside it, by the object's offsets, and none that
    /// reaches outside it (those are read from the store).
    #[test]
    fn a_fresh_object_answers_only_the_ranges_it_holds() {
        let f = FreshObject {
            base: 100,
            bytes: bytes::Bytes::from_static(b"0123456789"),
        };
        assert_eq!(f.slice(&(100..104)).as_deref(), Some(&b"0123"[..]));
        assert_eq!(f.slice(&(105..110)).as_deref(), Some(&b"56789"[..]));
        assert_eq!(f.slice(&(107..107)).as_deref(), Some(&b""[..]));
        for outside in [99..104, 105..111, 0..10, 120..130] {
            assert_eq!(f.slice(&outside), None, "{outside:?}");
        }
    }
}
