//! The services Grafana's Profiles Drilldown app calls besides the querier and its upload tab
//! (`crate::api::adhoc`), over Connect (proto or JSON): `settings.v1.SettingsService` (its
//! plugin settings, kept per tenant), `capabilities.v1.FeatureFlagsService` (what this server
//! can do), `settings.v1.RecordingRulesService` (metrics from profiles: [`recording`]), and
//! the service Kiln does not offer, answered Connect `unimplemented` with a message so the app
//! hides the feature (`vcs.v1.VCSService`). One table ([`SERVICES`]) names every method; the
//! API table (`crate::api`) routes and names them from it.

pub mod recording;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;
use kiln_proto::capabilities::v1 as caps;
use kiln_proto::settings::v1 as settings;

use crate::app::AppRef;
use crate::auth::TenantId;
use crate::error::{ApiError, ErrorKind};
use crate::transport::caller::ReadsAcross;
use crate::transport::connect::{Call, Codec, Service, connect_error, connect_ok, prepare};

/// The services of this module.
pub const SERVICES: [Service; 4] = [
    Service {
        name: "settings.v1.SettingsService",
        methods: &[
            "settings.v1.SettingsService/Get",
            "settings.v1.SettingsService/Set",
            "settings.v1.SettingsService/Delete",
        ],
        absent: None,
    },
    Service {
        name: "capabilities.v1.FeatureFlagsService",
        methods: &["capabilities.v1.FeatureFlagsService/GetFeatureFlags"],
        absent: None,
    },
    Service {
        name: "vcs.v1.VCSService",
        methods: &["vcs.v1.VCSService"],
        absent: Some("Kiln has no source-code integration (vcs.v1); function details show no code"),
    },
    Service {
        name: "settings.v1.RecordingRulesService",
        methods: &[
            "settings.v1.RecordingRulesService/GetRecordingRule",
            "settings.v1.RecordingRulesService/ListRecordingRules",
            "settings.v1.RecordingRulesService/UpsertRecordingRule",
            "settings.v1.RecordingRulesService/DeleteRecordingRule",
        ],
        absent: None,
    },
];

/// The name of the tenant document holding the settings.
const SETTINGS_DOCUMENT: &str = "settings.json";

/// `POST /{service}/{method}` for the services above.
pub async fn handler(
    State(app): State<AppRef>,
    ReadsAcross(tenants): ReadsAcross,
    Path(method): Path<String>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let service = crate::transport::connect::service_of(&uri);
    let result = async {
        let Some(s) = SERVICES.iter().find(|s| s.name == service) else {
            return Err(ApiError::new(
                ErrorKind::NotFound,
                format!("no service {service:?}"),
            ));
        };
        if let Some(why) = s.absent {
            return Err(ApiError::new(ErrorKind::Unimplemented, why));
        }
        let Call {
            codec,
            tenant,
            body,
            share: _share,
        } = prepare(&app, &headers, body, tenants.first().clone()).await?;
        let out = match (service.as_str(), method.as_str()) {
            // A read spanning tenants (Grafana's app over `a|b`) gets the defaults and no
            // rules: one tenant's settings do not apply to the others. The rest acts for one.
            ("settings.v1.SettingsService", "Get") if tenants.spans_tenants() => {
                let _: settings::GetSettingsRequest = codec.decode(&body)?;
                codec.encode(&settings::GetSettingsResponse::default())?
            }
            ("settings.v1.RecordingRulesService", "ListRecordingRules")
                if tenants.spans_tenants() =>
            {
                let _: settings::ListRecordingRulesRequest = codec.decode(&body)?;
                codec.encode(&settings::ListRecordingRulesResponse::default())?
            }
            ("capabilities.v1.FeatureFlagsService", "GetFeatureFlags") => {
                let _: caps::GetFeatureFlagsRequest = codec.decode(&body)?;
                codec.encode(&feature_flags())?
            }
            _ if tenants.spans_tenants() => {
                return Err(ApiError::invalid(format!(
                    "{service}/{method} acts for one tenant; X-Scope-OrgID names {tenants}"
                )));
            }
            ("settings.v1.SettingsService", "Get") => {
                let _: settings::GetSettingsRequest = codec.decode(&body)?;
                codec.encode(&get_settings(&app, &tenant).await?)?
            }
            ("settings.v1.SettingsService", "Set") => {
                let req: settings::SetSettingsRequest = codec.decode(&body)?;
                codec.encode(&set_setting(&app, &tenant, req).await?)?
            }
            ("settings.v1.SettingsService", "Delete") => {
                let req: settings::DeleteSettingsRequest = codec.decode(&body)?;
                delete_setting(&app, &tenant, &req.name).await?;
                codec.encode(&settings::DeleteSettingsResponse {})?
            }
            ("settings.v1.RecordingRulesService", "GetRecordingRule") => {
                let req: settings::GetRecordingRuleRequest = codec.decode(&body)?;
                codec.encode(&recording::get(&app, &tenant, &req.id).await?)?
            }
            ("settings.v1.RecordingRulesService", "ListRecordingRules") => {
                let _: settings::ListRecordingRulesRequest = codec.decode(&body)?;
                codec.encode(&recording::list(&app, &tenant).await?)?
            }
            ("settings.v1.RecordingRulesService", "UpsertRecordingRule") => {
                let req: settings::UpsertRecordingRuleRequest = codec.decode(&body)?;
                let backfill = recording::backfill_of(&headers);
                let may_write = app
                    .auth
                    .authenticate(&headers, crate::auth::Scope::Write)
                    .is_ok();
                codec.encode(&recording::upsert(&app, &tenant, req, backfill, may_write).await?)?
            }
            ("settings.v1.RecordingRulesService", "DeleteRecordingRule") => {
                let req: settings::DeleteRecordingRuleRequest = codec.decode(&body)?;
                recording::delete(&app, &tenant, &req.id).await?;
                codec.encode(&settings::DeleteRecordingRuleResponse {})?
            }
            _ => {
                return Err(ApiError::new(
                    ErrorKind::Unimplemented,
                    format!("{service} has no method {method:?} in Kiln"),
                ));
            }
        };
        Ok::<(Codec, Bytes), ApiError>((codec, out))
    }
    .await;
    match result {
        Ok((codec, body)) => connect_ok(codec, body),
        Err(e) => connect_error(&e),
    }
}

/// What this server can do, as Pyroscope names it (`pkg/featureflags`), sorted by name as
/// Pyroscope sorts them. Kiln's own: `functionProjections`, exact function tables, call trees
/// and sandwiches computed by the server from the whole profile (`crate::api::querier`'s
/// projections), so the app stops computing them from a truncated flame graph.
fn feature_flags() -> caps::GetFeatureFlagsResponse {
    let flag = |name: &str, enabled: bool, description: &str| caps::FeatureFlag {
        name: name.into(),
        enabled,
        description: Some(description.into()),
        documentation_url: None,
    };
    caps::GetFeatureFlagsResponse {
        feature_flags: vec![
            flag(
                "functionProjections",
                true,
                "PROFILE_FORMAT_FUNCTIONS, FUNCTION_TREE and SANDWICH in SelectMergeStacktraces; \
                 FUNCTIONS and FUNCTION_TREE in Diff",
            ),
            // settings.v1.RecordingRulesService, evaluated as profiles are stored.
            flag(
                "pyroscopeRuler",
                true,
                "Supports the Pyroscope ruler, which exports Prometheus metrics from profiling data.",
            ),
            // A rule's `function_name`: the total of the stacks through that function.
            flag(
                "pyroscopeRulerFunctions",
                true,
                "Enables function support for the Pyroscope ruler, which allows to export \
                 resource usage on a per function level.",
            ),
            // Label names beyond Prometheus' legacy set (OTLP's `process.pid`), written,
            // listed and matched (quoted or not) as they are.
            flag(
                "utf8LabelNames",
                true,
                "Supports UTF-8 label names for Pyroscope read/write APIs: letters and digits \
                 of any script, '_', '.', '-' and '/'.",
            ),
            // Kiln's storage is its own, not Pyroscope's v2 layer.
            flag("v2StorageLayer", false, "v2 storage layer"),
        ],
    }
}

/// The tenant's settings, by name.
async fn get_settings(
    app: &AppRef,
    tenant: &TenantId,
) -> Result<settings::GetSettingsResponse, ApiError> {
    let Some(doc) = app
        .storage
        .tenant_document(tenant, SETTINGS_DOCUMENT)
        .await?
    else {
        return Ok(settings::GetSettingsResponse::default());
    };
    serde_json::from_slice(&doc)
        .map_err(|e| ApiError::internal(format!("the settings of {tenant} are unreadable: {e}")))
}

async fn put_settings(
    app: &AppRef,
    tenant: &TenantId,
    mut all: settings::GetSettingsResponse,
) -> Result<(), ApiError> {
    all.settings.sort_by(|a, b| a.name.cmp(&b.name));
    let doc = serde_json::to_vec(&all).map_err(ApiError::internal)?;
    Ok(app
        .storage
        .put_tenant_document(tenant, SETTINGS_DOCUMENT, Bytes::from(doc))
        .await?)
}

/// Largest value of one setting: the app stores its plugin settings as one small JSON string.
const MAX_SETTING_BYTES: usize = 64 << 10;

/// Stores one setting (replacing the one of its name), stamped with the time of the change.
async fn set_setting(
    app: &AppRef,
    tenant: &TenantId,
    req: settings::SetSettingsRequest,
) -> Result<settings::SetSettingsResponse, ApiError> {
    let Some(mut setting) = req.setting else {
        return Err(ApiError::invalid("SetSettingsRequest needs a setting"));
    };
    if setting.name.is_empty() {
        return Err(ApiError::invalid("a setting needs a name"));
    }
    if setting.name.len() + setting.value.len() > MAX_SETTING_BYTES {
        return Err(ApiError::too_large(format!(
            "setting {:?} is larger than {MAX_SETTING_BYTES} bytes",
            setting.name
        )));
    }
    setting.modified_at = crate::time::now_nanos() / 1_000_000;
    let _one_change = lock_documents(app, tenant).await?;
    let mut all = get_settings(app, tenant).await?;
    all.settings.retain(|s| s.name != setting.name);
    if all.settings.len() >= MAX_SETTINGS {
        return Err(ApiError::too_large(format!(
            "the tenant keeps {MAX_SETTINGS} settings, the most it may; delete one first"
        )));
    }
    let bytes: usize = all
        .settings
        .iter()
        .map(|s| s.name.len() + s.value.len())
        .sum();
    if bytes + setting.name.len() + setting.value.len() > MAX_SETTINGS_BYTES {
        return Err(ApiError::too_large(format!(
            "the tenant's settings would pass {MAX_SETTINGS_BYTES} bytes; delete some first"
        )));
    }
    all.settings.push(setting.clone());
    put_settings(app, tenant, all).await?;
    app.metrics.settings_written(tenant);
    Ok(settings::SetSettingsResponse {
        setting: Some(setting),
    })
}

async fn delete_setting(app: &AppRef, tenant: &TenantId, name: &str) -> Result<(), ApiError> {
    let _one_change = lock_documents(app, tenant).await?;
    let mut all = get_settings(app, tenant).await?;
    let before = all.settings.len();
    all.settings.retain(|s| s.name != name);
    if all.settings.len() != before {
        put_settings(app, tenant, all).await?;
        app.metrics.settings_written(tenant);
    }
    Ok(())
}

/// Most settings a tenant keeps (the app writes a handful).
const MAX_SETTINGS: usize = 64;
/// Most bytes of names and values a tenant's settings hold in all.
const MAX_SETTINGS_BYTES: usize = 1 << 20;

/// How long a change of a tenant's documents may hold their cluster-wide lock: a change reads
/// and writes two small objects, far less; a process that died holding it stops blocking others
/// after this.
const DOCUMENTS_LEASE: std::time::Duration = std::time::Duration::from_secs(30);

/// How long a change waits for another one of the same tenant's documents to end.
const DOCUMENTS_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A tenant's documents (settings, recording rules) held for one change: the change reads,
/// changes and writes a document in the bucket, and no other change of the tenant's documents
/// runs meanwhile, in this process (a mutex) or any other (a lease in the metastore, released
/// when this is dropped). Other tenants' changes run apart.
pub(super) struct DocumentsLock {
    _local: tokio::sync::OwnedMutexGuard<()>,
    lease: Option<(
        std::sync::Arc<dyn kiln_storage::metastore::Metastore>,
        String,
        String,
    )>,
}

impl Drop for DocumentsLock {
    fn drop(&mut self) {
        if let Some((metastore, name, holder)) = self.lease.take() {
            tokio::spawn(async move {
                if let Err(e) = metastore.release_lease(&name, &holder).await {
                    tracing::warn!(lease = %name, error = %e, "tenant documents' lease not released; it expires");
                }
            });
        }
    }
}

/// Takes `tenant`'s documents for one change ([`DocumentsLock`]); 503 when another change
/// holds them for longer than [`DOCUMENTS_WAIT`].
pub(super) async fn lock_documents(
    app: &AppRef,
    tenant: &TenantId,
) -> Result<DocumentsLock, ApiError> {
    let local = local_lock(tenant).lock_owned().await;
    let metastore = std::sync::Arc::clone(app.storage.metastore());
    if !metastore.shared() {
        return Ok(DocumentsLock {
            _local: local,
            lease: None,
        });
    }
    let name = format!("documents/{tenant}");
    let holder = format!("{}/{}", app.cluster.me().id, ulid::Ulid::generate());
    let started = std::time::Instant::now();
    let mut wait = std::time::Duration::from_millis(5);
    while metastore
        .hold_lease(&name, &holder, DOCUMENTS_LEASE)
        .await?
        .is_none()
    {
        if started.elapsed() >= DOCUMENTS_WAIT {
            return Err(ApiError::new(
                ErrorKind::Unavailable,
                "another change of the tenant's settings or rules is still running; retry",
            ));
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(std::time::Duration::from_millis(100));
    }
    Ok(DocumentsLock {
        _local: local,
        lease: Some((metastore, name, holder)),
    })
}

/// This process's lock of `tenant`'s documents: its changes queue here, not on the metastore.
fn local_lock(tenant: &TenantId) -> std::sync::Arc<tokio::sync::Mutex<()>> {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, Weak};
    static LOCKS: Mutex<Option<HashMap<String, Weak<tokio::sync::Mutex<()>>>>> = Mutex::new(None);
    let mut locks = LOCKS.lock().expect("settings locks");
    let locks = locks.get_or_insert_with(HashMap::new);
    if let Some(lock) = locks.get(tenant.as_str()).and_then(Weak::upgrade) {
        return lock;
    }
    // A lock lives while a change holds it: the ones no change holds are dropped here.
    locks.retain(|_, l| l.strong_count() > 0);
    let lock = Arc::new(tokio::sync::Mutex::new(()));
    locks.insert(tenant.as_str().to_owned(), Arc::downgrade(&lock));
    lock
}
