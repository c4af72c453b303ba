//! Per-tenant limits: a tenant over its ingest rate gets 429 with Retry-After while another
//! tenant's ingest and queries keep their latency; nothing acknowledged is lost; limits reload
//! from the tenant file without a restart; usage is metered and a tenant can be erased.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use kiln_e2e::Kiln;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

fn percentile(mut v: Vec<Duration>, p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// One ingest and one flame graph query of `tenant`, timed.
fn quiet_round(kiln: &Kiln, i: usize) -> Result<Vec<Duration>> {
    let t = Instant::now();
    let (s, body) = kiln.ingest(
        "quiet",
        "name=quiet.cpu&from=1700000000",
        format!("main;quiet_work_{} 1\n", i % 7).into_bytes(),
        &[],
    )?;
    ensure!(s == 200, "quiet ingest: {s} {body}");
    let ingest = t.elapsed();
    let t = Instant::now();
    kiln.flamegraph("quiet", CPU, "{}")?;
    Ok(vec![ingest, t.elapsed()])
}

#[test]
fn noisy_tenant_is_limited_without_hurting_others() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(
        &tenants,
        "[tenants.noisy]\ningest_rate_bytes = 4000\ningest_burst_bytes = 4000\n",
    )?;
    let kiln = Arc::new(Kiln::start(&["--tenants", &tenants.display().to_string()])?);

    // Baseline latency of the quiet tenant, alone.
    let mut baseline = Vec::new();
    for i in 0..20 {
        baseline.extend(quiet_round(&kiln, i)?);
    }

    // The noisy tenant floods from two threads.
    let stop = Arc::new(AtomicBool::new(false));
    let (acked, refused, retry_after) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(true)),
    );
    let body = "main;noisy_flood ".to_string() + "1\n";
    let mut threads = Vec::new();
    for _ in 0..2 {
        let (kiln, stop, acked, refused, retry_after, body) = (
            kiln.clone(),
            stop.clone(),
            acked.clone(),
            refused.clone(),
            retry_after.clone(),
            body.clone(),
        );
        threads.push(std::thread::spawn(move || {
            let padded = format!("{}{}", "main;noisy_padding 1\n".repeat(40), body);
            while !stop.load(Ordering::Relaxed) {
                let r = kiln
                    .http()
                    .post(kiln.url("/ingest?name=noisy.cpu&from=1700000000"))
                    .header("X-Scope-OrgID", "noisy")
                    .body(padded.clone())
                    .send();
                match r {
                    Ok(r) if r.status().as_u16() == 200 => {
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(r) if r.status().as_u16() == 429 => {
                        refused.fetch_add(1, Ordering::Relaxed);
                        if r.headers().get("retry-after").is_none() {
                            retry_after.store(false, Ordering::Relaxed);
                        }
                        // A client ignoring Retry-After, but not spinning this test's CPU.
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Ok(r) => panic!("noisy got {}", r.status()),
                    Err(e) => panic!("noisy request failed: {e}"),
                }
            }
        }));
    }
    std::thread::sleep(Duration::from_millis(300));
    let mut during = Vec::new();
    for i in 0..20 {
        during.extend(quiet_round(&kiln, i)?);
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let (acked, refused) = (
        acked.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
    );
    let (b95, d95) = (
        percentile(baseline.clone(), 0.95),
        percentile(during.clone(), 0.95),
    );
    eprintln!(
        "quiet p50/p95 alone {:?}/{:?}, during the flood {:?}/{:?}; noisy: {acked} acknowledged, {refused} refused",
        percentile(baseline, 0.5),
        b95,
        percentile(during, 0.5),
        d95
    );
    ensure!(refused > 0, "the noisy tenant was never limited");
    ensure!(
        retry_after.load(Ordering::Relaxed),
        "a 429 without Retry-After"
    );
    ensure!(
        d95 <= (b95 * 5).max(b95 + Duration::from_millis(250)),
        "quiet p95 went from {b95:?} to {d95:?}"
    );

    // Nothing acknowledged was lost: 41 samples of 10 ms per acknowledged request.
    let fg = kiln.flamegraph("noisy", CPU, "{}")?;
    ensure!(
        fg.total == acked as i64 * 41 * 10_000_000,
        "noisy stored {} for {acked} acknowledged",
        fg.total
    );
    ensure!(
        !fg.names.iter().any(|n| n.starts_with("quiet_work")),
        "tenant wall"
    );

    // Usage is metered per tenant, on the admin API (none/trusted-header: no admin scope here,
    // see usage_admin_api) and on /metrics.
    let metrics = kiln.metrics_text()?;
    ensure!(
        metrics.contains(
            "kiln_tenant_refused_requests_total{tenant=\"noisy\",reason=\"rate_limited\"}"
        ),
        "{metrics}"
    );
    ensure!(metrics.contains("kiln_tenant_ingest_samples_total{tenant=\"quiet\"}"));
    Ok(())
}

#[test]
fn limits_reload_without_restart() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(&tenants, "[defaults]\nmax_series = 1\n")?;
    let kiln = Kiln::start(&["--tenants", &tenants.display().to_string()])?;
    let (s, _) = kiln.ingest("t", "name=one.cpu", b"a 1".to_vec(), &[])?;
    ensure!(s == 200);
    let (s, body) = kiln.ingest("t", "name=two.cpu", b"a 1".to_vec(), &[])?;
    ensure!(s == 429 && body.contains("series"), "{s} {body}");
    // Raise the limit in the file: the running server picks it up.
    std::fs::write(&tenants, "[defaults]\nmax_series = 10\n# reloaded\n")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (s, body) = kiln.ingest("t", "name=two.cpu", b"a 1".to_vec(), &[])?;
        if s == 200 {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the new limit did not apply: {s} {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // A broken file keeps the limits in force.
    std::fs::write(&tenants, "[defaults]\nmax_seriess = 1\n")?;
    std::thread::sleep(Duration::from_millis(1500));
    let (s, _) = kiln.ingest("t", "name=three.cpu", b"a 1".to_vec(), &[])?;
    ensure!(s == 200, "a bad file must not change the limits");
    ensure!(kiln.log_text().contains("tenant limits not reloaded"));
    // Other limits from the file: samples per profile and label value length.
    std::fs::write(
        &tenants,
        "[defaults]\nmax_samples_per_profile = 2\nmax_label_value_length = 8\n",
    )?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (s, body) = kiln.ingest(
            "t",
            "name=four.cpu&format=pprof",
            pprof_with_samples(3),
            &[],
        )?;
        if s == 400 && body.contains("limit of 2") {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "max_samples_per_profile did not apply: {s} {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (s, body) = kiln.ingest(
        "t",
        "name=five.cpu%7Benv%3Dproduction-eu%7D",
        b"a 1".to_vec(),
        &[],
    )?;
    ensure!(
        s == 400 && body.contains("longer than 8 bytes"),
        "{s} {body}"
    );
    Ok(())
}

fn pprof_with_samples(n: u64) -> Vec<u8> {
    use kiln_proto::google::v1 as p;
    prost::Message::encode_to_vec(&p::Profile {
        string_table: ["", "cpu", "nanoseconds", "f"].map(String::from).to_vec(),
        sample_type: vec![p::ValueType { r#type: 1, unit: 2 }],
        function: vec![p::Function {
            id: 1,
            name: 3,
            ..Default::default()
        }],
        location: vec![p::Location {
            id: 1,
            line: vec![p::Line {
                function_id: 1,
                line: 1,
            }],
            ..Default::default()
        }],
        sample: (0..n)
            .map(|_| p::Sample {
                location_id: vec![1],
                value: vec![1],
                label: vec![],
            })
            .collect(),
        ..Default::default()
    })
}

/// A tenant over its rate that sends a large body receives its 429 and `Retry-After`, not a
/// connection reset: this client writes the whole 8 MiB body before it reads, as ordinary HTTP
/// clients do.
#[test]
fn an_over_rate_tenant_sending_a_large_body_reads_its_429() -> Result<()> {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir()?;
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(
        &tenants,
        "[tenants.big]\ningest_rate_bytes = 100\ningest_burst_bytes = 1000\n",
    )?;
    let kiln = Kiln::start(&[
        "--tenants",
        &tenants.display().to_string(),
        "--max-body-bytes",
        "16777216",
    ])?;
    // One request larger than the burst passes and empties the bucket for a minute.
    let (s, b) = kiln.ingest(
        "big",
        "name=big.cpu&from=1700000000",
        "main;fill 1\n".repeat(500).into_bytes(),
        &[],
    )?;
    ensure!(s == 200, "{s} {b}");
    let body = "main;flood 1\n".repeat(8 << 20 >> 4);
    for round in 0..3 {
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", kiln.port))?;
        conn.set_read_timeout(Some(Duration::from_secs(30)))?;
        write!(
            conn,
            "POST /ingest?name=big.cpu&from=1700000000 HTTP/1.1\r\nHost: 127.0.0.1\r\n\
             X-Scope-OrgID: big\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )?;
        conn.write_all(body.as_bytes())
            .map_err(|e| anyhow::anyhow!("round {round}: writing the body: {e}"))?;
        let mut answer = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match conn.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    answer.extend_from_slice(&buf[..n]);
                    if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
                Err(e) => anyhow::bail!("round {round}: reading the answer: {e}"),
            }
        }
        let head = String::from_utf8_lossy(&answer).to_ascii_lowercase();
        ensure!(head.starts_with("http/1.1 429"), "round {round}: {head}");
        ensure!(head.contains("retry-after:"), "round {round}: {head}");
    }
    // Nothing of the refused bodies was stored; the tenant that stayed within bounds is whole.
    let fg = kiln.flamegraph("big", CPU, "{}")?;
    ensure!(!fg.names.iter().any(|n| n == "flood"), "{:?}", fg.names);
    ensure!(fg.names.iter().any(|n| n == "fill"));
    kiln.assert_tenant_empty("other")?;
    Ok(())
}

/// Reads from a raw connection until it closes or `within` passes; true when it closed.
fn closes_within(mut conn: &std::net::TcpStream, within: Duration) -> bool {
    use std::io::Read;
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        let _ = conn.set_read_timeout(Some(Duration::from_millis(100)));
        match conn.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
    }
    false
}

/// Clients that connect and send nothing at all are closed after `--header-read-timeout-secs`,
/// long before the idle timeout (hyper's header timeout starts only with a first byte).
#[test]
fn silent_connections_are_closed_after_the_header_timeout() -> Result<()> {
    let kiln = Kiln::start(&[
        "--header-read-timeout-secs",
        "2",
        "--idle-timeout-secs",
        "90",
    ])?;
    let silent: Vec<std::net::TcpStream> = (0..20)
        .map(|_| {
            std::net::TcpStream::connect(("127.0.0.1", kiln.port)).map_err(anyhow::Error::from)
        })
        .collect::<Result<_>>()?;
    let started = std::time::Instant::now();
    let closed = silent
        .iter()
        .filter(|c| closes_within(c, Duration::from_secs(6)))
        .count();
    ensure!(
        closed == 20,
        "{closed} of 20 silent connections were closed"
    );
    ensure!(started.elapsed() < Duration::from_secs(20));
    // A client that then speaks is served.
    ensure!(kiln.is_ready());
    Ok(())
}

/// Slow clients (headers or body dribbling in, or nothing at all) are closed by the timeouts,
/// at most `--max-connections` are open at once, and the server keeps serving everyone else.
#[test]
fn slow_clients_time_out_and_connections_are_capped() -> Result<()> {
    use std::io::{Read, Write};
    let kiln = Kiln::start(&[
        "--header-read-timeout-secs",
        "2",
        "--body-read-timeout-secs",
        "2",
        "--idle-timeout-secs",
        "3",
        "--max-connections",
        "40",
    ])?;
    let addr = ("127.0.0.1", kiln.port);
    let fresh = || {
        reqwest::blocking::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
    };
    // 30 clients send half a request's headers and stall; one stalls in its body.
    let slow: Vec<std::net::TcpStream> = (0..30)
        .map(|_| -> Result<_> {
            let mut c = std::net::TcpStream::connect(addr)?;
            c.write_all(b"POST /ingest?name=slow.cpu HTTP/1.1\r\nHost: 127.0.0.1\r\n")?;
            Ok(c)
        })
        .collect::<Result<_>>()?;
    let mut body_stall = std::net::TcpStream::connect(addr)?;
    body_stall.write_all(
        b"POST /ingest?name=slow.cpu HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Scope-OrgID: a\r\n\
          Content-Length: 1000\r\n\r\nmain;slow",
    )?;
    // Below the cap, everyone else is served meanwhile.
    let r = fresh()?
        .post(kiln.url("/ingest?name=ok.cpu&from=1700000000"))
        .header("X-Scope-OrgID", "a")
        .body("main;ok 1\n")
        .send()?;
    ensure!(r.status().as_u16() == 200, "{}", r.status());
    // Over the cap (30 + 1 open, 40 allowed): the extra connections are closed at once.
    let extra: Vec<std::net::TcpStream> = (0..20)
        .map(|_| std::net::TcpStream::connect(addr).map_err(anyhow::Error::from))
        .collect::<Result<_>>()?;
    let refused = extra
        .iter()
        .filter(|c| closes_within(c, Duration::from_millis(300)))
        .count();
    ensure!(
        refused >= 10,
        "{refused} of 20 connections over the cap were closed"
    );
    drop(extra);
    // The stalled body is answered 408; the stalled headers are closed.
    body_stall.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut answer = vec![0u8; 512];
    let n = body_stall.read(&mut answer)?;
    let answer = String::from_utf8_lossy(&answer[..n]).to_string();
    ensure!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    let closed = slow
        .iter()
        .filter(|c| closes_within(c, Duration::from_secs(5)))
        .count();
    ensure!(closed == 30, "{closed} of 30 slow clients were closed");
    // A kept-alive connection nobody uses is closed too.
    let mut idle = std::net::TcpStream::connect(addr)?;
    idle.write_all(b"GET /ready HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")?;
    ensure!(
        closes_within(&idle, Duration::from_secs(6)),
        "the idle connection stayed open"
    );
    // The server serves on, counted the refusals, and kept the tenants apart.
    let metrics = fresh()?
        .get(kiln.url("/metrics"))
        .header("X-Scope-OrgID", kiln_e2e::OPERATOR)
        .send()?
        .text()?;
    ensure!(
        metrics
            .lines()
            .filter_map(|l| l.strip_prefix("kiln_connections_refused_total "))
            .any(|v| v.trim().parse::<f64>().is_ok_and(|v| v >= 10.0)),
        "{metrics}"
    );
    ensure!(kiln.flamegraph("a", CPU, r#"{service_name="ok"}"#)?.total > 0);
    ensure!(
        !kiln
            .flamegraph("a", CPU, "{}")?
            .names
            .iter()
            .any(|n| n == "slow")
    );
    kiln.assert_tenant_empty("b")?;
    Ok(())
}

/// Sends `tenant` profiles stamped now through `kiln` until one is refused 429 for its rate;
/// how many were stored.
pub(super) fn ingest_until_throttled(kiln: &Kiln, tenant: &str, service: &str) -> Result<usize> {
    let body = format!("main;{} 1\n", "throttled_work_".repeat(40)).into_bytes();
    for stored in 0..200 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs();
        let (s, text) = kiln.ingest(
            tenant,
            &format!("name={service}.cpu&from={now}"),
            body.clone(),
            &[],
        )?;
        match s {
            200 => continue,
            429 => return Ok(stored),
            _ => anyhow::bail!("{tenant}: {s} {text}"),
        }
    }
    anyhow::bail!("{tenant} was never refused for its rate")
}

/// The points of `tenant`'s per-minute CPU series over the last 10 minutes, and the
/// throttling annotations they carry (their parsed values).
pub(super) fn throttled_points(
    kiln: &Kiln,
    tenant: &str,
) -> Result<(usize, Vec<serde_json::Value>)> {
    use kiln_proto::querier::v1 as q;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64;
    let r: q::SelectSeriesResponse = kiln.connect(
        tenant,
        "/querier.v1.QuerierService/SelectSeries",
        &q::SelectSeriesRequest {
            profile_type_id: CPU.into(),
            label_selector: "{}".into(),
            start: now_ms - 600_000,
            end: now_ms + 60_000,
            step: 60.0,
            ..Default::default()
        },
    )?;
    let points: Vec<_> = r.series.iter().flat_map(|s| &s.points).collect();
    let mut annotations = Vec::new();
    for p in &points {
        for a in &p.annotations {
            ensure!(a.key == "pyroscope.ingest.throttled", "{a:?}");
            annotations.push(serde_json::from_str(&a.value)?);
        }
    }
    Ok((points.len(), annotations))
}

/// A tenant refused for its rate has the points of those minutes marked with Pyroscope's
/// throttling annotation (what Grafana draws as "Ingestion limit reached"), giving its rate;
/// a tenant never refused has none.
#[test]
fn throttled_minutes_are_annotated_on_the_series() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(
        &tenants,
        "[tenants.noisy]\ningest_rate_bytes = 2048\ningest_burst_bytes = 4096\n",
    )?;
    let kiln = Kiln::start(&["--tenants", &tenants.display().to_string()])?;
    let stored = ingest_until_throttled(&kiln, "noisy", "noisy")?;
    ensure!(stored > 0, "nothing stored before the refusal");
    let (s, text) = kiln.ingest(
        "quiet",
        "name=quiet.cpu&from=now",
        b"main;quiet 1\n".to_vec(),
        &[],
    )?;
    ensure!(s == 200, "{s} {text}");
    let (points, annotations) = throttled_points(&kiln, "noisy")?;
    ensure!(
        points > 0 && !annotations.is_empty(),
        "{points} points, {annotations:?}"
    );
    let body = &annotations[0]["body"];
    ensure!(body["periodType"] == "second", "{body}");
    ensure!(
        body["periodLimitMb"].as_f64() == Some(2048.0 / 1048576.0),
        "{body}"
    );
    let reset = body["limitResetTime"].as_i64().unwrap_or(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs() as i64;
    ensure!(
        (now..=now + 60).contains(&reset),
        "reset {reset}, now {now}"
    );
    let (points, annotations) = throttled_points(&kiln, "quiet")?;
    ensure!(
        points > 0 && annotations.is_empty(),
        "quiet: {points} {annotations:?}"
    );
    Ok(())
}
