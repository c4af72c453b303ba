//! The one clock of the engine: Unix milliseconds from the system, or a manual clock in tests.

use std::sync::Arc;

/// Unix milliseconds now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The time of new object ids (Unix milliseconds): the system clock, or a fixed one in tests.
#[derive(Clone, Default)]
pub struct Clock(Option<Arc<std::sync::atomic::AtomicU64>>);

impl Clock {
    /// A clock that reads `ms` until it is set again.
    pub fn manual(ms: Arc<std::sync::atomic::AtomicU64>) -> Self {
        Self(Some(ms))
    }

    /// Unix milliseconds now.
    pub fn now_ms(&self) -> u64 {
        match &self.0 {
            Some(ms) => ms.load(std::sync::atomic::Ordering::SeqCst),
            None => now_ms(),
        }
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            None => f.write_str("Clock(system)"),
            Some(ms) => write!(
                f,
                "Clock(manual {})",
                ms.load(std::sync::atomic::Ordering::SeqCst)
            ),
        }
    }
}
