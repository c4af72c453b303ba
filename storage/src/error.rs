//! Errors of the storage engine.

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What kind of failure, for the gateway to answer with the right status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The caller's mistake (400).
    InvalidInput,
    /// The object store or the metastore failed; retrying later may succeed (503).
    Unavailable,
    /// The engine is shutting down (503).
    ShuttingDown,
    /// A bug or corrupt data (500).
    Internal,
}

/// What can go wrong in the storage engine.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid query: {0}")]
    InvalidQuery(String),
    /// A write the engine refuses as a whole (nothing of it is stored).
    #[error("{0}")]
    InvalidWrite(String),
    #[error("object store error at {path}: {source}")]
    ObjectStore {
        path: String,
        #[source]
        source: object_store::Error,
    },
    /// The metastore's storage failed (disk full, I/O error).
    #[error("metastore unavailable: {0}")]
    MetastoreUnavailable(String),
    /// Two metastore transactions conflicted (a deadlock or serialization failure); the
    /// transaction is tried again, and this is answered only when the retries ran out.
    #[error("metastore conflict: {0}")]
    MetastoreConflict(String),
    /// The metastore holds something it cannot read, or refused an inconsistent change.
    #[error("metastore error: {0}")]
    Metastore(String),
    /// A block was added twice, or after it was compacted away.
    #[error("block {block} of tenant {tenant} already exists or was compacted")]
    BlockExists { tenant: String, block: String },
    /// A block a query looked up was compacted away before it was read (the query retries).
    #[error("block {block} of tenant {tenant} was replaced while being read")]
    BlockGone { tenant: String, block: String },
    /// A compaction job's lease passed to another compactor.
    #[error("the lease of compaction job {job} was lost")]
    LeaseLost { job: u64 },
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
    #[error("i/o error at {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A flush failed; every write in it is refused with this.
    #[error("{message}")]
    Flush { kind: ErrorKind, message: String },
    #[error("the storage engine is shutting down")]
    ShuttingDown,
    #[error("invalid storage configuration: {0}")]
    Config(String),
    #[error("background task failed: {0}")]
    Task(String),
}

impl Error {
    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::InvalidQuery(_) | Self::InvalidWrite(_) => ErrorKind::InvalidInput,
            Self::ObjectStore { source, .. } => match source {
                object_store::Error::NotFound { .. } => ErrorKind::Internal,
                _ => ErrorKind::Unavailable,
            },
            Self::MetastoreUnavailable(_)
            | Self::MetastoreConflict(_)
            | Self::Io { .. }
            | Self::BlockGone { .. } => ErrorKind::Unavailable,
            Self::Flush { kind, .. } => *kind,
            Self::ShuttingDown => ErrorKind::ShuttingDown,
            Self::Metastore(_)
            | Self::BlockExists { .. }
            | Self::LeaseLost { .. }
            | Self::Corrupt { .. }
            | Self::Parquet(_)
            | Self::Arrow(_)
            | Self::Config(_)
            | Self::Task(_) => ErrorKind::Internal,
        }
    }

    /// True when the caller made the mistake.
    pub fn is_invalid_input(&self) -> bool {
        self.kind() == ErrorKind::InvalidInput
    }
}
