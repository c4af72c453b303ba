//! Errors of the profile formats. Every variant is the client's mistake: the gateway maps them
//! to 400, except [`Error::TooLarge`] and [`Error::DecodesTooLarge`], which are 413.

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A profile that cannot be accepted, with the reason a client can act on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The body, once decompressed, is larger than the configured limit.
    #[error("decompressed profile exceeds the limit of {limit} bytes")]
    TooLarge { limit: usize },
    /// The protobuf would decode to more than a request may hold (its fields as a decoder holds
    /// them: a body of empty messages decodes to many times its size).
    #[error(
        "the profile would decode to about {estimate} bytes, more than the {max} bytes a request \
         may hold decoded ({factor}× the tenant's max_decompressed_bytes)"
    )]
    DecodesTooLarge {
        estimate: usize,
        max: usize,
        factor: usize,
    },
    /// The gzip stream is corrupt or truncated.
    #[error("invalid gzip data: {0}")]
    Gzip(String),
    /// The zstd stream is corrupt, truncated, or wants a window past the decoder's cap.
    #[error("invalid zstd data: {0}")]
    Zstd(String),
    /// The protobuf does not decode.
    #[error("invalid pprof protobuf: {0}")]
    Protobuf(String),
    /// The profile decodes but breaks a rule of the format.
    #[error("invalid profile: {0}")]
    Invalid(String),
    /// A text profile line cannot be parsed.
    #[error("invalid {format} profile at line {line}: {reason}")]
    Text {
        format: &'static str,
        line: usize,
        reason: String,
    },
    /// A JFR recording cannot be read.
    #[error("invalid JFR recording at byte {offset}: {reason}")]
    Jfr { offset: usize, reason: String },
    /// The `name` parameter or a label is malformed.
    #[error("invalid labels: {0}")]
    Labels(String),
}
