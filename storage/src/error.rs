//! Errors of the storage engine: [`Error`] with its [`ErrorKind`] (what the gateway answers), and
//! [`DecodeError`], why bytes Kiln wrote (symbols, footers, metastore entries) do not read back.

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
    /// Bytes of a block do not decode: `what` is the symbols section, the footer or the
    /// metastore entry (the block is corrupt, as with [`Error::Corrupt`]).
    #[error("block {block} of tenant {tenant} is corrupt: {what}: {source}")]
    Decode {
        tenant: String,
        block: String,
        what: &'static str,
        #[source]
        source: DecodeError,
    },
    #[error("parquet error: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    #[error("arrow error: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// The object store is unreachable and the spool has no room for the segment.
    #[error(
        "the object store is unreachable and the spool is full ({bytes} of {max} bytes): \
         the write is not stored; retry later"
    )]
    SpoolFull { bytes: u64, max: u64 },
    /// A spool file does not read back.
    #[error("spool file {path}: {reason}")]
    Spool { path: String, reason: String },
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
    /// A write's shard stopped before answering it: the engine closed, or the shard panicked
    /// (a bug) and was started again. The write was not acknowledged; one whose record the log
    /// had taken just before is replayed all the same.
    #[error(
        "the write was not acknowledged: its write shard stopped before answering it (the \
         storage is closing, or the shard failed and was started again); send it again"
    )]
    Unanswered,
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
            | Self::SpoolFull { .. }
            | Self::BlockGone { .. }
            | Self::Unanswered => ErrorKind::Unavailable,
            Self::Flush { kind, .. } => *kind,
            // A read of Parquet pages failed in the store (the reader carries Kiln's error):
            // that error's kind, an unreachable store's `Unavailable` rather than a bug's.
            Self::Parquet(parquet::errors::ParquetError::External(inner)) => inner
                .downcast_ref::<Error>()
                .map_or(ErrorKind::Internal, Error::kind),
            Self::ShuttingDown => ErrorKind::ShuttingDown,
            Self::Metastore(_)
            | Self::BlockExists { .. }
            | Self::LeaseLost { .. }
            | Self::Corrupt { .. }
            | Self::Decode { .. }
            | Self::Parquet(_)
            | Self::Arrow(_)
            | Self::Config(_)
            | Self::Spool { .. }
            | Self::Task(_) => ErrorKind::Internal,
        }
    }

    /// True when the caller made the mistake.
    pub fn is_invalid_input(&self) -> bool {
        self.kind() == ErrorKind::InvalidInput
    }
}

/// Why bytes Kiln wrote do not read back: a symbols section ([`crate::format::symbols`]), an object's
/// footer or a metastore entry ([`crate::format::meta`]). Always a bug or corrupt data; callers wrap it in
/// [`Error::Decode`] with the block it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The magic bytes are missing: `what` is not there at all.
    #[error("not a {0} (magic bytes missing)")]
    Magic(&'static str),
    #[error("unsupported {what} version {version} (this build reads up to {supported})")]
    Version {
        what: &'static str,
        version: u32,
        supported: u32,
    },
    #[error("{0} checksum mismatch")]
    Checksum(&'static str),
    #[error("{0} truncated")]
    Truncated(&'static str),
    #[error("{what} protobuf: {source}")]
    Protobuf {
        what: &'static str,
        #[source]
        source: prost::DecodeError,
    },
    /// Symbols: the stack tree's parent and location arrays differ in length (or are empty).
    #[error("stack tree arrays differ in length")]
    StackTreeLength,
    /// A compressed section does not decompress to its recorded length.
    #[error("{what} does not decompress: {reason}")]
    Decompress { what: &'static str, reason: String },
    /// Symbols: a stack node's parent does not come before it, or its location is not there.
    #[error("stack node {0} is out of order")]
    StackNodeOrder(usize),
    /// Symbols: a reference (`what`) points outside its table.
    #[error("{0} out of range")]
    OutOfRange(&'static str),
    /// Metadata: a string table index is out of range.
    #[error("string index {0} out of range")]
    StringIndex(u32),
    #[error("block id {0:?} is not a ULID")]
    BlockId(String),
    #[error("odd label list")]
    OddLabels,
    #[error("series rows add up to {series}, the dataset has {dataset}")]
    Rows { series: u64, dataset: u64 },
    #[error("a metastore entry holds one dataset, not {0}")]
    EntryDatasets(usize),
    #[error("a rollup lists {rollup} series, the dataset has {dataset}")]
    RollupSeries { rollup: usize, dataset: usize },
    #[error("rollup resolution {0} is negative")]
    RollupResolution(i64),
    /// A dataset's sections end beyond the object.
    #[error("dataset of {0} lies outside the object")]
    OutsideObject(String),
    /// Metadata: the protobuf is malformed where prost's own checks do not reach (Kiln reads
    /// it field by field, [`crate::format::meta`]).
    #[error("block metadata: {0}")]
    Wire(&'static str),
}

/// Wraps an I/O error with the path it happened at: `.map_err(io(path))`.
pub(crate) fn io(path: &std::path::Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Whether an error means the block itself is bad (as opposed to the store being unreachable).
pub(crate) fn is_corruption(e: &Error) -> bool {
    match e {
        // A format newer than this build reads (a block from an upgraded writer, seen by a
        // reader not yet upgraded or rolled back): the block is fine, this process is old.
        Error::Decode {
            source: DecodeError::Version { .. },
            ..
        } => false,
        Error::Corrupt { .. } | Error::Decode { .. } => true,
        Error::ObjectStore { source, .. } => matches!(source, object_store::Error::NotFound { .. }),
        Error::Parquet(parquet::errors::ParquetError::External(inner)) => {
            inner.downcast_ref::<Error>().is_some_and(is_corruption)
        }
        Error::Parquet(_) | Error::Arrow(_) => true,
        _ => false,
    }
}
