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
//! Files are memory-mapped (`addr2line`'s loader), never read whole. [`store`] keeps a tenant's
//! uploads, [`debuginfod`] fetches what no upload covers, and [`Symbolizer`] answers a batch of
//! frames within a deadline with its caches (ADR 0013).

pub mod budget;
pub mod debug_file;
pub mod debuginfod;
pub mod elf;
pub mod error;
pub mod files;
pub mod fuzz;
pub mod gopclntab;
pub mod metrics;
pub mod service;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;

pub use debug_file::{DebugFile, Frame, Inflation, MappingRange, OpenLimits};
pub use elf::{ElfInfo, FileKind, identify, identify_file};
pub use error::{Error, Result};
pub use metrics::Metrics;
pub use service::{Request, Resolution, Symbolizer, SymbolizerConfig};
