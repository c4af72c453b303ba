//! Real clients: Go runtime/pprof, pyroscope-io (push.v1), @pyroscope/nodejs (/ingest) and
//! py-spy (folded). For each, the flame graph total equals what the client sent, the functions
//! it ran are in the flame graph, and another tenant sees nothing.

use std::collections::BTreeMap;
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use kiln_e2e::proxy::Proxy;
use kiln_e2e::{Kiln, Tools, find_type, pprof_function_names, pprof_totals};
use prost::Message;

fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Checks, for every (sample type, unit) the client sent, that the stored flame graph total of
/// that type equals the sum of what was sent.
fn check_totals(
    kiln: &Kiln,
    tenant: &str,
    sent: &BTreeMap<(String, String), i64>,
    selector: &str,
) -> Result<()> {
    let types = kiln.profile_types(tenant)?;
    ensure!(!sent.is_empty(), "the client sent nothing");
    for ((ty, unit), total) in sent {
        if *total == 0 {
            continue;
        }
        let pt = find_type(&types, ty, unit)
            .with_context(|| format!("no profile type for {ty}/{unit} in {types:?}"))?;
        let fg = kiln.flamegraph(tenant, &pt.id, selector)?;
        ensure!(
            fg.total == *total,
            "{}: stored total {} != sent {}",
            pt.id,
            fg.total,
            total
        );
    }
    Ok(())
}

fn add_totals(into: &mut BTreeMap<(String, String), i64>, pprof: &[u8]) -> Result<()> {
    for (k, v) in pprof_totals(pprof)? {
        *into.entry(k).or_insert(0) += v;
    }
    Ok(())
}

#[test]
fn go_runtime_pprof() -> Result<()> {
    let tools = Tools::find()?;
    let out = tempfile::tempdir()?;
    let src = kiln_e2e::repo_root().join("e2e/clients/go/main.go");
    let bin = out.path().join("profdemo");
    run(Command::new(&tools.go)
        .args(["build", "-o"])
        .arg(&bin)
        .arg(&src)
        .env("GO111MODULE", "off")
        .env("GOPROXY", "off")
        .env("GOCACHE", out.path().join("gocache"))
        .env("GOFLAGS", "-buildvcs=false"))?;
    run(Command::new(&bin).arg(out.path()))?;

    let kiln = Kiln::start(&[])?;
    let mut sent = BTreeMap::new();
    for file in ["cpu.pb.gz", "heap.pb.gz"] {
        let body = std::fs::read(out.path().join(file))?;
        add_totals(&mut sent, &body)?;
        let (status, text) = kiln.ingest(
            "go-team",
            "name=go-demo%7Benv%3De2e%7D&format=pprof&spyName=gospy",
            body,
            &[("Content-Type", "application/octet-stream")],
        )?;
        ensure!(status == 200, "{file}: {status} {text}");
    }
    check_totals(&kiln, "go-team", &sent, r#"{service_name="go-demo"}"#)?;
    let types = kiln.profile_types("go-team")?;
    let cpu = find_type(&types, "cpu", "nanoseconds").context("cpu type")?;
    assert_eq!(cpu.id, "process_cpu:cpu:nanoseconds:cpu:nanoseconds");
    let fg = kiln.flamegraph("go-team", &cpu.id, r#"{controller="compute"}"#)?;
    assert!(
        fg.names.iter().any(|n| n == "main.kilnBusyCompute"),
        "{:?}",
        fg.names
    );
    assert!(fg.names.iter().any(|n| n == "main.fib"));
    let alloc = find_type(&types, "alloc_space", "bytes").context("alloc_space type")?;
    assert_eq!(alloc.id, "memory:alloc_space:bytes:space:bytes");
    let fg = kiln.flamegraph("go-team", &alloc.id, "{}")?;
    assert!(
        fg.names.iter().any(|n| n == "main.kilnBusyAllocate"),
        "{:?}",
        fg.names
    );
    kiln.assert_tenant_empty("other-team")?;
    Ok(())
}

#[test]
fn pyroscope_io_push() -> Result<()> {
    let tools = Tools::find()?;
    let kiln = Kiln::start(&[])?;
    let proxy = Proxy::start(kiln.port, vec![("X-Scope-OrgID".into(), "py-team".into())])?;
    let script = kiln_e2e::repo_root().join("e2e/clients/python/pyroscope_app.py");
    run(Command::new(&tools.python)
        .arg(&script)
        .arg(proxy.url())
        .arg("e2e.py.app")
        .arg("3"))?;

    let records = proxy.records();
    let mut sent = BTreeMap::new();
    let mut names = Vec::new();
    let pushes: Vec<_> = records
        .iter()
        .filter(|r| r.target.ends_with("/push.v1.PusherService/Push"))
        .collect();
    ensure!(!pushes.is_empty(), "pyroscope-io sent no push: {records:?}");
    for r in &pushes {
        ensure!(r.status == 200, "push answered {}", r.status);
        let body = if r.header("content-encoding") == Some("gzip") {
            let mut out = Vec::new();
            std::io::Read::read_to_end(
                &mut flate2::read::GzDecoder::new(r.body.as_slice()),
                &mut out,
            )?;
            out
        } else {
            r.body.clone()
        };
        let req = kiln_proto::push::v1::PushRequest::decode(body.as_slice())?;
        for s in req.series {
            for sample in s.samples {
                add_totals(&mut sent, &sample.raw_profile)?;
                names.extend(pprof_function_names(&sample.raw_profile)?);
            }
        }
    }
    check_totals(&kiln, "py-team", &sent, r#"{service_name="e2e.py.app"}"#)?;
    let types = kiln.profile_types("py-team")?;
    let cpu = find_type(&types, "cpu", "nanoseconds").context("cpu type")?;
    let fg = kiln.flamegraph("py-team", &cpu.id, r#"{controller="busy"}"#)?;
    assert!(
        fg.names.iter().any(|n| n.contains("kiln_py_fib")),
        "{:?}",
        fg.names
    );
    assert!(names.iter().any(|n| n.contains("kiln_py_fib")));
    kiln.assert_tenant_empty("other-team")?;
    Ok(())
}

#[test]
fn pyroscope_nodejs_ingest() -> Result<()> {
    let tools = Tools::find()?;
    let kiln = Kiln::start(&[])?;
    let proxy = Proxy::start(
        kiln.port,
        vec![("X-Scope-OrgID".into(), "node-team".into())],
    )?;
    run(Command::new(&tools.node)
        .current_dir(&tools.node_dir)
        .arg("app.js")
        .arg(proxy.url())
        .arg("e2e-node-app")
        .arg("4"))?;
    let records = proxy.records();
    let ingests: Vec<_> = records
        .iter()
        .filter(|r| r.target.starts_with("/ingest"))
        .collect();
    ensure!(
        !ingests.is_empty(),
        "@pyroscope/nodejs sent nothing: {records:?}"
    );
    let mut sent = BTreeMap::new();
    for r in &ingests {
        ensure!(r.status == 200, "ingest answered {}", r.status);
        add_totals(&mut sent, &r.body)?;
    }
    check_totals(
        &kiln,
        "node-team",
        &sent,
        r#"{service_name="e2e-node-app"}"#,
    )?;
    let types = kiln.profile_types("node-team")?;
    let wall = find_type(&types, "wall", "nanoseconds").context("wall type")?;
    let fg = kiln.flamegraph("node-team", &wall.id, r#"{e2e="nodejs"}"#)?;
    assert!(
        fg.names.iter().any(|n| n.contains("kilnNodeFib")),
        "{:?}",
        fg.names
    );
    kiln.assert_tenant_empty("other-team")?;
    Ok(())
}

#[test]
fn py_spy_folded() -> Result<()> {
    let tools = Tools::find()?;
    let out = tempfile::tempdir()?;
    let raw = out.path().join("raw.txt");
    let script = kiln_e2e::repo_root().join("e2e/clients/python/busy.py");
    run(Command::new(&tools.py_spy)
        .args(["record", "-f", "raw", "-r", "100", "-o"])
        .arg(&raw)
        .arg("--")
        .arg(&tools.python)
        .arg(&script))?;
    let text = std::fs::read_to_string(&raw)?;
    let sent: i64 = text
        .lines()
        .filter_map(|l| {
            l.rsplit_once(' ')
                .and_then(|(_, v)| v.trim().parse::<i64>().ok())
        })
        .sum();
    ensure!(sent > 0, "py-spy recorded nothing");

    let kiln = Kiln::start(&[])?;
    let (status, body) = kiln.ingest(
        "spy-team",
        "name=pyspy-app.cpu&sampleRate=100&spyName=pyspy",
        text.into_bytes(),
        &[],
    )?;
    ensure!(status == 200, "{status} {body}");
    let fg = kiln.flamegraph(
        "spy-team",
        "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
        r#"{service_name="pyspy-app"}"#,
    )?;
    assert_eq!(fg.total, sent * 10_000_000, "100 Hz samples are 10 ms each");
    assert!(
        fg.names.iter().any(|n| n.starts_with("kiln_spy_fib")),
        "{:?}",
        fg.names
    );
    kiln.assert_tenant_empty("other-team")?;
    Ok(())
}
