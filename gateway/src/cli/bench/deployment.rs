//! Where `kiln bench` sends its workload: one `kiln serve` with every role on its embedded
//! defaults, or (`--scaled-out`) three processes, one per role (`--roles ingest`, `query`,
//! `compact`), sharing a PostgreSQL metastore and an S3 object store as a scaled-out Kiln does.

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::{Server, dir_bytes};

/// Where the deployment keeps its objects (what "bytes at rest" measures).
enum Objects {
    Dir(PathBuf),
    Store(String),
}

/// The processes of one deployment and where to reach each role.
pub struct Deployment {
    servers: Vec<Server>,
    /// The process that accepts profiles.
    pub ingest: String,
    /// The process that answers queries.
    pub query: String,
    /// The process that compacts (its admin API states the compaction jobs it runs).
    pub compact: String,
    objects: Objects,
}

impl Deployment {
    /// One process with every role, its metastore and objects under `data`.
    pub fn single(data: &Path, extra: &[String]) -> anyhow::Result<Self> {
        let server = Server::start(data, extra)?;
        let url = server.url.clone();
        Ok(Self {
            ingest: url.clone(),
            query: url.clone(),
            compact: url,
            objects: Objects::Dir(data.join("objects")),
            servers: vec![server],
        })
    }

    /// Three processes, one role each, sharing the metastore and object store at these URLs
    /// (the object store's endpoint and credentials from the environment, as `kiln serve`
    /// reads them); each has a data directory of its own under `dir` (spool, compaction
    /// scratch).
    pub fn scaled_out(
        dir: &Path,
        metastore: &str,
        object_store: &str,
        extra: &[String],
    ) -> anyhow::Result<Self> {
        let mut servers = Vec::new();
        for role in ["ingest", "query", "compact"] {
            let mut args: Vec<String> = vec![
                "--roles".into(),
                role.into(),
                "--metastore".into(),
                metastore.into(),
                "--object-store".into(),
                object_store.into(),
            ];
            args.extend_from_slice(extra);
            servers.push(
                Server::start(&dir.join(role), &args)
                    .with_context(|| format!("starting the {role} process"))?,
            );
        }
        Ok(Self {
            ingest: servers[0].url.clone(),
            query: servers[1].url.clone(),
            compact: servers[2].url.clone(),
            objects: Objects::Store(object_store.into()),
            servers,
        })
    }

    /// CPU seconds all processes have used.
    pub fn cpu_seconds(&self) -> f64 {
        self.servers.iter().map(Server::cpu_seconds).sum()
    }

    /// The sum of the processes' peak resident memory, MiB.
    pub fn peak_rss_mib(&self) -> f64 {
        self.servers.iter().map(Server::peak_rss_mib).sum()
    }

    /// Bytes of every object the deployment stores.
    pub async fn bytes_at_rest(&self) -> anyhow::Result<u64> {
        match &self.objects {
            Objects::Dir(dir) => Ok(dir_bytes(dir)),
            Objects::Store(url) => {
                let store = kiln_storage::store::ObjectStorage::from_url(
                    url,
                    std::time::Duration::from_secs(10),
                )?;
                Ok(store.list("").await?.iter().map(|m| m.size).sum())
            }
        }
    }
}
