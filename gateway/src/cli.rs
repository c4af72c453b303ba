//! The `kiln` command line ([`Cli`]: `kiln serve`, the default, and the other commands), and
//! the commands that are clients or tools, not the server ([`Tool`], run by [`run`]):
//! `kiln token` ([`token`]), `kiln metastore` ([`metastore`]), `kiln bench` with its workload
//! ([`bench`](mod@bench)), `kiln upload` ([`upload`]) and `kiln debuginfo upload` ([`debuginfo`]). `kiln serve`'s flags are the server's
//! (`crate::server::config`).

pub mod bench;
pub mod debuginfo;
pub mod metastore;
pub mod token;
pub mod upload;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use crate::server::config::ServeArgs;

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
    Serve(Box<ServeArgs>),
    #[command(flatten)]
    Tool(Tool),
}

/// The commands that are not the server.
#[derive(Debug, Subcommand)]
pub enum Tool {
    /// Mint and inspect JSON Web Tokens for `--auth jwt`.
    #[command(subcommand)]
    Token(token::TokenCommand),
    /// Metastore maintenance.
    #[command(subcommand)]
    Metastore(metastore::MetastoreCommand),
    /// Benchmark the whole system under a deterministic workload, optionally side by side with
    /// DuckDB and ClickHouse (chDB) on the same rows.
    Bench(Box<bench::BenchArgs>),
    /// Upload the Parca agent's offline recordings (`.padata`, `.padata.zst`) to a Kiln.
    Upload(upload::UploadArgs),
    /// Debug files for native frames (`kiln debuginfo upload FILE...`).
    #[command(subcommand)]
    Debuginfo(debuginfo::DebuginfoCommand),
}

/// Runs a command that is not the server. Those that log keep to warnings (`kiln upload`'s on
/// stderr).
pub async fn run(tool: Tool) -> anyhow::Result<()> {
    match tool {
        Tool::Token(cmd) => token::run(cmd),
        Tool::Bench(args) => {
            tracing_subscriber::fmt()
                .with_env_filter(EnvFilter::new("warn"))
                .init();
            bench::run(*args).await
        }
        Tool::Upload(args) => {
            tracing_subscriber::fmt()
                .with_env_filter(EnvFilter::new("warn"))
                .with_writer(std::io::stderr)
                .init();
            upload::run(args).await
        }
        Tool::Debuginfo(cmd) => debuginfo::run(cmd).await,
        Tool::Metastore(cmd) => {
            tracing_subscriber::fmt()
                .with_env_filter(EnvFilter::new("warn"))
                .init();
            metastore::run(cmd).await
        }
    }
}
