//! The `kiln` binary: the allocator and the runtime, then `kiln serve` (the default, run by
//! `kiln_gateway::server`) or one of the other commands (`kiln_gateway::cli`).

use clap::Parser;
use kiln_gateway::cli::{Cli, Command};
use kiln_gateway::server::config::ServeArgs;
use kiln_gateway::server::{lifecycle, traces};

/// jemalloc instead of glibc's allocator: the ingest path allocates and frees many small
/// objects per request, and glibc's malloc (consolidating and searching its free lists) took
/// about a fifth of the server's CPU (docs/performance.md, "Allocator").
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> anyhow::Result<()> {
    lifecycle::runtime()?.block_on(run())
}

async fn run() -> anyhow::Result<()> {
    // Freed pages go back to the system from jemalloc's own thread, after its decay time (10 s),
    // whether or not the process allocates again: without it an idle server kept a burst's
    // memory (1.35 GB after four large profiles, measured; docs/operations.md).
    let background_purge = tikv_jemalloc_ctl::background_thread::write(true);
    // Flags renamed when their values took units keep their old variables for a release.
    let argv = kiln_gateway::units::with_old_environment(std::env::args_os().collect(), |n| {
        std::env::var(n).ok()
    });
    let args = match Cli::parse_from(argv).command {
        None => ServeArgs::default(),
        Some(Command::Serve(args)) => *args,
        Some(Command::Tool(tool)) => return kiln_gateway::cli::run(tool).await,
    };
    // The self-profiler logs each start and stop at info; a filter that names `pprof` decides.
    let telemetry = &args.telemetry;
    let filter = if telemetry.log.contains("pprof") {
        telemetry.log.clone()
    } else {
        format!("{},pprof=warn", telemetry.log)
    };
    let traces = traces::init(&filter, telemetry.otlp_traces_endpoint.as_deref())?;
    if let Err(e) = background_purge {
        tracing::warn!(error = %e, "jemalloc's background purge thread could not start");
    }
    let served = lifecycle::serve(args).await;
    traces.shutdown();
    served
}
