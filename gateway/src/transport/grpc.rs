//! gRPC through tonic, as every gRPC API shares it: the [`Grpc`] service every API implements
//! its tonic trait on (`crate::api::querier`, `crate::api::push`, `crate::api::parca`), with the
//! tenant the request was authenticated as, and a query's report in response metadata.

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::middleware::Next;
use tonic::{Request, Response, Status};
use tower::ServiceExt;

use crate::app::AppRef;
use crate::auth::Scope;

/// gRPC services over the shared app.
#[derive(Debug, Clone)]
pub struct Grpc {
    pub(crate) app: AppRef,
}

impl Grpc {
    pub fn new(app: AppRef) -> Self {
        Self { app }
    }

    pub(crate) fn tenant<T>(
        &self,
        req: &Request<T>,
        scope: Scope,
    ) -> Result<crate::auth::TenantId, Status> {
        if let Some(Authenticated(tenant)) = req.extensions().get() {
            return Ok(tenant.clone());
        }
        let headers = req.metadata().clone().into_headers();
        Ok(self.app.authenticate(&headers, scope)?)
    }
}

/// A query's report in response metadata, as the Connect front end puts it in headers.
/// A unary call's answer: the message, or the error as its gRPC status, counted as the
/// tenant's refusal.
pub(crate) fn answer<T>(
    app: &AppRef,
    tenant: &crate::auth::TenantId,
    result: Result<T, crate::error::ApiError>,
) -> Result<Response<T>, Status> {
    result.map(Response::new).map_err(|e| {
        app.metrics.refused(tenant, e.reason());
        e.into()
    })
}

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

/// The tenant a gRPC request was authenticated as, before tonic decoded anything.
#[derive(Debug, Clone)]
pub struct Authenticated(pub crate::auth::TenantId);

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
    if is_grpc(req.headers()) {
        let scope = scope_of(req.uri().path());
        let tenant = match app.authenticate(req.headers(), scope) {
            Ok(t) => t,
            Err(e) => return grpc_refusal(e),
        };
        if scope == Scope::Write
            && let Err(e) = app.tenants.check_ingest(&tenant)
        {
            app.metrics.refused(&tenant, e.reason());
            return grpc_refusal(e);
        }
        req.extensions_mut().insert(Authenticated(tenant));
        let mut resp = match grpc.oneshot(req).await {
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

/// Whether a request is gRPC: its content type is `application/grpc`, `application/grpc+proto`, …
pub(crate) fn is_grpc(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/grpc"))
}
