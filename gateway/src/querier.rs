//! `querier.v1.QuerierService`: the logic shared by the Connect and gRPC front ends.
//! Times on the wire are Unix milliseconds; `step` is seconds.

use kiln_proto::google::v1::Profile;
use kiln_proto::querier::v1 as q;
use kiln_proto::types::v1 as t;
use kiln_storage::query::{Aggregation, FlameTree, SampleFilter};
use kiln_storage::selector::{Selector, parse_selector};

use crate::app::AppRef;
use crate::auth::TenantId;
use crate::error::{ApiError, ErrorKind};
use crate::time::now_nanos;

const NANOS_PER_MS: i64 = 1_000_000;

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
}

impl Querier {
    pub fn new(app: AppRef) -> Self {
        Self { app }
    }

    fn filter(&self, tenant: &TenantId, r: &MergeRequest<'_>) -> Result<SampleFilter, ApiError> {
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
        let (start_nanos, end_nanos) = self.range(tenant, r.start, r.end)?;
        Ok(SampleFilter {
            tenant: tenant.to_string(),
            // A sixth `:delta` part is accepted and dropped, as Pyroscope does.
            profile_type: profile_type.id(),
            selector: parse_selector(r.label_selector)?,
            start_nanos,
            end_nanos,
            span_ids: span_ids(r.span_selector)?,
            trace_ids: trace_ids(r.trace_id_selector)?,
        })
    }

    /// The query's time range within the tenant's maximum query range. (Retention works on
    /// whole blocks by ingestion time: see `crate::admin::apply_retention`.)
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

    /// A flame graph's node budget: the tenant's default for `None` or 0, refused above its
    /// maximum.
    pub fn max_nodes(&self, tenant: &TenantId, requested: Option<i64>) -> Result<usize, ApiError> {
        let limits = self.app.limits(tenant);
        match requested {
            None | Some(0) => Ok(limits.max_flamegraph_nodes_default as usize),
            Some(n) if n < 0 => Err(ApiError::invalid("max_nodes must not be negative")),
            Some(n) if n > limits.max_flamegraph_nodes_max => Err(ApiError::invalid(format!(
                "max_nodes {n} is above the limit of {}",
                limits.max_flamegraph_nodes_max
            ))),
            Some(n) => Ok(n as usize),
        }
    }

    pub async fn profile_types(
        &self,
        tenant: &TenantId,
        r: q::ProfileTypesRequest,
    ) -> Result<q::ProfileTypesResponse, ApiError> {
        let (start, end) = self.range(tenant, r.start, r.end)?;
        let types = self
            .app
            .storage
            .query()
            .profile_types(tenant, start, end)
            .await?;
        Ok(q::ProfileTypesResponse {
            profile_types: types
                .into_iter()
                .map(|p| t::ProfileType {
                    id: p.id(),
                    name: p.name,
                    sample_type: p.sample_type,
                    sample_unit: p.sample_unit,
                    period_type: p.period_type,
                    period_unit: p.period_unit,
                })
                .collect(),
        })
    }

    pub async fn label_names(
        &self,
        tenant: &TenantId,
        r: t::LabelNamesRequest,
    ) -> Result<t::LabelNamesResponse, ApiError> {
        let (start, end) = self.range(tenant, r.start, r.end)?;
        let names = self
            .app
            .storage
            .query()
            .label_names(tenant, &selectors(&r.matchers)?, start, end)
            .await?;
        Ok(t::LabelNamesResponse { names })
    }

    pub async fn label_values(
        &self,
        tenant: &TenantId,
        r: t::LabelValuesRequest,
    ) -> Result<t::LabelValuesResponse, ApiError> {
        if r.name.is_empty() {
            return Err(ApiError::invalid("the label name is required"));
        }
        let (start, end) = self.range(tenant, r.start, r.end)?;
        let names = self
            .app
            .storage
            .query()
            .label_values(tenant, &r.name, &selectors(&r.matchers)?, start, end)
            .await?;
        Ok(t::LabelValuesResponse { names })
    }

    pub async fn series(
        &self,
        tenant: &TenantId,
        r: q::SeriesRequest,
    ) -> Result<q::SeriesResponse, ApiError> {
        let (start, end) = self.range(tenant, r.start, r.end)?;
        let series = self
            .app
            .storage
            .query()
            .series(tenant, &selectors(&r.matchers)?, &r.label_names, start, end)
            .await?;
        Ok(q::SeriesResponse {
            labels_set: series
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
    /// what the legacy render APIs (`crate::legacy`) encode in formats of their own.
    pub async fn merge_tree(
        &self,
        tenant: &TenantId,
        profile_type: &str,
        label_selector: &str,
        start: i64,
        end: i64,
    ) -> Result<FlameTree, ApiError> {
        let m = MergeRequest {
            profile_type,
            label_selector,
            start,
            end,
            span_selector: &[],
            trace_id_selector: &[],
        };
        let filter = self.filter(tenant, &m)?;
        Ok(self.app.storage.query().merge_tree(&filter).await?)
    }

    async fn flamegraph(
        &self,
        tenant: &TenantId,
        r: &MergeRequest<'_>,
        max_nodes: Option<i64>,
    ) -> Result<q::FlameGraph, ApiError> {
        let filter = self.filter(tenant, r)?;
        let max_nodes = self.max_nodes(tenant, max_nodes)?;
        let tree = self.app.storage.query().merge_tree(&filter).await?;
        Ok(tree.to_flamegraph(max_nodes))
    }

    pub async fn select_merge_stacktraces(
        &self,
        tenant: &TenantId,
        r: q::SelectMergeStacktracesRequest,
    ) -> Result<q::SelectMergeStacktracesResponse, ApiError> {
        if !r.profile_id_selector.is_empty() {
            return Err(ApiError::new(
                ErrorKind::Unimplemented,
                "profile_id_selector is not supported yet",
            ));
        }
        if r.stack_trace_selector.is_some() {
            return Err(ApiError::new(
                ErrorKind::Unimplemented,
                "stack_trace_selector is not supported yet",
            ));
        }
        let m = MergeRequest {
            profile_type: &r.profile_type_id,
            label_selector: &r.label_selector,
            start: r.start,
            end: r.end,
            span_selector: &r.span_selector,
            trace_id_selector: &r.trace_id_selector,
        };
        match q::ProfileFormat::try_from(r.format).unwrap_or(q::ProfileFormat::Unspecified) {
            q::ProfileFormat::Unspecified | q::ProfileFormat::Flamegraph => {
                Ok(q::SelectMergeStacktracesResponse {
                    flamegraph: Some(self.flamegraph(tenant, &m, r.max_nodes).await?),
                    ..Default::default()
                })
            }
            q::ProfileFormat::Pprof => {
                let filter = self.filter(tenant, &m)?;
                let profile = self.app.storage.query().merge_pprof(&filter).await?;
                Ok(q::SelectMergeStacktracesResponse {
                    pprof: Some(q::PprofProfile {
                        profile: Some(profile),
                    }),
                    ..Default::default()
                })
            }
            other => Err(ApiError::new(
                ErrorKind::Unimplemented,
                format!(
                    "format {} is not supported; use FLAMEGRAPH or PPROF",
                    other.as_str_name()
                ),
            )),
        }
    }

    pub async fn select_merge_span_profile(
        &self,
        tenant: &TenantId,
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
        };
        Ok(q::SelectMergeSpanProfileResponse {
            flamegraph: Some(self.flamegraph(tenant, &m, r.max_nodes).await?),
            ..Default::default()
        })
    }

    pub async fn select_merge_profile(
        &self,
        tenant: &TenantId,
        r: q::SelectMergeProfileRequest,
    ) -> Result<Profile, ApiError> {
        if !r.profile_id_selector.is_empty() {
            return Err(ApiError::new(
                ErrorKind::Unimplemented,
                "profile_id_selector is not supported yet",
            ));
        }
        let m = MergeRequest {
            profile_type: &r.profile_type_id,
            label_selector: &r.label_selector,
            start: r.start,
            end: r.end,
            span_selector: &[],
            trace_id_selector: &r.trace_id_selector,
        };
        let filter = self.filter(tenant, &m)?;
        Ok(self.app.storage.query().merge_pprof(&filter).await?)
    }

    pub async fn select_series(
        &self,
        tenant: &TenantId,
        r: q::SelectSeriesRequest,
    ) -> Result<q::SelectSeriesResponse, ApiError> {
        if r.start <= 0 || r.end <= 0 {
            return Err(ApiError::invalid(
                "SelectSeries needs start and end (Unix ms)",
            ));
        }
        if !(r.step.is_finite() && r.step > 0.0) {
            return Err(ApiError::invalid(
                "step must be a positive number of seconds",
            ));
        }
        let m = MergeRequest {
            profile_type: &r.profile_type_id,
            label_selector: &r.label_selector,
            start: r.start,
            end: r.end,
            span_selector: &[],
            trace_id_selector: &[],
        };
        let filter = self.filter(tenant, &m)?;
        let aggregation = match r.aggregation {
            Some(a) if a == t::TimeSeriesAggregationType::Average as i32 => Aggregation::Average,
            _ => Aggregation::Sum,
        };
        let step_nanos = ((r.step * 1e9) as i64).max(1_000_000);
        let limit = r.limit.filter(|l| *l > 0).map(|l| l as usize);
        let series = self
            .app
            .storage
            .query()
            .select_series(
                &filter,
                &r.group_by,
                step_nanos,
                aggregation,
                limit,
                r.exemplar_type == t::ExemplarType::Span as i32,
            )
            .await?;
        Ok(q::SelectSeriesResponse {
            series: series
                .into_iter()
                .map(|s| t::Series {
                    labels: s
                        .labels
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
                            exemplars: s
                                .exemplars
                                .get(i)
                                .map(|e| e.iter().map(exemplar).collect())
                                .unwrap_or_default(),
                            ..Default::default()
                        })
                        .collect(),
                })
                .collect(),
        })
    }

    pub async fn get_profile_stats(
        &self,
        tenant: &TenantId,
        _r: t::GetProfileStatsRequest,
    ) -> Result<t::GetProfileStatsResponse, ApiError> {
        let s = self.app.storage.query().profile_stats(tenant).await?;
        Ok(t::GetProfileStatsResponse {
            data_ingested: s.data_ingested,
            oldest_profile_time: s.oldest_nanos.div_euclid(NANOS_PER_MS),
            newest_profile_time: s.newest_nanos.div_euclid(NANOS_PER_MS),
        })
    }
}

/// A span exemplar on the wire: span and trace ids in hex, time in Unix ms.
fn exemplar(e: &kiln_storage::query::SpanExemplar) -> t::Exemplar {
    t::Exemplar {
        timestamp: e.timestamp_ms,
        span_id: kiln_otel::ids::format_span_id(e.span_id),
        trace_id: e
            .trace_id
            .map(|t| kiln_otel::ids::format_trace_id(&t))
            .unwrap_or_default(),
        value: e.value,
        ..Default::default()
    }
}
