//! `querier.v1.QuerierService`: the logic shared by its Connect front end (`connect`) and its
//! gRPC one (`grpc`); the function projections in `projections`, heatmap slots in
//! `heatmap`. Times on the wire are Unix milliseconds; `step` is seconds.

use std::sync::Arc;

use kiln_proto::google::v1::Profile;
use kiln_proto::querier::v1 as q;
use kiln_proto::types::v1 as t;
use kiln_storage::query::frame_filter::FrameFilter;
use kiln_storage::query::{Aggregation, Exemplars, FlameTree, SampleFilter};
use kiln_storage::selector::{Selector, parse_selector};

use crate::app::AppRef;
use crate::auth::{TenantId, TenantSet};
use crate::error::ApiError;
use crate::tenants::throttled;
use crate::time::now_nanos;

mod connect;
mod grpc;
mod heatmap;
mod projections;
mod tenancy;

pub use tenancy::TENANT_LABEL;
use tenancy::{for_tenant, tenant_selectors};

pub use connect::connect_handler;

const NANOS_PER_MS: i64 = 1_000_000;

/// Every `querier.v1` method Kiln answers, with the [`Querier`] function answering it: the one
/// list the Connect dispatch (`connect`) and the telemetry layer's names
/// ([`QUERIER_METHODS`]) are made from. (gRPC's come from the service trait, which the compiler
/// checks against the `.proto`.) Invokes `$callback! { "Name" => function, … }`.
macro_rules! querier_methods {
    ($callback:ident) => {
        $callback! {
            "ProfileTypes" => profile_types,
            "LabelNames" => label_names,
            "LabelValues" => label_values,
            "Series" => series,
            "SelectMergeStacktraces" => select_merge_stacktraces,
            "SelectMergeSpanProfile" => select_merge_span_profile,
            "SelectMergeProfile" => select_merge_profile,
            "SelectSeries" => select_series,
            "GetProfileStats" => get_profile_stats,
            "AnalyzeQuery" => analyze_query,
            "SelectHeatmap" => select_heatmap,
            "Diff" => diff,
        }
    };
}
pub(crate) use querier_methods;

macro_rules! full_names {
    ($($name:literal => $fn:ident),* $(,)?) => {
        /// `querier.v1.QuerierService/<method>` of every method Kiln answers (others are
        /// `querier.v1.QuerierService/unknown`).
        pub const QUERIER_METHODS: &[&str] = &[$(concat!("querier.v1.QuerierService/", $name)),*];
    };
}
querier_methods!(full_names);

/// `[start, end)` in nanoseconds from a request's milliseconds. Both 0: all time; end 0: now.
fn time_range(start_ms: i64, end_ms: i64) -> Result<(i64, i64), ApiError> {
    if start_ms <= 0 && end_ms <= 0 {
        return Ok((i64::MIN, i64::MAX));
    }
    let end = if end_ms <= 0 {
        now_nanos()
    } else {
        end_ms.saturating_mul(NANOS_PER_MS)
    };
    let start = start_ms.max(0).saturating_mul(NANOS_PER_MS);
    if start > end {
        return Err(ApiError::invalid(format!(
            "start {start_ms} is after end {end_ms}"
        )));
    }
    // `end` is inclusive on the wire (Pyroscope reads [start, end]).
    Ok((start, end.saturating_add(1)))
}

fn selectors(matchers: &[String]) -> Result<Vec<Selector>, ApiError> {
    matchers
        .iter()
        .map(|m| parse_selector(m).map_err(ApiError::from))
        .collect()
}

/// Parses 16-hex-digit span ids.
fn span_ids(spans: &[String]) -> Result<Vec<u64>, ApiError> {
    spans
        .iter()
        .map(|s| {
            let id = kiln_otel::ids::parse_span_id(s);
            if id == 0 {
                Err(ApiError::invalid(format!(
                    "invalid span id {s:?}: expected 16 hex digits"
                )))
            } else {
                Ok(id)
            }
        })
        .collect()
}

/// Parses 32-hex-digit trace ids.
fn trace_ids(traces: &[String]) -> Result<Vec<[u8; 16]>, ApiError> {
    traces
        .iter()
        .map(|t| {
            kiln_otel::ids::parse_trace_id(t).ok_or_else(|| {
                ApiError::invalid(format!("invalid trace id {t:?}: expected 32 hex digits"))
            })
        })
        .collect()
}

/// Most profile ids one query may select (each row is checked against them).
const MAX_PROFILE_IDS: usize = 1024;

/// Parses profile ids (UUIDs, as exemplars give them).
fn profile_ids(ids: &[String]) -> Result<Vec<[u8; 16]>, ApiError> {
    if ids.len() > MAX_PROFILE_IDS {
        return Err(ApiError::invalid(format!(
            "profile_id_selector names {} profiles; at most {MAX_PROFILE_IDS}",
            ids.len()
        )));
    }
    ids.iter()
        .map(|id| {
            uuid::Uuid::parse_str(id)
                .map(|u| *u.as_bytes())
                .map_err(|_| {
                    ApiError::invalid(format!("invalid profile id {id:?}: expected a UUID"))
                })
        })
        .collect()
}

/// A profile id on the wire.
fn format_profile_id(id: &[u8; 16]) -> String {
    uuid::Uuid::from_bytes(*id).to_string()
}

/// The querier API.
#[derive(Debug, Clone)]
pub struct Querier {
    app: AppRef,
}

struct MergeRequest<'a> {
    profile_type: &'a str,
    label_selector: &'a str,
    start: i64,
    end: i64,
    span_selector: &'a [String],
    trace_id_selector: &'a [String],
    /// When not empty, only these ingested profiles (UUIDs).
    profile_id_selector: &'a [String],
    /// Only the stacks starting with these functions, root first (empty: all).
    call_site: Vec<String>,
    /// Only the stacks this filter keeps (`stack_trace_selector.frame_filter`).
    frame_filter: Option<Arc<FrameFilter>>,
}

impl<'a> MergeRequest<'a> {
    /// A profile type and label selector over `[start, end]`, nothing more.
    fn plain(profile_type: &'a str, label_selector: &'a str, start: i64, end: i64) -> Self {
        Self {
            profile_type,
            label_selector,
            start,
            end,
            span_selector: &[],
            trace_id_selector: &[],
            profile_id_selector: &[],
            call_site: Vec::new(),
            frame_filter: None,
        }
    }
}

impl<'a> MergeRequest<'a> {
    /// Every selector of a `SelectMergeStacktraces` request (a flame graph, a projection, one
    /// side of a diff).
    fn of_stacktraces(r: &'a q::SelectMergeStacktracesRequest) -> Result<Self, ApiError> {
        Ok(Self {
            profile_type: &r.profile_type_id,
            label_selector: &r.label_selector,
            start: r.start,
            end: r.end,
            span_selector: &r.span_selector,
            trace_id_selector: &r.trace_id_selector,
            profile_id_selector: &r.profile_id_selector,
            call_site: call_site(r.stack_trace_selector.as_ref()),
            frame_filter: frame_filter(r.stack_trace_selector.as_ref())?,
        })
    }
}

/// Checks what a time series or heatmap needs: a range in Unix ms and a positive step.
fn check_stepped(method: &str, start: i64, end: i64, step: f64) -> Result<(), ApiError> {
    if start <= 0 || end <= 0 {
        return Err(ApiError::invalid(format!(
            "{method} needs start and end (Unix ms)"
        )));
    }
    if !(step.is_finite() && step > 0.0) {
        return Err(ApiError::invalid(
            "step must be a positive number of seconds",
        ));
    }
    Ok(())
}

/// The compiled `frame_filter` of a `stack_trace_selector` (`None`: no terms). An invalid regex
/// is refused before anything is read, as Pyroscope refuses it.
fn frame_filter(
    selector: Option<&t::StackTraceSelector>,
) -> Result<Option<Arc<FrameFilter>>, ApiError> {
    let Some(f) = selector.and_then(|s| s.frame_filter.as_ref()) else {
        return Ok(None);
    };
    FrameFilter::new(
        &f.include_function_names,
        &f.exclude_function_names,
        &f.include_function_name_regexes,
        &f.exclude_function_name_regexes,
    )
    .map(|f| f.map(Arc::new))
    .map_err(ApiError::invalid)
}

/// The function names of a `stack_trace_selector`'s call site, root first.
fn call_site(selector: Option<&t::StackTraceSelector>) -> Vec<String> {
    selector
        .map(|s| s.call_site.iter().map(|l| l.name.clone()).collect())
        .unwrap_or_default()
}

impl Querier {
    pub fn new(app: AppRef) -> Self {
        Self { app }
    }

    /// The storage filter of each tenant a request reads: the tenants its `__tenant__`
    /// matchers keep (none may be left), each within its own limits.
    fn filters<'t>(
        &self,
        tenants: &'t TenantSet,
        r: &MergeRequest<'_>,
    ) -> Result<Vec<(&'t TenantId, SampleFilter)>, ApiError> {
        let Some(profile_type) = kiln_otel::model::ProfileType::parse(r.profile_type) else {
            return Err(ApiError::invalid(format!(
                "invalid profile type {:?}: expected name:sample_type:sample_unit:period_type:period_unit",
                r.profile_type
            )));
        };
        if !r.span_selector.is_empty() && !r.trace_id_selector.is_empty() {
            return Err(ApiError::invalid(
                "span_selector and trace_id_selector cannot be used together",
            ));
        }
        let selector = parse_selector(r.label_selector)?;
        let (span_ids, trace_ids) = (span_ids(r.span_selector)?, trace_ids(r.trace_id_selector)?);
        let profile_ids = profile_ids(r.profile_id_selector)?;
        let mut out = Vec::with_capacity(tenants.len());
        for tenant in tenants.iter() {
            let Some(selector) = for_tenant(&selector, tenant) else {
                continue;
            };
            let (start_nanos, end_nanos) = self.range(tenant, r.start, r.end)?;
            out.push((
                tenant,
                SampleFilter {
                    tenant: tenant.to_string(),
                    // A sixth `:delta` part is accepted and dropped, as Pyroscope does.
                    profile_type: profile_type.id(),
                    selector,
                    start_nanos,
                    end_nanos,
                    span_ids: span_ids.clone(),
                    trace_ids: trace_ids.clone(),
                    profile_ids: profile_ids.clone(),
                },
            ));
        }
        Ok(out)
    }

    /// The query's time range within the tenant's maximum query range. (Retention works on
    /// whole blocks by ingestion time: see `crate::server::upkeep::apply_retention`.)
    fn range(&self, tenant: &TenantId, start_ms: i64, end_ms: i64) -> Result<(i64, i64), ApiError> {
        let limits = self.app.limits(tenant);
        let (mut start, end) = time_range(start_ms, end_ms)?;
        let max = limits.max_query_range.0 as i64 * 1_000_000_000;
        if max > 0 {
            if start == i64::MIN {
                start = now_nanos().saturating_sub(max);
            } else if end.saturating_sub(start) > max.saturating_add(1) {
                return Err(ApiError::invalid(format!(
                    "the query covers more than the tenant's maximum range of {} s",
                    limits.max_query_range.0
                )));
            }
        }
        Ok((start, end.max(start)))
    }

    /// A flame graph's node budget: the tenants' default for `None` or 0, refused above their
    /// maximum (the smallest of each, over a read spanning tenants).
    pub fn max_nodes(
        &self,
        tenants: &TenantSet,
        requested: Option<i64>,
    ) -> Result<usize, ApiError> {
        let (default, max) = tenants
            .iter()
            .map(|t| {
                let l = self.app.limits(t);
                (l.max_flamegraph_nodes_default, l.max_flamegraph_nodes_max)
            })
            .fold((i64::MAX, i64::MAX), |(d, m), (ld, lm)| {
                (d.min(ld), m.min(lm))
            });
        match requested {
            None | Some(0) => Ok(default.max(0) as usize),
            Some(n) if n < 0 => Err(ApiError::invalid("max_nodes must not be negative")),
            Some(n) if n > max => Err(ApiError::invalid(format!(
                "max_nodes {n} is above the limit of {max}"
            ))),
            Some(n) => Ok(n as usize),
        }
    }

    pub async fn profile_types(
        &self,
        tenants: &TenantSet,
        r: q::ProfileTypesRequest,
    ) -> Result<q::ProfileTypesResponse, ApiError> {
        let mut types = std::collections::BTreeMap::new();
        for tenant in tenants.iter() {
            let (start, end) = self.range(tenant, r.start, r.end)?;
            let found = self
                .app
                .storage
                .query()
                .profile_types(tenant, start, end)
                .await?;
            types.extend(found.into_iter().map(|p| (p.id(), p)));
        }
        Ok(q::ProfileTypesResponse {
            profile_types: types
                .into_iter()
                .map(|(id, p)| t::ProfileType {
                    id,
                    name: p.name,
                    sample_type: p.sample_type,
                    sample_unit: p.sample_unit,
                    period_type: p.period_type,
                    period_unit: p.period_unit,
                })
                .collect(),
        })
    }

    /// Label names; a read spanning tenants lists [`TENANT_LABEL`] too.
    pub async fn label_names(
        &self,
        tenants: &TenantSet,
        r: t::LabelNamesRequest,
    ) -> Result<t::LabelNamesResponse, ApiError> {
        let mut names = std::collections::BTreeSet::new();
        for (tenant, selectors) in tenant_selectors(tenants, &r.matchers)? {
            let (start, end) = self.range(tenant, r.start, r.end)?;
            let found = self
                .app
                .storage
                .query()
                .label_names(tenant, &selectors, start, end)
                .await?;
            if tenants.spans_tenants() && !found.is_empty() {
                names.insert(TENANT_LABEL.to_owned());
            }
            names.extend(found);
        }
        Ok(t::LabelNamesResponse {
            names: names.into_iter().collect(),
        })
    }

    /// Label values; those of [`TENANT_LABEL`] are the tenants read that hold matching data.
    pub async fn label_values(
        &self,
        tenants: &TenantSet,
        r: t::LabelValuesRequest,
    ) -> Result<t::LabelValuesResponse, ApiError> {
        if r.name.is_empty() {
            return Err(ApiError::invalid("the label name is required"));
        }
        let mut values = std::collections::BTreeSet::new();
        for (tenant, selectors) in tenant_selectors(tenants, &r.matchers)? {
            let (start, end) = self.range(tenant, r.start, r.end)?;
            let query = self.app.storage.query();
            if r.name == TENANT_LABEL {
                if !query
                    .label_names(tenant, &selectors, start, end)
                    .await?
                    .is_empty()
                {
                    values.insert(tenant.to_string());
                }
                continue;
            }
            values.extend(
                query
                    .label_values(tenant, &r.name, &selectors, start, end)
                    .await?,
            );
        }
        Ok(t::LabelValuesResponse {
            names: values.into_iter().collect(),
        })
    }

    /// Series label sets; over several tenants each carries [`TENANT_LABEL`] (when
    /// `label_names` is empty or names it).
    pub async fn series(
        &self,
        tenants: &TenantSet,
        r: q::SeriesRequest,
    ) -> Result<q::SeriesResponse, ApiError> {
        let label_names: Vec<String> = r
            .label_names
            .iter()
            .filter(|n| *n != TENANT_LABEL)
            .cloned()
            .collect();
        let with_tenant = (tenants.spans_tenants() && r.label_names.is_empty())
            || r.label_names.len() > label_names.len();
        let mut sets = std::collections::BTreeSet::new();
        for (tenant, selectors) in tenant_selectors(tenants, &r.matchers)? {
            let (start, end) = self.range(tenant, r.start, r.end)?;
            let series = self
                .app
                .storage
                .query()
                .series(tenant, &selectors, &label_names, start, end)
                .await?;
            // Only `__tenant__` asked for: the storage's empty list would mean every label.
            let only_tenant = label_names.is_empty() && !r.label_names.is_empty();
            for mut labels in series {
                if only_tenant {
                    labels.clear();
                }
                if with_tenant {
                    tenancy::label_tenant(&mut labels, tenant);
                }
                sets.insert(labels);
            }
        }
        Ok(q::SeriesResponse {
            labels_set: sets
                .into_iter()
                .map(|labels| t::Labels {
                    labels: labels
                        .into_iter()
                        .map(|(name, value)| t::LabelPair { name, value })
                        .collect(),
                })
                .collect(),
        })
    }

    /// The merged stack tree of a profile type and label selector over `[start, end]` (Unix ms):
    /// what the legacy render APIs (`crate::api::legacy`) encode in formats of their own.
    pub async fn merge_tree(
        &self,
        tenants: &TenantSet,
        profile_type: &str,
        label_selector: &str,
        start: i64,
        end: i64,
    ) -> Result<FlameTree, ApiError> {
        let m = MergeRequest::plain(profile_type, label_selector, start, end);
        self.merged_tree(tenants, &m).await
    }

    /// The merged tree of a request's stacks (its call site not applied), summed over the
    /// tenants read.
    async fn merged_tree(
        &self,
        tenants: &TenantSet,
        m: &MergeRequest<'_>,
    ) -> Result<FlameTree, ApiError> {
        let filters = self.filters(tenants, m)?;
        let query = self.app.storage.query();
        let trees =
            futures::future::try_join_all(filters.iter().map(|(_, f)| query.merge_tree(f))).await?;
        let tree = FlameTree::merged(trees);
        Ok(match &m.frame_filter {
            Some(f) => tree.retain_frames(f),
            None => tree,
        })
    }

    /// The merged tree of a request's stacks under its call site.
    async fn focused_tree(
        &self,
        tenants: &TenantSet,
        m: &MergeRequest<'_>,
    ) -> Result<FlameTree, ApiError> {
        let call_site: Vec<&str> = m.call_site.iter().map(String::as_str).collect();
        Ok(self.merged_tree(tenants, m).await?.focus(&call_site))
    }

    async fn flamegraph(
        &self,
        tenants: &TenantSet,
        r: &MergeRequest<'_>,
        max_nodes: Option<i64>,
    ) -> Result<q::FlameGraph, ApiError> {
        let max_nodes = self.max_nodes(tenants, max_nodes)?;
        Ok(self
            .focused_tree(tenants, r)
            .await?
            .to_flamegraph(max_nodes))
    }

    /// The merged tree in Pyroscope's compact encoding (`PROFILE_FORMAT_TREE`), cut to
    /// `max_nodes` as the flame graph is ([`FlameTree::to_tree_bytes`]).
    async fn tree_bytes(
        &self,
        tenants: &TenantSet,
        r: &MergeRequest<'_>,
        max_nodes: Option<i64>,
    ) -> Result<Vec<u8>, ApiError> {
        let max_nodes = self.max_nodes(tenants, max_nodes)?;
        Ok(self
            .focused_tree(tenants, r)
            .await?
            .to_tree_bytes(max_nodes))
    }

    pub async fn select_merge_stacktraces(
        &self,
        tenants: &TenantSet,
        r: q::SelectMergeStacktracesRequest,
    ) -> Result<q::SelectMergeStacktracesResponse, ApiError> {
        let m = MergeRequest::of_stacktraces(&r)?;
        match q::ProfileFormat::try_from(r.format).unwrap_or(q::ProfileFormat::Unspecified) {
            q::ProfileFormat::Unspecified | q::ProfileFormat::Flamegraph => {
                Ok(q::SelectMergeStacktracesResponse {
                    flamegraph: Some(self.flamegraph(tenants, &m, r.max_nodes).await?),
                    ..Default::default()
                })
            }
            q::ProfileFormat::Functions
            | q::ProfileFormat::FunctionTree
            | q::ProfileFormat::Sandwich => self.select_projection(tenants, &r).await,
            q::ProfileFormat::Tree => Ok(q::SelectMergeStacktracesResponse {
                tree: self.tree_bytes(tenants, &m, r.max_nodes).await?,
                ..Default::default()
            }),
            q::ProfileFormat::Pprof => {
                let profile = self.merged_pprof(tenants, &m).await?;
                Ok(q::SelectMergeStacktracesResponse {
                    pprof: Some(q::PprofProfile {
                        profile: Some(profile),
                    }),
                    ..Default::default()
                })
            }
            q::ProfileFormat::Dot => {
                let filters = self.filters(tenants, &m)?;
                let max_nodes = match r.max_nodes {
                    Some(n) if n > 0 => usize::try_from(n).unwrap_or(usize::MAX),
                    _ => 100,
                };
                let source = self.max_nodes(
                    tenants,
                    Some(
                        i64::try_from(max_nodes.max(crate::api::render::DOT_SOURCE_NODES))
                            .unwrap_or(i64::MAX),
                    ),
                )?;
                let tree = self.focused_tree(tenants, &m).await?;
                let profile_type = kiln_otel::model::ProfileType::parse(m.profile_type)
                    .ok_or_else(|| ApiError::invalid("invalid profile type"))?;
                // The legend's range: the one the query covered, in Unix ms.
                let ms = |nanos: i64| nanos.div_euclid(1_000_000);
                let (start, end) = filters
                    .iter()
                    .map(|(_, f)| (f.start_nanos, f.end_nanos))
                    .reduce(|(s, e), (fs, fe)| (s.min(fs), e.max(fe)))
                    .unwrap_or((0, 0));
                let end = ms(end.min(now_nanos()));
                let start = ms(start.max(0)).min(end);
                let dot = if tree.total() == 0 {
                    String::new()
                } else {
                    crate::api::render::dot_text(
                        &tree,
                        source,
                        max_nodes,
                        &profile_type,
                        start,
                        end,
                    )?
                };
                Ok(q::SelectMergeStacktracesResponse {
                    dot,
                    ..Default::default()
                })
            }
        }
    }

    pub async fn select_merge_span_profile(
        &self,
        tenants: &TenantSet,
        r: q::SelectMergeSpanProfileRequest,
    ) -> Result<q::SelectMergeSpanProfileResponse, ApiError> {
        if r.span_selector.is_empty() {
            return Err(ApiError::invalid(
                "span_selector must name at least one span",
            ));
        }
        let m = MergeRequest {
            profile_type: &r.profile_type_id,
            label_selector: &r.label_selector,
            start: r.start,
            end: r.end,
            span_selector: &r.span_selector,
            trace_id_selector: &[],
            profile_id_selector: &[],
            call_site: Vec::new(),
            frame_filter: None,
        };
        if r.format == q::ProfileFormat::Tree as i32 {
            return Ok(q::SelectMergeSpanProfileResponse {
                tree: self.tree_bytes(tenants, &m, r.max_nodes).await?,
                ..Default::default()
            });
        }
        Ok(q::SelectMergeSpanProfileResponse {
            flamegraph: Some(self.flamegraph(tenants, &m, r.max_nodes).await?),
            ..Default::default()
        })
    }

    pub async fn select_merge_profile(
        &self,
        tenants: &TenantSet,
        r: q::SelectMergeProfileRequest,
    ) -> Result<Profile, ApiError> {
        let m = MergeRequest {
            profile_type: &r.profile_type_id,
            label_selector: &r.label_selector,
            start: r.start,
            end: r.end,
            span_selector: &[],
            trace_id_selector: &r.trace_id_selector,
            profile_id_selector: &r.profile_id_selector,
            call_site: call_site(r.stack_trace_selector.as_ref()),
            frame_filter: frame_filter(r.stack_trace_selector.as_ref())?,
        };
        let mut profile = self.merged_pprof(tenants, &m).await?;
        // As Pyroscope: a positive `max_nodes` cuts the profile to its heaviest call-tree
        // nodes; none (or 0) is the whole profile, as the pprof export wants it.
        if let Some(n) = r.max_nodes.filter(|n| *n > 0) {
            kiln_storage::query::pprof::truncate(
                &mut profile,
                usize::try_from(n).unwrap_or(usize::MAX),
            );
        }
        Ok(profile)
    }

    /// The selected stacks as one pprof profile, merged over the tenants read.
    async fn merged_pprof(
        &self,
        tenants: &TenantSet,
        m: &MergeRequest<'_>,
    ) -> Result<Profile, ApiError> {
        let filters = self.filters(tenants, m)?;
        let query = self.app.storage.query();
        let profiles = futures::future::try_join_all(
            filters
                .iter()
                .map(|(_, f)| query.merge_pprof_selected(f, &m.call_site, m.frame_filter.clone())),
        )
        .await?;
        if profiles.len() <= 1 {
            // One tenant's profile as the storage made it; none when `__tenant__` kept none.
            return Ok(profiles.into_iter().next().unwrap_or_else(|| {
                let profile_type = kiln_otel::model::ProfileType::parse(m.profile_type)
                    .expect("checked by filters");
                kiln_storage::query::pprof::PprofBuilder::new(&profile_type).finish(0, 0)
            }));
        }
        Ok(kiln_storage::query::pprof::merge(profiles))
    }

    /// Time series of the selected stacks. Over several tenants, each tenant's series are
    /// made alike and summed by label set; `group_by` [`TENANT_LABEL`] keeps them apart.
    pub async fn select_series(
        &self,
        tenants: &TenantSet,
        r: q::SelectSeriesRequest,
    ) -> Result<q::SelectSeriesResponse, ApiError> {
        check_stepped("SelectSeries", r.start, r.end, r.step)?;
        // A frame filter narrows the series to the stacks it keeps (judged over each block's
        // symbols, as recording rules' functions are); a call site does not narrow them.
        let frames = frame_filter(r.stack_trace_selector.as_ref())?;
        let m = MergeRequest::plain(&r.profile_type_id, &r.label_selector, r.start, r.end);
        let filters = self.filters(tenants, &m)?;
        let aggregation = match r.aggregation {
            Some(a) if a == t::TimeSeriesAggregationType::Average as i32 => Aggregation::Average,
            _ => Aggregation::Sum,
        };
        let (group_by, by_tenant) = tenancy::group_by(&r.group_by);
        if filters.len() > 1 && aggregation == Aggregation::Average && !by_tenant {
            return Err(ApiError::invalid(
                "an average over several tenants needs group_by __tenant__: each tenant's \
                 average stands alone",
            ));
        }
        let step_nanos = ((r.step * 1e9) as i64).max(1_000_000);
        let limit = r.limit.filter(|l| *l > 0).map(|l| l as usize);
        let exemplars = match t::ExemplarType::try_from(r.exemplar_type) {
            Ok(t::ExemplarType::Span) => Exemplars::Spans,
            Ok(t::ExemplarType::Individual) => Exemplars::Profiles,
            _ => Exemplars::None,
        };
        let step_ms = step_nanos / 1_000_000;
        let mut out = Vec::new();
        for (tenant, filter) in &filters {
            let series = self
                .app
                .storage
                .query()
                .select_series_of_stacks(
                    filter,
                    &group_by,
                    step_nanos,
                    aggregation,
                    // Over several tenants the limit applies to the sums.
                    if filters.len() > 1 { None } else { limit },
                    exemplars,
                    frames.clone(),
                )
                .await?;
            let throttled_at = self
                .throttled_minutes(tenant, r.start, r.end, step_nanos)
                .await?;
            let rate = self.app.tenants.limits(tenant).ingest_rate_bytes;
            out.extend(series.into_iter().map(|s| {
                let mut labels = s.labels;
                if by_tenant {
                    tenancy::label_tenant_at(&mut labels, tenant, &r.group_by);
                }
                t::Series {
                    labels: labels
                        .into_iter()
                        .map(|(name, value)| t::LabelPair { name, value })
                        .collect(),
                    points: s
                        .points
                        .iter()
                        .enumerate()
                        .map(|(i, &(timestamp, value))| t::Point {
                            value,
                            timestamp,
                            annotations: throttled::last_minute_in_step(
                                &throttled_at,
                                timestamp,
                                step_ms,
                            )
                            .map(|m| vec![throttled::annotation(rate, m)])
                            .unwrap_or_default(),
                            exemplars: s
                                .exemplars
                                .get(i)
                                .map(|e| e.iter().map(exemplar).collect())
                                .unwrap_or_default(),
                        })
                        .collect(),
                }
            }));
        }
        if filters.len() > 1 {
            out = tenancy::sum_series(out, limit);
        }
        Ok(q::SelectSeriesResponse { series: out })
    }

    /// The minutes from `start` to `end` (ms, widened by a step) in which `tenant`'s ingest
    /// was refused for its rate, sorted.
    async fn throttled_minutes(
        &self,
        tenant: &TenantId,
        start: i64,
        end: i64,
        step_nanos: i64,
    ) -> Result<Vec<i64>, ApiError> {
        let from = start.saturating_sub(throttled::MINUTE_MS);
        let to = end.saturating_add(step_nanos / 1_000_000);
        let metastore = self.app.storage.metastore();
        Ok(self
            .app
            .tenants
            .throttled()
            .minutes_of(metastore.as_ref(), tenant, from, to)
            .await?)
    }

    /// A heatmap of the selected profiles' totals (`HEATMAP_QUERY_TYPE_INDIVIDUAL`) or spans'
    /// (`…_SPAN`): per group of `group_by`, time slots of `step` seconds, each counting the
    /// points in 20 value buckets shared by every group (the smallest value to the largest),
    /// with the largest point of a bucket as its exemplar when exemplars are asked for.
    pub async fn select_heatmap(
        &self,
        tenants: &TenantSet,
        r: q::SelectHeatmapRequest,
    ) -> Result<q::SelectHeatmapResponse, ApiError> {
        check_stepped("SelectHeatmap", r.start, r.end, r.step)?;
        let m = MergeRequest::plain(&r.profile_type_id, &r.label_selector, r.start, r.end);
        let filters = self.filters(tenants, &m)?;
        let spans = r.query_type == q::HeatmapQueryType::Span as i32;
        let (group_by, by_tenant) = tenancy::group_by(&r.group_by);
        let mut groups = Vec::new();
        for (tenant, filter) in &filters {
            let found = self
                .app
                .storage
                .query()
                .profile_points(filter, &group_by, spans)
                .await?;
            groups.extend(found.into_iter().map(|mut g| {
                if by_tenant {
                    tenancy::label_tenant_at(&mut g.labels, tenant, &r.group_by);
                }
                g
            }));
        }
        if filters.len() > 1 {
            groups = tenancy::join_groups(groups);
        }
        if let Some(limit) = r.limit.filter(|l| *l > 0).map(|l| l as usize)
            && limit < groups.len()
        {
            let total = |g: &kiln_storage::query::PointGroup| -> i64 {
                g.points.iter().map(|p| p.value).sum()
            };
            groups.sort_by_key(|g| std::cmp::Reverse(total(g)));
            groups.truncate(limit);
            groups.sort_by(|a, b| a.labels.cmp(&b.labels));
        }
        let exemplars = ![
            t::ExemplarType::Unspecified as i32,
            t::ExemplarType::None as i32,
        ]
        .contains(&r.exemplar_type);
        let step_ms = ((r.step * 1000.0) as i64).max(1);
        Ok(q::SelectHeatmapResponse {
            series: heatmap::series(&groups, r.start, r.end, step_ms, exemplars),
        })
    }

    /// The flame graphs of two queries aligned node by node (the app's diff view): the
    /// encoding of `/pyroscope/render-diff`, as `FlameGraphDiff`. With the format FUNCTIONS or
    /// FUNCTION_TREE, the two queries' function projections instead ([`projections`]).
    pub async fn diff(
        &self,
        tenants: &TenantSet,
        r: q::DiffRequest,
    ) -> Result<q::DiffResponse, ApiError> {
        if let Some(projection) = self.diff_projection(tenants, &r).await? {
            return Ok(projection);
        }
        let (Some(left), Some(right)) = (r.left, r.right) else {
            return Err(ApiError::invalid("Diff needs a left and a right query"));
        };
        if left.profile_type_id != right.profile_type_id {
            return Err(ApiError::invalid(format!(
                "the two sides of a diff must have one profile type, not {:?} and {:?}",
                left.profile_type_id, right.profile_type_id
            )));
        }
        let Some(profile_type) = kiln_otel::model::ProfileType::parse(&left.profile_type_id) else {
            return Err(ApiError::invalid(format!(
                "invalid profile type {:?}",
                left.profile_type_id
            )));
        };
        let max_nodes = self.max_nodes(tenants, left.max_nodes.or(right.max_nodes))?;
        // Each side is a whole `SelectMergeStacktraces` request: its span, trace and profile id
        // selectors and its call site apply, as they do to a flame graph.
        let (lm, rm) = (
            MergeRequest::of_stacktraces(&left)?,
            MergeRequest::of_stacktraces(&right)?,
        );
        let (left_tree, right_tree) = futures::try_join!(
            self.focused_tree(tenants, &lm),
            self.focused_tree(tenants, &rm)
        )?;
        let p = crate::api::render::flamebearer::diff(
            &left_tree,
            &right_tree,
            max_nodes,
            &profile_type,
        )
        .map_err(ApiError::internal)?;
        Ok(q::DiffResponse {
            flamegraph: Some(q::FlameGraphDiff {
                names: p.flamebearer.names,
                levels: p
                    .flamebearer
                    .levels
                    .into_iter()
                    .map(|values| q::Level { values })
                    .collect(),
                total: p.flamebearer.num_ticks,
                max_self: p.flamebearer.max_self,
                left_ticks: i64::try_from(p.left_ticks).unwrap_or(i64::MAX),
                right_ticks: i64::try_from(p.right_ticks).unwrap_or(i64::MAX),
            }),
            ..Default::default()
        })
    }

    /// What a query (`<profile type id>{selector}`) would read, from the index alone: the
    /// Drilldown app's query-size tooltip.
    pub async fn analyze_query(
        &self,
        tenants: &TenantSet,
        r: q::AnalyzeQueryRequest,
    ) -> Result<q::AnalyzeQueryResponse, ApiError> {
        let query = r.query.trim();
        let (profile_type, selector) = match query.find('{') {
            Some(i) => (&query[..i], &query[i..]),
            None => (query, "{}"),
        };
        let m = MergeRequest::plain(profile_type, selector, r.start, r.end);
        let mut a = kiln_storage::query::QueryAnalysis::default();
        for (_, filter) in self.filters(tenants, &m)? {
            a.add(&self.app.storage.query().analyze(&filter).await?);
        }
        Ok(q::AnalyzeQueryResponse {
            query_scopes: vec![q::QueryScope {
                component_type: "Object store blocks".into(),
                component_count: a.blocks,
                block_count: a.blocks,
                series_count: a.series,
                profile_count: a.profiles,
                sample_count: a.rows,
                index_bytes: 0,
                profile_bytes: a.sample_bytes,
                symbol_bytes: a.symbol_bytes,
            }],
            query_impact: Some(q::QueryImpact {
                total_bytes_in_time_range: a.bytes_in_range,
                total_queried_series: a.series,
                deduplication_needed: false,
            }),
        })
    }

    pub async fn get_profile_stats(
        &self,
        tenants: &TenantSet,
        _r: t::GetProfileStatsRequest,
    ) -> Result<t::GetProfileStatsResponse, ApiError> {
        let mut out = t::GetProfileStatsResponse::default();
        for tenant in tenants.iter() {
            let s = self.app.storage.query().profile_stats(tenant).await?;
            let (oldest, newest) = (
                s.oldest_nanos.div_euclid(NANOS_PER_MS),
                s.newest_nanos.div_euclid(NANOS_PER_MS),
            );
            if !s.data_ingested && (out.data_ingested || tenant != tenants.first()) {
                continue;
            }
            if out.data_ingested {
                out.oldest_profile_time = out.oldest_profile_time.min(oldest);
                out.newest_profile_time = out.newest_profile_time.max(newest);
            } else {
                // The first tenant's answer, or the first that holds data.
                (out.oldest_profile_time, out.newest_profile_time) = (oldest, newest);
            }
            out.data_ingested |= s.data_ingested;
        }
        Ok(out)
    }
}

/// An exemplar on the wire: span and trace ids in hex, a profile's id as a UUID with its
/// series labels, time in Unix ms.
fn exemplar(e: &kiln_storage::query::Exemplar) -> t::Exemplar {
    t::Exemplar {
        timestamp: e.timestamp_ms,
        span_id: if e.span_id == 0 {
            String::new()
        } else {
            kiln_otel::ids::format_span_id(e.span_id)
        },
        trace_id: e
            .trace_id
            .map(|t| kiln_otel::ids::format_trace_id(&t))
            .unwrap_or_default(),
        profile_id: e
            .profile_id
            .as_ref()
            .map(format_profile_id)
            .unwrap_or_default(),
        value: e.value,
        labels: label_pairs(&e.labels),
    }
}

/// Label pairs on the wire.
fn label_pairs(labels: &[(String, String)]) -> Vec<t::LabelPair> {
    labels
        .iter()
        .map(|(name, value)| t::LabelPair {
            name: name.clone(),
            value: value.clone(),
        })
        .collect()
}
