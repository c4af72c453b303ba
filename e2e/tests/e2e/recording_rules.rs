//! Recording rules against a real Prometheus (Debian's, its remote-write receiver on): rules
//! made with the Drilldown app's Connect JSON calls, profiles sent over `/ingest`, OTLP and
//! `push.v1`; every point Prometheus stores equals what Kiln's own queries answer for the same
//! selector up to that point, to the sample (a function rule's, the function's total in the
//! function table); another tenant's profiles never feed them; and a `kill -9` of Kiln during
//! ingest plus a minute without the receiver lose and double nothing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail, ensure};
use kiln_e2e::prometheus::Prometheus;
use kiln_e2e::{ALL_TIME, Kiln};
use kiln_proto::querier::v1 as q;
use kiln_proto::types::v1 as t;
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::profiles::v1development as otlp;
use prost::Message;
use serde_json::{Value, json};

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
const RR: &str = "/settings.v1.RecordingRulesService";
/// 10 ms: a folded sample at 100 Hz, and the period of the pprof and OTLP profiles below.
const TICK: i64 = 10_000_000;
/// team-a's series of the rule both tenants made.
const A_SHOP_CPU: &str = "profiles_recorded_shop_cpu{kiln_tenant=\"team-a\"}";

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Kiln with fast intervals, sending to `prom`.
fn kiln_for(prom: &Prometheus, backfill: &str) -> Result<Kiln> {
    Kiln::start(&[
        "--remote-write-url",
        &prom.write_url(),
        "--recording-interval",
        "1s",
        "--recording-delay",
        "2s",
        "--recording-backfill",
        backfill,
    ])
}

/// A rule made as the Drilldown app makes it; its id.
pub(crate) fn make_rule(
    kiln: &Kiln,
    tenant: &str,
    name: &str,
    matchers: &[&str],
    group_by: &[&str],
    function: Option<&str>,
) -> Result<String> {
    let mut body = json!({
        "metricName": format!("profiles_recorded_{name}"),
        "matchers": matchers,
        "groupBy": group_by,
    });
    if let Some(f) = function {
        body["stacktraceFilter"] = json!({
            "$typeName": "settings.v1.StacktraceFilter",
            "functionName": {"$typeName": "settings.v1.StacktraceFilterFunctionName", "functionName": f, "metricType": 0}
        });
    }
    let resp = kiln
        .http()
        .post(kiln.url(&format!("{RR}/UpsertRecordingRule")))
        .header("X-Scope-OrgID", tenant)
        .header("Content-Type", "application/json")
        .body(body.to_string())
        .send()?;
    let status = resp.status();
    let v: Value = resp.json()?;
    ensure!(status.is_success(), "upsert {name}: {status} {v}");
    Ok(v["rule"]["id"].as_str().context("rule id")?.to_owned())
}

/// Folded stacks over `/ingest` at `secs`.
pub(crate) fn send_folded(
    kiln: &Kiln,
    tenant: &str,
    pod: &str,
    secs: i64,
    text: &str,
) -> Result<u16> {
    let (status, body) = kiln.ingest(
        tenant,
        &format!("name=shop.cpu%7Bpod%3D{pod}%7D&from={secs}&format=folded"),
        text.as_bytes().to_vec(),
        &[],
    )?;
    ensure!(status == 200 || status >= 500, "ingest: {status} {body}");
    Ok(status)
}

/// A CPU pprof profile: `main;pay` worth `pay` ticks and `main;browse` worth `browse`.
fn cpu_pprof(time_nanos: i64, pay: i64, browse: i64) -> Vec<u8> {
    use kiln_proto::google::v1 as p;
    let line = |f| {
        vec![p::Line {
            function_id: f,
            line: 1,
        }]
    };
    p::Profile {
        string_table: ["", "cpu", "nanoseconds", "main", "pay", "browse"]
            .map(String::from)
            .to_vec(),
        sample_type: vec![p::ValueType { r#type: 1, unit: 2 }],
        period_type: Some(p::ValueType { r#type: 1, unit: 2 }),
        period: TICK,
        function: (1..=3)
            .map(|id| p::Function {
                id,
                name: id as i64 + 2,
                ..Default::default()
            })
            .collect(),
        location: (1..=3)
            .map(|id| p::Location {
                id,
                line: line(id),
                ..Default::default()
            })
            .collect(),
        sample: vec![
            p::Sample {
                location_id: vec![2, 1],
                value: vec![pay * TICK],
                label: vec![],
            },
            p::Sample {
                location_id: vec![3, 1],
                value: vec![browse * TICK],
                label: vec![],
            },
        ],
        time_nanos,
        duration_nanos: 1_000_000_000,
        ..Default::default()
    }
    .encode_to_vec()
}

/// `push.v1` (Connect, binary) of one CPU profile.
fn send_push(
    kiln: &Kiln,
    tenant: &str,
    pod: &str,
    time_nanos: i64,
    pay: i64,
    browse: i64,
) -> Result<()> {
    use kiln_proto::push::v1 as push;
    let label = |name: &str, value: &str| t::LabelPair {
        name: name.into(),
        value: value.into(),
    };
    let req = push::PushRequest {
        series: vec![push::RawProfileSeries {
            labels: vec![
                label("__name__", "process_cpu"),
                label("service_name", "shop"),
                label("pod", pod),
            ],
            samples: vec![push::RawSample {
                raw_profile: cpu_pprof(time_nanos, pay, browse).into(),
                id: String::new(),
            }],
            annotations: Vec::new(),
        }],
    };
    let _: push::PushResponse = kiln.connect(tenant, "/push.v1.PusherService/Push", &req)?;
    Ok(())
}

/// OTLP profiles over HTTP: `main;pay` and `main;browse` samples of the eBPF profiler's kind
/// (`samples/count` at a 10 ms period), resource `service.name=shop`, `pod`.
fn send_otlp(
    kiln: &Kiln,
    tenant: &str,
    pod: &str,
    time_nanos: i64,
    pay: i64,
    browse: i64,
) -> Result<()> {
    let strings = [
        "",
        "samples",
        "count",
        "cpu",
        "nanoseconds",
        "main",
        "pay",
        "browse",
    ];
    let function = |name| otlp::Function {
        name_strindex: name,
        ..Default::default()
    };
    let location = |f| otlp::Location {
        lines: vec![otlp::Line {
            function_index: f,
            line: 1,
            column: 0,
        }],
        ..Default::default()
    };
    let dictionary = otlp::ProfilesDictionary {
        string_table: strings.map(String::from).to_vec(),
        mapping_table: vec![Default::default()],
        function_table: vec![Default::default(), function(5), function(6), function(7)],
        location_table: vec![Default::default(), location(1), location(2), location(3)],
        stack_table: vec![
            Default::default(),
            otlp::Stack {
                location_indices: vec![2, 1],
            },
            otlp::Stack {
                location_indices: vec![3, 1],
            },
        ],
        ..Default::default()
    };
    let attr = |k: &str, v: &str| KeyValue {
        key: k.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(v.into())),
        }),
        ..Default::default()
    };
    let req = ExportProfilesServiceRequest {
        resource_profiles: vec![otlp::ResourceProfiles {
            resource: Some(opentelemetry_proto::tonic::resource::v1::Resource {
                attributes: vec![attr("service.name", "shop"), attr("pod", pod)],
                ..Default::default()
            }),
            scope_profiles: vec![otlp::ScopeProfiles {
                profiles: vec![otlp::Profile {
                    sample_type: Some(otlp::ValueType {
                        type_strindex: 1,
                        unit_strindex: 2,
                    }),
                    period_type: Some(otlp::ValueType {
                        type_strindex: 3,
                        unit_strindex: 4,
                    }),
                    period: TICK,
                    time_unix_nano: time_nanos as u64,
                    duration_nano: 1_000_000_000,
                    samples: vec![
                        otlp::Sample {
                            stack_index: 1,
                            values: vec![pay],
                            ..Default::default()
                        },
                        otlp::Sample {
                            stack_index: 2,
                            values: vec![browse],
                            ..Default::default()
                        },
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
        dictionary: Some(dictionary),
    };
    let resp = kiln
        .http()
        .post(kiln.url("/v1development/profiles"))
        .header("X-Scope-OrgID", tenant)
        .header("Content-Type", "application/x-protobuf")
        .body(req.encode_to_vec())
        .send()?;
    ensure!(resp.status().is_success(), "otlp: {}", resp.status());
    Ok(())
}

/// The newest time the tenant's counters are sealed through (their pull endpoint's stamps).
fn sealed_through(kiln: &Kiln, tenant: &str) -> Result<Option<i64>> {
    let text = kiln
        .http()
        .get(kiln.url("/api/v1/recording-rules/metrics"))
        .header("X-Scope-OrgID", tenant)
        .send()?
        .text()?;
    Ok(text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .max())
}

/// A metric's value in Kiln's `/metrics`.
fn kiln_metric(kiln: &Kiln, name: &str) -> Result<f64> {
    let text = kiln.metrics_text()?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .with_context(|| format!("{name} not in /metrics"))
}

/// Waits until the tenant's intervals are sealed past `past_ms` and the queue has drained.
fn wait_sealed_and_sent(kiln: &Kiln, tenant: &str, past_ms: i64, within: Duration) -> Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let sealed = sealed_through(kiln, tenant)?.unwrap_or(0);
        if sealed > past_ms
            && kiln_metric(kiln, "kiln_recording_remote_write_pending_bytes")? == 0.0
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "sealed through {sealed}, want past {past_ms}; pending {}: {}",
                kiln_metric(kiln, "kiln_recording_remote_write_pending_bytes")?,
                kiln.log_text()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Every sample Prometheus holds of `metric`, per value of `label` ("" when absent):
/// (Unix ms, value), in time order.
fn raw_points(
    prom: &Prometheus,
    metric: &str,
    label: &str,
) -> Result<BTreeMap<String, Vec<(i64, i64)>>> {
    let now = now_ms() as f64 / 1000.0 + 5.0;
    let mut out = BTreeMap::new();
    for series in prom.query(&format!("{metric}[2h]"), now)? {
        let key = series["metric"][label].as_str().unwrap_or("").to_owned();
        let points: Vec<(i64, i64)> = series["values"]
            .as_array()
            .context("values")?
            .iter()
            .map(|p| {
                let t = (p[0].as_f64().unwrap_or(0.0) * 1000.0).round() as i64;
                let v: f64 = p[1]
                    .as_str()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(f64::NAN);
                (t, v as i64)
            })
            .collect();
        ensure!(
            out.insert(key.clone(), points).is_none(),
            "{metric}: two series for {label}={key}"
        );
    }
    Ok(out)
}

/// Kiln's own answer for a selector: per value of `label`, the totals of 1 s steps from
/// `from_ms`, as SelectSeries sums them.
fn kiln_steps(
    kiln: &Kiln,
    tenant: &str,
    selector: &str,
    label: &str,
    from_ms: i64,
) -> Result<BTreeMap<String, Vec<(i64, i64)>>> {
    let r: q::SelectSeriesResponse = kiln.connect(
        tenant,
        "/querier.v1.QuerierService/SelectSeries",
        &q::SelectSeriesRequest {
            profile_type_id: CPU.into(),
            label_selector: selector.into(),
            start: from_ms,
            end: now_ms() + 60_000,
            step: 1.0,
            group_by: vec![label.into()],
            ..Default::default()
        },
    )?;
    Ok(r.series
        .into_iter()
        .map(|s| {
            let key = s
                .labels
                .iter()
                .find(|l| l.name == label)
                .map(|l| l.value.clone())
                .unwrap_or_default();
            (
                key,
                s.points
                    .iter()
                    .map(|p| (p.timestamp, p.value as i64))
                    .collect(),
            )
        })
        .collect())
}

/// Each Prometheus point equals what Kiln holds before its time: its counter is the sum of the
/// steps before it (what the rule counted before `from_ms` is `base`, the same for every
/// point). Returns the points checked.
fn points_equal_steps(
    prom: &BTreeMap<String, Vec<(i64, i64)>>,
    steps: &BTreeMap<String, Vec<(i64, i64)>>,
) -> Result<usize> {
    ensure!(!prom.is_empty(), "Prometheus holds no series");
    let mut checked = 0;
    for (key, points) in prom {
        let steps = steps.get(key).cloned().unwrap_or_default();
        for &(t, v) in points {
            let want: i64 = steps.iter().filter(|(s, _)| *s < t).map(|(_, v)| v).sum();
            ensure!(
                v == want,
                "{key} at {t}: Prometheus {v}, Kiln {want} (steps {steps:?}, points {points:?})"
            );
            checked += 1;
        }
    }
    Ok(checked)
}

/// `sum by (label) (metric)` now, per value of `label`.
pub(crate) fn promql_sum_by(
    prom: &Prometheus,
    metric: &str,
    label: &str,
) -> Result<BTreeMap<String, i64>> {
    let now = now_ms() as f64 / 1000.0;
    prom.query(&format!("sum by ({label}) ({metric})"), now)?
        .iter()
        .map(|s| {
            let v: f64 = s["value"][1]
                .as_str()
                .and_then(|x| x.parse().ok())
                .context("value")?;
            Ok((
                s["metric"][label].as_str().unwrap_or("").to_owned(),
                v as i64,
            ))
        })
        .collect()
}

/// Kiln's flame graph total for a selector over all time.
fn flame_total(kiln: &Kiln, tenant: &str, selector: &str) -> Result<i64> {
    Ok(kiln.flamegraph(tenant, CPU, selector)?.total)
}

/// The total of `function` in Kiln's function table for a selector over all time.
fn function_total(kiln: &Kiln, tenant: &str, selector: &str, function: &str) -> Result<i64> {
    let r: q::SelectMergeStacktracesResponse = kiln.connect(
        tenant,
        "/querier.v1.QuerierService/SelectMergeStacktraces",
        &q::SelectMergeStacktracesRequest {
            profile_type_id: CPU.into(),
            label_selector: selector.into(),
            start: ALL_TIME.0,
            end: ALL_TIME.1,
            format: q::ProfileFormat::Functions as i32,
            ..Default::default()
        },
    )?;
    Ok(r.functions
        .context("a function table")?
        .functions
        .iter()
        .find(|f| f.name == function)
        .map_or(0, |f| f.total))
}

#[test]
fn rule_series_in_prometheus_equal_kilns_own_answers() -> Result<()> {
    let prom = Prometheus::start()?;
    let kiln = kiln_for(&prom, "10m")?;
    let start = now_ms() - 120_000;
    // Before the rules exist: backfilled from storage when they are made.
    send_folded(
        &kiln,
        "team-a",
        "p1",
        start / 1000,
        "main;pay 4\nmain;browse 2\n",
    )?;
    send_folded(&kiln, "team-a", "p1", start / 1000 + 30, "main;pay 1\n")?;

    let shop = "{ service_name=\"shop\" }";
    let cpu = format!("{{ __profile_type__=\"{CPU}\"}}");
    make_rule(&kiln, "team-a", "shop_cpu", &[shop, &cpu], &["pod"], None)?;
    make_rule(
        &kiln,
        "team-a",
        "shop_pay",
        &[shop, &cpu],
        &["pod"],
        Some("pay"),
    )?;
    make_rule(&kiln, "team-a", "all_cpu", &[&cpu], &["service_name"], None)?;
    // team-b's rule of the same name: one Prometheus for both, told apart by `kiln_tenant`.
    make_rule(&kiln, "team-b", "shop_cpu", &[shop, &cpu], &["pod"], None)?;

    // Then over three seconds: every protocol, and team-b writing into the same service.
    let mut last = 0;
    for round in 0..6i64 {
        let t = now_ms();
        last = t;
        send_folded(
            &kiln,
            "team-a",
            "p1",
            t / 1000,
            &format!("main;pay {}\nmain;browse 3\n", round + 1),
        )?;
        send_push(&kiln, "team-a", "p2", t * 1_000_000, round + 2, 1)?;
        send_otlp(&kiln, "team-a", "p3", t * 1_000_000, 2, round)?;
        send_folded(&kiln, "team-b", "p1", t / 1000, "main;pay 1000\n")?;
        std::thread::sleep(Duration::from_millis(500));
    }
    let other = kiln
        .http()
        .post(kiln.url("/api/v1/recording-rules/metrics"))
        .send()?;
    ensure!(
        other.status().as_u16() != 200,
        "the pull endpoint takes GET only"
    );
    wait_sealed_and_sent(&kiln, "team-a", last + 1000, Duration::from_secs(60))?;
    wait_sealed_and_sent(&kiln, "team-b", last + 1000, Duration::from_secs(60))?;

    // Every point of every rule, to the sample.
    let from = start.div_euclid(1000) * 1000 - 1000;
    let checked = points_equal_steps(
        &raw_points(&prom, A_SHOP_CPU, "pod")?,
        &kiln_steps(&kiln, "team-a", "{service_name=\"shop\"}", "pod", from)?,
    )?;
    ensure!(checked >= 12, "only {checked} points");
    points_equal_steps(
        &raw_points(
            &prom,
            "profiles_recorded_shop_cpu{kiln_tenant=\"team-b\"}",
            "pod",
        )?,
        &kiln_steps(&kiln, "team-b", "{service_name=\"shop\"}", "pod", from)?,
    )?;
    points_equal_steps(
        &raw_points(&prom, "profiles_recorded_all_cpu", "service_name")?,
        &kiln_steps(&kiln, "team-a", "{}", "service_name", from)?,
    )?;

    // PromQL as a user writes it equals Kiln's flame graphs and its function table.
    let by_pod = promql_sum_by(&prom, A_SHOP_CPU, "pod")?;
    let pay = promql_sum_by(&prom, "profiles_recorded_shop_pay", "pod")?;
    ensure!(by_pod.len() == 3, "{by_pod:?}");
    for pod in ["p1", "p2", "p3"] {
        let selector = format!("{{service_name=\"shop\",pod=\"{pod}\"}}");
        let total = flame_total(&kiln, "team-a", &selector)?;
        ensure!(
            by_pod[pod] == total,
            "{pod}: Prometheus {} != flame graph {total}",
            by_pod[pod]
        );
        let f = function_total(&kiln, "team-a", &selector, "pay")?;
        ensure!(f > 0 && f < total, "{pod}: pay {f} of {total}");
        ensure!(
            pay[pod] == f,
            "{pod}: Prometheus pay {} != function table {f}",
            pay[pod]
        );
    }
    // The alert example's share, on these rules' counters: the function's share of the CPU.
    let share = prom.query(
        "sum(profiles_recorded_shop_pay) / sum(profiles_recorded_shop_cpu{kiln_tenant=\"team-a\"})",
        now_ms() as f64 / 1000.0,
    )?;
    let share: f64 = share[0]["value"][1].as_str().context("share")?.parse()?;
    let (pay_all, cpu_all) = (pay.values().sum::<i64>(), by_pod.values().sum::<i64>());
    ensure!(
        (share - pay_all as f64 / cpu_all as f64).abs() < 1e-12,
        "share {share}, want {pay_all}/{cpu_all}"
    );
    // The backfilled profiles count: p1's counter holds them.
    ensure!(by_pod["p1"] > 7 * TICK, "{by_pod:?}");
    // team-b: its one rule, its own counters; none of its profiles in team-a's series, and
    // none of team-a's rules in its list.
    let b = promql_sum_by(
        &prom,
        "profiles_recorded_shop_cpu{kiln_tenant=\"team-b\"}",
        "pod",
    )?;
    ensure!(
        b.len() == 1 && b["p1"] == flame_total(&kiln, "team-b", "{}")?,
        "{b:?}"
    );
    let listed: Value = kiln
        .http()
        .post(kiln.url(&format!("{RR}/ListRecordingRules")))
        .header("X-Scope-OrgID", "team-b")
        .header("Content-Type", "application/json")
        .body("{}")
        .send()?
        .json()?;
    ensure!(
        listed["rules"].as_array().map(Vec::len) == Some(1),
        "{listed}"
    );
    Ok(())
}

#[test]
fn kill_9_and_a_minute_without_the_receiver_lose_and_double_nothing() -> Result<()> {
    let mut prom = Prometheus::start()?;
    let mut kiln = kiln_for(&prom, "0s")?;
    let cpu = format!("{{__profile_type__=\"{CPU}\", service_name=\"shop\"}}");
    make_rule(&kiln, "team-a", "shop_cpu", &[&cpu], &["pod"], None)?;
    let started = now_ms();

    // Senders, until told to stop: folded and push, two pods; a refused or cut request is
    // simply not acknowledged (the comparison is with what Kiln stored).
    let stop = Arc::new(AtomicBool::new(false));
    let port = kiln.port;
    let sender = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || -> u64 {
            let http = reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap();
            let mut acked = 0u64;
            let mut n = 0i64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let t = now_ms();
                let pod = if n % 2 == 0 { "p1" } else { "p2" };
                let url = format!(
                    "http://127.0.0.1:{port}/ingest?name=shop.cpu%7Bpod%3D{pod}%7D&from={}&format=folded",
                    t / 1000
                );
                let body = format!("main;pay {}\nmain;browse 1\n", n % 7 + 1);
                if let Ok(r) = http
                    .post(url)
                    .header("X-Scope-OrgID", "team-a")
                    .body(body)
                    .send()
                    && r.status().is_success()
                {
                    acked += 1;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            acked
        })
    };
    std::thread::sleep(Duration::from_millis(3500));
    kiln.kill()?;
    std::thread::sleep(Duration::from_millis(300));
    kiln.start_again()?;
    std::thread::sleep(Duration::from_millis(3000));

    // The receiver goes away for a minute while profiles keep coming.
    prom.stop()?;
    std::thread::sleep(Duration::from_secs(20));
    stop.store(true, Ordering::Relaxed);
    let acked = sender
        .join()
        .map_err(|_| anyhow::anyhow!("sender panicked"))?;
    ensure!(acked > 50, "only {acked} profiles acknowledged");
    let last = now_ms();
    std::thread::sleep(Duration::from_secs(40));
    ensure!(
        kiln_metric(&kiln, "kiln_recording_remote_write_pending_bytes")? > 0.0,
        "nothing waited for the receiver"
    );
    prom.start_again()?;
    wait_sealed_and_sent(&kiln, "team-a", last + 1000, Duration::from_secs(90))?;

    let points = raw_points(&prom, "profiles_recorded_shop_cpu", "pod")?;
    let steps = kiln_steps(
        &kiln,
        "team-a",
        "{service_name=\"shop\"}",
        "pod",
        started.div_euclid(1000) * 1000 - 1000,
    )?;
    let checked = points_equal_steps(&points, &steps)?;
    ensure!(checked > 60, "only {checked} points");
    let by_pod = promql_sum_by(&prom, "profiles_recorded_shop_cpu", "pod")?;
    for pod in ["p1", "p2"] {
        let total = flame_total(
            &kiln,
            "team-a",
            &format!("{{service_name=\"shop\",pod=\"{pod}\"}}"),
        )?;
        ensure!(
            by_pod[pod] == total,
            "{pod}: Prometheus {} != flame graph {total}",
            by_pod[pod]
        );
    }
    ensure!(kiln_metric(&kiln, "kiln_recording_remote_write_samples_dropped_total")? == 0.0);
    ensure!(kiln_metric(&kiln, "kiln_recording_remote_write_samples_rejected_total")? == 0.0);
    Ok(())
}

/// The alert rules `docs/recording-rules.md` shows are valid for Prometheus.
#[test]
fn the_alert_example_is_a_valid_prometheus_rule_file() -> Result<()> {
    let promtool = kiln_e2e::prometheus::prometheus_bin()?.with_file_name("promtool");
    let file = kiln_e2e::repo_root().join("docs/examples/recording-rules-alerts.yml");
    let out = std::process::Command::new(&promtool)
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .with_context(|| format!("running {}", promtool.display()))?;
    ensure!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
