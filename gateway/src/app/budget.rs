//! The budget of decoded bytes in flight: what bounds ingest memory across requests.
//!
//! Each ingest request holds a share of the budget from before it inflates and decodes its
//! profile until what it produced is stored, sized by the bytes it decodes (the inflated size,
//! from the gzip trailer where the body is compressed). A request that finds the budget spent
//! waits up to [`WAIT`] for others to finish, then is answered 503 with `Retry-After`: the server
//! is busy, not the tenant over its rate (that is 429). A request larger than the whole budget
//! takes all of it, so it still runs, alone.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{ApiError, ErrorKind};

/// How long a request waits for budget before it is refused.
pub const WAIT: Duration = Duration::from_secs(2);

/// Seconds a refused client is asked to wait.
pub const RETRY_AFTER_SECS: u64 = 1;

/// The budget's unit: permits are KiB, so a `u32` of them covers 4 TiB.
const UNIT: usize = 1024;

/// A budget of decoded bytes shared by all ingest requests of a process.
#[derive(Debug, Clone)]
pub struct DecodeBudget {
    permits: Arc<Semaphore>,
    total: u32,
}

/// A request's share of the budget, given back when dropped.
#[derive(Debug)]
pub struct Share {
    _permit: Option<OwnedSemaphorePermit>,
}

impl DecodeBudget {
    /// A budget of `bytes` (at least 1 MiB; 0 means no bound).
    pub fn new(bytes: usize) -> Self {
        let total = if bytes == 0 {
            0
        } else {
            u32::try_from(bytes.max(1 << 20) / UNIT).unwrap_or(u32::MAX)
        };
        Self {
            permits: Arc::new(Semaphore::new(total as usize)),
            total,
        }
    }

    /// Takes `bytes` of the budget, waiting up to [`WAIT`] for it.
    pub async fn take(&self, bytes: usize) -> Result<Share, ApiError> {
        if self.total == 0 {
            return Ok(Share { _permit: None });
        }
        let want = u32::try_from(bytes.div_ceil(UNIT))
            .unwrap_or(u32::MAX)
            .clamp(1, self.total);
        match tokio::time::timeout(WAIT, self.permits.clone().acquire_many_owned(want)).await {
            Ok(Ok(permit)) => Ok(Share {
                _permit: Some(permit),
            }),
            _ => Err(ApiError::new(
                ErrorKind::Unavailable,
                "the server is decoding as much as it may at once; nothing was stored, retry later",
            )
            .retry_after(RETRY_AFTER_SECS)),
        }
    }

    /// Bytes of the budget in use now.
    pub fn in_use(&self) -> usize {
        (self.total as usize - self.permits.available_permits()) * UNIT
    }
}

/// The bytes decoding `body` produces, as far as can be told before doing it: a gzip body's
/// trailer gives its inflated size (the last member's, modulo 4 GiB; a hint a sender could
/// falsify, so it is taken as at least the body and at most `limit`, which inflation enforces).
pub fn decoded_size(body: &[u8], limit: usize) -> usize {
    let n = body.len();
    match kiln_otel::compress::gzip_size_hint(body) {
        Some(stated) => stated.max(n).min(limit.max(n)),
        None => n,
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[tokio::test]
    async fn shares_are_bounded_and_given_back() {
        let budget = DecodeBudget::new(4 << 20);
        let a = budget.take(3 << 20).await.unwrap();
        assert_eq!(budget.in_use(), 3 << 20);
        // 2 MiB more does not fit: refused 503 after the wait.
        let err = budget.take(2 << 20).await.unwrap_err();
        assert_eq!(err.kind, ErrorKind::Unavailable);
        assert_eq!(err.retry_after, Some(RETRY_AFTER_SECS));
        // ... but does once the first share is dropped; more than the budget takes all of it.
        drop(a);
        let b = budget.take(2 << 20).await.unwrap();
        drop(b);
        let all = budget.take(1 << 30).await.unwrap();
        assert_eq!(budget.in_use(), 4 << 20);
        drop(all);
        assert_eq!(budget.in_use(), 0);
        // 0 is no bound.
        let none = DecodeBudget::new(0);
        let _s = none.take(1 << 40).await.unwrap();
    }

    #[test]
    fn decoded_size_reads_the_gzip_trailer() {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(&vec![7u8; 1 << 20]).unwrap();
        let gz = enc.finish().unwrap();
        assert!(gz.len() < 8192);
        assert_eq!(decoded_size(&gz, 64 << 20), 1 << 20);
        assert_eq!(decoded_size(&gz, 1000), 1000.max(gz.len()));
        assert_eq!(decoded_size(b"plain body", 4), 10);
    }
}
