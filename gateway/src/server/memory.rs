//! Freed memory handed back to the system when the allocator holds too much of it.
//!
//! jemalloc keeps the pages a program frees ("dirty" pages) for reuse and returns them to the
//! system over its decay time, 10 s. Most of Kiln's work reuses them at once, but a burst that
//! frees hundreds of megabytes (a merge of a million series, whose metadata is rebuilt, encoded
//! and decoded) leaves them held while the next burst allocates fresh ones: in
//! `kiln bench --series 1008000` the process held 1.4 GiB with 0.6 GiB in use. A shorter decay
//! for every page costs the steady ingest about a tenth of its CPU in page faults (the small
//! preset: 12.8 → 14.2 s). So a thread looks at the dirty pages every [`INTERVAL`] and purges
//! them all when they pass `--allocator-dirty-bytes`; below it, nothing changes. The default,
//! 128 MiB, is above what the small preset's steady ingest holds (its CPU is unchanged); 64 MiB
//! purged during it and cost 8 % (docs/performance.md, "Freed memory returned to the system").

use std::time::Duration;

use tikv_jemalloc_ctl::{Access, AsName, epoch};
use tracing::warn;

/// How often the dirty pages are counted.
pub const INTERVAL: Duration = Duration::from_millis(100);

/// Dirty pages of every arena (4096 is jemalloc's `MALLCTL_ARENAS_ALL`).
const DIRTY_PAGES: &[u8] = b"stats.arenas.4096.pdirty\0";

/// Purges every arena.
const PURGE: &[u8] = b"arena.4096.purge\0";

/// Bytes of dirty pages the allocator holds, over all arenas.
fn dirty_bytes(page: usize) -> Option<usize> {
    epoch::advance().ok()?;
    let pages: usize = DIRTY_PAGES.name().read().ok()?;
    Some(pages.saturating_mul(page))
}

/// `arena.<all>.purge`: returns every arena's dirty pages to the system.
#[allow(unsafe_code)]
fn purge() -> bool {
    // SAFETY: `arena.<i>.purge` is a documented control that reads and writes nothing
    // (https://jemalloc.net/jemalloc.3.html#arena.i.purge): every pointer is null and the
    // length 0, as it requires; the name is a NUL-terminated constant. The ctl
    // crate's safe and raw writers always pass a value, which this control refuses.
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(
            PURGE.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    rc == 0
}

/// Starts the thread that purges dirty pages past `limit` bytes; `limit` 0 leaves them to
/// jemalloc's decay.
pub fn spawn_purger(limit: u64) {
    if limit == 0 {
        return;
    }
    let page = match b"arenas.page\0".name().read() {
        Ok(page) => page,
        Err(e) => {
            warn!(error = %e, "--allocator-dirty-bytes off: jemalloc's page size is unknown");
            return;
        }
    };
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let spawned = std::thread::Builder::new()
        .name("kiln-purge".into())
        .spawn(move || {
            loop {
                std::thread::sleep(INTERVAL);
                if dirty_bytes(page).is_some_and(|d| d > limit) && !purge() {
                    warn!("--allocator-dirty-bytes off: jemalloc refused arena.all.purge");
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        warn!(error = %e, "--allocator-dirty-bytes off: no thread for it");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Memory freed stays with jemalloc (the unit tests' allocator too, `lib.rs`) as dirty
    /// pages until purged, and the purge hands them back.
    #[test]
    fn freed_pages_are_counted_and_purged() {
        let page: usize = b"arenas.page\0".name().read().unwrap();
        let blocks: Vec<Vec<u8>> = (0..64).map(|_| vec![1u8; 1 << 20]).collect();
        assert_eq!(blocks.iter().map(|b| b[4096] as usize).sum::<usize>(), 64);
        drop(blocks);
        let before = dirty_bytes(page).unwrap();
        assert!(
            before >= 32 << 20,
            "{before} bytes dirty after freeing 64 MiB"
        );
        assert!(purge());
        let after = dirty_bytes(page).unwrap();
        assert!(after < before / 4, "{after} bytes dirty after the purge");
    }
}
