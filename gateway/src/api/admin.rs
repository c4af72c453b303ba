//! The admin API (scope `admin`): tenants, their usage, erasing a tenant, quarantined blocks.
//! (Retention and the stored-bytes refresh are background upkeep: `crate::server::upkeep`.)
//!
//! - `GET /api/v1/tenants`: every tenant with data, limits or traffic, with its usage.
//! - `GET /api/v1/tenants/{id}/usage`: one tenant's usage.
//! - `DELETE /api/v1/tenants/{id}`: erases the tenant's blocks.
//! - `GET /api/v1/tenants/{id}/blocks`: blocks by compaction level, rows, bytes, jobs.
//! - `GET /api/v1/quarantine`, `GET /api/v1/tenants/{id}/quarantine`: unreadable blocks.
//! - `GET /api/v1/members`: the processes of the cluster alive, as this one last saw them.

use std::collections::BTreeSet;

use axum::Json;
use axum::extract::{Path, State};
use serde_json::json;

use crate::app::AppRef;
use crate::auth::validate_tenant;
use crate::error::ApiError;
use crate::metrics::Usage;
use crate::transport::caller::Admin;

/// A tenant's usage for the cluster: the counters every process added to the metastore's
/// (`crate::server::upkeep::flush_usage`) and what this one counted since; one process's own
/// counters where the metastore keeps none (embedded: one process).
async fn usage_of(app: &AppRef, tenant: &str) -> Result<Usage, ApiError> {
    let stored = app.storage.stored_bytes(tenant).await?;
    app.metrics.set_stored_bytes(tenant, stored);
    let Some(cluster) = app.storage.metastore().usage(tenant).await? else {
        return Ok(app.metrics.usage(tenant, stored));
    };
    let mut usage = Usage {
        tenant: tenant.to_owned(),
        stored_bytes: stored,
        ..Default::default()
    };
    usage.add(&cluster);
    usage.add(&app.metrics.unflushed(tenant));
    Ok(usage)
}

async fn all_tenants(app: &AppRef) -> Result<Vec<String>, ApiError> {
    let mut all: BTreeSet<String> = app
        .storage
        .metastore()
        .tenants()
        .await?
        .into_iter()
        .collect();
    all.extend(app.metrics.tenants());
    all.extend(app.tenants.configured());
    Ok(all.into_iter().collect())
}

/// `GET /api/v1/tenants`.
pub async fn list(
    State(app): State<AppRef>,
    admin: Admin,
) -> Result<Json<serde_json::Value>, ApiError> {
    admin.administers(None)?;
    let mut tenants = Vec::new();
    for t in all_tenants(&app).await? {
        tenants.push(usage_of(&app, &t).await?);
    }
    Ok(Json(json!({ "tenants": tenants })))
}

/// `GET /api/v1/members`: the live processes of the cluster (operator only), this one marked.
pub async fn members(
    State(app): State<AppRef>,
    admin: Admin,
) -> Result<Json<serde_json::Value>, ApiError> {
    admin.administers(None)?;
    let me = &app.cluster.me().id;
    let members: Vec<_> = app
        .cluster
        .live()
        .into_iter()
        .map(|m| json!({ "id": m.id, "roles": m.roles, "self": &m.id == me }))
        .collect();
    Ok(Json(json!({ "members": members })))
}

/// `GET /api/v1/tenants/{id}/usage`.
pub async fn usage(
    State(app): State<AppRef>,
    admin: Admin,
    Path(id): Path<String>,
) -> Result<Json<Usage>, ApiError> {
    validate_tenant(&id)?;
    admin.administers(Some(&id))?;
    Ok(Json(usage_of(&app, &id).await?))
}

/// `DELETE /api/v1/tenants/{id}`.
pub async fn delete(
    State(app): State<AppRef>,
    admin: Admin,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    validate_tenant(&id)?;
    admin.administers(Some(&id))?;
    // Its recording rules stop first, so no seal writes their state back after the delete.
    app.recording.forget(&id);
    let deleted = app.storage.delete_tenant(&id).await?;
    app.tenants.forget(&id);
    // Its debug files went with its documents: names cached for it are forgotten.
    app.symbolizer.changed(&id);
    app.metrics.set_stored_bytes(&id, 0);
    tracing::info!(tenant = %id, blocks = deleted, "tenant erased");
    Ok(Json(json!({ "tenant": id, "deleted_blocks": deleted })))
}

/// `GET /api/v1/tenants/{id}/blocks`: the tenant's blocks by compaction level, with rows, bytes
/// and compaction jobs waiting or running (how far compaction is behind).
pub async fn blocks(
    State(app): State<AppRef>,
    admin: Admin,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    validate_tenant(&id)?;
    admin.administers(Some(&id))?;
    let metastore = app.storage.metastore();
    let blocks = metastore
        .query_blocks(kiln_storage::metastore::BlockQuery::all(&id))
        .await?;
    let mut levels: std::collections::BTreeMap<u32, u64> = Default::default();
    let mut by_level: std::collections::BTreeMap<u32, LevelBytes> = Default::default();
    for b in &blocks {
        *levels.entry(b.level).or_default() += 1;
        by_level.entry(b.level).or_default().add(&LevelBytes {
            blocks: 1,
            rows: b.rows,
            samples_bytes: b.samples.size,
            symbols_bytes: b.symbols.size,
            rollup_bytes: b.rollup_bytes(),
            object_bytes: b.object_size,
        });
    }
    let jobs = metastore
        .jobs()
        .await?
        .iter()
        .filter(|j| j.tenant == id)
        .count();
    Ok(Json(json!({
        "tenant": id,
        "blocks": blocks.len(),
        "levels": levels,
        "by_level": by_level,
        "top_level": kiln_storage::format::meta::TOP_LEVEL,
        "rows": blocks.iter().map(|b| b.rows).sum::<u64>(),
        "bytes": blocks.iter().map(|b| b.dataset_bytes()).sum::<u64>(),
        "jobs": jobs,
    })))
}

/// One compaction level's share of a tenant's data (`by_level`): where fresh data's bytes go.
/// `kiln bench` reads it back and sums it over its looks.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct LevelBytes {
    pub blocks: u64,
    pub rows: u64,
    pub samples_bytes: u64,
    pub symbols_bytes: u64,
    pub rollup_bytes: u64,
    /// The objects holding them, footers included (an L0 segment is counted once for each
    /// tenant it holds).
    pub object_bytes: u64,
}

impl LevelBytes {
    /// Adds `o`'s counts to these.
    pub fn add(&mut self, o: &Self) {
        self.blocks += o.blocks;
        self.rows += o.rows;
        self.samples_bytes += o.samples_bytes;
        self.symbols_bytes += o.symbols_bytes;
        self.rollup_bytes += o.rollup_bytes;
        self.object_bytes += o.object_bytes;
    }

    /// Bytes of `part` per row.
    pub fn per_row(&self, part: u64) -> f64 {
        part as f64 / self.rows.max(1) as f64
    }
}

/// `GET /api/v1/quarantine` (every tenant's, for the operator): blocks taken out of the index
/// because they could not be read.
pub async fn quarantine_all(
    State(app): State<AppRef>,
    admin: Admin,
) -> Result<Json<serde_json::Value>, ApiError> {
    quarantine(app, None, admin).await
}

/// `GET /api/v1/tenants/{id}/quarantine`.
pub async fn quarantine_of(
    State(app): State<AppRef>,
    admin: Admin,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    quarantine(app, Some(id), admin).await
}

async fn quarantine(
    app: AppRef,
    tenant: Option<String>,
    admin: Admin,
) -> Result<Json<serde_json::Value>, ApiError> {
    if let Some(t) = &tenant {
        validate_tenant(t)?;
    }
    admin.administers(tenant.as_deref())?;
    let blocks = app
        .storage
        .metastore()
        .quarantined(tenant.as_deref())
        .await?;
    Ok(Json(json!({ "blocks": blocks })))
}
