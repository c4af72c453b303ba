//! Reads spanning tenants (`X-Scope-OrgID: a|b`): the `__tenant__` label that tells their
//! series apart, its matchers that pick tenants, and the merging of each tenant's answers.
//!
//! Each tenant is queried on its own, within its own limits; the answers are merged here, in
//! the one request's memory. Nothing is kept between requests.

use std::collections::BTreeMap;

use kiln_proto::types::v1 as t;
use kiln_storage::query::{MAX_EXEMPLARS_PER_POINT, PointGroup};
use kiln_storage::selector::Selector;

use crate::auth::{TenantId, TenantSet};
use crate::error::ApiError;

/// The label naming a series' tenant. A selector's matchers on it pick the tenants read
/// (`{__tenant__=~"team-.*"}`); `group_by` on it keeps tenants' series apart.
pub const TENANT_LABEL: &str = "__tenant__";

/// The selector the storage reads for `tenant`: `selector` without its [`TENANT_LABEL`]
/// matchers, or `None` when they leave the tenant out.
pub(super) fn for_tenant(selector: &Selector, tenant: &str) -> Option<Selector> {
    let (on_tenant, rest): (Vec<_>, Vec<_>) = selector
        .matchers
        .iter()
        .cloned()
        .partition(|m| m.name == TENANT_LABEL);
    on_tenant
        .iter()
        .all(|m| m.matches(tenant))
        .then_some(Selector { matchers: rest })
}

/// The tenants a label query reads, each with the selectors it reads (a series matches any
/// one). With no matchers every tenant is read; else a tenant that no selector keeps is not.
pub(super) fn tenant_selectors<'t>(
    tenants: &'t TenantSet,
    matchers: &[String],
) -> Result<Vec<(&'t TenantId, Vec<Selector>)>, ApiError> {
    let parsed = super::selectors(matchers)?;
    Ok(tenants
        .iter()
        .filter_map(|tenant| {
            let kept: Vec<Selector> = parsed
                .iter()
                .filter_map(|s| for_tenant(s, tenant))
                .collect();
            (parsed.is_empty() || !kept.is_empty()).then_some((tenant, kept))
        })
        .collect())
}

/// `group_by` without [`TENANT_LABEL`] (what the storage groups by), and whether it was there.
pub(super) fn group_by(group_by: &[String]) -> (Vec<String>, bool) {
    let rest: Vec<String> = group_by
        .iter()
        .filter(|g| *g != TENANT_LABEL)
        .cloned()
        .collect();
    let had = rest.len() < group_by.len();
    (rest, had)
}

/// Adds the tenant to a series' labels, sorted by name.
pub(super) fn label_tenant(labels: &mut Vec<(String, String)>, tenant: &TenantId) {
    labels.retain(|(name, _)| name != TENANT_LABEL);
    let at = labels.partition_point(|(name, _)| name.as_str() < TENANT_LABEL);
    labels.insert(at, (TENANT_LABEL.to_owned(), tenant.to_string()));
}

/// Adds the tenant to a group's labels (in `group_by` order, as the storage gives them) at
/// [`TENANT_LABEL`]'s place in `group_by`.
pub(super) fn label_tenant_at(
    labels: &mut Vec<(String, String)>,
    tenant: &TenantId,
    group_by: &[String],
) {
    let place = |name: &str| group_by.iter().position(|g| g == name);
    let tenant_place = place(TENANT_LABEL);
    let at = labels
        .iter()
        .take_while(|(name, _)| place(name) < tenant_place)
        .count();
    labels.insert(at, (TENANT_LABEL.to_owned(), tenant.to_string()));
}

/// Series of several tenants summed by label set: the values of a timestamp added, its
/// annotations and exemplars (the largest [`MAX_EXEMPLARS_PER_POINT`]) joined. With `limit`,
/// the series of the largest totals, as one tenant's query keeps them. Sorted by labels.
pub(super) fn sum_series(series: Vec<t::Series>, limit: Option<usize>) -> Vec<t::Series> {
    type Key = Vec<(String, String)>;
    let mut by_labels: BTreeMap<Key, BTreeMap<i64, t::Point>> = BTreeMap::new();
    for s in series {
        let key: Key = s.labels.into_iter().map(|l| (l.name, l.value)).collect();
        let points = by_labels.entry(key).or_default();
        for p in s.points {
            match points.get_mut(&p.timestamp) {
                None => {
                    points.insert(p.timestamp, p);
                }
                Some(sum) => {
                    sum.value += p.value;
                    for a in p.annotations {
                        if !sum.annotations.contains(&a) {
                            sum.annotations.push(a);
                        }
                    }
                    sum.exemplars.extend(p.exemplars);
                    sum.exemplars
                        .sort_by(|a, b| b.value.cmp(&a.value).then(a.span_id.cmp(&b.span_id)));
                    sum.exemplars.truncate(MAX_EXEMPLARS_PER_POINT);
                }
            }
        }
    }
    let mut out: Vec<(f64, t::Series)> = by_labels
        .into_iter()
        .map(|(labels, points)| {
            let points: Vec<t::Point> = points.into_values().collect();
            let total = points.iter().map(|p| p.value).sum();
            let labels = labels
                .into_iter()
                .map(|(name, value)| t::LabelPair { name, value })
                .collect();
            (total, t::Series { labels, points })
        })
        .collect();
    if let Some(limit) = limit.filter(|l| *l < out.len()) {
        out.sort_by(|a, b| b.0.total_cmp(&a.0));
        out.truncate(limit);
        out.sort_by(|a, b| label_key(&a.1).cmp(&label_key(&b.1)));
    }
    out.into_iter().map(|(_, s)| s).collect()
}

fn label_key(s: &t::Series) -> Vec<(&str, &str)> {
    s.labels
        .iter()
        .map(|l| (l.name.as_str(), l.value.as_str()))
        .collect()
}

/// Point groups of several tenants joined by label set, sorted by labels.
pub(super) fn join_groups(groups: Vec<PointGroup>) -> Vec<PointGroup> {
    let mut by_labels: BTreeMap<Vec<(String, String)>, Vec<_>> = BTreeMap::new();
    for g in groups {
        by_labels.entry(g.labels).or_default().extend(g.points);
    }
    by_labels
        .into_iter()
        .map(|(labels, points)| PointGroup { labels, points })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_storage::selector::parse_selector;

    fn point(timestamp: i64, value: f64) -> t::Point {
        t::Point {
            value,
            timestamp,
            ..Default::default()
        }
    }

    fn series(labels: &[(&str, &str)], points: &[(i64, f64)]) -> t::Series {
        t::Series {
            labels: labels
                .iter()
                .map(|(n, v)| t::LabelPair {
                    name: (*n).into(),
                    value: (*v).into(),
                })
                .collect(),
            points: points.iter().map(|&(ts, v)| point(ts, v)).collect(),
        }
    }

    #[test]
    fn tenant_matchers_pick_tenants_and_leave_the_storage() {
        let s = parse_selector(r#"{service_name="api", __tenant__=~"team-.*"}"#).unwrap();
        let kept = for_tenant(&s, "team-a").unwrap();
        assert_eq!(kept, parse_selector(r#"{service_name="api"}"#).unwrap());
        assert!(for_tenant(&s, "ops").is_none());
        let not = parse_selector(r#"{__tenant__!="ops"}"#).unwrap();
        assert_eq!(for_tenant(&not, "a"), Some(Selector::default()));
        assert!(for_tenant(&not, "ops").is_none());
    }

    #[test]
    fn the_tenant_label_takes_its_place() {
        let tenant = TenantId::vouched_for_tests("b");
        let mut sorted = vec![
            ("__name__".into(), "cpu".into()),
            ("service_name".into(), "api".into()),
        ];
        label_tenant(&mut sorted, &tenant);
        assert_eq!(sorted[1], (TENANT_LABEL.into(), "b".into()));
        let group_by: Vec<String> = ["service_name", TENANT_LABEL, "pod"]
            .map(String::from)
            .into();
        let mut grouped = vec![
            ("service_name".into(), "api".into()),
            ("pod".into(), "p1".into()),
        ];
        label_tenant_at(&mut grouped, &tenant, &group_by);
        let names: Vec<&str> = grouped.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["service_name", TENANT_LABEL, "pod"]);
        assert_eq!(
            group_by.iter().filter(|g| *g != TENANT_LABEL).count(),
            self::group_by(&group_by).0.len()
        );
    }

    #[test]
    fn series_of_equal_labels_are_summed_point_by_point() {
        let merged = sum_series(
            vec![
                series(&[("service_name", "api")], &[(1000, 1.0), (2000, 2.0)]),
                series(&[("service_name", "db")], &[(1000, 5.0)]),
                series(&[("service_name", "api")], &[(2000, 3.0), (3000, 4.0)]),
            ],
            None,
        );
        assert_eq!(
            merged,
            vec![
                series(
                    &[("service_name", "api")],
                    &[(1000, 1.0), (2000, 5.0), (3000, 4.0)]
                ),
                series(&[("service_name", "db")], &[(1000, 5.0)]),
            ]
        );
        // The limit keeps the largest sum (api: 10), not the largest of one tenant (db: 5).
        let top = sum_series(
            vec![
                series(&[("s", "api")], &[(1000, 4.0)]),
                series(&[("s", "db")], &[(1000, 5.0)]),
                series(&[("s", "api")], &[(1000, 6.0)]),
            ],
            Some(1),
        );
        assert_eq!(top, vec![series(&[("s", "api")], &[(1000, 10.0)])]);
    }
}
