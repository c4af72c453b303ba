//! The `kiln` command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use kiln_storage::{Storage, StorageConfig};

use crate::app::{App, Limits};
use crate::metrics::Metrics;
use crate::tenant::AuthMode;

/// Kiln: a multi-tenant continuous-profiling backend.
#[derive(Debug, Parser)]
#[command(name = "kiln", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server (the default).
    Serve(ServeArgs),
}

/// `kiln serve` flags. Every flag also reads a `KILN_…` environment variable.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on, HTTP/1.1 and h2c (gRPC) on one port.
    #[arg(long, env = "KILN_LISTEN", default_value = "127.0.0.1:4040")]
    pub listen: SocketAddr,

    /// Directory for the local object store and the embedded metastore.
    #[arg(long, env = "KILN_DATA_DIR", default_value = "./data")]
    pub data_dir: PathBuf,

    /// How requests map to tenants: `none` (one tenant, `anonymous`) or `trusted-header`
    /// (`X-Scope-OrgID`, behind an authenticating proxy).
    #[arg(long, env = "KILN_AUTH", value_enum, default_value = "none")]
    pub auth: AuthMode,

    /// Number of write shards.
    #[arg(long, env = "KILN_SHARDS", default_value_t = 2)]
    pub shards: u32,

    /// Longest time, in milliseconds, a write is buffered before it is flushed to a block.
    #[arg(long, env = "KILN_FLUSH_INTERVAL_MS", default_value_t = 200)]
    pub flush_interval_ms: u64,

    /// A shard flushes as soon as its buffer passes this many bytes.
    #[arg(long, env = "KILN_FLUSH_BYTES", default_value_t = 32 << 20)]
    pub flush_bytes: usize,

    /// Largest request body accepted, as sent (413 above it).
    #[arg(long, env = "KILN_MAX_BODY_BYTES", default_value_t = 64 << 20)]
    pub max_body_bytes: usize,

    /// Largest profile accepted once decompressed (413 above it).
    #[arg(long, env = "KILN_MAX_DECOMPRESSED_BYTES", default_value_t = 64 << 20)]
    pub max_decompressed_bytes: usize,

    /// Stacks deeper than this are truncated, keeping the root side.
    #[arg(long, env = "KILN_MAX_STACK_DEPTH", default_value_t = 1000)]
    pub max_stack_depth: usize,

    /// Memory for cached symbol tables, in bytes.
    #[arg(long, env = "KILN_SYMBOLS_CACHE_BYTES", default_value_t = 256 << 20)]
    pub symbols_cache_bytes: u64,

    /// Log filter (tracing `EnvFilter` syntax).
    #[arg(long, env = "KILN_LOG", default_value = "info")]
    pub log: String,
}

impl Default for ServeArgs {
    fn default() -> Self {
        Self::parse_from_empty()
    }
}

impl ServeArgs {
    fn parse_from_empty() -> Self {
        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            args: ServeArgs,
        }
        Wrapper::parse_from(["kiln"]).args
    }

    /// Checks values clap cannot.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.shards > 0, "--shards must be at least 1");
        anyhow::ensure!(
            self.flush_interval_ms > 0,
            "--flush-interval-ms must be positive"
        );
        anyhow::ensure!(self.max_body_bytes > 0, "--max-body-bytes must be positive");
        anyhow::ensure!(
            self.max_decompressed_bytes > 0,
            "--max-decompressed-bytes must be positive"
        );
        Ok(())
    }

    /// Storage settings from these flags.
    pub fn storage_config(&self) -> StorageConfig {
        let mut c = StorageConfig::new(&self.data_dir);
        c.writer.shards = self.shards;
        c.writer.flush_interval = Duration::from_millis(self.flush_interval_ms);
        c.writer.flush_bytes = self.flush_bytes;
        c.symbols_cache_bytes = self.symbols_cache_bytes;
        c
    }

    /// Request limits from these flags.
    pub fn limits(&self) -> Limits {
        let mut l = Limits {
            max_body_bytes: self.max_body_bytes,
            max_decompressed_bytes: self.max_decompressed_bytes,
            ..Limits::default()
        };
        l.normalize.max_stack_depth = self.max_stack_depth;
        l
    }
}

/// Opens storage and builds the shared app.
pub async fn build_app(args: &ServeArgs) -> anyhow::Result<Arc<App>> {
    args.validate()?;
    let storage = Storage::open(args.storage_config()).await?;
    Ok(Arc::new(App {
        storage,
        limits: args.limits(),
        auth: args.auth,
        metrics: Metrics::default(),
    }))
}

/// Runs `kiln serve` until SIGTERM.
pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let app = build_app(&args).await?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.listen))?;
    crate::server::serve(app, listener, crate::server::shutdown_signal()).await?;
    Ok(())
}
