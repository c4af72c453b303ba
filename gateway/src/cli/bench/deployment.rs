//! Where `kiln bench` sends its workload: one `kiln serve` with every role on its embedded
//! defaults, or (`--scaled-out`) a process per role (`--roles ingest`, `query`, `compact`; one
//! or more ingest processes, written to in turn), sharing a PostgreSQL metastore and an S3
//! object store as a scaled-out Kiln does.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context;

use super::{Server, dir_bytes};

/// Where the deployment keeps its objects (what "bytes at rest" measures).
enum Objects {
    Dir(PathBuf),
    Store(String),
}

/// The processes of one deployment and where to reach each role.
pub struct Deployment {
    /// Each process, named by its role (`ingest`, `ingest-1`, ..., `query`, `compact`; `kiln`
    /// for the single process).
    servers: Vec<(String, Server)>,
    /// The (first) process that accepts profiles.
    pub ingest: String,
    /// Every process that accepts profiles, and the next to write to.
    ingests: Vec<String>,
    next: AtomicUsize,
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
            ingests: vec![url.clone()],
            next: AtomicUsize::new(0),
            query: url.clone(),
            compact: url,
            objects: Objects::Dir(data.join("objects")),
            servers: vec![("kiln".to_owned(), server)],
        })
    }

    /// A process per role, `ingest_processes` of the ingest role, sharing the metastore and
    /// object store at these URLs (the object store's endpoint and credentials from the
    /// environment, as `kiln serve` reads them); each has a data directory of its own under
    /// `dir` (spool, log, compaction scratch).
    pub fn scaled_out(
        dir: &Path,
        metastore: &str,
        object_store: &str,
        ingest_processes: usize,
        extra: &[String],
    ) -> anyhow::Result<Self> {
        let mut servers = Vec::new();
        let ingest = (0..ingest_processes.max(1)).map(|n| ("ingest", n));
        for (role, n) in ingest.chain([("query", 0), ("compact", 0)]) {
            let mut args: Vec<String> = vec![
                "--roles".into(),
                role.into(),
                "--metastore".into(),
                metastore.into(),
                "--object-store".into(),
                object_store.into(),
            ];
            args.extend_from_slice(extra);
            let name = if n == 0 {
                role.to_owned()
            } else {
                format!("{role}-{n}")
            };
            let server = Server::start(&dir.join(&name), &args)
                .with_context(|| format!("starting the {name} process"))?;
            servers.push((name, server));
        }
        let n = servers.len();
        let ingests: Vec<String> = servers[..n - 2]
            .iter()
            .map(|(_, s)| s.url.clone())
            .collect();
        Ok(Self {
            ingest: ingests[0].clone(),
            ingests,
            next: AtomicUsize::new(0),
            query: servers[n - 2].1.url.clone(),
            compact: servers[n - 1].1.url.clone(),
            objects: Objects::Store(object_store.into()),
            servers,
        })
    }

    /// The ingest process to send the next request to (each in turn, as a round-robin load
    /// balancer does).
    pub fn next_ingest(&self) -> &str {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        &self.ingests[n % self.ingests.len()]
    }

    /// How far behind the newest acknowledged write the query process may answer: none where
    /// it is the ingesting process (its queries cut what its shards buffer); else a segment
    /// interval scaled to the ingest processes (`--ack-from log`, at most 5 s) and a second to
    /// register it.
    pub fn query_lag(&self) -> std::time::Duration {
        if self.query == self.ingest {
            return std::time::Duration::ZERO;
        }
        let processes = u32::try_from(self.ingests.len()).unwrap_or(u32::MAX);
        kiln_storage::writer::scaled_segment_interval(std::time::Duration::from_secs(1), processes)
            + std::time::Duration::from_secs(1)
    }

    /// CPU seconds all processes have used.
    pub fn cpu_seconds(&self) -> f64 {
        self.servers.iter().map(|(_, s)| s.cpu_seconds()).sum()
    }

    /// CPU seconds each process has used, by name.
    pub fn cpu_by_process(&self) -> Vec<(String, f64)> {
        self.servers
            .iter()
            .map(|(name, s)| (name.clone(), s.cpu_seconds()))
            .collect()
    }

    /// The sum of the processes' peak resident memory, MiB.
    pub fn peak_rss_mib(&self) -> f64 {
        self.servers.iter().map(|(_, s)| s.peak_rss_mib()).sum()
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
