//! The metastore: which blocks exist, for which tenant, shard and time range, with their series.
//!
//! One [`Metastore`] trait; the embedded backend ([`embedded::EmbeddedMetastore`], on redb) serves
//! the single binary. Keys are `(tenant, time partition, block id)` with six-hour partitions, as in
//! Pyroscope's metastore index, so a PostgreSQL backend can index and drop partitions the same way.

pub mod embedded;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::Result;

/// Current block format version (see `docs/adr/0002-block-format.md`).
pub const BLOCK_FORMAT_VERSION: u32 = 1;

/// Length of a metastore time partition.
pub const PARTITION_NANOS: i64 = 6 * 3600 * 1_000_000_000;

/// The time partition of a timestamp.
pub fn partition_of(time_nanos: i64) -> i64 {
    time_nanos.div_euclid(PARTITION_NANOS)
}

/// One series of a block: its labels (with `__name__` and `service_name`) and profile type id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeriesMeta {
    pub labels: Vec<(String, String)>,
    pub profile_type: String,
    pub min_time_nanos: i64,
    pub max_time_nanos: i64,
}

impl SeriesMeta {
    /// The value of a label.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Metadata of one block, as the metastore keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockMeta {
    pub format_version: u32,
    /// ULID.
    pub id: String,
    pub tenant: String,
    pub shard: u32,
    pub compaction_level: u32,
    pub min_time_nanos: i64,
    pub max_time_nanos: i64,
    /// Series in sort order; a row's `series_id` indexes this list.
    pub series: Vec<SeriesMeta>,
    /// Object path of the Parquet samples.
    pub samples_path: String,
    pub samples_bytes: u64,
    /// Object path of the symbols section.
    pub symbols_path: String,
    pub symbols_bytes: u64,
    pub rows: u64,
    /// Profiles (ingest requests' series) that went into this block.
    pub profiles: u64,
}

impl BlockMeta {
    /// Whether the block's time range meets `[start, end)`.
    pub fn overlaps(&self, start_nanos: i64, end_nanos: i64) -> bool {
        self.min_time_nanos < end_nanos && self.max_time_nanos >= start_nanos
    }

    /// The metastore partition.
    pub fn partition(&self) -> i64 {
        partition_of(self.min_time_nanos)
    }
}

/// Block metadata storage. Implementations must make `add_block` durable before returning.
#[async_trait::async_trait]
pub trait Metastore: Send + Sync + std::fmt::Debug {
    /// Registers a block; it is queryable once this returns.
    async fn add_block(&self, block: BlockMeta) -> Result<()>;

    /// Blocks of `tenant` whose time range meets `[start, end)`.
    async fn query_blocks(
        &self,
        tenant: &str,
        start_nanos: i64,
        end_nanos: i64,
    ) -> Result<Vec<Arc<BlockMeta>>>;

    /// Tenants with at least one block.
    async fn tenants(&self) -> Result<Vec<String>>;

    /// Removes blocks of `tenant` from the index (their objects are deleted by the caller after).
    async fn delete_blocks(&self, tenant: &str, ids: &[String]) -> Result<()>;
}
