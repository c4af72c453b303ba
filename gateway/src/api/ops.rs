//! What every process answers its operators, whatever its roles: `/ready` and `/metrics` (on the
//! API port, and on the admin listener without credentials).

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::app::AppRef;

/// `/ready`: the process is up and can serve. 503 once it is leaving (SIGTERM), while it still
/// serves for `--shutdown-delay`, so a load balancer stops sending before the port closes.
/// 503 too when the metastore or the object store does not answer and the process has no
/// role that goes on without them: queries and compaction need both, while ingest
/// acknowledges from its log and spool, so a process with the ingest role stays ready (its
/// answer names what is down).
pub(crate) async fn ready(State(app): State<AppRef>) -> impl IntoResponse {
    if app.cluster.leaving() {
        return (StatusCode::SERVICE_UNAVAILABLE, "leaving\n".to_owned());
    }
    let down = app.cluster.unreachable(&app.storage).await;
    if down.is_empty() {
        return (StatusCode::OK, "ready\n".to_owned());
    }
    let down = down.join(", ");
    if app.roles.ingest {
        return (
            StatusCode::OK,
            format!("ready; unreachable: {down} (writes wait in the log and spool)\n"),
        );
    }
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!("unreachable: {down}\n"),
    )
}

/// `/metrics` on the API port. Its label values name every tenant, so it answers the operator
/// only: with `--auth jwt` an admin token of the operator tenant (`--admin-tenant`); with
/// `--auth trusted-header` the proxy's `X-Scope-OrgID` naming that tenant (no other tenant the
/// proxy forwards may read it; without `--admin-tenant`, nobody on this port). Prometheus scrapes
/// it so, or scrapes the admin listener (`--admin-listen`) instead. `--auth none` (loopback)
/// serves it to all.
pub(crate) async fn guarded_metrics(
    State(app): State<AppRef>,
    credentials: crate::transport::caller::Credentials,
) -> Response {
    use crate::auth::{AuthMode, Scope};
    let allowed = match app.auth.mode {
        AuthMode::None => Ok(()),
        AuthMode::Jwt => credentials
            .principal(Scope::Admin)
            .and_then(|p| app.auth.administers(&p, None)),
        AuthMode::TrustedHeader => credentials.tenant(Scope::Read).and_then(|tenant| {
            if app.auth.admin_tenant.as_deref() == Some(tenant.as_str()) {
                Ok(())
            } else {
                Err(crate::error::ApiError::new(
                    crate::error::ErrorKind::PermissionDenied,
                    "/metrics names every tenant: with --auth trusted-header it answers only \
                     X-Scope-OrgID of the operator tenant (--admin-tenant); or scrape the \
                     admin listener (--admin-listen)",
                ))
            }
        }),
    };
    if let Err(e) = allowed {
        return e.into_response();
    }
    metrics(State(app)).await.into_response()
}

/// `/metrics`: Kiln's own metrics, with the storage counters and memory figures read now.
pub(crate) async fn metrics(State(app): State<AppRef>) -> impl IntoResponse {
    let counters = app.storage.query().counters();
    let get = |c: &std::sync::atomic::AtomicU64| {
        i64::try_from(c.load(std::sync::atomic::Ordering::Relaxed)).unwrap_or(i64::MAX)
    };
    app.metrics
        .storage_quarantined_blocks
        .set(get(&counters.quarantined));
    app.metrics
        .storage_query_read_bytes
        .set(get(&counters.bytes_read));
    app.metrics
        .storage_query_rollup_reads
        .set(get(&counters.rollup_reads));
    for (cache, lookups, misses) in [
        (
            "symbols",
            &counters.symbols_lookups,
            &counters.symbols_misses,
        ),
        (
            "parquet_metadata",
            &counters.parquet_lookups,
            &counters.parquet_misses,
        ),
        (
            "partial_results",
            &counters.results_lookups,
            &counters.results_misses,
        ),
    ] {
        let labels = crate::metrics::CacheLabels {
            cache: cache.into(),
        };
        app.metrics
            .storage_cache_lookups
            .get_or_create(&labels)
            .set(get(lookups));
        app.metrics
            .storage_cache_misses
            .get_or_create(&labels)
            .set(get(misses));
    }
    if tikv_jemalloc_ctl::epoch::advance().is_ok() {
        let read = |r: tikv_jemalloc_ctl::Result<usize>| r.map_or(0, |b| b as i64);
        app.metrics
            .memory_allocated
            .set(read(tikv_jemalloc_ctl::stats::allocated::read()));
        app.metrics
            .memory_resident
            .set(read(tikv_jemalloc_ctl::stats::resident::read()));
    }
    app.metrics
        .ingest_decode_budget_used
        .set(app.decode_budget.in_use() as i64);
    app.metrics
        .parca_stack_cache_bytes
        .set(app.stacks.weighted_size() as i64);
    // Stored bytes per tenant come from the background refresh
    // (`server::upkeep::refresh_stored_bytes`): a scrape reads gauges, never the metastore.
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        app.metrics.encode(),
    )
}
