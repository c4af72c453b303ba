//! The write barrier: what a query of this process waits on so that it reads every write
//! acknowledged before it, including those a logged shard buffers and has not cut yet.
//!
//! State: one per process, set by the writer on the process's [`super::Caches`] when it
//! acknowledges writes from its log. A barrier never reaches another process's writer.

use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::sync::oneshot;

use super::unregistered::Unregistered;

/// One shard as the barrier sees it.
pub(crate) trait ShardCut: Send + Sync {
    /// Asks the shard to cut what it buffers into a segment queries can read. The receiver
    /// answers once the cut is made; `None` when the shard buffers nothing or is gone.
    fn cut(&self) -> BoxFuture<'_, Option<oneshot::Receiver<()>>>;
}

/// What a query engine holds of the writer in its process: its shards and the segments built
/// and not yet registered.
#[derive(Clone)]
pub(crate) struct WriteBarrier {
    shards: Vec<Arc<dyn ShardCut>>,
    unregistered: Arc<Unregistered>,
}

impl std::fmt::Debug for WriteBarrier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteBarrier")
            .field("shards", &self.shards.len())
            .finish_non_exhaustive()
    }
}

impl WriteBarrier {
    pub(crate) fn new(shards: Vec<Arc<dyn ShardCut>>, unregistered: Arc<Unregistered>) -> Self {
        Self {
            shards,
            unregistered,
        }
    }

    /// Has every shard that buffers writes cut them into a segment, and waits for the cuts
    /// (not their registration): every write acknowledged before this call is then in a
    /// registered block or in [`Self::unregistered`].
    pub(crate) async fn wait(&self) {
        let mut waits = Vec::new();
        for shard in &self.shards {
            if let Some(wait) = shard.cut().await {
                waits.push(wait);
            }
        }
        for w in waits {
            let _ = w.await;
        }
    }

    /// The segments built and not yet registered.
    pub(crate) fn unregistered(&self) -> &Unregistered {
        &self.unregistered
    }
}
