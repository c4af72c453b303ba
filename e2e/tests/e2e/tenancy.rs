//! Reads across tenants (`X-Scope-OrgID: a|b`) against the real binary: every querier answer
//! over `a|b` is the sum of the answers over `a` and over `b`, node by node; `__tenant__` groups
//! and filters; the render API and gRPC take the same header; a token reads only the tenants it
//! names (403 naming the other); writes act for one tenant; a third tenant stays out of it.

use std::collections::BTreeMap;

use anyhow::{Context, Result, ensure};
use kiln_e2e::{ALL_TIME, Kiln, with_tenant};
use kiln_proto::querier::v1 as q;
use kiln_proto::types::v1 as t;
use kiln_storage::query::tree::flamegraph_stacks;

use crate::auth::{bearer, kiln_token, make_keys, start_jwt};

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
/// Nanoseconds per folded sample at the default 100 Hz.
const TICK: i64 = 10_000_000;

type Stacks = BTreeMap<Vec<String>, i64>;

/// Folded stacks of (tenant, application) pairs, ingested a minute ago.
const DATA: &[(&str, &str, &str)] = &[
    ("a", "api.cpu", "main;work 30\nmain;idle 10\n"),
    ("b", "api.cpu", "main;work 5\nmain;db 7\n"),
    ("b", "batch.cpu", "main;run 20\n"),
    ("c", "secret.cpu", "main;hidden 99\n"),
];

fn ingest_all(kiln: &Kiln, auth: impl Fn(&str) -> Vec<(String, String)>) -> Result<()> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    for (tenant, name, folded) in DATA {
        let url = kiln.url(&format!(
            "/ingest?name={name}&from={}&until={}",
            now - 70,
            now - 60
        ));
        let resp = auth(tenant)
            .iter()
            .fold(kiln.http().post(url), |r, (k, v)| r.header(k, v))
            .body(folded.to_string())
            .send()?;
        ensure!(
            resp.status().is_success(),
            "ingest {tenant}: {}",
            resp.text()?
        );
    }
    Ok(())
}

/// A Connect call with binary protobuf and these headers.
fn call<Req: prost::Message, Resp: prost::Message + Default>(
    kiln: &Kiln,
    headers: &[(String, String)],
    method: &str,
    req: &Req,
) -> Result<(u16, Resp, String)> {
    let resp = headers
        .iter()
        .fold(
            kiln.http()
                .post(kiln.url(&format!("/querier.v1.QuerierService/{method}"))),
            |r, (k, v)| r.header(k, v),
        )
        .header("Content-Type", "application/proto")
        .body(req.encode_to_vec())
        .send()?;
    let status = resp.status().as_u16();
    let body = resp.bytes()?;
    if status != 200 {
        return Ok((
            status,
            Resp::default(),
            String::from_utf8_lossy(&body).into_owned(),
        ));
    }
    Ok((status, Resp::decode(body.as_ref())?, String::new()))
}

fn org(tenants: &str) -> Vec<(String, String)> {
    vec![("X-Scope-OrgID".into(), tenants.into())]
}

fn stacks_request(selector: &str) -> q::SelectMergeStacktracesRequest {
    q::SelectMergeStacktracesRequest {
        profile_type_id: CPU.into(),
        label_selector: selector.into(),
        start: ALL_TIME.0,
        end: ALL_TIME.1,
        max_nodes: Some(1 << 20),
        ..Default::default()
    }
}

fn flame(kiln: &Kiln, headers: &[(String, String)], selector: &str) -> Result<Stacks> {
    let (status, r, err): (_, q::SelectMergeStacktracesResponse, _) = call(
        kiln,
        headers,
        "SelectMergeStacktraces",
        &stacks_request(selector),
    )?;
    ensure!(status == 200, "flame graph: {status} {err}");
    Ok(flamegraph_stacks(&r.flamegraph.context("no flame graph")?)?)
}

fn sum(a: &Stacks, b: &Stacks) -> Stacks {
    let mut out = a.clone();
    for (k, v) in b {
        *out.entry(k.clone()).or_default() += v;
    }
    out
}

fn series(
    kiln: &Kiln,
    headers: &[(String, String)],
    group_by: &[&str],
) -> Result<BTreeMap<Vec<(String, String)>, f64>> {
    let (status, r, err): (_, q::SelectSeriesResponse, _) = call(
        kiln,
        headers,
        "SelectSeries",
        &q::SelectSeriesRequest {
            profile_type_id: CPU.into(),
            label_selector: "{}".into(),
            start: ALL_TIME.0,
            end: ALL_TIME.1,
            group_by: group_by.iter().map(|g| g.to_string()).collect(),
            step: 4_102_444_800.0,
            ..Default::default()
        },
    )?;
    ensure!(status == 200, "series: {status} {err}");
    Ok(r.series
        .into_iter()
        .map(|s| {
            let labels = s.labels.into_iter().map(|l| (l.name, l.value)).collect();
            (labels, s.points.iter().map(|p| p.value).sum())
        })
        .collect())
}

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

#[test]
fn a_read_across_tenants_is_the_sum_of_each() -> Result<()> {
    let kiln = Kiln::start(&[])?;
    ingest_all(&kiln, org)?;
    let (a, b) = (
        flame(&kiln, &org("a"), "{}")?,
        flame(&kiln, &org("b"), "{}")?,
    );
    ensure!(a.values().sum::<i64>() == 40 * TICK, "a: {a:?}");
    let both = flame(&kiln, &org("a|b"), "{}")?;
    ensure!(both == sum(&a, &b), "a|b {both:?} is not a + b");
    ensure!(
        flame(&kiln, &org("b|a"), "{}")? == both,
        "the order of tenants matters"
    );
    ensure!(
        !both.keys().any(|k| k.iter().any(|f| f == "hidden")),
        "tenant c's stacks in a|b"
    );

    // `__tenant__` picks tenants, beside the other matchers.
    ensure!(flame(&kiln, &org("a|b"), r#"{__tenant__="b"}"#)? == b);
    let api_b = flame(&kiln, &org("b"), r#"{service_name="api"}"#)?;
    let picked = flame(
        &kiln,
        &org("a|b"),
        r#"{service_name="api", __tenant__!="a"}"#,
    )?;
    ensure!(picked == api_b, "{picked:?} != {api_b:?}");
    ensure!(flame(&kiln, &org("a|b"), r#"{__tenant__="c"}"#)?.is_empty());

    // Series: one sum, or one series per tenant.
    let total = series(&kiln, &org("a|b"), &[])?;
    ensure!(
        total == BTreeMap::from([(vec![], (40 + 32) as f64 * TICK as f64)]),
        "{total:?}"
    );
    let by_tenant = series(&kiln, &org("a|b"), &["__tenant__"])?;
    let want = BTreeMap::from([
        (labels(&[("__tenant__", "a")]), (40 * TICK) as f64),
        (labels(&[("__tenant__", "b")]), (32 * TICK) as f64),
    ]);
    ensure!(by_tenant == want, "{by_tenant:?}");
    let by_both = series(&kiln, &org("a|b"), &["service_name", "__tenant__"])?;
    ensure!(
        by_both.get(&labels(&[("service_name", "api"), ("__tenant__", "b")]))
            == Some(&((12 * TICK) as f64)),
        "{by_both:?}"
    );
    let by_service = series(&kiln, &org("a|b"), &["service_name"])?;
    ensure!(
        by_service.get(&labels(&[("service_name", "api")])) == Some(&((52 * TICK) as f64)),
        "api is not summed over the tenants: {by_service:?}"
    );

    // Label APIs list the tenant label; tenant c is not among the values.
    let (_, names, _): (_, t::LabelNamesResponse, _) = call(
        &kiln,
        &org("a|b"),
        "LabelNames",
        &t::LabelNamesRequest {
            start: ALL_TIME.0,
            end: ALL_TIME.1,
            ..Default::default()
        },
    )?;
    ensure!(
        names.names.contains(&"__tenant__".into()),
        "{:?}",
        names.names
    );
    let values = |name: &str| -> Result<Vec<String>> {
        let (_, v, _): (_, t::LabelValuesResponse, _) = call(
            &kiln,
            &org("a|b"),
            "LabelValues",
            &t::LabelValuesRequest {
                name: name.into(),
                start: ALL_TIME.0,
                end: ALL_TIME.1,
                ..Default::default()
            },
        )?;
        Ok(v.names)
    };
    ensure!(values("__tenant__")? == ["a", "b"]);
    ensure!(values("service_name")? == ["api", "batch"]);
    let (_, sets, _): (_, q::SeriesResponse, _) = call(
        &kiln,
        &org("a|b"),
        "Series",
        &q::SeriesRequest {
            start: ALL_TIME.0,
            end: ALL_TIME.1,
            ..Default::default()
        },
    )?;
    ensure!(sets.labels_set.len() == 3, "{:?}", sets.labels_set);
    ensure!(sets.labels_set.iter().all(|s| {
        s.labels
            .iter()
            .any(|l| l.name == "__tenant__" && (l.value == "a" || l.value == "b"))
    }));

    // The pprof of `a|b` carries both tenants' samples.
    let profile = |tenants: &str| -> Result<Vec<((String, String), i64)>> {
        let resp = kiln
            .http()
            .post(kiln.url("/querier.v1.QuerierService/SelectMergeProfile"))
            .header("X-Scope-OrgID", tenants)
            .header("Content-Type", "application/proto")
            .body(prost::Message::encode_to_vec(
                &q::SelectMergeProfileRequest {
                    profile_type_id: CPU.into(),
                    label_selector: "{}".into(),
                    start: ALL_TIME.0,
                    end: ALL_TIME.1,
                    ..Default::default()
                },
            ))
            .send()?;
        ensure!(resp.status().is_success(), "pprof: {}", resp.status());
        kiln_e2e::pprof_totals(&resp.bytes()?)
    };
    ensure!(profile("a|b")?[0].1 == 72 * TICK, "{:?}", profile("a|b")?);

    // The render API (Grafana's Drilldown app) over `a|b`.
    let render: serde_json::Value = kiln
        .http()
        .get(kiln.url("/pyroscope/render"))
        .query(&[("query", format!("{CPU}{{}}").as_str()), ("from", "now-1h")])
        .header("X-Scope-OrgID", "a|b")
        .send()?
        .json()?;
    ensure!(
        render["flamebearer"]["numTicks"] == 72 * TICK,
        "render: {}",
        render["flamebearer"]["numTicks"]
    );

    // gRPC takes the same metadata.
    let rt = tokio::runtime::Runtime::new()?;
    let grpc_total = rt.block_on(async {
        let mut client =
            kiln_proto::querier::v1::querier_service_client::QuerierServiceClient::connect(
                kiln.url(""),
            )
            .await?;
        let r = client
            .select_merge_stacktraces(with_tenant(stacks_request("{}"), "a|b"))
            .await?
            .into_inner();
        anyhow::Ok(r.flamegraph.map(|f| f.total).unwrap_or_default())
    })?;
    ensure!(grpc_total == 72 * TICK, "gRPC total {grpc_total}");

    // Writes act for one tenant; another tenant's read sees none of a's or b's.
    let (status, _) = kiln.ingest("a|b", "name=x.cpu", b"main 1\n".to_vec(), &[])?;
    ensure!(status == 400, "a write over a|b answered {status}");
    let c = flame(&kiln, &org("c"), "{}")?;
    ensure!(c.keys().all(|k| k.iter().any(|f| f == "hidden")), "{c:?}");
    ensure!(
        !flame(&kiln, &org("a"), "{}")?
            .keys()
            .any(|k| k.contains(&"db".to_owned()))
    );
    Ok(())
}

#[test]
fn a_token_reads_only_the_tenants_it_names() -> Result<()> {
    let keys = make_keys()?;
    let kiln = start_jwt(&keys)?;
    let key = keys.private("hs1.secret");
    let iss_aud = ["--issuer", crate::auth::ISS, "--audience", crate::auth::AUD];
    let writer = |tenant: &str| -> Vec<(String, String)> {
        bearer(&kiln_token(&key, tenant, "write", &iss_aud).expect("a token"))
    };
    ingest_all(&kiln, writer)?;

    let mut extra = vec!["--read-tenants", "b"];
    extra.extend(iss_aud);
    let ab = bearer(&kiln_token(&key, "a", "read", &extra)?);
    let only_a = bearer(&kiln_token(&key, "a", "read", &iss_aud)?);
    let with_org = |auth: &[(String, String)], tenants: &str| {
        let mut h = auth.to_vec();
        h.extend(org(tenants));
        h
    };

    let a = flame(&kiln, &only_a, "{}")?;
    let b = flame(&kiln, &with_org(&ab, "b"), "{}")?;
    ensure!(b.values().sum::<i64>() == 32 * TICK, "b: {b:?}");
    ensure!(flame(&kiln, &with_org(&ab, "a|b"), "{}")? == sum(&a, &b));
    // Without the header the token reads its own tenant.
    ensure!(flame(&kiln, &ab, "{}")? == a);

    for (auth, tenants, refused) in [(&only_a, "a|b", "b"), (&ab, "a|b|c", "c"), (&ab, "c", "c")] {
        let (status, _, err): (_, q::SelectMergeStacktracesResponse, _) = call(
            &kiln,
            &with_org(auth, tenants),
            "SelectMergeStacktraces",
            &stacks_request("{}"),
        )?;
        ensure!(status == 403, "{tenants}: {status} {err}");
        let message: serde_json::Value = serde_json::from_str(&err)?;
        let message = message["message"].as_str().unwrap_or_default();
        ensure!(
            message.ends_with(&format!("tenant {refused:?}")),
            "{tenants}: {message}"
        );
    }
    // The token may read b, never write to it.
    let mut write_b = with_org(&ab, "b");
    write_b.retain(|(k, _)| k != "Content-Type");
    let resp = write_b
        .iter()
        .fold(
            kiln.http().post(kiln.url("/ingest?name=x.cpu")),
            |r, (k, v)| r.header(k, v),
        )
        .body("main 1\n")
        .send()?;
    ensure!(
        resp.status() == 403,
        "a write to b answered {}",
        resp.status()
    );
    Ok(())
}
