//! Grafana, without a Grafana server: the plugin binary started exactly as Grafana starts it
//! (environment, handshake line, gRPC), `QueryData`/`CheckHealth`/`CallResource` against a
//! running Kiln with real data, frames decoded from Arrow IPC and checked against Kiln's own
//! answers; and the built-in Pyroscope datasource's calls replayed as Connect binary protobuf.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result, ensure};
use arrow::array::AsArray;
use arrow::datatypes::{Float64Type, Int64Type, TimestampNanosecondType};
use kiln_e2e::{Kiln, plugin_bin};
use kiln_proto::pluginv2 as pb;
use kiln_proto::querier::v1 as q;
use kiln_proto::types::v1 as t;
use prost::Message;

use crate::auth::{bearer, hs256_token, make_keys, start_jwt};

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
const FROM_MS: i64 = 1_700_000_000_000;
const TO_MS: i64 = 1_700_000_600_000;

/// Where the plugin's flame graph frame is written for the headless-Chromium render test.
pub fn frame_out() -> std::path::PathBuf {
    kiln_e2e::kiln_bin().with_file_name("grafana-flamegraph-frame.json")
}

struct Plugin {
    child: Child,
    addr: String,
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the plugin as Grafana does: explicit environment, stdout handshake line.
fn start_plugin() -> Result<Plugin> {
    let mut child = Command::new(plugin_bin())
        .env_clear()
        .env("grafana_plugin_type", "datasource")
        .env("PLUGIN_PROTOCOL_VERSIONS", "2")
        .env("PLUGIN_MIN_PORT", "10000")
        .env("PLUGIN_MAX_PORT", "25000")
        .env("GF_VERSION", "12.0.2")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", plugin_bin().display()))?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
    let parts: Vec<&str> = line.trim().split('|').collect();
    ensure!(
        parts.len() == 5
            && parts[0] == "1"
            && parts[1] == "2"
            && parts[2] == "tcp"
            && parts[4] == "grpc",
        "bad handshake {line:?}"
    );
    Ok(Plugin {
        child,
        addr: format!("http://{}", parts[3]),
    })
}

fn context(url: &str, token: &str, tenant: Option<&str>) -> pb::PluginContext {
    let json = match tenant {
        Some(t) => serde_json::json!({ "url": url, "tenant": t }),
        None => serde_json::json!({ "url": url }),
    };
    pb::PluginContext {
        org_id: 1,
        plugin_id: "kiln-profiles-datasource".into(),
        data_source_instance_settings: Some(pb::DataSourceInstanceSettings {
            id: 1,
            uid: "kiln".into(),
            name: "Kiln".into(),
            json_data: json.to_string().into_bytes(),
            decrypted_secure_json_data: [("token".to_string(), token.to_string())].into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn query(ref_id: &str, json: serde_json::Value) -> pb::DataQuery {
    pb::DataQuery {
        ref_id: ref_id.into(),
        max_data_points: 1000,
        interval_ms: 60_000,
        time_range: Some(pb::TimeRange {
            from_epoch_ms: FROM_MS,
            to_epoch_ms: TO_MS,
        }),
        json: json.to_string().into_bytes(),
        query_type: String::new(),
    }
}

struct Frame {
    name: String,
    meta: String,
    batch: arrow::array::RecordBatch,
}

fn decode(bytes: &[u8]) -> Result<Frame> {
    let reader =
        arrow::ipc::reader::FileReader::try_new(std::io::Cursor::new(bytes.to_vec()), None)?;
    let schema = reader.schema();
    let md = schema.metadata().clone();
    let batches: Vec<_> = reader.collect::<std::result::Result<_, _>>()?;
    let batch = arrow::compute::concat_batches(&schema, &batches)?;
    Ok(Frame {
        name: md.get("name").cloned().unwrap_or_default(),
        meta: md.get("meta").cloned().unwrap_or_default(),
        batch,
    })
}

fn pprof_with_spans() -> Vec<u8> {
    use kiln_proto::google::v1 as p;
    p::Profile {
        string_table: [
            "",
            "cpu",
            "nanoseconds",
            "main",
            "graf_checkout",
            "graf_search",
            "span_id",
            "00000000000000c1",
            "/app/checkout",
        ]
        .map(String::from)
        .to_vec(),
        sample_type: vec![p::ValueType { r#type: 1, unit: 2 }],
        period_type: Some(p::ValueType { r#type: 1, unit: 2 }),
        function: (1..=3)
            .map(|i| p::Function {
                id: i,
                name: 2 + i as i64,
                ..Default::default()
            })
            .collect(),
        mapping: vec![p::Mapping {
            id: 1,
            filename: 8,
            has_functions: true,
            ..Default::default()
        }],
        location: (1..=3)
            .map(|i| p::Location {
                id: i,
                mapping_id: 1,
                line: vec![p::Line {
                    function_id: i,
                    line: 1,
                }],
                ..Default::default()
            })
            .collect(),
        sample: vec![
            p::Sample {
                location_id: vec![2, 1],
                value: vec![30_000_000],
                label: vec![p::Label {
                    key: 6,
                    str: 7,
                    ..Default::default()
                }],
            },
            p::Sample {
                location_id: vec![3, 1],
                value: vec![50_000_000],
                label: vec![],
            },
        ],
        time_nanos: FROM_MS * 1_000_000 + 60_000_000_000,
        ..Default::default()
    }
    .encode_to_vec()
}

/// Kiln with data for tenant `graf-a` (two services, a span) and `graf-b`.
fn kiln_with_data() -> Result<(Kiln, crate::auth::Keys)> {
    let keys = make_keys()?;
    let mut kiln = start_jwt(&keys)?;
    let a = hs256_token(&keys, "graf-a", &["read", "write"])?;
    kiln.set_auth(bearer(&a));
    let (s, b) = kiln.ingest(
        "graf-a",
        "name=checkout-svc%7Benv%3Dprod%7D&format=pprof",
        pprof_with_spans(),
        &[],
    )?;
    ensure!(s == 200, "{s} {b}");
    let (s, b) = kiln.ingest(
        "graf-a",
        &format!(
            "name=search-svc.cpu%7Benv%3Dstaging%7D&from={}",
            FROM_MS / 1000 + 300
        ),
        b"main;graf_index 4\n".to_vec(),
        &[],
    )?;
    ensure!(s == 200, "{s} {b}");
    let b_token = hs256_token(&keys, "graf-b", &["read", "write"])?;
    kiln.set_auth(bearer(&b_token));
    let (s, b) = kiln.ingest(
        "graf-b",
        &format!("name=b-only.cpu&from={}", FROM_MS / 1000 + 60),
        b"main;graf_b_secret 9\n".to_vec(),
        &[],
    )?;
    ensure!(s == 200, "{s} {b}");
    kiln.set_auth(bearer(&a));
    Ok((kiln, keys))
}

/// The nodes of a flame graph, checked by the shared decoder.
fn nodes_of(fg: &q::FlameGraph) -> Result<usize> {
    Ok(kiln_proto::flamegraph::decode(fg)?.len())
}

#[test]
fn plugin_answers_grafana_like_kiln_does() -> Result<()> {
    let (kiln, keys) = kiln_with_data()?;
    let a = hs256_token(&keys, "graf-a", &["read"])?;
    let b = hs256_token(&keys, "graf-b", &["read"])?;
    let ab = crate::auth::kiln_token(
        &keys.private("hs1.secret"),
        "graf-a",
        "read",
        &[
            "--read-tenants",
            "graf-b",
            "--issuer",
            crate::auth::ISS,
            "--audience",
            crate::auth::AUD,
        ],
    )?;
    let plugin = start_plugin()?;
    let url = kiln.url("");
    let rt = tokio::runtime::Runtime::new()?;
    let addr = plugin.addr.clone();

    // Kiln's own answers, to compare with.
    let kiln_fg: q::SelectMergeStacktracesResponse = kiln.connect(
        "graf-a",
        "/querier.v1.QuerierService/SelectMergeStacktraces",
        &q::SelectMergeStacktracesRequest {
            profile_type_id: CPU.into(),
            label_selector: "{}".into(),
            start: FROM_MS,
            end: TO_MS,
            ..Default::default()
        },
    )?;
    let kiln_fg = kiln_fg.flamegraph.context("kiln flame graph")?;
    let kiln_series: q::SelectSeriesResponse = kiln.connect(
        "graf-a",
        "/querier.v1.QuerierService/SelectSeries",
        &q::SelectSeriesRequest {
            profile_type_id: CPU.into(),
            label_selector: "{}".into(),
            start: FROM_MS,
            end: TO_MS,
            step: 60.0,
            group_by: vec!["service_name".into()],
            ..Default::default()
        },
    )?;

    rt.block_on(async move {
        let channel = tonic::transport::Channel::from_shared(addr)?.connect().await?;
        let mut data = pb::data_client::DataClient::new(channel.clone());
        let mut diag = pb::diagnostics_client::DiagnosticsClient::new(channel.clone());
        let res = pb::resource_client::ResourceClient::new(channel);

        let resp = data
            .query_data(pb::QueryDataRequest {
                plugin_context: Some(context(&url, &a, None)),
                queries: vec![
                    query("P", serde_json::json!({ "queryType": "profile", "profileTypeId": CPU, "labelSelector": "{}", "maxNodes": 1000 })),
                    query("M", serde_json::json!({ "queryType": "metrics", "profileTypeId": CPU, "labelSelector": "{}", "groupBy": ["service_name"] })),
                    query("B", serde_json::json!({ "queryType": "both", "profileTypeId": CPU, "labelSelector": "{service_name=\"checkout-svc\"}" })),
                    query("S", serde_json::json!({ "queryType": "profile", "profileTypeId": CPU, "labelSelector": "{}", "spanSelector": ["00000000000000c1"] })),
                    query("X", serde_json::json!({ "queryType": "profile", "profileTypeId": "" })),
                ],
                ..Default::default()
            })
            .await?
            .into_inner();

        // profile: one nested-set frame with Kiln's totals and node count.
        let p = &resp.responses["P"];
        ensure!(p.status == 200 && p.error.is_empty(), "{p:?}");
        ensure!(p.frames.len() == 1);
        let f = decode(&p.frames[0])?;
        ensure!(f.name == "response" && f.meta.contains("\"preferredVisualisationType\":\"flamegraph\""), "{} {}", f.name, f.meta);
        let schema = f.batch.schema();
        let names: Vec<&str> = schema.fields().iter().map(|x| x.name().as_str()).collect();
        ensure!(names == ["level", "value", "self", "label"], "{names:?}");
        ensure!(schema.field(1).metadata()["config"].contains("\"unit\":\"ns\""));
        let level = f.batch.column(0).as_primitive::<Int64Type>();
        let value = f.batch.column(1).as_primitive::<Int64Type>();
        let self_ = f.batch.column(2).as_primitive::<Int64Type>();
        let label = f.batch.column(3).as_string::<i32>();
        let kiln_nodes = nodes_of(&kiln_fg)?;
        ensure!(f.batch.num_rows() == kiln_nodes, "{} rows, Kiln has {kiln_nodes} nodes", f.batch.num_rows());
        ensure!(level.value(0) == 0 && label.value(0) == "total" && value.value(0) == kiln_fg.total);
        ensure!(kiln_fg.total == 80_000_000 + 40_000_000);
        let self_sum: i64 = (0..f.batch.num_rows()).map(|i| self_.value(i)).sum();
        ensure!(self_sum == kiln_fg.total, "self values add up to the total");
        let labels: BTreeSet<&str> = (0..f.batch.num_rows()).map(|i| label.value(i)).collect();
        let kiln_names: BTreeSet<&str> = kiln_fg.names.iter().map(String::as_str).collect();
        ensure!(labels == kiln_names, "{labels:?} vs {kiln_names:?}");
        // Depth-first: every row's level is at most one deeper than the row before.
        ensure!((1..f.batch.num_rows()).all(|i| level.value(i) <= level.value(i - 1) + 1));
        // Hand the frame to the browser test (scripts/test.sh renders it with @grafana/flamegraph).
        let rows = 0..f.batch.num_rows();
        let frame_json = serde_json::json!({ "fields": [
            { "name": "level", "values": rows.clone().map(|i| level.value(i)).collect::<Vec<_>>() },
            { "name": "value", "values": rows.clone().map(|i| value.value(i)).collect::<Vec<_>>(), "unit": "ns" },
            { "name": "self", "values": rows.clone().map(|i| self_.value(i)).collect::<Vec<_>>() },
            { "name": "label", "values": rows.map(|i| label.value(i)).collect::<Vec<_>>() },
        ]});
        std::fs::write(frame_out(), serde_json::to_vec_pretty(&frame_json)?)?;

        // metrics: one frame per series, same points as Kiln's SelectSeries.
        let m = &resp.responses["M"];
        ensure!(m.status == 200 && m.frames.len() == kiln_series.series.len() && m.frames.len() == 2, "{m:?}");
        let mut got: BTreeMap<String, Vec<(i64, f64)>> = BTreeMap::new();
        for bytes in &m.frames {
            let f = decode(bytes)?;
            ensure!(f.name == "series" && f.meta.contains("graph"));
            let schema = f.batch.schema();
            ensure!(schema.field(0).name() == "time" && schema.field(1).name() == "cpu");
            let labels: serde_json::Value = serde_json::from_str(&schema.field(1).metadata()["labels"])?;
            let times = f.batch.column(0).as_primitive::<TimestampNanosecondType>();
            let values = f.batch.column(1).as_primitive::<Float64Type>();
            got.insert(
                labels["service_name"].as_str().unwrap_or_default().to_owned(),
                (0..f.batch.num_rows()).map(|i| (times.value(i) / 1_000_000, values.value(i))).collect(),
            );
        }
        for s in &kiln_series.series {
            let svc = &s.labels.iter().find(|l| l.name == "service_name").unwrap().value;
            let want: Vec<(i64, f64)> = s.points.iter().map(|p| (p.timestamp, p.value)).collect();
            ensure!(got.get(svc) == Some(&want), "{svc}: {:?} vs {want:?}", got.get(svc));
        }

        // both: a series frame and a flame graph frame of the selected service only.
        let both = &resp.responses["B"];
        ensure!(both.status == 200 && both.frames.len() == 2, "{both:?}");
        let fg = decode(&both.frames[1])?;
        ensure!(fg.batch.column(1).as_primitive::<Int64Type>().value(0) == 80_000_000);

        // span selector: only the span's samples.
        let s = &resp.responses["S"];
        let f = decode(&s.frames[0])?;
        let labels = f.batch.column(3).as_string::<i32>();
        ensure!(f.batch.column(1).as_primitive::<Int64Type>().value(0) == 30_000_000);
        ensure!((0..f.batch.num_rows()).any(|i| labels.value(i) == "graf_checkout"));
        ensure!(!(0..f.batch.num_rows()).any(|i| labels.value(i) == "graf_search"));

        // A query without a profile type is refused clearly.
        let x = &resp.responses["X"];
        ensure!(x.status == 400 && x.error.contains("profile type"), "{x:?}");

        // Another tenant's token: none of graf-a's data.
        let other = data
            .query_data(pb::QueryDataRequest {
                plugin_context: Some(context(&url, &b, None)),
                queries: vec![query("P", serde_json::json!({ "queryType": "profile", "profileTypeId": CPU }))],
                ..Default::default()
            })
            .await?
            .into_inner();
        let f = decode(&other.responses["P"].frames[0])?;
        let labels = f.batch.column(3).as_string::<i32>();
        let seen: BTreeSet<&str> = (0..f.batch.num_rows()).map(|i| labels.value(i)).collect();
        ensure!(seen.contains("graf_b_secret") && !seen.contains("graf_checkout") && !seen.contains("graf_index"), "{seen:?}");

        // A query naming two tenants reads both as one; grouped by `__tenant__`, apart. A token
        // of graf-a alone gets 403 naming graf-b.
        let across = |token: String| {
            let mut data = data.clone();
            let url = url.clone();
            async move {
                let queries = vec![
                    query("P", serde_json::json!({ "queryType": "profile", "profileTypeId": CPU, "tenants": ["graf-a", "graf-b"] })),
                    query("M", serde_json::json!({ "queryType": "metrics", "profileTypeId": CPU, "groupBy": ["__tenant__"], "tenants": ["graf-a", "graf-b"] })),
                ];
                let r = data
                    .query_data(pb::QueryDataRequest { plugin_context: Some(context(&url, &token, None)), queries, ..Default::default() })
                    .await?
                    .into_inner();
                Ok::<_, anyhow::Error>(r)
            }
        };
        let r = across(ab).await?;
        let p = &r.responses["P"];
        ensure!(p.status == 200, "{p:?}");
        let f = decode(&p.frames[0])?;
        ensure!(f.batch.column(1).as_primitive::<Int64Type>().value(0) == kiln_fg.total + 90_000_000);
        let m = &r.responses["M"];
        let mut tenants = BTreeSet::new();
        for bytes in &m.frames {
            let f = decode(bytes)?;
            let labels: serde_json::Value = serde_json::from_str(&f.batch.schema().field(1).metadata()["labels"])?;
            tenants.insert(labels["__tenant__"].as_str().unwrap_or_default().to_owned());
        }
        ensure!(tenants == BTreeSet::from(["graf-a".to_owned(), "graf-b".to_owned()]), "{tenants:?}");
        let r = across(a.clone()).await?;
        let p = &r.responses["P"];
        ensure!(p.status == 403 && p.error.contains("graf-b"), "{p:?}");

        // CheckHealth: good, bad URL, bad token, wrong tenant.
        let health = |ctx: pb::PluginContext| {
            let mut diag = diag.clone();
            async move {
                let r = diag.check_health(pb::CheckHealthRequest { plugin_context: Some(ctx), ..Default::default() }).await?.into_inner();
                Ok::<_, anyhow::Error>((r.status, r.message))
            }
        };
        let (status, msg) = health(context(&url, &a, None)).await?;
        ensure!(status == 1 && msg.contains("reachable"), "{status} {msg}");
        let dead = format!("http://127.0.0.1:{}", kiln_e2e::free_port());
        let (status, msg) = health(context(&dead, &a, None)).await?;
        ensure!(status == 2 && msg.contains("cannot reach Kiln"), "{msg}");
        let (status, msg) = health(context(&url, "not-a-token", None)).await?;
        ensure!(status == 2 && msg.contains("401"), "{msg}");
        let (status, msg) = health(context(&url, &a, Some("graf-b"))).await?;
        ensure!(status == 2 && msg.contains("403") && msg.contains("graf-b"), "{msg}");
        let metrics = diag.collect_metrics(pb::CollectMetricsRequest::default()).await?.into_inner();
        let text = String::from_utf8(metrics.metrics.context("metrics")?.prometheus)?;
        ensure!(text.contains("kiln_plugin_health_checks_total 4"), "{text}");

        // CallResource: every path, compared with Kiln.
        let call = |path: &str, url_q: &str, ctx: pb::PluginContext| {
            let mut res = res.clone();
            let (path, url_q) = (path.to_owned(), url_q.to_owned());
            async move {
                let mut stream = res
                    .call_resource(pb::CallResourceRequest { plugin_context: Some(ctx), path: path.clone(), method: "GET".into(), url: format!("{path}?{url_q}"), ..Default::default() })
                    .await?
                    .into_inner();
                let first = stream.message().await?.context("a response")?;
                Ok::<_, anyhow::Error>((first.code, serde_json::from_slice::<serde_json::Value>(&first.body)?))
            }
        };
        let range = format!("start={FROM_MS}&end={TO_MS}");
        let (code, types) = call("profileTypes", &range, context(&url, &a, None)).await?;
        ensure!(code == 200 && types[0]["id"] == CPU && types[0]["sampleType"] == "cpu", "{types}");
        let (code, names) = call("labelNames", &format!("{range}&matchers=%7B%7D"), context(&url, &a, None)).await?;
        ensure!(code == 200 && names.as_array().unwrap().iter().any(|n| n == "env"), "{names}");
        let (code, values) = call("labelValues", &format!("label=service_name&{range}"), context(&url, &a, None)).await?;
        ensure!(code == 200 && values == serde_json::json!(["checkout-svc", "search-svc"]), "{values}");
        let (code, values) = call("labelValues", &format!("label=env&matchers=%7Bservice_name%3D%22search-svc%22%7D&{range}"), context(&url, &a, None)).await?;
        ensure!(code == 200 && values == serde_json::json!(["staging"]), "{values}");
        let (code, values) = call("labelValues", &format!("label=service_name&{range}"), context(&url, &b, None)).await?;
        ensure!(code == 200 && values == serde_json::json!(["b-only"]), "tenant wall: {values}");
        let (code, body) = call("nope", "", context(&url, &a, None)).await?;
        ensure!(code == 404 && body["message"].as_str().unwrap().contains("profileTypes"), "{body}");
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(())
}

/// Grafana's built-in "Grafana Pyroscope" datasource, replayed: connect-go requests with binary
/// protobuf bodies, `Connect-Protocol-Version: 1`, gzip accepted, basic auth (user = tenant,
/// password = token), in the order its editor, health check and panels make them.
#[test]
fn builtin_pyroscope_datasource_calls() -> Result<()> {
    let (mut kiln, keys) = kiln_with_data()?;
    let token = hs256_token(&keys, "graf-a", &["read"])?;
    let b_token = hs256_token(&keys, "graf-b", &["read"])?;
    let post_as = |tenant: &str,
                   token: &str,
                   method: &str,
                   body: Vec<u8>|
     -> Result<(u16, String, Vec<u8>)> {
        let auth = format!(
            "Basic {}",
            crate::auth::b64std(format!("{tenant}:{token}").as_bytes())
        );
        let r = kiln
            .http()
            .post(kiln.url(&format!("/querier.v1.QuerierService/{method}")))
            .header("Content-Type", "application/proto")
            .header("Connect-Protocol-Version", "1")
            .header("Accept-Encoding", "gzip")
            .header("User-Agent", "connect-go/1.18.1 (go1.24.2)")
            .header("Authorization", auth)
            .body(body)
            .send()?;
        let status = r.status().as_u16();
        let ct = r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        Ok((status, ct, r.bytes()?.to_vec()))
    };
    let post = |method: &str, body: Vec<u8>| post_as("graf-a", &token, method, body);
    // Save & test: ProfileTypes.
    let (s, ct, body) = post(
        "ProfileTypes",
        q::ProfileTypesRequest {
            start: FROM_MS,
            end: TO_MS,
        }
        .encode_to_vec(),
    )?;
    ensure!(s == 200 && ct == "application/proto");
    let types = q::ProfileTypesResponse::decode(body.as_slice())?.profile_types;
    ensure!(types.len() == 1);
    let ty = &types[0];
    ensure!(
        ty.id == CPU
            && ty.name == "process_cpu"
            && ty.sample_type == "cpu"
            && ty.sample_unit == "nanoseconds"
            && ty.period_type == "cpu"
            && ty.period_unit == "nanoseconds",
        "{ty:?}"
    );
    // Label pickers.
    let (_, _, body) = post(
        "LabelNames",
        t::LabelNamesRequest {
            matchers: vec!["{}".into()],
            start: FROM_MS,
            end: TO_MS,
        }
        .encode_to_vec(),
    )?;
    let names = t::LabelNamesResponse::decode(body.as_slice())?.names;
    for n in ["__name__", "env", "service_name"] {
        ensure!(names.iter().any(|x| x == n), "{names:?}");
    }
    let (_, _, body) = post(
        "LabelValues",
        t::LabelValuesRequest {
            name: "env".into(),
            matchers: vec!["{service_name=\"checkout-svc\"}".into()],
            start: FROM_MS,
            end: TO_MS,
        }
        .encode_to_vec(),
    )?;
    ensure!(t::LabelValuesResponse::decode(body.as_slice())?.names == ["prod"]);
    // Metrics panel: step = max(interval, minStep 15 s), group by, limit, exemplars requested.
    let (_, _, body) = post(
        "SelectSeries",
        q::SelectSeriesRequest {
            profile_type_id: CPU.into(),
            label_selector: "{}".into(),
            start: FROM_MS,
            end: TO_MS,
            group_by: vec!["env".into()],
            step: 15.0,
            limit: Some(10),
            exemplar_type: t::ExemplarType::Individual as i32,
            ..Default::default()
        }
        .encode_to_vec(),
    )?;
    let series = q::SelectSeriesResponse::decode(body.as_slice())?.series;
    ensure!(series.len() == 2);
    ensure!(
        series[0].labels
            == [t::LabelPair {
                name: "env".into(),
                value: "prod".into()
            }]
    );
    ensure!(series[0].points.len() == 1 && series[0].points[0].value == 80_000_000.0);
    ensure!(
        series[0].points[0].timestamp == FROM_MS + 60_000,
        "aligned to 15 s steps from start: {}",
        series[0].points[0].timestamp
    );
    ensure!(series[1].labels[0].value == "staging" && series[1].points[0].value == 40_000_000.0);
    // Individual exemplars name the profile; the Drilldown opens it by id (binary proto too),
    // and another tenant cannot.
    let exemplar = series[0].points[0]
        .exemplars
        .first()
        .context("an individual exemplar")?;
    ensure!(
        exemplar.value == 80_000_000
            && exemplar.profile_id.len() == 36
            && exemplar
                .labels
                .iter()
                .any(|l| l.name == "env" && l.value == "prod"),
        "{exemplar:?}"
    );
    let by_id = q::SelectMergeStacktracesRequest {
        profile_type_id: CPU.into(),
        label_selector: "{}".into(),
        start: FROM_MS,
        end: TO_MS,
        max_nodes: Some(16384),
        profile_id_selector: vec![exemplar.profile_id.clone()],
        ..Default::default()
    };
    let total_of = |body: &[u8]| -> Result<i64> {
        Ok(q::SelectMergeStacktracesResponse::decode(body)?
            .flamegraph
            .map_or(0, |f| f.total))
    };
    let (_, _, body) = post("SelectMergeStacktraces", by_id.encode_to_vec())?;
    ensure!(total_of(&body)? == 80_000_000);
    let (s, _, body) = post_as(
        "graf-b",
        &b_token,
        "SelectMergeStacktraces",
        by_id.encode_to_vec(),
    )?;
    ensure!(s == 200 && total_of(&body)? == 0);
    // The Drilldown's heatmap panel through the datasource: one profile, one point.
    let heatmap = q::SelectHeatmapRequest {
        profile_type_id: CPU.into(),
        label_selector: "{env=\"prod\"}".into(),
        start: FROM_MS,
        end: TO_MS,
        step: ((TO_MS - FROM_MS) / 64 / 1000) as f64,
        query_type: q::HeatmapQueryType::Individual as i32,
        exemplar_type: t::ExemplarType::Individual as i32,
        ..Default::default()
    };
    let (_, _, body) = post("SelectHeatmap", heatmap.encode_to_vec())?;
    let h = q::SelectHeatmapResponse::decode(body.as_slice())?;
    let points: i32 = h
        .series
        .iter()
        .flat_map(|s| s.slots.iter().flat_map(|slot| slot.counts.iter()))
        .sum();
    ensure!(points == 1, "{h:?}");
    ensure!(
        h.series[0]
            .slots
            .iter()
            .flat_map(|s| &s.exemplars)
            .any(|e| e.profile_id == exemplar.profile_id),
        "{h:?}"
    );
    let (_, _, body) = post_as("graf-b", &b_token, "SelectHeatmap", heatmap.encode_to_vec())?;
    ensure!(
        q::SelectHeatmapResponse::decode(body.as_slice())?
            .series
            .is_empty()
    );
    // Flame graph panel with max_nodes.
    let (_, _, body) = post(
        "SelectMergeStacktraces",
        q::SelectMergeStacktracesRequest {
            profile_type_id: CPU.into(),
            label_selector: "{env=\"prod\"}".into(),
            start: FROM_MS,
            end: TO_MS,
            max_nodes: Some(16384),
            ..Default::default()
        }
        .encode_to_vec(),
    )?;
    let fg = q::SelectMergeStacktracesResponse::decode(body.as_slice())?
        .flamegraph
        .context("flamegraph")?;
    ensure!(
        fg.names[0] == "total" && fg.total == 80_000_000 && fg.max_self == 50_000_000,
        "{fg:?}"
    );
    ensure!(fg.levels[0].values == [0, 80_000_000, 0, 0]);
    ensure!(
        fg.levels.len() == 3 && fg.levels[2].values.len() == 8,
        "{:?}",
        fg.levels
    );
    // max_nodes = 2 folds the smaller leaf into "other".
    let (_, _, body) = post(
        "SelectMergeStacktraces",
        q::SelectMergeStacktracesRequest {
            profile_type_id: CPU.into(),
            label_selector: "{env=\"prod\"}".into(),
            start: FROM_MS,
            end: TO_MS,
            max_nodes: Some(2),
            ..Default::default()
        }
        .encode_to_vec(),
    )?;
    let small = q::SelectMergeStacktracesResponse::decode(body.as_slice())?
        .flamegraph
        .context("flamegraph")?;
    ensure!(
        small.names.iter().any(|n| n == "other") && small.total == fg.total,
        "{small:?}"
    );
    // The Drilldown's progressive refinement through the datasource: each child of the root
    // re-queried by its call site (binary `stack_trace_selector`) has the total it had in the
    // whole graph, and together they are the whole.
    let mut refined = 0;
    for node in fg.levels[1].values.chunks(4) {
        let name = fg.names[node[3] as usize].clone();
        let (_, _, body) = post(
            "SelectMergeStacktraces",
            q::SelectMergeStacktracesRequest {
                profile_type_id: CPU.into(),
                label_selector: "{env=\"prod\"}".into(),
                start: FROM_MS,
                end: TO_MS,
                max_nodes: Some(3),
                stack_trace_selector: Some(t::StackTraceSelector {
                    call_site: vec![t::Location { name: name.clone() }],
                    ..Default::default()
                }),
                ..Default::default()
            }
            .encode_to_vec(),
        )?;
        let part = total_of(&body)?;
        ensure!(part == node[1], "{name}: {part} vs {}", node[1]);
        refined += part;
    }
    ensure!(refined == fg.total, "{refined} vs {}", fg.total);
    // Traces to profiles.
    let (_, _, body) = post(
        "SelectMergeSpanProfile",
        q::SelectMergeSpanProfileRequest {
            profile_type_id: CPU.into(),
            label_selector: "{service_name=\"checkout-svc\"}".into(),
            span_selector: vec!["00000000000000c1".into()],
            start: FROM_MS,
            end: TO_MS,
            max_nodes: Some(16384),
            ..Default::default()
        }
        .encode_to_vec(),
    )?;
    let span = q::SelectMergeSpanProfileResponse::decode(body.as_slice())?
        .flamegraph
        .context("flamegraph")?;
    ensure!(span.total == 30_000_000 && span.names.contains(&"graf_checkout".to_string()));
    // Errors are Connect JSON.
    let (s, ct, body) = post(
        "SelectMergeStacktraces",
        q::SelectMergeStacktracesRequest {
            profile_type_id: "bad".into(),
            ..Default::default()
        }
        .encode_to_vec(),
    )?;
    let err: serde_json::Value = serde_json::from_slice(&body)?;
    ensure!(
        s == 400 && ct == "application/json" && err["code"] == "invalid_argument",
        "{err}"
    );
    // The same calls over gRPC and Connect JSON give the same flame graph.
    let json_resp = kiln
        .http()
        .post(kiln.url("/querier.v1.QuerierService/SelectMergeStacktraces"))
        .header("Content-Type", "application/json")
        .header("Authorization", format!("Bearer {token}"))
        .body(serde_json::json!({ "profileTypeID": CPU, "labelSelector": "{env=\"prod\"}", "start": FROM_MS.to_string(), "end": TO_MS, "maxNodes": "16384" }).to_string())
        .send()?;
    let v: serde_json::Value = json_resp.json()?;
    ensure!(
        v["flamegraph"]["total"] == "80000000" && v["flamegraph"]["maxSelf"] == "50000000",
        "{v}"
    );

    // Function details: the service's repository, ref and root path reach every mapping's
    // build id as Pyroscope's JSON; a newer client's `frameFilter` is applied.
    let w = hs256_token(&keys, "graf-a", &["write"])?;
    kiln.set_auth(bearer(&w));
    let (s, b) = kiln.ingest(
        "graf-a",
        "name=src-svc%7Bservice_repository%3Dhttps%3A%2F%2Fgithub.com%2Facme%2Fshop%2Cservice_git_ref%3Dv1.2.3%2Cservice_root_path%3Dcmd%2Fshop%7D&format=pprof",
        pprof_with_spans(),
        &[],
    )?;
    ensure!(s == 200, "{s} {b}");
    // The Drilldown's own calls through Grafana's datasource proxy (Connect JSON, Basic auth).
    let json_as = |tenant: &str, token: &str, method: &str, body: serde_json::Value| {
        let auth = format!(
            "Basic {}",
            crate::auth::b64std(format!("{tenant}:{token}").as_bytes())
        );
        let r = kiln
            .http()
            .post(kiln.url(&format!("/querier.v1.QuerierService/{method}")))
            .header("Content-Type", "application/json")
            .header("Authorization", auth)
            .body(body.to_string())
            .send()?;
        ensure!(r.status().as_u16() == 200, "{method}: {}", r.status());
        Ok::<serde_json::Value, anyhow::Error>(r.json()?)
    };
    // Span heatmap → Tempo traces: the span's point and its exemplar; graf-b sees none.
    let span_heatmap = serde_json::json!({
        "profileTypeID": CPU, "labelSelector": "{service_name=\"checkout-svc\"}",
        "start": FROM_MS.to_string(), "end": TO_MS.to_string(),
        "step": ((TO_MS - FROM_MS) / 1000 + 63) / 64, "groupBy": [],
        "queryType": "HEATMAP_QUERY_TYPE_SPAN", "exemplarType": "EXEMPLAR_TYPE_SPAN",
    });
    let h = json_as("graf-a", &token, "SelectHeatmap", span_heatmap.clone())?;
    let slots = h["series"][0]["slots"].as_array().context("slots")?;
    let points: i64 = slots
        .iter()
        .flat_map(|s| s["counts"].as_array().cloned().unwrap_or_default())
        .map(|c| c.as_i64().unwrap_or(0))
        .sum();
    let exemplar = &slots[0]["exemplars"][0];
    ensure!(
        points == 1 && exemplar["spanId"] == "00000000000000c1",
        "{h}"
    );
    ensure!(json_int(&exemplar["value"]) == 30_000_000, "{h}");
    let h = json_as("graf-b", &b_token, "SelectHeatmap", span_heatmap)?;
    ensure!(h["series"].as_array().is_none_or(|s| s.is_empty()), "{h}");
    // Function details, with a frame filter as a newer client sends it (the call site's stacks
    // all have a `graf_` function: nothing more is dropped).
    let details = serde_json::json!({
        "profile_typeID": CPU, "label_selector": "{service_name=\"src-svc\"}",
        "start": FROM_MS, "end": TO_MS, "maxNodes": 500,
        "stackTraceSelector": {"call_site": [{"name": "main"}, {"name": "graf_checkout"}],
                               "frameFilter": {"includeFunctionNameRegexes": ["^graf_"]}},
    });
    let pprof = json_as("graf-a", &token, "SelectMergeProfile", details.clone())?;
    let strings = pprof["stringTable"].as_array().context("stringTable")?;
    let build_id = &strings[json_int(&pprof["mapping"][0]["buildId"]) as usize];
    let version: serde_json::Value = serde_json::from_str(build_id.as_str().context("build id")?)?;
    ensure!(
        version["repository"] == "https://github.com/acme/shop"
            && version["git_ref"] == "v1.2.3"
            && version["root_path"] == "cmd/shop",
        "{version}"
    );
    let total: i64 = pprof["sample"]
        .as_array()
        .context("samples")?
        .iter()
        .map(|s| json_int(&s["value"][0]))
        .sum();
    ensure!(total == 30_000_000, "graf_checkout's stack only: {total}");
    let other = json_as("graf-b", &b_token, "SelectMergeProfile", details)?;
    ensure!(
        other["sample"].as_array().is_none_or(|s| s.is_empty()),
        "{other}"
    );
    Ok(())
}

/// An int64 of Connect JSON (a string) or a number.
fn json_int(v: &serde_json::Value) -> i64 {
    v.as_str()
        .and_then(|s| s.parse().ok())
        .or_else(|| v.as_i64())
        .unwrap_or(0)
}
