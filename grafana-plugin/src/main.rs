//! `gpx_kiln`: the Grafana backend plugin binary.

use std::io::Write;

use kiln_grafana_plugin::handshake::{check_env, handshake_line};
use kiln_grafana_plugin::service::{HealthService, KilnPlugin};
use kiln_proto::grpc::health::v1::health_server::HealthServer;
use kiln_proto::pluginv2::data_server::DataServer;
use kiln_proto::pluginv2::diagnostics_server::DiagnosticsServer;
use kiln_proto::pluginv2::resource_server::ResourceServer;

/// Logs a line in hclog's JSON form on stderr, which Grafana parses into its own log.
fn log(level: &str, message: &str) {
    let line = serde_json::json!({ "@level": level, "@message": message, "@module": "kiln" });
    eprintln!("{line}");
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if let Err(e) = check_env(|k| std::env::var(k).ok()) {
        eprintln!("{e}");
        std::process::exit(1);
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let plugin = KilnPlugin::default();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let server = tonic::transport::Server::builder()
        .add_service(DataServer::new(plugin.clone()))
        .add_service(DiagnosticsServer::new(plugin.clone()))
        .add_service(ResourceServer::new(plugin))
        .add_service(HealthServer::new(HealthService))
        .serve_with_incoming(incoming);
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", handshake_line(addr))?;
        out.flush()?;
    }
    log(
        "info",
        &format!("kiln datasource plugin listening on {addr}"),
    );
    server.await?;
    Ok(())
}
