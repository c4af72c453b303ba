//! Profile formats for Kiln.
//!
//! Everything a profile goes through between the wire and the storage engine:
//!
//! ```text
//!  bytes ──► decompress (bounded) ──► pprof decode / OTLP / JFR / speedscope / folded / lines
//!        ──► normalize (one series per sample type, labels, span ids, merge) ──► NormalizedProfile
//! ```
//!
//! The output, [`model::NormalizedProfile`], carries resolved symbols (functions, locations,
//! mappings) and, for every series, its label set, profile type and samples with location stacks.
//!
//! Every decoder has an entry in [`fuzz`], which the `cargo fuzz` targets of `fuzz/` and the
//! seeded mutation test (`tests/fuzz_entries.rs`, with [`mutate`] under the `testing` feature)
//! run.

pub mod base64;
pub mod compress;
pub mod error;
pub mod folded;
pub mod fuzz;
pub mod ids;
pub mod jfr;
pub mod labels;
pub mod model;
#[cfg(any(test, feature = "testing"))]
pub mod mutate;
pub mod normalize;
pub mod otlp;
pub mod otlp_json;
pub mod parca;
pub mod pprof;
pub mod record;
#[cfg(any(test, feature = "testing"))]
pub mod skip;
pub mod speedscope;

pub use error::{Error, Result};
pub use model::{
    Function, Labels, Line, Location, Mapping, NormalizedProfile, ProfileType, Sample, Series,
    Symbols,
};
pub use normalize::{IngestMeta, NormalizeLimits};
