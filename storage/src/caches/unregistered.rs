//! Blocks the writer of this process has built but not yet registered in the metastore
//! (ADR 0018, "Reading what is not yet registered"): a query reads them from memory with the
//! metastore's blocks, so it need not wait for a segment's object to be synced and its
//! metastore transaction committed to see the writes acknowledged from the log.
//!
//! A segment enters when it is built ([`Unregistered::insert`]) and leaves once its metastore
//! transaction has committed ([`Unregistered::remove`]). A query lists the metastore's blocks
//! and then these under the read side of a gate that a removal takes for writing: a block it
//! misses in one of the two lists is in the other.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::Result;
use crate::caches::cache::FreshObject;
use crate::format::meta::{BlockMeta, EntryKey};
use crate::metastore::{BlockQuery, Metastore};

/// The blocks built and not yet registered, with their segment's object.
#[derive(Default)]
pub(crate) struct Unregistered {
    /// Held for reading while a query lists blocks, for writing while blocks leave.
    gate: tokio::sync::RwLock<()>,
    blocks: std::sync::RwLock<HashMap<EntryKey, (Arc<BlockMeta>, FreshObject)>>,
}

impl std::fmt::Debug for Unregistered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unregistered").finish_non_exhaustive()
    }
}

impl Unregistered {
    /// Makes a segment's blocks readable, before they are registered.
    pub(crate) fn insert(&self, metas: &[BlockMeta], object: &bytes::Bytes) {
        let mut blocks = self.blocks.write().expect("unregistered blocks lock");
        for meta in metas {
            blocks.insert(
                meta.key(),
                (Arc::new(meta.clone()), FreshObject::whole(object.clone())),
            );
        }
    }

    /// Takes a segment's blocks out once the metastore holds them (waits for the queries
    /// listing blocks at the moment).
    pub(crate) async fn remove(&self, metas: &[BlockMeta]) {
        let _gate = self.gate.write().await;
        let mut blocks = self.blocks.write().expect("unregistered blocks lock");
        for meta in metas {
            blocks.remove(&meta.key());
        }
    }

    /// Takes out every block of write shard `shard` (a shard that panicked: its restart
    /// replays their writes from its log).
    pub(crate) async fn remove_shard(&self, shard: u32) {
        let _gate = self.gate.write().await;
        let mut blocks = self.blocks.write().expect("unregistered blocks lock");
        blocks.retain(|_, (b, _)| b.shard != shard);
    }

    /// The metastore's blocks matching `query`, and the unregistered ones it does not hold.
    pub(crate) async fn query_blocks(
        &self,
        metastore: &dyn Metastore,
        query: BlockQuery<'_>,
    ) -> Result<Vec<Arc<BlockMeta>>> {
        let _gate = self.listing().await;
        let mut out = metastore.query_blocks(query).await?;
        let blocks = self.blocks.read().expect("unregistered blocks lock");
        let extra: Vec<Arc<BlockMeta>> = blocks
            .values()
            .filter(|(b, _)| query.matches(b))
            .map(|(b, _)| Arc::clone(b))
            .collect();
        drop(blocks);
        if !extra.is_empty() {
            // A block can leave only after the gate is released, but one whose transaction
            // committed before the metastore's read and is still to leave is in both.
            let listed: HashSet<(&str, &str)> = out
                .iter()
                .map(|b| (b.tenant.as_str(), b.id.as_str()))
                .collect();
            let extra: Vec<Arc<BlockMeta>> = extra
                .into_iter()
                .filter(|b| !listed.contains(&(b.tenant.as_str(), b.id.as_str())))
                .collect();
            out.extend(extra);
        }
        Ok(out)
    }

    /// Held while a query reads the metastore and then these blocks: none leaves meanwhile.
    pub(crate) async fn listing(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.gate.read().await
    }

    /// The oldest and newest sample time of `tenant`'s unregistered blocks.
    pub(crate) fn time_range(&self, tenant: &str) -> Option<(i64, i64)> {
        let blocks = self.blocks.read().expect("unregistered blocks lock");
        blocks
            .values()
            .filter(|(b, _)| b.tenant == tenant)
            .map(|(b, _)| (b.min_time_nanos, b.max_time_nanos))
            .reduce(|(lo, hi), (l, h)| (lo.min(l), hi.max(h)))
    }

    /// The object of an unregistered block.
    pub(crate) fn object(&self, key: &EntryKey) -> Option<FreshObject> {
        let blocks = self.blocks.read().expect("unregistered blocks lock");
        blocks.get(key).map(|(_, o)| o.clone())
    }
}
