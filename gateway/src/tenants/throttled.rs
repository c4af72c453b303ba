//! The minutes in which a tenant's ingest was refused for its rate. `SelectSeries` marks the
//! points of those minutes with Pyroscope's `pyroscope.ingest.throttled` annotation, which
//! Grafana draws as "Ingestion limit reached" over the chart.
//!
//! Where the state lives: each process counts its own refusals here, by (tenant, minute).
//! With a shared metastore, upkeep adds what this process counted to the metastore every
//! 10 s (`flush_usage`), and queries read the cluster's minutes back from it. With the embedded
//! metastore this process is the only one: its record here is the tenant's, kept in memory for
//! [`KEPT`] and within [`MAX_MINUTES`] minutes over all tenants (lost on restart).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use kiln_storage::metastore::{Metastore, THROTTLED_KEPT_MS};

/// A minute, in Unix milliseconds.
pub const MINUTE_MS: i64 = 60_000;

/// How long this process keeps the minutes it counted.
pub const KEPT: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// The most minutes kept over all tenants; past it the oldest minute of the tenant holding the
/// most goes first. About 64 bytes each: 4 MiB in all.
pub const MAX_MINUTES: usize = 1 << 16;

/// Refusals by tenant and minute: what this process counted ([`Throttled::record`]) and the
/// part of it not yet added to a shared metastore ([`Throttled::unflushed`]).
#[derive(Debug)]
pub struct Throttled {
    state: Mutex<State>,
    /// A shared metastore's minutes of each tenant (the last [`THROTTLED_KEPT_MS`]), read
    /// again after [`SHARED_FOR`]: a dashboard's series queries cost one metastore read.
    shared: moka::future::Cache<String, Arc<Vec<(i64, u64)>>>,
}

/// How long a query process reuses a tenant's minutes read from a shared metastore. The
/// ingest processes add theirs every 10 s, so a marker shows up to 15 s after its refusal.
pub const SHARED_FOR: std::time::Duration = std::time::Duration::from_secs(5);

impl Default for Throttled {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            shared: moka::future::Cache::builder()
                .time_to_live(SHARED_FOR)
                .weigher(|_, v: &Arc<Vec<(i64, u64)>>| v.len().max(1) as u32)
                .max_capacity(MAX_MINUTES as u64)
                .build(),
        }
    }
}

#[derive(Debug, Default)]
struct State {
    kept: HashMap<String, BTreeMap<i64, u64>>,
    minutes: usize,
    unflushed: HashMap<(String, i64), u64>,
    /// When minutes were last dropped by age.
    pruned_ms: i64,
}

impl Throttled {
    /// Counts a refusal of `tenant` at `now_ms`.
    pub fn record(&self, tenant: &str, now_ms: i64) {
        let minute = now_ms.div_euclid(MINUTE_MS) * MINUTE_MS;
        let mut s = self.state.lock().expect("throttled lock");
        *s.unflushed.entry((tenant.to_owned(), minute)).or_default() += 1;
        let minutes = s.kept.entry(tenant.to_owned()).or_default();
        let new = !minutes.contains_key(&minute);
        *minutes.entry(minute).or_default() += 1;
        if new {
            s.minutes += 1;
        }
        s.prune(now_ms);
    }

    /// The minutes of `tenant` from `from_ms` to `to_ms` (inclusive) this process counted,
    /// with their refusals.
    pub fn minutes(&self, tenant: &str, from_ms: i64, to_ms: i64) -> Vec<(i64, u64)> {
        let s = self.state.lock().expect("throttled lock");
        s.kept
            .get(tenant)
            .map(|m| m.range(from_ms..=to_ms).map(|(k, v)| (*k, *v)).collect())
            .unwrap_or_default()
    }

    /// The minutes of `tenant` from `from_ms` to `to_ms` (inclusive), sorted: the cluster's
    /// from a shared metastore (read at most every [`SHARED_FOR`]), else this process's own.
    pub async fn minutes_of(
        &self,
        metastore: &dyn Metastore,
        tenant: &str,
        from_ms: i64,
        to_ms: i64,
    ) -> kiln_storage::Result<Vec<i64>> {
        if !metastore.shared() {
            return Ok(self
                .minutes(tenant, from_ms, to_ms)
                .into_iter()
                .map(|(m, _)| m)
                .collect());
        }
        let all = self
            .shared
            .try_get_with(tenant.to_owned(), async {
                let now_ms = crate::time::now_nanos().div_euclid(1_000_000);
                let kept = metastore
                    .throttled(tenant, now_ms - THROTTLED_KEPT_MS, i64::MAX)
                    .await?
                    .unwrap_or_default();
                Ok::<_, kiln_storage::Error>(Arc::new(kept))
            })
            .await
            .map_err(|e| {
                Arc::try_unwrap(e)
                    .unwrap_or_else(|e| kiln_storage::Error::MetastoreUnavailable(e.to_string()))
            })?;
        Ok(all
            .iter()
            .map(|(m, _)| *m)
            .filter(|m| (from_ms..=to_ms).contains(m))
            .collect())
    }

    /// Takes what was counted since the last call, as (tenant, minute, refusals); a caller that
    /// fails to store it gives it back with [`Throttled::restore`].
    pub fn unflushed(&self) -> Vec<(String, i64, u64)> {
        let mut s = self.state.lock().expect("throttled lock");
        s.unflushed
            .drain()
            .map(|((tenant, minute), n)| (tenant, minute, n))
            .collect()
    }

    /// Gives back counts [`Throttled::unflushed`] took, for the next flush.
    pub fn restore(&self, counts: Vec<(String, i64, u64)>) {
        let mut s = self.state.lock().expect("throttled lock");
        for (tenant, minute, n) in counts {
            *s.unflushed.entry((tenant, minute)).or_default() += n;
        }
    }
}

impl State {
    /// Drops minutes older than [`KEPT`], then the oldest of the largest tenants past
    /// [`MAX_MINUTES`].
    fn prune(&mut self, now_ms: i64) {
        let oldest = now_ms - KEPT.as_millis() as i64;
        // By age at most once a minute: a refusal costs a walk over the tenants no more often.
        if now_ms - self.pruned_ms >= MINUTE_MS {
            self.pruned_ms = now_ms;
            for m in self.kept.values_mut() {
                *m = m.split_off(&oldest);
            }
            self.kept.retain(|_, m| !m.is_empty());
            self.minutes = self.kept.values().map(BTreeMap::len).sum();
        }
        while self.minutes > MAX_MINUTES {
            let Some(largest) = self
                .kept
                .iter_mut()
                .max_by_key(|(_, m)| m.len())
                .map(|(_, m)| m)
            else {
                break;
            };
            largest.pop_first();
            self.minutes -= 1;
            if self.minutes <= MAX_MINUTES {
                // Only past the bound: a refusal otherwise walks no tenant.
                self.kept.retain(|_, m| !m.is_empty());
            }
        }
    }
}

/// The annotation of a point whose step holds throttled minutes, as Pyroscope writes it: a
/// JSON `{"body": {...}}` with the limit and when it was last seen reached. Kiln's limit is a
/// rate, so `periodType` is `second` and `periodLimitMb` the rate in MiB a second;
/// `limitResetTime` (Unix seconds) is the end of the last throttled minute in the step. Kiln
/// lets no sampled request through, so the sampling fields are 0.
pub fn annotation(
    rate_bytes: u64,
    last_minute_ms: i64,
) -> kiln_proto::types::v1::ProfileAnnotation {
    let body = serde_json::json!({
        "body": {
            "periodType": "second",
            "periodLimitMb": rate_bytes as f64 / (1 << 20) as f64,
            "limitResetTime": (last_minute_ms + MINUTE_MS) / 1000,
            "samplingPeriodSec": 0,
            "samplingRequests": 0,
            "usageGroup": "",
        }
    });
    kiln_proto::types::v1::ProfileAnnotation {
        key: THROTTLED_KEY.to_owned(),
        value: body.to_string(),
    }
}

/// Pyroscope's key of the throttling annotation (`pkg/distributor/annotation`).
pub const THROTTLED_KEY: &str = "pyroscope.ingest.throttled";

/// For each point of a series of `step_ms` steps, the last throttled minute its step overlaps:
/// a point at `t` covers `[t, t + step)`, and a minute `[m, m + 60 s)` overlaps it when
/// `m < t + step` and `m + 60 s > t`. `minutes` is sorted.
pub fn last_minute_in_step(minutes: &[i64], t: i64, step_ms: i64) -> Option<i64> {
    let end = t.saturating_add(step_ms.max(1));
    let upto = minutes.partition_point(|m| *m < end);
    minutes[..upto]
        .last()
        .copied()
        .filter(|m| m + MINUTE_MS > t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minutes_are_counted_taken_once_and_bounded() {
        let th = Throttled::default();
        let t0 = 1_700_000_000_000 - 1_700_000_000_000 % MINUTE_MS;
        th.record("a", t0 + 5);
        th.record("a", t0 + 59_999);
        th.record("a", t0 + MINUTE_MS);
        th.record("b", t0);
        assert_eq!(
            th.minutes("a", t0, t0 + MINUTE_MS),
            vec![(t0, 2), (t0 + MINUTE_MS, 1)]
        );
        assert_eq!(th.minutes("a", t0 + 1, t0 + MINUTE_MS - 1), vec![]);
        assert_eq!(th.minutes("c", 0, i64::MAX), vec![]);
        let mut taken = th.unflushed();
        taken.sort();
        assert_eq!(
            taken,
            vec![
                ("a".to_owned(), t0, 2),
                ("a".to_owned(), t0 + MINUTE_MS, 1),
                ("b".to_owned(), t0, 1)
            ]
        );
        assert!(th.unflushed().is_empty());
        th.restore(taken);
        assert_eq!(th.unflushed().len(), 3);
        // A week on, the old minutes are gone.
        let later = t0 + KEPT.as_millis() as i64 + 2 * MINUTE_MS;
        th.record("b", later);
        assert_eq!(th.minutes("a", 0, i64::MAX), vec![]);
        assert_eq!(th.minutes("b", 0, i64::MAX).len(), 1);
        // Past the bound, the largest tenant loses its oldest minutes.
        // Eight tenants of 8,292 minutes each (under a week) pass the bound together.
        let per_tenant = MAX_MINUTES as i64 / 8 + 100;
        for i in 0..per_tenant {
            for t in 0..8 {
                th.record(&format!("t{t}"), later + i * MINUTE_MS);
            }
        }
        let s = th.state.lock().unwrap();
        assert_eq!(s.minutes, MAX_MINUTES);
        assert_eq!(s.kept["b"].len(), 1, "the small tenant keeps its minute");
        let sizes: Vec<usize> = (0..8).map(|t| s.kept[&format!("t{t}")].len()).collect();
        assert!(
            sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1,
            "{sizes:?}"
        );
    }

    #[test]
    fn a_point_takes_the_last_minute_its_step_overlaps() {
        let m = MINUTE_MS;
        let minutes = [10 * m, 11 * m, 20 * m];
        // A one-minute step at 10 m: its own minute only.
        assert_eq!(last_minute_in_step(&minutes, 10 * m, m), Some(10 * m));
        // A 15 s step inside minute 11.
        assert_eq!(
            last_minute_in_step(&minutes, 11 * m + 30_000, 15_000),
            Some(11 * m)
        );
        // A step of 5 minutes from 9 m: minutes 10 and 11, the last of them.
        assert_eq!(last_minute_in_step(&minutes, 9 * m, 5 * m), Some(11 * m));
        // Steps that touch none.
        assert_eq!(last_minute_in_step(&minutes, 12 * m, 5 * m), None);
        assert_eq!(last_minute_in_step(&minutes, 9 * m, m), None);
        assert_eq!(last_minute_in_step(&[], 0, m), None);
    }

    #[test]
    fn the_annotation_is_what_grafana_reads() {
        let a = annotation(4 << 20, 1_700_000_040_000);
        assert_eq!(a.key, "pyroscope.ingest.throttled");
        let v: serde_json::Value = serde_json::from_str(&a.value).unwrap();
        assert_eq!(v["body"]["periodType"], "second");
        assert_eq!(v["body"]["periodLimitMb"], 4.0);
        assert_eq!(v["body"]["limitResetTime"], 1_700_000_100);
        assert_eq!(v["body"]["usageGroup"], "");
    }
}
