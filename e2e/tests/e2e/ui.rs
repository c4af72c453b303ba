//! The built-in UI (ADR 0016) in a real headless Chromium (Debian's, driven by playwright-core
//! from `e2e/clients/browser`, both installed by `scripts/install-test-deps.sh`): the page draws
//! the flame graph Kiln's API answers for the same query — every frame with its name and total —
//! and the exact function table beside it; a search highlights the matching frames and states
//! their share; a click zooms; in JWT mode it asks for a token and shows only that token's tenant;
//! a query over the limits, a selector that matches nothing and a stopped Kiln each get a state
//! that says what to do. Screenshots of each page are kept as test artifacts and checked not blank.

use std::process::Command;

use anyhow::{Context, Result, ensure};
use kiln_e2e::{ALL_TIME, Kiln, Tools, token};
use kiln_proto::querier::v1 as q;
use prost::Message;
use serde_json::Value;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

fn chromium() -> Result<&'static str> {
    let path = "/usr/bin/chromium";
    ensure!(
        std::path::Path::new(path).exists(),
        "{path} is missing: run scripts/install-test-deps.sh"
    );
    Ok(path)
}

/// What `e2e/clients/browser/ui-check.mjs` saw of the page at `url`.
fn drive(url: &str, name: &str, extra: &[&str]) -> Result<Value> {
    drive_pausing(url, name, extra, || Ok(()))
}

/// As `drive`; with `--pause-then-refresh` in `extra`, `paused` runs once the first view is read
/// and before the page's Refresh is pressed.
fn drive_pausing(
    url: &str,
    name: &str,
    extra: &[&str],
    mut paused: impl FnMut() -> Result<()>,
) -> Result<Value> {
    use std::io::{BufRead, Read, Write};
    use std::process::Stdio;

    let tools = Tools::find()?;
    let dir = kiln_e2e::repo_root().join("e2e/clients/browser");
    ensure!(
        dir.join("node_modules/playwright-core").exists(),
        "playwright-core is missing: run scripts/install-test-deps.sh"
    );
    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ui-{name}"));
    std::fs::create_dir_all(&shots)?;
    let mut child = Command::new(&tools.node)
        .current_dir(&dir)
        .arg("ui-check.mjs")
        .arg(url)
        .arg(&shots)
        .args(extra)
        .env("KILN_TEST_CHROMIUM", chromium()?)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running node")?;
    let mut stderr = child.stderr.take().context("stderr")?;
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let mut stdin = child.stdin.take().context("stdin")?;
    let mut last = String::new();
    for line in std::io::BufReader::new(child.stdout.take().context("stdout")?).lines() {
        let line = line?;
        if line == "paused" {
            paused()?;
            stdin.write_all(b"go\n")?;
            stdin.flush()?;
        } else if !line.trim().is_empty() {
            last = line;
        }
    }
    drop(stdin);
    let status = child.wait()?;
    let errors = errors.join().unwrap_or_default();
    ensure!(status.success(), "ui-check: {last}{errors}");
    let v: Value = serde_json::from_str(&last)?;
    // Every screenshot is of a drawn page: fuller than a blank one of the same size.
    let blank = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui-blank.png");
    if !blank.exists() {
        let out = Command::new(chromium()?)
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--window-size=1400,900",
            ])
            .arg(format!("--screenshot={}", blank.display()))
            .arg("about:blank")
            .output()?;
        ensure!(
            out.status.success(),
            "chromium: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let empty = std::fs::metadata(&blank)?.len();
    for shot in v["screenshots"].as_array().into_iter().flatten() {
        let path = shot.as_str().context("a screenshot path")?;
        let size = std::fs::metadata(path)?.len();
        ensure!(
            size > 2 * empty,
            "{path} ({size} B) is no fuller than a blank page ({empty} B)"
        );
    }
    Ok(v)
}

fn frames(v: &Value) -> Vec<(String, i64)> {
    let mut f: Vec<(String, i64)> = v
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p[0].as_str()?.to_owned(), p[1].as_i64()?)))
        .collect();
    f.sort();
    f
}

/// The API's flame graph as (name, total) per node.
fn api_frames(kiln: &Kiln, tenant: &str, selector: &str) -> Result<(Vec<(String, i64)>, i64)> {
    let fg = kiln.flamegraph(tenant, CPU, selector)?;
    let nodes = kiln_proto::flamegraph::decode(&fg)?;
    let mut want: Vec<(String, i64)> = nodes
        .iter()
        .map(|n| (fg.names[n.name].clone(), n.total))
        .collect();
    want.sort();
    Ok((want, fg.total))
}

/// A selector as a URL query value.
fn encode(sel: &str) -> String {
    sel.replace('{', "%7B")
        .replace('}', "%7D")
        .replace('"', "%22")
        .replace('=', "%3D")
        .replace(',', "%2C")
}

fn now_secs() -> Result<i64> {
    Ok(std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs() as i64)
}

const SHOP: &[u8] = b"main;checkout;pay 30\nmain;checkout;render 20\nmain;browse 10\ngc 5\n";

#[test]
fn the_page_draws_searches_and_zooms_what_the_api_answers() -> Result<()> {
    let kiln = Kiln::start_with(&["--auth", "none"])?;
    let now = now_secs()?;
    for (i, pod) in ["a", "b", "a", "b"].iter().enumerate() {
        let (status, body) = kiln.ingest(
            "anonymous",
            &format!(
                "name=shop.cpu%7Bpod%3D{pod}%7D&from={}&format=folded",
                now - 600 + 60 * i as i64
            ),
            SHOP.to_vec(),
            &[],
        )?;
        ensure!(status == 200, "{body}");
    }
    let (status, _) = kiln.ingest(
        "anonymous",
        &format!("name=other.cpu&from={now}&format=folded"),
        b"elsewhere 99\n".to_vec(),
        &[],
    )?;
    ensure!(status == 200);

    let url = kiln.url(&format!(
        "/?query={CPU}%7Bservice_name%3D%22shop%22%7D&from=now-1h&until=now"
    ));
    let pprof = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui-download.pb");
    let _ = std::fs::remove_file(&pprof);
    let seen = drive(
        &url,
        "none",
        &[
            "--search",
            "checkout",
            "--zoom",
            "checkout",
            "--download",
            &pprof.to_string_lossy(),
        ],
    )?;
    ensure!(seen["tokenAsked"] == false, "{seen}");
    // A bounded page: the document, its script and style, and the API calls of one view.
    let requests = seen["requests"].as_u64().unwrap_or(u64::MAX);
    ensure!(requests <= 12, "the first view took {requests} requests");

    // The frames drawn are the API's, name for name and total for total.
    let (want, total) = api_frames(&kiln, "anonymous", "{service_name=\"shop\"}")?;
    let drawn = frames(&seen["frames"]);
    ensure!(
        !want.is_empty() && drawn == want,
        "drawn {drawn:?}\nAPI {want:?}"
    );
    ensure!(
        !drawn.iter().any(|(n, _)| n == "elsewhere"),
        "another service's frames drawn"
    );

    // The function table beside it: every function of the exact table.
    let table: q::SelectMergeStacktracesResponse = kiln.connect(
        "anonymous",
        "/querier.v1.QuerierService/SelectMergeStacktraces",
        &q::SelectMergeStacktracesRequest {
            profile_type_id: CPU.into(),
            label_selector: "{service_name=\"shop\"}".into(),
            start: ALL_TIME.0,
            end: ALL_TIME.1,
            format: q::ProfileFormat::Functions as i32,
            ..Default::default()
        },
    )?;
    let mut rows: Vec<String> = seen["table"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n.as_str().map(str::to_owned))
        .collect();
    let mut want_rows: Vec<String> = table
        .functions
        .context("a function table")?
        .functions
        .iter()
        .map(|f| f.name.clone())
        .collect();
    rows.sort();
    want_rows.sort();
    ensure!(rows == want_rows, "table {rows:?}, API {want_rows:?}");

    // The download is the shown profile as pprof: the same total, read as Go's pprof reads it.
    let profile = kiln_proto::google::v1::Profile::decode(std::fs::read(&pprof)?.as_slice())?;
    let pprof_total: i64 = profile.sample.iter().map(|s| s.value[0]).sum();
    ensure!(
        pprof_total == total,
        "pprof {pprof_total}, flame graph {total}"
    );
    ensure!(
        seen["downloaded"]
            .as_str()
            .is_some_and(|n| n.starts_with("shop-process_cpu-") && n.ends_with(".pb")),
        "{seen}"
    );

    // A search highlights `checkout` and states its share of the whole.
    let checkout: i64 = want
        .iter()
        .filter(|(n, _)| n == "checkout")
        .map(|(_, t)| t)
        .sum();
    let share = format!("({:.2}%)", 100.0 * checkout as f64 / total as f64);
    let line = seen["searchShare"].as_str().unwrap_or("");
    ensure!(
        line.contains(&share) && line.ends_with("match"),
        "{line:?}, want {share}"
    );
    ensure!(seen["matched"] == serde_json::json!(["checkout"]), "{seen}");

    // A click on `checkout` keeps its ancestors and its subtree.
    let mut zoomed: Vec<String> = frames(&seen["zoomed"])
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    zoomed.sort();
    ensure!(
        zoomed == ["checkout", "main", "pay", "render", "total"],
        "{zoomed:?}"
    );

    // The diff view, from a link as Pyroscope's UI makes it: pod a's stacks against the whole
    // service; the root's baseline and comparison are the two queries' totals.
    let diff_url = kiln.url(&format!(
        "/comparison-diff?leftQuery={CPU}{}&leftFrom=now-1h&leftUntil=now&rightQuery={CPU}{}&rightFrom=now-1h&rightUntil=now",
        encode("{service_name=\"shop\"}"),
        encode("{service_name=\"shop\",pod=\"a\"}"),
    ));
    let seen = drive(&diff_url, "diff", &["--search", "checkout"])?;
    let root = seen["frames"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|f| f[0] == "total")
        .with_context(|| format!("no root drawn: {seen}"))?;
    let side = |v: &Value| v.as_str().and_then(|s| s.parse::<i64>().ok());
    let (_, pod_a) = api_frames(&kiln, "anonymous", "{service_name=\"shop\",pod=\"a\"}")?;
    ensure!(
        side(&root[2]) == Some(total)
            && side(&root[3]) == Some(pod_a)
            && pod_a > 0
            && pod_a < total,
        "root {root}: want baseline {total}, comparison {pod_a}"
    );

    // Searched in the diff view: each side's share of `checkout`, of that side's total.
    let (pod_a_frames, _) = api_frames(&kiln, "anonymous", "{service_name=\"shop\",pod=\"a\"}")?;
    let checkout_a: i64 = pod_a_frames
        .iter()
        .filter(|(n, _)| n == "checkout")
        .map(|(_, t)| t)
        .sum();
    let line = seen["searchShare"].as_str().unwrap_or("");
    let want = format!(
        "baseline {} ({:.2}%), comparison {} ({:.2}%) match",
        secs(checkout),
        100.0 * checkout as f64 / total as f64,
        secs(checkout_a),
        100.0 * checkout_a as f64 / pod_a as f64,
    );
    ensure!(line == want, "{line:?}, want {want:?}");

    // An empty tenant's page says how to send a profile.
    let empty = Kiln::start_with(&["--auth", "none"])?;
    let seen = drive(&empty.url("/"), "empty", &[])?;
    let status = seen["status"].as_str().unwrap_or("");
    ensure!(
        status.contains("No profiles here yet") && status.contains("/ingest?name=myapp.cpu"),
        "{status}"
    );
    Ok(())
}

/// A CPU value as the page writes it (nanoseconds as seconds).
fn secs(ns: i64) -> String {
    let v = ns as f64 / 1e9;
    if ns >= 10_000_000_000 {
        format!("{v:.0} s")
    } else {
        format!("{v:.2} s")
    }
}

#[test]
fn the_page_says_what_went_wrong() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(&tenants, "[tenants.anonymous]\nmax_query_range = \"6h\"\n")?;
    let mut kiln = Kiln::start_with(&["--auth", "none", "--tenants", &tenants.to_string_lossy()])?;
    let (status, body) = kiln.ingest(
        "anonymous",
        &format!("name=shop.cpu&from={}&format=folded", now_secs()? - 120),
        SHOP.to_vec(),
        &[],
    )?;
    ensure!(status == 200, "{body}");
    let view = |sel: &str, from: &str| {
        kiln.url(&format!(
            "/?query={CPU}{}&from={from}&until=now",
            encode(sel)
        ))
    };

    // Over the tenant's limits: the page says which and what to do.
    let seen = drive(
        &view("{service_name=\"shop\"}", "now-7d"),
        "over-limit",
        &[],
    )?;
    let status = seen["status"].as_str().unwrap_or("");
    ensure!(
        status.starts_with("Kiln refused this query")
            && status.contains("maximum range of 21600 s")
            && status.contains("Choose a shorter range"),
        "{status}"
    );
    ensure!(frames(&seen["frames"]).is_empty(), "{seen}");

    // A selector that matches nothing.
    let seen = drive(
        &view("{service_name=\"shop\",pod=\"nope\"}", "now-1h"),
        "no-match",
        &[],
    )?;
    let status = seen["status"].as_str().unwrap_or("");
    ensure!(
        status.starts_with("Nothing matches") && status.contains("pod=\"nope\""),
        "{status}"
    );

    // Kiln stops after the page is drawn: Refresh says it does not answer and keeps trying.
    let seen = drive_pausing(
        &view("{service_name=\"shop\"}", "now-1h"),
        "unreachable",
        &["--pause-then-refresh"],
        || kiln.kill(),
    )?;
    ensure!(!frames(&seen["frames"]).is_empty(), "{seen}");
    let after = seen["afterRefresh"].as_str().unwrap_or("");
    ensure!(
        after.starts_with("Kiln did not answer") && after.contains("Trying again every 5 s"),
        "{after}"
    );
    Ok(())
}

#[test]
fn in_jwt_mode_the_page_asks_for_a_token_and_shows_its_tenant_only() -> Result<()> {
    let keys = tempfile::tempdir()?;
    let key = keys.path().join("k1.secret");
    std::fs::write(&key, "0123456789abcdef0123456789abcdef-ui-e2e")?;
    let mut kiln = Kiln::start_with(&[
        "--auth",
        "jwt",
        "--jwt-keys",
        &keys.path().to_string_lossy(),
    ])?;
    let now = now_secs()?;
    for (tenant, service, body) in [
        ("team-a", "shop", SHOP),
        ("team-b", "vault", b"main;team_b_secret 9\n".as_slice()),
    ] {
        let write = token(&key, tenant, "write")?;
        kiln.set_auth(vec![("Authorization".into(), format!("Bearer {write}"))]);
        let (status, text) = kiln.ingest(
            tenant,
            &format!("name={service}.cpu&from={}&format=folded", now - 300),
            body.to_vec(),
            &[],
        )?;
        ensure!(status == 200, "{text}");
    }
    let url = kiln.url("/");

    // No token: the page asks for one.
    let seen = drive(&url, "jwt-none", &[])?;
    ensure!(seen["tokenAsked"] == true, "{seen}");

    // team-a's read token: team-a's flame graph, none of team-b's frames.
    let read_a = token(&key, "team-a", "read")?;
    let seen = drive(&url, "jwt-team-a", &["--token", &read_a])?;
    let drawn = frames(&seen["frames"]);
    kiln.set_auth(vec![("Authorization".into(), format!("Bearer {read_a}"))]);
    let (want, _) = api_frames(&kiln, "team-a", "{service_name=\"shop\"}")?;
    ensure!(
        !want.is_empty() && drawn == want,
        "drawn {drawn:?}\nteam-a's {want:?}"
    );
    ensure!(
        !drawn.iter().any(|(n, _)| n.contains("team_b")),
        "team-b's frames drawn for team-a"
    );

    // team-b's: its own only.
    let read_b = token(&key, "team-b", "read")?;
    let seen = drive(&url, "jwt-team-b", &["--token", &read_b])?;
    let names: Vec<String> = frames(&seen["frames"])
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    ensure!(
        names.contains(&"team_b_secret".to_owned()) && !names.contains(&"checkout".to_owned()),
        "{names:?}"
    );

    // A token that also reads team-b, with the page's Tenants field (`?tenants=`): both
    // tenants' frames in one flame graph, and the request names both.
    let out = std::process::Command::new(kiln_e2e::kiln_bin())
        .args(["token", "create", "--tenant", "team-a", "--scope", "read"])
        .args(["--read-tenants", "team-b", "--key"])
        .arg(&key)
        .output()?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read_ab = String::from_utf8(out.stdout)?.trim().to_owned();
    let seen = drive(
        &format!("{url}?tenants=team-a%7Cteam-b"),
        "jwt-team-a-and-b",
        &["--token", &read_ab],
    )?;
    let names: Vec<String> = frames(&seen["frames"])
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    ensure!(
        names.contains(&"team_b_secret".to_owned()) && names.contains(&"checkout".to_owned()),
        "{names:?}"
    );
    // The same page with team-a's own token: 403, the page names team-b.
    let seen = drive(
        &format!("{url}?tenants=team-a%7Cteam-b"),
        "jwt-team-a-not-b",
        &["--token", &read_a],
    )?;
    let status = seen["status"].as_str().unwrap_or("");
    ensure!(status.contains("team-b"), "{status}");
    ensure!(frames(&seen["frames"]).is_empty());

    // A write-only token is refused with a clear message.
    let write_a = token(&key, "team-a", "write")?;
    let seen = drive(&url, "jwt-write-only", &["--token", &write_a])?;
    let status = seen["status"].as_str().unwrap_or("");
    ensure!(status.contains("needs the read scope"), "{status}");
    ensure!(frames(&seen["frames"]).is_empty());
    Ok(())
}
