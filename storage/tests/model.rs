//! Model-based test: random sequences of ingest, compaction, garbage collection, retention,
//! tenant deletion, restarts and queries against a naive in-memory model of what was
//! acknowledged. Flame graphs and series must be identical after every step.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kiln_storage::format::meta::{PARTITION_NANOS, partition_of};
use kiln_storage::query::{Aggregation, Exemplars};
use kiln_storage::selector::parse_selector;
use kiln_storage::testing::{config_with_clock, filter, frames, profile};
use kiln_storage::{Storage, StorageConfig};
use proptest::prelude::*;

const T0: i64 = 1_700_000_000_000_000_000 - 1_700_000_000_000_000_000 % PARTITION_NANOS;
/// Time slots are a third of a partition apart, so retention cuts through the data.
const SLOT: i64 = PARTITION_NANOS / 3;
const STEP: i64 = 3600 * 1_000_000_000;
const TENANTS: [&str; 2] = ["alpha", "beta"];
const SERVICES: [&str; 2] = ["api", "db"];
const STACKS: [&str; 5] = ["main;a", "main;a;b", "main;c", "run;x;y", "main"];

#[derive(Debug, Clone)]
struct Sample {
    tenant: usize,
    service: usize,
    stack: usize,
    value: i64,
    slot: i64,
}

#[derive(Debug, Clone)]
enum Op {
    /// Profiles written concurrently (so they share segments), ingested at time slot `at`.
    Ingest {
        at: i64,
        samples: Vec<Sample>,
    },
    Compact,
    CollectGarbage,
    Retention {
        tenant: usize,
        slot: i64,
    },
    DeleteTenant(usize),
    Restart,
}

fn sample() -> impl Strategy<Value = Sample> {
    (0..2usize, 0..2usize, 0..STACKS.len(), 1..100i64, 0..9i64).prop_map(
        |(tenant, service, stack, value, slot)| Sample {
            tenant,
            service,
            stack,
            value,
            slot,
        },
    )
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..9i64, prop::collection::vec(sample(), 1..5))
            .prop_map(|(at, samples)| Op::Ingest { at, samples }),
        2 => Just(Op::Compact),
        1 => Just(Op::CollectGarbage),
        1 => (0..2usize, 0..9i64).prop_map(|(tenant, slot)| Op::Retention { tenant, slot }),
        1 => (0..2usize).prop_map(Op::DeleteTenant),
        1 => Just(Op::Restart),
    ]
}

/// What was acknowledged: samples with the slot they were ingested at.
#[derive(Default)]
struct Model {
    samples: Vec<(i64, Sample)>,
    /// Per tenant, the clock at its last deletion: a write received by then is gone with it
    /// (the ops' clock may go back, as no real one does for long).
    deleted_at: BTreeMap<usize, u64>,
}

type Flame = BTreeMap<Vec<String>, i64>;
type SeriesOut = Vec<(Vec<(String, String)>, Vec<(i64, f64)>)>;

impl Model {
    fn flame(&self, tenant: usize, service: Option<usize>) -> Flame {
        let mut out = Flame::new();
        for (_, s) in &self.samples {
            if s.tenant == tenant && service.is_none_or(|x| x == s.service) {
                *out.entry(frames(STACKS[s.stack])).or_insert(0) += s.value;
            }
        }
        out
    }

    fn series(&self, tenant: usize) -> SeriesOut {
        let start = T0 - PARTITION_NANOS;
        let mut groups: BTreeMap<&str, BTreeMap<i64, f64>> = BTreeMap::new();
        for (_, s) in self.samples.iter().filter(|(_, s)| s.tenant == tenant) {
            let t = T0 + s.slot * SLOT;
            let bucket = (start + (t - start).div_euclid(STEP) * STEP) / 1_000_000;
            *groups
                .entry(SERVICES[s.service])
                .or_default()
                .entry(bucket)
                .or_default() += s.value as f64;
        }
        groups
            .into_iter()
            .map(|(svc, points)| {
                (
                    vec![("service_name".to_string(), svc.to_string())],
                    points.into_iter().collect(),
                )
            })
            .collect()
    }
}

async fn check(s: &Storage, model: &Model) -> Result<(), TestCaseError> {
    for (t, tenant) in TENANTS.iter().enumerate() {
        let f = filter(tenant, "{}", T0 - PARTITION_NANOS, T0 + 10 * SLOT);
        let got = s.query().merge_tree(&f).await.unwrap().stacks();
        prop_assert_eq!(&got, &model.flame(t, None), "flame graph of {}", tenant);
        for (v, svc) in SERVICES.iter().enumerate() {
            let sel = format!("{{service_name=\"{svc}\"}}");
            let f = filter(tenant, &sel, T0 - PARTITION_NANOS, T0 + 10 * SLOT);
            let got = s.query().merge_tree(&f).await.unwrap().stacks();
            prop_assert_eq!(&got, &model.flame(t, Some(v)), "{} of {}", sel, tenant);
        }
        let got: SeriesOut = s
            .query()
            .select_series(
                &f,
                &["service_name".to_string()],
                STEP,
                Aggregation::Sum,
                None,
                Exemplars::None,
            )
            .await
            .unwrap()
            .into_iter()
            .map(|x| (x.labels, x.points))
            .collect();
        prop_assert_eq!(&got, &model.series(t), "series of {}", tenant);

        // Label values and names, read from each block's series index (ADR 0017).
        let services: Vec<String> = model
            .series(t)
            .into_iter()
            .map(|(l, _)| l[0].1.clone())
            .collect();
        let (start, end) = (T0 - PARTITION_NANOS, T0 + 10 * SLOT);
        let q = s.query();
        let got = q
            .label_values(tenant, "service_name", &[], start, end)
            .await
            .unwrap();
        prop_assert_eq!(&got, &services, "services of {}", tenant);
        for svc in SERVICES {
            let sel = parse_selector(&format!("{{service_name=~\"{svc}|nothing\"}}")).unwrap();
            let got = q
                .label_values(tenant, "service_name", &[sel], start, end)
                .await
                .unwrap();
            let want: Vec<String> = services.iter().filter(|s| *s == svc).cloned().collect();
            prop_assert_eq!(&got, &want, "{} of {}", svc, tenant);
        }
        let names = q.label_names(tenant, &[], start, end).await.unwrap();
        prop_assert_eq!(
            names.contains(&"service_name".to_string()),
            !services.is_empty(),
            "label names of {}: {:?}",
            tenant,
            names
        );
    }
    Ok(())
}

async fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(AtomicU64::new(0));
    let cfg: StorageConfig = config_with_clock(dir.path(), clock.clone());
    let mut s = Storage::open(cfg.clone()).await.unwrap();
    let mut model = Model::default();
    for op in ops {
        match op {
            Op::Ingest { at, samples } => {
                let now_ms = ((T0 + at * SLOT) / 1_000_000) as u64;
                clock.store(now_ms, Ordering::SeqCst);
                let writes = samples.iter().map(|x| {
                    let p = profile(
                        SERVICES[x.service],
                        &[(frames(STACKS[x.stack]), x.value)],
                        T0 + x.slot * SLOT,
                    );
                    s.write(TENANTS[x.tenant], p)
                });
                for r in futures::future::join_all(writes).await {
                    r.unwrap();
                }
                let gone = |x: &Sample| model.deleted_at.get(&x.tenant) >= Some(&now_ms);
                let kept: Vec<Sample> = samples.into_iter().filter(|x| !gone(x)).collect();
                model.samples.extend(kept.into_iter().map(|x| (at, x)));
            }
            Op::Compact => {
                s.compactor().compact_all(u64::MAX / 2).await.unwrap();
            }
            Op::CollectGarbage => {
                s.collect_garbage(u64::MAX).await.unwrap();
            }
            Op::Retention { tenant, slot } => {
                let before = T0 + slot * SLOT;
                s.apply_retention(TENANTS[tenant], before).await.unwrap();
                let cut = partition_of(before);
                model
                    .samples
                    .retain(|(at, x)| x.tenant != tenant || partition_of(T0 + at * SLOT) >= cut);
            }
            Op::DeleteTenant(tenant) => {
                s.delete_tenant(TENANTS[tenant]).await.unwrap();
                model.samples.retain(|(_, x)| x.tenant != tenant);
                let at = model.deleted_at.entry(tenant).or_default();
                *at = (*at).max(clock.load(Ordering::SeqCst));
            }
            Op::Restart => {
                s.close().await;
                drop(s);
                s = Storage::open(cfg.clone()).await.unwrap();
            }
        }
        check(&s, &model).await?;
    }
    s.compactor().compact_all(u64::MAX / 2).await.unwrap();
    s.collect_garbage(u64::MAX).await.unwrap();
    check(&s, &model).await
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn storage_matches_the_model(ops in prop::collection::vec(op(), 1..24)) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(run(ops))?;
    }
}
