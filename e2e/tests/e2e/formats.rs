//! Formats beside pprof on `/ingest`: speedscope JSON (named by `format` and found by content)
//! and the .NET profiler's pprof, repaired only when the spy says it is .NET.

use anyhow::{Result, ensure};
use kiln_e2e::Kiln;
use kiln_proto::google::v1 as pb;
use prost::Message;

/// py-spy's shape: frames with files and lines, one sampled profile per thread, root first,
/// weights in seconds.
const SPEEDSCOPE: &str = r#"{
  "$schema": "https://www.speedscope.app/file-format-schema.json",
  "exporter": "py-spy@0.4.3",
  "name": "py-spy profile",
  "activeProfileIndex": null,
  "shared": {"frames": [
    {"name": "<module>", "file": "busy.py", "line": 17, "col": null},
    {"name": "kiln_busy_a", "file": "busy.py", "line": 7, "col": null},
    {"name": "kiln_fib", "file": "busy.py", "line": 3, "col": null}
  ]},
  "profiles": [{
    "type": "sampled", "name": "Thread 19604 \"MainThread\"", "unit": "seconds",
    "startValue": 0.0, "endValue": 0.05,
    "samples": [[0, 1, 2], [0, 1, 2], [0, 1], [0, 1, 2], [0]],
    "weights": [0.01, 0.01, 0.01, 0.01, 0.01]
  }]
}"#;

#[test]
fn speedscope_by_format_and_by_content() -> Result<()> {
    let kiln = Kiln::start(&[])?;
    let cpu = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
    for (tenant, query, ct) in [
        (
            "speedscope-format",
            "name=busy-py&format=speedscope",
            "application/json",
        ),
        (
            "speedscope-sniffed",
            "name=busy-py",
            "application/octet-stream",
        ),
    ] {
        let (status, text) = kiln.ingest(
            tenant,
            query,
            SPEEDSCOPE.as_bytes().to_vec(),
            &[("Content-Type", ct)],
        )?;
        ensure!(status == 200, "{tenant}: {status} {text}");
        let fg = kiln.flamegraph(tenant, cpu, r#"{service_name="busy-py"}"#)?;
        ensure!(
            fg.total == 50_000_000,
            "{tenant}: five 10 ms samples, got {}",
            fg.total
        );
        ensure!(
            fg.names.iter().any(|n| n == "kiln_fib") && fg.names.iter().any(|n| n == "kiln_busy_a"),
            "{tenant}: {:?}",
            fg.names
        );
        let thread = kiln.flamegraph(
            tenant,
            cpu,
            r#"{profile_name="Thread 19604 \"MainThread\""}"#,
        )?;
        ensure!(thread.total == 50_000_000, "{tenant}: profile_name label");
    }
    let broken = SPEEDSCOPE.replace("[0, 1, 2], [0, 1]", "[0, 1, 7], [0, 1]");
    let (status, text) = kiln.ingest(
        "speedscope-bad",
        "name=busy-py&format=speedscope",
        broken.into_bytes(),
        &[("Content-Type", "application/json")],
    )?;
    ensure!(status == 400 && text.contains("frame 7"), "{status} {text}");
    kiln.assert_tenant_empty("speedscope-bad")?;
    kiln.assert_tenant_empty("speedscope-other")?;
    Ok(())
}

/// A .NET profile as the profiler writes it: every function's id is 0, one function per
/// location, in step; a dash-named sample type.
fn broken_dotnet() -> Vec<u8> {
    let strings = [
        "",
        "cpu",
        "nanoseconds",
        "alloc-samples",
        "count",
        "KilnShop!Program.Main",
        "KilnShop!Checkout.Pay",
    ];
    pb::Profile {
        string_table: strings.map(String::from).to_vec(),
        sample_type: vec![
            pb::ValueType { r#type: 1, unit: 2 },
            pb::ValueType { r#type: 3, unit: 4 },
        ],
        sample: vec![pb::Sample {
            location_id: vec![2, 1],
            value: vec![30_000_000, 2],
            label: vec![],
        }],
        location: [1, 2]
            .map(|id| pb::Location {
                id,
                line: vec![pb::Line {
                    function_id: id,
                    line: 0,
                }],
                ..Default::default()
            })
            .to_vec(),
        function: [5, 6]
            .map(|name| pb::Function {
                id: 0,
                name,
                ..Default::default()
            })
            .to_vec(),
        ..Default::default()
    }
    .encode_to_vec()
}

#[test]
fn dotnet_pprof_is_repaired_for_its_spy_only() -> Result<()> {
    let kiln = Kiln::start(&[])?;
    let body = broken_dotnet();
    let (status, text) = kiln.ingest(
        "dotnet-unknown",
        "name=shop.dotnet&format=pprof",
        body.clone(),
        &[],
    )?;
    ensure!(status == 400, "without the spy: {status} {text}");
    ensure!(text.contains("which the profile does not define"), "{text}");
    kiln.assert_tenant_empty("dotnet-unknown")?;

    let (status, text) = kiln.ingest(
        "dotnet",
        "name=shop.dotnet&format=pprof&spyName=dotnetspy",
        body,
        &[],
    )?;
    ensure!(status == 200, "dotnetspy: {status} {text}");
    let fg = kiln.flamegraph("dotnet", "process_cpu:cpu:nanoseconds::", "{}")?;
    ensure!(fg.total == 30_000_000, "cpu total {}", fg.total);
    ensure!(
        fg.names.iter().any(|n| n == "KilnShop!Checkout.Pay"),
        "{:?}",
        fg.names
    );
    let alloc = kiln.flamegraph("dotnet", "process_cpu:alloc_samples:count::", "{}")?;
    ensure!(
        alloc.total == 2,
        "dash-named sample type renamed: {}",
        alloc.total
    );
    kiln.assert_tenant_empty("dotnet-other")?;
    Ok(())
}

/// A multipart upload as the .NET profiler's `PyroscopePprofSink` makes it (cpp-httplib): a
/// `profile` part and a `sample_type_config` part of dash-named sample types.
fn dotnet_multipart(profile: &[u8], config: &str) -> (String, Vec<u8>) {
    let boundary = "--cpp-httplib-multipart-data-kiln0dotnet";
    let mut body = Vec::new();
    for (name, data) in [
        ("profile", profile),
        ("sample_type_config", config.as_bytes()),
    ] {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; \
                 filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// The .NET profiler's multipart uploads are repaired as Pyroscope repairs them: with
/// `spyName=dotnetspy` (releases 0.8.5 to 0.8.8), and with no spyName when the sample type config
/// has `inuse-space` (releases before 0.8.5, which Pyroscope tells by that key); exact totals.
/// An upload of no spy without that key is not .NET's, and stays refused as Pyroscope refuses it.
#[test]
fn dotnet_multipart_uploads_are_repaired_as_pyroscope_repairs_them() -> Result<()> {
    let kiln = Kiln::start(&[])?;
    let profile = broken_dotnet();
    let dotnet_config = r#"{"cpu":{"units":"samples","sampled":true},"alloc-samples":{"units":"objects"},"inuse-space":{"units":"bytes","aggregation":"average"}}"#;
    let other_config = r#"{"cpu":{"units":"samples","sampled":true}}"#;
    for (tenant, query, config, want) in [
        ("dotnet-old", "name=shop.dotnet", dotnet_config, 200),
        (
            "dotnet-spy",
            "name=shop.dotnet&spyName=dotnetspy",
            other_config,
            200,
        ),
        ("dotnet-none", "name=shop.dotnet", other_config, 400),
    ] {
        let (ct, body) = dotnet_multipart(&profile, config);
        let (status, text) = kiln.ingest(tenant, query, body, &[("Content-Type", ct.as_str())])?;
        ensure!(status == want, "{tenant}: {status} {text}");
        if want != 200 {
            ensure!(text.contains("which the profile does not define"), "{text}");
            kiln.assert_tenant_empty(tenant)?;
            continue;
        }
        let fg = kiln.flamegraph(tenant, "process_cpu:cpu:nanoseconds::", "{}")?;
        ensure!(fg.total == 30_000_000, "{tenant}: cpu total {}", fg.total);
        ensure!(
            fg.names.iter().any(|n| n == "KilnShop!Checkout.Pay"),
            "{tenant}: {:?}",
            fg.names
        );
        let alloc = kiln.flamegraph(tenant, "process_cpu:alloc_samples:count::", "{}")?;
        ensure!(alloc.total == 2, "{tenant}: alloc total {}", alloc.total);
    }
    kiln.assert_tenant_empty("dotnet-other")?;
    Ok(())
}

/// Pyroscope's speedscope test documents from the corpus, with the totals Pyroscope's own tests
/// expect of them (an evented profile in unit `none` at 100 Hz; duplicates merged; two profiles
/// named by unit).
#[test]
#[cfg_attr(not(kiln_corpus), ignore = "../shared/corpus is absent")]
fn corpus_speedscope_documents() -> Result<()> {
    let dir = kiln_e2e::corpus_dir()
        .ok_or_else(|| anyhow::anyhow!("../shared/corpus is absent"))?
        .join("speedscope");
    let kiln = Kiln::start(&[])?;
    let cases = [
        (
            "simple",
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            14 * 10_000_000,
            1,
        ),
        (
            "duplicates",
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            3 * 14_000_000_000,
            1,
        ),
        (
            "two-sampled",
            "wall:wall:nanoseconds:cpu:nanoseconds",
            2 * 14_000_000_000,
            2,
        ),
        ("two-sampled-bytes", "memory:samples:bytes::", 2 * 14, 2),
    ];
    for (file, ty, total, series) in cases {
        let body = std::fs::read(dir.join(format!("{file}.speedscope.json")))?;
        let tenant = format!("speedscope-{file}");
        let (status, text) = kiln.ingest(&tenant, "name=foo", body, &[])?;
        ensure!(status == 200, "{file}: {status} {text}");
        let fg = kiln.flamegraph(&tenant, ty, r#"{service_name="foo"}"#)?;
        ensure!(fg.total == total, "{file}: total {} of {ty}", fg.total);
        let names: kiln_proto::types::v1::LabelValuesResponse = kiln.connect(
            &tenant,
            "/querier.v1.QuerierService/LabelValues",
            &kiln_proto::types::v1::LabelValuesRequest {
                name: "profile_name".into(),
                matchers: vec![],
                start: kiln_e2e::ALL_TIME.0,
                end: kiln_e2e::ALL_TIME.1,
            },
        )?;
        ensure!(names.names.len() == series, "{file}: {:?}", names.names);
    }
    kiln.assert_tenant_empty("speedscope-corpus-other")?;
    Ok(())
}
