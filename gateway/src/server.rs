//! The server: `kiln serve`'s flags ([`config`]), its life from start-up to shutdown
//! ([`lifecycle`]), the listener with its per-connection limits ([`listener`]), its background
//! upkeep ([`upkeep`]), Kiln's own profiles ([`self_profile`]) and its logs and traces
//! ([`traces`]). It starts what the rooms below it define: the APIs' router (`crate::api`)
//! over the app's state (`crate::app`).

pub mod cluster;
pub mod config;
pub mod lifecycle;
pub mod listener;
pub mod memory;
pub mod recording;
pub mod self_profile;
pub mod tls;
pub mod traces;
pub mod upkeep;

/// The router the listener serves (the API table's, `crate::api::router`).
pub use crate::api::router;
