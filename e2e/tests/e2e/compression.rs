//! zstd wherever compression is negotiated: gRPC messages both ways (tonic's client), HTTP
//! request bodies (`curl --data-binary` with `Content-Encoding: zstd`), large answers as
//! `Accept-Encoding` asks, and a zstd bomb refused like a gzip one.

use std::io::Write;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use kiln_e2e::with_tenant;
use kiln_e2e::{ALL_TIME, Kiln, corpus_dir};
use kiln_proto::google::v1 as pprof;
use kiln_proto::push::v1::pusher_service_client::PusherServiceClient;
use kiln_proto::push::v1::{PushRequest, RawProfileSeries, RawSample};
use kiln_proto::querier::v1 as q;
use kiln_proto::querier::v1::querier_service_client::QuerierServiceClient;
use kiln_proto::types::v1::LabelPair;
use tonic::codec::CompressionEncoding;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

/// A CPU profile of `samples` stacks `main;work_<i>`, `(i + 1) × 10 ms` each.
fn profile(samples: usize) -> Vec<u8> {
    let mut strings: Vec<String> = ["", "cpu", "nanoseconds", "main"]
        .map(String::from)
        .to_vec();
    let mut p = pprof::Profile {
        sample_type: vec![pprof::ValueType { r#type: 1, unit: 2 }],
        period_type: Some(pprof::ValueType { r#type: 1, unit: 2 }),
        period: 10_000_000,
        time_nanos: 1_700_000_000_000_000_000,
        ..Default::default()
    };
    let func = |p: &mut pprof::Profile, name: i64| {
        let id = p.function.len() as u64 + 1;
        p.function.push(pprof::Function {
            id,
            name,
            ..Default::default()
        });
        p.location.push(pprof::Location {
            id,
            line: vec![pprof::Line {
                function_id: id,
                line: 1,
            }],
            ..Default::default()
        });
        id
    };
    let main = func(&mut p, 3);
    for i in 0..samples {
        strings.push(format!("work_{i}"));
        let leaf = func(&mut p, strings.len() as i64 - 1);
        p.sample.push(pprof::Sample {
            location_id: vec![leaf, main],
            value: vec![(i as i64 + 1) * 10_000_000],
            label: vec![],
        });
    }
    p.string_table = strings;
    prost::Message::encode_to_vec(&p)
}

/// The total of [`profile`]`(samples)`.
fn total(samples: usize) -> i64 {
    (1..=samples as i64).sum::<i64>() * 10_000_000
}

fn curl() -> Command {
    let mut c = Command::new("curl");
    c.args(["-sS", "--max-time", "30"]);
    c
}

#[test]
fn grpc_messages_are_zstd_both_ways() -> Result<()> {
    let kiln = Kiln::start(&[])?;
    let url = kiln.url("");
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let channel = tonic::transport::Channel::from_shared(url)?
            .connect()
            .await?;
        for (encoding, name) in [
            (CompressionEncoding::Zstd, "zstd"),
            (CompressionEncoding::Gzip, "gzip"),
        ] {
            let tenant = format!("grpc-{name}");
            let mut pusher = PusherServiceClient::new(channel.clone()).send_compressed(encoding);
            let mut querier = QuerierServiceClient::new(channel.clone())
                .send_compressed(encoding)
                .accept_compressed(encoding);
            let push = PushRequest {
                series: vec![RawProfileSeries {
                    labels: vec![
                        LabelPair {
                            name: "__name__".into(),
                            value: "process_cpu".into(),
                        },
                        LabelPair {
                            name: "service_name".into(),
                            value: "zstd-svc".into(),
                        },
                    ],
                    samples: vec![RawSample {
                        raw_profile: profile(400).into(),
                        id: "1".into(),
                    }],
                    annotations: vec![],
                }],
            };
            pusher
                .push(with_tenant(push, &tenant))
                .await
                .with_context(|| format!("push {name}"))?;
            let req = q::SelectMergeStacktracesRequest {
                profile_type_id: CPU.into(),
                label_selector: r#"{service_name="zstd-svc"}"#.into(),
                start: ALL_TIME.0,
                end: ALL_TIME.1,
                max_nodes: Some(1 << 20),
                ..Default::default()
            };
            let resp = querier
                .select_merge_stacktraces(with_tenant(req.clone(), &tenant))
                .await?;
            // The answer came in the client's encoding (tonic inflated it).
            let got = resp
                .metadata()
                .get("grpc-encoding")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            ensure!(
                got.as_deref() == Some(name),
                "{name}: grpc-encoding {got:?}"
            );
            let fg = resp.into_inner().flamegraph.context("flame graph")?;
            ensure!(fg.total == total(400), "{name}: total {}", fg.total);
            ensure!(fg.names.iter().any(|n| n == "work_399"), "{name}: names");
            // Another tenant sees nothing of it.
            let other = querier
                .select_merge_stacktraces(with_tenant(req, "grpc-nobody"))
                .await?
                .into_inner()
                .flamegraph
                .context("flame graph")?;
            ensure!(
                other.total == 0,
                "{name}: another tenant sees {}",
                other.total
            );
        }
        Ok::<_, anyhow::Error>(())
    })?;
    kiln.assert_tenant_empty("grpc-nobody")?;
    Ok(())
}

#[test]
fn curl_sends_zstd_bodies_and_reads_zstd_answers() -> Result<()> {
    let kiln = Kiln::start(&[])?;
    let dir = tempfile::tempdir()?;
    let raw = profile(300);
    let body = dir.path().join("cpu.pprof.zst");
    std::fs::write(&body, zstd::bulk::compress(&raw, 3)?)?;

    // Content-Encoding: zstd on /ingest, and a zstd pprof named by its magic alone.
    for (tenant, header) in [
        ("curl-zstd", Some("Content-Encoding: zstd")),
        ("curl-magic", None),
    ] {
        let mut c = curl();
        c.args(["-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
            .args(["-H", &format!("X-Scope-OrgID: {tenant}")])
            .arg("--data-binary")
            .arg(format!("@{}", body.display()));
        if let Some(h) = header {
            c.args(["-H", h]);
        }
        c.arg(kiln.url("/ingest?name=curl-app&format=pprof&from=1700000000"));
        let out = c.output()?;
        let code = String::from_utf8_lossy(&out.stdout).to_string();
        ensure!(
            code == "200",
            "{tenant}: {code} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let fg = kiln.flamegraph(tenant, CPU, r#"{service_name="curl-app"}"#)?;
        ensure!(fg.total == total(300), "{tenant}: total {}", fg.total);
    }
    kiln.assert_tenant_empty("curl-nobody")?;

    // A large answer, as Accept-Encoding asks: the same bytes once inflated.
    let query = serde_json::json!({
        "profileTypeID": CPU,
        "labelSelector": "{service_name=\"curl-app\"}",
        "start": ALL_TIME.0.to_string(),
        "end": ALL_TIME.1.to_string(),
    })
    .to_string();
    let answer = |accept: Option<&str>| -> Result<(String, Vec<u8>)> {
        let headers = dir.path().join("headers");
        let mut c = curl();
        c.args(["-D"])
            .arg(&headers)
            .args(["-H", "X-Scope-OrgID: curl-zstd"])
            .args(["-H", "Content-Type: application/json"])
            .args(["--data-binary", &query]);
        if let Some(a) = accept {
            c.args(["-H", &format!("Accept-Encoding: {a}")]);
        }
        c.arg(kiln.url("/querier.v1.QuerierService/SelectMergeStacktraces"));
        let out = c.output()?;
        ensure!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let head = std::fs::read_to_string(&headers)?.to_ascii_lowercase();
        ensure!(head.starts_with("http/1.1 200"), "{head}");
        let encoding = head
            .lines()
            .find_map(|l| l.strip_prefix("content-encoding:"))
            .map(|v| v.trim().to_owned())
            .unwrap_or_default();
        Ok((encoding, out.stdout))
    };
    let (none, plain) = answer(None)?;
    ensure!(none.is_empty(), "not asked, yet {none:?}");
    ensure!(plain.len() > 4096, "a large answer: {} bytes", plain.len());
    let (enc, zst) = answer(Some("zstd"))?;
    ensure!(enc == "zstd", "content-encoding {enc:?}");
    ensure!(
        zst.len() * 3 < plain.len(),
        "{} of {}",
        zst.len(),
        plain.len()
    );
    ensure!(zstd::stream::decode_all(&zst[..])? == plain);
    let (enc, gz) = answer(Some("gzip"))?;
    ensure!(enc == "gzip", "content-encoding {enc:?}");
    let mut inflated = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut inflated)?;
    ensure!(inflated == plain);
    Ok(())
}

#[test]
fn a_zstd_bomb_is_refused_within_the_memory_bounds() -> Result<()> {
    let kiln = Kiln::start(&["--max-decompressed-bytes", "8388608"])?;
    // 1 GiB of zeros in frames of 64 MiB: some 32 kB on the wire.
    let frame = zstd::stream::encode_all(&vec![0u8; 64 << 20][..], 3)?;
    let bomb: Vec<u8> = frame
        .iter()
        .copied()
        .cycle()
        .take(frame.len() * 16)
        .collect();
    ensure!(bomb.len() < 1 << 20, "{}", bomb.len());
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("bomb.zst");
    std::fs::File::create(&path)?.write_all(&bomb)?;
    for header in [Some("Content-Encoding: zstd"), None] {
        let mut c = curl();
        c.args(["-X", "POST", "-H", "X-Scope-OrgID: bomb"])
            .arg("--data-binary")
            .arg(format!("@{}", path.display()))
            .args(["-w", "\n%{http_code}"]);
        if let Some(h) = header {
            c.args(["-H", h]);
        }
        c.arg(kiln.url("/ingest?name=x&format=pprof"));
        let out = String::from_utf8(c.output()?.stdout)?;
        let (text, code) = out.rsplit_once('\n').context("a status")?;
        ensure!(code == "413", "{header:?}: {code} {text}");
        ensure!(text.contains("exceeds"), "{header:?}: {text}");
    }
    // gRPC: the message limit bounds what tonic inflates.
    let url = kiln.url("");
    let rt = tokio::runtime::Runtime::new()?;
    let status = rt.block_on(async move {
        let channel = tonic::transport::Channel::from_shared(url)?
            .connect()
            .await?;
        let mut pusher =
            PusherServiceClient::new(channel).send_compressed(CompressionEncoding::Zstd);
        let push = PushRequest {
            series: vec![RawProfileSeries {
                labels: vec![LabelPair {
                    name: "__name__".into(),
                    value: "process_cpu".into(),
                }],
                samples: vec![RawSample {
                    raw_profile: vec![0u8; 256 << 20].into(),
                    id: "1".into(),
                }],
                annotations: vec![],
            }],
        };
        Ok::<_, anyhow::Error>(pusher.push(with_tenant(push, "bomb")).await.unwrap_err())
    })?;
    ensure!(
        status.code() == tonic::Code::ResourceExhausted,
        "{status:?}"
    );
    let rss = kiln_e2e::status_kib(kiln.pid(), "VmHWM:");
    ensure!(
        rss < 512 * 1024,
        "kiln's peak RSS is {rss} KiB after the bombs"
    );
    kiln.assert_tenant_empty("bomb")?;
    ensure!(kiln.is_ready());
    Ok(())
}

/// The eBPF profiler's payload sent zstd over OTLP/gRPC and OTLP/HTTP reads back as the plain
/// one does.
#[test]
#[cfg_attr(not(kiln_corpus), ignore = "../shared/corpus is absent")]
fn otlp_takes_zstd_over_grpc_and_http() -> Result<()> {
    use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
    use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_client::ProfilesServiceClient;
    let dir = corpus_dir().context("../shared/corpus is absent")?;
    let bin = std::fs::read(dir.join("otlp/otel-ebpf-profile.pb.bin"))?;
    let kiln = Kiln::start(&[])?;

    let resp = kiln
        .http()
        .post(kiln.url("/v1development/profiles"))
        .header("X-Scope-OrgID", "otlp-plain")
        .header("Content-Type", "application/x-protobuf")
        .body(bin.clone())
        .send()?;
    ensure!(resp.status() == 200, "{}", resp.text()?);

    let tmp = tempfile::tempdir()?;
    let zst = tmp.path().join("export.pb.zst");
    std::fs::write(&zst, zstd::stream::encode_all(&bin[..], 3)?)?;
    let out = curl()
        .args(["-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
        .args(["-H", "X-Scope-OrgID: otlp-http-zstd"])
        .args(["-H", "Content-Type: application/x-protobuf"])
        .args(["-H", "Content-Encoding: zstd"])
        .arg("--data-binary")
        .arg(format!("@{}", zst.display()))
        .arg(kiln.url("/v1development/profiles"))
        .output()?;
    ensure!(
        out.stdout == b"200",
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    let req = <ExportProfilesServiceRequest as prost::Message>::decode(&bin[..])?;
    let url = kiln.url("");
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let mut client = ProfilesServiceClient::connect(url)
            .await?
            .send_compressed(CompressionEncoding::Zstd)
            .accept_compressed(CompressionEncoding::Zstd);
        client.export(with_tenant(req, "otlp-grpc-zstd")).await?;
        Ok::<_, anyhow::Error>(())
    })?;

    let plain = kiln.flamegraph("otlp-plain", CPU, "{}")?;
    ensure!(plain.total > 0);
    for tenant in ["otlp-http-zstd", "otlp-grpc-zstd"] {
        let fg = kiln.flamegraph(tenant, CPU, "{}")?;
        ensure!(
            fg == plain,
            "{tenant}: {} against {}",
            fg.total,
            plain.total
        );
    }
    kiln.assert_tenant_empty("otlp-nobody")?;
    Ok(())
}
