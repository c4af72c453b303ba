//! Kiln's gateway: the `kiln` binary, its server and its commands.
//!
//! The crate is cut into rooms by role. A room uses the rooms above it in this list, never one
//! below it:
//!
//! | room | what |
//! |---|---|
//! | [`error`], [`time`], [`metrics`] | the one error type, times, Kiln's own metrics |
//! | [`auth`] | who is calling, as which tenant, allowed to do what |
//! | [`tenants`] | per-tenant limits |
//! | [`recording`] | recording rules: metrics from profiles, evaluated at ingest, sent by remote write |
//! | [`app`] | the state every handler reads, and what every API shares below its transport |
//! | [`transport`] | Connect, gRPC and plain HTTP framing, error mapping, the telemetry layer |
//! | [`api`] | one module per API family, and the one table that routes them all |
//! | [`server`] | `kiln serve`: flags, start-up, the listener, upkeep, self-profiling, traces |
//! | [`cli`] | the command line, and the commands that are not the server |
//!
//! ```text
//!  SDKs, collectors, Grafana ── HTTP/1.1 + h2c, one port ──► api::router, its layers:
//!    transport::telemetry (count, time, trace) → transport::grpc::steer
//!    (application/grpc* → tonic, authenticated first; else → the axum route of the table)
//!
//!    /ingest, /pyroscope/ingest ───► api::ingest ─┐ decode, normalize
//!    push.v1 (Connect, gRPC) ──────► api::push ───┤ (app::write::blocking)
//!    Parca Write* (Connect, gRPC) ─► api::parca ──┤ → app::write::store
//!    OTLP profiles (HTTP, gRPC) ───► api::otlp ───┘ → storage write (durable)
//!    querier.v1 (Connect, gRPC) ─► api::querier ─► the storage query engine ─► flame graph, …
//!    /pyroscope/render, labels ─► api::legacy ─► api::querier ─► api::render: flamebearer, DOT
//! ```
//!
//! Every request is mapped to a tenant first ([`auth`]); errors of every protocol come from one
//! [`error::ApiError`].

pub mod api;
pub mod app;
pub mod auth;
pub mod cli;
pub mod error;
pub mod metrics;
pub mod recording;
pub mod server;
pub mod tenants;
pub mod time;
pub mod transport;
pub mod units;

/// The unit tests allocate as the `kiln` binary does (`main.rs`), through jemalloc.
#[cfg(test)]
#[global_allocator]
static TEST_ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
