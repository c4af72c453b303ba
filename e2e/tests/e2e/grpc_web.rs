//! gRPC-Web against the real binary, with a real gRPC-Web client: connect-es (the gRPC-Web
//! transport of `@connectrpc/connect-node`) calls `querier.v1`, and its answers equal the
//! Connect API's; the text variant is read back from a raw request; errors keep their codes;
//! CORS answers the origins allowed; another tenant sees nothing.

use std::process::Command;

use anyhow::{Context, Result, ensure};
use kiln_e2e::{ALL_TIME, Kiln, Tools};
use kiln_proto::querier::v1 as q;
use serde_json::{Value, json};

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
/// Nanoseconds per folded sample at the default 100 Hz.
const TICK: i64 = 10_000_000;
const ORIGIN: &str = "http://parca.example:7070";

/// connect-es's calls over gRPC-Web, with `headers`.
fn grpc_web(kiln: &Kiln, headers: Value, calls: Value) -> Result<Vec<Value>> {
    let tools = Tools::find()?;
    let dir = tempfile::tempdir()?;
    let descriptors = dir.path().join("kiln.binpb");
    std::fs::write(&descriptors, kiln_proto::FILE_DESCRIPTOR_SET)?;
    let out = Command::new(&tools.node)
        .current_dir(&tools.node_dir)
        .arg("grpcweb.mjs")
        .arg(kiln.url(""))
        .arg(&descriptors)
        .arg(headers.to_string())
        .arg(calls.to_string())
        .output()?;
    ensure!(
        out.status.success(),
        "node: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).context("node's answer")?;
    Ok(v.as_array().context("an array")?.clone())
}

/// An int64 of proto JSON (a string).
fn int64(v: &Value) -> Option<i64> {
    v.as_str()?.parse().ok()
}

fn stacks(range: &Value) -> Value {
    json!({ "method": "SelectMergeStacktraces", "request": {
        "profileTypeID": CPU, "labelSelector": "{}", "start": range["start"], "end": range["end"],
        "maxNodes": "100000" } })
}

#[test]
fn connect_es_reads_the_querier_over_grpc_web() -> Result<()> {
    let kiln = Kiln::start(&["--cors-allowed-origins", ORIGIN])?;
    for (tenant, name, folded) in [
        ("gw-a", "api.cpu", "main;work 30\nmain;idle 10\n"),
        ("gw-b", "vault.cpu", "main;b_secret 9\n"),
    ] {
        let (status, body) = kiln.ingest(tenant, &format!("name={name}"), folded.into(), &[])?;
        ensure!(status == 200, "{status} {body}");
    }
    let range = json!({ "start": ALL_TIME.0.to_string(), "end": ALL_TIME.1.to_string() });
    let org = |t: &str| json!({ "X-Scope-OrgID": t });
    let calls = json!([
        { "method": "ProfileTypes", "request": range },
        { "method": "LabelValues", "request": { "name": "service_name", "start": range["start"], "end": range["end"] } },
        stacks(&range),
        { "method": "SelectSeries", "request": {
            "profileTypeID": CPU, "labelSelector": "{}", "start": range["start"], "end": range["end"],
            "step": 4102444800.0, "groupBy": ["service_name"] } },
        { "method": "SelectMergeStacktraces", "request": { "profileTypeID": "cpu", "labelSelector": "{}" } },
    ]);
    let a = grpc_web(&kiln, org("gw-a"), calls)?;
    ensure!(a.iter().take(4).all(|c| c["ok"] == true), "{a:?}");
    ensure!(
        a[0]["response"]["profileTypes"][0]["ID"] == CPU,
        "{}",
        a[0]["response"]
    );
    ensure!(a[1]["response"]["names"] == json!(["api"]), "{}", a[1]);
    // The flame graph equals the Connect API's, name by name and level by level.
    let connect: q::SelectMergeStacktracesResponse = kiln.connect(
        "gw-a",
        "/querier.v1.QuerierService/SelectMergeStacktraces",
        &q::SelectMergeStacktracesRequest {
            profile_type_id: CPU.into(),
            label_selector: "{}".into(),
            start: ALL_TIME.0,
            end: ALL_TIME.1,
            max_nodes: Some(100_000),
            ..Default::default()
        },
    )?;
    let fg = connect.flamegraph.context("flame graph")?;
    let web = &a[2]["response"]["flamegraph"];
    ensure!(int64(&web["total"]) == Some(40 * TICK), "{web}");
    ensure!(web["names"] == json!(fg.names), "{web}");
    ensure!(
        web["levels"].as_array().map(Vec::len) == Some(fg.levels.len()),
        "{web}"
    );
    ensure!(
        a[3]["response"]["series"][0]["points"][0]["value"] == (40 * TICK) as f64,
        "{}",
        a[3]
    );
    // A bad request keeps its code.
    ensure!(
        a[4]["ok"] == false && a[4]["code"] == "InvalidArgument",
        "{}",
        a[4]
    );

    // Another tenant: its own only; two as one; none is refused.
    let b = grpc_web(&kiln, org("gw-b"), json!([stacks(&range)]))?;
    let names = &b[0]["response"]["flamegraph"]["names"];
    ensure!(
        names.to_string().contains("b_secret") && !names.to_string().contains("work"),
        "{names}"
    );
    let both = grpc_web(&kiln, org("gw-a|gw-b"), json!([stacks(&range)]))?;
    ensure!(
        int64(&both[0]["response"]["flamegraph"]["total"]) == Some(49 * TICK),
        "{both:?}"
    );
    let none = grpc_web(&kiln, json!({}), json!([stacks(&range)]))?;
    ensure!(none[0]["code"] == "Unauthenticated", "{none:?}");

    // The text variant (base64 frames), as browsers without binary bodies send it.
    let req = q::ProfileTypesRequest {
        start: ALL_TIME.0,
        end: ALL_TIME.1,
    };
    let msg = prost::Message::encode_to_vec(&req);
    let mut frame = vec![0u8];
    frame.extend((msg.len() as u32).to_be_bytes());
    frame.extend(msg);
    let resp = kiln
        .http()
        .post(kiln.url("/querier.v1.QuerierService/ProfileTypes"))
        .header("Content-Type", "application/grpc-web-text")
        .header("Accept", "application/grpc-web-text")
        .header("X-Grpc-Web", "1")
        .header("X-Scope-OrgID", "gw-a")
        .body(kiln_otel::base64::encode(&frame))
        .send()?;
    ensure!(resp.status() == 200, "{}", resp.status());
    let text = resp.text()?;
    let mut bytes = Vec::new();
    // Each frame may be its own base64 chunk (padding between them).
    for chunk in text
        .split_inclusive('=')
        .filter(|c| !c.trim_matches('=').is_empty())
    {
        bytes.extend(kiln_otel::base64::decode(chunk).context("base64")?);
    }
    ensure!(bytes[0] == 0, "a data frame first");
    let len = u32::from_be_bytes(bytes[1..5].try_into()?) as usize;
    let types: q::ProfileTypesResponse = prost::Message::decode(&bytes[5..5 + len])?;
    ensure!(types.profile_types[0].id == CPU, "{types:?}");
    let trailer = String::from_utf8_lossy(&bytes[5 + len + 5..]).to_lowercase();
    ensure!(
        bytes[5 + len] == 0x80 && trailer.contains("grpc-status:0"),
        "{trailer}"
    );

    // CORS: the allowed origin's preflight is answered, another's is not.
    let preflight = |origin: &str| {
        kiln.http()
            .request(
                reqwest::Method::OPTIONS,
                kiln.url("/querier.v1.QuerierService/ProfileTypes"),
            )
            .header("Origin", origin)
            .header("Access-Control-Request-Method", "POST")
            .header(
                "Access-Control-Request-Headers",
                "content-type,x-grpc-web,x-scope-orgid,authorization",
            )
            .send()
    };
    let ok = preflight(ORIGIN)?;
    let h = ok.headers();
    ensure!(
        h.get("access-control-allow-origin").map(|v| v.as_bytes()) == Some(ORIGIN.as_bytes()),
        "{h:?}"
    );
    ensure!(
        h.get("access-control-allow-headers")
            .is_some_and(|v| v.to_str().unwrap_or("").contains("x-scope-orgid")),
        "{h:?}"
    );
    let other = preflight("http://evil.example")?;
    ensure!(
        other.headers().get("access-control-allow-origin").is_none(),
        "{:?}",
        other.headers()
    );
    Ok(())
}
