//! The server's life: open storage and build the app, start the background upkeep
//! ([`super::upkeep`]), the admin listener and the self-profiler, serve until SIGTERM, then stop
//! in order.

use std::sync::Arc;
use std::time::Duration;

use kiln_storage::Storage;
use tracing::info;

use super::config::ServeArgs;
use crate::app::App;
use crate::app::budget::DecodeBudget;
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
    let symbolizer = args.symbolize.config(storage.data_dir());
    let queue_dir = crate::recording::queue_dir(storage.data_dir());
    let queue = crate::recording::remote_write::RemoteWriteQueue::open(
        &queue_dir,
        args.recording.remote_write_queue_bytes,
    )
    .map_err(|e| anyhow::anyhow!("the remote-write queue in {}: {e}", queue_dir.display()))?;
    let recording =
        crate::recording::Recording::new(args.recording.config(), Some(Arc::new(queue)));
    let mut app = App::with_symbolizer(
        storage,
        auth,
        tenants,
        symbolizer,
        args.symbolize.deadline(),
        recording,
    )
    .map_err(|e| anyhow::anyhow!("the symbolizer's cache directory: {e}"))?;
    app.roles = args.roles()?;
    app.cluster = crate::app::cluster::Cluster::new(args.instance_id(), app.roles);
    app.set_members(vec![app.cluster.me().clone()]);
    app.set_decode_budget(DecodeBudget::new(args.limits.max_inflight_decode_bytes));
    app.debuginfo_uploads = crate::app::uploads::Uploads::new(
        args.limits.debuginfo_upload_concurrency,
        args.limits.debuginfo_upload_rate_bytes,
        args.limits.debuginfo_scratch_bytes,
        app.storage.metastore(),
    );
    app.stacks = crate::app::StackCache::new(args.limits.parca_stack_cache_bytes);
    app.cors_origins = crate::api::cors_origins(&args.network.cors_allowed_origins)?;
    Ok(Arc::new(app))
}

/// Locks the data directory for this process (`<data-dir>/LOCK`, an advisory file lock the
/// system drops when the process ends, however it ends): a second `kiln serve` on the same
/// directory would share its write-ahead log, spool and scratch, so it refuses to start.
pub fn lock_data_dir(dir: &std::path::Path) -> anyhow::Result<std::fs::File> {
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow::anyhow!("the data directory {}: {e}", dir.display()))?;
    let path = dir.join("LOCK");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(anyhow::anyhow!(
            "another kiln process uses the data directory {} (it holds {}); give each \
             process its own --data-dir",
            dir.display(),
            path.display()
        )),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(anyhow::anyhow!("locking {}: {e}", path.display()))
        }
    }
}

/// Runs `kiln serve` until SIGTERM.
pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // Held until the process ends.
    let _lock = lock_data_dir(&args.storage.data_dir)?;
    let app = build_app(&args).await?;
    super::memory::spawn_purger(args.storage.allocator_dirty_bytes);
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
    super::upkeep::spawn_upkeep(
        Arc::clone(&app),
        Duration::from_secs(args.compaction.retention_interval_secs.max(1)),
    );
    // Recording rules are evaluated where profiles are written; in a cluster, by the
    // compactors, and sealed by one of them (ADR 0021).
    if app.storage.metastore().shared() {
        if app.roles.compact {
            // Sums come when a level-0 job completes: sealing waits that long besides.
            let first_level = args
                .compaction
                .levels()
                .ok()
                .and_then(|l| l.first().map(|p| p.age));
            let lag = first_level.unwrap_or(Duration::from_secs(30))
                + Duration::from_millis(args.compaction.upkeep_interval_ms)
                + crate::recording::cluster::MERGE_ALLOWANCE;
            super::recording::spawn(&app, lag);
        }
    } else if app.roles.ingest {
        spawn_recording(Arc::clone(&app));
    }
    // A query process reads ahead the blocks ingest processes write for its dashboards.
    if app.roles.query {
        app.storage.spawn_fresh_follower();
    }
    if app.roles.compact {
        app.storage.spawn_upkeep(
            Duration::from_millis(args.compaction.upkeep_interval_ms.max(10)),
            Duration::from_secs(args.compaction.orphan_sweep_interval_secs.max(1)),
        );
    }
    // Profiles are written through this process's own writer, which runs with the ingest role.
    if args.telemetry.self_profile && app.roles.ingest {
        crate::server::self_profile::spawn(
            Arc::clone(&app),
            crate::server::self_profile::SelfProfile {
                tenant: app
                    .auth
                    .configured_tenant(&args.telemetry.self_profile_tenant)
                    .map_err(|e| anyhow::anyhow!("--self-profile-tenant: {}", e.message))?,
                interval: Duration::from_secs(args.telemetry.self_profile_interval_secs.max(1)),
                heap: args.telemetry.self_profile_heap,
                labels: vec![("instance".into(), app.cluster.me().id.clone())],
            },
        );
    }
    let limits = super::listener::ConnectionLimits {
        header_read_timeout: Duration::from_secs(args.network.header_read_timeout_secs.max(1)),
        body_read_timeout: Duration::from_secs(args.network.body_read_timeout_secs.max(1)),
        idle_timeout: Duration::from_secs(args.network.idle_timeout_secs.max(1)),
        max_connections: args.network.max_connections.max(1),
    };
    let tls = match (&args.network.tls_cert, &args.network.tls_key) {
        (Some(cert), Some(key)) => {
            let files = super::tls::TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: args.network.tls_client_ca.clone(),
                client_optional: args.network.tls_client_auth
                    == super::config::ClientAuth::Optional,
            };
            let tls = super::tls::Tls::load(files).map_err(|e| anyhow::anyhow!("{e}"))?;
            super::tls::spawn_reload(Arc::clone(&tls));
            Some(tls)
        }
        _ => None,
    };
    let membership = super::cluster::spawn_heartbeat(Arc::clone(&app));
    let shutdown = {
        let app = Arc::clone(&app);
        let delay = Duration::from_millis(args.network.shutdown_delay);
        async move {
            super::listener::shutdown_signal().await;
            super::cluster::leave(&app, membership, delay).await;
        }
    };
    super::listener::serve(Arc::clone(&app), listener, limits, tls, shutdown).await?;
    // What the last requests counted joins the cluster's usage.
    if let Err(e) = super::upkeep::flush_usage(&app).await {
        tracing::warn!(error = %e.log_text(), "usage of the last interval not added to the cluster's");
    }
    Ok(())
}

/// How often an ingest process reads the tenants' rules again (changed by a query process, or
/// in the tenant file).
const RECORDING_RELOAD: Duration = Duration::from_secs(15);

/// Recording rules in the background: the remote-write queue's sender; the rules of every
/// tenant with data loaded (their open intervals read back from storage), then due intervals
/// sealed every second and rules reloaded every [`RECORDING_RELOAD`].
fn spawn_recording(app: Arc<App>) {
    if let Some(queue) = app.recording.queue() {
        let client = reqwest::Client::builder()
            .user_agent(concat!("kiln/", env!("CARGO_PKG_VERSION")))
            .build();
        match client {
            Ok(client) => {
                tokio::spawn(Arc::clone(queue).run(client, std::future::pending()));
            }
            Err(e) => {
                tracing::error!(error = %e, "recording rules: no HTTP client; nothing is sent")
            }
        }
    }
    tokio::spawn(async move {
        // What the spool holds is queryable once drained: drained first, so the open
        // intervals are rebuilt with it (ADR 0015).
        app.storage.drain_spool().await;
        app.recording.load_all(&app.storage, &app.tenants).await;
        // Reloads (which may rebuild and backfill) apart from sealing, so a slow one never
        // delays another tenant's points.
        let reloader = Arc::clone(&app);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(RECORDING_RELOAD);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                reloader
                    .recording
                    .reload_all(&reloader.storage, &reloader.tenants)
                    .await;
            }
        });
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            app.recording.seal_due(&app.storage, &app.tenants).await;
        }
    });
}
