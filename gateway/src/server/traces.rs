//! Logs and traces. One `tracing` subscriber: log lines filtered by `--log`, and, with
//! `--otlp-traces-endpoint`, Kiln's own spans exported over OTLP/gRPC as `service.name=kiln`
//! (the `service_name` its self-profiles carry, so a trace view links to Kiln's own flame
//! graph). Spans are named in `docs/instrumentation.md`: `request` for each API call (method,
//! transport, tenant, status), and the storage engine's stages under it or on their own
//! (`ingest.decode`, `storage.write`, `storage.flush`, `query.*`, `compaction.job`).

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Level;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

/// The crates whose spans are exported: Kiln's own. Spans of the HTTP and gRPC libraries (the
/// exporter's own among them) would feed the exporter with itself.
const EXPORTED: [&str; 3] = ["kiln_gateway", "kiln_storage", "kiln_otel"];

/// Failure to set up tracing.
#[derive(Debug, thiserror::Error)]
pub enum TracesError {
    #[error("--log {filter:?}: {source}")]
    Filter {
        filter: String,
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    #[error("--otlp-traces-endpoint: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error("a tracing subscriber is already installed")]
    AlreadyInstalled,
}

/// Keeps the span exporter alive; [`Traces::shutdown`] sends what is still queued.
#[must_use = "dropping it loses the spans still queued for export"]
pub struct Traces {
    provider: Option<SdkTracerProvider>,
}

impl Traces {
    /// Exports the spans still queued (at most a few seconds) and stops the exporter.
    pub fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(e) = provider.shutdown()
        {
            tracing::warn!(error = %e, "spans still queued for export were lost");
        }
    }
}

/// Installs the process's subscriber: log lines by `filter` (tracing `EnvFilter` syntax), and
/// span export to `otlp_endpoint` when given. Call it inside the Tokio runtime (the exporter's
/// gRPC channel runs on it).
pub fn init(filter: &str, otlp_endpoint: Option<&str>) -> Result<Traces, TracesError> {
    let env_filter = EnvFilter::try_new(filter).map_err(|source| TracesError::Filter {
        filter: filter.to_owned(),
        source,
    })?;
    let logs = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .with_filter(env_filter);
    let provider = match otlp_endpoint {
        Some(endpoint) => {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint)
                .build()?;
            Some(
                SdkTracerProvider::builder()
                    .with_batch_exporter(exporter)
                    .with_resource(
                        Resource::builder()
                            .with_service_name(crate::server::self_profile::SERVICE_NAME)
                            .build(),
                    )
                    .build(),
            )
        }
        None => None,
    };
    let spans = provider.as_ref().map(|p| {
        let own = EXPORTED.iter().fold(Targets::new(), |t, krate| {
            t.with_target(*krate, Level::INFO)
        });
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("kiln"))
            .with_filter(own)
    });
    tracing_subscriber::registry()
        .with(logs)
        .with(spans)
        .try_init()
        .map_err(|_| TracesError::AlreadyInstalled)?;
    if let Some(endpoint) = otlp_endpoint {
        tracing::info!(endpoint, "exporting Kiln's own spans over OTLP");
    }
    Ok(Traces { provider })
}
