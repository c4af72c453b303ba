//! The `kiln upload` batches stored recently, per tenant, so a resumed upload stores none twice
//! (the batch id is the `kiln-upload-id` header, read by `crate::api::parca`).

use std::sync::Arc;
use std::time::Duration;

use crate::auth::TenantId;
use crate::error::ApiError;

/// Upload ids stored recently, per tenant (a day, at most a million). A batch sent again while
/// its first sending is still being stored waits for it, then is answered as it was.
#[derive(Debug, Clone)]
pub struct UploadIds {
    seen: moka::sync::Cache<(TenantId, String), Arc<tokio::sync::Mutex<bool>>>,
}

impl Default for UploadIds {
    fn default() -> Self {
        Self {
            seen: moka::sync::Cache::builder()
                .max_capacity(1_000_000)
                .time_to_live(Duration::from_secs(24 * 3600))
                .build(),
        }
    }
}

impl UploadIds {
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
