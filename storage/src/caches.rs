//! What the writer, the query engine and the compactor share in one process ([`Caches`]): the
//! caches of symbols and Parquet metadata with the frame namer (`cache`), the byte sources that
//! read sections through them (`source`), the segments built and not yet registered
//! (`unregistered`), the write barrier a query waits on (`barrier`), the tenants whose new blocks
//! are read ahead (`follow`), and what a query read (`report`). The frame namer's trait is in `names`.
//!
//! State: one [`Caches`] per process, built by [`crate::Storage::open`], cloned into the query
//! engine, the writer and the compactor. Nothing here is shared between processes.

pub(crate) mod barrier;
pub(crate) mod cache;
pub(crate) mod follow;
pub mod names;
pub mod report;
pub(crate) mod source;
pub(crate) mod unregistered;

use std::sync::Arc;

use parquet::arrow::arrow_reader::ArrowReaderMetadata;

use crate::format::meta::{BlockMeta, EntryKey};
use crate::format::rollup::Source;
use crate::format::symbols::SymbolTable;
use crate::metastore::{BlockQuery, Metastore};
use crate::store::ObjectStorage;

use barrier::WriteBarrier;
use report::QueryCounters;

/// The caches of one process. Cheap to clone: every clone shares them.
#[derive(Clone)]
pub struct Caches {
    pub(crate) store: ObjectStorage,
    pub(crate) metastore: Arc<dyn Metastore>,
    pub(crate) symbols: moka::future::Cache<EntryKey, Arc<SymbolTable>>,
    /// Parquet metadata by entry and section ([`Source`]).
    pub(crate) parquet: moka::future::Cache<(EntryKey, Source), ArrowReaderMetadata>,
    /// What names native frames, set once the process has built it ([`Self::set_frame_namer`]);
    /// shared by every clone (the compactor's too).
    pub(crate) naming: Arc<std::sync::OnceLock<cache::Naming>>,
    /// Block symbols with their native frames named, by block and the tenant's naming
    /// generation ([`crate::caches::names`]).
    pub(crate) named: moka::future::Cache<(EntryKey, u64), Arc<SymbolTable>>,
    /// Pages read from a remote object store (none for the local file system).
    pub(crate) pages: Option<source::PageCache>,
    /// The objects of fresh segments as the writer made them, and of small compaction outputs,
    /// by block: a query of the last minutes reads their pages from memory, not from the store
    /// ([`Self::warm_object`]).
    pub(crate) fresh: cache::FreshObjects,
    pub(crate) counters: Arc<QueryCounters>,
    /// The writer of this process, where it acknowledges writes from a log: a query first cuts
    /// what it buffers ([`WriteBarrier::wait`]).
    pub(crate) barrier: Arc<std::sync::OnceLock<WriteBarrier>>,
    /// The tenants queried lately, whose new blocks [`Self::follow`] reads ahead.
    pub(crate) followed: Arc<follow::Followed>,
}

impl std::fmt::Debug for Caches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caches").finish_non_exhaustive()
    }
}

impl Caches {
    /// Caches over `store`: about `cache_bytes` for symbols (a quarter of it for Parquet
    /// metadata, half for named symbols), when the store is remote `pages_bytes` for the byte
    /// ranges queries read (0: none), and `fresh_bytes` for the objects of fresh segments (0:
    /// none kept).
    pub fn new(
        store: ObjectStorage,
        metastore: Arc<dyn Metastore>,
        cache_bytes: u64,
        pages_bytes: u64,
        fresh_bytes: u64,
    ) -> Self {
        let pages = (!store.is_local() && pages_bytes > 0).then(|| {
            moka::future::Cache::builder()
                .weigher(|_: &(Arc<str>, u64, u64), b: &bytes::Bytes| {
                    u32::try_from(b.len() + 64).unwrap_or(u32::MAX)
                })
                .max_capacity(pages_bytes)
                .build()
        });
        let symbols = moka::future::Cache::builder()
            .weigher(|_: &EntryKey, t: &Arc<SymbolTable>| {
                u32::try_from(t.estimated_bytes()).unwrap_or(u32::MAX)
            })
            .max_capacity(cache_bytes)
            .build();
        let parquet = moka::future::Cache::builder()
            .weigher(|_: &(EntryKey, Source), m: &ArrowReaderMetadata| {
                u32::try_from(m.metadata().memory_size()).unwrap_or(u32::MAX)
            })
            .max_capacity(cache_bytes / 4)
            .build();
        // A process sees another's uploads through its namer's caches, which expire; these
        // entries expire alike, so a named table is at most a minute behind.
        let named = moka::future::Cache::builder()
            .weigher(|_: &(EntryKey, u64), t: &Arc<SymbolTable>| {
                u32::try_from(t.estimated_bytes()).unwrap_or(u32::MAX)
            })
            .max_capacity(cache_bytes / 2)
            .time_to_live(std::time::Duration::from_secs(60))
            .build();
        Self {
            store,
            metastore,
            symbols,
            parquet,
            naming: Arc::default(),
            named,
            pages,
            fresh: cache::fresh_objects(fresh_bytes),
            counters: Arc::new(QueryCounters::default()),
            barrier: Arc::default(),
            followed: Arc::default(),
        }
    }

    /// Counters of the read path.
    pub fn counters(&self) -> &QueryCounters {
        &self.counters
    }

    /// Has every query over these caches first cut what the writer of this process
    /// acknowledged from its log and buffers, and read what it has not registered yet.
    pub(crate) fn set_write_barrier(&self, barrier: WriteBarrier) {
        let _ = self.barrier.set(barrier);
    }

    /// The blocks matching `query`: after the writer's barrier, where there is one, the
    /// metastore's and those the writer built and has not registered yet (every write
    /// acknowledged before this call is in one of them).
    pub(crate) async fn query_blocks(
        &self,
        query: BlockQuery<'_>,
    ) -> crate::Result<Vec<Arc<BlockMeta>>> {
        match self.barrier.get() {
            None => self.metastore.query_blocks(query).await,
            Some(b) => {
                b.wait(barrier::Scope {
                    tenant: query.tenant,
                    start_nanos: query.start_nanos,
                    end_nanos: query.end_nanos,
                })
                .await;
                b.unregistered()
                    .query_blocks(self.metastore.as_ref(), query)
                    .await
            }
        }
    }
}
