//! `kiln bench --preset tiny --peers`: the whole benchmark runs (a real `kiln serve`, HTTP
//! ingest, compaction, Connect queries, DuckDB and chDB on the same rows from the test venv)
//! and its totals agree across the three. A smoke test: no timing is asserted.

use anyhow::{Result, ensure};
use kiln_e2e::kiln_bin;

#[test]
fn bench_tiny_runs_side_by_side_with_peers() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let json = dir.path().join("bench.json");
    let out = std::process::Command::new(kiln_bin())
        .args([
            "bench", "--preset", "tiny", "--peers", "--runs", "2", "--dir",
        ])
        .arg(dir.path().join("work"))
        .arg("--json")
        .arg(&json)
        .output()?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    ensure!(
        out.status.success(),
        "kiln bench failed:\n{stdout}\n{stderr}"
    );
    for row in [
        "| flame graph, 1 service, 1 h",
        "| flame graph, 1 service, 30 d",
        "| per-minute series by pod, 12 h",
        "| bytes at rest per sample row",
        "| ack latency p50 / p99",
    ] {
        ensure!(stdout.contains(row), "no {row:?} row in:\n{stdout}");
    }
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json)?)?;
    let kiln = &v["kiln"];
    let rows = kiln["rows"].as_u64().unwrap_or(0);
    ensure!(rows > 0 && kiln["profiles"] == 240, "{kiln}");
    let queries = kiln["queries"].as_array().cloned().unwrap_or_default();
    ensure!(queries.len() == 6, "{kiln}");
    let flames: Vec<_> = queries.iter().filter(|q| q["kind"] == "flame").collect();
    ensure!(flames.len() == 4, "{kiln}");
    for q in &flames {
        let (got, sent) = (&q["total"][0], &q["total"][1]);
        ensure!(got == sent && sent.as_i64() > Some(0), "{q}");
    }
    for peer in ["duckdb", "chdb"] {
        let p = &v["peers"][peer];
        ensure!(p["rows"].as_u64() == Some(rows), "{peer}: {p}");
        for q in &flames {
            let key = format!("{}_total", q["key"].as_str().unwrap_or_default());
            ensure!(p[&key] == q["total"][1], "{peer} {key}: {p}");
        }
        ensure!(p["bytes_per_row"].as_f64() > Some(0.0), "{peer}: {p}");
    }
    Ok(())
}
