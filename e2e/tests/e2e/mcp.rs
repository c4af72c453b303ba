//! `/mcp` with the official MCP Python SDK (`mcp` on PyPI) as the client, against the real
//! binary: the tools are listed with their bounds, each is called on a tenant's data, and the
//! figures equal the querier's; another tenant sees none of it; a read over two tenants sums.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, ensure};
use kiln_e2e::{Kiln, Tools};
use kiln_proto::querier::v1 as q;
use kiln_proto::types::v1 as t;
use serde_json::{Value, json};

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
/// Nanoseconds per folded sample at the default 100 Hz.
const TICK: i64 = 10_000_000;

/// Runs the Python client with `headers` and `calls`; its JSON answer and exit status.
fn client(kiln: &Kiln, headers: Value, calls: Value) -> Result<(Value, bool)> {
    let tools = Tools::find()?;
    let script = kiln_e2e::repo_root().join("e2e/clients/python/mcp_client.py");
    let mut child = Command::new(&tools.python)
        .arg(&script)
        .arg(kiln.url("/mcp"))
        .arg(headers.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(calls.to_string().as_bytes())?;
    let out = child.wait_with_output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(text.trim()).with_context(|| {
        format!(
            "client printed {text:?}; stderr {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    Ok((v, out.status.success()))
}

fn org(tenants: &str) -> Value {
    json!({ "X-Scope-OrgID": tenants })
}

/// The text of the call named `name`, checked not to be an error.
fn text(answer: &Value, i: usize) -> Result<&str> {
    let call = &answer["calls"][i];
    ensure!(call["is_error"] == false, "call {i}: {call}");
    call["text"].as_str().context("text")
}

/// Rows of a tab-separated table after its header line starting with `header`.
fn rows<'a>(text: &'a str, header: &str) -> Vec<Vec<&'a str>> {
    text.lines()
        .skip_while(|l| !l.starts_with(header))
        .skip(1)
        .filter(|l| !l.is_empty())
        .map(|l| l.split('\t').collect())
        .collect()
}

fn ingest(kiln: &Kiln, tenant: &str, name: &str, ago_s: u64, folded: &str) -> Result<()> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let (status, body) = kiln.ingest(
        tenant,
        &format!(
            "name={name}&from={}&until={}",
            now - ago_s,
            now - ago_s + 10
        ),
        folded.as_bytes().to_vec(),
        &[],
    )?;
    ensure!(status == 200, "{status} {body}");
    Ok(())
}

#[test]
fn the_python_sdk_calls_every_tool_and_reads_what_the_querier_answers() -> Result<()> {
    let kiln = Kiln::start(&[])?;
    // An hour ago the baseline; ten minutes ago the comparison, where `hot` grew.
    ingest(
        &kiln,
        "m-a",
        "api.cpu",
        3600,
        "main;work;hot 5\nmain;idle 20\n",
    )?;
    ingest(
        &kiln,
        "m-a",
        "api.cpu",
        600,
        "main;work;hot 30\nmain;work 10\nmain;idle 5\n",
    )?;
    ingest(&kiln, "m-a", "batch.cpu", 600, "main;run 15\n")?;
    ingest(&kiln, "m-b", "vault.cpu", 600, "main;b_secret 9\n")?;

    let range = json!({ "profile_type": CPU, "from": "now-2h", "until": "now" });
    let with = |extra: Value| {
        let mut a = range.clone();
        a.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        a
    };
    let calls = json!([
        { "name": "list_profile_types", "arguments": { "from": "now-2h" } },
        { "name": "list_services", "arguments": { "from": "now-2h", "profile_type": CPU } },
        { "name": "top_functions", "arguments": with(json!({ "limit": 10 })) },
        { "name": "flame_graph", "arguments": with(json!({ "selector": "{service_name=\"api\"}" })) },
        { "name": "diff_functions", "arguments": {
            "profile_type": CPU, "selector": "{service_name=\"api\"}",
            "baseline_from": "now-2h", "baseline_until": "now-30m",
            "comparison_from": "now-30m", "comparison_until": "now" } },
        { "name": "series", "arguments": with(json!({ "group_by": ["service_name"], "step_seconds": 3600 })) },
        { "name": "top_functions", "arguments": with(json!({ "limit": 100000 })) },
        { "name": "no_such_tool", "arguments": {} },
        { "name": "flame_graph", "arguments": with(json!({ "max_lines": 2, "min_percent": 0 })) },
    ]);
    let (answer, ok) = client(&kiln, org("m-a"), calls.clone())?;
    ensure!(ok, "{answer}");
    ensure!(answer["server"] == "kiln", "{answer}");
    let names: Vec<&str> = answer["tools"]
        .as_array()
        .context("tools")?
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    ensure!(
        names
            == [
                "list_profile_types",
                "list_services",
                "top_functions",
                "flame_graph",
                "diff_functions",
                "series"
            ],
        "{names:?}"
    );
    // Each description states the bound of its answer.
    for tool in answer["tools"].as_array().unwrap() {
        let d = tool["description"].as_str().unwrap_or_default();
        ensure!(d.contains("at most"), "{}: {d}", tool["name"]);
    }

    ensure!(text(&answer, 0)?.lines().any(|l| l == CPU));
    ensure!(text(&answer, 1)?.lines().collect::<Vec<_>>() == ["api", "batch"]);

    // top_functions: exactly the querier's function table.
    let table: q::SelectMergeStacktracesResponse = kiln.connect(
        "m-a",
        "/querier.v1.QuerierService/SelectMergeStacktraces",
        &q::SelectMergeStacktracesRequest {
            profile_type_id: CPU.into(),
            label_selector: "{}".into(),
            start: kiln_e2e::ALL_TIME.0,
            end: kiln_e2e::ALL_TIME.1,
            format: q::ProfileFormat::Functions as i32,
            format_options: Some(q::ProfileFormatOptions {
                functions: Some(t::FunctionTableOptions { limit: 10 }),
                ..Default::default()
            }),
            ..Default::default()
        },
    )?;
    let table = table.functions.context("functions")?;
    let top = text(&answer, 2)?;
    ensure!(
        top.starts_with(&format!("total\t{}\tnanoseconds\n", table.total)),
        "{top}"
    );
    ensure!(table.total == 85 * TICK, "querier total {}", table.total);
    let got: Vec<(i64, i64, String)> = rows(top, "self\t")
        .iter()
        .map(|r| {
            (
                r[0].parse().unwrap(),
                r[2].parse().unwrap(),
                r[4].to_owned(),
            )
        })
        .collect();
    let want: Vec<(i64, i64, String)> = table
        .functions
        .iter()
        .map(|f| (f.self_, f.total, f.name.clone()))
        .collect();
    ensure!(got == want, "{got:?}\nvs the querier's {want:?}");

    // flame_graph: the call tree of api, shares of its total.
    let flame = text(&answer, 3)?;
    ensure!(
        flame.starts_with(&format!("total\t{}\t", 70 * TICK)),
        "{flame}"
    );
    let lines: Vec<Vec<&str>> = rows(flame, "total%");
    let line = |name: &str| {
        lines
            .iter()
            .find(|r| r[2].trim() == name)
            .map(|r| (r[0], r[1], r[2].len() - r[2].trim_start().len()))
    };
    ensure!(line("main") == Some(("100.00%", "0.00%", 0)), "{flame}");
    ensure!(line("work") == Some(("64.29%", "14.29%", 2)), "{flame}");
    ensure!(line("hot") == Some(("50.00%", "50.00%", 4)), "{flame}");
    ensure!(
        !flame.contains("run"),
        "batch's frames in api's flame graph"
    );

    // diff_functions, largest change first: idle fell from 80 % (20 of 25 samples) to 11.11 %
    // (5 of 45); hot grew from 20 % to 66.67 %.
    let diff = text(&answer, 4)?;
    let changes = rows(diff, "baseline self");
    let tick = |n: i64| (n * TICK).to_string();
    ensure!(
        changes[0]
            == [
                tick(20),
                "80.00%".into(),
                tick(5),
                "11.11%".into(),
                "-68.89".into(),
                "idle".into()
            ],
        "{diff}"
    );
    ensure!(
        changes[1]
            == [
                tick(5),
                "20.00%".into(),
                tick(30),
                "66.67%".into(),
                "+46.67".into(),
                "hot".into()
            ],
        "{diff}"
    );

    // series: one per service, summing to the table's total.
    let series = text(&answer, 5)?;
    let sums: BTreeMap<&str, f64> = series
        .lines()
        .filter(|l| l.starts_with("series\t"))
        .map(|l| {
            let parts: Vec<&str> = l.split('\t').collect();
            (parts[1], parts[3].parse().unwrap())
        })
        .collect();
    ensure!(
        sums == BTreeMap::from([
            ("{service_name=\"api\"}", (70 * TICK) as f64),
            ("{service_name=\"batch\"}", (15 * TICK) as f64)
        ]),
        "{series}"
    );

    // A flame graph cut to its lines says so.
    let short = text(&answer, 8)?;
    let shown = rows(short, "total%");
    ensure!(
        shown.len() == 3 && shown[2][0].starts_with("(cut at 2 lines"),
        "{short}"
    );

    // Refusals are tool errors the model reads.
    for (i, says) in [(6, "limit must be from 1 to 200"), (7, "no tool")] {
        let call = &answer["calls"][i];
        ensure!(call["is_error"] == true, "{call}");
        ensure!(call["text"].as_str().unwrap_or("").contains(says), "{call}");
    }

    // Another tenant: its own data only.
    let (other, ok) = client(
        &kiln,
        org("m-b"),
        json!([{ "name": "top_functions", "arguments": range }]),
    )?;
    ensure!(ok, "{other}");
    let top_b = text(&other, 0)?;
    ensure!(
        top_b.contains("b_secret") && !top_b.contains("hot"),
        "{top_b}"
    );
    // Both, as one read.
    let (both, ok) = client(
        &kiln,
        org("m-a|m-b"),
        json!([{ "name": "top_functions", "arguments": range }]),
    )?;
    ensure!(ok, "{both}");
    ensure!(
        text(&both, 0)?.starts_with(&format!("total\t{}\t", 94 * TICK)),
        "{both}"
    );
    // No tenant: refused before any tool runs.
    let (refused, ok) = client(&kiln, json!({}), json!([]))?;
    ensure!(!ok && refused["error"].as_str().is_some(), "{refused}");
    Ok(())
}
