//! The server's background upkeep: JWT keys and tenant limits reloaded on change or SIGHUP, the
//! stored-bytes gauges refreshed from the metastore, and (with the compact role) retention and
//! the bound on debuginfod's stored files.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::app::{App, AppRef};
use crate::error::ApiError;

/// How often the `kiln_tenant_stored_bytes` gauges are refreshed from the metastore.
const STORED_BYTES_REFRESH: Duration = Duration::from_secs(30);

/// Background upkeep: reload keys and tenant limits on change or SIGHUP, refresh stored bytes,
/// run retention.
pub(crate) fn spawn_upkeep(app: Arc<App>, retention_every: Duration) {
    let reload = {
        let app = Arc::clone(&app);
        move |why: &str, force: bool| {
            if let Some(keys) = &app.auth.keys {
                let result = if force {
                    keys.reload().map(|_| true)
                } else {
                    keys.reload_if_changed()
                };
                match result {
                    Ok(true) => info!(why, keys = keys.keys().len(), "JWT keys reloaded"),
                    Ok(false) => {}
                    Err(e) => warn!(error = %e, "JWT keys not reloaded; the old keys stay"),
                }
            }
            let result = if force {
                app.tenants.reload().map(|_| true)
            } else {
                app.tenants.reload_if_changed()
            };
            match result {
                Ok(true) => info!(why, "tenant limits reloaded"),
                Ok(false) => {}
                Err(e) => warn!(error = %e, "tenant limits not reloaded; the old limits stay"),
            }
        }
    };
    let poll = reload.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            poll("changed on disk", false);
        }
    });
    #[cfg(unix)]
    tokio::spawn(async move {
        let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        else {
            return;
        };
        while hup.recv().await.is_some() {
            reload("SIGHUP", true);
        }
    });
    let metered = Arc::clone(&app);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(STORED_BYTES_REFRESH);
        loop {
            tick.tick().await;
            // One process of the cluster reads every tenant's blocks for the gauges; the
            // others export none (a sum or max over processes is the cluster's figure).
            let ttl = STORED_BYTES_REFRESH + kiln_storage::metastore::LEASE_TTL;
            let result = match metered.storage.holds_lease(GAUGES_LEASE, ttl).await {
                Ok(true) => refresh_stored_bytes(&metered).await,
                Ok(false) => {
                    metered.metrics.clear_stored_bytes();
                    metered.storage.clear_block_gauges();
                    Ok(())
                }
                Err(e) => Err(e.into()),
            };
            if let Err(e) = result {
                warn!(error = %e.log_text(), "stored bytes not refreshed; retrying at the next interval");
            }
        }
    });
    if app.storage.metastore().shared() {
        let counted = Arc::clone(&app);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(USAGE_FLUSH);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if let Err(e) = flush_usage(&counted).await {
                    warn!(error = %e.log_text(), "usage not added to the cluster's; retrying at the next interval");
                }
            }
        });
    }
    if !app.roles.compact {
        return;
    }
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(retention_every);
        loop {
            tick.tick().await;
            // One compacting process of the cluster applies retention at a time.
            let ttl = retention_every + kiln_storage::metastore::LEASE_TTL;
            let result = match app.storage.holds_lease(RETENTION_LEASE, ttl).await {
                Ok(true) => {
                    match app.symbolizer.evict_fetched().await {
                        Ok(e) if e.evicted_files > 0 => info!(
                            files = e.evicted_files,
                            bytes = e.evicted_bytes,
                            kept = e.bytes,
                            "debuginfod files removed past --debuginfod-stored-size"
                        ),
                        Ok(_) => {}
                        Err(e) => {
                            warn!(error = %e, "debuginfod files not bounded; retrying at the next interval")
                        }
                    }
                    apply_retention(&app).await.map(|_| ())
                }
                Ok(false) => Ok(()),
                Err(e) => Err(e.into()),
            };
            if let Err(e) = result {
                warn!(error = %e.log_text(), "retention failed; retrying at the next interval");
            }
        }
    });
}

/// The cluster-wide lease whose holder refreshes the stored-bytes and block gauges.
const GAUGES_LEASE: &str = "gauges";

/// The cluster-wide lease whose holder applies retention.
const RETENTION_LEASE: &str = "retention";

/// How often a process adds what it counted to the cluster's usage counters: the admin usage
/// API is this far behind the other processes' traffic at most.
const USAGE_FLUSH: Duration = Duration::from_secs(10);

/// Adds what this process counted for each tenant since the last flush to the metastore's usage
/// counters, which every process of the cluster adds to (state lives in PostgreSQL; each
/// process owns only its unflushed share). Runs every [`USAGE_FLUSH`] and once as the process
/// stops. What a process counted after its last flush is lost if it is killed.
pub async fn flush_usage(app: &AppRef) -> Result<(), ApiError> {
    let mut counts = Vec::new();
    let mut added = Vec::new();
    for tenant in app.metrics.tenants() {
        let delta = app.metrics.unflushed(&tenant);
        if delta.is_empty() {
            continue;
        }
        counts.extend(
            delta
                .iter()
                .map(|(counter, &value)| kiln_storage::metastore::UsageCount {
                    tenant: tenant.clone(),
                    counter: counter.clone(),
                    value,
                }),
        );
        added.push((tenant, delta));
    }
    app.storage.metastore().add_usage(&counts).await?;
    for (tenant, delta) in added {
        app.metrics.flushed(&tenant, &delta);
    }
    flush_throttled(app).await
}

/// Adds the minutes this process refused tenants' ingest for their rate to a shared
/// metastore's, where every query process reads the cluster's (an embedded metastore's one
/// process reads its own: nothing to add). What fails to be added is kept for the next flush.
async fn flush_throttled(app: &AppRef) -> Result<(), ApiError> {
    let counted = app.tenants.throttled().unflushed();
    let metastore = app.storage.metastore();
    if counted.is_empty() || !metastore.shared() {
        return Ok(());
    }
    let minutes: Vec<_> = counted
        .iter()
        .map(
            |(tenant, minute_ms, refused)| kiln_storage::metastore::ThrottledMinute {
                tenant: tenant.clone(),
                minute_ms: *minute_ms,
                refused: *refused,
            },
        )
        .collect();
    if let Err(e) = metastore.add_throttled(&minutes).await {
        app.tenants.throttled().restore(counted);
        return Err(e.into());
    }
    Ok(())
}

/// Sets every tenant's stored-bytes gauge from the metastore's partition summaries. Runs in
/// the background (`spawn_upkeep`), so a `/metrics` scrape costs the same whatever the
/// tenant count.
pub async fn refresh_stored_bytes(app: &AppRef) -> Result<(), ApiError> {
    for t in app.storage.metastore().tenants().await? {
        let bytes = app.storage.stored_bytes(&t).await?;
        app.metrics.set_stored_bytes(&t, bytes);
    }
    app.storage.refresh_block_gauges().await?;
    Ok(())
}

/// Drops, for every tenant, the partitions wholly older than its retention (data time).
/// Returns index entries removed.
pub async fn apply_retention(app: &AppRef) -> Result<usize, ApiError> {
    let now_nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0);
    let mut total = 0;
    for tenant in app.storage.metastore().tenants().await? {
        let retention = app.limits(&tenant).retention.0;
        if retention == 0 {
            continue;
        }
        let before = now_nanos.saturating_sub((retention as i64).saturating_mul(1_000_000_000));
        let n = app.storage.apply_retention(&tenant, before).await?;
        if n > 0 {
            tracing::info!(tenant = %tenant, blocks = n, "retention deleted old blocks");
            app.tenants.forget(&tenant);
        }
        total += n;
    }
    Ok(total)
}
