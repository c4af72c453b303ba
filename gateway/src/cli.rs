//! The `kiln` command line, and the commands that are not the server: `kiln bench`
//! ([`bench`]) and `kiln upload` ([`upload`]).

pub mod bench;
pub mod upload;

pub use crate::server::config::*;
