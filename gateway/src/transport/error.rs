//! How an [`ApiError`] is written on each wire: its kind's HTTP status, gRPC code and Connect
//! code (one table, [`ErrorKind::http_status`] and its two twins), plain HTTP's JSON body
//! ([`IntoResponse`]), Connect's error body, a gRPC status, and `Retry-After`. A failure of ours
//! carries its detail to the telemetry layer ([`ErrorDetail`]), never to the client.

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
    fn error_detail(&self) -> Option<ErrorDetail> {
        self.detail.as_ref().map(|detail| ErrorDetail {
            kind: self.kind,
            detail: detail.clone(),
        })
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

        let connect = crate::transport::connect::connect_error(&ApiError::internal("disk on fire"));
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
}
