//! The write-ahead log (ADR 0018): real profiles sent by every logged protocol (`/ingest` pprof,
//! the .NET profiler's pprof, `push.v1`, OTLP protobuf and JSON) to a `kiln` that cuts no
//! segment before it is killed with SIGKILL, so everything it stores after the restart comes
//! from replaying its log; the answers equal those of a `kiln` that acknowledged the same
//! requests from their segments, and another tenant sees nothing.

use std::collections::BTreeMap;

use anyhow::{Context, Result, ensure};
use kiln_e2e::{ALL_TIME, Kiln, corpus_dir};
use kiln_storage::query::tree::flamegraph_stacks;
use prost::Message;

/// Every request, by a label of what it is: (path with query, content type, body).
fn requests() -> Option<Vec<(&'static str, String, &'static str, Vec<u8>)>> {
    let corpus = corpus_dir()?;
    let read = |p: &str| std::fs::read(corpus.join(p)).ok();
    let pprof = read("pprof/pyroscope__cpu.pb.gz")?;
    let dotnet = read("pprof/pyroscope__dotnet.labels.pprof")?;
    let push = kiln_proto::push::v1::PushRequest {
        series: vec![kiln_proto::push::v1::RawProfileSeries {
            labels: vec![
                kiln_proto::types::v1::LabelPair {
                    name: "service_name".into(),
                    value: "pushed".into(),
                },
                kiln_proto::types::v1::LabelPair {
                    name: "__name__".into(),
                    value: "process_cpu".into(),
                },
            ],
            samples: vec![kiln_proto::push::v1::RawSample {
                raw_profile: pprof.clone().into(),
                id: "p".into(),
            }],
            annotations: vec![],
        }],
    };
    Some(vec![
        (
            "ingest",
            "/ingest?name=ingested.cpu%7Bregion%3Deu%7D&from=1700000000&until=1700000010&format=pprof"
                .into(),
            "application/octet-stream",
            pprof,
        ),
        (
            "dotnet",
            "/ingest?name=dotnet&from=1700000000&spyName=dotnetspy&format=pprof".into(),
            "application/octet-stream",
            dotnet,
        ),
        (
            "push",
            "/push.v1.PusherService/Push".into(),
            "application/proto",
            push.encode_to_vec(),
        ),
        (
            "otlp",
            "/v1development/profiles".into(),
            "application/x-protobuf",
            read("otlp/otel-ebpf-profile.pb.bin")?,
        ),
        (
            "otlp-json",
            "/v1development/profiles".into(),
            "application/json",
            read("otlp/otel-ebpf-profile.pb.json")?,
        ),
    ])
}

/// Every label's values of `tenant`, and every profile type's stacks per service.
type Everything = (
    BTreeMap<String, Vec<String>>,
    BTreeMap<(String, String), BTreeMap<Vec<String>, i64>>,
);

fn everything(kiln: &Kiln, tenant: &str) -> Result<Everything> {
    use kiln_proto::types::v1 as t;
    let names = kiln.label_names(tenant)?;
    let mut labels = BTreeMap::new();
    for name in names {
        let values: t::LabelValuesResponse = kiln.connect(
            tenant,
            "/querier.v1.QuerierService/LabelValues",
            &t::LabelValuesRequest {
                name: name.clone(),
                matchers: vec![],
                start: ALL_TIME.0,
                end: ALL_TIME.1,
            },
        )?;
        labels.insert(name, values.names);
    }
    let mut stacks = BTreeMap::new();
    for t in kiln.profile_types(tenant)? {
        for service in labels.get("service_name").into_iter().flatten() {
            let fg = kiln.flamegraph(tenant, &t.id, &format!("{{service_name=\"{service}\"}}"))?;
            let s: BTreeMap<Vec<String>, i64> = flamegraph_stacks(&fg)?.into_iter().collect();
            if !s.is_empty() {
                stacks.insert((t.id.clone(), service.clone()), s);
            }
        }
    }
    Ok((labels, stacks))
}

#[test]
#[cfg_attr(not(kiln_corpus), ignore = "../shared/corpus is absent")]
fn a_replayed_log_stores_what_the_requests_did() -> Result<()> {
    let requests = requests().context("../shared/corpus is not readable")?;
    // No segment is cut by time before the kill, and no query comes: only the log holds them.
    let mut logged = Kiln::start(&["--segment-interval-ms", "600000"])?;
    let stored = Kiln::start(&["--ack-from", "store"])?;
    for (what, path, content_type, body) in &requests {
        for kiln in [&logged, &stored] {
            let resp = kiln
                .http()
                .post(kiln.url(path))
                .header("X-Scope-OrgID", "replayed")
                .header("Content-Type", *content_type)
                .body(body.clone())
                .send()?;
            let status = resp.status();
            ensure!(status.is_success(), "{what}: {status} {}", resp.text()?);
        }
    }
    logged.kill()?;
    logged.start_again()?;
    let log = logged.log_text();
    ensure!(
        log.contains("write-ahead log replayed"),
        "no replay after the kill"
    );
    let want = everything(&stored, "replayed")?;
    ensure!(
        want.1.len() >= 5,
        "too few series of profile types and services: {:?}",
        want.1.keys()
    );
    let got = everything(&logged, "replayed")?;
    ensure!(
        got.0 == want.0,
        "labels after the replay {:?}, from the requests {:?}",
        got.0,
        want.0
    );
    for (key, stacks) in &want.1 {
        ensure!(
            got.1.get(key) == Some(stacks),
            "{key:?}: the replayed log stored {} stacks, the requests {}",
            got.1.get(key).map_or(0, BTreeMap::len),
            stacks.len()
        );
    }
    ensure!(
        got.1.len() == want.1.len(),
        "{:?} against {:?}",
        got.1.keys(),
        want.1.keys()
    );
    logged.assert_tenant_empty("other")?;
    // Replayed once: a second restart replays nothing and answers the same.
    logged.restart()?;
    ensure!(everything(&logged, "replayed")? == want);
    Ok(())
}
