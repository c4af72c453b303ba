//! The Connect protocol (unary, POST), as every Connect API shares it: binary protobuf
//! (`application/proto`, what Grafana's datasource sends) and protobuf-JSON (`application/json`),
//! gzip request bodies, and Connect's JSON error bodies. Each API's Connect front end is in its
//! own module (`crate::api::querier`, `crate::api::push`, …).

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use prost::Message;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::app::AppRef;
use crate::app::budget::Share;
use crate::error::ApiError;
use crate::transport::http::{decode_content_encoding, read_body};

/// A Connect codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Proto,
    Json,
}

impl Codec {
    /// The codec of a request's content type; anything else is 415.
    pub fn from_headers(headers: &HeaderMap) -> Result<Self, ApiError> {
        let media = crate::transport::http::media_type(headers)?;
        match media.as_ref().map(|m| m.essence_str()) {
            Some("application/proto" | "application/protobuf" | "application/x-protobuf") => {
                Ok(Self::Proto)
            }
            Some("application/json") => Ok(Self::Json),
            _ => Err(ApiError::unsupported_media_type(format!(
                "content type {:?} is not supported; use application/proto, application/json \
                 or gRPC (application/grpc)",
                media.as_ref().map_or("", |m| m.as_ref())
            ))),
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            Self::Proto => "application/proto",
            Self::Json => "application/json",
        }
    }

    pub(crate) fn decode<M: Message + Default + DeserializeOwned>(
        self,
        body: &[u8],
    ) -> Result<M, ApiError> {
        match self {
            Self::Proto => kiln_proto::wire::decode(body)
                .map_err(|e| ApiError::invalid(format!("invalid protobuf request: {e}"))),
            Self::Json if body.is_empty() => Ok(M::default()),
            Self::Json => serde_json::from_slice(body)
                .map_err(|e| ApiError::invalid(format!("invalid JSON request: {e}"))),
        }
    }

    pub(crate) fn encode<M: Message + Serialize>(self, msg: &M) -> Result<Bytes, ApiError> {
        match self {
            Self::Proto => Ok(Bytes::from(msg.encode_to_vec())),
            Self::Json => serde_json::to_vec(msg)
                .map(Bytes::from)
                .map_err(ApiError::internal),
        }
    }
}

/// A Connect error response.
pub fn connect_error(e: &ApiError) -> Response {
    let mut resp = (
        e.kind.http_status(),
        [(header::CONTENT_TYPE, "application/json")],
        e.connect_body(),
    )
        .into_response();
    e.decorate(&mut resp);
    resp
}

pub(crate) fn connect_ok(codec: Codec, body: Bytes) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, codec.content_type())],
        body,
    )
        .into_response()
}

/// A Connect service an API answers: its methods, or why Kiln does not offer it (the API table
/// routes and names its calls from this).
pub struct Service {
    pub name: &'static str,
    /// Every method as `service/method`, the telemetry layer's names.
    pub methods: &'static [&'static str],
    /// Kiln does not offer this service: every call is answered `unimplemented` with this.
    pub absent: Option<&'static str>,
}

/// The service a Connect request's path names (`/{service}/{method}`).
pub(crate) fn service_of(uri: &axum::http::Uri) -> String {
    uri.path()
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned()
}

pub(crate) struct Call {
    pub codec: Codec,
    pub tenant: crate::auth::TenantId,
    pub body: Bytes,
    /// The decode budget the body holds (its inflated size, when it was gzip), until the call
    /// is dropped.
    pub share: Share,
}

pub(crate) async fn prepare(
    app: &AppRef,
    headers: &HeaderMap,
    body: Body,
    tenant: crate::auth::TenantId,
) -> Result<Call, ApiError> {
    let codec = Codec::from_headers(headers)?;
    let limits = app.limits(&tenant);
    let body = read_body(body, limits.max_body_bytes).await?;
    // Only an inflated body takes budget (`decode_content_encoding` grows the share); a plain
    // one, what queries send, never waits for ingest's.
    let mut share = app.decode_budget.empty_share();
    let body =
        decode_content_encoding(headers, body, limits.max_decompressed_bytes, &mut share).await?;
    Ok(Call {
        codec,
        tenant,
        body,
        share,
    })
}
