//! The spool, end to end: kiln on an S3 server (moto's, started by the test) keeps acknowledging
//! writes into its spool while the server is stopped, refuses them with 503 once the spool's
//! budget is spent, and after the server is back the data it acknowledged — exactly that — is
//! queryable; another tenant sees none of it.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use kiln_e2e::{Kiln, Tools, free_port};

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
const BUCKET: &str = "spool-e2e";
/// 10 ms per folded sample at the default 100 Hz.
const MS10: i64 = 10_000_000;

/// moto's S3 server on `port`, with the test's bucket (moto keeps objects in memory: a stopped
/// server comes back empty, so the test writes to S3 only once it is down).
fn start_s3(port: u16) -> Result<Child> {
    let python = Tools::find()?.python;
    let server = python.with_file_name("moto_server");
    let child = Command::new(&server)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", server.display()))?;
    let http = reqwest::blocking::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let made = http
            .put(format!("http://127.0.0.1:{port}/{BUCKET}"))
            .send()
            .is_ok_and(|r| r.status().is_success());
        if made {
            return Ok(child);
        }
        ensure!(Instant::now() < deadline, "moto_server did not start");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn spooled_bytes(kiln: &Kiln) -> Result<i64> {
    let text = kiln.metrics_text()?;
    text.lines()
        .find_map(|l| l.strip_prefix("kiln_storage_spool_bytes "))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| anyhow!("no kiln_storage_spool_bytes in /metrics"))
}

#[test]
fn writes_are_spooled_while_s3_is_stopped() -> Result<()> {
    let port = free_port();
    let mut s3 = start_s3(port)?;
    let endpoint = format!("http://127.0.0.1:{port}");
    let env = [
        ("KILN_AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_REGION", "us-east-1"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ];
    let store = format!("s3://{BUCKET}/kiln");
    let kiln = Kiln::start_with_env(
        &[
            "--auth",
            "trusted-header",
            "--admin-tenant",
            kiln_e2e::OPERATOR,
            "--object-store",
            &store,
            "--object-store-retry-timeout-secs",
            "1",
            "--spool-max-bytes",
            "60000",
            "--compaction",
            "false",
        ],
        &env,
    )?;
    // The S3 server stops.
    s3.kill()?;
    s3.wait()?;
    // Writes go on, acknowledged into the spool, until its budget is spent: then 503.
    let mut acknowledged = 0i64;
    let mut refused = 0;
    for i in 0..60 {
        let body: String = (0..30)
            .map(|k| format!("main;spooled_{i};leaf_{k} 1\n"))
            .collect();
        let (status, text) = kiln.ingest(
            "spool-a",
            &format!("name=spooled.cpu&from={}", 1_700_000_000 + i),
            body.into_bytes(),
            &[],
        )?;
        match status {
            200 => acknowledged += 30,
            503 => {
                // The answer is generic; the log says why.
                ensure!(text.contains("nothing was stored"), "{text}");
                refused += 1;
                if refused == 3 {
                    break;
                }
            }
            other => return Err(anyhow!("ingest answered {other}: {text}")),
        }
    }
    ensure!(
        acknowledged > 0 && refused > 0,
        "{acknowledged} acknowledged, {refused} refused"
    );
    ensure!(spooled_bytes(&kiln)? > 0);
    // The server is back (empty: moto keeps nothing); the drainer puts what was spooled.
    let mut s3 = start_s3(port)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let total = loop {
        let total = kiln
            .flamegraph("spool-a", CPU, "{}")
            .map(|f| f.total)
            .unwrap_or(0);
        if total >= acknowledged * MS10 || Instant::now() > deadline {
            break total;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    ensure!(
        total == acknowledged * MS10,
        "queryable after the store returned: {total} of {}",
        acknowledged * MS10
    );
    ensure!(spooled_bytes(&kiln)? == 0);
    kiln.assert_tenant_empty("spool-b")?;
    let _ = s3.kill();
    let _ = s3.wait();
    Ok(())
}
