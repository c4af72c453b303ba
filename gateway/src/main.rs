//! The `kiln` binary.

use clap::Parser;
use kiln_gateway::cli::{Cli, Command, ServeArgs};
use tracing_subscriber::EnvFilter;

/// jemalloc instead of glibc's allocator: the ingest path allocates and frees many small
/// objects per request, and glibc's malloc (consolidating and searching its free lists) took
/// about a fifth of the server's CPU (docs/performance.md).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let args = match cli.command {
        Some(Command::Token(cmd)) => return kiln_gateway::cli::token(cmd),
        Some(Command::Serve(args)) => *args,
        Some(Command::Bench(args)) => {
            tracing_subscriber::fmt()
                .with_env_filter(EnvFilter::new("warn"))
                .init();
            return kiln_gateway::bench::run(*args).await;
        }
        Some(Command::Metastore(cmd)) => {
            tracing_subscriber::fmt()
                .with_env_filter(EnvFilter::new("warn"))
                .init();
            return kiln_gateway::cli::metastore(cmd).await;
        }
        None => ServeArgs::default(),
    };
    // The self-profiler logs each start and stop at info; a filter that names `pprof` decides.
    let filter = if args.log.contains("pprof") {
        args.log.clone()
    } else {
        format!("{},pprof=warn", args.log)
    };
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(&filter).unwrap_or_else(|_| EnvFilter::new("info")))
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    kiln_gateway::cli::serve(args).await
}
