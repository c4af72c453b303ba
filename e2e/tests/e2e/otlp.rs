//! OTLP profiles end to end: the real eBPF profiler payload over gRPC, HTTP protobuf and HTTP
//! JSON; a Python OTLP sender with links, reference attributes and timestamps; a proto 1.9
//! payload; bad requests on both transports.

use std::collections::BTreeMap;
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use kiln_e2e::{ALL_TIME, Kiln, Tools, corpus_dir};
use kiln_proto::querier::v1 as q;
use kiln_proto::types::v1 as t;
use kiln_storage::query::tree::flamegraph_stacks;
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_client::ProfilesServiceClient;
use prost::Message;

fn export_grpc(
    kiln: &Kiln,
    tenant: &str,
    body: &[u8],
) -> Result<std::result::Result<(), tonic::Status>> {
    let req = ExportProfilesServiceRequest::decode(body)?;
    let url = kiln.url("");
    let tenant = tenant.to_owned();
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let mut client = ProfilesServiceClient::connect(url)
            .await?
            .send_compressed(tonic::codec::CompressionEncoding::Gzip);
        let mut r = tonic::Request::new(req);
        r.metadata_mut().insert("x-scope-orgid", tenant.parse()?);
        Ok(client.export(r).await.map(|_| ()))
    })
}

/// Raw gRPC call with an arbitrary (possibly broken) message body.
fn raw_grpc(kiln: &Kiln, tenant: Option<&str>, body: Vec<u8>) -> Result<tonic::Status> {
    raw_grpc_with(kiln, tenant, body, &[])
}

/// [`raw_grpc`] with more metadata.
fn raw_grpc_with(
    kiln: &Kiln,
    tenant: Option<&str>,
    body: Vec<u8>,
    metadata: &[(&'static str, &str)],
) -> Result<tonic::Status> {
    let url = kiln.url("");
    let tenant = tenant.map(str::to_owned);
    let metadata: Vec<(&'static str, String)> =
        metadata.iter().map(|(k, v)| (*k, v.to_string())).collect();
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let channel = tonic::transport::Channel::from_shared(url)?
            .connect()
            .await?;
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await?;
        let mut req = tonic::Request::new(bytes_msg::Raw(body));
        if let Some(t) = tenant {
            req.metadata_mut().insert("x-scope-orgid", t.parse()?);
        }
        for (k, v) in metadata {
            req.metadata_mut().insert(k, v.parse()?);
        }
        let path = http::uri::PathAndQuery::from_static(
            "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export",
        );
        match grpc
            .unary::<_, bytes_msg::Raw, _>(req, path, bytes_msg::RawCodec)
            .await
        {
            Ok(_) => Ok(tonic::Status::ok("")),
            Err(s) => Ok(s),
        }
    })
}

/// A codec that sends bytes as they are, for malformed gRPC messages.
mod bytes_msg {
    use bytes::{Buf, BufMut};
    use tonic::Status;
    use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

    #[derive(Debug, Clone, Default)]
    pub struct Raw(pub Vec<u8>);
    #[derive(Debug, Clone, Copy, Default)]
    pub struct RawCodec;
    pub struct Enc;
    pub struct Dec;

    impl Encoder for Enc {
        type Item = Raw;
        type Error = Status;
        fn encode(&mut self, item: Raw, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
            dst.put_slice(&item.0);
            Ok(())
        }
    }
    impl Decoder for Dec {
        type Item = Raw;
        type Error = Status;
        fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Raw>, Status> {
            let n = src.remaining();
            Ok(Some(Raw(src.copy_to_bytes(n).to_vec())))
        }
    }
    impl Codec for RawCodec {
        type Encode = Raw;
        type Decode = Raw;
        type Encoder = Enc;
        type Decoder = Dec;
        fn encoder(&mut self) -> Enc {
            Enc
        }
        fn decoder(&mut self) -> Dec {
            Dec
        }
    }
}

fn post_otlp(
    kiln: &Kiln,
    tenant: &str,
    content_type: &str,
    body: Vec<u8>,
) -> Result<(u16, String, Vec<u8>)> {
    post_otlp_with(kiln, tenant, content_type, body, &[])
}

/// [`post_otlp`] with more headers.
fn post_otlp_with(
    kiln: &Kiln,
    tenant: &str,
    content_type: &str,
    body: Vec<u8>,
    headers: &[(&str, &str)],
) -> Result<(u16, String, Vec<u8>)> {
    let mut req = kiln
        .http()
        .post(kiln.url("/v1development/profiles"))
        .header("X-Scope-OrgID", tenant)
        .header("Content-Type", content_type)
        .body(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send()?;
    let status = resp.status().as_u16();
    let ct = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    Ok((status, ct, resp.bytes()?.to_vec()))
}

/// Every (service, profile type) flame graph of a tenant.
fn all_flamegraphs(kiln: &Kiln, tenant: &str) -> Result<BTreeMap<(String, String), q::FlameGraph>> {
    let mut out = BTreeMap::new();
    let services: t::LabelValuesResponse = kiln.connect(
        tenant,
        "/querier.v1.QuerierService/LabelValues",
        &t::LabelValuesRequest {
            name: "service_name".into(),
            matchers: vec![],
            start: ALL_TIME.0,
            end: ALL_TIME.1,
        },
    )?;
    for pt in kiln.profile_types(tenant)? {
        for svc in &services.names {
            let fg = kiln.flamegraph(tenant, &pt.id, &format!("{{service_name={svc:?}}}"))?;
            if fg.total > 0 {
                out.insert((svc.clone(), pt.id.clone()), fg);
            }
        }
    }
    Ok(out)
}

/// The corpus payload (proto 1.10) written back in an older layout, tag bytes rewritten in
/// place as the Collector's pdata of that version writes the fields: `Sample` values 2,
/// attribute_indices 3, link_index 4 (1.8 and 1.9); for 1.8 also `Profile` profile_id 8,
/// dropped_attributes_count 9, original_payload_format 10, original_payload 11,
/// attribute_indices 12.
fn in_older_layout(body: &[u8], v1_8: bool) -> Vec<u8> {
    use kiln_proto::wire::{WireKind, fields};
    let mut out = body.to_vec();
    let within = |range: std::ops::Range<usize>, number: u32| {
        let base = range.start;
        fields(&body[range])
            .filter(move |f| f.number == number && f.kind == WireKind::Len)
            .map(move |f| (base + f.tag_at, base + f.value.start..base + f.value.end))
            .collect::<Vec<_>>()
    };
    let retag = |out: &mut Vec<u8>, at: usize, from: u32, to: &dyn Fn(u32) -> Option<u32>| {
        if let Some(n) = to(from) {
            out[at] = ((n << 3) as u8) | (out[at] & 7);
        }
    };
    for (_, resource) in within(0..body.len(), 1) {
        for (_, scope) in within(resource, 2) {
            for (_, profile) in within(scope, 2) {
                let base = profile.start;
                for f in fields(&body[profile.clone()]) {
                    let at = base + f.tag_at;
                    if f.number == 2 && f.kind == WireKind::Len {
                        let sample = base + f.value.start..base + f.value.end;
                        for g in fields(&body[sample.clone()]) {
                            let to = |n| match n {
                                2 => Some(3),
                                3 => Some(4),
                                4 => Some(2),
                                _ => None,
                            };
                            retag(&mut out, sample.start + g.tag_at, g.number, &to);
                        }
                    } else if v1_8 {
                        retag(&mut out, at, f.number, &|n| {
                            (7..=11).contains(&n).then_some(n + 1)
                        });
                    }
                }
            }
        }
    }
    out
}

/// Collectors v0.136–v0.147 send the OTLP profiles layouts before proto 1.10 (1.8, then 1.9):
/// the corpus payload in each is read exactly as the 1.10 original (over HTTP and gRPC), and the
/// 1.8 JSON names (`sample`, `line`) as 1.10's; another tenant sees nothing. (Decoded as 1.10, a
/// 1.9 body's values became attribute indices.)
#[test]
#[cfg_attr(not(kiln_corpus), ignore = "../shared/corpus is absent")]
fn older_otlp_layouts_are_read_as_they_were_meant() -> Result<()> {
    let dir = corpus_dir().context("../shared/corpus is absent")?;
    let bin = std::fs::read(dir.join("otlp/otel-ebpf-profile.pb.bin"))?;
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("otlp/otel-ebpf-profile.pb.json"))?)?;
    let v19 = in_older_layout(&bin, false);
    let v18 = in_older_layout(&bin, true);
    // (The corpus profiles carry none of Profile fields 7–12, so their 1.8 bytes equal their 1.9
    // bytes; the unit tests of `kiln_otel::otlp::layout` cover a 1.8 profile that has them.)
    ensure!(v19 != bin && v18.len() == bin.len());
    let kiln = Kiln::start(&[])?;
    let (status, _, body) = post_otlp(&kiln, "layout-110", "application/x-protobuf", bin)?;
    ensure!(status == 200, "{status} {}", String::from_utf8_lossy(&body));
    let want = all_flamegraphs(&kiln, "layout-110")?;
    ensure!(want.len() >= 2, "{:?}", want.keys());
    for (tenant, body) in [("layout-19", &v19), ("layout-18", &v18)] {
        let (status, _, answer) = post_otlp(&kiln, tenant, "application/x-protobuf", body.clone())?;
        ensure!(
            status == 200,
            "{tenant}: {status} {}",
            String::from_utf8_lossy(&answer)
        );
        ensure!(
            all_flamegraphs(&kiln, tenant)? == want,
            "{tenant} over HTTP differs"
        );
        let grpc = format!("{tenant}-grpc");
        let status = raw_grpc(&kiln, Some(&grpc), body.clone())?;
        ensure!(status.code() == tonic::Code::Ok, "{grpc}: {status:?}");
        ensure!(all_flamegraphs(&kiln, &grpc)? == want, "{grpc} differs");
    }
    // 1.8 JSON: `sample` and `line`.
    let renamed = serde_json::to_vec(&rename_keys(
        json,
        &[("samples", "sample"), ("lines", "line")],
    ))?;
    let (status, _, answer) = post_otlp(&kiln, "layout-18-json", "application/json", renamed)?;
    ensure!(
        status == 200,
        "{status} {}",
        String::from_utf8_lossy(&answer)
    );
    ensure!(
        all_flamegraphs(&kiln, "layout-18-json")? == want,
        "1.8 JSON differs"
    );
    kiln.assert_tenant_empty("layout-none")?;
    Ok(())
}

/// `v` with object keys renamed everywhere.
fn rename_keys(v: serde_json::Value, renames: &[(&str, &str)]) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| {
                    let k = renames
                        .iter()
                        .find(|(from, _)| *from == k)
                        .map_or(k.clone(), |(_, to)| (*to).to_owned());
                    (k, rename_keys(v, renames))
                })
                .collect(),
        ),
        Value::Array(items) => {
            Value::Array(items.into_iter().map(|x| rename_keys(x, renames)).collect())
        }
        other => other,
    }
}

/// The corpus' eBPF profiler payload: its JSON twin parses to the same message.
#[test]
#[cfg_attr(not(kiln_corpus), ignore = "../shared/corpus is absent")]
fn corpus_json_twin_matches_the_binary() -> Result<()> {
    let dir = corpus_dir()
        .context("../shared/corpus is absent")?
        .join("otlp");
    let bin = std::fs::read(dir.join("otel-ebpf-profile.pb.bin"))?;
    let json = std::fs::read(dir.join("otel-ebpf-profile.pb.json"))?;
    let from_bin = ExportProfilesServiceRequest::decode(bin.as_slice())?;
    let from_json = kiln_otel::otlp_json::parse_request(&json)?;
    ensure!(
        from_json == from_bin,
        "the JSON twin parses to another message"
    );
    Ok(())
}

#[test]
#[cfg_attr(not(kiln_corpus), ignore = "../shared/corpus is absent")]
fn ebpf_payload_is_identical_over_grpc_http_and_json() -> Result<()> {
    let dir = corpus_dir().context("../shared/corpus is absent")?;
    let bin = std::fs::read(dir.join("otlp/otel-ebpf-profile.pb.bin"))?;
    let json = std::fs::read(dir.join("otlp/otel-ebpf-profile.pb.json"))?;
    let kiln = Kiln::start(&[])?;
    export_grpc(&kiln, "ebpf-grpc", &bin)?.map_err(|s| anyhow::anyhow!("gRPC export: {s:?}"))?;
    let (status, ct, body) = post_otlp(&kiln, "ebpf-http", "application/x-protobuf", bin.clone())?;
    ensure!(status == 200, "{status} {}", String::from_utf8_lossy(&body));
    ensure!(ct == "application/x-protobuf");
    let (status, ct, body) = post_otlp(&kiln, "ebpf-json", "application/json", json)?;
    ensure!(status == 200, "{status} {}", String::from_utf8_lossy(&body));
    ensure!(ct == "application/json");

    let grpc = all_flamegraphs(&kiln, "ebpf-grpc")?;
    ensure!(
        grpc.len() >= 2,
        "services × types: {:?}",
        grpc.keys().collect::<Vec<_>>()
    );
    ensure!(
        grpc.keys()
            .any(|(_, ty)| ty == "process_cpu:cpu:nanoseconds:cpu:nanoseconds")
    );
    ensure!(
        grpc.keys()
            .any(|(_, ty)| ty == "off_cpu:off_cpu:nanoseconds::")
    );
    ensure!(
        grpc.keys()
            .any(|(svc, _)| svc.starts_with("unknown_service:")),
        "{:?}",
        grpc.keys()
    );
    ensure!(
        all_flamegraphs(&kiln, "ebpf-http")? == grpc,
        "HTTP protobuf differs from gRPC"
    );
    ensure!(
        all_flamegraphs(&kiln, "ebpf-json")? == grpc,
        "HTTP JSON differs from gRPC"
    );

    // The eBPF CPU profile counts timestamps at 20 Hz: 50 ms per sample.
    let (_, cpu) = grpc
        .iter()
        .find(|((_, ty), _)| ty.starts_with("process_cpu"))
        .context("a CPU flame graph")?;
    ensure!(cpu.total % 50_000_000 == 0, "cpu total {}", cpu.total);

    // thread.* stay per sample: not label names, but in the pprof samples.
    let names = kiln.label_names("ebpf-grpc")?;
    ensure!(
        !names.iter().any(|n| n.starts_with("thread.")),
        "{:?}",
        names
    );
    ensure!(
        names.iter().any(|n| n == "process.pid"),
        "resource attributes are labels: {:?}",
        names
    );
    let pprof: kiln_proto::google::v1::Profile = kiln.connect(
        "ebpf-grpc",
        "/querier.v1.QuerierService/SelectMergeProfile",
        &q::SelectMergeProfileRequest {
            profile_type_id: "off_cpu:off_cpu:nanoseconds::".into(),
            label_selector: "{}".into(),
            start: ALL_TIME.0,
            end: ALL_TIME.1,
            ..Default::default()
        },
    )?;
    let thread_key = pprof
        .string_table
        .iter()
        .position(|s| s == "thread.name")
        .context("thread.name label")?;
    ensure!(
        pprof
            .sample
            .iter()
            .any(|s| s.label.iter().any(|l| l.key == thread_key as i64))
    );

    // Samples keep their timestamps: the off-CPU profile spans several seconds of points.
    let series: q::SelectSeriesResponse = kiln.connect(
        "ebpf-grpc",
        "/querier.v1.QuerierService/SelectSeries",
        &q::SelectSeriesRequest {
            profile_type_id: "off_cpu:off_cpu:nanoseconds::".into(),
            label_selector: "{}".into(),
            start: 1_774_910_000_000,
            end: 1_774_911_000_000,
            step: 1.0,
            ..Default::default()
        },
    )?;
    ensure!(series.series.len() == 1);
    ensure!(
        series.series[0].points.len() >= 3,
        "points: {}",
        series.series[0].points.len()
    );
    kiln.assert_tenant_empty("ebpf-other")?;
    Ok(())
}

#[test]
fn python_otlp_sender_links_references_and_timestamps() -> Result<()> {
    let tools = Tools::find()?;
    let kiln = Kiln::start(&[])?;
    let script = kiln_e2e::repo_root().join("e2e/clients/python/otlp_sender.py");
    let out = Command::new(&tools.python)
        .arg(&script)
        .arg(format!("127.0.0.1:{}", kiln.port))
        .args(["otlp-grpc", "otlp-http"])
        .output()?;
    if !out.status.success() {
        bail!(
            "otlp_sender.py failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let sent: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    ensure!(sent["http_status"] == 200 && sent["http_content_type"] == "application/x-protobuf");
    ensure!(sent["grpc_partial_success"] == false && sent["http_partial_success"] == false);
    let pt = sent["profile_type"].as_str().unwrap();
    let svc = sent["service"].as_str().unwrap();
    let selector = format!("{{service_name={svc:?}}}");
    for tenant in ["otlp-grpc", "otlp-http"] {
        let fg = kiln.flamegraph(tenant, pt, &selector)?;
        ensure!(
            fg.total == sent["total"].as_i64().unwrap(),
            "{tenant}: total {}",
            fg.total
        );
        let stacks: BTreeMap<String, i64> = flamegraph_stacks(&fg)?
            .into_iter()
            .map(|(k, v)| (k.join(";"), v))
            .collect();
        let want: BTreeMap<String, i64> = sent["stacks"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_i64().unwrap()))
            .collect();
        ensure!(stacks == want, "{tenant}: {stacks:?} != {want:?}");

        for (span, total) in sent["spans"].as_object().unwrap() {
            let r: q::SelectMergeSpanProfileResponse = kiln.connect(
                tenant,
                "/querier.v1.QuerierService/SelectMergeSpanProfile",
                &q::SelectMergeSpanProfileRequest {
                    profile_type_id: pt.into(),
                    label_selector: selector.clone(),
                    span_selector: vec![span.clone()],
                    start: ALL_TIME.0,
                    end: ALL_TIME.1,
                    ..Default::default()
                },
            )?;
            ensure!(
                r.flamegraph.unwrap().total == total.as_i64().unwrap(),
                "{tenant}: span {span}"
            );
        }
        for (trace, total) in sent["traces"].as_object().unwrap() {
            let r: q::SelectMergeStacktracesResponse = kiln.connect(
                tenant,
                "/querier.v1.QuerierService/SelectMergeStacktraces",
                &q::SelectMergeStacktracesRequest {
                    profile_type_id: pt.into(),
                    label_selector: selector.clone(),
                    trace_id_selector: vec![trace.clone()],
                    start: ALL_TIME.0,
                    end: ALL_TIME.1,
                    ..Default::default()
                },
            )?;
            ensure!(
                r.flamegraph.unwrap().total == total.as_i64().unwrap(),
                "{tenant}: trace {trace}"
            );
        }
        // Resource attributes (one given by reference) and sample attributes are series labels.
        let series: q::SeriesResponse = kiln.connect(
            tenant,
            "/querier.v1.QuerierService/Series",
            &q::SeriesRequest {
                matchers: vec![selector.clone()],
                label_names: vec![],
                start: ALL_TIME.0,
                end: ALL_TIME.1,
            },
        )?;
        let labels: Vec<(String, String)> = series
            .labels_set
            .iter()
            .flat_map(|l| l.labels.iter().map(|p| (p.name.clone(), p.value.clone())))
            .collect();
        ensure!(
            labels.contains(&("deployment.environment".into(), "e2e".into())),
            "{labels:?}"
        );
        ensure!(labels.contains(&("region".into(), "eu-west".into())));
        ensure!(!labels.iter().any(|(k, _)| k == "thread.name"));

        // Timestamps are kept: points at the sample times, with span exemplars.
        let first = sent["first_ms"].as_i64().unwrap();
        let series: q::SelectSeriesResponse = kiln.connect(
            tenant,
            "/querier.v1.QuerierService/SelectSeries",
            &q::SelectSeriesRequest {
                profile_type_id: pt.into(),
                label_selector: selector.clone(),
                start: first,
                end: sent["last_ms"].as_i64().unwrap() + 1000,
                step: 1.0,
                exemplar_type: t::ExemplarType::Span as i32,
                ..Default::default()
            },
        )?;
        let points = &series.series[0].points;
        ensure!(
            points.len() == 7,
            "5 one-second steps of checkout, 2 of search: {}",
            points.len()
        );
        ensure!(points[0].timestamp == first);
        let spans: Vec<&str> = points
            .iter()
            .flat_map(|p| p.exemplars.iter().map(|e| e.span_id.as_str()))
            .collect();
        for span in sent["spans"].as_object().unwrap().keys() {
            ensure!(
                spans.contains(&span.as_str()),
                "exemplar of span {span} missing: {spans:?}"
            );
        }
    }
    kiln.assert_tenant_empty("otlp-other")?;
    Ok(())
}

/// An OTLP request whose one sample is laid out as proto 1.9 wrote it (values = 2, attribute
/// indices = 3, link index = 4), encoded by hand.
fn v19_request() -> Vec<u8> {
    use prost::encoding::{bytes, int32, int64};
    let mut sample = Vec::new();
    int32::encode(1, &1, &mut sample); // stack_index
    int64::encode_packed(2, &[100, 200], &mut sample); // values (1.9)
    int32::encode_packed(3, &[1], &mut sample); // attribute_indices (1.9)
    int32::encode(4, &0, &mut sample); // link_index (1.9)
    let mut value_type = Vec::new();
    int32::encode(1, &1, &mut value_type);
    int32::encode(2, &2, &mut value_type);
    let mut profile = Vec::new();
    bytes::encode(1, &value_type, &mut profile);
    bytes::encode(2, &sample, &mut profile);
    let mut scope = Vec::new();
    bytes::encode(2, &profile, &mut scope);
    let mut resource = Vec::new();
    bytes::encode(2, &scope, &mut resource);
    let mut req = Vec::new();
    bytes::encode(1, &resource, &mut req);
    bytes::encode(2, &v19_dictionary().encode_to_vec(), &mut req);
    req
}

/// The dictionary of [`v19_request`] (the same in 1.9 and 1.10).
fn v19_dictionary() -> opentelemetry_proto::tonic::profiles::v1development::ProfilesDictionary {
    opentelemetry_proto::tonic::profiles::v1development::ProfilesDictionary {
        string_table: vec![
            "".into(),
            "samples".into(),
            "count".into(),
            "main".into(),
            "k".into(),
        ],
        function_table: vec![
            Default::default(),
            opentelemetry_proto::tonic::profiles::v1development::Function {
                name_strindex: 3,
                ..Default::default()
            },
        ],
        location_table: vec![
            Default::default(),
            opentelemetry_proto::tonic::profiles::v1development::Location {
                lines: vec![opentelemetry_proto::tonic::profiles::v1development::Line {
                    function_index: 1,
                    line: 1,
                    column: 0,
                }],
                ..Default::default()
            },
        ],
        stack_table: vec![
            Default::default(),
            opentelemetry_proto::tonic::profiles::v1development::Stack {
                location_indices: vec![1],
            },
        ],
        attribute_table: vec![Default::default(), Default::default()],
        ..Default::default()
    }
}

/// A hand-encoded 1.9 body (what Collectors v0.140–v0.147 send) is read as it was meant: the
/// same flame graphs as its 1.10 twin, over HTTP and gRPC. (Read as 1.10, its values were
/// attribute indices, and it was refused.)
#[test]
fn proto_1_9_payload_is_read_as_it_was_meant() -> Result<()> {
    use opentelemetry_proto::tonic::profiles::v1development as otlp;
    let kiln = Kiln::start(&[])?;
    let body = v19_request();
    // Its 1.10 twin, built from 1.10's messages.
    let twin = ExportProfilesServiceRequest {
        resource_profiles: vec![otlp::ResourceProfiles {
            scope_profiles: vec![otlp::ScopeProfiles {
                profiles: vec![otlp::Profile {
                    sample_type: Some(otlp::ValueType {
                        type_strindex: 1,
                        unit_strindex: 2,
                    }),
                    samples: vec![otlp::Sample {
                        stack_index: 1,
                        values: vec![100, 200],
                        attribute_indices: vec![1],
                        link_index: 0,
                        timestamps_unix_nano: vec![],
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
        dictionary: Some(v19_dictionary()),
    };
    let (status, _, text) = post_otlp(
        &kiln,
        "v110",
        "application/x-protobuf",
        twin.encode_to_vec(),
    )?;
    ensure!(status == 200, "{status} {}", String::from_utf8_lossy(&text));
    let want = all_flamegraphs(&kiln, "v110")?;
    let total: i64 = want.values().map(|f| f.total).sum();
    ensure!(total == 300, "the 1.10 twin's total {total}");
    let (status, _, text) = post_otlp(&kiln, "v19", "application/x-protobuf", body.clone())?;
    ensure!(status == 200, "{status} {}", String::from_utf8_lossy(&text));
    ensure!(
        all_flamegraphs(&kiln, "v19")? == want,
        "1.9 over HTTP differs"
    );
    let status = raw_grpc(&kiln, Some("v19-grpc"), body)?;
    ensure!(status.code() == tonic::Code::Ok, "{status:?}");
    ensure!(
        all_flamegraphs(&kiln, "v19-grpc")? == want,
        "1.9 over gRPC differs"
    );
    kiln.assert_tenant_empty("v19-other")?;
    Ok(())
}

/// A valid request: one profile of `samples/count` with one sample of 3 on an empty stack.
fn small_request() -> ExportProfilesServiceRequest {
    let d = opentelemetry_proto::tonic::profiles::v1development::ProfilesDictionary {
        string_table: vec!["".into(), "samples".into(), "count".into()],
        stack_table: vec![Default::default(), Default::default()],
        ..Default::default()
    };
    let mut req = ExportProfilesServiceRequest {
        dictionary: Some(d),
        ..Default::default()
    };
    req.resource_profiles.push(Default::default());
    req.resource_profiles[0]
        .scope_profiles
        .push(Default::default());
    req.resource_profiles[0].scope_profiles[0].profiles.push(
        opentelemetry_proto::tonic::profiles::v1development::Profile {
            sample_type: Some(
                opentelemetry_proto::tonic::profiles::v1development::ValueType {
                    type_strindex: 1,
                    unit_strindex: 2,
                },
            ),
            samples: vec![
                opentelemetry_proto::tonic::profiles::v1development::Sample {
                    stack_index: 1,
                    values: vec![3],
                    ..Default::default()
                },
            ],
            ..Default::default()
        },
    );
    req
}

#[test]
fn bad_otlp_requests_get_the_right_codes() -> Result<()> {
    let kiln = Kiln::start(&[
        "--max-body-bytes",
        "65536",
        "--max-decompressed-bytes",
        "131072",
    ])?;
    let good = small_request();
    let mut bad_index = good.clone();
    bad_index.resource_profiles[0].scope_profiles[0].profiles[0].samples[0].stack_index = 7;
    let good = good.encode_to_vec();
    let bad_index = bad_index.encode_to_vec();
    let truncated = good[..good.len() - 3].to_vec();
    let big = vec![0x0a; 200_000];

    // HTTP
    let cases: Vec<(&str, &str, Vec<u8>, u16, &str)> = vec![
        (
            "wrong content type",
            "text/plain",
            good.clone(),
            415,
            "content type",
        ),
        (
            "truncated",
            "application/x-protobuf",
            truncated.clone(),
            400,
            "invalid OTLP profiles protobuf",
        ),
        (
            "bad index",
            "application/x-protobuf",
            bad_index.clone(),
            400,
            "stack_index is 7",
        ),
        (
            "bad JSON",
            "application/json",
            b"{\"resourceProfiles\": 3}".to_vec(),
            400,
            "resourceProfiles",
        ),
        (
            "oversized",
            "application/x-protobuf",
            big.clone(),
            413,
            "exceeds",
        ),
    ];
    for (what, ct, body, want, needle) in cases {
        let (status, _, text) = post_otlp(&kiln, "bad-otlp", ct, body)?;
        let text = String::from_utf8_lossy(&text).to_string();
        ensure!(status == want, "{what}: {status} {text}");
        ensure!(text.contains(needle), "{what}: {text}");
        ensure!(kiln.is_ready());
    }
    // gRPC
    let cases: Vec<(&str, Option<&str>, Vec<u8>, tonic::Code, &str)> = vec![
        (
            "truncated",
            Some("bad-otlp"),
            truncated,
            tonic::Code::InvalidArgument,
            "invalid OTLP profiles protobuf",
        ),
        (
            "bad index",
            Some("bad-otlp"),
            bad_index,
            tonic::Code::InvalidArgument,
            "stack_index is 7",
        ),
        (
            "oversized",
            Some("bad-otlp"),
            big,
            tonic::Code::ResourceExhausted,
            "limit",
        ),
        (
            "no tenant",
            None,
            good.clone(),
            tonic::Code::Unauthenticated,
            "X-Scope-OrgID",
        ),
    ];
    for (what, tenant, body, want, needle) in cases {
        let status = raw_grpc(&kiln, tenant, body)?;
        ensure!(status.code() == want, "{what}: {status:?}");
        ensure!(status.message().contains(needle), "{what}: {status:?}");
        ensure!(kiln.is_ready());
    }
    kiln.assert_tenant_empty("bad-otlp")?;
    // And a good request still works after all that.
    let status = raw_grpc(&kiln, Some("bad-otlp"), good)?;
    ensure!(status.code() == tonic::Code::Ok, "{status:?}");
    ensure!(
        kiln.flamegraph("bad-otlp", "samples:samples:count::", "{}")?
            .total
            == 3
    );
    Ok(())
}

/// `OTLP-Profiles-Development-Version` (opentelemetry-proto #857): absent or 1 is accepted, any
/// other version is refused on both transports and nothing of it is stored.
#[test]
fn profiles_development_version_is_checked() -> Result<()> {
    let kiln = Kiln::start(&[])?;
    let body = small_request().encode_to_vec();
    let header = "OTLP-Profiles-Development-Version";
    for version in [None, Some("1"), Some(" 1 ")] {
        let headers: Vec<(&str, &str)> = version.map(|v| (header, v)).into_iter().collect();
        let (status, _, text) = post_otlp_with(
            &kiln,
            "version-ok",
            "application/x-protobuf",
            body.clone(),
            &headers,
        )?;
        ensure!(
            status == 200,
            "{version:?}: {status} {}",
            String::from_utf8_lossy(&text)
        );
        let metadata: Vec<(&'static str, &str)> = version
            .map(|v| ("otlp-profiles-development-version", v.trim()))
            .into_iter()
            .collect();
        let status = raw_grpc_with(&kiln, Some("version-ok"), body.clone(), &metadata)?;
        ensure!(status.code() == tonic::Code::Ok, "{version:?}: {status:?}");
    }
    ensure!(
        kiln.flamegraph("version-ok", "samples:samples:count::", "{}")?
            .total
            == 6 * 3
    );

    for version in ["2", "0", "v1", ""] {
        let (status, _, text) = post_otlp_with(
            &kiln,
            "version-refused",
            "application/x-protobuf",
            body.clone(),
            &[(header, version)],
        )?;
        let text = String::from_utf8_lossy(&text).to_string();
        ensure!(status == 400, "{version:?}: {status} {text}");
        ensure!(
            text.contains("OTLP-Profiles-Development-Version") && text.contains("version 1"),
            "{version:?}: {text}"
        );
        let status = raw_grpc_with(
            &kiln,
            Some("version-refused"),
            body.clone(),
            &[("otlp-profiles-development-version", version)],
        )?;
        ensure!(
            status.code() == tonic::Code::InvalidArgument,
            "{version:?}: {status:?}"
        );
        ensure!(
            status
                .message()
                .contains("OTLP-Profiles-Development-Version"),
            "{version:?}: {status:?}"
        );
    }
    kiln.assert_tenant_empty("version-refused")?;
    Ok(())
}
