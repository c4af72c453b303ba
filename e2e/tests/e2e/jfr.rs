//! JFR end to end: a Java program recorded by the JDK's own flight recorder, ingested raw and as
//! the Pyroscope Java SDK's multipart upload (gzip, with and without a labels part); the stored
//! CPU samples are the recording's `jdk.ExecutionSample` events, counted by the JDK's `jfr` tool.

use std::io::Write;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use kiln_e2e::Kiln;
use prost::Message;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

/// Busy methods with names no JDK frame has, a worker thread and some allocation.
const PROGRAM: &str = r#"
public class KilnBusy {
    static volatile long sink;

    static long kilnSpinFib(int n) {
        return n < 2 ? n : kilnSpinFib(n - 1) + kilnSpinFib(n - 2);
    }

    static void kilnHashLoop() {
        long h = 0;
        for (int i = 0; i < 5_000_000; i++) {
            h = h * 31 + i;
        }
        sink = h;
    }

    public static void main(String[] args) throws Exception {
        long end = System.currentTimeMillis() + Long.parseLong(args[0]);
        Thread worker = new Thread(() -> {
            while (System.currentTimeMillis() < end) {
                sink += kilnSpinFib(22);
            }
        }, "kiln-worker");
        worker.start();
        while (System.currentTimeMillis() < end) {
            kilnHashLoop();
            byte[] garbage = new byte[1 << 16];
            sink += garbage.length;
        }
        worker.join();
    }
}
"#;

fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Compiles and runs the program for `millis` under the flight recorder (`profile` settings:
/// execution samples every 10 ms), returning the recording.
fn record(dir: &Path, millis: u64) -> Result<std::path::PathBuf> {
    std::fs::write(dir.join("KilnBusy.java"), PROGRAM)?;
    run(Command::new("javac").current_dir(dir).arg("KilnBusy.java"))?;
    let recording = dir.join("busy.jfr");
    run(Command::new("java")
        .current_dir(dir)
        .arg(format!(
            "-XX:StartFlightRecording=filename={},settings=profile",
            recording.display()
        ))
        .args(["KilnBusy", &millis.to_string()]))?;
    Ok(recording)
}

/// The `jdk.ExecutionSample` events of a recording, as the JDK's `jfr` tool prints them.
fn execution_samples(recording: &Path) -> Result<i64> {
    let printed = run(Command::new("jfr")
        .args(["print", "--events", "jdk.ExecutionSample"])
        .arg(recording))?;
    Ok(printed
        .lines()
        .filter(|l| l.trim_start().starts_with("jdk.ExecutionSample {"))
        .count() as i64)
}

fn gzip(data: &[u8]) -> Result<Vec<u8>> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(data)?;
    Ok(enc.finish()?)
}

/// A multipart body as the Java SDK sends it: `jfr`, and `labels` when given, each gzip.
fn multipart(recording: &[u8], labels: Option<&[u8]>) -> Result<(String, Vec<u8>)> {
    let boundary = "kiln-jfr-boundary-7d3";
    let mut body = Vec::new();
    let mut part = |name: &str, data: &[u8]| -> Result<()> {
        write!(
            body,
            "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; \
             filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        )?;
        body.extend_from_slice(&gzip(data)?);
        body.extend_from_slice(b"\r\n");
        Ok(())
    };
    part("jfr", recording)?;
    if let Some(labels) = labels {
        part("labels", labels)?;
    }
    write!(body, "--{boundary}--\r\n")?;
    Ok((format!("multipart/form-data; boundary={boundary}"), body))
}

#[test]
#[cfg_attr(
    not(kiln_jdk),
    ignore = "java, javac or jfr is absent (openjdk-17-jdk-headless)"
)]
fn a_jdk_recording_is_ingested_raw_and_multipart() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let recording = record(dir.path(), 3000)?;
    let samples = execution_samples(&recording)?;
    ensure!(samples > 50, "only {samples} execution samples in 3 s");
    let jfr = std::fs::read(&recording)?;
    let kiln = Kiln::start(&[])?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let query =
        |extra: &str| format!("name=busy.java&format=jfr&spyName=javaspy&from={now}{extra}");

    // Raw: the recording's own period (10 ms in the profile settings).
    let (status, text) = kiln.ingest(
        "jfr-raw",
        &query(""),
        jfr.clone(),
        &[("Content-Type", "application/octet-stream")],
    )?;
    ensure!(status == 200, "raw: {status} {text}");

    // Multipart without labels, at the SDK's sampleRate (50 Hz: 20 ms a sample).
    let (ct, body) = multipart(&jfr, None)?;
    let (status, text) = kiln.ingest(
        "jfr-multipart",
        &query("&sampleRate=50"),
        body,
        &[("Content-Type", ct.as_str())],
    )?;
    ensure!(status == 200, "multipart: {status} {text}");

    // Multipart with labels: the JDK's samples carry no context id, so context 0's labels are
    // theirs.
    let labels = kiln_otel::jfr::LabelsSnapshot {
        contexts: [(
            0,
            kiln_otel::jfr::Context {
                labels: [(1, 2)].into(),
            },
        )]
        .into(),
        strings: [(1, "tier".to_owned()), (2, "gold".to_owned())].into(),
    };
    let (ct, body) = multipart(&jfr, Some(&labels.encode_to_vec()))?;
    let (status, text) = kiln.ingest(
        "jfr-labels",
        &query(""),
        body,
        &[("Content-Type", ct.as_str())],
    )?;
    ensure!(status == 200, "labels: {status} {text}");

    let selector = r#"{service_name="busy.java"}"#;
    for (tenant, period) in [
        ("jfr-raw", 10_000_000),
        ("jfr-multipart", 20_000_000),
        ("jfr-labels", 10_000_000),
    ] {
        let fg = kiln.flamegraph(tenant, CPU, selector)?;
        ensure!(
            fg.total % period == 0 && fg.total / period == samples,
            "{tenant}: {} ns stored is {} samples of {period} ns, the recording has {samples}",
            fg.total,
            fg.total as f64 / period as f64
        );
        for method in [
            "KilnBusy.kilnSpinFib",
            "KilnBusy.kilnHashLoop",
            "java/lang/Thread.run",
        ] {
            ensure!(
                fg.names.iter().any(|n| n == method),
                "{tenant}: {method} missing from {:?}",
                fg.names
            );
        }
        let types = kiln.profile_types(tenant)?;
        ensure!(
            types
                .iter()
                .any(|t| t.id == "memory:alloc_sample_bytes:bytes:space:bytes"),
            "{tenant}: {:?}",
            types.iter().map(|t| &t.id).collect::<Vec<_>>()
        );
    }
    let gold = kiln.flamegraph(
        "jfr-labels",
        CPU,
        r#"{service_name="busy.java",tier="gold"}"#,
    )?;
    ensure!(
        gold.total == samples * 10_000_000,
        "labelled total {}",
        gold.total
    );
    let raw_gold = kiln.flamegraph("jfr-raw", CPU, r#"{tier="gold"}"#)?;
    ensure!(raw_gold.total == 0, "no labels part, no tier label");

    // A damaged recording is refused and stores nothing.
    let (status, text) = kiln.ingest(
        "jfr-bad",
        &query(""),
        jfr[..jfr.len() / 3].to_vec(),
        &[("Content-Type", "application/octet-stream")],
    )?;
    ensure!(status == 400, "truncated: {status} {text}");
    ensure!(text.contains("invalid JFR recording"), "{text}");
    let (status, text) = kiln.ingest(
        "jfr-bad",
        &query(""),
        multipart(&jfr, Some(b"\xff\xff\xff"))?.1,
        &[("Content-Type", multipart(&[], None)?.0.as_str())],
    )?;
    ensure!(
        status == 400 && text.contains("LabelsSnapshot"),
        "bad labels: {status} {text}"
    );
    ensure!(kiln.is_ready());
    kiln.assert_tenant_empty("jfr-bad")?;
    kiln.assert_tenant_empty("jfr-other")?;
    Ok(())
}

/// async-profiler's recording from the corpus with its labels: every sample counted, the
/// snapshot's labels on the series.
#[test]
#[cfg_attr(not(kiln_corpus), ignore = "../shared/corpus is absent")]
fn async_profiler_recording_with_labels() -> Result<()> {
    let dir = kiln_e2e::corpus_dir()
        .context("../shared/corpus is absent")?
        .join("jfr");
    let jfr = std::fs::read(dir.join("dump1.jfr.gz"))?;
    let labels = std::fs::read(dir.join("dump1.labels.pb.gz"))?;
    let kiln = Kiln::start(&[])?;
    let boundary = "corpus-boundary";
    let mut body = Vec::new();
    for (name, data) in [("jfr", &jfr), ("labels", &labels)] {
        write!(
            body,
            "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n"
        )?;
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    }
    write!(body, "--{boundary}--\r\n")?;
    let ct = format!("multipart/form-data; boundary={boundary}");
    let (status, text) = kiln.ingest(
        "jfr-async",
        "name=app.java&format=jfr&sampleRate=100&spyName=javaspy",
        body,
        &[("Content-Type", ct.as_str())],
    )?;
    ensure!(status == 200, "{status} {text}");
    // 2188 execution samples (`jfr summary`), 10 ms each.
    let fg = kiln.flamegraph("jfr-async", CPU, "{}")?;
    ensure!(fg.total == 2188 * 10_000_000, "total {}", fg.total);
    ensure!(fg.names.iter().any(|n| n == "App.fib"), "{:?}", fg.names);
    let series: kiln_proto::querier::v1::SeriesResponse = kiln.connect(
        "jfr-async",
        "/querier.v1.QuerierService/Series",
        &kiln_proto::querier::v1::SeriesRequest {
            matchers: vec!["{}".into()],
            label_names: vec![],
            start: kiln_e2e::ALL_TIME.0,
            end: kiln_e2e::ALL_TIME.1,
        },
    )?;
    let names: std::collections::BTreeSet<&str> = series
        .labels_set
        .iter()
        .flat_map(|l| l.labels.iter().map(|p| p.name.as_str()))
        .collect();
    ensure!(
        series.labels_set.len() > 1,
        "labels split the series: {names:?}"
    );
    ensure!(
        names.contains("thread_name") && names.contains("jfr_event"),
        "the snapshot's thread_name and the recording's event (itimer): {names:?}"
    );
    kiln.assert_tenant_empty("jfr-async-other")?;
    Ok(())
}
