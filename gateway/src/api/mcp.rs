//! `/mcp`: the Model Context Protocol's streamable HTTP transport (rmcp), so an AI assistant
//! reads a tenant's profiles as tables and text sized for a model's context.
//!
//! Stateless: every POST is authenticated as any read ([`ReadsAcross`]) and answered on its
//! own, so any query process behind a load balancer serves any request. No session lives
//! anywhere. Each tool is one querier call ([`Querier`]) with the caller's tenants, limits and
//! query slots; its answer is cut to the bounds its description states.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use kiln_proto::querier::v1 as q;
use kiln_proto::types::v1 as t;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde::Deserialize;
use serde_json::json;

use crate::api::querier::Querier;
use crate::app::AppRef;
use crate::auth::TenantSet;
use crate::error::ApiError;
use crate::transport::caller::ReadsAcross;

/// Rows of a function table, at most.
const MAX_ROWS: usize = 200;
/// Lines of a flame graph's text, at most.
const MAX_LINES: usize = 300;
/// Series of one answer, and points of one series, at most.
const MAX_SERIES: usize = 20;
const MAX_POINTS: usize = 200;
/// Names listed, at most; a function name is cut past this many characters.
const MAX_NAMES: usize = 500;
const MAX_NAME_CHARS: usize = 200;
/// A request body, at most: tool calls are small.
const MAX_BODY_BYTES: usize = 1 << 20;

/// `POST /mcp` (and the transport's `GET` and `DELETE`, which a stateless server refuses).
pub async fn handler(
    State(app): State<AppRef>,
    ReadsAcross(tenants): ReadsAcross,
    req: Request,
) -> Response {
    // Stateless: a request needs no process to remember the one before. Kiln authenticates
    // every call and does not know its public name, so Host is not checked.
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        .with_max_request_body_bytes(MAX_BODY_BYTES)
        .disable_allowed_hosts();
    let tools = KilnTools {
        app,
        tenants: Arc::new(tenants),
    };
    let service = StreamableHttpService::new(
        move || Ok(tools.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    service
        .handle(req)
        .await
        .map(axum::body::Body::new)
        .into_response()
}

/// The tools of one request, for its caller's tenants.
#[derive(Clone)]
struct KilnTools {
    app: AppRef,
    tenants: Arc<TenantSet>,
}

/// A time range and the profiles it reads: every tool's first arguments.
#[derive(Debug, Deserialize)]
struct Range {
    #[serde(default = "default_from")]
    from: String,
    #[serde(default = "default_until")]
    until: String,
}

fn default_from() -> String {
    "now-1h".into()
}

fn default_until() -> String {
    "now".into()
}

impl Range {
    /// `[from, until]` in Unix milliseconds.
    fn millis(&self) -> Result<(i64, i64), ApiError> {
        let now = crate::time::now_nanos();
        let parse = |s: &str| {
            crate::time::parse_time(s, now)
                .map(|n| n.div_euclid(1_000_000))
                .ok_or_else(|| {
                    ApiError::invalid(format!(
                        "invalid time {s:?}: use now, now-1h, now-7d or Unix seconds or ms"
                    ))
                })
        };
        let (from, until) = (parse(&self.from)?, parse(&self.until)?);
        if from >= until {
            return Err(ApiError::invalid(format!(
                "from {:?} is not before until {:?}",
                self.from, self.until
            )));
        }
        Ok((from, until))
    }
}

#[derive(Debug, Deserialize)]
struct Query {
    profile_type: String,
    #[serde(default = "default_selector")]
    selector: String,
    #[serde(flatten)]
    range: Range,
}

fn default_selector() -> String {
    "{}".into()
}

#[derive(Debug, Deserialize)]
struct ListArgs {
    profile_type: Option<String>,
    #[serde(flatten)]
    range: Range,
}

#[derive(Debug, Deserialize)]
struct TopArgs {
    #[serde(flatten)]
    query: Query,
    #[serde(default = "default_limit")]
    limit: usize,
    #[serde(default)]
    sort: Sort,
}

fn default_limit() -> usize {
    20
}

#[derive(Debug, Default, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Sort {
    #[default]
    #[serde(rename = "self")]
    SelfValue,
    Total,
}

#[derive(Debug, Deserialize)]
struct FlameArgs {
    #[serde(flatten)]
    query: Query,
    #[serde(default = "default_lines")]
    max_lines: usize,
    #[serde(default = "default_min_percent")]
    min_percent: f64,
}

fn default_lines() -> usize {
    60
}

fn default_min_percent() -> f64 {
    1.0
}

#[derive(Debug, Deserialize)]
struct DiffArgs {
    profile_type: String,
    #[serde(default = "default_selector")]
    selector: String,
    baseline_from: String,
    baseline_until: String,
    comparison_from: String,
    comparison_until: String,
    /// Selectors of each side, over `selector`.
    baseline_selector: Option<String>,
    comparison_selector: Option<String>,
    #[serde(default = "default_limit")]
    limit: usize,
}

#[derive(Debug, Deserialize)]
struct SeriesArgs {
    #[serde(flatten)]
    query: Query,
    #[serde(default)]
    group_by: Vec<String>,
    step_seconds: Option<f64>,
}

/// The tools' descriptions and input schemas: what a model reads to call them.
fn tools() -> Vec<Tool> {
    let range = json!({
        "from": {"type": "string", "description": "Start: now-1h (default), now-7d, or Unix seconds or ms."},
        "until": {"type": "string", "description": "End: now (default) or Unix seconds or ms."},
    });
    let query = |extra: serde_json::Value, required: &[&str]| -> Arc<JsonObject> {
        let mut props = json!({
            "profile_type": {"type": "string", "description": "A profile type id from list_profile_types, e.g. process_cpu:cpu:nanoseconds:cpu:nanoseconds."},
            "selector": {"type": "string", "description": "Label selector, e.g. {service_name=\"api\"}; {} (default) is everything. __tenant__ picks tenants of a read over several."},
        });
        let obj = props.as_object_mut().expect("an object");
        obj.extend(range.as_object().expect("an object").clone());
        obj.extend(extra.as_object().expect("an object").clone());
        let schema = json!({"type": "object", "properties": props, "required": required});
        Arc::new(schema.as_object().expect("an object").clone())
    };
    let list = |extra: serde_json::Value| -> Arc<JsonObject> {
        let mut props = range.clone();
        props
            .as_object_mut()
            .expect("an object")
            .extend(extra.as_object().expect("an object").clone());
        let schema = json!({"type": "object", "properties": props});
        Arc::new(schema.as_object().expect("an object").clone())
    };
    vec![
        Tool::new(
            "list_profile_types",
            format!(
                "The profile types (CPU, memory, ...) with data in the range, one id per line \
                 (at most {MAX_NAMES}). Pass an id as profile_type to the other tools."
            ),
            list(json!({})),
        ),
        Tool::new(
            "list_services",
            format!(
                "The services (service_name) with data in the range, optionally of one profile \
                 type, one per line (at most {MAX_NAMES})."
            ),
            list(
                json!({"profile_type": {"type": "string", "description": "Only services with this profile type."}}),
            ),
        ),
        Tool::new(
            "top_functions",
            format!(
                "The functions that cost most, exact: a tab-separated table of self, self %, \
                 total, total % and function, heaviest first, with the profile's total and \
                 unit. Self counts the samples in the function itself; total counts the \
                 stacks through it (once per stack). limit rows (default 20, at most \
                 {MAX_ROWS}); names cut at {MAX_NAME_CHARS} characters."
            ),
            query(
                json!({
                    "limit": {"type": "integer", "description": format!("Rows, 1 to {MAX_ROWS} (default 20).")},
                    "sort": {"type": "string", "enum": ["self", "total"], "description": "Order by self (default) or total."},
                }),
                &["profile_type"],
            ),
        ),
        Tool::new(
            "flame_graph",
            format!(
                "The call tree as indented text, root first: each line is total %, self % and \
                 the function, children indented under their caller, heaviest first. Only nodes \
                 of at least min_percent of the total (default 1) are shown, at most max_lines \
                 lines (default 60, at most {MAX_LINES})."
            ),
            query(
                json!({
                    "max_lines": {"type": "integer", "description": format!("Lines, 1 to {MAX_LINES} (default 60).")},
                    "min_percent": {"type": "number", "description": "Smallest node shown, in % of the total (default 1)."},
                }),
                &["profile_type"],
            ),
        ),
        Tool::new(
            "diff_functions",
            format!(
                "What changed between a baseline and a comparison (two ranges, or two \
                 selectors): per function the self value and share in each and the change in \
                 percentage points, largest change first, tab-separated; limit rows (default \
                 20, at most {MAX_ROWS})."
            ),
            {
                let mut schema = (*query(
                    json!({
                        "baseline_from": {"type": "string"},
                        "baseline_until": {"type": "string"},
                        "comparison_from": {"type": "string"},
                        "comparison_until": {"type": "string"},
                        "baseline_selector": {"type": "string", "description": "The baseline's selector, over selector."},
                        "comparison_selector": {"type": "string", "description": "The comparison's selector, over selector."},
                        "limit": {"type": "integer", "description": format!("Rows, 1 to {MAX_ROWS} (default 20).")},
                    }),
                    &[
                        "profile_type",
                        "baseline_from",
                        "baseline_until",
                        "comparison_from",
                        "comparison_until",
                    ],
                ))
                .clone();
                if let Some(p) = schema.get_mut("properties").and_then(|p| p.as_object_mut()) {
                    p.remove("from");
                    p.remove("until");
                }
                Arc::new(schema)
            },
        ),
        Tool::new(
            "series",
            format!(
                "The profile's total over time: per series (split by group_by labels) its \
                 labels, then one line per point, time (UTC) and value. At most {MAX_SERIES} \
                 series (the largest) of at most {MAX_POINTS} points; the step defaults to the \
                 range over 100."
            ),
            query(
                json!({
                    "group_by": {"type": "array", "items": {"type": "string"}, "description": "Labels to split by, e.g. [\"service_name\"] or [\"__tenant__\"]."},
                    "step_seconds": {"type": "number", "description": "Seconds per point."},
                }),
                &["profile_type"],
            ),
        ),
    ]
}

impl rmcp::ServerHandler for KilnTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("kiln", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Kiln's continuous profiles. Start with list_profile_types and list_services, \
                 then top_functions or flame_graph for where time or memory goes, \
                 diff_functions for what changed, series for when.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, rmcp::ErrorData> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, rmcp::ErrorData> {
        let args = serde_json::Value::Object(request.arguments.unwrap_or_default());
        let result = self.run(&request.name, args).await;
        // A refused call is the tool's error, which the model reads; the protocol went well.
        Ok(match result {
            Ok(text) => CallToolResult::success(vec![ContentBlock::text(text)]),
            Err(e) => CallToolResult::error(vec![ContentBlock::text(format!(
                "{}: {}",
                e.kind.connect_code(),
                e.message
            ))]),
        }
        .into())
    }
}

fn args<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Result<T, ApiError> {
    serde_json::from_value(v).map_err(|e| ApiError::invalid(format!("invalid arguments: {e}")))
}

impl KilnTools {
    async fn run(&self, tool: &str, a: serde_json::Value) -> Result<String, ApiError> {
        let _slots = self.app.tenants.query_slots(&self.tenants).await?;
        match tool {
            "list_profile_types" => self.profile_types(args(a)?).await,
            "list_services" => self.services(args(a)?).await,
            "top_functions" => self.top_functions(args(a)?).await,
            "flame_graph" => self.flame_graph(args(a)?).await,
            "diff_functions" => self.diff_functions(args(a)?).await,
            "series" => self.series(args(a)?).await,
            other => Err(ApiError::invalid(format!(
                "no tool {other:?}; the tools are {}",
                tools()
                    .iter()
                    .map(|t| t.name.as_ref())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    fn querier(&self) -> Querier {
        Querier::new(self.app.clone())
    }

    async fn profile_types(&self, a: ListArgs) -> Result<String, ApiError> {
        let (start, end) = a.range.millis()?;
        let r = self
            .querier()
            .profile_types(&self.tenants, q::ProfileTypesRequest { start, end })
            .await?;
        Ok(lines(r.profile_types.into_iter().map(|p| p.id).collect()))
    }

    async fn services(&self, a: ListArgs) -> Result<String, ApiError> {
        let (start, end) = a.range.millis()?;
        let matchers = a
            .profile_type
            .map(|p| vec![format!("{{__profile_type__={p:?}}}")])
            .unwrap_or_default();
        let r = self
            .querier()
            .label_values(
                &self.tenants,
                t::LabelValuesRequest {
                    name: "service_name".into(),
                    matchers,
                    start,
                    end,
                },
            )
            .await?;
        Ok(lines(r.names))
    }

    /// The whole function table of a query (every row).
    async fn functions(&self, query: &Query, selector: &str) -> Result<t::FunctionTable, ApiError> {
        let (start, end) = query.range.millis()?;
        let r = self
            .querier()
            .select_merge_stacktraces(
                &self.tenants,
                functions_request(query, selector, start, end),
            )
            .await?;
        Ok(r.functions.unwrap_or_default())
    }

    async fn top_functions(&self, a: TopArgs) -> Result<String, ApiError> {
        let limit = bounded("limit", a.limit, MAX_ROWS)?;
        let mut table = self.functions(&a.query, &a.query.selector).await?;
        if a.sort == Sort::Total {
            table
                .functions
                .sort_by(|x, y| y.total.cmp(&x.total).then(x.name.cmp(&y.name)));
        }
        let unit = unit_of(&a.query.profile_type);
        let mut out = format!(
            "total\t{}\t{unit}\nfunctions\t{}\nself\tself%\ttotal\ttotal%\tfunction\n",
            table.total,
            table.functions.len()
        );
        for f in table.functions.iter().take(limit) {
            let _ = writeln!(
                out,
                "{}\t{}\t{}\t{}\t{}",
                f.self_,
                percent(f.self_, table.total),
                f.total,
                percent(f.total, table.total),
                cut(&f.name)
            );
        }
        Ok(out)
    }

    async fn flame_graph(&self, a: FlameArgs) -> Result<String, ApiError> {
        let max_lines = bounded("max_lines", a.max_lines, MAX_LINES)?;
        if !(a.min_percent.is_finite() && (0.0..=100.0).contains(&a.min_percent)) {
            return Err(ApiError::invalid("min_percent must be from 0 to 100"));
        }
        let (start, end) = a.query.range.millis()?;
        let tree = self
            .querier()
            .merge_tree(
                &self.tenants,
                &a.query.profile_type,
                &a.query.selector,
                start,
                end,
            )
            .await?;
        let total = tree.total();
        let unit = unit_of(&a.query.profile_type);
        let mut out = format!("total\t{total}\t{unit}\ntotal%\tself%\tfunction\n");
        if total == 0 {
            return Ok(out);
        }
        let min = (total as f64 * a.min_percent / 100.0).ceil() as i64;
        // Depth first, heaviest child first; a node's children only when it is shown.
        let mut stack: Vec<(u32, usize)> = vec![(0, 0)];
        let mut shown = 0;
        let mut truncated = false;
        while let Some((node, depth)) = stack.pop() {
            if node != 0 {
                if shown == max_lines {
                    truncated = true;
                    break;
                }
                shown += 1;
                let _ = writeln!(
                    out,
                    "{}\t{}\t{}{}",
                    percent(tree.node_total(node), total),
                    percent(tree.self_value(node), total),
                    "  ".repeat(depth - 1),
                    cut(tree.name_str(tree.node_name(node)))
                );
            }
            let mut kids: Vec<u32> = tree
                .children(node)
                .iter()
                .copied()
                .filter(|&c| tree.node_total(c) >= min.max(1))
                .collect();
            kids.sort_by_key(|&c| tree.node_total(c));
            stack.extend(kids.into_iter().map(|c| (c, depth + 1)));
        }
        if truncated {
            let _ = writeln!(
                out,
                "(cut at {max_lines} lines: more nodes are over {}% of the total; raise \
                 max_lines or min_percent)",
                a.min_percent
            );
        }
        Ok(out)
    }

    async fn diff_functions(&self, a: DiffArgs) -> Result<String, ApiError> {
        let limit = bounded("limit", a.limit, MAX_ROWS)?;
        let side = |from: &str, until: &str, sel: &Option<String>| {
            let query = Query {
                profile_type: a.profile_type.clone(),
                selector: a.selector.clone(),
                range: Range {
                    from: from.to_owned(),
                    until: until.to_owned(),
                },
            };
            let selector = match sel {
                Some(s) => join_selectors(&a.selector, s),
                None => a.selector.clone(),
            };
            (query, selector)
        };
        let (bq, bs) = side(&a.baseline_from, &a.baseline_until, &a.baseline_selector);
        let (cq, cs) = side(
            &a.comparison_from,
            &a.comparison_until,
            &a.comparison_selector,
        );
        let (baseline, comparison) =
            futures::try_join!(self.functions(&bq, &bs), self.functions(&cq, &cs))?;
        let mut rows: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
        for f in &baseline.functions {
            rows.entry(&f.name).or_default().0 = f.self_;
        }
        for f in &comparison.functions {
            rows.entry(&f.name).or_default().1 = f.self_;
        }
        let share = |v: i64, total: i64| {
            if total == 0 {
                0.0
            } else {
                v as f64 * 100.0 / total as f64
            }
        };
        let mut rows: Vec<(&str, i64, i64, f64)> = rows
            .into_iter()
            .map(|(name, (b, c))| {
                let change = share(c, comparison.total) - share(b, baseline.total);
                (name, b, c, change)
            })
            .collect();
        rows.sort_by(|x, y| y.3.abs().total_cmp(&x.3.abs()).then(x.0.cmp(y.0)));
        let unit = unit_of(&a.profile_type);
        let mut out = format!(
            "baseline total\t{}\t{unit}\ncomparison total\t{}\t{unit}\n\
             baseline self\tbaseline%\tcomparison self\tcomparison%\tchange (points)\tfunction\n",
            baseline.total, comparison.total
        );
        for (name, b, c, change) in rows.into_iter().take(limit) {
            let _ = writeln!(
                out,
                "{b}\t{}\t{c}\t{}\t{change:+.2}\t{}",
                percent(b, baseline.total),
                percent(c, comparison.total),
                cut(name)
            );
        }
        Ok(out)
    }

    async fn series(&self, a: SeriesArgs) -> Result<String, ApiError> {
        let (start, end) = a.query.range.millis()?;
        let span_s = (end - start) as f64 / 1000.0;
        let step = a.step_seconds.unwrap_or(span_s / 100.0).max(1.0);
        if !step.is_finite() || span_s / step > MAX_POINTS as f64 {
            return Err(ApiError::invalid(format!(
                "step_seconds {step} makes more than {MAX_POINTS} points over the range"
            )));
        }
        let r = self
            .querier()
            .select_series(
                &self.tenants,
                q::SelectSeriesRequest {
                    profile_type_id: a.query.profile_type.clone(),
                    label_selector: a.query.selector.clone(),
                    start,
                    end,
                    group_by: a.group_by,
                    step,
                    limit: Some(MAX_SERIES as i64),
                    ..Default::default()
                },
            )
            .await?;
        let unit = unit_of(&a.query.profile_type);
        let mut out = format!("step\t{step}\ts\nunit\t{unit}\n");
        for s in r.series {
            let labels: Vec<String> = s
                .labels
                .iter()
                .map(|l| format!("{}={:?}", l.name, l.value))
                .collect();
            let sum: f64 = s.points.iter().map(|p| p.value).sum();
            let _ = writeln!(out, "\nseries\t{{{}}}\tsum\t{sum}", labels.join(", "));
            for p in s.points.iter().take(MAX_POINTS) {
                let _ = writeln!(out, "{}\t{}", utc(p.timestamp), p.value);
            }
        }
        Ok(out)
    }
}

/// A `SelectMergeStacktraces` request for the whole function table.
fn functions_request(
    query: &Query,
    selector: &str,
    start: i64,
    end: i64,
) -> q::SelectMergeStacktracesRequest {
    q::SelectMergeStacktracesRequest {
        profile_type_id: query.profile_type.clone(),
        label_selector: selector.to_owned(),
        start,
        end,
        format: q::ProfileFormat::Functions as i32,
        format_options: Some(q::ProfileFormatOptions {
            functions: Some(t::FunctionTableOptions { limit: 0 }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Two selectors as one: `{a="1"}` and `{b="2"}` make `{a="1", b="2"}`.
fn join_selectors(a: &str, b: &str) -> String {
    let inner = |s: &str| {
        s.trim()
            .trim_start_matches('{')
            .trim_end_matches('}')
            .trim()
            .to_owned()
    };
    let parts: Vec<String> = [inner(a), inner(b)]
        .into_iter()
        .filter(|p| !p.is_empty())
        .collect();
    format!("{{{}}}", parts.join(", "))
}

/// A count argument from 1 to `max`.
fn bounded(name: &str, n: usize, max: usize) -> Result<usize, ApiError> {
    if n == 0 || n > max {
        return Err(ApiError::invalid(format!("{name} must be from 1 to {max}")));
    }
    Ok(n)
}

/// Names one per line, at most [`MAX_NAMES`] (then how many more).
fn lines(mut names: Vec<String>) -> String {
    let more = names.len().saturating_sub(MAX_NAMES);
    names.truncate(MAX_NAMES);
    let mut out = names.join("\n");
    if more > 0 {
        let _ = write!(out, "\n({more} more not listed)");
    }
    out
}

/// `v` as a share of `total`, in %, two decimals.
fn percent(v: i64, total: i64) -> String {
    if total == 0 {
        return "0.00%".into();
    }
    format!("{:.2}%", v as f64 * 100.0 / total as f64)
}

/// A name cut to [`MAX_NAME_CHARS`] characters.
fn cut(name: &str) -> Cow<'_, str> {
    match name.char_indices().nth(MAX_NAME_CHARS) {
        Some((i, _)) => Cow::Owned(format!("{}…", &name[..i])),
        None => Cow::Borrowed(name),
    }
}

/// The sample unit of a profile type id (its third part).
fn unit_of(profile_type: &str) -> &str {
    profile_type.split(':').nth(2).unwrap_or("")
}

/// Unix milliseconds as UTC, `2026-12-07T12:00:00Z`.
fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(1_765_108_800_000), "2025-12-07T12:00:00Z");
        assert_eq!(join_selectors("{a=\"1\"}", "{}"), "{a=\"1\"}");
        assert_eq!(join_selectors("{}", "{b=\"2\"}"), "{b=\"2\"}");
        assert_eq!(
            join_selectors("{a=\"1\"}", "{b=\"2\"}"),
            "{a=\"1\", b=\"2\"}"
        );
        assert_eq!(percent(1, 3), "33.33%");
        assert_eq!(cut(&"é".repeat(300)).chars().count(), MAX_NAME_CHARS + 1);
        assert!(bounded("limit", 0, 5).is_err() && bounded("limit", 6, 5).is_err());
        assert_eq!(
            unit_of("process_cpu:cpu:nanoseconds:cpu:nanoseconds"),
            "nanoseconds"
        );
    }

    #[test]
    fn every_tool_has_an_object_schema_and_a_stated_bound() {
        let tools = tools();
        assert_eq!(tools.len(), 6);
        for t in &tools {
            assert_eq!(t.input_schema["type"], "object", "{}", t.name);
            let d = t.description.as_deref().unwrap_or_default();
            assert!(d.len() > 40, "{}: {d}", t.name);
        }
        let diff = tools.iter().find(|t| t.name == "diff_functions").unwrap();
        assert!(diff.input_schema["properties"].get("from").is_none());
    }
}
