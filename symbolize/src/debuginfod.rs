//! A debuginfod client: the debug file of a GNU build id no upload covers, fetched from the
//! servers of `--debuginfod-url` (`/buildid/<id>/debuginfo`, else `/buildid/<id>/executable`
//! when that has symbols), and kept in the object store for every tenant (debuginfod's files are
//! public) under `debuginfod/<id>`, at most `max_stored_bytes` of them ([`evict`]).
//!
//! A fetch runs on a task of its own, at most `concurrency` at once and `tenant_concurrency` for
//! the tenant whose query asked, with a timeout, retried with backoff on 429, 5xx and broken
//! connections; a caller waits for it only until its deadline, and a later caller finds the
//! result. What no server has is remembered for `missing_ttl`, a server that failed for
//! `retry_after`. Outcomes are remembered per tenant that asked ([`Known`]): one tenant's
//! flood of build ids makes it forget its own, never another tenant's.
//!
//! All of this is per process: each process fetches and remembers for itself, and a file one
//! fetched is found in the object store by the others.

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
    /// Fetches at once for one tenant's queries.
    pub tenant_concurrency: usize,
    /// How long "no server has it" is remembered.
    pub missing_ttl: Duration,
    /// How long a failure is remembered before the servers are asked again.
    pub retry_after: Duration,
    /// Largest file fetched.
    pub max_file_bytes: u64,
    /// Bytes of fetched files the object store keeps, for the whole cluster ([`evict`]); 0:
    /// no bound.
    pub max_stored_bytes: u64,
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
    /// Per tenant: its fetches' semaphore (dropped when none runs or waits).
    tenant_permits: Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
    /// Remembered outcomes, per tenant.
    known: Mutex<Known>,
    /// Fetches under way, with the tenants waiting for each (each remembers the outcome).
    inflight: Mutex<HashMap<String, (Fetch, Vec<String>)>>,
    /// Bumped when a file arrives (cached resolutions may name more frames now).
    generation: Arc<AtomicU64>,
    metrics: Arc<crate::Metrics>,
    /// What checking a fetched file may inflate, and the budget it reserves from.
    open_limits: OpenLimits,
    budget: BudgetSlot,
    /// Build ids this process marked as used within [`MARK_USE_EVERY`].
    marked: moka::sync::Cache<String, ()>,
}

impl std::fmt::Debug for Debuginfod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Debuginfod")
            .field("urls", &self.inner.config.urls)
            .finish()
    }
}

/// Most outcomes remembered, over all tenants.
const MAX_KNOWN: usize = 100_000;

/// Most outcomes remembered for one tenant.
const MAX_KNOWN_PER_TENANT: usize = 10_000;

/// Remembered outcomes by tenant, with when each expires: at most `per_tenant` for one tenant
/// and `total` in all. A tenant at its share forgets its own oldest outcome; at the total, the
/// tenant holding the most forgets its oldest. So random build ids from one tenant never push
/// out another tenant's outcomes while that tenant holds less than its share.
#[derive(Debug)]
pub struct Known {
    tenants: HashMap<String, TenantKnown>,
    total: usize,
    per_tenant: usize,
    max_total: usize,
}

#[derive(Debug, Default)]
struct TenantKnown {
    outcomes: HashMap<String, (Lookup, Instant)>,
    /// The keys of `outcomes`, oldest first.
    order: std::collections::VecDeque<String>,
}

impl TenantKnown {
    /// Forgets the oldest outcome still held; whether there was one.
    fn forget_oldest(&mut self) -> bool {
        while let Some(id) = self.order.pop_front() {
            if self.outcomes.remove(&id).is_some() {
                return true;
            }
        }
        false
    }
}

impl Known {
    pub fn new(per_tenant: usize, max_total: usize) -> Self {
        Self {
            tenants: HashMap::new(),
            total: 0,
            per_tenant: per_tenant.max(1),
            max_total: max_total.max(1),
        }
    }

    /// What `tenant` remembers of `id` at `now`, if it has not expired.
    pub fn get(&self, tenant: &str, id: &str, now: Instant) -> Option<Lookup> {
        let (outcome, until) = self.tenants.get(tenant)?.outcomes.get(id)?;
        (*until > now).then(|| outcome.clone())
    }

    /// Remembers `outcome` of `id` for `tenant` until `until`.
    pub fn insert(&mut self, tenant: &str, id: &str, outcome: Lookup, until: Instant) {
        if let Some(t) = self.tenants.get_mut(tenant)
            && let Some(known) = t.outcomes.get_mut(id)
        {
            *known = (outcome, until);
            return;
        }
        if self.total >= self.max_total {
            // The tenant holding the most gives one up.
            if let Some(t) = self.tenants.values_mut().max_by_key(|t| t.outcomes.len())
                && t.forget_oldest()
            {
                self.total -= 1;
            }
            self.tenants.retain(|_, t| !t.outcomes.is_empty());
        }
        let t = self.tenants.entry(tenant.to_owned()).or_default();
        if t.outcomes.len() >= self.per_tenant && t.forget_oldest() {
            self.total -= 1;
        }
        t.outcomes.insert(id.to_owned(), (outcome, until));
        t.order.push_back(id.to_owned());
        self.total += 1;
    }

    /// Forgets what every tenant remembers of `id` (its file left the store).
    pub fn forget(&mut self, id: &str) {
        for t in self.tenants.values_mut() {
            if t.outcomes.remove(id).is_some() {
                self.total -= 1;
            }
        }
        self.tenants.retain(|_, t| !t.outcomes.is_empty());
    }

    /// Outcomes remembered in all.
    pub fn len(&self) -> usize {
        self.total
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }
}

/// The object path of a fetched file.
pub fn object_path(build_id: &str) -> String {
    format!("debuginfod/{build_id}/debuginfo")
}

/// The object whose time says when a fetched file was last opened ([`Debuginfod::note_use`]).
fn used_path(build_id: &str) -> String {
    format!("debuginfod/{build_id}/used")
}

/// How often one process marks a file it keeps opening as used.
const MARK_USE_EVERY: Duration = Duration::from_secs(3600);

/// What [`evict`] found and removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Evicted {
    /// Fetched files and their bytes kept.
    pub files: u64,
    pub bytes: u64,
    /// Files and bytes removed.
    pub evicted_files: u64,
    pub evicted_bytes: u64,
}

/// Removes fetched files from `store`, least recently used first, until they hold at most
/// `budget` bytes. A file's use is the newer of its fetch and its last use mark. Run by one
/// process of the cluster (the retention lease's holder); a file removed is fetched again when
/// a query asks for it.
pub async fn evict(store: &ObjectStorage, budget: u64) -> kiln_storage::Result<Evicted> {
    // By build id: the file's size and time, and the use mark's time.
    let mut files: HashMap<String, (Option<u64>, u64, u64)> = HashMap::new();
    for meta in store.list("debuginfod").await? {
        let path = meta.location.as_ref();
        let Some((id, name)) = path
            .strip_prefix("debuginfod/")
            .and_then(|rest| rest.split_once('/'))
        else {
            continue;
        };
        let at = meta.last_modified.timestamp_millis().max(0) as u64;
        let f = files.entry(id.to_owned()).or_default();
        match name {
            "debuginfo" => {
                f.0 = Some(meta.size);
                f.1 = f.1.max(at);
            }
            "used" => f.2 = f.2.max(at),
            _ => {}
        }
    }
    let mut kept: Vec<(u64, String, u64)> = Vec::with_capacity(files.len());
    for (id, (size, fetched, used)) in files {
        match size {
            Some(size) => kept.push((fetched.max(used), id, size)),
            // A mark whose file is gone.
            None => store.delete(&used_path(&id)).await?,
        }
    }
    kept.sort();
    let mut out = Evicted {
        files: kept.len() as u64,
        bytes: kept.iter().map(|(_, _, size)| size).sum(),
        ..Evicted::default()
    };
    for (_, id, size) in kept {
        if out.bytes <= budget {
            break;
        }
        store.delete(&object_path(&id)).await?;
        store.delete(&used_path(&id)).await?;
        out.files -= 1;
        out.bytes -= size;
        out.evicted_files += 1;
        out.evicted_bytes += size;
    }
    Ok(out)
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
                tenant_permits: Mutex::new(HashMap::new()),
                known: Mutex::new(Known::new(MAX_KNOWN_PER_TENANT, MAX_KNOWN)),
                inflight: Mutex::new(HashMap::new()),
                generation,
                metrics,
                open_limits,
                budget,
                marked: moka::sync::Cache::builder()
                    .max_capacity(MAX_KNOWN as u64)
                    .time_to_live(MARK_USE_EVERY)
                    .build(),
            }),
        }
    }

    /// Marks the fetched file at `object` as used now (at most once per [`MARK_USE_EVERY`] in
    /// this process), so [`evict`] removes files no query opens first.
    pub async fn note_use(&self, object: &str) {
        let Some(id) = object
            .strip_prefix("debuginfod/")
            .and_then(|rest| rest.strip_suffix("/debuginfo"))
        else {
            return;
        };
        if self.inner.marked.contains_key(id) {
            return;
        }
        self.inner.marked.insert(id.to_owned(), ());
        if let Err(e) = self
            .inner
            .store
            .put_durable(&used_path(id), bytes::Bytes::new())
            .await
        {
            tracing::debug!(build_id = id, error = %e, "fetched file not marked as used");
        }
    }

    /// Forgets every tenant's outcome for the file at `object` when it is no longer in the
    /// store ([`evict`] removed it): the next query fetches it again. Whether it was gone.
    pub async fn forget_if_gone(&self, object: &str) -> bool {
        let Some(id) = object
            .strip_prefix("debuginfod/")
            .and_then(|rest| rest.strip_suffix("/debuginfo"))
        else {
            return false;
        };
        if self.inner.store.get_range(object, 0..4).await.is_ok() {
            return false;
        }
        self.inner
            .known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .forget(id);
        self.inner.marked.invalidate(id);
        true
    }

    /// `--debuginfod-stored-size` (0: no bound).
    pub fn max_stored_bytes(&self) -> u64 {
        self.inner.config.max_stored_bytes
    }

    /// The object store fetched files are kept in.
    pub fn store(&self) -> &ObjectStorage {
        &self.inner.store
    }

    /// Whether any server is configured.
    pub fn enabled(&self) -> bool {
        !self.inner.config.urls.is_empty()
    }

    /// The file of `build_id` (a GNU build id, hex) for a query of `tenant`, waiting for a fetch
    /// until `deadline`.
    pub async fn lookup(&self, tenant: &str, build_id: &str, deadline: Instant) -> Lookup {
        let id = build_id.to_ascii_lowercase();
        if !self.enabled() || !is_hex_id(&id) {
            return Lookup::Missing;
        }
        let known = self
            .inner
            .known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(tenant, &id, Instant::now());
        if let Some(known) = known {
            return known;
        }
        let fetch = self.fetch(tenant, &id);
        match tokio::time::timeout_at(deadline.into(), fetch).await {
            Ok(found) => found,
            Err(_) => {
                self.inner.metrics.debuginfod_deadline.inc();
                Lookup::Pending
            }
        }
    }

    /// The fetch of `id` under way (`tenant` then remembers its outcome too), or a new one on a
    /// task of its own.
    fn fetch(&self, tenant: &str, id: &str) -> Fetch {
        let mut inflight = self
            .inner
            .inflight
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some((f, waiting)) = inflight.get_mut(id) {
            if !waiting.iter().any(|t| t == tenant) {
                waiting.push(tenant.to_owned());
            }
            return f.clone();
        }
        let inner = Arc::clone(&self.inner);
        let (key, asker) = (id.to_owned(), tenant.to_owned());
        let task = tokio::spawn(async move {
            let found = inner.fetch(&asker, &key).await;
            let ttl = match &found {
                Lookup::Found(_) => Duration::from_secs(24 * 3600),
                Lookup::Missing => inner.config.missing_ttl,
                Lookup::Failed(_) | Lookup::Pending => inner.config.retry_after,
            };
            let waiting = inner
                .inflight
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&key)
                .map(|(_, w)| w)
                .unwrap_or_default();
            let until = Instant::now() + ttl;
            let mut known = inner.known.lock().unwrap_or_else(|e| e.into_inner());
            for tenant in waiting {
                known.insert(&tenant, &key, found.clone(), until);
            }
            found
        });
        let shared = async move {
            task.await
                .unwrap_or_else(|e| Lookup::Failed(format!("the fetch task failed: {e}")))
        }
        .boxed()
        .shared();
        inflight.insert(id.to_owned(), (shared.clone(), vec![tenant.to_owned()]));
        shared
    }
}

impl Inner {
    async fn fetch(&self, tenant: &str, id: &str) -> Lookup {
        let object = object_path(id);
        // Another process (or an earlier run) may have fetched it.
        if self.store.get_range(&object, 0..4).await.is_ok() {
            return Lookup::Found(object);
        }
        // The tenant's permit first: a tenant at its share waits without holding a permit of
        // the process, which other tenants' fetches take meanwhile.
        let own = self.tenant_semaphore(tenant);
        let Ok(_own) = own.acquire().await else {
            return Lookup::Failed("shutting down".into());
        };
        let Ok(_permit) = self.permits.acquire().await else {
            return Lookup::Failed("shutting down".into());
        };
        let found = self.fetch_permitted(id).await;
        drop(_own);
        self.release_tenant(tenant, own);
        found
    }

    /// The semaphore of `tenant`'s fetches.
    fn tenant_semaphore(&self, tenant: &str) -> Arc<tokio::sync::Semaphore> {
        let n = self.config.tenant_concurrency.max(1);
        Arc::clone(
            self.tenant_permits
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(tenant.to_owned())
                .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(n))),
        )
    }

    /// Drops `tenant`'s semaphore once no fetch of it runs or waits.
    fn release_tenant(&self, tenant: &str, own: Arc<tokio::sync::Semaphore>) {
        let mut permits = self
            .tenant_permits
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // Two holders: the map and `own`.
        if Arc::strong_count(&own) == 2 {
            permits.remove(tenant);
        }
    }

    async fn fetch_permitted(&self, id: &str) -> Lookup {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn random_id(rng: &mut u64) -> String {
        // xorshift64*: 40 hex digits of a GNU build id.
        (0..3)
            .map(|_| {
                *rng ^= *rng >> 12;
                *rng ^= *rng << 25;
                *rng ^= *rng >> 27;
                format!("{:016x}", rng.wrapping_mul(0x2545_f491_4f6c_dd1d))
            })
            .collect::<String>()[..40]
            .to_owned()
    }

    #[test]
    fn one_tenants_random_build_ids_do_not_push_out_anothers_outcomes() {
        let mut known = Known::new(MAX_KNOWN_PER_TENANT, MAX_KNOWN);
        let now = Instant::now();
        let until = now + Duration::from_secs(3600);
        let quiet = "4e1b0c2d";
        known.insert("quiet", quiet, Lookup::Missing, until);
        let found = Lookup::Found(object_path("aa11"));
        known.insert("quiet", "aa11", found.clone(), until);
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..100_000 {
            known.insert("noisy", &random_id(&mut rng), Lookup::Missing, until);
        }
        // The flood costs the noisy tenant its own outcomes only.
        assert_eq!(known.get("quiet", quiet, now), Some(Lookup::Missing));
        assert_eq!(known.get("quiet", "aa11", now), Some(found));
        assert_eq!(known.len(), MAX_KNOWN_PER_TENANT + 2);
        // Another tenant's new outcomes are still remembered.
        known.insert("later", "bb22", Lookup::Missing, until);
        assert_eq!(known.get("later", "bb22", now), Some(Lookup::Missing));
        // Remembered per tenant: the noisy tenant does not read the quiet one's.
        assert_eq!(known.get("noisy", quiet, now), None);
    }

    #[test]
    fn a_forgotten_file_is_forgotten_by_every_tenant_and_counted_once() {
        let mut known = Known::new(2, 10);
        let until = Instant::now() + Duration::from_secs(60);
        let found = Lookup::Found(object_path("aa"));
        known.insert("a", "aa", found.clone(), until);
        known.insert("b", "aa", found, until);
        known.insert("b", "bb", Lookup::Missing, until);
        known.forget("aa");
        assert_eq!(known.len(), 1);
        assert_eq!(known.get("a", "aa", Instant::now()), None);
        assert_eq!(known.get("b", "aa", Instant::now()), None);
        // b's share is still 2: the forgotten id left its order without taking a place.
        known.insert("b", "cc", Lookup::Missing, until);
        known.insert("b", "dd", Lookup::Missing, until);
        assert_eq!(known.len(), 2);
        assert_eq!(known.get("b", "bb", Instant::now()), None);
        assert_eq!(known.get("b", "dd", Instant::now()), Some(Lookup::Missing));
    }

    /// Past the bound, the files used longest ago go first; a use mark counts as a use, and a
    /// mark without its file is removed.
    #[tokio::test]
    async fn fetched_files_past_the_bound_go_least_recently_used_first() {
        let dir = tempfile::tempdir().unwrap();
        let store = ObjectStorage::local(dir.path()).unwrap();
        let put = |path: String, n: usize| {
            let store = store.clone();
            async move {
                store
                    .put_durable(&path, bytes::Bytes::from(vec![7u8; n]))
                    .await
                    .unwrap();
                // Distinct modification times, oldest first.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        for id in ["aa", "bb", "cc"] {
            put(object_path(id), 100).await;
        }
        put(used_path("aa"), 0).await;
        put(used_path("dd"), 0).await;
        let out = evict(&store, 150).await.unwrap();
        assert_eq!(
            out,
            Evicted {
                files: 1,
                bytes: 100,
                evicted_files: 2,
                evicted_bytes: 200
            }
        );
        let mut left: Vec<String> = store
            .list("debuginfod")
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.location.to_string())
            .collect();
        left.sort();
        assert_eq!(left, [object_path("aa"), used_path("aa")]);
        // Within the bound, nothing goes.
        assert_eq!(evict(&store, 100).await.unwrap().evicted_files, 0);
    }

    #[test]
    fn past_the_total_the_largest_tenant_forgets_first() {
        let mut known = Known::new(4, 6);
        let until = Instant::now() + Duration::from_secs(60);
        for i in 0..4 {
            known.insert("big", &format!("b{i}"), Lookup::Missing, until);
        }
        known.insert("small", "s0", Lookup::Missing, until);
        known.insert("small", "s1", Lookup::Missing, until);
        // Full: the next one of the small tenant costs the big tenant its oldest.
        known.insert("small", "s2", Lookup::Missing, until);
        let now = Instant::now();
        assert_eq!(known.len(), 6);
        assert_eq!(known.get("big", "b0", now), None);
        assert!(known.get("big", "b1", now).is_some());
        assert!(
            ["s0", "s1", "s2"]
                .iter()
                .all(|s| known.get("small", s, now).is_some())
        );
        // Expired outcomes are not answered, and are replaced in place.
        let past = Instant::now();
        known.insert("small", "s0", Lookup::Failed("down".into()), past);
        assert_eq!(known.get("small", "s0", Instant::now()), None);
        assert_eq!(known.len(), 6);
    }
}
