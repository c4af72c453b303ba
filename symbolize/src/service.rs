//! The symbolizer a server runs: for a tenant's native frames (a build id, a mapping, an
//! address) the frames of their debug files — the tenant's uploads first, then debuginfod —
//! within a deadline, with three caches:
//!
//! - which file an id names, per tenant (invalidated by a generation bumped on every upload
//!   and delete of the tenant);
//! - open files (memory-mapped), weighed by their size and the heap they hold (inflated
//!   sections, symbol maps, Go's table), opened once however many queries ask at once;
//! - resolved addresses per (file, address), weighed by their bytes: the second query of the
//!   same frames reads nothing.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kiln_storage::store::ObjectStorage;

use crate::budget::{BudgetSlot, InflateBudget};
use crate::debug_file::{Inflation, OpenLimits};
use crate::debuginfod::{Debuginfod, DebuginfodConfig, Lookup};
use crate::files::LocalFiles;
use crate::store::{DebugStore, StoredFile};
use crate::{DebugFile, Frame, MappingRange, Metrics};

/// How the symbolizer runs (flags of `kiln serve`, docs/configuration.md).
#[derive(Debug, Clone)]
pub struct SymbolizerConfig {
    /// Local copies of debug files from a remote store.
    pub cache_dir: PathBuf,
    pub cache_bytes: u64,
    /// Open (mapped) files, by their size.
    pub open_bytes: u64,
    /// Resolved addresses, by their bytes.
    pub resolved_bytes: u64,
    /// Bytes one file's compressed sections may inflate to when a query or a debuginfod fetch
    /// opens it (uploads are held to their tenant's `max_debuginfo_inflated_bytes`).
    pub max_inflated_bytes: u64,
    pub debuginfod: DebuginfodConfig,
}

impl SymbolizerConfig {
    /// Uploads only (no debuginfod), local copies under `data_dir`, modest caches: what an
    /// embedded or test server starts with.
    pub fn without_debuginfod(data_dir: &std::path::Path) -> Self {
        let dir = data_dir.join("debuginfo-cache");
        Self {
            debuginfod: DebuginfodConfig {
                urls: Vec::new(),
                timeout: Duration::from_secs(120),
                concurrency: 4,
                tenant_concurrency: 2,
                missing_ttl: Duration::from_secs(3600),
                retry_after: Duration::from_secs(30),
                max_file_bytes: 4 << 30,
                max_stored_bytes: 0,
                attempts: 3,
                scratch_dir: dir.join("incoming"),
            },
            cache_dir: dir.join("copies"),
            cache_bytes: 1 << 30,
            open_bytes: 1 << 30,
            resolved_bytes: 64 << 20,
            max_inflated_bytes: DEFAULT_MAX_INFLATED_BYTES,
        }
    }
}

/// The default bound on what one debug file's compressed sections may inflate to.
pub const DEFAULT_MAX_INFLATED_BYTES: u64 = 512 << 20;

/// A native frame to name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Request {
    /// The build id as the profile gives it (GNU hex, Go's, hex-encoded Go, the file id; or the
    /// JSON Kiln writes when a service names its source repository, which holds it).
    pub build_id: String,
    pub mapping: MappingRange,
    pub address: u64,
}

/// What a batch of requests got.
#[derive(Debug, Clone, Default)]
pub struct Resolution {
    /// Per request, innermost first; `None` where no file named it.
    pub frames: Vec<Option<Arc<[Frame]>>>,
    /// Whether an answer may still change without a new file being uploaded (a debuginfod
    /// fetch is under way, or failed and will be tried again).
    pub incomplete: bool,
    /// What a user should know (`kiln-warning`).
    pub warnings: Vec<String>,
}

/// Where a build id's file was found.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    Upload(String),
    Debuginfod(String),
}

/// The symbolizer.
#[derive(Clone)]
pub struct Symbolizer {
    inner: Arc<Inner>,
}

struct Inner {
    store: DebugStore,
    files: LocalFiles,
    debuginfod: Debuginfod,
    open: moka::future::Cache<String, Arc<DebugFile>>,
    /// What a query's open may inflate, and the budget it reserves from.
    open_limits: OpenLimits,
    budget: BudgetSlot,
    resolved: moka::sync::Cache<(String, u64), Arc<[Frame]>>,
    /// (tenant, id, tenant generation) → the object of the file it names.
    named: moka::future::Cache<(String, String, u64), Option<String>>,
    /// Bumped when debuginfod brings a file: every tenant's answers may change.
    global: Arc<AtomicU64>,
    tenants: Mutex<HashMap<String, u64>>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Symbolizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Symbolizer")
            .field("debuginfod", &self.inner.debuginfod)
            .finish()
    }
}

/// The GNU/Go/file id inside a mapping's build id: Kiln writes a JSON object there when a
/// service names its source repository (`{"build_id": …, "repository": …}`).
pub fn build_id_of(raw: &str) -> &str {
    let raw = raw.trim();
    if !raw.starts_with('{') {
        return raw;
    }
    // A small scan rather than a parser: the field is a plain string Kiln wrote.
    raw.split("\"build_id\":\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or("")
}

fn weight_of(frames: &[Frame]) -> u32 {
    let bytes: usize = frames
        .iter()
        .map(|f| f.function.len() + f.file.as_ref().map_or(0, String::len) + 64)
        .sum();
    u32::try_from(bytes + 32).unwrap_or(u32::MAX)
}

impl Symbolizer {
    /// A symbolizer over the object store the storage engine uses (`Storage::store`).
    pub fn new(
        store: ObjectStorage,
        config: SymbolizerConfig,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<Self> {
        let global = Arc::new(AtomicU64::new(0));
        let budget = BudgetSlot::default();
        let open_limits = OpenLimits {
            max_inflated_bytes: config.max_inflated_bytes,
        };
        let files = LocalFiles::new(store.clone(), config.cache_dir.clone(), config.cache_bytes)?;
        let debuginfod = Debuginfod::new(
            config.debuginfod.clone(),
            store.clone(),
            Arc::clone(&global),
            Arc::clone(&metrics),
            (open_limits, budget.clone()),
        );
        let open = moka::future::Cache::builder()
            .max_capacity(config.open_bytes)
            .weigher(|_: &String, f: &Arc<DebugFile>| {
                u32::try_from(f.mapped_bytes() + f.heap_bytes() as u64).unwrap_or(u32::MAX)
            })
            .build();
        let resolved = moka::sync::Cache::builder()
            .max_capacity(config.resolved_bytes)
            .weigher(|_: &(String, u64), f: &Arc<[Frame]>| weight_of(f))
            .build();
        let named = moka::future::Cache::builder()
            .max_capacity(100_000)
            .time_to_live(Duration::from_secs(60))
            .build();
        Ok(Self {
            inner: Arc::new(Inner {
                store: DebugStore::new(store, budget.clone()),
                files,
                debuginfod,
                open,
                open_limits,
                budget,
                resolved,
                named,
                global,
                tenants: Mutex::new(HashMap::new()),
                metrics,
            }),
        })
    }

    /// Sets the budget that opening a file reserves its inflated sections from (the server's
    /// decode budget, shared with ingest). Until then nothing is reserved.
    pub fn set_inflate_budget(&self, budget: Arc<dyn InflateBudget>) {
        self.inner.budget.set(budget);
    }

    /// The tenants' debug files.
    pub fn store(&self) -> &DebugStore {
        &self.inner.store
    }

    /// Bounds debuginfod's files in the object store to `--debuginfod-stored-size`, least
    /// recently used first ([`crate::debuginfod::evict`]). One process of the cluster runs it.
    pub async fn evict_fetched(&self) -> kiln_storage::Result<crate::debuginfod::Evicted> {
        let budget = self.inner.debuginfod.max_stored_bytes();
        if budget == 0 {
            return Ok(Default::default());
        }
        let out = crate::debuginfod::evict(self.inner.debuginfod.store(), budget).await?;
        let m = &self.inner.metrics;
        m.debuginfod_stored_bytes
            .set(i64::try_from(out.bytes).unwrap_or(i64::MAX));
        m.debuginfod_evicted_bytes.inc_by(out.evicted_bytes);
        Ok(out)
    }

    /// Changes whenever an answer for `tenant` may change: an upload or delete of its own, a
    /// file from debuginfod.
    pub fn generation(&self, tenant: &str) -> u64 {
        let own = self
            .inner
            .tenants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(tenant)
            .copied()
            .unwrap_or(0);
        self.inner
            .global
            .load(Ordering::Relaxed)
            .wrapping_add(own << 32)
    }

    /// A tenant's files changed (an upload, a delete).
    pub fn changed(&self, tenant: &str) {
        *self
            .inner
            .tenants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(tenant.to_owned())
            .or_default() += 1;
    }

    /// Forgets what is cached of a deleted file.
    pub async fn forget(&self, tenant: &str, file: &StoredFile) {
        let object = self.inner.store.object_path(tenant, &file.sha256);
        self.inner.open.invalidate(&object).await;
        self.inner.files.forget(&object).await;
        self.changed(tenant);
    }

    /// Names `requests` for `tenant`, waiting for debuginfod until `deadline`.
    pub async fn resolve(
        &self,
        tenant: &str,
        requests: &[Request],
        deadline: Instant,
    ) -> Resolution {
        let mut by_id: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, r) in requests.iter().enumerate() {
            let id = build_id_of(&r.build_id);
            if !id.is_empty() {
                by_id.entry(id.to_owned()).or_default().push(i);
            }
        }
        let mut out = Resolution {
            frames: vec![None; requests.len()],
            ..Default::default()
        };
        let generation = self.generation(tenant);
        let results: Vec<_> = futures::stream::iter(by_id)
            .map(|(id, indices)| {
                let (this, tenant) = (self.clone(), tenant.to_owned());
                async move {
                    let found = this.source(&tenant, &id, generation, deadline).await;
                    (indices, found)
                }
            })
            .buffer_unordered(8)
            .collect()
            .await;
        let (mut pending, mut failed) = (0usize, Vec::new());
        let mut work = Vec::new();
        for (indices, found) in results {
            match found {
                Ok(Some(source)) => work.push((source, indices)),
                Ok(None) => {
                    self.inner.metrics.addresses("none", indices.len() as u64);
                }
                Err(Lookup::Pending) => pending += 1,
                Err(Lookup::Failed(e)) => failed.push(e),
                Err(_) => {}
            }
        }
        for (source, indices) in work {
            let (object, label) = match &source {
                Source::Upload(o) => (o.clone(), "upload"),
                Source::Debuginfod(o) => (o.clone(), "debuginfod"),
            };
            self.inner.metrics.addresses(label, indices.len() as u64);
            let fetched = matches!(source, Source::Debuginfod(_));
            match self.resolve_in(&object, requests, &indices).await {
                Ok(frames) => {
                    if fetched {
                        self.inner.debuginfod.note_use(&object).await;
                    }
                    for (i, f) in indices.into_iter().zip(frames) {
                        out.frames[i] = (!f.is_empty()).then_some(f);
                    }
                }
                // Evicted since it was fetched: fetched again at the next query.
                Err(_) if fetched && self.inner.debuginfod.forget_if_gone(&object).await => {
                    pending += 1;
                }
                Err(e) => failed.push(format!("{object}: {e}")),
            }
        }
        if pending > 0 {
            out.incomplete = true;
            out.warnings.push(format!(
                "debuginfod has not answered yet for {pending} build id(s): their frames keep \
                 their addresses until it does"
            ));
        }
        if !failed.is_empty() {
            out.incomplete = true;
            failed.sort();
            failed.dedup();
            out.warnings.push(format!(
                "native frames could not be named: {}",
                failed.join("; ")
            ));
        }
        out
    }

    /// The file `id` names for `tenant`: an upload of its own, else debuginfod's.
    async fn source(
        &self,
        tenant: &str,
        id: &str,
        generation: u64,
        deadline: Instant,
    ) -> Result<Option<Source>, Lookup> {
        let inner = &self.inner;
        let key = (tenant.to_owned(), id.to_owned(), generation);
        let store = inner.store.clone();
        let (t, i) = (tenant.to_owned(), id.to_owned());
        let uploaded = inner
            .named
            .try_get_with(key, async move {
                Ok::<_, kiln_storage::Error>(
                    store
                        .find(&t, &i)
                        .await?
                        .map(|f| store.object_path(&t, &f.sha256)),
                )
            })
            .await
            .map_err(|e| Lookup::Failed(e.to_string()))?;
        if let Some(object) = uploaded {
            return Ok(Some(Source::Upload(object)));
        }
        match inner.debuginfod.lookup(tenant, id, deadline).await {
            Lookup::Found(object) => Ok(Some(Source::Debuginfod(object))),
            Lookup::Missing => Ok(None),
            other => Err(other),
        }
    }

    /// Resolves the requests at `indices` in the file at `object`.
    async fn resolve_in(
        &self,
        object: &str,
        requests: &[Request],
        indices: &[usize],
    ) -> Result<Vec<Arc<[Frame]>>, String> {
        let file = self.open(object).await?;
        let inner = Arc::clone(&self.inner);
        let key = object.to_owned();
        let wanted: Vec<(MappingRange, u64)> = indices
            .iter()
            .map(|&i| (requests[i].mapping, requests[i].address))
            .collect();
        tokio::task::spawn_blocking(move || {
            wanted
                .into_iter()
                .map(|(mapping, address)| {
                    let at = file.file_address(mapping, address);
                    let cache_key = (key.clone(), at);
                    if let Some(hit) = inner.resolved.get(&cache_key) {
                        inner.metrics.resolved_cache_hits.inc();
                        return hit;
                    }
                    inner.metrics.resolved_cache_misses.inc();
                    let frames: Arc<[Frame]> = file.resolve(at).into();
                    inner.resolved.insert(cache_key, Arc::clone(&frames));
                    frames
                })
                .collect()
        })
        .await
        .map_err(|e| e.to_string())
    }

    /// The open file at `object` (copied and mapped on first use; queries that ask at once
    /// share one open). Its compressed sections are checked against the symbolizer's bound and
    /// reserved from the budget while it opens.
    async fn open(&self, object: &str) -> Result<Arc<DebugFile>, String> {
        let inner = Arc::clone(&self.inner);
        let key = object.to_owned();
        self.inner
            .open
            .try_get_with(key.clone(), async move {
                let path = inner.files.get(&key).await.map_err(|e| e.to_string())?;
                let (limits, at) = (inner.open_limits, path.clone());
                let inflation = tokio::task::spawn_blocking(move || Inflation::of_file(&at))
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())?;
                inflation.check(limits).map_err(|e| e.to_string())?;
                let _reserved = inner.budget.reserve(inflation.bytes).await?;
                let file = tokio::task::spawn_blocking(move || DebugFile::open(&path, limits))
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(Arc::new(file))
            })
            .await
            .map_err(|e: Arc<String>| e.as_ref().clone())
    }
}

#[async_trait::async_trait]
impl kiln_storage::caches::names::FrameNamer for Symbolizer {
    fn generation(&self, tenant: &str) -> u64 {
        Symbolizer::generation(self, tenant)
    }

    async fn name(
        &self,
        tenant: &str,
        frames: Vec<kiln_storage::caches::names::NativeFrame>,
        deadline: Instant,
    ) -> kiln_storage::caches::names::Named {
        let requests: Vec<Request> = frames
            .into_iter()
            .map(|f| Request {
                build_id: f.build_id,
                mapping: MappingRange {
                    start: f.memory_start,
                    limit: f.memory_limit,
                    offset: f.file_offset,
                },
                address: f.address,
            })
            .collect();
        let resolution = self.resolve(tenant, &requests, deadline).await;
        // One conversion per distinct answer: frames of a file share theirs.
        let mut converted: HashMap<*const Frame, Arc<[kiln_storage::caches::names::NamedLine]>> =
            HashMap::new();
        let lines = resolution
            .frames
            .iter()
            .map(|f| {
                f.as_ref().map(|frames| {
                    Arc::clone(converted.entry(frames.as_ptr()).or_insert_with(|| {
                        frames
                            .iter()
                            .map(|f| kiln_storage::caches::names::NamedLine {
                                function: f.function.clone(),
                                file: f.file.clone().unwrap_or_default(),
                                line: i64::from(f.line),
                            })
                            .collect()
                    }))
                })
            })
            .collect();
        kiln_storage::caches::names::Named {
            lines,
            incomplete: resolution.incomplete,
            warnings: resolution.warnings,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_ids_are_unwrapped_from_source_link_json() {
        assert_eq!(build_id_of(" 4e1b0c "), "4e1b0c");
        // What ingest writes when a service names its repository (otel's model).
        let json = r#"{"repository":"https://github.com/a/b","git_ref":"v1","build_id":"4e1b0c","root_path":"src"}"#;
        assert_eq!(build_id_of(json), "4e1b0c");
        assert_eq!(build_id_of(r#"{"repository":"r"}"#), "");
    }
}
