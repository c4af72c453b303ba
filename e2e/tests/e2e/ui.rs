//! The built-in UI (ADR 0016) in a real headless Chromium (Debian's, installed by
//! `scripts/install-test-deps.sh`): the page, once its script has run, draws the flame graph Kiln's
//! API answers for the same query — every frame with its name and total — and the exact function
//! table beside it; its screenshot is kept as a test artifact and is not blank.

use std::process::Command;

use anyhow::{Context, Result, ensure};
use kiln_e2e::{ALL_TIME, Kiln};
use kiln_proto::querier::v1 as q;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

fn chromium() -> Result<&'static str> {
    let path = "/usr/bin/chromium";
    ensure!(
        std::path::Path::new(path).exists(),
        "{path} is missing: run scripts/install-test-deps.sh"
    );
    Ok(path)
}

/// The page's DOM after its script ran (Chromium's virtual time lets the fetches finish).
fn rendered_dom(url: &str) -> Result<String> {
    let out = Command::new(chromium()?)
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--window-size=1400,900",
            "--virtual-time-budget=10000",
            "--dump-dom",
            url,
        ])
        .output()
        .context("running chromium")?;
    ensure!(
        out.status.success(),
        "chromium: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The value of attribute `name` in an element's text.
fn attr<'a>(element: &'a str, name: &str) -> Option<&'a str> {
    let start = element.find(&format!(" {name}=\""))? + name.len() + 3;
    let len = element[start..].find('"')?;
    Some(&element[start..start + len])
}

/// The frames the page drew: (name, total) per rectangle.
fn drawn_frames(dom: &str) -> Vec<(String, i64)> {
    dom.split("<rect ")
        .skip(1)
        .filter_map(|r| {
            let r = &r[..r.find('>')?];
            let name = attr(r, "data-name")?
                .replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&quot;", "\"")
                .replace("&amp;", "&");
            Some((name, attr(r, "data-total")?.parse().ok()?))
        })
        .collect()
}

#[test]
fn the_page_draws_the_flame_graph_the_api_answers() -> Result<()> {
    let kiln = Kiln::start_with(&["--auth", "none"])?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs() as i64;
    for (i, pod) in ["a", "b", "a", "b"].iter().enumerate() {
        let (status, body) = kiln.ingest(
            "anonymous",
            &format!(
                "name=shop.cpu%7Bpod%3D{pod}%7D&from={}&format=folded",
                now - 600 + 60 * i as i64
            ),
            b"main;checkout;pay 30\nmain;checkout;render 20\nmain;browse 10\ngc 5\n".to_vec(),
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
    let dom = rendered_dom(&url)?;
    let mut drawn = drawn_frames(&dom);
    drawn.sort();

    let fg = kiln.flamegraph("anonymous", CPU, "{service_name=\"shop\"}")?;
    let nodes = kiln_proto::flamegraph::decode(&fg)?;
    let mut want: Vec<(String, i64)> = nodes
        .iter()
        .map(|n| (fg.names[n.name].clone(), n.total))
        .collect();
    want.sort();
    ensure!(
        !want.is_empty() && drawn == want,
        "drawn {drawn:?}\nAPI {want:?}"
    );
    ensure!(
        !drawn.iter().any(|(n, _)| n == "elsewhere"),
        "another service's frames drawn"
    );

    // The function table beside it: every function, exact (from PROFILE_FORMAT_FUNCTIONS).
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
    for f in &table.functions.context("a function table")?.functions {
        ensure!(
            dom.contains(&format!("<td>{}</td>", f.name)),
            "{} not in the table",
            f.name
        );
    }
    ensure!(
        dom.contains("service_name=\"shop\""),
        "the status line names the query"
    );

    // The screenshot, kept as an artifact: a drawn page, not a blank one.
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui-flamegraph.png");
    let out = Command::new(chromium()?)
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--window-size=1400,900",
            "--virtual-time-budget=10000",
        ])
        .arg(format!("--screenshot={}", shot.display()))
        .arg(&url)
        .output()?;
    ensure!(
        out.status.success(),
        "chromium: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let blank = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui-blank.png");
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
    ensure!(out.status.success());
    let (drawn, empty) = (
        std::fs::metadata(&shot)?.len(),
        std::fs::metadata(&blank)?.len(),
    );
    ensure!(
        drawn > 4 * empty,
        "the screenshot ({drawn} B) is no fuller than a blank page ({empty} B)"
    );

    // An empty tenant's page says how to send a profile.
    let empty = Kiln::start_with(&["--auth", "none"])?;
    let dom = rendered_dom(&empty.url("/"))?;
    ensure!(
        dom.contains("No profiles here yet") && dom.contains("/ingest?name=myapp.cpu"),
        "{dom}"
    );
    Ok(())
}
