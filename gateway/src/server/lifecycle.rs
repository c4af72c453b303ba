//! The server's life: open storage and build the app, start the background upkeep, the admin
//! listener and the self-profiler, serve until SIGTERM, then stop in order.

use std::sync::Arc;
use std::time::Duration;

use kiln_storage::Storage;
use tracing::{info, warn};

use super::config::ServeArgs;
use crate::app::App;
use crate::budget::DecodeBudget;
use crate::tenants::Tenants;

/// Stack of every runtime thread, async workers and the blocking pool alike: request bodies are
/// decoded there, so the depth limits on what they decode ([`kiln_proto::wire::MAX_DEPTH`], the
/// normalize limits) are sized against a stack this process chose, not the platform's default.
/// The `decode_stack` test decodes the deepest input each format admits on a thread of this size.
pub const THREAD_STACK_BYTES: usize = 8 << 20;

/// The process's runtime: worker and blocking threads with [`THREAD_STACK_BYTES`] of stack.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(THREAD_STACK_BYTES)
        .build()
}

/// Opens storage and builds the shared app.
pub async fn build_app(args: &ServeArgs) -> anyhow::Result<Arc<App>> {
    args.validate()?;
    let auth = args.auth.authenticator()?;
    let tenants = Tenants::load(args.limits.tenants.as_deref(), args.limits.overrides())?;
    let storage = Storage::open(args.storage_config()).await?;
    let mut app = App::new(storage, auth, tenants);
    app.roles = args.roles()?;
    app.decode_budget = DecodeBudget::new(args.limits.max_inflight_decode_bytes);
    app.stacks = crate::app::StackCache::new(args.limits.parca_stack_cache_bytes);
    Ok(Arc::new(app))
}

/// How often the `kiln_tenant_stored_bytes` gauges are refreshed from the metastore.
const STORED_BYTES_REFRESH: Duration = Duration::from_secs(30);

/// Background upkeep: reload keys and tenant limits on change or SIGHUP, refresh stored bytes,
/// run retention.
fn spawn_upkeep(app: Arc<App>, retention_every: Duration) {
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
            if let Err(e) = crate::admin::refresh_stored_bytes(&metered).await {
                warn!(error = %e.log_text(), "stored bytes not refreshed; retrying at the next interval");
            }
        }
    });
    if !app.roles.compact {
        return;
    }
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(retention_every);
        loop {
            tick.tick().await;
            if let Err(e) = crate::admin::apply_retention(&app).await {
                warn!(error = %e.log_text(), "retention failed; retrying at the next interval");
            }
        }
    });
}

/// Runs `kiln serve` until SIGTERM.
pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let app = build_app(&args).await?;
    let listener = tokio::net::TcpListener::bind(args.network.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.network.listen))?;
    info!(roles = %app.roles, "kiln starting");
    if let Some(addr) = args.network.admin_listen {
        let admin = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {addr} (--admin-listen): {e}"))?;
        info!(%addr, "admin listener (/metrics, /ready) is listening");
        let router = crate::api::admin_router(Arc::clone(&app));
        tokio::spawn(async move {
            if let Err(e) = axum::serve(admin, router).await {
                tracing::error!(error = %e, "the admin listener stopped");
            }
        });
    }
    spawn_upkeep(
        Arc::clone(&app),
        Duration::from_secs(args.compaction.retention_interval_secs.max(1)),
    );
    if app.roles.compact {
        app.storage.spawn_upkeep(
            Duration::from_millis(args.compaction.upkeep_interval_ms.max(10)),
            Duration::from_secs(args.compaction.orphan_sweep_interval_secs.max(1)),
        );
    }
    // Profiles are written through this process's own writer, which runs with the ingest role.
    if args.telemetry.self_profile && app.roles.ingest {
        crate::self_profile::spawn(
            Arc::clone(&app),
            crate::self_profile::SelfProfile {
                tenant: app
                    .auth
                    .configured_tenant(&args.telemetry.self_profile_tenant)
                    .map_err(|e| anyhow::anyhow!("--self-profile-tenant: {}", e.message))?,
                interval: Duration::from_secs(args.telemetry.self_profile_interval_secs.max(1)),
                heap: args.telemetry.self_profile_heap,
                labels: vec![("instance".into(), args.network.listen.to_string())],
            },
        );
    }
    let limits = super::listener::ConnectionLimits {
        header_read_timeout: Duration::from_secs(args.network.header_read_timeout_secs.max(1)),
        body_read_timeout: Duration::from_secs(args.network.body_read_timeout_secs.max(1)),
        idle_timeout: Duration::from_secs(args.network.idle_timeout_secs.max(1)),
        max_connections: args.network.max_connections.max(1),
    };
    super::listener::serve(app, listener, limits, super::listener::shutdown_signal()).await?;
    Ok(())
}
