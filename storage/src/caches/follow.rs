//! Fresh blocks read ahead where other processes write them (ADR 0019). A query process
//! follows the tenants it answered lately: every [`FOLLOW_INTERVAL`] it lists each one's
//! blocks of the last [`FOLLOW_WINDOW_NANOS`] before the newest time they asked for, and reads
//! each new block small enough to keep ([`Caches::holds_fresh`]) whole into the fresh objects.
//! A dashboard's next query then reads the last minutes from memory.
//!
//! State: one [`Followed`] per process, in its [`Caches`]; nothing is shared between
//! processes. Cost: one metastore listing per followed tenant and interval, and one GET per
//! new block, each read once.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::Caches;
use crate::format::meta::EntryKey;
use crate::metastore::BlockQuery;

/// How often followed tenants' blocks are listed.
pub(crate) const FOLLOW_INTERVAL: Duration = Duration::from_millis(100);
/// How long a tenant is followed after a query reached its blocks.
const FOLLOW_FOR: Duration = Duration::from_secs(300);
/// Most tenants followed at once: the most recently queried.
const FOLLOWED_TENANTS: usize = 32;
/// The data time followed: this far before the newest end a tenant's queries asked for.
const FOLLOW_WINDOW_NANOS: i64 = 3_600 * 1_000_000_000;

/// The tenants a process's queries reached lately.
#[derive(Debug, Default)]
pub(crate) struct Followed {
    /// By tenant: when a query last reached its blocks, and the newest end asked for.
    tenants: Mutex<HashMap<String, (Instant, i64)>>,
}

impl Followed {
    /// Notes a query of `tenant` up to `end_nanos`.
    pub(crate) fn touch(&self, tenant: &str, end_nanos: i64) {
        let now = Instant::now();
        let mut tenants = self.tenants.lock().expect("followed tenants lock");
        if let Some((at, end)) = tenants.get_mut(tenant) {
            *at = now;
            *end = (*end).max(end_nanos);
            return;
        }
        if tenants.len() >= FOLLOWED_TENANTS {
            let oldest = tenants
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(t, _)| t.clone());
            if let Some(t) = oldest {
                tenants.remove(&t);
            }
        }
        tenants.insert(tenant.to_owned(), (now, end_nanos));
    }

    /// The tenants followed now, each with the start of the data time followed.
    fn windows(&self) -> Vec<(String, i64)> {
        let mut tenants = self.tenants.lock().expect("followed tenants lock");
        tenants.retain(|_, (at, _)| at.elapsed() < FOLLOW_FOR);
        tenants
            .iter()
            .map(|(t, (_, end))| (t.clone(), end.saturating_sub(FOLLOW_WINDOW_NANOS)))
            .collect()
    }
}

impl Caches {
    /// Follows the tenants queried lately until the process ends, reading their new blocks
    /// ahead ([`self`](self) module). Only registered blocks are listed: the writer's barrier
    /// is never cut, and what this process wrote is in memory already.
    pub(crate) async fn follow(&self) {
        // Blocks read ahead, or found held or too large: each is looked at once.
        let mut seen: HashSet<EntryKey> = HashSet::new();
        let mut tick = tokio::time::interval(FOLLOW_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let mut listed = HashSet::new();
            for (tenant, since) in self.followed.windows() {
                let query = BlockQuery::new(&tenant, since, i64::MAX);
                let blocks = match self.metastore.query_blocks(query).await {
                    Ok(blocks) => blocks,
                    Err(e) => {
                        tracing::debug!(%tenant, error = %e, "fresh blocks not listed");
                        continue;
                    }
                };
                listed.extend(blocks.iter().map(|b| b.key()));
                let mut new: Vec<_> = blocks
                    .into_iter()
                    .filter(|b| seen.insert(b.key()))
                    .collect();
                // Newest first, at most half the fresh objects a round: a tenant whose last
                // hour does not fit leaves its older blocks to its queries.
                new.sort_by_key(|b| std::cmp::Reverse(b.max_time_nanos));
                let budget = self.fresh.policy().max_capacity().unwrap_or(0) / 2;
                let mut taken = 0u64;
                new.retain(|b| {
                    taken = taken.saturating_add(b.dataset_bytes());
                    taken <= budget
                });
                self.read_whole(&new, true).await;
            }
            seen.retain(|k| listed.contains(k));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_recently_queried_tenants_are_followed_from_their_newest_end() {
        let f = Followed::default();
        f.touch("a", 10 * FOLLOW_WINDOW_NANOS);
        f.touch("a", 5 * FOLLOW_WINDOW_NANOS);
        assert_eq!(f.windows(), [("a".to_owned(), 9 * FOLLOW_WINDOW_NANOS)]);
        for n in 0..FOLLOWED_TENANTS {
            f.touch(&format!("t{n}"), 0);
        }
        let windows = f.windows();
        assert_eq!(windows.len(), FOLLOWED_TENANTS);
        assert!(
            !windows.iter().any(|(t, _)| t == "a"),
            "the least recently queried tenant is no longer followed"
        );
    }
}
