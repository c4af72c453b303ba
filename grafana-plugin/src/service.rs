//! The `pluginv2` services Grafana calls: Data, Diagnostics, Resource, plus gRPC health.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kiln_proto::grpc::health::v1 as health;
use kiln_proto::pluginv2 as pb;
use kiln_proto::querier::v1 as q;
use kiln_proto::types::v1 as t;
use tonic::{Request, Response, Status};

use crate::client::{ClientError, KilnClient};
use crate::frames::{flamegraph_frame, series_frame, unit_of};
use crate::query::{KilnQuery, Settings};

/// Counters for `CollectMetrics`.
#[derive(Debug, Default)]
pub struct PluginMetrics {
    pub queries: AtomicU64,
    pub query_errors: AtomicU64,
    pub resource_calls: AtomicU64,
    pub health_checks: AtomicU64,
}

/// The plugin.
#[derive(Debug, Clone, Default)]
pub struct KilnPlugin {
    metrics: Arc<PluginMetrics>,
    /// One client (one connection pool) per datasource instance and settings version.
    clients: Arc<std::sync::Mutex<HashMap<(String, i64), KilnClient>>>,
}

impl KilnPlugin {
    fn client(&self, ctx: Option<&pb::PluginContext>) -> Result<KilnClient, ClientError> {
        let settings = Settings::from_context(ctx)?;
        let ds = ctx.and_then(|c| c.data_source_instance_settings.as_ref());
        let key = (
            ds.map(|d| d.uid.clone()).unwrap_or_default(),
            ds.map(|d| d.last_updated_ms).unwrap_or_default(),
        );
        let mut clients = self.clients.lock().expect("clients lock");
        if let Some(c) = clients.get(&key).filter(|c| c.settings() == &settings) {
            return Ok(c.clone());
        }
        let c = KilnClient::new(settings)?;
        clients.insert(key, c.clone());
        Ok(c)
    }
}

/// Step in seconds for a panel: its interval, but no more points than `max_data_points`.
pub fn step_seconds(from_ms: i64, to_ms: i64, interval_ms: i64, max_data_points: i64) -> f64 {
    let span = (to_ms - from_ms).max(0) as f64 / 1000.0;
    let by_points = if max_data_points > 0 {
        span / max_data_points as f64
    } else {
        0.0
    };
    (interval_ms as f64 / 1000.0).max(by_points).max(1.0)
}

impl KilnPlugin {
    async fn run_query(
        &self,
        client: &KilnClient,
        dq: &pb::DataQuery,
    ) -> Result<Vec<Vec<u8>>, ClientError> {
        let kq = KilnQuery::parse(&dq.json, &dq.query_type)?;
        if kq.profile_type_id.is_empty() {
            return Err(ClientError::Settings("choose a profile type".into()));
        }
        let client = &client.for_tenants(&kq.tenants);
        let (from, to) = dq
            .time_range
            .as_ref()
            .map(|r| (r.from_epoch_ms, r.to_epoch_ms))
            .unwrap_or((0, 0));
        let unit = unit_of(&kq.profile_type_id).to_owned();
        let mut frames = Vec::new();
        if kq.wants_metrics() {
            let resp: q::SelectSeriesResponse = client
                .call(
                    "SelectSeries",
                    &q::SelectSeriesRequest {
                        profile_type_id: kq.profile_type_id.clone(),
                        label_selector: kq.label_selector.clone(),
                        start: from,
                        end: to,
                        group_by: kq.group_by.clone(),
                        step: step_seconds(from, to, dq.interval_ms, dq.max_data_points),
                        limit: kq.limit,
                        ..Default::default()
                    },
                )
                .await?;
            let value_name = kq
                .profile_type_id
                .split(':')
                .nth(1)
                .unwrap_or("value")
                .to_owned();
            for s in resp.series {
                let labels: Vec<(String, String)> =
                    s.labels.into_iter().map(|p| (p.name, p.value)).collect();
                let points: Vec<(i64, f64)> =
                    s.points.iter().map(|p| (p.timestamp, p.value)).collect();
                frames.push(series_frame(
                    &dq.ref_id,
                    &value_name,
                    &labels,
                    &points,
                    &unit,
                )?);
            }
        }
        if kq.wants_profile() {
            let fg = if kq.span_selector.is_empty() {
                let r: q::SelectMergeStacktracesResponse = client
                    .call(
                        "SelectMergeStacktraces",
                        &q::SelectMergeStacktracesRequest {
                            profile_type_id: kq.profile_type_id.clone(),
                            label_selector: kq.label_selector.clone(),
                            start: from,
                            end: to,
                            max_nodes: kq.max_nodes,
                            ..Default::default()
                        },
                    )
                    .await?;
                r.flamegraph
            } else {
                let r: q::SelectMergeSpanProfileResponse = client
                    .call(
                        "SelectMergeSpanProfile",
                        &q::SelectMergeSpanProfileRequest {
                            profile_type_id: kq.profile_type_id.clone(),
                            label_selector: kq.label_selector.clone(),
                            span_selector: kq.span_selector.clone(),
                            start: from,
                            end: to,
                            max_nodes: kq.max_nodes,
                            ..Default::default()
                        },
                    )
                    .await?;
                r.flamegraph
            };
            let fg = fg.unwrap_or_default();
            frames.push(flamegraph_frame(&dq.ref_id, &fg, &unit)?);
        }
        Ok(frames)
    }
}

#[tonic::async_trait]
impl pb::data_server::Data for KilnPlugin {
    async fn query_data(
        &self,
        req: Request<pb::QueryDataRequest>,
    ) -> Result<Response<pb::QueryDataResponse>, Status> {
        let req = req.into_inner();
        let client = self.client(req.plugin_context.as_ref());
        let mut responses = HashMap::new();
        for dq in &req.queries {
            self.metrics.queries.fetch_add(1, Ordering::Relaxed);
            let result = match &client {
                Ok(c) => self.run_query(c, dq).await,
                Err(e) => Err(ClientError::Settings(e.to_string())),
            };
            let resp = match result {
                Ok(frames) => pb::DataResponse {
                    frames,
                    status: 200,
                    ..Default::default()
                },
                Err(e) => {
                    self.metrics.query_errors.fetch_add(1, Ordering::Relaxed);
                    pb::DataResponse {
                        error: e.to_string(),
                        status: i32::from(e.status()),
                        error_source: match e {
                            ClientError::Settings(_) => "plugin".into(),
                            _ => "downstream".into(),
                        },
                        ..Default::default()
                    }
                }
            };
            responses.insert(dq.ref_id.clone(), resp);
        }
        Ok(Response::new(pb::QueryDataResponse { responses }))
    }
}

#[tonic::async_trait]
impl pb::diagnostics_server::Diagnostics for KilnPlugin {
    async fn check_health(
        &self,
        req: Request<pb::CheckHealthRequest>,
    ) -> Result<Response<pb::CheckHealthResponse>, Status> {
        self.metrics.health_checks.fetch_add(1, Ordering::Relaxed);
        let req = req.into_inner();
        let result = async {
            let c = self.client(req.plugin_context.as_ref())?;
            let r: q::ProfileTypesResponse = c
                .call("ProfileTypes", &q::ProfileTypesRequest { start: 0, end: 0 })
                .await?;
            Ok::<_, ClientError>(r.profile_types.len())
        }
        .await;
        let (status, message) = match result {
            Ok(n) => (
                pb::check_health_response::HealthStatus::Ok,
                format!("Kiln is reachable and accepts the credentials: {n} profile types"),
            ),
            Err(e) => (
                pb::check_health_response::HealthStatus::Error,
                e.to_string(),
            ),
        };
        Ok(Response::new(pb::CheckHealthResponse {
            status: status as i32,
            message,
            json_details: Vec::new(),
        }))
    }

    async fn collect_metrics(
        &self,
        _req: Request<pb::CollectMetricsRequest>,
    ) -> Result<Response<pb::CollectMetricsResponse>, Status> {
        let m = &self.metrics;
        let text = format!(
            "# TYPE kiln_plugin_queries_total counter\nkiln_plugin_queries_total {}\n\
             # TYPE kiln_plugin_query_errors_total counter\nkiln_plugin_query_errors_total {}\n\
             # TYPE kiln_plugin_resource_calls_total counter\nkiln_plugin_resource_calls_total {}\n\
             # TYPE kiln_plugin_health_checks_total counter\nkiln_plugin_health_checks_total {}\n",
            m.queries.load(Ordering::Relaxed),
            m.query_errors.load(Ordering::Relaxed),
            m.resource_calls.load(Ordering::Relaxed),
            m.health_checks.load(Ordering::Relaxed),
        );
        Ok(Response::new(pb::CollectMetricsResponse {
            metrics: Some(pb::collect_metrics_response::Payload {
                prometheus: text.into_bytes(),
            }),
        }))
    }
}

/// Query parameters of a resource URL (`labelNames?matchers=...&start=...`).
fn url_params(url: &str) -> HashMap<String, String> {
    let query = url.split_once('?').map(|(_, q)| q).unwrap_or("");
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let dec = |s: &str| {
                percent_encoding::percent_decode_str(&s.replace('+', " "))
                    .decode_utf8_lossy()
                    .into_owned()
            };
            (dec(k), dec(v))
        })
        .collect()
}

async fn resource(
    client: &KilnClient,
    path: &str,
    url: &str,
) -> Result<serde_json::Value, ClientError> {
    let params = url_params(url);
    let int = |k: &str| {
        params
            .get(k)
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(0)
    };
    let matchers: Vec<String> = params
        .get("matchers")
        .or(params.get("query"))
        .filter(|m| !m.is_empty())
        .cloned()
        .into_iter()
        .collect();
    match path.trim_matches('/') {
        "profileTypes" => {
            let r: q::ProfileTypesResponse = client
                .call(
                    "ProfileTypes",
                    &q::ProfileTypesRequest {
                        start: int("start"),
                        end: int("end"),
                    },
                )
                .await?;
            Ok(serde_json::Value::Array(
                r.profile_types
                    .into_iter()
                    .map(|p| serde_json::json!({
                        "id": p.id, "name": p.name, "sampleType": p.sample_type, "sampleUnit": p.sample_unit,
                        "periodType": p.period_type, "periodUnit": p.period_unit,
                    }))
                    .collect(),
            ))
        }
        "labelNames" => {
            let r: t::LabelNamesResponse = client
                .call(
                    "LabelNames",
                    &t::LabelNamesRequest {
                        matchers,
                        start: int("start"),
                        end: int("end"),
                    },
                )
                .await?;
            Ok(serde_json::json!(r.names))
        }
        "labelValues" => {
            let name = params.get("label").cloned().unwrap_or_default();
            if name.is_empty() {
                return Err(ClientError::Settings(
                    "labelValues needs ?label=<name>".into(),
                ));
            }
            let r: t::LabelValuesResponse = client
                .call(
                    "LabelValues",
                    &t::LabelValuesRequest {
                        name,
                        matchers,
                        start: int("start"),
                        end: int("end"),
                    },
                )
                .await?;
            Ok(serde_json::json!(r.names))
        }
        other => Err(ClientError::Status {
            status: 404,
            message: format!("no resource {other:?}: use profileTypes, labelNames or labelValues"),
        }),
    }
}

type ResourceStream =
    Pin<Box<dyn futures::Stream<Item = Result<pb::CallResourceResponse, Status>> + Send>>;

#[tonic::async_trait]
impl pb::resource_server::Resource for KilnPlugin {
    type CallResourceStream = ResourceStream;

    async fn call_resource(
        &self,
        req: Request<pb::CallResourceRequest>,
    ) -> Result<Response<Self::CallResourceStream>, Status> {
        self.metrics.resource_calls.fetch_add(1, Ordering::Relaxed);
        let req = req.into_inner();
        let result = match self.client(req.plugin_context.as_ref()) {
            Ok(c) => resource(&c, &req.path, &req.url).await,
            Err(e) => Err(e),
        };
        let (code, body) = match result {
            Ok(v) => (200, v.to_string()),
            Err(e) => (
                i32::from(e.status()),
                serde_json::json!({ "message": e.to_string() }).to_string(),
            ),
        };
        let headers = HashMap::from([(
            "Content-Type".to_owned(),
            pb::StringList {
                values: vec!["application/json".into()],
            },
        )]);
        let resp = pb::CallResourceResponse {
            code,
            headers,
            body: body.into_bytes(),
        };
        Ok(Response::new(Box::pin(tokio_stream::once(Ok(resp)))))
    }
}

/// gRPC health, as go-plugin hosts check it (`""` and `"plugin"` are served).
#[derive(Debug, Clone, Default)]
pub struct HealthService;

#[tonic::async_trait]
impl health::health_server::Health for HealthService {
    async fn check(
        &self,
        req: Request<health::HealthCheckRequest>,
    ) -> Result<Response<health::HealthCheckResponse>, Status> {
        let service = req.into_inner().service;
        let status =
            if service.is_empty() || service == "plugin" || service.starts_with("pluginv2.") {
                health::health_check_response::ServingStatus::Serving
            } else {
                health::health_check_response::ServingStatus::ServiceUnknown
            };
        Ok(Response::new(health::HealthCheckResponse {
            status: status as i32,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_honour_interval_and_max_points() {
        assert_eq!(step_seconds(0, 3_600_000, 15_000, 1000), 15.0);
        assert_eq!(step_seconds(0, 3_600_000, 1_000, 100), 36.0);
        assert_eq!(step_seconds(0, 1000, 0, 0), 1.0);
    }

    #[test]
    fn resource_urls() {
        let p = url_params(
            "labelValues?label=service_name&matchers=%7Benv%3D%22prod%22%7D&start=1&end=2",
        );
        assert_eq!(p["label"], "service_name");
        assert_eq!(p["matchers"], r#"{env="prod"}"#);
        assert_eq!(p["end"], "2");
    }
}
