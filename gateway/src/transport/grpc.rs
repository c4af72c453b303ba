//! gRPC through tonic, as every gRPC API shares it: the [`Grpc`] service every API implements
//! its tonic trait on (`crate::api::querier`, `crate::api::push`, `crate::api::parca`), with the
//! tenant the request was authenticated as, and a query's report in response metadata.

use axum::Router;
use axum::extract::State;
use axum::middleware::Next;
use tonic::{Request, Response, Status};
use tower::{Layer, ServiceExt};

use crate::app::AppRef;
use crate::auth::Scope;
use crate::transport::caller::authenticate_reads;

/// gRPC services over the shared app.
#[derive(Debug, Clone)]
pub struct Grpc {
    pub(crate) app: AppRef,
}

impl Grpc {
    pub fn new(app: AppRef) -> Self {
        Self { app }
    }

    /// The one tenant a request acts for; a read spanning tenants is refused.
    pub(crate) fn tenant<T>(
        &self,
        req: &Request<T>,
        scope: Scope,
    ) -> Result<crate::auth::TenantId, Status> {
        Ok(self.tenants(req, scope)?.single()?)
    }

    /// Every tenant a request covers (a read may span several: `X-Scope-OrgID: a|b`).
    pub(crate) fn tenants<T>(
        &self,
        req: &Request<T>,
        scope: Scope,
    ) -> Result<crate::auth::TenantSet, Status> {
        if let Some(Authenticated(tenants)) = req.extensions().get() {
            return Ok(tenants.clone());
        }
        // Not through `steer` (which always authenticates gRPC): no slot for the layer.
        let headers = req.metadata().clone().into_headers();
        Ok(crate::transport::caller::authenticate_reads(
            &self.app,
            &headers,
            &Default::default(),
            scope,
        )?)
    }
}

/// A unary call's answer: the message, or the error as its gRPC status (counted by the
/// telemetry layer).
pub(crate) fn answer<T>(result: Result<T, crate::error::ApiError>) -> Result<Response<T>, Status> {
    result.map(Response::new).map_err(Status::from)
}

/// A query's report in response metadata, as the Connect front end puts it in headers.
pub(crate) fn report_metadata<T>(
    resp: &mut Response<T>,
    report: &kiln_storage::query::QueryReport,
) {
    use tonic::metadata::MetadataValue;
    if !report.warnings.is_empty()
        && let Ok(v) = MetadataValue::try_from(report.warnings.join("; "))
    {
        resp.metadata_mut()
            .insert(crate::transport::http::WARNING_HEADER, v);
    }
    if let Ok(v) = MetadataValue::try_from(report.stats.to_string()) {
        resp.metadata_mut()
            .insert(crate::transport::http::STATS_HEADER, v);
    }
}

/// The tenants a gRPC request was authenticated for, before tonic decoded anything: one, or
/// several for a read spanning tenants (each service asks for what it takes).
#[derive(Debug, Clone)]
pub struct Authenticated(pub crate::auth::TenantSet);

/// What [`steer`] needs: tonic's routes, the app, and the scope each gRPC path needs (the API
/// table's knowledge, handed in by `crate::api::router`).
#[derive(Clone)]
pub(crate) struct Steer {
    pub grpc: Router,
    pub app: AppRef,
    pub scope_of: fn(&str) -> Scope,
}

/// Sends gRPC requests to tonic, the rest on through axum. gRPC requests are authenticated here,
/// before tonic reads and decompresses their message, so an unauthenticated caller costs nothing;
/// the tenant travels to the services as a request extension.
pub(crate) async fn steer(
    State(Steer {
        grpc,
        app,
        scope_of,
    }): State<Steer>,
    mut req: axum::extract::Request,
    next: Next,
) -> axum::response::Response {
    let web = is_grpc_web(req.headers());
    if is_grpc(req.headers()) || web {
        let scope = scope_of(req.uri().path());
        let checked =
            authenticate_reads(&app, req.headers(), req.extensions(), scope).and_then(|tenants| {
                if scope == Scope::Write {
                    app.tenants.check_ingest(tenants.first())?;
                }
                Ok(tenants)
            });
        let tenants = match checked {
            Ok(t) => t,
            Err(e) if web => return grpc_web_refusal(req.into_body(), e).await,
            Err(e) => return grpc_refusal(e),
        };
        req.extensions_mut().insert(Authenticated(tenants));
        // gRPC-Web is translated to gRPC and back (tonic-web), so both reach the same services.
        let result = if web {
            tonic_web::GrpcWebLayer::new()
                .layer(grpc)
                .oneshot(req)
                .await
                .map(|r| r.map(axum::body::Body::new))
        } else {
            grpc.oneshot(req).await
        };
        let mut resp = match result {
            Ok(resp) => resp,
            Err(never) => match never {},
        };
        oversize_is_resource_exhausted(&mut resp);
        return resp;
    }
    next.run(req).await
}

/// A gRPC refusal (trailers-only response) for an error found before tonic runs.
fn grpc_refusal(e: crate::error::ApiError) -> axum::response::Response {
    tonic::Status::from(e).into_http::<axum::body::Body>()
}

/// Most of a refused gRPC-Web body read, and for how long.
const REFUSED_DRAIN_BYTES: usize = 1 << 20;
const REFUSED_DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(2);

/// A gRPC-Web refusal: the gRPC one, with gRPC-Web's content type (its clients check it). Over
/// HTTP/1.1 a client still writing its request would see the connection close (`EPIPE`) rather
/// than the answer, so up to [`REFUSED_DRAIN_BYTES`] of the body are read first.
async fn grpc_web_refusal(
    body: axum::body::Body,
    e: crate::error::ApiError,
) -> axum::response::Response {
    use http_body_util::BodyExt;
    let limited = http_body_util::Limited::new(body, REFUSED_DRAIN_BYTES);
    let _ = tokio::time::timeout(REFUSED_DRAIN_TIME, limited.collect()).await;
    let mut resp = grpc_refusal(e);
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc-web+proto"),
    );
    resp
}

/// tonic answers a message over the size limit with `OutOfRange`; gRPC servers elsewhere (and
/// OTLP exporters' retry logic) expect `ResourceExhausted`.
fn oversize_is_resource_exhausted(resp: &mut axum::response::Response) {
    let headers = resp.headers_mut();
    let too_large = headers.get("grpc-status").is_some_and(|s| s == "11")
        && headers
            .get("grpc-message")
            .and_then(|m| m.to_str().ok())
            .is_some_and(|m| {
                m.contains("message%20length%20too%20large")
                    || m.contains("message length too large")
            });
    if too_large {
        headers.insert("grpc-status", http::HeaderValue::from_static("8"));
    }
}

/// Whether a request (or response) is gRPC-Web: `application/grpc-web`, `…+proto`, or the text
/// variants (`application/grpc-web-text`, base64 bodies) browser clients send.
pub(crate) fn is_grpc_web(headers: &axum::http::HeaderMap) -> bool {
    crate::transport::http::media_type(headers)
        .ok()
        .flatten()
        .is_some_and(|m| {
            m.type_() == mime::APPLICATION
                && matches!(m.subtype().as_str(), "grpc-web" | "grpc-web-text")
        })
}

/// Whether a request (or response) is gRPC: its content type is `application/grpc`,
/// `application/grpc+proto`, `application/grpc+json` (not gRPC-Web's `application/grpc-web`).
pub(crate) fn is_grpc(headers: &axum::http::HeaderMap) -> bool {
    crate::transport::http::media_type(headers)
        .ok()
        .flatten()
        .is_some_and(|m| m.type_() == mime::APPLICATION && m.subtype() == "grpc")
}
