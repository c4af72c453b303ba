//! Recording rules in a cluster's `compact` processes (ADR 0021): the compactor evaluates
//! level-0 jobs through [`Recorder`], and [`spawn`] seals and sends while this process holds
//! the `recording` lease. The state lives in PostgreSQL (`crate::recording::cluster`).

use std::sync::{Arc, Weak};
use std::time::Duration;

use kiln_storage::compaction::JobRecorder;
use kiln_storage::format::meta::BlockMeta;
use kiln_storage::metastore::RecordedSum;

use crate::app::App;

/// Evaluates the recording rules on a level-0 job's outputs, for a cluster's compactor. Holds
/// the process weakly: the compactor belongs to the process's storage.
#[derive(Debug)]
pub struct Recorder {
    pub app: Weak<App>,
}

#[async_trait::async_trait]
impl JobRecorder for Recorder {
    async fn sums(
        &self,
        tenant: &str,
        outputs: &[Arc<BlockMeta>],
    ) -> kiln_storage::Result<Vec<RecordedSum>> {
        // Stopping: the job fails and runs again, never completes without its sums.
        let app = self.app.upgrade().ok_or_else(|| {
            kiln_storage::Error::MetastoreUnavailable("recording rules: stopping".into())
        })?;
        app.recording
            .job_sums(&app.storage, &app.tenants, tenant, outputs)
            .await
    }
}

/// Sets the compactor's [`Recorder`] and seals every second. `lag`: how long after their
/// time sums are committed ([`crate::recording::Recording::cluster_round`]).
pub fn spawn(app: &Arc<App>, lag: Duration) {
    app.storage.compactor().record_with(Arc::new(Recorder {
        app: Arc::downgrade(app),
    }));
    let app = Arc::clone(app);
    tokio::spawn(async move {
        let client = match reqwest::Client::builder()
            .user_agent(concat!("kiln/", env!("CARGO_PKG_VERSION")))
            .build()
        {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "recording rules: no HTTP client; nothing is sent");
                return;
            }
        };
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            app.recording
                .cluster_round(&app.storage, &app.tenants, &client, lag)
                .await;
        }
    });
}
