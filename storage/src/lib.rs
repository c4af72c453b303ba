//! Kiln's storage engine.
//!
//! ```text
//!  NormalizedProfile ──► writer (one task per shard, buffers per tenant)
//!        every flush interval or size limit:
//!        BlockBuilder ──► samples.parquet + symbols.bin ──► object store (fsynced)
//!                     ──► metastore.add_block ──► acknowledge the waiting requests
//!
//!  query ──► metastore.query_blocks(tenant, time) ──► series pruning from block metadata
//!        ──► DataFusion scan per block (label matchers, time, span ids pushed into Parquet)
//!        ──► merge stack trees by frame name ──► FlameGraph / pprof / series / labels
//! ```

pub mod block;
pub mod error;
pub mod metastore;
pub mod query;
pub mod selector;
pub mod store;
pub mod symbols;
pub mod writer;

mod storage;

pub use error::{Error, Result};
pub use storage::{Storage, StorageConfig, series_hash};
