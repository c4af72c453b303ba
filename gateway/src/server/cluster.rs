//! Membership in the background (ADR 0019): a heartbeat each second records this process alive
//! in the metastore and reads who else is; the counts set each limit's share
//! (`crate::tenants::Peers`). On SIGTERM the process leaves: `/ready` answers 503 and the
//! others stop counting it, then it serves on for `--shutdown-delay` before the port closes.

use std::time::Duration;

use kiln_storage::metastore::MEMBER_TIMEOUT;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::app::AppRef;

/// How often a process says it is alive.
pub const HEARTBEAT: Duration = Duration::from_secs(1);

/// How often an ingest process refreshes, in the shared count, the series it keeps seeing: a
/// series may so count up to this long past the active window.
pub const SERIES_REFRESH: Duration = Duration::from_secs(300);

/// Starts the heartbeat: the first now, then one each [`HEARTBEAT`].
pub fn spawn_heartbeat(app: AppRef) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(HEARTBEAT);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        let mut refreshed = tokio::time::Instant::now();
        loop {
            ticks.tick().await;
            if refreshed.elapsed() >= SERIES_REFRESH {
                refreshed = tokio::time::Instant::now();
                refresh_series(&app).await;
            }
            match beat(&app).await {
                Ok(()) if failing => {
                    info!("membership: the heartbeat is answered again");
                    failing = false;
                }
                Ok(()) => {}
                // The shares of the last answer stay: a database outage changes no limit.
                Err(e) if !failing => {
                    warn!(error = %e, "membership: the heartbeat failed; the last counts stay");
                    failing = true;
                }
                Err(_) => {}
            }
        }
    })
}

/// One heartbeat: this process alive, the live members read, the shares set.
async fn beat(app: &AppRef) -> kiln_storage::Result<()> {
    let members = app
        .storage
        .metastore()
        .heartbeat(app.cluster.me(), MEMBER_TIMEOUT)
        .await?;
    app.set_members(members);
    Ok(())
}

/// Tells the shared count of the series this process saw since the last refresh.
async fn refresh_series(app: &AppRef) {
    let metastore = app.storage.metastore();
    if !metastore.shared() {
        return;
    }
    for (tenant, hashes) in app.tenants.touched() {
        if let Err(e) = metastore.touch_series(&tenant, &hashes).await {
            warn!(%tenant, error = %e, "active series: the refresh failed; retried next time");
            app.tenants.saw_series(&tenant, &hashes);
        }
    }
}

/// Leaves the cluster (SIGTERM): `/ready` turns 503, the heartbeat stops and the row says so,
/// then the process serves on for `delay` while load balancers take it out.
pub async fn leave(app: &AppRef, heartbeat: JoinHandle<()>, delay: Duration) {
    app.cluster.leave();
    heartbeat.abort();
    if let Err(e) = app.storage.metastore().leave(&app.cluster.me().id).await {
        warn!(error = %e, "membership: leaving was not recorded; the others time this process out");
    }
    if !delay.is_zero() {
        info!(
            ?delay,
            "leaving: /ready answers 503 while requests are still served"
        );
        tokio::time::sleep(delay).await;
    }
}
