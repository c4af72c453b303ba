//! Transports: how a request reaches an API and how its answer goes back. Connect
//! ([`connect`]: its codecs and error bodies), gRPC through tonic ([`grpc`]), and the telemetry
//! layer every request of the API port passes through ([`telemetry`]). What an API answers is
//! in `crate::api`; a transport serves any of them.

pub mod connect;
pub mod grpc;
pub mod http;
pub mod telemetry;
