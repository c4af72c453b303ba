//! How an [`ApiError`] is written on each wire: its kind's HTTP status, gRPC code and Connect
//! code (one table, [`ErrorKind::http_status`] and its two twins), plain HTTP's JSON body
//! ([`IntoResponse`]), Connect's error body, a gRPC status, and `Retry-After`. A failure of ours
//! carries its kind and detail to the telemetry layer ([`Failure`]), never to the client.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::error::{ApiError, ErrorKind};

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
            Self::AlreadyExists => StatusCode::CONFLICT,
            Self::FailedPrecondition => StatusCode::PRECONDITION_FAILED,
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
            Self::AlreadyExists => tonic::Code::AlreadyExists,
            Self::FailedPrecondition => tonic::Code::FailedPrecondition,
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
            Self::AlreadyExists => "already_exists",
            Self::FailedPrecondition => "failed_precondition",
            Self::Unimplemented => "unimplemented",
            Self::Unavailable => "unavailable",
            Self::Internal => "internal",
        }
    }
}

/// What an error response carries to the telemetry layer, never to the client: its kind (the
/// refusal's reason) and, for a failure of ours, the detail the layer logs once.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", detail.as_deref().unwrap_or(kind.reason()))]
pub struct Failure {
    pub kind: ErrorKind,
    /// What went wrong, for the log: set for our failures only.
    pub detail: Option<String>,
}

impl Failure {
    /// What an error response carries: from a [`Failure`] extension (HTTP, Connect) or the
    /// source of a gRPC status. `None` for errors not made from an [`ApiError`] (axum's
    /// rejections, tonic's own): [`refusal_kind`] reads those from their status.
    pub fn of(resp: &Response) -> Option<&Failure> {
        let extensions = resp.extensions();
        extensions.get::<Failure>().or_else(|| {
            extensions
                .get::<tonic::Status>()
                .and_then(|s| std::error::Error::source(s))
                .and_then(|e| e.downcast_ref::<Failure>())
        })
    }
}

/// The kind of failure a response answers, `None` for a success: its [`Failure`], else its
/// `grpc-status` header (a trailers-only gRPC error), else its HTTP status.
pub fn refusal_kind(resp: &Response) -> Option<ErrorKind> {
    if let Some(failure) = Failure::of(resp) {
        return Some(failure.kind);
    }
    if let Some(code) = resp
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
    {
        return ErrorKind::of_grpc_code(tonic::Code::from_i32(code));
    }
    ErrorKind::of_http_status(resp.status())
}

impl ErrorKind {
    /// The kind a gRPC status code answers (`None` for OK); where codes merge kinds, the more
    /// common one.
    pub fn of_grpc_code(code: tonic::Code) -> Option<Self> {
        use tonic::Code;
        Some(match code {
            Code::Ok => return None,
            Code::InvalidArgument | Code::OutOfRange => Self::InvalidInput,
            Code::Unauthenticated => Self::Unauthenticated,
            Code::PermissionDenied => Self::PermissionDenied,
            Code::NotFound => Self::NotFound,
            Code::ResourceExhausted => Self::ResourceExhausted,
            Code::DeadlineExceeded | Code::Cancelled => Self::Timeout,
            Code::AlreadyExists => Self::AlreadyExists,
            Code::FailedPrecondition | Code::Aborted => Self::FailedPrecondition,
            Code::Unimplemented => Self::Unimplemented,
            Code::Unavailable => Self::Unavailable,
            Code::Internal | Code::Unknown | Code::DataLoss => Self::Internal,
        })
    }

    /// The kind an HTTP status answers (`None` below 400).
    pub fn of_http_status(status: StatusCode) -> Option<Self> {
        Some(match status.as_u16() {
            0..=399 => return None,
            401 => Self::Unauthenticated,
            403 => Self::PermissionDenied,
            404 | 405 => Self::NotFound,
            408 => Self::Timeout,
            409 => Self::AlreadyExists,
            412 => Self::FailedPrecondition,
            413 => Self::PayloadTooLarge,
            415 => Self::UnsupportedMediaType,
            422 => Self::Unprocessable,
            429 => Self::ResourceExhausted,
            501 => Self::Unimplemented,
            503 => Self::Unavailable,
            400..=499 => Self::InvalidInput,
            _ => Self::Internal,
        })
    }
}

impl ApiError {
    fn failure(&self) -> Failure {
        Failure {
            kind: self.kind,
            detail: self.detail.clone(),
        }
    }

    /// Adds `Retry-After`, and the [`Failure`] for the telemetry layer, to a response answering
    /// this error.
    pub fn decorate(&self, resp: &mut Response) {
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        resp.extensions_mut().insert(self.failure());
    }

    /// The body Connect clients expect.
    pub fn connect_body(&self) -> String {
        serde_json::json!({ "code": self.kind.connect_code(), "message": self.message }).to_string()
    }
}

impl From<ApiError> for tonic::Status {
    fn from(e: ApiError) -> Self {
        let failure = e.failure();
        let mut status = tonic::Status::new(e.kind.grpc_code(), e.message);
        status.set_source(std::sync::Arc::new(failure));
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
        let failure = Failure::of(&http).expect("HTTP responses carry the failure");
        assert_eq!(
            (failure.kind, failure.detail.as_deref()),
            (ErrorKind::Internal, Some("disk on fire"))
        );
        assert!(!body_text(http).await.contains("disk on fire"));

        let connect = crate::transport::connect::connect_error(&ApiError::internal("disk on fire"));
        assert_eq!(
            Failure::of(&connect).unwrap().detail.as_deref(),
            Some("disk on fire")
        );

        let grpc =
            tonic::Status::from(ApiError::internal("disk on fire")).into_http::<axum::body::Body>();
        assert_eq!(
            Failure::of(&grpc).unwrap().detail.as_deref(),
            Some("disk on fire")
        );
        assert!(
            !format!("{:?}", grpc.headers()).contains("disk on fire"),
            "grpc-message is the generic message"
        );

        // A client's mistake has nothing to log, but its kind is the refusal's reason, on
        // every wire.
        let mistake = ApiError::new(ErrorKind::PayloadTooLarge, "big");
        let http = mistake.into_response();
        assert_eq!(Failure::of(&http).unwrap().detail, None);
        assert_eq!(refusal_kind(&http), Some(ErrorKind::PayloadTooLarge));
        let grpc = tonic::Status::from(ApiError::new(ErrorKind::PayloadTooLarge, "big"))
            .into_http::<axum::body::Body>();
        assert_eq!(refusal_kind(&grpc), Some(ErrorKind::PayloadTooLarge));
        // Errors made elsewhere (tonic's, axum's) by their status.
        let tonic_own = tonic::Status::invalid_argument("x").into_http::<axum::body::Body>();
        assert_eq!(refusal_kind(&tonic_own), Some(ErrorKind::InvalidInput));
        let axum_own = StatusCode::UNPROCESSABLE_ENTITY.into_response();
        assert_eq!(refusal_kind(&axum_own), Some(ErrorKind::Unprocessable));
        assert_eq!(refusal_kind(&StatusCode::OK.into_response()), None);
    }
}
