//! Request telemetry as a layer: every request through the API port is counted, timed and
//! classified here (API method, transport, status class), so no handler can forget it and no
//! label can grow without bound, and the failures of ours a response carries are logged, once,
//! in the request's span. Names are in `docs/instrumentation.md`.

use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

use crate::app::AppRef;
use crate::error::{ErrorDetail, ErrorKind};
use crate::metrics::{ApiLabels, ApiRequestLabels};

/// Every API method name the layer gives (the `method` label's values), from the API table.
pub fn api_methods() -> Vec<String> {
    crate::api::method_names()
        .into_iter()
        .map(str::to_owned)
        .collect()
}

/// The API method a request calls: a bounded name, from the path alone (the API table's).
pub fn api_method(path: &str) -> &'static str {
    crate::api::method_name(path)
}

/// `grpc`, `connect` (Connect's protobuf or JSON over HTTP) or `http`.
pub fn transport(path: &str, headers: &HeaderMap) -> &'static str {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if content_type.starts_with("application/grpc") {
        "grpc"
    } else {
        crate::api::transport_of(path).label()
    }
}

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

/// The layer: counts, times and traces each request.
pub async fn track(State(app): State<AppRef>, req: Request, next: Next) -> Response {
    let method = api_method(req.uri().path());
    let transport = transport(req.uri().path(), req.headers());
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
    if let Some(failure) = ErrorDetail::of(&resp) {
        let _in_request = span.enter();
        match failure.kind {
            ErrorKind::Internal => tracing::error!(error = %failure.detail, "request failed"),
            _ => tracing::warn!(error = %failure.detail, "request failed"),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_are_bounded_names() {
        assert_eq!(api_method("/ingest"), "ingest");
        assert_eq!(
            api_method("/querier.v1.QuerierService/SelectSeries"),
            "querier.v1.QuerierService/SelectSeries"
        );
        assert_eq!(
            api_method("/querier.v1.QuerierService/Whatever123"),
            "querier.v1.QuerierService/unknown"
        );
        assert_eq!(
            api_method("/api/v1/tenants/acme/usage"),
            "admin.tenant.usage"
        );
        assert_eq!(api_method("/api/v1/tenants/acme"), "admin.tenant");
        assert_eq!(api_method("/random/path/12345"), "other");
        assert_eq!(api_method("/pyroscope/render"), "pyroscope.render");
        assert_eq!(
            api_method("/pyroscope/render-diff"),
            "pyroscope.render-diff"
        );
        assert_eq!(api_method("/pyroscope/labels"), "pyroscope.labels");
        assert_eq!(
            api_method("/pyroscope/label-values"),
            "pyroscope.label-values"
        );
        for path in [
            "/ingest",
            "/metrics",
            "/x",
            "/api/v1/tenants/a/b/c",
            "/pyroscope/render",
            "/pyroscope/label-values",
            "/settings.v1.SettingsService/Get",
        ] {
            assert!(api_methods().contains(&api_method(path).to_owned()));
        }
        for m in crate::querier::QUERIER_METHODS {
            assert_eq!(api_method(&format!("/{m}")), *m);
        }
    }

    #[test]
    fn transports_come_from_the_table() {
        let none = HeaderMap::new();
        let mut grpc = HeaderMap::new();
        grpc.insert(header::CONTENT_TYPE, "application/grpc".parse().unwrap());
        assert_eq!(
            transport("/settings.v1.SettingsService/Get", &none),
            "connect"
        );
        assert_eq!(transport("/push.v1.PusherService/Push", &none), "connect");
        assert_eq!(transport("/push.v1.PusherService/Push", &grpc), "grpc");
        assert_eq!(transport("/ingest", &none), "http");
        assert_eq!(transport("/unknown", &none), "http");
    }
}
