//! Points into heatmap slots and value buckets.

use kiln_proto::types::v1 as t;
use kiln_storage::query::{PointGroup, ProfilePoint};

/// Value buckets per slot.
pub const BUCKETS: usize = 20;

/// The right edge (Unix ms) of the slot `ms` falls in: slots are `(edge - step, edge]` on a
/// grid through `start`, clamped to the query's first and last edges.
pub fn slot_of(ms: i64, start: i64, end: i64, step: i64) -> i64 {
    let up = |ms: i64| {
        start
            + (ms - start).div_euclid(step) * step
            + if (ms - start).rem_euclid(step) == 0 {
                0
            } else {
                step
            }
    };
    up(ms).clamp(start, up(end))
}

/// The heatmap series of the groups' points.
pub fn series(
    groups: &[PointGroup],
    start: i64,
    end: i64,
    step: i64,
    exemplars: bool,
) -> Vec<t::HeatmapSeries> {
    let values = groups.iter().flat_map(|g| g.points.iter().map(|p| p.value));
    let (Some(min), Some(max)) = (values.clone().min(), values.max()) else {
        return Vec::new();
    };
    let max = if max == min { min + 1 } else { max };
    let size = (max - min) as f64 / BUCKETS as f64;
    let floors: Vec<i64> = (0..BUCKETS)
        .map(|i| min + (i as f64 * size) as i64)
        .collect();
    let bucket_of = |v: i64| floors.iter().rposition(|&f| v >= f).unwrap_or(0);
    groups
        .iter()
        .filter(|g| !g.points.is_empty())
        .map(|g| {
            // slot -> per bucket: count and largest point
            let mut slots: std::collections::BTreeMap<i64, Vec<(i32, Option<&ProfilePoint>)>> =
                std::collections::BTreeMap::new();
            for p in &g.points {
                let slot = slot_of(p.timestamp_nanos.div_euclid(1_000_000), start, end, step);
                let cells = slots
                    .entry(slot)
                    .or_insert_with(|| vec![(0, None); BUCKETS]);
                let cell = &mut cells[bucket_of(p.value)];
                cell.0 += 1;
                if cell.1.is_none_or(|best| p.value > best.value) {
                    cell.1 = Some(p);
                }
            }
            t::HeatmapSeries {
                labels: super::label_pairs(&g.labels),
                slots: slots
                    .into_iter()
                    .map(|(timestamp, cells)| t::HeatmapSlot {
                        timestamp,
                        y_min: floors.iter().map(|&f| f as f64).collect(),
                        counts: cells.iter().map(|c| c.0).collect(),
                        exemplars: if exemplars {
                            cells.iter().filter_map(|c| c.1).map(exemplar).collect()
                        } else {
                            Vec::new()
                        },
                    })
                    .collect(),
            }
        })
        .collect()
}

fn exemplar(p: &ProfilePoint) -> t::Exemplar {
    t::Exemplar {
        timestamp: p.timestamp_nanos.div_euclid(1_000_000),
        span_id: if p.span_id == 0 {
            String::new()
        } else {
            kiln_otel::ids::format_span_id(p.span_id)
        },
        trace_id: p
            .trace_id
            .map(|t| kiln_otel::ids::format_trace_id(&t))
            .unwrap_or_default(),
        profile_id: p
            .profile_id
            .as_ref()
            .map(super::format_profile_id)
            .unwrap_or_default(),
        value: p.value,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_right_edges_on_the_grid_through_start() {
        assert_eq!(slot_of(1000, 1000, 5000, 1000), 1000);
        assert_eq!(slot_of(1001, 1000, 5000, 1000), 2000);
        assert_eq!(slot_of(2000, 1000, 5000, 1000), 2000);
        assert_eq!(
            slot_of(500, 1000, 5000, 1000),
            1000,
            "clamped to the first edge"
        );
        assert_eq!(
            slot_of(9000, 1000, 5000, 1000),
            5000,
            "clamped to the last edge"
        );
    }

    #[test]
    fn points_are_counted_in_shared_buckets() {
        let p = |ms: i64, value: i64| ProfilePoint {
            timestamp_nanos: ms * 1_000_000,
            value,
            span_id: 0,
            trace_id: None,
            profile_id: None,
        };
        let groups = vec![
            PointGroup {
                labels: vec![("pod".into(), "a".into())],
                points: vec![p(1500, 10), p(1600, 10), p(2500, 30)],
            },
            PointGroup {
                labels: vec![("pod".into(), "b".into())],
                points: vec![p(1500, 20)],
            },
        ];
        let s = series(&groups, 1000, 3000, 1000, true);
        assert_eq!(s.len(), 2);
        let a = &s[0];
        assert_eq!(a.slots.len(), 2);
        assert_eq!(a.slots[0].timestamp, 2000);
        assert_eq!(a.slots[0].counts.iter().sum::<i32>(), 2);
        assert_eq!(
            a.slots[0].counts[0], 2,
            "the smallest value is in the first bucket"
        );
        assert_eq!(a.slots[1].counts[BUCKETS - 1], 1, "the largest in the last");
        assert_eq!(a.slots[0].y_min[0], 10.0);
        assert_eq!(a.slots[0].exemplars.len(), 1);
        assert_eq!(s[1].slots[0].counts.iter().sum::<i32>(), 1);
        assert!(series(&[], 1000, 3000, 1000, false).is_empty());
    }
}
