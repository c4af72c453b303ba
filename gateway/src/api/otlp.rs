//! OTLP profiles ingest on Kiln's port: gRPC
//! `opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export` and HTTP
//! `POST /v1development/profiles` (`application/x-protobuf` or `application/json`, gzip).
//!
//! The gRPC service decodes the request itself (tonic hands it the raw message), so a truncated
//! or proto-1.9 payload is answered `InvalidArgument` with a message, like every other client
//! mistake, rather than tonic's `Internal`.
//!
//! Both transports read the Profiles development version a sender names in the
//! `OTLP-Profiles-Development-Version` header (gRPC: metadata), as opentelemetry-proto #857
//! proposes: absent means version 1; a version Kiln does not decode is refused (400,
//! `INVALID_ARGUMENT`) before the payload is read as if it were another.

use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::{Buf, Bytes};
use opentelemetry_proto::tonic::collector::profiles::v1development::{
    ExportProfilesPartialSuccess, ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::{Status, server::NamedService};

use crate::app::AppRef;
use crate::app::wal::{Record, RecordBody};
use crate::app::write::{decode, store};
use crate::auth::{Scope, TenantId};
use crate::error::ApiError;
use crate::time::now_nanos;
use crate::transport::caller::Writes;
use crate::transport::http::{admit, decode_content_encoding, read_body};

/// The gRPC method path.
pub const EXPORT_PATH: &str =
    "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";

/// Hint for a protobuf that does not decode as proto 1.10.
const V19_HINT: &str = "Kiln reads proto 1.8 and 1.9 bodies it can tell from 1.10 by their wire \
     types, and this one it could not: if the sender speaks proto 1.9 (Collector < 0.148), upgrade \
     it (Sample fields were renumbered in 1.10)";

/// The header (gRPC: metadata key) naming the OTLP Profiles development version of a payload.
pub const VERSION_HEADER: &str = "otlp-profiles-development-version";

/// The Profiles development versions Kiln decodes: 1, the first, which the proto 1.10 messages
/// are.
pub const SUPPORTED_VERSIONS: [u32; 1] = [1];

/// Checks the Profiles development version a request names (absent: 1).
pub fn check_version(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get(VERSION_HEADER) else {
        return Ok(());
    };
    let text = value.to_str().unwrap_or("").trim();
    match text.parse::<u32>() {
        Ok(v) if SUPPORTED_VERSIONS.contains(&v) => Ok(()),
        _ => Err(ApiError::invalid(format!(
            "OTLP-Profiles-Development-Version {:?} is not supported: Kiln decodes version {} \
             (OTLP profiles proto 1.10); send that version, or none",
            String::from_utf8_lossy(value.as_bytes()),
            SUPPORTED_VERSIONS.map(|v| v.to_string()).join(", ")
        ))),
    }
}

/// Decodes a binary export request (its nesting checked first: [`kiln_proto::wire`]), read in
/// the layout it was written in (proto 1.8 and 1.9 bodies are recognised and rewritten to 1.10:
/// [`kiln_otel::otlp::layout`]), naming the proto version when that is the likely cause of a
/// failure.
pub fn decode_request(body: &[u8]) -> Result<ExportProfilesServiceRequest, ApiError> {
    let (layout, body) = kiln_otel::otlp::layout::to_current(body)?;
    if layout != kiln_otel::otlp::layout::Layout::V1_10 {
        tracing::debug!(
            layout = layout.name(),
            "an OTLP profiles body of an older layout, read as it was written"
        );
    }
    kiln_proto::wire::decode(&body[..]).map_err(|e| {
        let msg = e.to_string();
        if msg.contains("Sample.") {
            ApiError::invalid(format!("invalid OTLP profiles protobuf: {msg}; {V19_HINT}"))
        } else {
            ApiError::invalid(format!("invalid OTLP profiles protobuf: {msg}"))
        }
    })
}

/// How an export request's body is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Protobuf,
    Json,
}

/// Decodes, converts and stores an export request (decoding and converting off the async
/// workers); the response carries partial success.
async fn export(
    app: &AppRef,
    tenant: &TenantId,
    body: Bytes,
    encoding: Encoding,
    share: &mut crate::app::budget::Share,
) -> Result<ExportProfilesServiceResponse, ApiError> {
    // Announced from the start: a group of log records waits briefly for it.
    let expected = app.storage.expect_write();
    let max_decoded = kiln_otel::pprof::decoded_limit(app.limits(tenant).max_decompressed_bytes);
    if encoding == Encoding::Protobuf {
        let decoded = crate::app::budget::decoded_estimate(body.clone(), None, max_decoded).await?;
        share.cover(decoded).await?;
    }
    let limits = app.limits(tenant).normalize();
    let decompressed_bytes = body.len();
    let now = now_nanos();
    let record = Record {
        limits,
        max_decompressed_bytes: app.limits(tenant).max_decompressed_bytes,
        body: RecordBody::Otlp {
            body: body.clone(),
            json: encoding == Encoding::Json,
            now_nanos: now,
        },
    };
    let converted = decode(decompressed_bytes, move || {
        let req = match encoding {
            Encoding::Json => kiln_otel::otlp_json::parse_request(&body)?,
            Encoding::Protobuf => decode_request(&body)?,
        };
        drop(body);
        Ok(kiln_otel::otlp::convert(&req, now, &limits)?)
    })
    .await?;
    let rejected = converted.rejected;
    if converted.profile.series.is_empty() {
        // Nothing to store, but the decoding work still counts against the rate.
        app.tenants
            .charge_ingest(tenant, decompressed_bytes as u64)?;
    } else {
        store(
            app,
            tenant,
            vec![converted.profile],
            decompressed_bytes,
            Some(record),
            Some(expected),
        )
        .await?;
    }
    let partial_success = (!rejected.is_empty()).then(|| ExportProfilesPartialSuccess {
        rejected_profiles: rejected.len() as i64,
        error_message: rejected.join("; "),
    });
    Ok(ExportProfilesServiceResponse { partial_success })
}

/// `POST /v1development/profiles`.
pub async fn http_handler(
    State(app): State<AppRef>,
    Writes(tenant): Writes,
    headers: HeaderMap,
    body: Body,
) -> Response {
    http_export(&app, &tenant, &headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn http_export(
    app: &AppRef,
    tenant: &TenantId,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let limits = app.limits(tenant);
    let body = admit(app, tenant, body, limits.max_body_bytes).await?;
    let media = crate::transport::http::media_type(headers)?;
    let json = match media.as_ref().map(|m| m.essence_str()) {
        Some("application/x-protobuf" | "application/protobuf") => false,
        Some("application/json") => true,
        _ => {
            return Err(ApiError::unsupported_media_type(format!(
                "content type {:?} is not supported; use application/x-protobuf or application/json",
                media.as_ref().map_or("", |m| m.as_ref())
            )));
        }
    };
    let body = read_body(body, limits.max_body_bytes).await?;
    app.metrics.received(tenant, body.len());
    // After the body is read: a client that writes it all before reading sees the 400, not a
    // reset.
    check_version(headers)?;
    // The body's bytes; inflating it grows the share (each gzip trailer read once).
    let mut share = app.decode_budget.take(body.len()).await?;
    let body =
        decode_content_encoding(headers, body, limits.max_decompressed_bytes, &mut share).await?;
    if body.len() > limits.max_decompressed_bytes {
        return Err(ApiError::too_large(format!(
            "request body exceeds the limit of {} bytes once decompressed",
            limits.max_decompressed_bytes
        )));
    }
    let encoding = if json {
        Encoding::Json
    } else {
        Encoding::Protobuf
    };
    let resp = export(app, tenant, body, encoding, &mut share).await?;
    Ok(if json {
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            kiln_otel::otlp_json::response_json(&resp),
        )
            .into_response()
    } else {
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/x-protobuf")],
            resp.encode_to_vec(),
        )
            .into_response()
    })
}

/// The gRPC `ProfilesService`.
#[derive(Debug, Clone)]
pub struct OtlpGrpc {
    app: AppRef,
}

impl OtlpGrpc {
    pub fn new(app: AppRef) -> Self {
        Self { app }
    }
}

impl NamedService for OtlpGrpc {
    const NAME: &'static str =
        "opentelemetry.proto.collector.profiles.v1development.ProfilesService";
}

/// Decodes to raw bytes (Kiln decodes them itself) and encodes the response with prost.
#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

struct RawDecoder;
struct ResponseEncoder;

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        let n = src.remaining();
        Ok(Some(src.copy_to_bytes(n)))
    }
}

impl Encoder for ResponseEncoder {
    type Item = ExportProfilesServiceResponse;
    type Error = Status;
    fn encode(&mut self, item: Self::Item, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|e| Status::internal(format!("encoding the response: {e}")))
    }
}

impl Codec for RawCodec {
    type Encode = ExportProfilesServiceResponse;
    type Decode = Bytes;
    type Encoder = ResponseEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> ResponseEncoder {
        ResponseEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

struct ExportMethod(AppRef);

impl tonic::server::UnaryService<Bytes> for ExportMethod {
    type Response = ExportProfilesServiceResponse;
    type Future =
        futures::future::BoxFuture<'static, Result<tonic::Response<Self::Response>, Status>>;

    fn call(&mut self, req: tonic::Request<Bytes>) -> Self::Future {
        let app = Arc::clone(&self.0);
        Box::pin(async move {
            let tenant = match req
                .extensions()
                .get::<crate::transport::grpc::Authenticated>()
            {
                Some(a) => a.0.clone().single()?,
                None => crate::transport::caller::authenticate(
                    &app,
                    &req.metadata().clone().into_headers(),
                    &Default::default(),
                    Scope::Write,
                )?,
            };
            let version = check_version(&req.metadata().clone().into_headers());
            let result = async {
                version?;
                let body = req.into_inner();
                app.metrics.received(&tenant, body.len());
                let limits = app.limits(&tenant);
                if body.len() > limits.max_decompressed_bytes {
                    return Err(ApiError::new(
                        crate::error::ErrorKind::ResourceExhausted,
                        format!(
                            "the message is {} bytes, more than the tenant's limit of {} bytes",
                            body.len(),
                            limits.max_decompressed_bytes
                        ),
                    ));
                }
                let mut share = app.decode_budget.take(body.len()).await?;
                export(&app, &tenant, body, Encoding::Protobuf, &mut share).await
            }
            .await;
            Ok(tonic::Response::new(result?))
        })
    }
}

impl<B> tower::Service<http::Request<B>> for OtlpGrpc
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let app = Arc::clone(&self.app);
        Box::pin(async move {
            if req.uri().path() != EXPORT_PATH {
                return Ok(
                    Status::unimplemented(format!("no method {}", req.uri().path())).into_http(),
                );
            }
            let max = app.grpc_max_message_bytes;
            let mut grpc = tonic::server::Grpc::new(RawCodec)
                .accept_compressed(tonic::codec::CompressionEncoding::Gzip)
                .accept_compressed(tonic::codec::CompressionEncoding::Zstd)
                .send_compressed(tonic::codec::CompressionEncoding::Gzip)
                .send_compressed(tonic::codec::CompressionEncoding::Zstd)
                .max_decoding_message_size(max)
                .max_encoding_message_size(usize::MAX);
            Ok(grpc.unary(ExportMethod(app), req).await)
        })
    }
}
