//! The queries `kiln bench` times, one list per preset, run the same way on Kiln (over Connect)
//! and on the peers (`bench/peers.py` reads the list as `queries.json`).

use kiln_proto::querier::v1 as q;
use kiln_proto::types::v1 as t;
use prost::Message;
use serde::Serialize;

use super::workload::{Shape, service_name};

pub const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
const HOUR_NANOS: i64 = 3_600_000_000_000;
const DAY_NANOS: i64 = 24 * HOUR_NANOS;
/// How far the unaligned 1 h window ends before the data's end: Grafana's "last hour" ends
/// now, not on a bucket boundary, so the rollups' edges are read from samples.
const UNALIGNED_SHIFT_NANOS: i64 = 433_000_000_000;
/// Grafana's default `max_nodes` for a flame graph.
pub const MAX_NODES: i64 = 16_384;

/// What a query asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A flame graph (the full tree of node totals); its total is checked against what was
    /// sent.
    Flame,
    /// Series grouped by `pod`, one point per `step_nanos`.
    Series,
    /// The values of `pod`.
    LabelValues,
}

/// One timed query.
#[derive(Debug, Clone, Serialize)]
pub struct BenchQuery {
    /// Its key in the results and the peers' JSON.
    pub key: String,
    /// Its row in the table.
    pub title: String,
    pub kind: Kind,
    /// The services it selects (by `service_name`); empty: every service.
    pub services: Vec<String>,
    /// The time range, Unix nanoseconds, end exclusive.
    pub start: i64,
    pub end: i64,
    /// The series' step (with [`Kind::Series`]).
    pub step_nanos: i64,
    /// How many series (service × pod names) the selector matches in the range, as the
    /// workload sent them.
    pub series: u64,
}

impl BenchQuery {
    fn new(shape: &Shape, key: &str, title: &str, kind: Kind, services: &[usize]) -> Self {
        let end = shape.end_nanos();
        Self {
            key: key.into(),
            title: title.into(),
            kind,
            services: services.iter().map(|s| service_name(*s)).collect(),
            start: end - HOUR_NANOS,
            end,
            step_nanos: 60_000_000_000,
            series: 0,
        }
    }

    fn last(mut self, nanos: i64) -> Self {
        self.start = self.end - nanos;
        self
    }

    fn shifted(mut self, nanos: i64) -> Self {
        self.start -= nanos;
        self.end -= nanos;
        self
    }

    fn step(mut self, nanos: i64) -> Self {
        self.step_nanos = nanos;
        self
    }

    /// Whether a profile of `service` at `time_nanos` is in the query's selection.
    pub fn selects(&self, service: &str, time_nanos: i64) -> bool {
        time_nanos >= self.start
            && time_nanos < self.end
            && (self.services.is_empty() || self.services.iter().any(|s| s == service))
    }

    /// The label selector Kiln is asked with.
    pub fn selector(&self) -> String {
        match self.services.as_slice() {
            [] => "{}".into(),
            [one] => format!(r#"{{service_name="{one}"}}"#),
            many => format!(r#"{{service_name=~"{}"}}"#, many.join("|")),
        }
    }

    /// The Connect path and request body of the query.
    pub fn request(&self) -> (&'static str, Vec<u8>) {
        let ms = |ns: i64| ns / 1_000_000;
        let selector = self.selector();
        match self.kind {
            Kind::Flame => (
                "/querier.v1.QuerierService/SelectMergeStacktraces",
                q::SelectMergeStacktracesRequest {
                    profile_type_id: CPU.into(),
                    label_selector: selector,
                    start: ms(self.start),
                    end: ms(self.end),
                    max_nodes: Some(MAX_NODES),
                    ..Default::default()
                }
                .encode_to_vec(),
            ),
            Kind::Series => (
                "/querier.v1.QuerierService/SelectSeries",
                q::SelectSeriesRequest {
                    profile_type_id: CPU.into(),
                    label_selector: selector,
                    start: ms(self.start),
                    end: ms(self.end),
                    group_by: vec!["pod".into()],
                    step: self.step_nanos as f64 / 1e9,
                    ..Default::default()
                }
                .encode_to_vec(),
            ),
            Kind::LabelValues => (
                "/querier.v1.QuerierService/LabelValues",
                t::LabelValuesRequest {
                    name: "pod".into(),
                    matchers: vec![selector],
                    start: ms(self.start),
                    end: ms(self.end),
                }
                .encode_to_vec(),
            ),
        }
    }
}

/// The service the one-service queries look at (the last one when there are fewer).
pub fn queried_service(shape: &Shape) -> usize {
    3.min(shape.services.saturating_sub(1))
}

/// The flame graph of the queried service over the `nanos` before `end` (a live dashboard's
/// "last 5 minutes").
pub fn fresh_flame(shape: &Shape, end: i64, nanos: i64) -> BenchQuery {
    let mut q = BenchQuery::new(
        shape,
        "flame_fresh",
        "flame graph, 1 service, the last minutes",
        Kind::Flame,
        &[queried_service(shape)],
    );
    q.end = end;
    q.start = end - nanos;
    q
}

/// The queries of a workload: the month preset's (its shape has pod churn) or the others'.
pub fn plan(shape: &Shape) -> Vec<BenchQuery> {
    let one = [queried_service(shape)];
    let q =
        |key, title, kind, services: &[usize]| BenchQuery::new(shape, key, title, kind, services);
    let hour = q("flame_1h", "flame graph, 1 service, 1 h", Kind::Flame, &one);
    let days = |n: i64| n * DAY_NANOS;
    let month = q(
        "flame_30d",
        "flame graph, 1 service, 30 d",
        Kind::Flame,
        &one,
    )
    .last(days(30));
    let mut queries = if shape.churn_hours.is_some() {
        // A selector matching about 10 k series over 30 days: the first 21 services.
        let many: Vec<usize> = (0..shape.services.min(21)).collect();
        vec![
            hour,
            q(
                "flame_24h",
                "flame graph, 1 service, 24 h",
                Kind::Flame,
                &one,
            )
            .last(days(1)),
            month,
            q(
                "fleet_24h",
                "flame graph, every service, 24 h",
                Kind::Flame,
                &[],
            )
            .last(days(1)),
            q(
                "selector_30d",
                "flame graph, 21 services, 30 d",
                Kind::Flame,
                &many,
            )
            .last(days(30)),
            q(
                "series_7d",
                "series by pod, 1 service, 7 d (10 min step)",
                Kind::Series,
                &one,
            )
            .last(days(7))
            .step(600_000_000_000),
            q(
                "label_values",
                "label values (pod), 1 service, 30 d",
                Kind::LabelValues,
                &one,
            )
            .last(days(30)),
        ]
    } else {
        let unaligned = "flame graph, 1 service, 1 h unaligned";
        vec![
            hour,
            q(
                "flame_12h",
                "flame graph, 1 service, 12 h",
                Kind::Flame,
                &one,
            )
            .last(12 * HOUR_NANOS),
            q("flame_1h_unaligned", unaligned, Kind::Flame, &one).shifted(UNALIGNED_SHIFT_NANOS),
            month,
            q(
                "series_12h",
                "per-minute series by pod, 12 h",
                Kind::Series,
                &one,
            )
            .last(12 * HOUR_NANOS),
            q(
                "label_values",
                "label values (pod), 12 h",
                Kind::LabelValues,
                &one,
            )
            .last(12 * HOUR_NANOS),
        ]
    };
    for query in &mut queries {
        let services = if query.services.is_empty() {
            shape.services
        } else {
            query.services.len()
        };
        query.series = shape.series_in(services, query.start, query.end);
    }
    queries
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::bench::Preset;

    #[test]
    fn the_month_selector_matches_ten_thousand_series() {
        let shape = Preset::Month.shape();
        let queries = plan(&shape);
        let wide = queries.iter().find(|q| q.key == "selector_30d").unwrap();
        assert!(wide.series >= 10_000, "{}", wide.series);
        assert_eq!(
            wide.selector().matches('|').count() + 1,
            21,
            "{}",
            wide.selector()
        );
        // Every series of the month: 50 services × 8 pods, replaced twice a day.
        assert!(shape.series_in(shape.services, i64::MIN / 2, i64::MAX / 2) >= 20_000);
        let fleet = queries.iter().find(|q| q.key == "fleet_24h").unwrap();
        assert_eq!(fleet.selector(), "{}");
        assert!(fleet.selects("service-49", shape.end_nanos() - 1));
        assert!(!fleet.selects("service-49", shape.end_nanos()));
    }

    #[test]
    fn the_other_presets_keep_their_queries() {
        let shape = Preset::Small.shape();
        let keys: Vec<_> = plan(&shape).into_iter().map(|q| q.key).collect();
        assert_eq!(
            keys,
            [
                "flame_1h",
                "flame_12h",
                "flame_1h_unaligned",
                "flame_30d",
                "series_12h",
                "label_values"
            ]
        );
    }
}
