//! What fresh data costs at rest: while the workload is sent, the tenant's blocks below the top
//! level (L0 segments, L1 and L2 blocks: where the last minutes to hours live, and where a live
//! dashboard reads) are looked at every second through `/api/v1/tenants/{id}/blocks`, and their
//! bytes per row summed over the looks, so each level's figure is its average over the run.
//!
//! The bench's compaction policy is accelerated (seconds, not minutes and hours), so how the
//! rows split between levels is the bench's; each level's bytes per row is not: it follows how
//! many profiles a block of that level holds.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::api::admin::LevelBytes;

/// How often the blocks are looked at.
const INTERVAL: Duration = Duration::from_secs(1);

/// Fresh data's bytes at rest, by level.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FreshBytes {
    /// How many times the blocks were looked at.
    pub looks: u64,
    pub levels: BTreeMap<u32, LevelBytes>,
}

impl FreshBytes {
    /// Every level below the top together.
    pub fn all(&self) -> LevelBytes {
        let mut sum = LevelBytes::default();
        for l in self.levels.values() {
            sum.add(l);
        }
        sum
    }

    /// Lines for the bench's report.
    pub fn report(&self) -> String {
        let mut out = format!(
            "\nFresh data (below the top level, averaged over {} looks during ingest and one at its end):\n\n\
             | level | rows (mean) | bytes per row | samples | symbols | rollups |\n\
             |---|---|---|---|---|---|\n",
            self.looks
        );
        let looks = self.looks.max(1);
        let mut line = |name: String, l: &LevelBytes| {
            out.push_str(&format!(
                "| {name} | {} | {:.2} B | {:.2} B | {:.2} B | {:.2} B |\n",
                l.rows / looks,
                l.per_row(l.object_bytes),
                l.per_row(l.samples_bytes),
                l.per_row(l.symbols_bytes),
                l.per_row(l.rollup_bytes),
            ));
        };
        for (level, l) in &self.levels {
            line(format!("L{level}"), l);
        }
        line("all below the top".into(), &self.all());
        out
    }
}

/// The tenant's blocks as the admin API states them (the part read here).
#[derive(Deserialize)]
struct Blocks {
    top_level: u32,
    by_level: BTreeMap<u32, LevelBytes>,
}

/// Looks at `server`'s blocks of the bench's tenant every second until the returned handle is
/// stopped; then holds what it saw.
pub struct Watch {
    http: reqwest::Client,
    url: String,
    seen: Arc<Mutex<FreshBytes>>,
    task: tokio::task::JoinHandle<()>,
}

impl Watch {
    pub fn start(http: reqwest::Client, server: &str) -> Self {
        let url = format!("{server}/api/v1/tenants/anonymous/blocks");
        let seen = Arc::new(Mutex::new(FreshBytes::default()));
        let (into, task_http, task_url) = (Arc::clone(&seen), http.clone(), url.clone());
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(INTERVAL);
            loop {
                tick.tick().await;
                // A look that fails (the server busy past its timeout) is skipped, not counted.
                let _ = look(&task_http, &task_url, &into).await;
            }
        });
        Self {
            http,
            url,
            seen,
            task,
        }
    }

    /// Stops looking, after one last look (so a run shorter than a second is seen too; one
    /// that fails is skipped as the others are).
    pub async fn stop(self) -> FreshBytes {
        self.task.abort();
        let _ = look(&self.http, &self.url, &self.seen).await;
        self.seen.lock().expect("not poisoned").clone()
    }
}

async fn look(http: &reqwest::Client, url: &str, seen: &Mutex<FreshBytes>) -> anyhow::Result<()> {
    let b: Blocks = http
        .get(url)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let mut seen = seen.lock().expect("not poisoned");
    seen.looks += 1;
    for (level, l) in b.by_level.range(..b.top_level) {
        seen.levels.entry(*level).or_default().add(l);
    }
    Ok(())
}
