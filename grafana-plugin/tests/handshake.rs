//! The built plugin binary follows go-plugin's start-up contract: it refuses to run without
//! Grafana's magic cookie, and with it prints the handshake line and serves gRPC health there.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

#[test]
fn refuses_without_the_cookie() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpx_kiln"))
        .env_remove("grafana_plugin_type")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("grafana_plugin_type=datasource"));
}

#[test]
fn prints_the_handshake_and_serves_health() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpx_kiln"))
        .env("grafana_plugin_type", "datasource")
        .env("PLUGIN_PROTOCOL_VERSIONS", "2")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let parts: Vec<&str> = line.trim().split('|').collect();
    assert_eq!(parts.len(), 5, "{line}");
    assert_eq!(&parts[..3], ["1", "2", "tcp"]);
    assert_eq!(parts[4], "grpc");
    let addr = format!("http://{}", parts[3]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let status = rt.block_on(async {
        let mut c = kiln_proto::grpc::health::v1::health_client::HealthClient::connect(addr)
            .await
            .unwrap();
        c.check(kiln_proto::grpc::health::v1::HealthCheckRequest {
            service: "plugin".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status
    });
    assert_eq!(status, 1, "SERVING");
    child.kill().unwrap();
    let _ = child.wait();
}
