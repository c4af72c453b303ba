//! Span profiles: pyroscope-otel's two root spans each get their own flame graph, and the span
//! ids in the pprof corpus stay per sample.

use std::collections::BTreeMap;
use std::io::Read;
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use kiln_e2e::proxy::Proxy;
use kiln_e2e::{ALL_TIME, Kiln, Tools, corpus_dir};
use kiln_proto::google::v1::Profile;
use kiln_proto::querier::v1 as q;
use prost::Message;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn span_flamegraph(
    kiln: &Kiln,
    tenant: &str,
    profile_type: &str,
    selector: &str,
    spans: &[String],
) -> Result<q::FlameGraph> {
    let r: q::SelectMergeSpanProfileResponse = kiln.connect(
        tenant,
        "/querier.v1.QuerierService/SelectMergeSpanProfile",
        &q::SelectMergeSpanProfileRequest {
            profile_type_id: profile_type.into(),
            label_selector: selector.into(),
            span_selector: spans.to_vec(),
            start: ALL_TIME.0,
            end: ALL_TIME.1,
            max_nodes: Some(1 << 20),
            ..Default::default()
        },
    )?;
    r.flamegraph.context("no flame graph")
}

fn decode_pprof(data: &[u8]) -> Result<Profile> {
    let raw = if data.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(data).read_to_end(&mut out)?;
        out
    } else {
        data.to_vec()
    };
    Ok(Profile::decode(raw.as_slice())?)
}

/// Per span id (labels `span_id` or `profile_id`), per sample type index: the summed values.
/// With `valid`, only ids Kiln can select by (16 hex digits); otherwise only the others.
fn span_totals_where(p: &Profile, valid: bool) -> BTreeMap<String, Vec<i64>> {
    let s = |i: i64| {
        p.string_table
            .get(i as usize)
            .map(String::as_str)
            .unwrap_or("")
    };
    let mut out: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for sample in &p.sample {
        if sample.value.iter().any(|v| *v < 0) {
            continue;
        }
        let span = sample
            .label
            .iter()
            .find(|l| matches!(s(l.key), "span_id" | "profile_id"))
            .map(|l| s(l.str).to_owned());
        if let Some(span) = span.filter(|s| (kiln_otel::ids::parse_span_id(s) != 0) == valid) {
            let e = out
                .entry(span)
                .or_insert_with(|| vec![0; sample.value.len()]);
            for (i, v) in sample.value.iter().enumerate() {
                e[i] += v;
            }
        }
    }
    out
}

fn span_totals(p: &Profile) -> BTreeMap<String, Vec<i64>> {
    span_totals_where(p, true)
}

#[test]
fn pyroscope_otel_root_spans_have_their_own_flame_graphs() -> Result<()> {
    let tools = Tools::find()?;
    let kiln = Kiln::start(&[])?;
    let proxy = Proxy::start(
        kiln.port,
        vec![("X-Scope-OrgID".into(), "span-team".into())],
    )?;
    let script = kiln_e2e::repo_root().join("e2e/clients/python/span_app.py");
    let started_ms = now_ms();
    let out = Command::new(&tools.python)
        .arg(&script)
        .arg(proxy.url())
        .arg("span-app")
        .output()?;
    if !out.status.success() {
        bail!(
            "span_app.py failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let ended_ms = now_ms();
    let ids: BTreeMap<String, String> = serde_json::from_slice(&out.stdout)?;
    let (alpha, beta) = (ids["alpha"].clone(), ids["beta"].clone());

    // What the SDK sent, per span.
    let mut sent: BTreeMap<String, i64> = BTreeMap::new();
    for r in proxy
        .records()
        .iter()
        .filter(|r| r.target.ends_with("/push.v1.PusherService/Push"))
    {
        let mut body = Vec::new();
        flate2::read::GzDecoder::new(r.body.as_slice()).read_to_end(&mut body)?;
        for series in kiln_proto::push::v1::PushRequest::decode(body.as_slice())?.series {
            for sample in series.samples {
                let p = decode_pprof(&sample.raw_profile)?;
                let cpu = p
                    .sample_type
                    .iter()
                    .position(|vt| p.string_table[vt.r#type as usize] == "cpu");
                let Some(cpu) = cpu else { continue };
                for (span, v) in span_totals(&p) {
                    *sent.entry(span).or_insert(0) += v[cpu];
                }
            }
        }
    }
    ensure!(
        sent.get(&alpha).copied().unwrap_or(0) > 0,
        "no samples of span alpha: {sent:?}"
    );
    ensure!(
        sent.get(&beta).copied().unwrap_or(0) > 0,
        "no samples of span beta: {sent:?}"
    );

    let selector = r#"{service_name="span-app"}"#;
    let a = span_flamegraph(
        &kiln,
        "span-team",
        CPU,
        selector,
        std::slice::from_ref(&alpha),
    )?;
    ensure!(
        a.total == sent[&alpha],
        "alpha: {} != sent {}",
        a.total,
        sent[&alpha]
    );
    ensure!(
        a.names.iter().any(|n| n.contains("kiln_span_alpha_work")),
        "{:?}",
        a.names
    );
    ensure!(
        !a.names.iter().any(|n| n.contains("kiln_span_beta_work")),
        "beta leaked into alpha"
    );
    let b = span_flamegraph(
        &kiln,
        "span-team",
        CPU,
        selector,
        std::slice::from_ref(&beta),
    )?;
    ensure!(
        b.total == sent[&beta],
        "beta: {} != sent {}",
        b.total,
        sent[&beta]
    );
    ensure!(
        b.names.iter().any(|n| n.contains("kiln_span_beta_work")),
        "{:?}",
        b.names
    );
    ensure!(
        !b.names.iter().any(|n| n.contains("kiln_span_alpha_work")),
        "alpha leaked into beta"
    );
    let both = kiln.flamegraph("span-team", CPU, selector)?;
    ensure!(
        both.names
            .iter()
            .any(|n| n.contains("kiln_span_alpha_work"))
    );
    ensure!(both.names.iter().any(|n| n.contains("kiln_span_beta_work")));
    ensure!(both.total >= a.total + b.total);
    // span_name stays a series label; span ids never are.
    let names = kiln.label_names("span-team")?;
    ensure!(names.iter().any(|n| n == "span_name"), "{:?}", names);
    ensure!(
        !names.iter().any(|n| n == "span_id" || n == "trace_id"),
        "{:?}",
        names
    );
    // Exactly what Grafana's Tempo "profiles for this span" link sends: the configured profile
    // type, `{service_name="..."}` from the span's tags, the span's `pyroscope.profile.id`, and
    // the span's time range widened by 60 s each side, as Connect binary protobuf.
    let r: q::SelectMergeSpanProfileResponse = kiln.connect(
        "span-team",
        "/querier.v1.QuerierService/SelectMergeSpanProfile",
        &q::SelectMergeSpanProfileRequest {
            profile_type_id: CPU.into(),
            label_selector: r#"{service_name="span-app"}"#.into(),
            span_selector: vec![alpha.clone()],
            start: started_ms - 60_000,
            end: ended_ms + 60_000,
            max_nodes: Some(16384),
            format: 0,
        },
    )?;
    ensure!(r.flamegraph.context("flame graph")?.total == sent[&alpha]);
    // Another tenant asking for the same span gets nothing.
    let other = span_flamegraph(&kiln, "other-team", CPU, "{}", &[alpha])?;
    ensure!(other.total == 0);
    Ok(())
}

#[test]
#[cfg_attr(not(kiln_corpus), ignore = "../shared/corpus is absent")]
fn corpus_span_ids_stay_per_sample() -> Result<()> {
    let dir = corpus_dir().context("../shared/corpus is absent")?;
    let kiln = Kiln::start(&[])?;
    for (i, file) in [
        "pyroscope__go.cpu.labels.pprof",
        "pyroscope__single_group_with_optional_span_id.pb.gz",
    ]
    .iter()
    .enumerate()
    {
        let tenant = format!("spans-{i}");
        let body = std::fs::read(dir.join("pprof").join(file))?;
        let p = decode_pprof(&body)?;
        let totals = span_totals(&p);
        let odd = span_totals_where(&p, false);
        ensure!(totals.len() + odd.len() >= 1, "{file}: no span ids");
        let (status, text) = kiln.ingest(&tenant, "name=spans-app&format=pprof", body, &[])?;
        ensure!(status == 200, "{file}: {status} {text}");
        let types = kiln.profile_types(&tenant)?;
        for (t, vt) in p.sample_type.iter().enumerate() {
            let ty = &p.string_table[vt.r#type as usize];
            let pt = types
                .iter()
                .find(|x| &x.sample_type == ty)
                .context("profile type")?;
            // Span ids Kiln can select by (16 hex digits): each alone, for up to 25, then all.
            for (span, v) in totals.iter().take(25) {
                let fg = span_flamegraph(&kiln, &tenant, &pt.id, "{}", std::slice::from_ref(span))?;
                ensure!(
                    fg.total == v[t],
                    "{file} {} span {span}: {} != {}",
                    pt.id,
                    fg.total,
                    v[t]
                );
            }
            if !totals.is_empty() {
                let all: Vec<String> = totals.keys().cloned().collect();
                let fg = span_flamegraph(&kiln, &tenant, &pt.id, "{}", &all)?;
                let want: i64 = totals.values().map(|v| v[t]).sum();
                ensure!(
                    fg.total == want,
                    "{file} {}: all spans {} != {want}",
                    pt.id,
                    fg.total
                );
            }
            // Other span ids (such as `span_id="239"`) stay with their samples as labels.
            if !odd.is_empty() {
                let merged: Profile = kiln.connect(
                    &tenant,
                    "/querier.v1.QuerierService/SelectMergeProfile",
                    &q::SelectMergeProfileRequest {
                        profile_type_id: pt.id.clone(),
                        label_selector: "{}".into(),
                        start: ALL_TIME.0,
                        end: ALL_TIME.1,
                        ..Default::default()
                    },
                )?;
                let kept = span_totals_where(&merged, false);
                for (span, v) in &odd {
                    let got = kept.get(span).map(|x| x[0]).unwrap_or(0);
                    ensure!(
                        got == v[t],
                        "{file} {}: span label {span}: {got} != {}",
                        pt.id,
                        v[t]
                    );
                }
            }
        }
        // Span ids never become series labels.
        let names = kiln.label_names(&tenant)?;
        ensure!(
            !names.iter().any(|n| n == "span_id" || n == "profile_id"),
            "{:?}",
            names
        );
    }
    kiln.assert_tenant_empty("spans-other")?;
    Ok(())
}
