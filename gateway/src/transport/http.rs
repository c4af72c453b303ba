//! Plain HTTP, as every API over it shares it: request bodies read within their limit and
//! undone of `Content-Encoding: gzip` or `zstd` (bounded), the ingest rate's refusal answered only once the
//! body is drained, and the headers a query's report travels in.

use axum::body::Body;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use crate::app::AppRef;
use crate::app::budget::{self, Share};
use crate::auth::TenantId;
use crate::error::ApiError;
use kiln_otel::compress::Codec;

/// A request's media type (`Content-Type`), `None` when it names none: the one parser of
/// content types every API uses. Its type, subtype and parameter names are lower case; text
/// that is not a media type is 415.
pub fn media_type(headers: &HeaderMap) -> Result<Option<mime::Mime>, ApiError> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Ok(None);
    };
    let text = value
        .to_str()
        .map_err(|_| ApiError::unsupported_media_type("the content type is not valid text"))?;
    if text.trim().is_empty() {
        return Ok(None);
    }
    text.parse().map(Some).map_err(|_| {
        ApiError::unsupported_media_type(format!("content type {text:?} is not a media type"))
    })
}

/// Reads a request body, refusing more than `limit` bytes with 413.
pub async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        // The cause sits some layers down (axum's error, the length limit's, the timeout's).
        let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&e);
        let (mut too_large, mut timed_out) = (false, false);
        while let Some(c) = cause {
            too_large |= c.is::<http_body_util::LengthLimitError>();
            timed_out |= c.is::<tower_http::timeout::TimeoutError>();
            cause = c.source();
        }
        if too_large {
            ApiError::too_large(format!("request body exceeds the limit of {limit} bytes"))
        } else if timed_out {
            ApiError::new(
                crate::error::ErrorKind::Timeout,
                "the request body stopped arriving (nothing for the body read timeout)",
            )
        } else {
            ApiError::invalid(format!("cannot read the request body: {e}"))
        }
    })
}

/// Undoes `Content-Encoding: gzip` or `zstd` (within `limit` bytes, and in the decode budget:
/// `share` is grown as bytes are inflated), if the request says so.
pub async fn decode_content_encoding(
    headers: &HeaderMap,
    body: Bytes,
    limit: usize,
    share: &mut Share,
) -> Result<Bytes, ApiError> {
    let codec = match headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_ascii_lowercase())
        .as_deref()
    {
        None | Some("") | Some("identity") => return Ok(body),
        Some("gzip") | Some("x-gzip") => Codec::Gzip,
        Some("zstd") => Codec::Zstd,
        Some(other) => {
            return Err(ApiError::unsupported_media_type(format!(
                "content encoding {other:?} is not supported; use gzip, zstd or none"
            )));
        }
    };
    Ok(Bytes::from(
        budget::inflate(share, codec, &body, limit, 0).await?,
    ))
}

/// Longest time a refused request's body is read and thrown away.
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The tenant's ingest rate admits another request; when it does not, the body is read and
/// thrown away (up to `limit` bytes, for at most [`DRAIN_TIMEOUT`]) before the 429 is answered.
/// Closing a connection with unread request bytes resets it, so an HTTP/1.1 client that writes
/// its whole body before reading (most do) would see a reset instead of the 429 and its
/// `Retry-After`, and never learn to back off.
pub async fn admit(
    app: &AppRef,
    tenant: &TenantId,
    body: Body,
    limit: usize,
) -> Result<Body, ApiError> {
    match app.tenants.check_ingest(tenant) {
        Ok(()) => Ok(body),
        Err(e) => {
            let mut frames = body.into_data_stream();
            let mut read = 0usize;
            let _ = tokio::time::timeout(DRAIN_TIMEOUT, async {
                while let Some(Ok(chunk)) = futures::StreamExt::next(&mut frames).await {
                    read += chunk.len();
                    if read > limit {
                        break;
                    }
                }
            })
            .await;
            Err(e)
        }
    }
}

/// A query's options from its request headers: `Cache-Control: no-store` (or `no-cache`)
/// answers without the partial-result cache, as HTTP caches and Cortex's query frontend do.
pub fn query_options(headers: &HeaderMap) -> kiln_storage::query::QueryOptions {
    let no_cache = headers
        .get_all(header::CACHE_CONTROL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|d| {
            matches!(
                d.trim().to_ascii_lowercase().as_str(),
                "no-store" | "no-cache"
            )
        });
    kiln_storage::query::QueryOptions {
        results_cache: !no_cache,
    }
}

/// Puts a query's report in response headers any client sees: its warnings (partial answers
/// say so: blocks quarantined while answering) and what it read.
pub fn report_headers(headers: &mut HeaderMap, report: &kiln_storage::query::QueryReport) {
    if !report.warnings.is_empty()
        && let Ok(v) = header::HeaderValue::from_str(&report.warnings.join("; "))
    {
        headers.insert(WARNING_HEADER, v);
    }
    if let Ok(v) = header::HeaderValue::from_str(&report.stats.to_string()) {
        headers.insert(STATS_HEADER, v);
    }
}

/// Response header carrying what a query read ([`kiln_storage::query::QueryStats`]).
pub const STATS_HEADER: &str = "kiln-query-stats";

/// Response header carrying a query's warnings.
pub const WARNING_HEADER: &str = "kiln-warning";

/// The 500 a handler's panic is answered with (the router catches it, so a bug costs one
/// request, never the connection or the process).
pub(crate) fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let detail = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("unknown panic");
    crate::error::ApiError::internal(format!("handler panicked: {detail}")).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn with_type(ct: &[u8]) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_bytes(ct).unwrap(),
        );
        h
    }

    #[test]
    fn one_parser_reads_every_media_type() {
        assert!(media_type(&HeaderMap::new()).unwrap().is_none());
        let m = media_type(&with_type(b"Multipart/Form-Data; Boundary=abc"))
            .unwrap()
            .unwrap();
        assert_eq!(m.essence_str(), "multipart/form-data");
        assert_eq!(m.get_param(mime::BOUNDARY).unwrap(), "abc");
        let err = media_type(&with_type(b"not a type")).unwrap_err();
        assert_eq!(err.kind, ErrorKind::UnsupportedMediaType);
        let err = media_type(&with_type(b"text/\xff")).unwrap_err();
        assert_eq!(err.kind, ErrorKind::UnsupportedMediaType);
        // gRPC by its subtype, with or without a suffix; gRPC-Web is not gRPC.
        use crate::transport::grpc::is_grpc;
        assert!(is_grpc(&with_type(b"application/grpc")));
        assert!(is_grpc(&with_type(b"application/grpc+proto")));
        assert!(!is_grpc(&with_type(b"application/grpc-web+proto")));
        use crate::transport::grpc::is_grpc_web;
        for web in [
            b"application/grpc-web".as_slice(),
            b"application/grpc-web+proto",
            b"application/grpc-web-text",
            b"application/grpc-web-text+proto",
        ] {
            assert!(is_grpc_web(&with_type(web)));
        }
        assert!(!is_grpc_web(&with_type(b"application/grpc")));
        assert!(!is_grpc_web(&with_type(b"application/proto")));
        assert!(!is_grpc(&with_type(b"application/proto")));
    }
}
