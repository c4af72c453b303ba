//! Kiln's storage engine.
//!
//! ```text
//!  NormalizedProfile ──► writer (one task per shard, a dataset builder per tenant)
//!        every flush interval or size limit, per shard:
//!        one segment object (every tenant's samples + symbols, footer) ──► object store
//!        ──► metastore.add_blocks (one transaction) ──► acknowledge the waiting requests
//!
//!  compactor ──► metastore queue ──► leased jobs: k-way merge per tenant, symbols merged
//!            ──► block one level up ──► metastore.complete_job (sources tombstoned)
//!
//!  query ──► metastore.query_blocks(tenant, time, service, type): partitions in range only
//!        ──► series selected by each block's series index ──► Parquet rows of those series' ranges
//!        ──► stack values summed per block ──► merged by frame name ──► FlameGraph / pprof / series
//! ```

pub mod caches;
pub mod clock;
pub mod compaction;
pub mod error;
pub mod format;
pub mod fuzz;
pub mod metastore;
pub mod metrics;
pub mod query;
pub mod selector;
pub mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod writer;

mod storage;

pub use error::{DecodeError, Error, ErrorKind, Result};
pub use storage::{
    Rebuilt, Storage, StorageConfig, UpkeepReport, read_footer, rebuild_metastore, series_hash,
    tenant_document_path,
};
