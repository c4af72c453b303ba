//! The write barrier: what a query of this process waits on so that it reads every write
//! acknowledged before it, including those a logged shard buffers and has not cut yet.
//!
//! A barrier is scoped: each shard keeps the time range of what it buffers per tenant
//! ([`Buffered`]), and a query cuts only the shards holding writes of its tenant and range. So
//! one tenant's dashboards never cut another tenant's writes into segments.
//!
//! State: one per process, set by the writer on the process's [`super::Caches`] when it
//! acknowledges writes from its log. A barrier never reaches another process's writer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use tokio::sync::oneshot;

use super::unregistered::Unregistered;

/// What a query reads: a tenant and a time range (Unix nanoseconds, end exclusive).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scope<'a> {
    pub(crate) tenant: &'a str,
    pub(crate) start_nanos: i64,
    pub(crate) end_nanos: i64,
}

/// What one shard buffers that queries cannot read yet: per tenant, the range of its sample
/// times (inclusive). Owned by the shard's task, which adds each write it buffers before
/// acknowledging it and clears all once its segment is readable; read by queries.
#[derive(Debug, Default)]
pub(crate) struct Buffered {
    ranges: Mutex<HashMap<String, (i64, i64)>>,
}

impl Buffered {
    /// Notes a buffered write of `tenant` with samples from `lo` to `hi`.
    pub(crate) fn add(&self, tenant: &str, (lo, hi): (i64, i64)) {
        let mut ranges = self.ranges.lock().expect("buffered ranges");
        match ranges.get_mut(tenant) {
            Some(r) => *r = (r.0.min(lo), r.1.max(hi)),
            None => {
                ranges.insert(tenant.to_owned(), (lo, hi));
            }
        }
    }

    /// Everything buffered is readable now.
    pub(crate) fn clear(&self) {
        self.ranges.lock().expect("buffered ranges").clear();
    }

    /// Whether a write `scope` reads is buffered.
    pub(crate) fn holds(&self, scope: Scope<'_>) -> bool {
        let ranges = self.ranges.lock().expect("buffered ranges");
        ranges
            .get(scope.tenant)
            .is_some_and(|&(lo, hi)| lo < scope.end_nanos && hi >= scope.start_nanos)
    }

    /// Whether anything is buffered.
    pub(crate) fn any(&self) -> bool {
        !self.ranges.lock().expect("buffered ranges").is_empty()
    }
}

/// One shard as the barrier sees it.
pub(crate) trait ShardCut: Send + Sync {
    /// Asks the shard to cut what it buffers into a segment queries can read, if it buffers a
    /// write `scope` reads (`None`: every write). The receiver answers once the cut is made;
    /// `None` when the shard buffers no such write or is gone.
    fn cut(&self, scope: Option<Scope<'_>>) -> BoxFuture<'_, Option<oneshot::Receiver<()>>>;
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

    /// Has every shard that buffers writes `scope` reads cut them into a segment, and waits
    /// for the cuts (not their registration): every such write acknowledged before this call
    /// is then in a registered block or in [`Self::unregistered`].
    pub(crate) async fn wait(&self, scope: Scope<'_>) {
        let mut waits = Vec::new();
        for shard in &self.shards {
            if let Some(wait) = shard.cut(Some(scope)).await {
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
