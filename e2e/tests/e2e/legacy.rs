//! Pyroscope's legacy HTTP query API against the real binary, called as Grafana's datasource
//! proxy calls it for the Profiles Drilldown app (basic auth with the tenant as user, or an
//! `X-Scope-OrgID` header): `/pyroscope/render` as flamebearer JSON (totals equal to Kiln's own
//! flame graph, `max-nodes` honoured) and as DOT that Graphviz's `dot` draws, `render-diff`,
//! `labels` and `label-values`; another tenant sees nothing of it through any of them.

use std::io::Write;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, ensure};
use kiln_e2e::Kiln;
use kiln_proto::querier::v1 as q;

use crate::auth::{basic, bearer, hs256_token, make_keys, start_jwt};

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
/// The left and right profiles of the diff, ten minutes apart (Unix seconds).
const LEFT_S: i64 = 1_700_000_000;
const RIGHT_S: i64 = LEFT_S + 600;
/// Nanoseconds per folded sample at the default 100 Hz.
const TICK: i64 = 10_000_000;

/// An answer: status, content type, body, `kiln-query-stats`.
struct Answer {
    status: u16,
    content_type: String,
    body: String,
    stats: Option<String>,
}

fn get(
    kiln: &Kiln,
    path: &str,
    params: &[(&str, &str)],
    auth: &[(String, String)],
) -> Result<Answer> {
    let req = auth.iter().fold(
        kiln.http().get(kiln.url(path)).query(params),
        |r, (k, v)| r.header(k, v),
    );
    let r = req.send()?;
    let header = |name: &str| {
        r.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (status, content_type, stats) = (
        r.status().as_u16(),
        header("content-type").unwrap_or_default(),
        header("kiln-query-stats"),
    );
    Ok(Answer {
        status,
        content_type,
        body: r.text()?,
        stats,
    })
}

fn json(a: &Answer) -> Result<serde_json::Value> {
    ensure!(
        a.status == 200 && a.content_type == "application/json",
        "{} {}: {}",
        a.status,
        a.content_type,
        a.body
    );
    Ok(serde_json::from_str(&a.body)?)
}

fn org(tenant: &str) -> Vec<(String, String)> {
    vec![("X-Scope-OrgID".into(), tenant.into())]
}

/// Kiln's own flame graph total (Connect, as Grafana's datasource asks) for a range in ms.
fn connect_total(kiln: &Kiln, tenant: &str, selector: &str, start: i64, end: i64) -> Result<i64> {
    let r: q::SelectMergeStacktracesResponse = kiln.connect(
        tenant,
        "/querier.v1.QuerierService/SelectMergeStacktraces",
        &q::SelectMergeStacktracesRequest {
            profile_type_id: CPU.into(),
            label_selector: selector.into(),
            start,
            end,
            max_nodes: Some(1 << 20),
            ..Default::default()
        },
    )?;
    Ok(r.flamegraph.context("a flame graph")?.total)
}

/// The flamebearer's tree as the querier's `FlameGraph`, read by the shared decoder.
fn decoded(v: &serde_json::Value) -> Result<(Vec<String>, Vec<kiln_proto::flamegraph::FlameNode>)> {
    let fb = &v["flamebearer"];
    let names: Vec<String> = serde_json::from_value(fb["names"].clone())?;
    let levels: Vec<Vec<i64>> = serde_json::from_value(fb["levels"].clone())?;
    let fg = q::FlameGraph {
        names: names.clone(),
        levels: levels
            .into_iter()
            .map(|values| q::Level { values })
            .collect(),
        total: fb["numTicks"].as_i64().context("numTicks")?,
        max_self: fb["maxSelf"].as_i64().context("maxSelf")?,
    };
    Ok((names, kiln_proto::flamegraph::decode(&fg)?))
}

/// Ingests `shop` (two profiles ten minutes apart, 30 leaf functions of distinct weights, two
/// environments) for `tenant`, and another service for `other`; leaves the harness with
/// `tenant`'s credentials.
fn ingest(
    kiln: &mut Kiln,
    tenant: &str,
    write: &[(String, String)],
    other: &str,
    other_write: &[(String, String)],
) -> Result<()> {
    kiln.set_auth(write.to_vec());
    let mut left = String::from("main;checkout;pay 3\nmain;browse 1\n");
    for i in 1..=30 {
        left.push_str(&format!("main;leaf_{i:02} {i}\n"));
    }
    for (query, body) in [
        (format!("name=shop.cpu%7Benv%3Dprod%7D&from={LEFT_S}"), left),
        (
            format!("name=shop.cpu%7Benv%3Dstaging%7D&from={RIGHT_S}"),
            "main;checkout;pay 1\nmain;search 5\n".to_string(),
        ),
    ] {
        let (s, b) = kiln.ingest(tenant, &query, body.into_bytes(), &[])?;
        ensure!(s == 200, "{s} {b}");
    }
    kiln.set_auth(other_write.to_vec());
    let (s, b) = kiln.ingest(
        other,
        &format!("name=hidden.cpu&from={LEFT_S}"),
        b"main;other_tenant_secret 9\n".to_vec(),
        &[],
    )?;
    ensure!(s == 200, "{s} {b}");
    // The harness's own Connect calls (`connect_total`) are the first tenant's.
    kiln.set_auth(write.to_vec());
    Ok(())
}

/// The whole API with basic auth (user = tenant, password = token), as the Drilldown app's
/// requests reach Kiln through Grafana's datasource proxy.
#[test]
fn legacy_api_with_basic_auth() -> Result<()> {
    let keys = make_keys()?;
    let mut kiln = start_jwt(&keys)?;
    let token_a = hs256_token(&keys, "leg-a", &["read", "write"])?;
    let token_b = hs256_token(&keys, "leg-b", &["read", "write"])?;
    ingest(
        &mut kiln,
        "leg-a",
        &bearer(&token_a),
        "leg-b",
        &bearer(&token_b),
    )?;
    let a = basic("leg-a", &token_a);
    let b = basic("leg-b", &token_b);

    let from_ms = (LEFT_S - 60) * 1_000;
    let until_ms = (RIGHT_S + 60) * 1_000;
    let (from, until) = (from_ms.to_string(), until_ms.to_string());
    let shop = format!("{CPU}{{service_name=\"shop\"}}");
    let total = connect_total(&kiln, "leg-a", "{service_name=\"shop\"}", from_ms, until_ms)?;
    ensure!(total == (3 + 1 + 465 + 1 + 5) * TICK, "{total}");

    // render, JSON: Kiln's total, every function, a timeline over the range.
    let r = get(
        &kiln,
        "/pyroscope/render",
        &[
            ("query", &shop),
            ("from", &from),
            ("until", &until),
            ("format", "json"),
        ],
        &a,
    )?;
    ensure!(r.stats.is_some(), "kiln-query-stats on a legacy answer");
    let v = json(&r)?;
    ensure!(
        v["version"] == 1 && v["flamebearer"]["numTicks"] == total,
        "{v}"
    );
    ensure!(
        v["metadata"]
            == serde_json::json!({"format": "single", "spyName": "", "sampleRate": 1_000_000_000u32, "units": "samples", "name": "cpu"}),
        "{}",
        v["metadata"]
    );
    let (names, nodes) = decoded(&v)?;
    for f in [
        "total", "main", "checkout", "pay", "browse", "search", "leaf_01", "leaf_30",
    ] {
        ensure!(names.iter().any(|n| n == f), "{f} missing from {names:?}");
    }
    ensure!(nodes[0].total == total && nodes.len() == names.len());
    let timeline = &v["timeline"];
    let samples: Vec<i64> = serde_json::from_value(timeline["samples"].clone())?;
    ensure!(
        timeline["durationDelta"] == 15 && samples.iter().sum::<i64>() == total,
        "{timeline}"
    );
    ensure!(
        samples.len() == ((until_ms / 15_000) - (from_ms / 15_000)) as usize,
        "{}",
        samples.len()
    );

    // `max-nodes`: five nodes drawn, the rest folded into `other`, the total kept.
    let r = get(
        &kiln,
        "/pyroscope/render",
        &[
            ("query", &shop),
            ("from", &from),
            ("until", &until),
            ("max-nodes", "5"),
        ],
        &a,
    )?;
    let v = json(&r)?;
    let (names, nodes) = decoded(&v)?;
    let drawn = nodes
        .iter()
        .filter(|n| n.level > 0 && names[n.name] != "other")
        .count();
    ensure!(
        drawn <= 5 && names.iter().any(|n| n == "other"),
        "{drawn} {names:?}"
    );
    ensure!(
        v["flamebearer"]["numTicks"] == total && nodes[0].total == total,
        "{v}"
    );
    ensure!(!names.iter().any(|n| n == "leaf_01"), "{names:?}");

    // The same query the first HTTP API's way: `name=<app>.<type>`, times in seconds.
    let r = get(
        &kiln,
        "/pyroscope/render",
        &[
            ("name", "shop.cpu{}"),
            ("from", &(LEFT_S - 60).to_string()),
            ("until", &(RIGHT_S + 60).to_string()),
        ],
        &a,
    )?;
    ensure!(json(&r)?["flamebearer"]["numTicks"] == total);

    // render, DOT: Graphviz draws it, naming the functions; at most `max-nodes` nodes.
    let r = get(
        &kiln,
        "/pyroscope/render",
        &[
            ("query", &shop),
            ("from", &from),
            ("until", &until),
            ("format", "dot"),
            ("max-nodes", "6"),
        ],
        &a,
    )?;
    ensure!(
        r.status == 200 && r.content_type.starts_with("text/plain"),
        "{} {}",
        r.status,
        r.body
    );
    ensure!(r.body.starts_with("digraph \"unnamed\" {"), "{}", r.body);
    let node_lines = r
        .body
        .lines()
        .filter(|l| l.starts_with('N') && !l.contains(" -> "))
        .count();
    ensure!(node_lines == 6, "{node_lines} nodes:\n{}", r.body);
    ensure!(
        r.body.contains("Showing top 6 nodes out of 35"),
        "{}",
        r.body
    );
    let svg = graphviz_svg(&r.body)?;
    for f in ["main", "leaf_30", "leaf_29"] {
        ensure!(
            svg.contains(&format!(">{f}<")),
            "{f} is not in the SVG:\n{svg}"
        );
    }
    // Every node, with the default of 100.
    let r = get(
        &kiln,
        "/pyroscope/render",
        &[
            ("query", &shop),
            ("from", &from),
            ("until", &until),
            ("format", "dot"),
        ],
        &a,
    )?;
    let svg = graphviz_svg(&r.body)?;
    for f in [
        "main", "checkout", "pay", "browse", "search", "leaf_01", "leaf_30",
    ] {
        ensure!(svg.contains(&format!(">{f}<")), "{f} is not in the SVG");
    }

    // render-diff, times in ms as the app sends them: each side's ticks are its total.
    let (left_from, left_until) = ((LEFT_S - 1) * 1_000, (LEFT_S + 1) * 1_000);
    let (right_from, right_until) = ((RIGHT_S - 1) * 1_000, (RIGHT_S + 1) * 1_000);
    let left_total = connect_total(
        &kiln,
        "leg-a",
        "{service_name=\"shop\"}",
        left_from,
        left_until,
    )?;
    let right_total = connect_total(
        &kiln,
        "leg-a",
        "{service_name=\"shop\"}",
        right_from,
        right_until,
    )?;
    ensure!(left_total == 469 * TICK && right_total == 6 * TICK);
    let diff_params = |query: &str| {
        [
            ("leftQuery", query.to_owned()),
            ("leftFrom", left_from.to_string()),
            ("leftUntil", left_until.to_string()),
            ("rightQuery", query.to_owned()),
            ("rightFrom", right_from.to_string()),
            ("rightUntil", right_until.to_string()),
            ("max-nodes", "16384".to_owned()),
        ]
    };
    let params = diff_params(&shop);
    let params: Vec<(&str, &str)> = params.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let v = json(&get(&kiln, "/pyroscope/render-diff", &params, &a)?)?;
    ensure!(
        v["metadata"]["format"] == "double"
            && v["leftTicks"] == left_total
            && v["rightTicks"] == right_total
            && v["flamebearer"]["numTicks"] == left_total + right_total,
        "{}",
        serde_json::json!({"metadata": v["metadata"], "leftTicks": v["leftTicks"], "rightTicks": v["rightTicks"]})
    );
    let levels: Vec<Vec<i64>> = serde_json::from_value(v["flamebearer"]["levels"].clone())?;
    ensure!(
        levels[0] == [0, left_total, 0, 0, right_total, 0, 0],
        "{:?}",
        levels[0]
    );
    ensure!(levels.iter().all(|l| l.len() % 7 == 0));
    let names: Vec<String> = serde_json::from_value(v["flamebearer"]["names"].clone())?;
    ensure!(names.contains(&"search".to_string()) && names.contains(&"leaf_17".to_string()));

    // labels and label-values: what was ingested.
    let range = [("from", from.as_str()), ("until", until.as_str())];
    let with = |extra: &[(&'static str, &'static str)]| -> Vec<(&str, &str)> {
        extra.iter().copied().chain(range.iter().copied()).collect()
    };
    let names = json(&get(
        &kiln,
        "/pyroscope/labels",
        &with(&[("query", "{service_name=\"shop\"}")]),
        &a,
    )?)?;
    for n in ["env", "service_name", "__name__"] {
        ensure!(
            names.as_array().is_some_and(|a| a.iter().any(|x| x == n)),
            "{n}: {names}"
        );
    }
    let envs = json(&get(
        &kiln,
        "/pyroscope/label-values",
        &with(&[("label", "env"), ("query", "{service_name=\"shop\"}")]),
        &a,
    )?)?;
    ensure!(envs == serde_json::json!(["prod", "staging"]), "{envs}");
    let types = json(&get(
        &kiln,
        "/pyroscope/label-values",
        &[("label", "__name__")],
        &a,
    )?)?;
    ensure!(types == serde_json::json!([CPU]), "{types}");
    let services = json(&get(
        &kiln,
        "/pyroscope/label-values",
        &[
            ("label", "service_name"),
            ("query", &format!("{CPU}{{env=\"staging\"}}")),
        ],
        &a,
    )?)?;
    ensure!(services == serde_json::json!(["shop"]), "{services}");

    // The other tenant, with its own credentials, sees nothing of it anywhere.
    let v = json(&get(
        &kiln,
        "/pyroscope/render",
        &[("query", &shop), ("from", &from), ("until", &until)],
        &b,
    )?)?;
    ensure!(
        v["flamebearer"]["numTicks"] == 0
            && v["flamebearer"]["names"] == serde_json::json!(["total"]),
        "{v}"
    );
    let r = get(
        &kiln,
        "/pyroscope/render",
        &[
            ("query", &shop),
            ("from", &from),
            ("until", &until),
            ("format", "dot"),
        ],
        &b,
    )?;
    ensure!(
        r.status == 200 && r.body.is_empty(),
        "{} {}",
        r.status,
        r.body
    );
    let v = json(&get(&kiln, "/pyroscope/render-diff", &params, &b)?)?;
    ensure!(
        v["flamebearer"]["numTicks"] == 0
            && v.get("leftTicks").is_none()
            && v.get("rightTicks").is_none(),
        "{v}"
    );
    let envs = json(&get(
        &kiln,
        "/pyroscope/label-values",
        &[("label", "env")],
        &b,
    )?)?;
    ensure!(envs == serde_json::json!([]), "{envs}");
    let services = json(&get(
        &kiln,
        "/pyroscope/label-values",
        &[("label", "service_name")],
        &b,
    )?)?;
    ensure!(services == serde_json::json!(["hidden"]), "{services}");
    let names = json(&get(
        &kiln,
        "/pyroscope/labels",
        &[("query", "{service_name=\"shop\"}")],
        &b,
    )?)?;
    ensure!(names == serde_json::json!([]), "{names}");
    // And tenant a sees nothing of b's.
    let all = json(&get(
        &kiln,
        "/pyroscope/render",
        &[("query", CPU), ("from", &from), ("until", &until)],
        &a,
    )?)?;
    ensure!(
        all["flamebearer"]["numTicks"] == total,
        "{}",
        all["flamebearer"]["numTicks"]
    );
    ensure!(!all.to_string().contains("other_tenant_secret"));

    // Credentials are checked as for every read API: a user that is not the token's tenant, or
    // no credentials, are refused.
    let r = get(
        &kiln,
        "/pyroscope/render",
        &[("query", &shop)],
        &basic("leg-b", &token_a),
    )?;
    ensure!(
        r.status == 401 || r.status == 403,
        "{} {}",
        r.status,
        r.body
    );
    let r = get(&kiln, "/pyroscope/labels", &[], &[])?;
    ensure!(r.status == 401, "{} {}", r.status, r.body);
    Ok(())
}

/// Through a datasource configured with an `X-Scope-OrgID` header (trusted-header mode).
#[test]
fn legacy_render_with_x_scope_orgid() -> Result<()> {
    let mut kiln = Kiln::start(&[])?;
    ingest(&mut kiln, "org-a", &org("org-a"), "org-b", &org("org-b"))?;
    let (from, until) = ("20231114", "now");
    let shop = format!("{CPU}{{service_name=\"shop\"}}");
    let total = connect_total(
        &kiln,
        "org-a",
        "{service_name=\"shop\"}",
        1_699_920_000_000,
        0,
    )?;
    let v = json(&get(
        &kiln,
        "/pyroscope/render",
        &[("query", &shop), ("from", from), ("until", until)],
        &org("org-a"),
    )?)?;
    ensure!(
        total > 0 && v["flamebearer"]["numTicks"] == total,
        "{total} {}",
        v["flamebearer"]
    );
    let v = json(&get(
        &kiln,
        "/pyroscope/render",
        &[("query", &shop), ("from", from), ("until", until)],
        &org("org-b"),
    )?)?;
    ensure!(v["flamebearer"]["numTicks"] == 0, "{v}");
    let names = json(&get(&kiln, "/pyroscope/labels", &[], &org("org-b"))?)?;
    ensure!(!names.to_string().contains("env"), "{names}");
    let r = get(&kiln, "/pyroscope/render", &[("query", &shop)], &[])?;
    ensure!(r.status == 401, "{} {}", r.status, r.body);

    // The same call graph from SelectMergeStacktraces' PROFILE_FORMAT_DOT, read by Graphviz.
    let text = connect_dot(&kiln, "org-a")?;
    let svg = graphviz_svg(&text)?;
    ensure!(
        svg.contains("<svg") && svg.contains("leaf_30") && svg.contains("Duration: "),
        "{svg}"
    );
    kiln.set_auth(org("org-b"));
    let other = connect_dot(&kiln, "org-b")?;
    ensure!(other.is_empty(), "another tenant's graph is empty: {other}");
    Ok(())
}

/// `SelectMergeStacktraces` with `PROFILE_FORMAT_DOT` for the shop's CPU, at most 8 nodes.
fn connect_dot(kiln: &Kiln, tenant: &str) -> Result<String> {
    let r: kiln_proto::querier::v1::SelectMergeStacktracesResponse = kiln.connect(
        tenant,
        "/querier.v1.QuerierService/SelectMergeStacktraces",
        &kiln_proto::querier::v1::SelectMergeStacktracesRequest {
            profile_type_id: CPU.into(),
            label_selector: "{service_name=\"shop\"}".into(),
            start: 1_699_920_000_000,
            end: 0,
            max_nodes: Some(8),
            format: kiln_proto::querier::v1::ProfileFormat::Dot as i32,
            ..Default::default()
        },
    )?;
    Ok(r.dot)
}

/// Graphviz's SVG of a DOT text (`dot -Tsvg`), failing if `dot` refuses it.
fn graphviz_svg(text: &str) -> Result<String> {
    let mut child = Command::new("dot")
        .arg("-Tsvg")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running Graphviz's dot: run scripts/install-test-deps.sh")?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(text.as_bytes())?;
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "dot -Tsvg: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}
