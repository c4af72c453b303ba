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
    /// Its compressed sections declare more bytes than the file may inflate to: refused before
    /// anything is inflated.
    #[error(
        "the file's compressed sections would inflate to {declared} bytes ({section} alone \
         {section_bytes}), more than the {limit} bytes a file of {file_bytes} bytes may inflate \
         to ({ratio}× its size, and at most {max} bytes; max_debuginfo_inflated_bytes); store \
         its sections uncompressed (objcopy --decompress-debug-sections)"
    )]
    Inflates {
        declared: u64,
        section: String,
        section_bytes: u64,
        limit: u64,
        file_bytes: u64,
        ratio: u64,
        max: u64,
    },
    #[error("cannot read the file: {0}")]
    Io(#[source] std::io::Error),
}
