//! The debug-info upload sessions of this process and the slots that bound uploads at once,
//! per tenant and in all, with the pace their bodies are read at.
//!
//! State: per process, in memory ([`Uploads`] on the [`crate::app::App`]). A session begun on
//! one process is unknown to another.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use kiln_symbolize::store::StoredFile;

use crate::auth::TenantId;
use crate::error::{ApiError, ErrorKind};

/// An upload session older than this may be started again (Parca: its 15 minute upload limit
/// and 2 minutes; Pyroscope's is shorter).
pub(crate) const STALE_AFTER: Duration = Duration::from_secs(17 * 60);

/// An upload announced and not yet finished.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    pub(crate) upload_id: String,
    pub(crate) started: Instant,
    pub(crate) started_at: SystemTime,
    /// The name the file was announced with.
    pub(crate) name: String,
    /// Ids the uploader names the file by besides its own.
    pub(crate) claimed: Vec<String>,
    /// A GNU build id the file must carry.
    pub(crate) gnu: Option<String>,
    /// The file, once its bytes arrived and it was stored.
    pub(crate) stored: Option<StoredFile>,
}

/// The upload sessions of this process, by (tenant, id), and its upload slots.
#[derive(Debug, Default)]
pub struct Uploads {
    pub(crate) pending: Mutex<HashMap<(TenantId, String), Pending>>,
    pub(crate) slots: UploadSlots,
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
    /// Sessions, and slots for `concurrency` uploads at once read at `rate` bytes a second.
    pub fn new(concurrency: usize, rate: u64) -> Self {
        Self {
            pending: Mutex::default(),
            slots: UploadSlots::new(concurrency, rate),
        }
    }

    pub(crate) fn get(&self, tenant: &TenantId, id: &str) -> Option<Pending> {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.retain(|_, p| p.started.elapsed() < STALE_AFTER || p.stored.is_some());
        pending.get(&(tenant.clone(), id.to_owned())).cloned()
    }

    pub(crate) fn start(&self, tenant: &TenantId, id: &str, p: Pending) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        // Bounded: sessions older than the stale age go first.
        if pending.len() >= 100_000 {
            pending.retain(|_, p| p.started.elapsed() < STALE_AFTER);
        }
        pending.insert((tenant.clone(), id.to_owned()), p);
    }

    pub(crate) fn stored(&self, tenant: &TenantId, id: &str, file: StoredFile) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = pending.get_mut(&(tenant.clone(), id.to_owned())) {
            p.stored = Some(file);
        }
    }

    pub(crate) fn finish(&self, tenant: &TenantId, id: &str) -> Option<Pending> {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(tenant.clone(), id.to_owned()))
    }

    pub(crate) fn of_tenant(&self, tenant: &TenantId) -> Vec<(String, Pending)> {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|((t, _), p)| t == tenant && p.stored.is_none())
            .map(|((_, id), p)| (id.clone(), p.clone()))
            .collect()
    }
}
