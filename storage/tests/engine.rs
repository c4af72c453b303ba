//! The storage engine end to end, in process: write through the shard writer, flush to Parquet
//! and symbols on the local object store, register in the embedded metastore, query back.

use std::collections::BTreeMap;
use std::time::Duration;

use kiln_otel::labels::parse_app_name;
use kiln_otel::model::{Labels, NormalizedProfile};
use kiln_otel::{IngestMeta, NormalizeLimits};
use kiln_storage::query::{Aggregation, Exemplars, SampleFilter};
use kiln_storage::selector::parse_selector;
use kiln_storage::{Storage, StorageConfig};

const T0: i64 = 1_700_000_000_000_000_000;
const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

fn profile(name: &str, folded: &str, time: i64, span: u64) -> NormalizedProfile {
    let stacks = kiln_otel::folded::parse_folded(folded).unwrap();
    let meta = IngestMeta {
        time_nanos: time,
        ..Default::default()
    };
    let mut p = kiln_otel::folded::from_text_stacks(
        &stacks,
        &parse_app_name(name).unwrap(),
        100,
        &meta,
        &NormalizeLimits::default(),
    )
    .unwrap();
    for s in &mut p.series {
        for x in &mut s.samples {
            x.span_id = span;
        }
    }
    p
}

fn filter(tenant: &str, selector: &str) -> SampleFilter {
    SampleFilter {
        tenant: tenant.into(),
        profile_type: CPU.into(),
        selector: parse_selector(selector).unwrap(),
        start_nanos: T0 - 1_000_000_000_000,
        end_nanos: T0 + 1_000_000_000_000,
        span_ids: vec![],
        trace_ids: vec![],
        profile_ids: vec![],
    }
}

fn config(dir: &std::path::Path) -> StorageConfig {
    let mut c = StorageConfig::new(dir);
    c.writer.flush_interval = Duration::from_millis(20);
    c
}

async fn stacks(s: &Storage, f: &SampleFilter) -> BTreeMap<Vec<String>, i64> {
    s.query().merge_tree(f).await.unwrap().stacks()
}

fn key(frames: &[&str]) -> Vec<String> {
    frames.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_query_restart_and_isolation() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = Storage::open(config(dir.path())).await.unwrap();
        let (a, b, c) = tokio::join!(
            s.write(
                "acme",
                profile(
                    "api.cpu{env=prod,region=eu}",
                    "main;handle;parse 3\nmain;idle 1",
                    T0,
                    0
                )
            ),
            s.write(
                "acme",
                profile(
                    "api.cpu{env=dev,region=us}",
                    "main;handle;render 2",
                    T0 + 10_000_000_000,
                    7
                )
            ),
            s.write(
                "globex",
                profile("secret.cpu{env=prod}", "main;globex_only 5", T0, 0)
            ),
        );
        // Tenant ids may hold characters object stores percent-encode.
        s.write("team*(1)", profile("odd.cpu", "main;odd 1", T0, 0))
            .await
            .unwrap();
        a.unwrap();
        b.unwrap();
        c.unwrap();
        s.write(
            "acme",
            profile("worker.cpu{env=prod}", "run;job 4", T0 + 20_000_000_000, 0),
        )
        .await
        .unwrap();

        let all = stacks(&s, &filter("acme", "{}")).await;
        assert_eq!(
            all.get(&key(&["main", "handle", "parse"])),
            Some(&30_000_000)
        );
        assert_eq!(
            all.get(&key(&["main", "handle", "render"])),
            Some(&20_000_000)
        );
        assert_eq!(all.get(&key(&["run", "job"])), Some(&40_000_000));
        assert!(
            all.keys().all(|k| !k.contains(&"globex_only".to_string())),
            "tenant wall"
        );
        assert_eq!(all.values().sum::<i64>(), 100_000_000);
        s.close().await;
        let err = s
            .write("acme", profile("api.cpu", "a 1", T0, 0))
            .await
            .unwrap_err();
        assert!(matches!(err, kiln_storage::Error::ShuttingDown), "{err}");
    }

    // Everything acknowledged survives a restart.
    let s = Storage::open(config(dir.path())).await.unwrap();
    let q = s.query();
    let only = |sel: &str| filter("acme", sel);
    assert_eq!(
        stacks(&s, &only(r#"{service_name="api"}"#))
            .await
            .values()
            .sum::<i64>(),
        60_000_000
    );
    assert_eq!(
        stacks(&s, &only(r#"{env="prod"}"#))
            .await
            .values()
            .sum::<i64>(),
        80_000_000
    );
    assert_eq!(
        stacks(&s, &only(r#"{env!="prod"}"#))
            .await
            .values()
            .sum::<i64>(),
        20_000_000
    );
    assert_eq!(
        stacks(&s, &only(r#"{region=~"e.*"}"#))
            .await
            .values()
            .sum::<i64>(),
        40_000_000
    );
    assert_eq!(
        stacks(&s, &only(r#"{region!~"e.*"}"#))
            .await
            .values()
            .sum::<i64>(),
        60_000_000
    );
    assert_eq!(
        stacks(&s, &only(r#"{region=""}"#))
            .await
            .values()
            .sum::<i64>(),
        40_000_000
    );
    assert_eq!(
        stacks(&s, &only(r#"{region="nowhere"}"#))
            .await
            .values()
            .sum::<i64>(),
        0
    );
    assert_eq!(
        stacks(&s, &only(r#"{missing="x"}"#))
            .await
            .values()
            .sum::<i64>(),
        0
    );
    let mut spans = only("{}");
    spans.span_ids = vec![7];
    assert_eq!(
        stacks(&s, &spans).await,
        BTreeMap::from([(key(&["main", "handle", "render"]), 20_000_000)])
    );
    let mut narrow = only("{}");
    narrow.start_nanos = T0 + 5_000_000_000;
    narrow.end_nanos = T0 + 15_000_000_000;
    assert_eq!(stacks(&s, &narrow).await.values().sum::<i64>(), 20_000_000);

    // Another tenant sees only its own data, whatever it asks for.
    assert_eq!(
        stacks(&s, &filter("globex", "{}")).await,
        BTreeMap::from([(key(&["main", "globex_only"]), 50_000_000)])
    );
    assert!(stacks(&s, &filter("nobody", "{}")).await.is_empty());
    assert_eq!(
        stacks(&s, &filter("team*(1)", "{}")).await,
        BTreeMap::from([(key(&["main", "odd"]), 10_000_000)])
    );
    let names = q
        .label_names("globex", &[], i64::MIN, i64::MAX)
        .await
        .unwrap();
    assert!(!names.contains(&"region".to_string()), "{names:?}");
    let values = q
        .label_values("acme", "service_name", &[], i64::MIN, i64::MAX)
        .await
        .unwrap();
    assert_eq!(values, ["api", "worker"]);
    let values = q
        .label_values(
            "acme",
            "env",
            &[parse_selector(r#"{service_name="api"}"#).unwrap()],
            i64::MIN,
            i64::MAX,
        )
        .await
        .unwrap();
    assert_eq!(values, ["dev", "prod"]);
    let types = q.profile_types("acme", i64::MIN, i64::MAX).await.unwrap();
    assert_eq!(types.iter().map(|t| t.id()).collect::<Vec<_>>(), [CPU]);
    let stats = q.profile_stats("acme").await.unwrap();
    assert_eq!(
        (stats.oldest_nanos, stats.newest_nanos),
        (T0, T0 + 20_000_000_000)
    );

    // Series: grouped by env, 10 s steps.
    let series = q
        .select_series(
            &only("{}"),
            &["env".to_string()],
            10_000_000_000,
            Aggregation::Sum,
            None,
            Exemplars::None,
        )
        .await
        .unwrap();
    let got: Vec<(Labels, Vec<(i64, f64)>)> = series
        .into_iter()
        .map(|s| (Labels::from_pairs(s.labels), s.points))
        .collect();
    let start_ms = (T0 - 1_000_000_000_000) / 1_000_000;
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].0.get("env"), Some("dev"));
    assert_eq!(got[0].1, [(start_ms + 1_010_000, 20_000_000.0)]);
    assert_eq!(
        got[1].1,
        [
            (start_ms + 1_000_000, 40_000_000.0),
            (start_ms + 1_020_000, 40_000_000.0)
        ]
    );

    // pprof export holds the same totals.
    let p = q.merge_pprof(&only("{}")).await.unwrap();
    assert_eq!(
        p.sample.iter().map(|s| s.value[0]).sum::<i64>(),
        100_000_000
    );
    assert_eq!(p.string_table[p.sample_type[0].r#type as usize], "cpu");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_sample_labels_reach_pprof_output() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(config(dir.path())).await.unwrap();
    let mut p = profile("labels.cpu", "main;a 1\nmain;b 2", T0, 0);
    p.series[0].samples[0].labels = vec![("thread.name".into(), "worker-1".into())];
    s.write("t", p).await.unwrap();
    let out = s.query().merge_pprof(&filter("t", "{}")).await.unwrap();
    let key = out
        .string_table
        .iter()
        .position(|x| x == "thread.name")
        .expect("the label name is in the string table") as i64;
    let labelled: Vec<_> = out
        .sample
        .iter()
        .filter(|x| x.label.iter().any(|l| l.key == key))
        .collect();
    assert_eq!(labelled.len(), 1);
    assert_eq!(labelled[0].value, [10_000_000]);
    assert_eq!(
        out.sample.iter().map(|x| x.value[0]).sum::<i64>(),
        30_000_000
    );
}

/// A write with a time no query can reach (before 2000, past a day from now, or a sample's own
/// time out of range) is refused as invalid, and nothing of it is stored; good writes around it are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn times_outside_the_accepted_range_are_refused_not_lost() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(config(dir.path())).await.unwrap();
    s.write("acme", profile("api.cpu", "main;ok 1", T0, 0))
        .await
        .unwrap();
    let week = 7 * 24 * 3600 * 1_000_000_000;
    let now = kiln_storage::testing::now_ms() as i64 * 1_000_000;
    let mut late_sample = profile("api.cpu", "main;late 1", T0, 0);
    late_sample.series[0].samples[0].timestamp_nanos = now + week;
    for (what, p) in [
        ("i64::MAX", profile("api.cpu", "main;max 1", i64::MAX, 0)),
        (
            "1970",
            profile("api.cpu", "main;old 1", 86_400_000_000_000, 0),
        ),
        (
            "a week ahead",
            profile("api.cpu", "main;ahead 1", now + week, 0),
        ),
        ("a sample a week ahead", late_sample),
    ] {
        let e = s.write("acme", p).await.expect_err(what);
        assert!(e.is_invalid_input(), "{what}: {e}");
        assert!(e.to_string().contains("outside the range"), "{what}: {e}");
    }
    // Within a day ahead is accepted (agents' clocks run ahead).
    s.write(
        "acme",
        profile("api.cpu", "main;soon 1", now + 3_600_000_000_000, 0),
    )
    .await
    .unwrap();
    let all = SampleFilter {
        start_nanos: 0,
        end_nanos: now + 2 * week,
        ..filter("acme", "{}")
    };
    let got = stacks(&s, &all).await;
    assert_eq!(
        got.keys().map(|k| k.join(";")).collect::<Vec<_>>(),
        ["main;ok", "main;soon"]
    );
    assert!(
        stacks(
            &s,
            &SampleFilter {
                tenant: "other".into(),
                ..all
            }
        )
        .await
        .is_empty()
    );
}
