//! Request telemetry as a layer: every request through the API port is counted, timed and
//! classified here (API method, transport, status class), so no handler can forget it and no
//! label can grow without bound; every refusal is counted here, by its reason, for the tenant
//! authentication found (`crate::transport::caller`); and the failures of ours a response
//! carries are logged, once, in the request's span. Names are in `docs/instrumentation.md`.

use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

use crate::app::AppRef;
use crate::error::ErrorKind;
use crate::metrics::{ApiLabels, ApiRequestLabels};
use crate::transport::caller::{Caller, CallerSlot};
use crate::transport::error::{Failure, refusal_kind};

/// `2xx`, `3xx`, `4xx` or `5xx`; a gRPC answer by its `grpc-status` (errors come trailers-only,
/// in the headers; a status in trailers is a success), mapped as the HTTP status would be.
fn status_class(resp: &Response) -> &'static str {
    if let Some(code) = resp
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
    {
        return match code {
            0 => "2xx",
            // Cancelled, invalid argument, not found, already exists, permission denied,
            // resource exhausted, failed precondition, aborted, out of range, unauthenticated.
            1 | 3 | 5 | 6 | 7 | 8 | 9 | 10 | 11 | 16 => "4xx",
            _ => "5xx",
        };
    }
    match resp.status().as_u16() {
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

/// How the layer names a request, from the API table (handed in by `crate::api::router`: the
/// layer knows no API).
#[derive(Debug, Clone, Copy)]
pub struct Classify {
    /// The API method a request to a path calls: a bounded name.
    pub method: fn(&str) -> &'static str,
    /// The transport a request came by: `grpc`, `connect` or `http`.
    pub transport: fn(&str, &HeaderMap) -> &'static str,
}

/// The layer: counts, times and traces each request.
pub async fn track(
    State((app, classify)): State<(AppRef, Classify)>,
    mut req: Request,
    next: Next,
) -> Response {
    let caller = CallerSlot::default();
    req.extensions_mut().insert(caller.clone());
    let method = (classify.method)(req.uri().path());
    let transport = (classify.transport)(req.uri().path(), req.headers());
    let labels = ApiLabels { method, transport };
    let in_flight = app.metrics.api_in_flight.get_or_create(&labels).clone();
    in_flight.inc();
    let started = Instant::now();
    let span = tracing::info_span!(
        "request",
        otel.name = method,
        method,
        transport,
        tenant = tracing::field::Empty,
        status = tracing::field::Empty,
    );
    let resp = next.run(req).instrument(span.clone()).await;
    in_flight.dec();
    let status = status_class(&resp);
    span.record("status", status);
    // Errors are logged here, once, in the request's span (with its tenant): not where they
    // were made.
    if let Some(Failure {
        kind,
        detail: Some(detail),
    }) = Failure::of(&resp)
    {
        let _in_request = span.enter();
        match kind {
            ErrorKind::Internal => tracing::error!(error = %detail, "request failed"),
            _ => tracing::warn!(error = %detail, "request failed"),
        }
    }
    let resp = count_refusal(&app, &caller, resp);
    app.metrics
        .api_requests
        .get_or_create(&ApiRequestLabels {
            method,
            transport,
            status,
        })
        .inc();
    app.metrics
        .api_duration
        .get_or_create(&labels)
        .observe(started.elapsed().as_secs_f64());
    resp
}

/// Counts a refused request: by reason when authentication refused it, by tenant and reason
/// after. A gRPC stream's refusal comes in its trailers: its body is watched for them.
fn count_refusal(app: &AppRef, caller: &CallerSlot, resp: Response) -> Response {
    match (caller.get(), refusal_kind(&resp)) {
        (Some(Caller::Refused), Some(kind)) => app.metrics.auth_refused(kind.reason()),
        (Some(Caller::Tenant(tenant)), Some(kind)) => app.metrics.refused(tenant, kind.reason()),
        (Some(Caller::Tenant(tenant)), None) if streams_grpc(&resp) => {
            let (app, tenant) = (app.clone(), tenant.clone());
            return resp.map(|body| {
                axum::body::Body::new(TrailersWatch {
                    inner: body,
                    on_refusal: Some(Box::new(move |kind| {
                        app.metrics.refused(&tenant, kind.reason())
                    })),
                })
            });
        }
        _ => {}
    }
    resp
}

/// A gRPC answer whose status comes in trailers (a stream, or a unary success).
fn streams_grpc(resp: &Response) -> bool {
    crate::transport::grpc::is_grpc(resp.headers()) && !resp.headers().contains_key("grpc-status")
}

/// A response body that tells `on_refusal` the kind of a non-OK `grpc-status` in its trailers.
struct TrailersWatch {
    inner: axum::body::Body,
    on_refusal: Option<Box<dyn FnOnce(ErrorKind) + Send>>,
}

impl http_body::Body for TrailersWatch {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let frame = std::task::ready!(std::pin::Pin::new(&mut self.inner).poll_frame(cx));
        if let Some(Ok(f)) = &frame
            && let Some(trailers) = f.trailers_ref()
            && let Some(kind) = trailers
                .get("grpc-status")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<i32>().ok())
                .and_then(|c| ErrorKind::of_grpc_code(tonic::Code::from_i32(c)))
            && let Some(count) = self.on_refusal.take()
        {
            count(kind);
        }
        std::task::Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
