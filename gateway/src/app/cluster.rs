//! This process as a member of its cluster (ADR 0019): its instance id and roles, the members
//! alive as membership last answered, and whether it is leaving.
//!
//! Where the state lives: membership is the metastore's (a table of PostgreSQL; an embedded
//! metastore serves one process). This struct is this process's view of it, in memory. The
//! server's heartbeat task (`crate::server::cluster`) owns the updates; handlers only read.

use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};

use kiln_storage::metastore::Member;

use super::Roles;

/// This process's view of its cluster.
#[derive(Debug)]
pub struct Cluster {
    me: Member,
    live: RwLock<Vec<Member>>,
    leaving: AtomicBool,
    /// What of the metastore and the object store did not answer at the last check, and when
    /// it ran (`/ready` checks at most once a [`READY_CHECK_EVERY`]).
    checked: tokio::sync::Mutex<Option<(std::time::Instant, Vec<&'static str>)>>,
}

/// How long `/ready`'s check of the metastore and the object store stands.
pub const READY_CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// How long `/ready` waits for the metastore and the object store to answer.
const READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

impl Cluster {
    /// A process named `instance_id` running `roles`, alone until membership answers.
    pub fn new(instance_id: impl Into<String>, roles: Roles) -> Self {
        let me = Member {
            id: instance_id.into(),
            roles: roles.to_string(),
        };
        Self {
            live: RwLock::new(vec![me.clone()]),
            me,
            leaving: AtomicBool::new(false),
            checked: tokio::sync::Mutex::new(None),
        }
    }

    /// What of the metastore and the object store does not answer, checked at most once a
    /// [`READY_CHECK_EVERY`] however often `/ready` is asked (concurrent askers share one
    /// check).
    pub async fn unreachable(&self, storage: &kiln_storage::Storage) -> Vec<&'static str> {
        let mut checked = self.checked.lock().await;
        if let Some((at, down)) = checked.as_ref()
            && at.elapsed() < READY_CHECK_EVERY
        {
            return down.clone();
        }
        let down = storage.unreachable(READY_TIMEOUT).await;
        *checked = Some((std::time::Instant::now(), down.clone()));
        down
    }

    /// This process.
    pub fn me(&self) -> &Member {
        &self.me
    }

    /// The members alive, this process among them, as membership last answered.
    pub fn live(&self) -> Vec<Member> {
        self.live.read().expect("members lock").clone()
    }

    /// How many live members run ingest, and how many query.
    pub fn counts(&self) -> (usize, usize) {
        let (ingest, query, _) = self.counts_by_role();
        (ingest, query)
    }

    /// How many live members run ingest, query and compact.
    pub fn counts_by_role(&self) -> (usize, usize, usize) {
        let live = self.live.read().expect("members lock");
        let roles = || live.iter().filter_map(|m| Roles::parse(&m.roles).ok());
        (
            roles().filter(|r| r.ingest).count(),
            roles().filter(|r| r.query).count(),
            roles().filter(|r| r.compact).count(),
        )
    }

    /// Records the members membership answered.
    pub fn set_live(&self, members: Vec<Member>) {
        *self.live.write().expect("members lock") = members;
    }

    /// Whether this process is leaving (SIGTERM): `/ready` answers 503 while it drains.
    pub fn leaving(&self) -> bool {
        self.leaving.load(Ordering::Relaxed)
    }

    /// Marks this process as leaving.
    pub fn leave(&self) {
        self.leaving.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_members_by_role() {
        let c = Cluster::new("a:1", Roles::parse("ingest").unwrap());
        assert_eq!(c.counts(), (1, 0));
        let member = |id: &str, roles: &str| Member {
            id: id.into(),
            roles: roles.into(),
        };
        c.set_live(vec![
            member("a:1", "ingest"),
            member("b:1", "ingest,query"),
            member("c:1", "query"),
            member("d:1", "compact"),
        ]);
        assert_eq!(c.counts(), (2, 2));
        assert!(!c.leaving());
        c.leave();
        assert!(c.leaving());
    }
}
