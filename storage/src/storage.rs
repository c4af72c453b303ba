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

/// Kiln's storage engine.
#[derive(Debug, Clone)]
pub struct Storage {
    writer: Writer,
    query: QueryEngine,
    metastore: Arc<dyn Metastore>,
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
        let query = QueryEngine::new(store, Arc::clone(&metastore), config.symbols_cache_bytes)?;
        Ok(Self {
            writer,
            query,
            metastore,
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

    /// The query engine.
    pub fn query(&self) -> &QueryEngine {
        &self.query
    }

    /// The metastore.
    pub fn metastore(&self) -> &Arc<dyn Metastore> {
        &self.metastore
    }
}
