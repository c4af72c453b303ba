//! Kiln's Grafana datasource backend plugin.
//!
//! Grafana starts `gpx_kiln_linux_amd64` as a go-plugin: it sets `grafana_plugin_type=datasource`
//! and `PLUGIN_PROTOCOL_VERSIONS=2`, reads one line, `1|2|tcp|127.0.0.1:PORT|grpc`, from the
//! plugin's stdout, and calls the `pluginv2` gRPC services on that address:
//!
//! ```text
//!  Grafana ── Data.QueryData ────────► query (KilnQuery JSON) ─► Kiln querier.v1 (Connect, proto)
//!          ── Diagnostics.CheckHealth ► ProfileTypes                  │
//!          ── Resource.CallResource ─► profileTypes/labelNames/labelValues
//!          ◄─ Arrow IPC frames: flame graph nested set, time series ◄─┘
//! ```
//!
//! The protocol is implemented here on the workspace's tonic and arrow (the `grafana-plugin-sdk`
//! crate is two years old and its frames break Grafana's flame graph).

pub mod client;
pub mod frames;
pub mod handshake;
pub mod query;
pub mod service;
