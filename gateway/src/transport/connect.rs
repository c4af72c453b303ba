//! The Connect protocol (unary, POST): the codec every Connect API shares and `querier.v1`'s
//! Connect front end (`push.v1`'s is in [`crate::push`]): binary protobuf
//! (`application/proto`, what Grafana's datasource sends) and protobuf-JSON (`application/json`),
//! gzip request bodies, and Connect's JSON error bodies.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use prost::Message;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::app::AppRef;
use crate::auth::Scope;
use crate::error::{ApiError, ErrorKind};
use crate::querier::Querier;
use crate::transport::http::{decode_content_encoding, query_options, read_body, report_headers};

/// A Connect codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Proto,
    Json,
}

impl Codec {
    /// The codec of a request's content type; anything else is 415.
    pub fn from_headers(headers: &HeaderMap) -> Result<Self, ApiError> {
        let ct = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let essence = ct
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match essence.as_str() {
            "application/proto" | "application/protobuf" | "application/x-protobuf" => {
                Ok(Self::Proto)
            }
            "application/json" => Ok(Self::Json),
            _ => Err(ApiError::unsupported_media_type(format!(
                "content type {ct:?} is not supported; use application/proto, application/json \
                 or gRPC (application/grpc)"
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

pub(crate) struct Call {
    pub codec: Codec,
    pub tenant: crate::auth::TenantId,
    pub body: Bytes,
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
    let body = decode_content_encoding(headers, body, limits.max_decompressed_bytes)?;
    Ok(Call {
        codec,
        tenant,
        body,
    })
}

/// `POST /querier.v1.QuerierService/{method}`.
pub async fn querier_handler(
    State(app): State<AppRef>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let querier = Querier::new(app.clone());
    let mut report = None;
    let (name, result) = match app.authenticate(&headers, Scope::Read) {
        Err(e) => ("auth", Err(e)),
        Ok(tenant) => {
            let (result, r) = kiln_storage::query::with_options(query_options(&headers), async {
                let _slot = app.tenants.query_slot(&tenant).await?;
                let call = prepare(&app, &headers, body, tenant.clone()).await?;
                Ok::<_, ApiError>(dispatch(&querier, &method, call).await)
            })
            .await;
            report = Some(r);
            let (name, result) = match result {
                Ok((name, r)) => (name, r),
                Err(e) => ("prepare", Err(e)),
            };
            if let Err(e) = &result {
                app.metrics.refused(&tenant, e.reason());
            }
            (name, result)
        }
    };
    let mut resp = match result {
        Ok((codec, body)) => connect_ok(codec, body),
        Err(e) => connect_error(&e),
    };
    if let Some(report) = report {
        app.metrics.query_read(name, &report.stats);
        report_headers(resp.headers_mut(), &report);
    }
    resp
}

macro_rules! unary {
    ($querier:expr, $call:expr, $method:ident) => {{
        let req = $call.codec.decode(&$call.body)?;
        let resp = $querier.$method(&$call.tenant, req).await?;
        Ok(($call.codec, $call.codec.encode(&resp)?))
    }};
}

/// Runs one querier method; returns its name (for metrics; `unknown` when there is no such
/// method) with the result.
async fn dispatch(
    querier: &Querier,
    method: &str,
    call: Call,
) -> (&'static str, Result<(Codec, Bytes), ApiError>) {
    macro_rules! route {
        ($($name:literal => $fn:ident),* $(,)?) => {
            match method {
                $($name => ($name, async { unary!(querier, call, $fn) }.await),)*
                other => (
                    "unknown",
                    Err(ApiError::new(
                        ErrorKind::NotFound,
                        format!("querier.v1.QuerierService has no method {other:?} in Kiln"),
                    )),
                ),
            }
        };
    }
    crate::querier::querier_methods!(route)
}
