//! The storage engine as one value: object store, metastore, writer and query engine.

use std::path::PathBuf;
use std::sync::Arc;

use kiln_otel::NormalizedProfile;

use crate::metastore::Metastore;
use crate::metastore::embedded::EmbeddedMetastore;
use crate::query::QueryEngine;
use crate::store::ObjectStorage;
use crate::writer::{Writer, WriterConfig};
use crate::{Error, Result};

/// Storage settings.
#[derive(Debug, Clone)]
pub struct StorageConfig {
    /// Root of the local object store and of the embedded metastore.
    pub data_dir: PathBuf,
    pub writer: WriterConfig,
    /// Memory for cached symbol tables.
    pub symbols_cache_bytes: u64,
}

impl StorageConfig {
    /// Defaults under `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            writer: WriterConfig::default(),
            symbols_cache_bytes: 256 << 20,
        }
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<()> {
        if self.writer.shards == 0 {
            return Err(Error::Config("shards must be at least 1".into()));
        }
        if self.writer.flush_interval.is_zero() {
            return Err(Error::Config("the flush interval must be positive".into()));
        }
        Ok(())
    }
}

/// A stable hash of a series: its profile type and its (sorted) labels.
pub fn series_hash<'a>(
    profile_type: &str,
    labels: impl Iterator<Item = (&'a str, &'a str)>,
) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(profile_type.as_bytes());
    for (k, v) in labels {
        h.update(b"\0");
        h.update(k.as_bytes());
        h.update(b"=");
        h.update(v.as_bytes());
    }
    h.digest()
}

/// Kiln's storage engine.
#[derive(Debug, Clone)]
pub struct Storage {
    writer: Writer,
    query: QueryEngine,
    metastore: Arc<dyn Metastore>,
    store: ObjectStorage,
}

impl Storage {
    /// Opens the storage on the local file system with the embedded metastore.
    pub async fn open(config: StorageConfig) -> Result<Self> {
        config.validate()?;
        let store = ObjectStorage::local(&config.data_dir.join("objects"))?;
        let metastore: Arc<dyn Metastore> = Arc::new(EmbeddedMetastore::open(
            &config.data_dir.join("metastore").join("metastore.redb"),
        )?);
        Self::with_parts(config, store, metastore)
    }

    /// Opens the storage on the given object store and metastore.
    pub fn with_parts(
        config: StorageConfig,
        store: ObjectStorage,
        metastore: Arc<dyn Metastore>,
    ) -> Result<Self> {
        config.validate()?;
        let writer = Writer::start(&config.writer, store.clone(), Arc::clone(&metastore));
        let query = QueryEngine::new(
            store.clone(),
            Arc::clone(&metastore),
            config.symbols_cache_bytes,
        )?;
        Ok(Self {
            writer,
            query,
            metastore,
            store,
        })
    }

    /// Writes a profile for `tenant`; returns once it is durable and queryable.
    pub async fn write(&self, tenant: &str, profile: NormalizedProfile) -> Result<()> {
        self.writer.write(tenant, vec![profile]).await
    }

    /// Writes the profiles of one request together: all are stored, or none.
    pub async fn write_all(&self, tenant: &str, profiles: Vec<NormalizedProfile>) -> Result<()> {
        self.writer.write(tenant, profiles).await
    }

    /// Flushes every buffer now.
    pub async fn flush(&self) {
        self.writer.flush().await;
    }

    /// Flushes every buffer and stops the writers (used on shutdown). Queries keep working.
    pub async fn close(&self) {
        self.writer.close().await;
    }

    /// Deletes blocks of `tenant` that `doomed` selects: first from the metastore (so no query sees
    /// them), then their objects. Returns how many blocks went.
    pub async fn delete_blocks(
        &self,
        tenant: &str,
        doomed: impl Fn(&crate::metastore::BlockMeta) -> bool,
    ) -> Result<usize> {
        let blocks = self
            .metastore
            .query_blocks(tenant, i64::MIN, i64::MAX)
            .await?;
        let victims: Vec<_> = blocks.into_iter().filter(|b| doomed(b)).collect();
        if victims.is_empty() {
            return Ok(0);
        }
        let ids: Vec<String> = victims.iter().map(|b| b.id.clone()).collect();
        self.metastore.delete_blocks(tenant, &ids).await?;
        for b in &victims {
            self.store.delete(&b.samples_path).await?;
            self.store.delete(&b.symbols_path).await?;
        }
        Ok(victims.len())
    }

    /// Erases every block of `tenant`.
    pub async fn delete_tenant(&self, tenant: &str) -> Result<usize> {
        self.delete_blocks(tenant, |_| true).await
    }

    /// Deletes the blocks of `tenant` written (by their ULID's time) before `before_ms`. Retention
    /// counts from ingestion, as Pyroscope's does, so backfilled old profiles get the full
    /// retention period too.
    pub async fn apply_retention(&self, tenant: &str, before_ms: u64) -> Result<usize> {
        self.delete_blocks(tenant, |b| {
            ulid::Ulid::from_string(&b.id).is_ok_and(|u| u.timestamp_ms() < before_ms)
        })
        .await
    }

    /// Bytes stored for `tenant` (samples and symbols of every block).
    pub async fn stored_bytes(&self, tenant: &str) -> Result<u64> {
        let blocks = self
            .metastore
            .query_blocks(tenant, i64::MIN, i64::MAX)
            .await?;
        Ok(blocks
            .iter()
            .map(|b| b.samples_bytes + b.symbols_bytes)
            .sum())
    }

    /// Hashes of every series `tenant` has (profile type and labels), for series limits.
    pub async fn series_hashes(&self, tenant: &str) -> Result<Vec<u64>> {
        let blocks = self
            .metastore
            .query_blocks(tenant, i64::MIN, i64::MAX)
            .await?;
        Ok(blocks
            .iter()
            .flat_map(|b| b.series.iter())
            .map(|s| {
                series_hash(
                    &s.profile_type,
                    s.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                )
            })
            .collect())
    }

    /// The query engine.
    pub fn query(&self) -> &QueryEngine {
        &self.query
    }

    /// The metastore.
    pub fn metastore(&self) -> &Arc<dyn Metastore> {
        &self.metastore
    }
}
