//! Errors of reading debug files: the file's fault (not ELF, damaged) or the machine's (I/O).

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a debug file cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Not an ELF file at all.
    #[error("not an ELF file: {0}")]
    NotElf(String),
    /// ELF, but damaged or truncated where it matters.
    #[error("a damaged ELF file: {0}")]
    Damaged(String),
    #[error("cannot read the file: {0}")]
    Io(#[source] std::io::Error),
}
