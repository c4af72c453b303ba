//! What a query is asked and what it read: its options ([`QueryOptions`]) and its report
//! ([`QueryReport`]: warnings and [`QueryStats`]), kept per task for the query running in it
//! ([`with_report`], [`with_options`]), and the engine-wide [`QueryCounters`].

use std::sync::atomic::{AtomicU64, Ordering};

/// What one query did: the figures that make pruning and caching visible (returned by
/// [`with_report`], and summed into the engine-wide [`QueryCounters`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct QueryStats {
    /// Blocks the query read (from the store or the caches).
    pub blocks: u64,
    /// Blocks answered from the partial-result cache, without reading their rows.
    pub blocks_cached: u64,
    /// Bytes read from the object store: Parquet pages and footers, symbols.
    pub bytes_read: u64,
    /// Rows decoded from samples and rollups.
    pub rows_read: u64,
    /// Series row ranges read from rollups rather than samples (ADR 0007).
    pub rollup_ranges: u64,
}

impl std::fmt::Display for QueryStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "blocks={} blocks_cached={} bytes_read={} rows_read={} rollup_ranges={}",
            self.blocks, self.blocks_cached, self.bytes_read, self.rows_read, self.rollup_ranges
        )
    }
}

/// Why a `kiln-query-stats` header does not read as [`QueryStats`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryStatsError {
    #[error("{0:?} is not name=value")]
    NotNameValue(String),
    #[error("{name}: {value:?}: {source}")]
    Value {
        name: String,
        value: String,
        #[source]
        source: std::num::ParseIntError,
    },
}

impl std::str::FromStr for QueryStats {
    type Err = QueryStatsError;

    /// Reads what [`Display`](std::fmt::Display) writes (the `kiln-query-stats` header); names
    /// it does not know are skipped, so a newer server's header still reads.
    fn from_str(s: &str) -> std::result::Result<Self, QueryStatsError> {
        let mut out = Self::default();
        for pair in s.split_whitespace() {
            let (name, value) = pair
                .split_once('=')
                .ok_or_else(|| QueryStatsError::NotNameValue(pair.to_owned()))?;
            let value: u64 = value.parse().map_err(|source| QueryStatsError::Value {
                name: name.to_owned(),
                value: value.to_owned(),
                source,
            })?;
            match name {
                "blocks" => out.blocks = value,
                "blocks_cached" => out.blocks_cached = value,
                "bytes_read" => out.bytes_read = value,
                "rows_read" => out.rows_read = value,
                "rollup_ranges" => out.rollup_ranges = value,
                _ => {}
            }
        }
        Ok(out)
    }
}

/// What a query reported besides its answer.
#[derive(Debug, Default, Clone)]
pub struct QueryReport {
    /// Partial answers say so: a block quarantined and left out of the answer, say.
    pub warnings: Vec<String>,
    pub stats: QueryStats,
}

/// How a query may be answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueryOptions {
    /// Whether blocks the range covers whole may be answered from the partial-result cache
    /// (and their results kept there). A client sending `Cache-Control: no-store` turns it off.
    pub results_cache: bool,
}

impl Default for QueryOptions {
    fn default() -> Self {
        Self {
            results_cache: true,
        }
    }
}

/// The options and report of one query, shared by the tasks it runs.
type Shared = std::sync::Arc<std::sync::Mutex<(QueryOptions, QueryReport)>>;

tokio::task_local! {
    /// The options and report of the query running in this task (see [`with_report`]) and in
    /// the tasks it spawned for it ([`spawned`]).
    static REPORT: Shared;
}

/// The shared report, also when a task holding it panicked (the figures stay usable).
fn lock(r: &Shared) -> std::sync::MutexGuard<'_, (QueryOptions, QueryReport)> {
    r.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs a query, collecting its warnings and [`QueryStats`] so the caller can hand them to the
/// client. Reads outside such a scope (the compactor's) are counted only engine-wide.
pub async fn with_report<F: std::future::Future>(f: F) -> (F::Output, QueryReport) {
    with_options(QueryOptions::default(), f).await
}

/// [`with_report`] with `options`.
pub async fn with_options<F: std::future::Future>(
    options: QueryOptions,
    f: F,
) -> (F::Output, QueryReport) {
    let shared: Shared =
        std::sync::Arc::new(std::sync::Mutex::new((options, QueryReport::default())));
    let out = REPORT.scope(std::sync::Arc::clone(&shared), f).await;
    let report = std::mem::take(&mut lock(&shared).1);
    (out, report)
}

/// Runs `f` as a task of its own on the runtime (another worker thread can take it), counted
/// in the running query's report as it goes. Dropping the returned future aborts the task, so
/// a query that stops waiting (it failed, or its client went) leaves no work running.
pub(crate) async fn spawned<T: Send + 'static>(
    f: impl std::future::Future<Output = T> + Send + 'static,
) -> std::result::Result<T, tokio::task::JoinError> {
    use tracing::Instrument;
    struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);
    impl<T> Drop for AbortOnDrop<T> {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let task = match REPORT.try_with(std::sync::Arc::clone) {
        Ok(shared) => tokio::spawn(REPORT.scope(shared, f).in_current_span()),
        Err(_) => tokio::spawn(f.in_current_span()),
    };
    let mut task = AbortOnDrop(task);
    (&mut task.0).await
}

pub(crate) fn options() -> QueryOptions {
    REPORT.try_with(|r| lock(r).0).unwrap_or_default()
}

pub(crate) fn warn(message: String) {
    let _ = REPORT.try_with(|r| lock(r).1.warnings.push(message));
}

pub(crate) fn count(f: impl FnOnce(&mut QueryStats)) {
    let _ = REPORT.try_with(|r| f(&mut lock(r).1.stats));
}

/// Counts bytes read from the store, for the engine and for the query running in this task.
pub(crate) fn read_bytes(counters: &QueryCounters, n: u64) {
    counters.bytes_read.fetch_add(n, Ordering::Relaxed);
    count(|s| s.bytes_read += n);
}

/// Counters of the read path.
#[derive(Debug, Default)]
pub struct QueryCounters {
    /// Blocks quarantined because they could not be read.
    pub quarantined: AtomicU64,
    /// Bytes read from the object store by queries.
    pub bytes_read: AtomicU64,
    /// Series row ranges read from rollups rather than samples (ADR 0007).
    pub rollup_reads: AtomicU64,
    /// Symbol table cache lookups and misses (hit rate = 1 − misses ÷ lookups).
    pub symbols_lookups: AtomicU64,
    pub symbols_misses: AtomicU64,
    /// Parquet metadata cache lookups and misses.
    pub parquet_lookups: AtomicU64,
    pub parquet_misses: AtomicU64,
    /// Partial-result cache lookups and misses (a block's stack totals for a set of series).
    pub results_lookups: AtomicU64,
    pub results_misses: AtomicU64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_stats_read_back_what_they_write() {
        let stats = QueryStats {
            blocks: 3,
            blocks_cached: 2,
            bytes_read: 48_211,
            rows_read: 9_000,
            rollup_ranges: 16,
        };
        assert_eq!(stats.to_string().parse::<QueryStats>(), Ok(stats));
        assert_eq!(
            "blocks=1 newer_field=7".parse::<QueryStats>(),
            Ok(QueryStats {
                blocks: 1,
                ..QueryStats::default()
            })
        );
        assert!("blocks".parse::<QueryStats>().is_err());
        assert!("blocks=x".parse::<QueryStats>().is_err());
        assert_eq!(
            "blocks".parse::<QueryStats>(),
            Err(QueryStatsError::NotNameValue("blocks".into()))
        );
        assert!(matches!(
            "blocks=x".parse::<QueryStats>(),
            Err(QueryStatsError::Value { name, .. }) if name == "blocks"
        ));
    }

    /// What a scan task counts and warns reaches its query's report, also when the query
    /// stopped waiting for it; and a task the query stopped waiting for is aborted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn spawned_tasks_report_into_their_query_and_stop_with_it() {
        let (out, report) = with_report(async {
            let n = spawned(async {
                count(|s| s.blocks += 2);
                warn("block x quarantined".into());
                options().results_cache
            })
            .await
            .unwrap();
            // A task the query drops before it ends: it warns, then is aborted while waiting.
            let (started, release) = (tokio::sync::Notify::new(), tokio::sync::Notify::new());
            let (started, release) = (std::sync::Arc::new(started), std::sync::Arc::new(release));
            let (s, r) = (started.clone(), release.clone());
            let dropped = spawned(async move {
                warn("from a task dropped early".into());
                s.notify_one();
                r.notified().await;
                // Notified once its abort was asked for: this yield is where the abort acts.
                tokio::task::yield_now().await;
                count(|s| s.blocks += 100);
            });
            tokio::select! {
                _ = dropped => unreachable!("it waits for the release"),
                _ = started.notified() => {}
            }
            // The task is aborted (dropped above) before it is released; released while still
            // running (seen under load), it yields before counting, and the abort acts there.
            release.notify_waiters();
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            n
        })
        .await;
        assert!(out, "the query's options reach the task");
        assert_eq!(
            report.stats.blocks, 2,
            "the aborted task counted nothing after its abort"
        );
        assert_eq!(
            report.warnings,
            ["block x quarantined", "from a task dropped early"]
        );
    }
}
