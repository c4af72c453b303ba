//! The roles of a `kiln` process (`--roles`): which APIs it serves and which background work it
//! runs.

/// The roles of a `kiln` process (`--roles`). Any number of processes of each role can share
/// one metastore and one object store; the single binary runs all three.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Roles {
    /// Accepts profiles (`/ingest`, `push.v1`, OTLP).
    pub ingest: bool,
    /// Answers queries (`querier.v1`).
    pub query: bool,
    /// Compacts, applies retention, deletes tombstoned objects and sweeps orphans.
    pub compact: bool,
}

/// A `--roles` value Kiln cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RolesError {
    #[error("unknown role {0:?}: use ingest, query, compact or all")]
    Unknown(String),
    #[error("give at least one role: ingest, query, compact")]
    None,
}

impl Roles {
    /// Every role.
    pub const ALL: Self = Self {
        ingest: true,
        query: true,
        compact: true,
    };

    /// Parses `ingest,query,compact` (any non-empty subset; `all` for every role).
    pub fn parse(s: &str) -> Result<Self, RolesError> {
        let mut roles = Self {
            ingest: false,
            query: false,
            compact: false,
        };
        for r in s.split(',').map(str::trim).filter(|r| !r.is_empty()) {
            match r {
                "ingest" => roles.ingest = true,
                "query" => roles.query = true,
                "compact" => roles.compact = true,
                "all" => roles = Self::ALL,
                other => return Err(RolesError::Unknown(other.to_owned())),
            }
        }
        if roles
            == (Self {
                ingest: false,
                query: false,
                compact: false,
            })
        {
            return Err(RolesError::None);
        }
        Ok(roles)
    }
}

impl std::fmt::Display for Roles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = [
            (self.ingest, "ingest"),
            (self.query, "query"),
            (self.compact, "compact"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect();
        f.write_str(&names.join(","))
    }
}
