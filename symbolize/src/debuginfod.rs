//! A debuginfod client: the debug file of a GNU build id no upload covers, fetched from the
//! servers of `--debuginfod-url` (`/buildid/<id>/debuginfo`, else `/buildid/<id>/executable`
//! when that has symbols), and kept in the object store for every tenant (debuginfod's files are
//! public) under `debuginfod/<id>`.
//!
//! A fetch runs on a task of its own, at most `concurrency` at once, with a timeout, retried
//! with backoff on 429, 5xx and broken connections; a caller waits for it only until its
//! deadline, and a later caller finds the result. What no server has is remembered for
//! `missing_ttl`, a server that failed for `retry_after`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use kiln_storage::store::ObjectStorage;

use crate::budget::BudgetSlot;
use crate::debug_file::OpenLimits;
use crate::elf::hex;
use crate::store::is_hex_id;

/// What a lookup found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The file, at this object path.
    Found(String),
    /// No server has it.
    Missing,
    /// Not known yet: a fetch is under way past the caller's deadline.
    Pending,
    /// The servers failed (unreachable, errors); asked again after `retry_after`.
    Failed(String),
}

/// How the client runs.
#[derive(Debug, Clone)]
pub struct DebuginfodConfig {
    /// Server base URLs, asked in order.
    pub urls: Vec<String>,
    /// One fetch's whole time, retries included.
    pub timeout: Duration,
    /// Fetches at once.
    pub concurrency: usize,
    /// How long "no server has it" is remembered.
    pub missing_ttl: Duration,
    /// How long a failure is remembered before the servers are asked again.
    pub retry_after: Duration,
    /// Largest file fetched.
    pub max_file_bytes: u64,
    /// Attempts per server and file kind.
    pub attempts: u32,
    /// Where files are written while they arrive.
    pub scratch_dir: std::path::PathBuf,
}

type Fetch = Shared<BoxFuture<'static, Lookup>>;

/// The client.
#[derive(Clone)]
pub struct Debuginfod {
    inner: Arc<Inner>,
}

struct Inner {
    config: DebuginfodConfig,
    http: reqwest::Client,
    store: ObjectStorage,
    permits: tokio::sync::Semaphore,
    /// Remembered outcomes, with when they expire.
    known: Mutex<HashMap<String, (Lookup, Instant)>>,
    inflight: Mutex<HashMap<String, Fetch>>,
    /// Bumped when a file arrives (cached resolutions may name more frames now).
    generation: Arc<AtomicU64>,
    metrics: Arc<crate::Metrics>,
    /// What checking a fetched file may inflate, and the budget it reserves from.
    open_limits: OpenLimits,
    budget: BudgetSlot,
}

impl std::fmt::Debug for Debuginfod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Debuginfod")
            .field("urls", &self.inner.config.urls)
            .finish()
    }
}

/// Most outcomes remembered.
const MAX_KNOWN: usize = 100_000;

/// The object path of a fetched file.
pub fn object_path(build_id: &str) -> String {
    format!("debuginfod/{build_id}/debuginfo")
}

impl Debuginfod {
    pub fn new(
        config: DebuginfodConfig,
        store: ObjectStorage,
        generation: Arc<AtomicU64>,
        metrics: Arc<crate::Metrics>,
        (open_limits, budget): (OpenLimits, BudgetSlot),
    ) -> Self {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5).min(config.timeout))
            .user_agent(concat!("kiln/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("an HTTP client with default TLS");
        let permits = tokio::sync::Semaphore::new(config.concurrency.max(1));
        Self {
            inner: Arc::new(Inner {
                config,
                http,
                store,
                permits,
                known: Mutex::new(HashMap::new()),
                inflight: Mutex::new(HashMap::new()),
                generation,
                metrics,
                open_limits,
                budget,
            }),
        }
    }

    /// Whether any server is configured.
    pub fn enabled(&self) -> bool {
        !self.inner.config.urls.is_empty()
    }

    /// The file of `build_id` (a GNU build id, hex), waiting for a fetch until `deadline`.
    pub async fn lookup(&self, build_id: &str, deadline: Instant) -> Lookup {
        let id = build_id.to_ascii_lowercase();
        if !self.enabled() || !is_hex_id(&id) {
            return Lookup::Missing;
        }
        if let Some(known) = self.known(&id) {
            return known;
        }
        let fetch = self.fetch(&id);
        match tokio::time::timeout_at(deadline.into(), fetch).await {
            Ok(found) => found,
            Err(_) => {
                self.inner.metrics.debuginfod_deadline.inc();
                Lookup::Pending
            }
        }
    }

    fn known(&self, id: &str) -> Option<Lookup> {
        let mut known = self.inner.known.lock().unwrap_or_else(|e| e.into_inner());
        match known.get(id) {
            Some((l, until)) if *until > Instant::now() => Some(l.clone()),
            Some(_) => {
                known.remove(id);
                None
            }
            None => None,
        }
    }

    /// The fetch of `id` under way, or a new one on a task of its own.
    fn fetch(&self, id: &str) -> Fetch {
        let mut inflight = self
            .inner
            .inflight
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(f) = inflight.get(id) {
            return f.clone();
        }
        let inner = Arc::clone(&self.inner);
        let key = id.to_owned();
        let task = tokio::spawn(async move {
            let found = inner.fetch(&key).await;
            let ttl = match &found {
                Lookup::Found(_) => Duration::from_secs(24 * 3600),
                Lookup::Missing => inner.config.missing_ttl,
                Lookup::Failed(_) | Lookup::Pending => inner.config.retry_after,
            };
            {
                let mut known = inner.known.lock().unwrap_or_else(|e| e.into_inner());
                if known.len() >= MAX_KNOWN {
                    known.retain(|_, (_, until)| *until > Instant::now());
                }
                if known.len() < MAX_KNOWN {
                    known.insert(key.clone(), (found.clone(), Instant::now() + ttl));
                }
            }
            inner
                .inflight
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&key);
            found
        });
        let shared = async move {
            task.await
                .unwrap_or_else(|e| Lookup::Failed(format!("the fetch task failed: {e}")))
        }
        .boxed()
        .shared();
        inflight.insert(id.to_owned(), shared.clone());
        shared
    }
}

impl Inner {
    async fn fetch(&self, id: &str) -> Lookup {
        let object = object_path(id);
        // Another process (or an earlier run) may have fetched it.
        if self.store.get_range(&object, 0..4).await.is_ok() {
            return Lookup::Found(object);
        }
        let Ok(_permit) = self.permits.acquire().await else {
            return Lookup::Failed("shutting down".into());
        };
        let started = Instant::now();
        let found = tokio::time::timeout(self.config.timeout, self.fetch_from_servers(id)).await;
        self.metrics
            .debuginfod_fetch_seconds
            .observe(started.elapsed().as_secs_f64());
        match found {
            Ok(l) => {
                let outcome = match &l {
                    Lookup::Found(_) => "found",
                    Lookup::Missing => "missing",
                    _ => "failed",
                };
                self.metrics.debuginfod_fetch(outcome);
                l
            }
            Err(_) => {
                self.metrics.debuginfod_fetch("timeout");
                Lookup::Failed(format!(
                    "debuginfod did not answer within {:?}",
                    self.config.timeout
                ))
            }
        }
    }

    async fn fetch_from_servers(&self, id: &str) -> Lookup {
        let mut failure = None;
        for url in &self.config.urls {
            for kind in ["debuginfo", "executable"] {
                let link = format!("{}/buildid/{id}/{kind}", url.trim_end_matches('/'));
                match self.download(&link, id).await {
                    Ok(Some(object)) => {
                        self.generation.fetch_add(1, Ordering::Relaxed);
                        return Lookup::Found(object);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::debug!(url = %link, error = %e, "debuginfod fetch failed");
                        failure = Some(e);
                    }
                }
            }
        }
        match failure {
            Some(e) => Lookup::Failed(e),
            None => Lookup::Missing,
        }
    }

    /// Downloads one file (`Ok(None)`: the server does not have it, or it has no symbols),
    /// retrying broken connections, 429 and 5xx with backoff.
    async fn download(&self, url: &str, id: &str) -> Result<Option<String>, String> {
        let mut delay = Duration::from_millis(200);
        let mut last = String::new();
        for attempt in 0..self.config.attempts.max(1) {
            if attempt > 0 {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            match self.download_once(url, id).await {
                Ok(found) => return Ok(found),
                Err((retry, e)) => {
                    last = e;
                    if !retry {
                        break;
                    }
                }
            }
        }
        Err(last)
    }

    async fn download_once(&self, url: &str, id: &str) -> Result<Option<String>, (bool, String)> {
        let resp = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|e| (true, format!("{url}: {e}")))?;
        let status = resp.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
            return Err((true, format!("{url}: {status}")));
        }
        if !status.is_success() {
            return Err((false, format!("{url}: {status}")));
        }
        if resp
            .content_length()
            .is_some_and(|n| n > self.config.max_file_bytes)
        {
            return Err((
                false,
                format!("{url}: larger than {} bytes", self.config.max_file_bytes),
            ));
        }
        std::fs::create_dir_all(&self.config.scratch_dir)
            .map_err(|e| (false, format!("scratch directory: {e}")))?;
        let path = self
            .config
            .scratch_dir
            .join(format!("{}-{}", hex(id.as_bytes()), uuid_like()));
        let written = self.write(resp, &path).await;
        let result = match written {
            Ok(()) => self.keep(&path, id).await,
            Err(e) => Err(e),
        };
        let _ = tokio::fs::remove_file(&path).await;
        result
    }

    async fn write(
        &self,
        mut resp: reqwest::Response,
        path: &std::path::Path,
    ) -> Result<(), (bool, String)> {
        use tokio::io::AsyncWriteExt;
        let mut out = tokio::fs::File::create(path)
            .await
            .map_err(|e| (false, e.to_string()))?;
        let mut total = 0u64;
        while let Some(chunk) = resp.chunk().await.map_err(|e| (true, e.to_string()))? {
            total += chunk.len() as u64;
            if total > self.config.max_file_bytes {
                return Err((
                    false,
                    format!("larger than {} bytes", self.config.max_file_bytes),
                ));
            }
            out.write_all(&chunk)
                .await
                .map_err(|e| (false, e.to_string()))?;
        }
        out.flush().await.map_err(|e| (false, e.to_string()))
    }

    /// Checks a downloaded file (its GNU build id must be the one asked for; it must have
    /// symbols) and stores it.
    async fn keep(
        &self,
        path: &std::path::Path,
        id: &str,
    ) -> Result<Option<String>, (bool, String)> {
        let info = crate::store::inspect_reserved(path, self.open_limits, &self.budget).await;
        let info = match info {
            Ok(info) => info,
            Err(crate::store::UploadError::NoSymbols) => return Ok(None),
            // The server is busy: the fetch is tried again.
            Err(e @ crate::store::UploadError::Busy(_)) => return Err((true, e.to_string())),
            Err(e) => return Err((false, e.to_string())),
        };
        if info.gnu_build_id.as_deref() != Some(id) {
            return Err((
                false,
                format!(
                    "the server's file has build id {:?}, not {id}",
                    info.gnu_build_id
                ),
            ));
        }
        let object = object_path(id);
        self.store
            .put_file_durable(&object, path)
            .await
            .map_err(|e| (true, e.to_string()))?;
        Ok(Some(object))
    }
}

/// A name part unique enough for a scratch file.
fn uuid_like() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
