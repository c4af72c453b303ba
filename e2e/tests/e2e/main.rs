//! Kiln end to end: the real `kiln` binary, real profiling clients, real corpus profiles.
//! One test binary; each module starts its own server on a free loopback port.

mod auth;
mod bad_input;
mod bench;
mod clients;
mod cluster;
mod compression;
mod corpus;
mod crash;
mod debuginfo_bounds;
mod deploy;
mod drilldown;
mod formats;
mod fuzz;
mod grafana;
mod grpc;
mod jfr;
mod legacy;
mod limits;
mod mcp;
mod memory;
mod object_stores;
mod otlp;
mod parca;
mod recording_rules;
mod restart;
mod scale_out;
mod self_profile;
mod spans;
mod spool;
mod symbolize;
mod tenancy;
mod tls;
mod traces;
mod ui;
mod wal;
