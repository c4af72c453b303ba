//! Errors of the storage engine.

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong in the storage engine. [`Error::InvalidQuery`] is the caller's mistake;
/// everything else is ours (or the object store's) and is reported as internal or unavailable.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid query: {0}")]
    InvalidQuery(String),
    #[error("object store error at {path}: {source}")]
    ObjectStore {
        path: String,
        #[source]
        source: object_store::Error,
    },
    #[error("metastore error: {0}")]
    Metastore(String),
    #[error("block {block} of tenant {tenant} is corrupt: {reason}")]
    Corrupt {
        tenant: String,
        block: String,
        reason: String,
    },
    #[error("parquet error: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    #[error("arrow error: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    #[error("query engine error: {0}")]
    DataFusion(#[from] datafusion::error::DataFusionError),
    #[error("i/o error at {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("flushing to storage failed: {0}")]
    Flush(String),
    #[error("the storage engine is shutting down")]
    ShuttingDown,
    #[error("invalid storage configuration: {0}")]
    Config(String),
}

impl Error {
    /// True when the caller made the mistake.
    pub fn is_invalid_input(&self) -> bool {
        matches!(self, Self::InvalidQuery(_))
    }
}
