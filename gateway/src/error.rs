//! One error type for every protocol: a small closed [`ErrorKind`] mapped to HTTP statuses, gRPC
//! codes and Connect codes in one place. Clients see a clear message for their mistakes and a
//! generic one for ours. Nothing here logs: an error answered to a client carries its detail to
//! the response (an [`ErrorDetail`] extension, or a gRPC status's source), and the telemetry
//! layer logs it once, inside the request's span (`crate::telemetry`).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// What kind of failure, independent of protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    InvalidInput,
    Unauthenticated,
    PermissionDenied,
    NotFound,
    PayloadTooLarge,
    UnsupportedMediaType,
    Unprocessable,
    ResourceExhausted,
    /// The client was too slow sending its request (408).
    Timeout,
    Unimplemented,
    Unavailable,
    Internal,
}

impl ErrorKind {
    /// HTTP status.
    pub fn http_status(self) -> StatusCode {
        match self {
            Self::InvalidInput => StatusCode::BAD_REQUEST,
            Self::Unauthenticated => StatusCode::UNAUTHORIZED,
            Self::PermissionDenied => StatusCode::FORBIDDEN,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::Unprocessable => StatusCode::UNPROCESSABLE_ENTITY,
            Self::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Self::Timeout => StatusCode::REQUEST_TIMEOUT,
            Self::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Self::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// gRPC status code.
    pub fn grpc_code(self) -> tonic::Code {
        match self {
            Self::InvalidInput | Self::Unprocessable | Self::UnsupportedMediaType => {
                tonic::Code::InvalidArgument
            }
            Self::Unauthenticated => tonic::Code::Unauthenticated,
            Self::PermissionDenied => tonic::Code::PermissionDenied,
            Self::NotFound => tonic::Code::NotFound,
            Self::PayloadTooLarge | Self::ResourceExhausted => tonic::Code::ResourceExhausted,
            Self::Timeout => tonic::Code::DeadlineExceeded,
            Self::Unimplemented => tonic::Code::Unimplemented,
            Self::Unavailable => tonic::Code::Unavailable,
            Self::Internal => tonic::Code::Internal,
        }
    }

    /// Connect error code (the JSON `code` string).
    pub fn connect_code(self) -> &'static str {
        match self {
            Self::InvalidInput | Self::Unprocessable | Self::UnsupportedMediaType => {
                "invalid_argument"
            }
            Self::Unauthenticated => "unauthenticated",
            Self::PermissionDenied => "permission_denied",
            Self::NotFound => "not_found",
            Self::PayloadTooLarge | Self::ResourceExhausted => "resource_exhausted",
            Self::Timeout => "deadline_exceeded",
            Self::Unimplemented => "unimplemented",
            Self::Unavailable => "unavailable",
            Self::Internal => "internal",
        }
    }
}

/// An error answered to a client.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
    /// Seconds after which a refused request may be retried (429).
    pub retry_after: Option<u64>,
    /// What went wrong, for the server's log only (our failures: the client sees a generic
    /// message).
    pub detail: Option<String>,
}

/// The detail of a failure of ours, carried by its response to the telemetry layer, which logs
/// it once; never sent to the client.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{detail}")]
pub struct ErrorDetail {
    pub kind: ErrorKind,
    pub detail: String,
}

impl ErrorDetail {
    /// The detail an error response carries: from an [`ErrorDetail`] extension (HTTP, Connect)
    /// or the source of a gRPC status.
    pub fn of(resp: &axum::response::Response) -> Option<&ErrorDetail> {
        let extensions = resp.extensions();
        extensions.get::<ErrorDetail>().or_else(|| {
            extensions
                .get::<tonic::Status>()
                .and_then(|s| std::error::Error::source(s))
                .and_then(|e| e.downcast_ref::<ErrorDetail>())
        })
    }
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            retry_after: None,
            detail: None,
        }
    }

    /// Adds what the server's log should say about it.
    pub fn with_detail(mut self, detail: impl std::fmt::Display) -> Self {
        self.detail = Some(detail.to_string());
        self
    }

    /// The detail for the log, or else the message.
    pub fn log_text(&self) -> &str {
        self.detail.as_deref().unwrap_or(&self.message)
    }

    /// Prefixes the message with where the error is.
    pub fn context(mut self, at: String) -> Self {
        self.message = format!("{at}: {}", self.message);
        self
    }

    fn error_detail(&self) -> Option<ErrorDetail> {
        self.detail.as_ref().map(|detail| ErrorDetail {
            kind: self.kind,
            detail: detail.clone(),
        })
    }

    /// Adds a `Retry-After` (seconds).
    pub fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }

    /// A bounded name for metrics.
    pub fn reason(&self) -> &'static str {
        match self.kind {
            ErrorKind::InvalidInput | ErrorKind::Unprocessable => "invalid",
            ErrorKind::Unauthenticated => "unauthenticated",
            ErrorKind::PermissionDenied => "forbidden",
            ErrorKind::NotFound => "not_found",
            ErrorKind::PayloadTooLarge => "too_large",
            ErrorKind::UnsupportedMediaType => "unsupported_media_type",
            ErrorKind::ResourceExhausted => "rate_limited",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Unimplemented => "unimplemented",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Internal => "internal",
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidInput, message)
    }

    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::PayloadTooLarge, message)
    }

    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::UnsupportedMediaType, message)
    }

    /// Our own failure: answered generically, its detail logged by the telemetry layer.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        Self::new(
            ErrorKind::Internal,
            "internal error; the server log has the details",
        )
        .with_detail(detail)
    }

    /// Adds `Retry-After` and the detail for the log to a response answering this error.
    pub fn decorate(&self, resp: &mut Response) {
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        if let Some(detail) = self.error_detail() {
            resp.extensions_mut().insert(detail);
        }
    }

    /// The body Connect clients expect.
    pub fn connect_body(&self) -> String {
        serde_json::json!({ "code": self.kind.connect_code(), "message": self.message }).to_string()
    }
}

impl From<kiln_otel::Error> for ApiError {
    fn from(e: kiln_otel::Error) -> Self {
        match e {
            kiln_otel::Error::TooLarge { .. } => Self::too_large(e.to_string()),
            other => Self::invalid(other.to_string()),
        }
    }
}

/// Seconds a client is asked to wait after a storage failure.
pub const STORAGE_RETRY_AFTER_SECS: u64 = 5;

impl From<kiln_storage::Error> for ApiError {
    fn from(e: kiln_storage::Error) -> Self {
        use kiln_storage::ErrorKind as K;
        match e.kind() {
            K::InvalidInput => Self::invalid(e.to_string().trim_start_matches("invalid query: ")),
            K::ShuttingDown => Self::new(ErrorKind::Unavailable, "the server is shutting down")
                .retry_after(STORAGE_RETRY_AFTER_SECS),
            K::Unavailable => Self::new(
                ErrorKind::Unavailable,
                "storage is unavailable; nothing was stored, retry later",
            )
            .retry_after(STORAGE_RETRY_AFTER_SECS)
            .with_detail(format!("storage unavailable: {e}")),
            K::Internal => Self::internal(e),
        }
    }
}

impl From<ApiError> for tonic::Status {
    fn from(e: ApiError) -> Self {
        let detail = e.error_detail();
        let mut status = tonic::Status::new(e.kind.grpc_code(), e.message);
        if let Some(detail) = detail {
            status.set_source(std::sync::Arc::new(detail));
        }
        if let Some(secs) = e.retry_after
            && let Ok(v) = secs.to_string().parse()
        {
            status.metadata_mut().insert("retry-after", v);
        }
        status
    }
}

impl IntoResponse for ApiError {
    /// Plain HTTP endpoints answer `{"error": "..."}`-free text, as Pyroscope's `/ingest` does,
    /// but as JSON so tools can read it.
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "code": self.kind.connect_code(), "message": self.message });
        let mut resp = (
            self.kind.http_status(),
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response();
        self.decorate(&mut resp);
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body_text(resp: Response) -> String {
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .expect("body");
        String::from_utf8_lossy(&bytes).into_owned()
    }

    #[tokio::test]
    async fn our_failures_carry_their_detail_to_the_layer_not_to_the_client() {
        let http = ApiError::internal("disk on fire").into_response();
        let detail = ErrorDetail::of(&http).expect("HTTP responses carry the detail");
        assert_eq!(
            (detail.kind, detail.detail.as_str()),
            (ErrorKind::Internal, "disk on fire")
        );
        assert!(!body_text(http).await.contains("disk on fire"));

        let connect = crate::connect::connect_error(&ApiError::internal("disk on fire"));
        assert_eq!(ErrorDetail::of(&connect).unwrap().detail, "disk on fire");

        let grpc =
            tonic::Status::from(ApiError::internal("disk on fire")).into_http::<axum::body::Body>();
        assert_eq!(ErrorDetail::of(&grpc).unwrap().detail, "disk on fire");
        assert!(
            !format!("{:?}", grpc.headers()).contains("disk on fire"),
            "grpc-message is the generic message"
        );

        // A client's mistake has nothing to log.
        assert!(ErrorDetail::of(&ApiError::invalid("bad").into_response()).is_none());
    }

    #[test]
    fn unavailable_storage_keeps_its_cause_for_the_log() {
        let e = ApiError::from(kiln_storage::Error::MetastoreUnavailable(
            "disk full".into(),
        ));
        assert_eq!(e.kind, ErrorKind::Unavailable);
        assert_eq!(e.retry_after, Some(STORAGE_RETRY_AFTER_SECS));
        assert!(!e.message.contains("disk full"));
        assert!(e.log_text().contains("disk full"), "{}", e.log_text());
    }
}
