//! A tenant's rule series: the counters through the last sealed interval, the sums of the
//! intervals still open, and the late sums (profiles whose interval was already sealed when
//! they were acknowledged). Pure bookkeeping: no I/O (the engine, `crate::recording`, makes it
//! durable).
//!
//! Time is cut into intervals of `interval_ms` on a grid through `sealed_through`. Sealing
//! through `t` adds each open interval before `t` to the counters, in order, and emits every
//! live series at each interval's end: a counter that only grows, so Prometheus can `rate()` it
//! and the difference of two points is exactly what was acknowledged between them. A series
//! seen for the first time also gets a point of 0 at the start of its first interval, so its
//! first interval counts too.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

/// One output series of a rule: the rule's id and the values of its `group_by` labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SeriesKey {
    pub rule: String,
    pub group: Vec<(String, String)>,
}

/// A profile's part in one series and interval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contribution {
    pub key: SeriesKey,
    /// Unix milliseconds of the sample (the interval is found when it is added).
    pub time_ms: i64,
    pub value: i64,
}

/// A point to send: a series, a time and the counter's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Point {
    pub key: SeriesKey,
    pub time_ms: i64,
    pub value: i64,
}

/// Series idle this long stop being sent (Prometheus marks them stale); one that comes back
/// starts again from 0, a counter reset `rate()` understands.
pub const IDLE_MS: i64 = 3_600_000;

/// What survives a restart (the tenant document `recording-state.json`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Checkpoint {
    pub interval_ms: i64,
    pub sealed_through_ms: i64,
    pub counters: Vec<CounterState>,
    /// Late sums not yet sealed.
    pub carry: Vec<(SeriesKey, i64)>,
    /// The rules these counters were started for (a rule not among them is new: backfilled).
    pub rules: Vec<String>,
    /// In a cluster: the interval from which each rule counts its level-0 sums; what came
    /// before is its backfill's (ADR 0021).
    pub activations: Vec<(String, i64)>,
}

/// One series' counter in a [`Checkpoint`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterState {
    pub key: SeriesKey,
    pub value: i64,
    /// The end of the last interval that added to it (for [`IDLE_MS`]).
    pub active_ms: i64,
}

/// A tenant's series.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantState {
    interval_ms: i64,
    sealed_through: i64,
    /// Series -> (value through `sealed_through`, end of the last interval that added).
    counters: BTreeMap<SeriesKey, (i64, i64)>,
    /// Interval start -> series -> sum.
    open: BTreeMap<i64, HashMap<SeriesKey, i64>>,
    carry: BTreeMap<SeriesKey, i64>,
    started: std::collections::BTreeSet<String>,
    /// Every series of `counters`, `open` and `carry` (so a write checks its keys, not them all).
    known: std::collections::HashSet<SeriesKey>,
}

/// What [`TenantState::add`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Added {
    /// Contributions to already sealed intervals (kept as late sums).
    pub late: usize,
    /// Contributions refused because they would start a series past the cap.
    pub refused: usize,
}

impl TenantState {
    /// A fresh state: nothing sealed before the interval that holds `now_ms`.
    pub fn new(interval_ms: i64, now_ms: i64) -> Self {
        let interval_ms = interval_ms.max(1);
        Self {
            interval_ms,
            sealed_through: now_ms.div_euclid(interval_ms) * interval_ms,
            counters: BTreeMap::new(),
            open: BTreeMap::new(),
            carry: BTreeMap::new(),
            started: Default::default(),
            known: Default::default(),
        }
    }

    /// The state a checkpoint kept; its grid continues with `interval_ms` from where it was
    /// sealed.
    pub fn from_checkpoint(c: Checkpoint, interval_ms: i64) -> Self {
        let mut s = Self {
            interval_ms: interval_ms.max(1),
            sealed_through: c.sealed_through_ms,
            counters: c
                .counters
                .into_iter()
                .map(|s| (s.key, (s.value, s.active_ms)))
                .collect(),
            open: BTreeMap::new(),
            carry: c.carry.into_iter().collect(),
            started: c.rules.into_iter().collect(),
            known: Default::default(),
        };
        s.refresh_known();
        s
    }

    /// Moves the grid to the interval holding `now_ms` (a state too old to resume); the
    /// counters and late sums stay.
    pub fn restart_grid(&mut self, now_ms: i64) {
        self.sealed_through = now_ms.div_euclid(self.interval_ms) * self.interval_ms;
        self.open.clear();
        self.refresh_known();
    }

    fn refresh_known(&mut self) {
        let mut known: std::collections::HashSet<SeriesKey> =
            self.counters.keys().cloned().collect();
        known.extend(self.carry.keys().cloned());
        for sums in self.open.values() {
            known.extend(sums.keys().cloned());
        }
        self.known = known;
    }

    /// What to keep.
    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            interval_ms: self.interval_ms,
            sealed_through_ms: self.sealed_through,
            counters: self
                .counters
                .iter()
                .map(|(key, &(value, active_ms))| CounterState {
                    key: key.clone(),
                    value,
                    active_ms,
                })
                .collect(),
            carry: self.carry.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            rules: self.started.iter().cloned().collect(),
            activations: Vec::new(),
        }
    }

    /// Everything before this time is sealed.
    pub fn sealed_through(&self) -> i64 {
        self.sealed_through
    }

    /// The start of the interval holding `t`.
    pub fn interval_of(&self, t_ms: i64) -> i64 {
        let i = i128::from(self.interval_ms);
        let base = i128::from(self.sealed_through);
        (base + (i128::from(t_ms) - base).div_euclid(i) * i) as i64
    }

    /// The interval length.
    pub fn interval_ms(&self) -> i64 {
        self.interval_ms
    }

    /// Series this state knows (counters, open and late sums).
    pub fn series(&self) -> usize {
        self.known.len()
    }

    /// Adds acknowledged contributions: to their open interval, or to the late sums when
    /// their interval is sealed. A series the state does not know is started only while the
    /// state holds fewer than `max_series`.
    pub fn add(&mut self, contributions: &[Contribution], max_series: usize) -> Added {
        let mut added = Added::default();
        for c in contributions {
            if !self.known.contains(&c.key) {
                if self.known.len() >= max_series {
                    added.refused += 1;
                    continue;
                }
                self.known.insert(c.key.clone());
            }
            let interval = self.interval_of(c.time_ms);
            let slot = if interval < self.sealed_through {
                added.late += 1;
                self.carry.entry(c.key.clone()).or_default()
            } else {
                self.open
                    .entry(interval)
                    .or_default()
                    .entry(c.key.clone())
                    .or_default()
            };
            *slot = slot.saturating_add(c.value);
        }
        added
    }

    /// Replaces the open sums of `rule` with `sums` (series, interval start, value): what the
    /// stored profiles hold for it from `sealed_through` on, read at start-up or when the rule
    /// is made.
    pub fn replace_open(
        &mut self,
        rule: &str,
        sums: impl IntoIterator<Item = (SeriesKey, i64, i64)>,
    ) {
        for s in self.open.values_mut() {
            s.retain(|k, _| k.rule != rule);
        }
        for (key, start, value) in sums {
            let start = self.interval_of(start);
            if start < self.sealed_through {
                continue;
            }
            let slot = self.open.entry(start).or_default().entry(key).or_default();
            *slot = slot.saturating_add(value);
        }
        self.open.retain(|_, s| !s.is_empty());
        self.refresh_known();
    }

    /// Whether the state counts for `rule` already.
    pub fn started(&self, rule: &str) -> bool {
        self.started.contains(rule)
    }

    /// Whether the state counts for `rule` already; marks it so.
    pub fn start(&mut self, rule: &str) -> bool {
        !self.started.insert(rule.to_owned())
    }

    /// Sets counters at the sealed point (a new rule's backfilled totals).
    pub fn seed_counters(&mut self, totals: impl IntoIterator<Item = (SeriesKey, i64)>) {
        for (key, value) in totals {
            self.counters.insert(key, (value, self.sealed_through));
        }
        self.refresh_known();
    }

    /// Forgets the series of the rules `keep` refuses (deleted ones).
    pub fn retain_rules(&mut self, keep: impl Fn(&str) -> bool) {
        self.started.retain(|r| keep(r));
        self.counters.retain(|k, _| keep(&k.rule));
        self.carry.retain(|k, _| keep(&k.rule));
        for s in self.open.values_mut() {
            s.retain(|k, _| keep(&k.rule));
        }
        self.open.retain(|_, s| !s.is_empty());
        self.refresh_known();
    }

    /// Where sealing may go at `now_ms` when intervals are sealed `delay_ms` after they end:
    /// `Some(t)` past the sealed point, on the grid.
    pub fn due(&self, now_ms: i64, delay_ms: i64) -> Option<i64> {
        let t = self.interval_of(now_ms.saturating_sub(delay_ms));
        (t > self.sealed_through).then_some(t)
    }

    /// Seals every interval before `through` (on the grid), in order: the late sums go into
    /// the first, each interval's sums into the counters, and every live series is emitted
    /// at each interval's end (a new series at its first interval's start too, with 0).
    pub fn seal(&mut self, through: i64) -> Vec<Point> {
        let mut points = Vec::new();
        let mut start = self.sealed_through;
        let mut carry = std::mem::take(&mut self.carry);
        while start < through {
            let end = start + self.interval_ms;
            let mut sums = self.open.remove(&start).unwrap_or_default();
            for (k, v) in std::mem::take(&mut carry) {
                let slot = sums.entry(k).or_default();
                *slot = slot.saturating_add(v);
            }
            let mut sums: Vec<(SeriesKey, i64)> = sums.into_iter().collect();
            sums.sort();
            for (key, value) in sums {
                let counter = self.counters.entry(key.clone()).or_insert_with(|| {
                    points.push(Point {
                        key: key.clone(),
                        time_ms: start,
                        value: 0,
                    });
                    (0, end)
                });
                counter.0 = counter.0.saturating_add(value);
                counter.1 = end;
            }
            self.counters
                .retain(|_, (_, active)| end - *active < IDLE_MS);
            points.extend(self.counters.iter().map(|(key, &(value, _))| Point {
                key: key.clone(),
                time_ms: end,
                value,
            }));
            start = end;
        }
        self.sealed_through = start.max(self.sealed_through);
        self.refresh_known();
        points
    }

    /// The counters through the sealed point, with that time.
    pub fn counters(&self) -> impl Iterator<Item = (&SeriesKey, i64)> {
        self.counters.iter().map(|(k, &(v, _))| (k, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(rule: &str, pod: &str) -> SeriesKey {
        SeriesKey {
            rule: rule.into(),
            group: vec![("pod".into(), pod.into())],
        }
    }

    fn c(k: &SeriesKey, time_ms: i64, value: i64) -> Contribution {
        Contribution {
            key: k.clone(),
            time_ms,
            value,
        }
    }

    #[test]
    fn counters_grow_by_what_each_interval_acknowledged() {
        let mut s = TenantState::new(15_000, 100_000); // sealed through 90 s
        assert_eq!(s.sealed_through(), 90_000);
        let (a, b) = (key("r", "a"), key("r", "b"));
        s.add(
            &[c(&a, 91_000, 5), c(&a, 104_999, 2), c(&b, 106_000, 7)],
            10,
        );
        assert_eq!(s.due(130_000, 30_000), None);
        assert_eq!(s.due(136_000, 30_000), Some(105_000));
        let points = s.seal(105_000);
        assert_eq!(
            points,
            vec![
                Point {
                    key: a.clone(),
                    time_ms: 90_000,
                    value: 0
                },
                Point {
                    key: a.clone(),
                    time_ms: 105_000,
                    value: 7
                },
            ]
        );
        // Late: its interval is sealed, so it goes into the next one to seal.
        let added = s.add(&[c(&a, 95_000, 1)], 10);
        assert_eq!(added.late, 1);
        let points = s.seal(120_000);
        assert_eq!(
            points,
            vec![
                Point {
                    key: b.clone(),
                    time_ms: 105_000,
                    value: 0
                },
                Point {
                    key: a.clone(),
                    time_ms: 120_000,
                    value: 8
                },
                Point {
                    key: b.clone(),
                    time_ms: 120_000,
                    value: 7
                },
            ]
        );
        // Kept and restored: the same state.
        let back = TenantState::from_checkpoint(s.checkpoint(), 15_000);
        assert_eq!(back, s);
    }

    #[test]
    fn the_series_cap_refuses_new_series_only() {
        let mut s = TenantState::new(1000, 0);
        let added = s.add(
            &[
                c(&key("r", "a"), 10, 1),
                c(&key("r", "b"), 10, 1),
                c(&key("r", "a"), 20, 1),
            ],
            1,
        );
        assert_eq!(added.refused, 1);
        assert_eq!(s.series(), 1);
    }

    #[test]
    fn rebuilt_sums_replace_the_rules_open_sums() {
        let mut s = TenantState::new(1000, 0);
        s.add(&[c(&key("r", "a"), 10, 1), c(&key("q", "a"), 10, 4)], 10);
        s.replace_open("r", [(key("r", "a"), 500, 3), (key("r", "b"), 1500, 2)]);
        let points = s.seal(2000);
        let last: Vec<(String, i64)> = points
            .iter()
            .filter(|p| p.time_ms == 2000)
            .map(|p| (format!("{}/{}", p.key.rule, p.key.group[0].1), p.value))
            .collect();
        assert_eq!(
            last,
            vec![("q/a".into(), 4), ("r/a".into(), 3), ("r/b".into(), 2)]
        );
    }
}
