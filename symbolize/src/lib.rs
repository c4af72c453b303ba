//! Native symbolization for Kiln: naming the frames that eBPF profilers and the Parca agent
//! send as a build id and an address.
//!
//! ```text
//!  debug file (upload or debuginfod) ──► elf::identify: GNU / Go build ids, file id, kind
//!  profile location (build id, mapping, address)
//!        ──► DebugFile::file_address (the mapping's start and offset, the program headers)
//!        ──► DebugFile::resolve: DWARF (inlined frames) → Go's .gopclntab → symbol tables
//!        ──► frames, innermost first, as pprof's location lines carry them
//! ```
//!
//! Files are memory-mapped (`addr2line`'s loader), never read whole. Where the files come from,
//! and the caches, are the gateway's (ADR 0013).

pub mod debug_file;
pub mod elf;
pub mod error;
pub mod fuzz;
pub mod gopclntab;
#[cfg(feature = "testing")]
pub mod testing;

pub use debug_file::{DebugFile, Frame, MappingRange};
pub use elf::{ElfInfo, FileKind, identify, identify_file};
pub use error::{Error, Result};
