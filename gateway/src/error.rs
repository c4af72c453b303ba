//! One error type for every protocol ([`ApiError`]): a small closed [`ErrorKind`], a message
//! for the client and a detail for the log. Clients see a clear message for their mistakes and a
//! generic one for ours. How it is written on each wire (the kind's HTTP status, gRPC code and
//! Connect code, in one table) is the transports' (`crate::transport::error`). Nothing here
//! logs: an error answered to a client carries its detail to the response, and the telemetry
//! layer logs it once, inside the request's span (`crate::transport::telemetry`).

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
    /// What the client would create is there already (409; gRPC `ALREADY_EXISTS`: the Parca
    /// agent's "this debug file is stored").
    AlreadyExists,
    /// The call does not fit the state it finds (412; gRPC `FAILED_PRECONDITION`: an upload
    /// that was not initiated, or is still under way).
    FailedPrecondition,
    Unimplemented,
    Unavailable,
    Internal,
}

impl ErrorKind {
    /// A bounded name for metrics: the `reason` label of refusals.
    pub fn reason(self) -> &'static str {
        match self {
            Self::InvalidInput | Self::Unprocessable => "invalid",
            Self::Unauthenticated => "unauthenticated",
            Self::PermissionDenied => "forbidden",
            Self::NotFound => "not_found",
            Self::PayloadTooLarge => "too_large",
            Self::UnsupportedMediaType => "unsupported_media_type",
            Self::ResourceExhausted => "rate_limited",
            Self::Timeout => "timeout",
            Self::AlreadyExists => "already_exists",
            Self::FailedPrecondition => "failed_precondition",
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

    /// Adds a `Retry-After` (seconds).
    pub fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }

    /// A bounded name for metrics ([`ErrorKind::reason`]).
    pub fn reason(&self) -> &'static str {
        self.kind.reason()
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
}

impl From<kiln_otel::Error> for ApiError {
    fn from(e: kiln_otel::Error) -> Self {
        match e {
            kiln_otel::Error::TooLarge { .. } | kiln_otel::Error::DecodesTooLarge { .. } => {
                Self::too_large(e.to_string())
            }
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

#[cfg(test)]
mod tests {
    use super::*;

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
