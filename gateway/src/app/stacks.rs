//! The stacks Parca agents sent, per tenant, so an agent's `Write` stream sends each stack once
//! (`crate::api::parca`).

use kiln_otel::parca::{self as format, Stack, StackId};

use crate::auth::TenantId;

/// The default bound of the known-stack cache (`--parca-stack-cache-bytes`).
pub const DEFAULT_STACK_CACHE_BYTES: u64 = 128 << 20;

/// The stacks each tenant's agents sent, by id, bounded by their bytes
/// ([`format::stack_weight`]); the least recently used go first (moka's TinyLFU admission).
#[derive(Debug, Clone)]
pub struct StackCache {
    cache: moka::sync::Cache<(TenantId, StackId), Stack>,
}

impl StackCache {
    /// A cache of at most `max_bytes` of stacks (0 keeps none: every id is asked for).
    pub fn new(max_bytes: u64) -> Self {
        Self {
            cache: moka::sync::Cache::builder()
                .max_capacity(max_bytes)
                .weigher(|_, stack: &Stack| {
                    u32::try_from(format::stack_weight(stack)).unwrap_or(u32::MAX)
                })
                .build(),
        }
    }

    pub fn get(&self, tenant: &TenantId, id: &StackId) -> Option<Stack> {
        self.cache.get(&(tenant.clone(), *id))
    }

    pub fn insert(&self, tenant: &TenantId, id: StackId, stack: Stack) {
        self.cache.insert((tenant.clone(), id), stack);
    }

    /// Forgets every stack (as a restart would).
    pub fn clear(&self) {
        self.cache.invalidate_all();
        self.cache.run_pending_tasks();
    }

    /// Bytes of stacks held now.
    pub fn weighted_size(&self) -> u64 {
        self.cache.run_pending_tasks();
        self.cache.weighted_size()
    }
}
