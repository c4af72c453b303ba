//! Kiln's gateway: the `kiln` binary's server.
//!
//! ```text
//!  SDKs, collectors, Grafana ── HTTP/1.1 + h2c, one port ──►  steer: application/grpc* → tonic
//!                                                                     else → axum routes
//!    /ingest, /pyroscope/ingest ─► ingest: body limit → gzip (bounded) → decode → normalize ┐
//!    push.v1 (Connect, gRPC)    ─► ingest::push ───────────────────────────────────────────┤
//!    Parca WriteRaw/WriteArrow/Write (Connect, gRPC) ─► parca (+ known-stack cache) ─────────┤
//!                                                                   storage.write (durable) ┘
//!    querier.v1 (Connect, gRPC) ─► querier ─► storage query engine ─► FlameGraph / pprof / series
//!    /pyroscope/render[-diff], /pyroscope/label[s|-values] ─► legacy ─► querier ─► flamebearer / DOT
//! ```
//!
//! Every request is mapped to a tenant first ([`tenant`]); errors of every protocol come from one
//! [`error::ApiError`].

pub mod api;
pub mod app;
pub mod auth;
pub mod error;
pub mod metrics;
pub mod tenants;
pub mod time;

pub mod transport {
    pub mod connect;
    pub mod grpc;
    pub mod telemetry;
}

pub mod server {
    pub mod config;
    pub mod lifecycle;
    pub mod listener;
    pub mod self_profile;
    pub mod traces;
    pub use listener::*;
}

pub mod cli {
    pub mod bench;
    pub mod upload;
    pub use crate::server::config::*;
}

// The modules' paths before the re-cut into rooms, while their files still use them.
pub use api::{adhoc, admin, ingest, legacy, otlp, parca, push, querier, settings as app_services};
pub use app::budget;
pub use auth::tenant;
pub use cli::{bench, upload};
pub use server::{lifecycle, self_profile, traces};
pub use transport::{connect, grpc, telemetry};
