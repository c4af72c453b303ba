//! Debug-info upload sessions, and the slots that bound uploads at once, per tenant and in all,
//! with the pace their bodies are read at.
//!
//! Where the state lives: sessions, in the metastore where processes share it (a session begun
//! on one process is finished on another: Parca's calls of one upload reach any process behind
//! a load balancer), else in this process's memory. Slots and pace are this process's: they
//! bound its own disk, memory and cores.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use kiln_storage::metastore::Metastore;
use kiln_symbolize::store::StoredFile;
use serde::{Deserialize, Serialize};

use crate::auth::TenantId;
use crate::error::{ApiError, ErrorKind};

/// An upload session older than this may be started again (Parca: its 15 minute upload limit
/// and 2 minutes; Pyroscope's is shorter).
pub(crate) const STALE_AFTER: Duration = Duration::from_secs(17 * 60);

/// How long a stored upload's session waits for its client to say it finished.
const STORED_TTL: Duration = Duration::from_secs(24 * 3600);

/// An upload announced and not yet finished.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Pending {
    pub(crate) upload_id: String,
    /// When it was announced, in Unix milliseconds.
    pub(crate) started_unix_ms: u64,
    /// The name the file was announced with.
    pub(crate) name: String,
    /// Ids the uploader names the file by besides its own.
    pub(crate) claimed: Vec<String>,
    /// A GNU build id the file must carry.
    pub(crate) gnu: Option<String>,
    /// The file, once its bytes arrived and it was stored.
    pub(crate) stored: Option<StoredFile>,
}

impl Pending {
    /// A session announced now.
    pub(crate) fn new(upload_id: String, name: String, claimed: Vec<String>) -> Self {
        Self {
            upload_id,
            started_unix_ms: unix_ms(SystemTime::now()),
            name,
            claimed,
            gnu: None,
            stored: None,
        }
    }

    /// Whether it may be started again: announced longer ago than [`STALE_AFTER`] and its
    /// bytes never arrived.
    fn stale(&self) -> bool {
        self.stored.is_none()
            && unix_ms(SystemTime::now()).saturating_sub(self.started_unix_ms)
                >= STALE_AFTER.as_millis() as u64
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Upload sessions by (tenant, id), and this process's upload slots.
#[derive(Debug, Default)]
pub struct Uploads {
    /// Sessions of a process alone.
    local: Mutex<HashMap<(TenantId, String), Pending>>,
    /// The metastore sessions live in when processes share it.
    shared: Option<Arc<dyn Metastore>>,
    pub(crate) slots: UploadSlots,
    /// Disk this process's uploads may fill at once.
    pub scratch: ScratchSpace,
}

/// The disk the uploads in progress of this process may fill with their temporary files at once
/// (`--debuginfo-scratch-size`): bytes are charged as they are written and given back when the
/// files go. Apart from the write-ahead log's, which it must not fill.
#[derive(Debug, Clone)]
pub struct ScratchSpace {
    used: Arc<std::sync::atomic::AtomicU64>,
    limit: u64,
}

impl Default for ScratchSpace {
    fn default() -> Self {
        Self::new(DEFAULT_SCRATCH_BYTES)
    }
}

/// `--debuginfo-scratch-size`: two files of the default largest debug file each, for two uploads.
pub const DEFAULT_SCRATCH_BYTES: u64 = 4 << 30;

impl ScratchSpace {
    pub fn new(limit: u64) -> Self {
        Self {
            used: Arc::default(),
            limit,
        }
    }

    /// A charge of nothing yet, added to as an upload's file grows.
    pub(crate) fn charge(&self) -> ScratchCharge {
        ScratchCharge {
            space: self.clone(),
            bytes: 0,
        }
    }

    /// Bytes charged now.
    pub fn used(&self) -> u64 {
        self.used.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// Bytes one upload's file holds of the [`ScratchSpace`], given back when dropped.
#[derive(Debug)]
pub(crate) struct ScratchCharge {
    space: ScratchSpace,
    bytes: u64,
}

impl ScratchCharge {
    /// Charges `n` more bytes; `false` (nothing charged) when the space is full.
    pub(crate) fn add(&mut self, n: u64) -> bool {
        use std::sync::atomic::Ordering;
        let limit = self.space.limit;
        let taken = self
            .space
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|u| *u <= limit)
            });
        if taken.is_ok() {
            self.bytes += n;
        }
        taken.is_ok()
    }

    /// The error of an upload the space has no room for.
    pub(crate) fn full(&self) -> ApiError {
        ApiError::new(
            ErrorKind::Unavailable,
            format!(
                "the uploads under way fill this process's scratch space of {} bytes                  (--debuginfo-scratch-size); retry when one ends",
                self.space.limit
            ),
        )
        .retry_after(5)
    }
}

impl Drop for ScratchCharge {
    fn drop(&mut self) {
        self.space
            .used
            .fetch_sub(self.bytes, std::sync::atomic::Ordering::AcqRel);
    }
}

/// A session's key in the shared metastore.
fn key(id: &str) -> String {
    format!("debuginfo/{id}")
}

fn encode(p: &Pending) -> Result<Vec<u8>, ApiError> {
    serde_json::to_vec(p).map_err(ApiError::internal)
}

fn decode(bytes: &[u8]) -> Result<Pending, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::internal(format!("an upload session: {e}")))
}

/// How long an upload waits for a slot of the process before it is answered 503.
pub(crate) const SLOT_WAIT: Duration = Duration::from_secs(10);

/// Uploads that receive, check and store a file at once, in this process: at most a tenant's
/// `max_debuginfo_uploads` of one tenant (429 past it, at once) and `total` of all tenants (one
/// past it waits up to [`SLOT_WAIT`], then 503). Each holds up to two files of
/// `max_debuginfo_file_bytes` on disk and what its sections inflate to in memory.
#[derive(Debug)]
pub struct UploadSlots {
    pub(crate) all: Arc<tokio::sync::Semaphore>,
    pub(crate) total: usize,
    pub(crate) tenants: Arc<Mutex<HashMap<TenantId, usize>>>,
    pub(crate) pace: Arc<Pace>,
}

impl Default for UploadSlots {
    fn default() -> Self {
        Self::new(DEFAULT_UPLOAD_CONCURRENCY, DEFAULT_UPLOAD_RATE_BYTES)
    }
}

/// Uploads of all tenants a process runs at once (`--debuginfo-upload-concurrency`).
pub const DEFAULT_UPLOAD_CONCURRENCY: usize = 4;

/// Bytes a second a process reads of all its uploads (`--debuginfo-upload-rate`). Eight 200 MB
/// uploads at once, on 2 cores (the e2e test `debuginfo_bounds`): at 32 MiB/s another tenant's
/// flame-graph p99 was 1.2–2.2× its idle value from run to run, at 16 MiB/s 1.4–1.7×.
pub const DEFAULT_UPLOAD_RATE_BYTES: u64 = 16 << 20;

/// The pace at which a process reads upload bodies: a token bucket of one second's bytes over
/// all its uploads. An upload that spent it waits before it reads more, so the sender is held
/// back by TCP and the uploads' share of the cores stays bounded.
#[derive(Debug)]
pub(crate) struct Pace {
    /// Bytes a second; 0 = unpaced.
    pub(crate) rate: u64,
    /// Tokens left (negative: owed) and when they were counted.
    pub(crate) bucket: Mutex<(f64, Instant)>,
}

impl Pace {
    pub(crate) fn new(rate: u64) -> Self {
        Self {
            rate,
            bucket: Mutex::new((rate as f64, Instant::now())),
        }
    }

    /// Charges `bytes`, waiting while the bucket is in debt.
    pub(crate) async fn charge(&self, bytes: usize) {
        if self.rate == 0 {
            return;
        }
        let rate = self.rate as f64;
        let wait = {
            let mut b = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            b.0 = (b.0 + now.duration_since(b.1).as_secs_f64() * rate).min(rate) - bytes as f64;
            b.1 = now;
            (b.0 < 0.0).then(|| Duration::from_secs_f64(-b.0 / rate))
        };
        if let Some(wait) = wait {
            tokio::time::sleep(wait).await;
        }
    }
}

/// One upload's slot, given back when dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) _all: tokio::sync::OwnedSemaphorePermit,
    pub(crate) _tenant: TenantCount,
    pub(crate) pace: Arc<Pace>,
}

/// One of a tenant's uploads counted, uncounted when dropped.
#[derive(Debug)]
pub(crate) struct TenantCount {
    pub(crate) tenant: TenantId,
    pub(crate) tenants: Arc<Mutex<HashMap<TenantId, usize>>>,
}

impl Drop for TenantCount {
    fn drop(&mut self) {
        let mut tenants = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = tenants.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                tenants.remove(&self.tenant);
            }
        }
    }
}

impl UploadSlots {
    /// Slots for `total` uploads at once (at least one), read at `rate` bytes a second in all
    /// (0 = unpaced).
    pub fn new(total: usize, rate: u64) -> Self {
        let total = total.max(1);
        Self {
            all: Arc::new(tokio::sync::Semaphore::new(total)),
            total,
            tenants: Arc::default(),
            pace: Arc::new(Pace::new(rate)),
        }
    }

    /// A slot for one more upload of `tenant`, which may run `per_tenant` at once.
    pub(crate) async fn take(
        &self,
        tenant: &TenantId,
        per_tenant: usize,
    ) -> Result<Slot, ApiError> {
        let counted = {
            let mut tenants = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
            let running = tenants.entry(tenant.clone()).or_default();
            if *running >= per_tenant.max(1) {
                return Err(ApiError::new(
                    ErrorKind::ResourceExhausted,
                    format!(
                        "the tenant has {running} debug-file uploads under way, its limit \
                         (max_debuginfo_uploads); retry when one ends"
                    ),
                )
                .retry_after(5));
            }
            *running += 1;
            TenantCount {
                tenant: tenant.clone(),
                tenants: Arc::clone(&self.tenants),
            }
        };
        let wait = Arc::clone(&self.all).acquire_owned();
        match tokio::time::timeout(SLOT_WAIT, wait).await {
            Ok(Ok(all)) => Ok(Slot {
                _all: all,
                _tenant: counted,
                pace: Arc::clone(&self.pace),
            }),
            _ => Err(ApiError::new(
                ErrorKind::Unavailable,
                format!(
                    "the server runs {} debug-file uploads at once, its limit \
                     (--debuginfo-upload-concurrency); nothing was stored, retry later",
                    self.total
                ),
            )
            .retry_after(5)),
        }
    }
}

impl Uploads {
    /// Sessions (in `metastore` when processes share it), slots for `concurrency` uploads at
    /// once read at `rate` bytes a second, and `scratch` bytes of disk for their files.
    pub fn new(
        concurrency: usize,
        rate: u64,
        scratch: u64,
        metastore: &Arc<dyn Metastore>,
    ) -> Self {
        Self {
            local: Mutex::default(),
            shared: metastore.shared().then(|| Arc::clone(metastore)),
            slots: UploadSlots::new(concurrency, rate),
            scratch: ScratchSpace::new(scratch),
        }
    }

    pub(crate) async fn get(
        &self,
        tenant: &TenantId,
        id: &str,
    ) -> Result<Option<Pending>, ApiError> {
        if let Some(m) = &self.shared {
            let found = m.get_session(tenant, &key(id)).await?;
            return Ok(found
                .map(|b| decode(&b))
                .transpose()?
                .filter(|p| !p.stale()));
        }
        let mut local = self.local.lock().unwrap_or_else(|e| e.into_inner());
        local.retain(|_, p| !p.stale());
        Ok(local.get(&(tenant.clone(), id.to_owned())).cloned())
    }

    pub(crate) async fn start(
        &self,
        tenant: &TenantId,
        id: &str,
        p: Pending,
    ) -> Result<(), ApiError> {
        if let Some(m) = &self.shared {
            return Ok(m
                .put_session(tenant, &key(id), encode(&p)?, STALE_AFTER)
                .await?);
        }
        let mut local = self.local.lock().unwrap_or_else(|e| e.into_inner());
        // Bounded: stale sessions go first.
        if local.len() >= 100_000 {
            local.retain(|_, p| !p.stale());
        }
        local.insert((tenant.clone(), id.to_owned()), p);
        Ok(())
    }

    pub(crate) async fn stored(
        &self,
        tenant: &TenantId,
        id: &str,
        file: StoredFile,
    ) -> Result<(), ApiError> {
        if let Some(m) = &self.shared {
            if let Some(mut p) = self.get(tenant, id).await? {
                p.stored = Some(file);
                m.put_session(tenant, &key(id), encode(&p)?, STORED_TTL)
                    .await?;
            }
            return Ok(());
        }
        let mut local = self.local.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = local.get_mut(&(tenant.clone(), id.to_owned())) {
            p.stored = Some(file);
        }
        Ok(())
    }

    pub(crate) async fn finish(
        &self,
        tenant: &TenantId,
        id: &str,
    ) -> Result<Option<Pending>, ApiError> {
        if let Some(m) = &self.shared {
            return m
                .take_session(tenant, &key(id))
                .await?
                .map(|b| decode(&b))
                .transpose();
        }
        Ok(self
            .local
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(tenant.clone(), id.to_owned())))
    }

    /// The tenant's uploads under way (announced, bytes not arrived), by id.
    pub(crate) async fn of_tenant(
        &self,
        tenant: &TenantId,
    ) -> Result<Vec<(String, Pending)>, ApiError> {
        let all: Vec<(String, Pending)> = match &self.shared {
            Some(m) => m
                .sessions(tenant, &key(""))
                .await?
                .into_iter()
                .map(|(k, b)| Ok((k.trim_start_matches("debuginfo/").to_owned(), decode(&b)?)))
                .collect::<Result<_, ApiError>>()?,
            None => self
                .local
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .filter(|((t, _), _)| t == tenant)
                .map(|((_, id), p)| (id.clone(), p.clone()))
                .collect(),
        };
        Ok(all
            .into_iter()
            .filter(|(_, p)| p.stored.is_none() && !p.stale())
            .collect())
    }
}
