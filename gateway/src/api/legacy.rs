//! Pyroscope's legacy HTTP query API, as Pyroscope serves it and as the Profiles Drilldown app,
//! `profilecli` and older tools call it:
//!
//! - `GET /pyroscope/render?query=<profile type>{selector}&from&until&format=json|dot&max-nodes`
//!   (`name=` as older clients send it): a flamebearer ([`flamebearer`]) with a timeline, or with
//!   `format=dot` pprof's Graphviz call graph ([`dot`](super::render::dot)).
//! - `GET /pyroscope/render-diff?leftQuery&leftFrom&leftUntil&rightQuery&rightFrom&rightUntil`:
//!   a "double" flamebearer of two merged trees.
//! - `GET /pyroscope/labels?query&from&until` and `GET /pyroscope/label-values?label&query&from&until`:
//!   JSON arrays of label names and values (`label=__name__` lists profile types, as Pyroscope's).
//!
//! Renders are drawn from the querier's merged tree ([`Querier::merge_tree`]), timelines from its
//! `SelectSeries`, label lists from its `LabelNames`/`LabelValues`, all with the tenancy of the
//! other read APIs: the caller authenticates for [`Scope::Read`], the query holds one of the
//! tenant's query slots, the answer carries `kiln-query-stats` (and `kiln-warning`), and errors
//! are the Connect-style JSON bodies Pyroscope's handlers write.
//!
//! Times are Pyroscope's `attime` forms: `now`, `now-1h` (units `s`, `m`/`min`, `h`, `d`, `w`,
//! `M`/`mon`, `y`, combinable: `now-1h30m`), `YYYYMMDD`, or Unix seconds, milliseconds,
//! microseconds or nanoseconds told apart by their number of digits (13, 16, 19; else seconds).

#[cfg(test)]
mod tests;

use std::future::Future;

use axum::extract::State;
use axum::http::{HeaderMap, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get};
use kiln_otel::model::ProfileType;
use kiln_proto::querier::v1 as q;
use kiln_proto::types::v1 as t;
use kiln_storage::selector::{MatchOp, Matcher, Selector, parse_selector};

use super::render::{DOT_SOURCE_NODES, dot_text, flamebearer};
use crate::api::querier::Querier;
use crate::app::AppRef;
use crate::auth::TenantSet;
use crate::error::ApiError;
use crate::transport::caller::ReadsAcross;
use crate::transport::http::{query_options, report_headers};

/// A legacy endpoint: its path, the API method name the telemetry layer gives it, its handler.
pub struct Route {
    pub path: &'static str,
    pub method: &'static str,
    pub handler: fn() -> MethodRouter<AppRef>,
}

/// The endpoints of this module (all `GET`; a process without the query role answers them 404),
/// for the API table (`crate::api`).
pub const ROUTES: [Route; 4] = [
    Route {
        path: "/pyroscope/render",
        method: "pyroscope.render",
        handler: || get(render),
    },
    Route {
        path: "/pyroscope/render-diff",
        method: "pyroscope.render-diff",
        handler: || get(render_diff),
    },
    Route {
        path: "/pyroscope/labels",
        method: "pyroscope.labels",
        handler: || get(labels),
    },
    Route {
        path: "/pyroscope/label-values",
        method: "pyroscope.label-values",
        handler: || get(label_values),
    },
];

/// The nodes Pyroscope's DOT renderer draws when `max-nodes` is absent or 0.
const DOT_DEFAULT_NODES: usize = 100;

/// The sample rate the first HTTP API's application names (`myapp.cpu`) are read with: `/ingest`'s
/// default, which gives CPU profiles their nanosecond type.
const DEFAULT_SAMPLE_RATE: u32 = 100;

/// Runs one legacy query as the querier runs a Connect one: take a query slot, record what was
/// read, put the report in headers.
async fn serve<F, Fut>(
    app: AppRef,
    tenant: TenantSet,
    method: &'static str,
    headers: HeaderMap,
    f: F,
) -> Response
where
    F: FnOnce(Querier, TenantSet) -> Fut,
    Fut: Future<Output = Result<Response, ApiError>>,
{
    let querier = Querier::new(app.clone());
    let (result, report) = kiln_storage::query::with_options(query_options(&headers), async {
        let _slots = app.tenants.query_slots(&tenant).await?;
        f(querier, tenant.clone()).await
    })
    .await;
    let mut resp = result.unwrap_or_else(IntoResponse::into_response);
    app.metrics.query_read(method, &report.stats);
    report_headers(resp.headers_mut(), &report);
    resp
}

/// `GET /pyroscope/render`.
async fn render(
    State(app): State<AppRef>,
    ReadsAcross(tenant): ReadsAcross,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    serve(
        app,
        tenant,
        ROUTES[0].method,
        headers,
        |querier, tenant| async move {
            let params = Params::parse(&uri)?;
            let now = now_ms();
            // `name` is what Pyroscope's first HTTP API took; `query` is what today's clients send.
            let field = if params.get("query").is_none() && params.get("name").is_some() {
                "name"
            } else {
                "query"
            };
            let query = Query::parse_required(field, params.get(field))?;
            let (start, end) = params.range("from", "until", now)?;
            let (type_id, selector) = (query.profile_type.id(), query.selector_text());
            if params.get("format") == Some("dot") {
                let max = match params.max_nodes()? {
                    n if n <= 0 => DOT_DEFAULT_NODES,
                    n => usize::try_from(n).unwrap_or(usize::MAX),
                };
                let source = max.max(DOT_SOURCE_NODES);
                let source =
                    querier.max_nodes(&tenant, Some(i64::try_from(source).unwrap_or(i64::MAX)))?;
                let tree = querier
                    .merge_tree(&tenant, &type_id, &selector, start, end)
                    .await?;
                return dot_response(&tree, source, max, &query.profile_type, start, end);
            }
            let max_nodes = querier.max_nodes(&tenant, Some(params.max_nodes()?))?;
            let group_by: Vec<String> = params.all("groupBy").map(str::to_owned).collect();
            let aggregation = match params.get("aggregation") {
                Some("avg") => t::TimeSeriesAggregationType::Average,
                _ => t::TimeSeriesAggregationType::Sum,
            };
            let step = point_interval_secs(start, end);
            let tree = querier.merge_tree(&tenant, &type_id, &selector, start, end);
            let series = async {
                if start <= 0 || end <= start {
                    return Ok(Vec::new());
                }
                let r = querier
                    .select_series(
                        &tenant,
                        q::SelectSeriesRequest {
                            profile_type_id: type_id.clone(),
                            label_selector: selector.clone(),
                            start,
                            end,
                            step: step as f64,
                            group_by: group_by.clone(),
                            aggregation: Some(aggregation as i32),
                            ..Default::default()
                        },
                    )
                    .await?;
                Ok::<_, ApiError>(r.series)
            };
            let (tree, series) = futures::try_join!(tree, series)?;
            let mut profile =
                flamebearer::single(&tree.to_flamegraph(max_nodes), &query.profile_type);
            let timeline = |s: Option<&t::Series>| {
                flamebearer::Timeline::new(s.map_or(&[][..], |s| &s.points), start, end, step)
            };
            profile.timeline = Some(timeline(if series.len() == 1 {
                series.first()
            } else {
                None
            }));
            if let Some(label) = group_by.first() {
                profile.groups = Some(
                    series
                        .iter()
                        .map(|s| {
                            let key = s
                                .labels
                                .iter()
                                .find(|l| &l.name == label)
                                .map_or("*", |l| l.value.as_str());
                            (key.to_owned(), timeline(Some(s)))
                        })
                        .collect(),
                );
            }
            json_response(&profile)
        },
    )
    .await
}

/// A DOT answer: empty `text/plain` when nothing matched, as Pyroscope answers.
fn dot_response(
    tree: &kiln_storage::query::FlameTree,
    source_nodes: usize,
    max_nodes: usize,
    profile_type: &ProfileType,
    start: i64,
    end: i64,
) -> Result<Response, ApiError> {
    let text_plain = [(header::CONTENT_TYPE, "text/plain; charset=utf-8")];
    if tree.total() == 0 {
        return Ok((text_plain, "").into_response());
    }
    let text = dot_text(tree, source_nodes, max_nodes, profile_type, start, end)?;
    Ok((text_plain, text).into_response())
}

/// `GET /pyroscope/render-diff`.
async fn render_diff(
    State(app): State<AppRef>,
    ReadsAcross(tenant): ReadsAcross,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    serve(
        app,
        tenant,
        ROUTES[1].method,
        headers,
        |querier, tenant| async move {
            let params = Params::parse(&uri)?;
            let now = now_ms();
            let left = Query::parse_required("leftQuery", params.get("leftQuery"))?;
            let right = Query::parse_required("rightQuery", params.get("rightQuery"))?;
            if left.profile_type.id() != right.profile_type.id() {
                return Err(ApiError::invalid("profile types must match"));
            }
            let (left_start, left_end) = params.range("leftFrom", "leftUntil", now)?;
            let (right_start, right_end) = params.range("rightFrom", "rightUntil", now)?;
            let max_nodes = querier.max_nodes(&tenant, Some(params.max_nodes()?))?;
            let type_id = left.profile_type.id();
            let (left_selector, right_selector) = (left.selector_text(), right.selector_text());
            let left_tree =
                querier.merge_tree(&tenant, &type_id, &left_selector, left_start, left_end);
            let right_tree =
                querier.merge_tree(&tenant, &type_id, &right_selector, right_start, right_end);
            let (left_tree, right_tree) = futures::try_join!(left_tree, right_tree)?;
            let profile = flamebearer::diff(&left_tree, &right_tree, max_nodes, &left.profile_type)
                .map_err(ApiError::internal)?;
            json_response(&profile)
        },
    )
    .await
}

/// `GET /pyroscope/labels`: label names of the series the query selects.
async fn labels(
    State(app): State<AppRef>,
    ReadsAcross(tenant): ReadsAcross,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    serve(
        app,
        tenant,
        ROUTES[2].method,
        headers,
        |querier, tenant| async move {
            let params = Params::parse(&uri)?;
            let matchers = Query::matchers(params.get("query"))?;
            let (start, end) = params.optional_range(now_ms())?;
            let r = querier
                .label_names(
                    &tenant,
                    t::LabelNamesRequest {
                        matchers,
                        start,
                        end,
                    },
                )
                .await?;
            json_response(&r.names)
        },
    )
    .await
}

/// `GET /pyroscope/label-values`: values of `label` in the series the query selects;
/// `label=__name__` lists their profile types, as Pyroscope answers it.
async fn label_values(
    State(app): State<AppRef>,
    ReadsAcross(tenant): ReadsAcross,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    serve(
        app,
        tenant,
        ROUTES[3].method,
        headers,
        |querier, tenant| async move {
            let params = Params::parse(&uri)?;
            let label = match params.get("label") {
                None | Some("") => return Err(ApiError::invalid("label parameter is required")),
                Some("__name__") => kiln_storage::query::PROFILE_TYPE_LABEL,
                Some(l) => l,
            };
            let matchers = Query::matchers(params.get("query"))?;
            let (start, end) = params.optional_range(now_ms())?;
            let r = querier
                .label_values(
                    &tenant,
                    t::LabelValuesRequest {
                        name: label.to_owned(),
                        matchers,
                        start,
                        end,
                    },
                )
                .await?;
            json_response(&r.names)
        },
    )
    .await
}

/// A JSON answer, newline-terminated as Go's encoder writes it.
fn json_response<T: serde::Serialize>(value: &T) -> Result<Response, ApiError> {
    let mut body = serde_json::to_vec(value).map_err(ApiError::internal)?;
    body.push(b'\n');
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

fn now_ms() -> i64 {
    crate::time::now_nanos().div_euclid(1_000_000)
}

/// A query string, percent-decoded; the first value of a repeated key wins, as Go's `Get`.
#[derive(Debug, Default)]
struct Params(Vec<(String, String)>);

impl Params {
    fn parse(uri: &Uri) -> Result<Self, ApiError> {
        let decode = |s: &str| -> Result<String, ApiError> {
            percent_encoding::percent_decode_str(&s.replace('+', " "))
                .decode_utf8()
                .map(|c| c.into_owned())
                .map_err(|_| ApiError::invalid(format!("query parameter {s:?} is not valid UTF-8")))
        };
        let pairs = uri
            .query()
            .unwrap_or("")
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                Ok((decode(k)?, decode(v)?))
            })
            .collect::<Result<_, ApiError>>()?;
        Ok(Self(pairs))
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// `max-nodes` (or `maxNodes`, which wins); 0 when absent, as Pyroscope reads them.
    fn max_nodes(&self) -> Result<i64, ApiError> {
        let mut n = 0;
        for key in ["max-nodes", "maxNodes"] {
            match self.get(key).map(str::trim) {
                None | Some("") => {}
                Some(v) => {
                    n = v.parse().map_err(|_| {
                        ApiError::invalid(format!("{key} must be a whole number, not {v:?}"))
                    })?
                }
            }
        }
        Ok(n)
    }

    /// A time range in Unix ms; an absent bound is now, as Pyroscope's render reads it.
    fn range(&self, from: &str, until: &str, now: i64) -> Result<(i64, i64), ApiError> {
        let time = |key: &str| match self.get(key) {
            None | Some("") => Ok(now),
            Some(v) => parse_at_time(v, now)
                .ok_or_else(|| ApiError::invalid(format!("invalid {key} {v:?}: {TIME_FORMS}"))),
        };
        Ok((time(from)?, time(until)?))
    }

    /// `from`/`until` for the label APIs: both absent is every time the tenant may query.
    fn optional_range(&self, now: i64) -> Result<(i64, i64), ApiError> {
        if self.get("from").is_none() && self.get("until").is_none() {
            return Ok((0, 0));
        }
        self.range("from", "until", now)
    }
}

const TIME_FORMS: &str = "use now, now-1h, YYYYMMDD or Unix seconds, ms, µs or ns";

/// Parses a time as Pyroscope's `attime` does (see the module docs) into Unix ms; `None` for
/// what it cannot read (Pyroscope would take it as now).
fn parse_at_time(s: &str, now_ms: i64) -> Option<i64> {
    let s: String = s
        .trim()
        .chars()
        .filter(|c| !matches!(c, '_' | ',' | ' '))
        .collect();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        if s.len() == 8
            && let Some(days) = yyyymmdd_days(&s)
        {
            return Some(days * 86_400_000);
        }
        let v: i64 = s.parse().ok()?;
        return match s.len() {
            13 => Some(v),
            16 => Some(v / 1_000),
            19 => Some(v / 1_000_000),
            _ => v.checked_mul(1_000),
        };
    }
    let (reference, offset) = match s.find(['+', '-']) {
        Some(i) => s.split_at(i),
        None => (s.as_str(), ""),
    };
    if !(reference.is_empty() || reference == "now") {
        return None;
    }
    now_ms.checked_add(parse_offset_secs(offset)?.checked_mul(1_000)?)
}

/// `-1h30m`, `+2d`: seconds.
fn parse_offset_secs(offset: &str) -> Option<i64> {
    let Some(sign) = offset.chars().next() else {
        return Some(0);
    };
    let sign = if sign == '-' { -1 } else { 1 };
    let mut rest = &offset[1..];
    let mut total = 0i64;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let n: i64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let secs: i64 = if unit.starts_with('s') {
            1
        } else if unit.starts_with("mon") || unit.starts_with('M') {
            30 * 86_400
        } else if unit.starts_with('m') {
            60
        } else if unit.starts_with('h') {
            3_600
        } else if unit.starts_with('d') {
            86_400
        } else if unit.starts_with('w') {
            7 * 86_400
        } else if unit.starts_with('y') {
            365 * 86_400
        } else {
            return None;
        };
        total = total.checked_add(n.checked_mul(secs)?.checked_mul(sign)?)?;
    }
    Some(total)
}

/// Days since 1970-01-01 of a `YYYYMMDD` date after 1900.
fn yyyymmdd_days(s: &str) -> Option<i64> {
    let (y, m, d): (i64, u32, u32) = (
        s[..4].parse().ok()?,
        s[4..6].parse().ok()?,
        s[6..].parse().ok()?,
    );
    let days_in_month = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if y % 4 == 0 && (y % 100 != 0 || y % 400 == 0) => 29,
        2 => 28,
        _ => return None,
    };
    (y > 1900 && (1..=days_in_month).contains(&d)).then(|| days_from_civil(y, m, d))
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    // Years start in March, so the leap day ends a year.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let shifted_month = i64::from((m + 9) % 12);
    let day_of_year = (153 * shifted_month + 2) / 5 + i64::from(d) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The timeline step Pyroscope's render picks for a range (Unix ms): about 1,500 points, at
/// least 15 s, rounded to a familiar interval. Seconds.
fn point_interval_secs(start_ms: i64, end_ms: i64) -> i64 {
    const MS: i128 = 1_000_000;
    let interval_ns = (i128::from(end_ms) - i128::from(start_ms)) * MS / 1_500;
    if interval_ns < 15_000 * MS {
        return 15;
    }
    // An interval up to the first value (ms) steps by the second (ms).
    const ROUNDED: [(i128, i64); 19] = [
        (17_500, 15_000),
        (25_000, 20_000),
        (45_000, 30_000),
        (90_000, 60_000),
        (210_000, 120_000),
        (450_000, 300_000),
        (750_000, 600_000),
        (1_050_000, 900_000),
        (1_500_000, 1_200_000),
        (2_700_000, 1_800_000),
        (5_400_000, 3_600_000),
        (9_000_000, 7_200_000),
        (16_200_000, 10_800_000),
        (32_400_000, 21_600_000),
        (86_400_000, 43_200_000),
        (172_800_000, 86_400_000),
        (604_800_000, 86_400_000),
        (1_814_400_000, 604_800_000),
        (3_628_800_000, 2_592_000_000),
    ];
    ROUNDED
        .iter()
        .enumerate()
        .find(|&(i, &(upper, _))| {
            // The last bound is exclusive.
            interval_ns < upper * MS || (i + 1 < ROUNDED.len() && interval_ns == upper * MS)
        })
        .map_or(31_536_000, |(_, (_, step))| step / 1_000)
}

/// A render query: `<profile type id>{selector}`, `{__name__="<profile type id>", …}`, or the
/// first HTTP API's `<app>.<type>{selector}` (`myapp.cpu`, `myapp.alloc_space`), which selects
/// the service `myapp` as ingest stored it.
#[derive(Debug, Clone, PartialEq)]
struct Query {
    profile_type: ProfileType,
    selector: Selector,
}

impl Query {
    fn parse_required(field: &str, query: Option<&str>) -> Result<Self, ApiError> {
        match query.map(str::trim) {
            None | Some("") => Err(ApiError::invalid(format!("{field:?} is required"))),
            Some(q) => Self::parse(field, q),
        }
    }

    fn parse(field: &str, query: &str) -> Result<Self, ApiError> {
        let (name, mut selector) = split_query(field, query)?;
        let name = match name {
            Some(n) => n,
            None => {
                let at = selector
                    .matchers
                    .iter()
                    .position(|m| m.name == "__name__" && m.op == MatchOp::Equal)
                    .ok_or_else(|| {
                        ApiError::invalid(format!(
                            "{field:?} must contain a profile-type selection"
                        ))
                    })?;
                selector.matchers.remove(at).value
            }
        };
        if let Some(profile_type) = ProfileType::parse(&name) {
            return Ok(Self {
                profile_type,
                selector,
            });
        }
        if name.contains(':') {
            return Err(ApiError::invalid(format!(
                "failed to parse {field:?}: {name:?} is not a profile type \
                 (name:sample_type:sample_unit:period_type:period_unit)"
            )));
        }
        let (service, profile_type, _) =
            kiln_otel::folded::text_profile_type(&name, DEFAULT_SAMPLE_RATE)
                .map_err(|e| ApiError::invalid(format!("failed to parse {field:?}: {e}")))?;
        selector
            .matchers
            .push(equal(kiln_otel::model::LABEL_SERVICE_NAME, &service)?);
        Ok(Self {
            profile_type,
            selector,
        })
    }

    /// The matchers of the label APIs: the selector, with the profile type (when the query
    /// names one) as a `__profile_type__` matcher. No query selects everything.
    fn matchers(query: Option<&str>) -> Result<Vec<String>, ApiError> {
        let Some(query) = query.map(str::trim).filter(|q| !q.is_empty()) else {
            return Ok(Vec::new());
        };
        let (name, mut selector) = split_query("query", query)?;
        if name.is_some()
            || selector
                .matchers
                .iter()
                .any(|m| m.name == "__name__" && m.op == MatchOp::Equal)
        {
            let q = Self::parse("query", query)?;
            selector = q.selector;
            selector.matchers.push(equal(
                kiln_storage::query::PROFILE_TYPE_LABEL,
                &q.profile_type.id(),
            )?);
        }
        Ok(vec![selector_text(&selector)])
    }

    /// The label selector, as the querier takes it.
    fn selector_text(&self) -> String {
        selector_text(&self.selector)
    }
}

/// Splits `name{selector}` into the name (if any) and the parsed selector.
fn split_query(field: &str, query: &str) -> Result<(Option<String>, Selector), ApiError> {
    let (name, selector) = match query.find('{') {
        Some(i) => query.split_at(i),
        None => (query, ""),
    };
    let selector = parse_selector(selector)
        .map_err(|e| ApiError::invalid(format!("failed to parse {field:?}: {e}")))?;
    let name = name.trim();
    Ok(((!name.is_empty()).then(|| name.to_owned()), selector))
}

fn equal(name: &str, value: &str) -> Result<Matcher, ApiError> {
    Matcher::new(name, MatchOp::Equal, value).map_err(ApiError::from)
}

/// A selector as text the selector parser reads back to the same matchers.
fn selector_text(selector: &Selector) -> String {
    let quote = |s: &str| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
    let matchers: Vec<String> = selector
        .matchers
        .iter()
        .map(|m| {
            let op = match m.op {
                MatchOp::Equal => "=",
                MatchOp::NotEqual => "!=",
                MatchOp::Regex => "=~",
                MatchOp::NotRegex => "!~",
            };
            format!("{}{op}{}", quote(&m.name), quote(&m.value))
        })
        .collect();
    format!("{{{}}}", matchers.join(","))
}
