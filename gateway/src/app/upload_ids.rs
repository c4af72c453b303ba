//! The `kiln upload` batches stored recently, per tenant, so a resumed upload stores none twice
//! (the batch id is the `kiln-upload-id` header, read by `crate::api::parca`).
//!
//! Where the state lives: in the metastore where processes share it (a batch sent again may
//! reach another process), else in this process's memory.

use std::sync::Arc;
use std::time::Duration;

use kiln_storage::metastore::Metastore;

use crate::auth::TenantId;
use crate::error::{ApiError, ErrorKind};

/// How long a stored batch is remembered.
const REMEMBERED: Duration = Duration::from_secs(24 * 3600);

/// How long a process may take to store a batch it claimed before another may claim it.
const STORING: Duration = Duration::from_secs(10 * 60);

/// How long a batch sent again waits for another process to store its first sending.
const WAIT: Duration = Duration::from_secs(30);

/// What a batch's session holds in the shared metastore.
const STORED: &[u8] = b"stored";
const CLAIMED: &[u8] = b"storing";

/// Upload ids stored recently, per tenant (a day; in memory, at most a million). A batch sent
/// again while its first sending is still being stored waits for it, then is answered as it
/// was.
#[derive(Debug, Clone)]
pub struct UploadIds {
    seen: moka::sync::Cache<(TenantId, String), Arc<tokio::sync::Mutex<bool>>>,
    /// The metastore batches are remembered in when processes share it.
    shared: Option<Arc<dyn Metastore>>,
}

impl UploadIds {
    /// Batches remembered in `metastore` when processes share it, else here.
    pub fn new(metastore: &Arc<dyn Metastore>) -> Self {
        Self {
            seen: moka::sync::Cache::builder()
                .max_capacity(1_000_000)
                .time_to_live(REMEMBERED)
                .build(),
            shared: metastore.shared().then(|| Arc::clone(metastore)),
        }
    }

    /// Runs `store` unless the batch `id` names was stored for `tenant` already.
    pub(crate) async fn once(
        &self,
        tenant: &TenantId,
        id: Option<String>,
        store: impl std::future::Future<Output = Result<(), ApiError>>,
    ) -> Result<(), ApiError> {
        let Some(id) = id else {
            return store.await;
        };
        if let Some(m) = &self.shared {
            return once_shared(m.as_ref(), tenant, &id, store).await;
        }
        let slot = self.seen.get_with((tenant.clone(), id), || {
            Arc::new(tokio::sync::Mutex::new(false))
        });
        let mut stored = slot.lock().await;
        if *stored {
            return Ok(());
        }
        store.await?;
        *stored = true;
        Ok(())
    }
}

/// [`UploadIds::once`] for the cluster: the batch's session claimed before it is stored,
/// marked stored after, given up if storing fails. A batch another process is storing is
/// waited for, up to [`WAIT`].
async fn once_shared(
    m: &dyn Metastore,
    tenant: &TenantId,
    id: &str,
    store: impl std::future::Future<Output = Result<(), ApiError>>,
) -> Result<(), ApiError> {
    let key = format!("upload/{id}");
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if m.claim_session(tenant, &key, CLAIMED.to_vec(), STORING)
            .await?
        {
            break;
        }
        match m.get_session(tenant, &key).await?.as_deref() {
            Some(STORED) => return Ok(()),
            // Storing elsewhere (or gone since the claim failed: claim again).
            _ if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            _ => {
                return Err(ApiError::new(
                    ErrorKind::Unavailable,
                    "another process is still storing this upload batch; retry later",
                )
                .retry_after(5));
            }
        }
    }
    match store.await {
        Ok(()) => Ok(m
            .put_session(tenant, &key, STORED.to_vec(), REMEMBERED)
            .await?),
        Err(e) => {
            // Not stored: a resend may try again at once.
            let _ = m.take_session(tenant, &key).await;
            Err(e)
        }
    }
}
