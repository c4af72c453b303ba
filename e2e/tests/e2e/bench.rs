//! `kiln bench --preset tiny --peers`: the whole benchmark runs (a real `kiln serve`, HTTP
//! ingest, compaction, Connect queries, DuckDB and chDB on the same rows from the test venv)
//! and its totals agree across the three; then a few seconds more under load; and the same
//! workload on three processes sharing PostgreSQL and S3. Smoke tests: no timing is asserted.

use anyhow::{Result, ensure};
use kiln_e2e::kiln_bin;

/// Runs `kiln bench --preset tiny --runs 2` with `args` and `env`; its stdout and JSON.
fn run_bench(args: &[&str], env: &[(String, String)]) -> Result<(String, serde_json::Value)> {
    let dir = tempfile::tempdir()?;
    let json = dir.path().join("bench.json");
    let out = std::process::Command::new(kiln_bin())
        .args(["bench", "--preset", "tiny", "--runs", "2"])
        .args(args)
        .arg("--dir")
        .arg(dir.path().join("work"))
        .arg("--json")
        .arg(&json)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    ensure!(
        out.status.success(),
        "kiln bench failed:\n{stdout}\n{stderr}"
    );
    let v = serde_json::from_slice(&std::fs::read(&json)?)?;
    Ok((stdout.into_owned(), v))
}

#[test]
fn bench_tiny_runs_side_by_side_with_peers() -> Result<()> {
    let (stdout, v) = run_bench(&["--peers", "--load-seconds", "3"], &[])?;
    for row in [
        "| flame graph, 1 service, 1 h",
        "| flame graph, 1 service, 30 d",
        "| per-minute series by pod, 12 h",
        "| bytes at rest per sample row",
        "| ack latency p50 / p99",
    ] {
        ensure!(stdout.contains(row), "no {row:?} row in:\n{stdout}");
    }
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
    // Fresh data was looked at (at least once, at the end of ingest) and held rows then.
    let fresh = &kiln["fresh"];
    ensure!(fresh["looks"].as_u64() >= Some(1), "{fresh}");
    ensure!(
        stdout.contains("| all below the top |"),
        "no fresh data table in:\n{stdout}"
    );
    let load = &v["under_load"];
    ensure!(
        load["queries"].as_u64() > Some(0) && load["profiles_per_s"].as_f64() > Some(0.0),
        "{load}"
    );
    ensure!(
        stdout.contains("flame graph of the last 5 minutes"),
        "{stdout}"
    );
    Ok(())
}

/// `--server-arg` reaches the server's command line: a flag the server does not know stops it,
/// and the bench with it; one it knows runs as usual.
#[test]
fn bench_passes_server_args_to_its_server() -> Result<()> {
    let refused = run_bench(&["--server-arg=--no-such-flag"], &[]).unwrap_err();
    let said = refused.to_string();
    ensure!(
        said.contains("kiln serve exited") && said.contains("--no-such-flag"),
        "the server's refusal is not shown: {said}"
    );
    let (_, v) = run_bench(&["--server-arg=--segment-interval-ms=50"], &[])?;
    ensure!(v["kiln"]["profiles"] == 240, "{v}");
    Ok(())
}

#[test]
fn bench_tiny_scaled_out_on_postgres_and_s3() -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let pg = rt.block_on(kiln_storage::testing::postgres_database());
    let (s3_url, env) = super::cluster::s3_env();
    let (stdout, v) = run_bench(
        &[
            "--scaled-out",
            "--metastore",
            &pg,
            "--object-store",
            &s3_url,
        ],
        &env,
    )?;
    ensure!(
        stdout.contains("| a process per role (ingest, query, compact)"),
        "{stdout}"
    );
    let (single, split) = (&v["kiln"], &v["scaled_out"]);
    ensure!(split["rows"] == single["rows"], "{split}");
    ensure!(split["bytes_at_rest"].as_u64() > Some(0), "{split}");
    let totals = |k: &serde_json::Value| -> Vec<serde_json::Value> {
        k["queries"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|q| q["total"].clone())
            .collect()
    };
    ensure!(totals(single) == totals(split), "{single}\n{split}");
    Ok(())
}
