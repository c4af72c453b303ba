//! Transports: how a request reaches an API and how its answer goes back. Connect
//! ([`connect`]: its codecs and error bodies), gRPC through tonic ([`grpc`]: the service every
//! API implements its trait on, authenticated before tonic decodes), plain HTTP ([`http`]:
//! bodies, encodings, media types, the query report's headers), who is calling ([`caller`]: the
//! authentication extractors handlers receive), and the telemetry layer every request of the
//! API port passes through ([`telemetry`]: it counts refusals too). What an API answers is in `crate::api`; a transport
//! knows no API, and what it must know of one (a gRPC path's scope, a request's method name) the
//! API table hands it.

pub mod caller;
pub mod connect;
pub mod error;
pub mod grpc;
pub mod http;
pub mod telemetry;

/// How an endpoint is reached (the telemetry layer's `transport` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Plain HTTP (Pyroscope's ingest and legacy query API, OTLP/HTTP, admin).
    Http,
    /// Connect, protobuf or JSON; the same paths with an `application/grpc` content type are
    /// gRPC, served by tonic.
    Connect,
    /// gRPC only.
    Grpc,
}

impl Transport {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Connect => "connect",
            Self::Grpc => "grpc",
        }
    }
}
