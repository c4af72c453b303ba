//! The server: `kiln serve`'s flags ([`config`]), its life from start-up to shutdown
//! ([`lifecycle`]), the listener with its per-connection limits ([`listener`]), Kiln's own
//! profiles ([`self_profile`]) and its logs and traces ([`traces`]).

pub mod config;
pub mod lifecycle;
pub mod listener;
pub mod self_profile;
pub mod traces;
pub mod upkeep;

/// The router the listener serves (the API table's, `crate::api::router`).
pub use crate::api::router;
