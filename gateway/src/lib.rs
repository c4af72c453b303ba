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

pub mod adhoc;
pub mod admin;
pub mod api;
pub mod app;
pub mod app_services;
pub mod auth;
pub mod bench;
pub mod budget;
pub mod cli;
pub mod connect;
pub mod error;
pub mod grpc;
pub mod ingest;
pub mod legacy;
pub mod lifecycle;
pub mod metrics;
pub mod otlp;
pub mod parca;
pub mod push;
pub mod querier;
pub mod self_profile;
pub mod server;
pub mod telemetry;
pub mod tenant;
pub mod tenants;
pub mod time;
pub mod traces;
pub mod upload;
