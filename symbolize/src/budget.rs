//! The heap that opening debug files takes, reserved before it is taken.
//!
//! A debug file's compressed sections are inflated when it is opened (an upload's check, a
//! debuginfod fetch's check, a query's first lookup). What they declare is reserved from a
//! budget the server shares with ingest (`--max-inflight-decode-bytes`), held while the file
//! opens, and given back after. Files kept open count in the open-file cache's weight instead.

use std::sync::{Arc, RwLock};

/// A reservation: the bytes stay reserved until it drops.
pub type Reservation = Box<dyn Send + Sync>;

/// Memory a server lends to work that inflates (its decode budget).
#[async_trait::async_trait]
pub trait InflateBudget: Send + Sync + std::fmt::Debug {
    /// Reserves `bytes`, waiting a while for them; an error says the server is busy.
    async fn reserve(&self, bytes: u64) -> Result<Reservation, String>;
}

/// The budget a symbolizer and its debuginfod client reserve from: none until the server sets
/// one (tests, tools), then the server's.
#[derive(Debug, Clone, Default)]
pub struct BudgetSlot(Arc<RwLock<Option<Arc<dyn InflateBudget>>>>);

impl BudgetSlot {
    /// Sets the budget reservations come from.
    pub fn set(&self, budget: Arc<dyn InflateBudget>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Some(budget);
    }

    /// Reserves `bytes` of the budget (nothing to reserve: no budget, or no bytes).
    pub async fn reserve(&self, bytes: u64) -> Result<Option<Reservation>, String> {
        let budget = self.0.read().unwrap_or_else(|e| e.into_inner()).clone();
        match budget {
            Some(b) if bytes > 0 => b.reserve(bytes).await.map(Some),
            _ => Ok(None),
        }
    }
}
