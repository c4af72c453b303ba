//! `settings.v1.RecordingRulesService` (Connect and gRPC) as Pyroscope answers it — ids of ten
//! letters, optimistic `generation` (409 on a stale one), provisioned rules first and
//! read-only, a per-tenant cap — and the pull endpoint of the rules' counters,
//! `GET /api/v1/recording-rules/metrics`. The rules are evaluated by `crate::recording`.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use kiln_proto::settings::v1 as pb;
use kiln_proto::settings::v1::recording_rules_service_server::RecordingRulesService;
use kiln_proto::types::v1::LabelPair;
use tonic::{Request, Status};

use crate::app::AppRef;
use crate::auth::{Scope, TenantId};
use crate::error::{ApiError, ErrorKind};
use crate::recording::rules::{InvalidRule, Rule};
use crate::recording::{put_stored_rules, stored_rules};
use crate::transport::caller::Reads;
use crate::transport::grpc::{Grpc, answer};

/// The prefix every rule's metric name has (Pyroscope's; the Drilldown app adds it).
pub const METRIC_PREFIX: &str = "profiles_recorded_";

/// The header (Connect) or metadata (gRPC) of an upsert naming how far back a new rule is
/// evaluated from stored profiles (`6h`; at most `7d`), instead of `--recording-backfill`.
pub const BACKFILL_HEADER: &str = "kiln-backfill";

/// The header of an upsert, if any.
pub fn backfill_of(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers.get(BACKFILL_HEADER).and_then(|v| v.to_str().ok())
}

/// The letters of rule ids.
const ID_ALPHABET: &[u8; 52] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// The answer of a rule.
pub fn to_proto(r: &Rule) -> pb::RecordingRule {
    let profile_type = r
        .compile()
        .map(|c| c.profile_type)
        .unwrap_or_else(|_| "unknown".into());
    pb::RecordingRule {
        id: r.id.clone(),
        metric_name: r.metric_name.clone(),
        profile_type,
        matchers: r.matchers.clone(),
        group_by: r.group_by.clone(),
        external_labels: r
            .external_labels
            .iter()
            .map(|(name, value)| LabelPair {
                name: name.clone(),
                value: value.clone(),
            })
            .collect(),
        generation: r.generation,
        stacktrace_filter: r.function_name.as_ref().map(|f| pb::StacktraceFilter {
            function_name: Some(pb::StacktraceFilterFunctionName {
                function_name: f.clone(),
                metric_type: pb::MetricType::Total as i32,
            }),
        }),
        provisioned: r.provisioned,
    }
}

fn refused(e: InvalidRule) -> ApiError {
    ApiError::invalid(format!("invalid recording rule: {e}"))
}

/// Every rule of the tenant, provisioned ones first.
pub async fn list(
    app: &AppRef,
    tenant: &TenantId,
) -> Result<pb::ListRecordingRulesResponse, ApiError> {
    let rules = app
        .recording
        .rules(&app.storage, &app.tenants, tenant)
        .await?;
    Ok(pb::ListRecordingRulesResponse {
        rules: rules.iter().map(to_proto).collect(),
    })
}

/// One rule by id (404 when there is none).
pub async fn get(
    app: &AppRef,
    tenant: &TenantId,
    id: &str,
) -> Result<pb::GetRecordingRuleResponse, ApiError> {
    let id = id.trim();
    if id.is_empty() {
        return Err(ApiError::invalid("id is required"));
    }
    let rules = app
        .recording
        .rules(&app.storage, &app.tenants, tenant)
        .await?;
    match rules.iter().find(|r| r.id == id) {
        Some(r) => Ok(pb::GetRecordingRuleResponse {
            rule: Some(to_proto(r)),
        }),
        None => Err(not_found(id)),
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(ErrorKind::NotFound, format!("no rule with id={id:?} found"))
}

fn provisioned(id: &str) -> ApiError {
    ApiError::invalid(format!(
        "rule {id:?} is provisioned in the tenant file and cannot be changed through the API"
    ))
}

/// A new id: ten letters.
fn new_id() -> String {
    let bytes = uuid::Uuid::new_v4().into_bytes();
    bytes[..10]
        .iter()
        .map(|b| ID_ALPHABET[*b as usize % ID_ALPHABET.len()] as char)
        .collect()
}

/// The backfill a rule is made with: `kiln-backfill`'s, none for a caller without write scope,
/// else `--recording-backfill` (`None`).
fn backfill_secs(backfill: Option<&str>, may_write: bool) -> Result<Option<u64>, ApiError> {
    let asked = match backfill {
        None => None,
        Some(b) => match crate::time::parse_duration_secs(b) {
            Some(secs) if secs <= crate::recording::MAX_BACKFILL.as_secs() => Some(secs),
            _ => {
                return Err(ApiError::invalid(format!(
                    "{BACKFILL_HEADER} {b:?} is not a duration of at most 7d (like 6h)"
                )));
            }
        },
    };
    match asked {
        _ if may_write => Ok(asked),
        Some(secs) if secs > 0 => Err(ApiError::new(
            ErrorKind::PermissionDenied,
            format!(
                "a backfill ({BACKFILL_HEADER}) reads the tenant's stored profiles and needs a \
                 token with write scope; without one the rule counts from now"
            ),
        )),
        _ => Ok(Some(0)),
    }
}

/// Makes or replaces a rule. A new rule (no id, or an id the tenant has no rule of) starts at
/// generation 1 within the tenant's cap; a replacement names the generation it read. A backfill
/// reads up to 7 days of the tenant's profiles: only a caller who `may_write` gets one (a read
/// token's rule counts from now; asking for a backfill with one is a 403).
pub async fn upsert(
    app: &AppRef,
    tenant: &TenantId,
    req: pb::UpsertRecordingRuleRequest,
    backfill: Option<&str>,
    may_write: bool,
) -> Result<pb::UpsertRecordingRuleResponse, ApiError> {
    let backfill_secs = backfill_secs(backfill, may_write)?;
    let mut rule = Rule {
        id: req.id.clone(),
        metric_name: req.metric_name.trim().to_owned(),
        matchers: req.matchers,
        group_by: req.group_by,
        external_labels: req
            .external_labels
            .into_iter()
            .map(|l| (l.name, l.value))
            .collect(),
        function_name: req
            .stacktrace_filter
            .and_then(|f| f.function_name)
            .map(|f| f.function_name)
            .filter(|f| !f.is_empty()),
        generation: req.generation,
        provisioned: false,
        backfill_secs,
    };
    if !rule.id.is_empty() && !rule.id.bytes().all(|b| b.is_ascii_alphabetic()) {
        return Err(ApiError::invalid(format!(
            "id {:?} must match ^[a-zA-Z]+$",
            rule.id
        )));
    }
    if rule.generation < 0 {
        return Err(ApiError::invalid("generation must be positive"));
    }
    if !rule.metric_name.starts_with(METRIC_PREFIX) {
        return Err(ApiError::invalid(format!(
            "metric name {:?} must start with {METRIC_PREFIX}",
            rule.metric_name
        )));
    }
    rule.compile().map_err(refused)?;
    let limits = app.limits(tenant);
    if limits
        .recording_rules
        .iter()
        .any(|p| p.rule().id == rule.id)
    {
        return Err(provisioned(&rule.id));
    }
    let _one_change = super::lock_documents(app, tenant).await?;
    let mut stored = stored_rules(&app.storage, tenant).await?;
    match stored
        .iter_mut()
        .find(|r| !rule.id.is_empty() && r.id == rule.id)
    {
        Some(old) => {
            if old.generation != rule.generation {
                return Err(ApiError::new(
                    ErrorKind::AlreadyExists,
                    format!(
                        "conflicting update: rule {:?} is at generation {}, not {}; read it again",
                        rule.id, old.generation, rule.generation
                    ),
                ));
            }
            rule.generation = old.generation + 1;
            *old = rule.clone();
        }
        None => {
            if stored.len() >= limits.max_recording_rules {
                return Err(ApiError::invalid(format!(
                    "the tenant has {} recording rules, the most it may (max_recording_rules); \
                     delete one first",
                    stored.len()
                )));
            }
            if rule.id.is_empty() {
                rule.id = loop {
                    let id = new_id();
                    if !stored.iter().any(|r| r.id == id) {
                        break id;
                    }
                };
            }
            rule.generation = 1;
            stored.push(rule.clone());
        }
    }
    put_stored_rules(&app.storage, tenant, &stored).await?;
    app.metrics.settings_written(tenant);
    reload(app, tenant).await;
    Ok(pb::UpsertRecordingRuleResponse {
        rule: Some(to_proto(&rule)),
    })
}

/// Deletes a rule made through the API (404 when there is none; provisioned ones refused).
pub async fn delete(app: &AppRef, tenant: &TenantId, id: &str) -> Result<(), ApiError> {
    let id = id.trim();
    if id.is_empty() {
        return Err(ApiError::invalid("id is required"));
    }
    if app
        .limits(tenant)
        .recording_rules
        .iter()
        .any(|p| p.rule().id == id)
    {
        return Err(provisioned(id));
    }
    let _one_change = super::lock_documents(app, tenant).await?;
    let mut stored = stored_rules(&app.storage, tenant).await?;
    let before = stored.len();
    stored.retain(|r| r.id != id);
    if stored.len() == before {
        return Err(not_found(id));
    }
    put_stored_rules(&app.storage, tenant, &stored).await?;
    app.metrics.settings_written(tenant);
    reload(app, tenant).await;
    Ok(())
}

/// Evaluates the changed rules at once where this process writes (others reload them).
async fn reload(app: &AppRef, tenant: &TenantId) {
    if !app.roles.ingest {
        return;
    }
    if let Err(e) = app.recording.load(&app.storage, &app.tenants, tenant).await {
        tracing::warn!(%tenant, error = %e, "recording rules: the change is stored, its evaluation is retried");
    }
}

/// `GET /api/v1/recording-rules/metrics`: the tenant's rule counters in the Prometheus text
/// format, each at the end of the last sealed interval, for users without a remote-write
/// receiver (a Prometheus scrape with `honor_timestamps`).
pub async fn metrics_handler(State(app): State<AppRef>, Reads(tenant): Reads) -> Response {
    let result = app
        .recording
        .exposition(&app.storage, &app.tenants, &tenant)
        .await;
    match result {
        Ok(text) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => e.into_response(),
    }
}

#[tonic::async_trait]
impl RecordingRulesService for Grpc {
    async fn get_recording_rule(
        &self,
        req: Request<pb::GetRecordingRuleRequest>,
    ) -> Result<tonic::Response<pb::GetRecordingRuleResponse>, Status> {
        let tenant = self.tenant(&req, Scope::Read)?;
        let r = get(&self.app, &tenant, &req.into_inner().id).await;
        answer(r)
    }

    async fn list_recording_rules(
        &self,
        req: Request<pb::ListRecordingRulesRequest>,
    ) -> Result<tonic::Response<pb::ListRecordingRulesResponse>, Status> {
        let tenant = self.tenant(&req, Scope::Read)?;
        let r = list(&self.app, &tenant).await;
        answer(r)
    }

    async fn upsert_recording_rule(
        &self,
        req: Request<pb::UpsertRecordingRuleRequest>,
    ) -> Result<tonic::Response<pb::UpsertRecordingRuleResponse>, Status> {
        let tenant = self.tenant(&req, Scope::Read)?;
        let backfill = req
            .metadata()
            .get(BACKFILL_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let headers = req.metadata().clone().into_headers();
        let may_write = self.app.auth.authenticate(&headers, Scope::Write).is_ok();
        let r = upsert(
            &self.app,
            &tenant,
            req.into_inner(),
            backfill.as_deref(),
            may_write,
        )
        .await;
        answer(r)
    }

    async fn delete_recording_rule(
        &self,
        req: Request<pb::DeleteRecordingRuleRequest>,
    ) -> Result<tonic::Response<pb::DeleteRecordingRuleResponse>, Status> {
        let tenant = self.tenant(&req, Scope::Read)?;
        let r = delete(&self.app, &tenant, &req.into_inner().id)
            .await
            .map(|()| pb::DeleteRecordingRuleResponse {});
        answer(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_caller_with_write_scope_backfills() {
        assert_eq!(backfill_secs(None, true).unwrap(), None);
        assert_eq!(backfill_secs(Some("6h"), true).unwrap(), Some(6 * 3600));
        // A read token's rule counts from now; asking it for a past is refused, not shortened.
        assert_eq!(backfill_secs(None, false).unwrap(), Some(0));
        assert_eq!(backfill_secs(Some("0s"), false).unwrap(), Some(0));
        let e = backfill_secs(Some("7d"), false).unwrap_err();
        assert_eq!(e.kind, ErrorKind::PermissionDenied, "{}", e.message);
        assert!(e.message.contains("write scope"), "{}", e.message);
        assert!(backfill_secs(Some("8d"), true).is_err());
    }
}
