//! The segment writer: one task per shard buffers profiles per tenant and flushes them once the
//! first of them has waited the flush interval, or sooner when the buffer passes the size limit
//! or the writes pause (for six times their mean gap, at least the linger: senders waiting for
//! their acknowledgements), or, after a flush, with the writes that queued up during it and came
//! within the linger after it (group commit), as one segment object holding every tenant's
//! dataset (one PUT per shard and flush). A write is answered only once the segment is in the
//! object store and all its datasets are registered in the metastore, in one
//! transaction; when either fails, every write of the flush is refused with the error's kind
//! (unavailable: the client may retry) and nothing of it is acknowledged — unless the object
//! store is what failed and the spool ([`crate::writer::spool`]) has room: then the segment is spooled
//! on local disk, the writes are acknowledged, and the spool's drainer (a task of this writer)
//! puts and registers it once the store answers again.
//!
//! With a write-ahead log ([`WriterConfig::log`], ADR 0018) the shards are [`logged`]'s
//! instead: a write that carries a record is acknowledged once the record is in the log, and
//! segments are cut by time, size and queries' barriers.

mod logged;
mod segment;
mod shard;

use shard::run_shard;
pub mod spool;
pub mod wal;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use kiln_otel::model::{LABEL_SERVICE_NAME, NormalizedProfile};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, error};

use crate::caches::Caches;
use crate::caches::barrier::{Buffered, Scope, ShardCut, WriteBarrier};
use crate::caches::unregistered::Unregistered;
use crate::clock::Clock;
use crate::metastore::Metastore;
use crate::store::ObjectStorage;
use crate::writer::spool::Spool;
use crate::{Error, ErrorKind, Result};

/// Switches for the tests.
#[cfg(feature = "testing")]
pub mod testing {
    /// A write of this tenant panics its shard (as a bug would), before it is logged.
    pub const PANICKING_TENANT: &str = "testing-panics-its-write-shard";
}

/// The earliest time a profile or sample may carry: 2000-01-01T00:00:00Z.
pub const MIN_TIME_NANOS: i64 = 946_684_800_000_000_000;
/// How far past now a profile or sample may reach (agents' clocks run ahead of Kiln's).
pub const MAX_FUTURE_NANOS: i64 = 24 * 3600 * 1_000_000_000;

/// Refuses a write whose profile or sample times fall outside
/// `[MIN_TIME_NANOS, now + MAX_FUTURE_NANOS]`: such data could be stored but never queried (a
/// query's range is milliseconds up to about now), so it must not be acknowledged.
pub fn check_times(profiles: &[NormalizedProfile], now_nanos: i64) -> Result<()> {
    let max = now_nanos.saturating_add(MAX_FUTURE_NANOS);
    let bad = |t: i64| !(MIN_TIME_NANOS..=max).contains(&t);
    for s in profiles.iter().flat_map(|p| &p.series) {
        let sample = s
            .samples
            .iter()
            .map(|x| x.timestamp_nanos)
            .find(|&t| t != 0 && bad(t));
        if let Some(t) = sample.or(bad(s.time_nanos).then_some(s.time_nanos)) {
            return Err(Error::InvalidWrite(format!(
                "time {t} ns is outside the range Kiln accepts (2000-01-01 to a day from now)"
            )));
        }
    }
    Ok(())
}

/// Writer settings.
#[derive(Debug, Clone)]
pub struct WriterConfig {
    /// Number of shards (writer tasks). One by default: a shard adds its writes and flushes
    /// its segments one at a time, and keeps up with about eight cores' worth of ingest; more
    /// shards split each flush's profiles into more, emptier segments (and every level of
    /// compaction into more blocks), which cost more to write, compact and store per row.
    /// `kiln serve` picks two for a remote object store, where each flush waits a PUT.
    pub shards: u32,
    /// Longest time a write waits before its buffer is flushed.
    pub flush_interval: Duration,
    /// A shard flushes as soon as its buffer passes this many bytes.
    pub flush_bytes: usize,
    /// After a flush, how long a shard waits for another write before it flushes the writes
    /// gathered meanwhile (never longer than `flush_interval` from the flush's end). Senders
    /// with a few requests in flight (an OpenTelemetry Collector's exporters, an SDK's
    /// uploader) answer an acknowledgement with their next request within a millisecond or
    /// two: gathered, they share one segment, and none waits out a new `flush_interval`.
    /// Zero flushes what queued during the flush at once. Also the shortest pause in the
    /// writes that ends a batch before `flush_interval` (where writes come fast enough that
    /// six of their mean gaps are shorter than the interval); zero: never.
    pub flush_linger: Duration,
    /// Time of segment ids (their metastore partition).
    pub clock: Clock,
    /// Acknowledge writes from a write-ahead log rather than from their segment (ADR 0018);
    /// none: every write waits for its segment.
    pub log: Option<LogConfig>,
}

/// Turns a write-ahead log record back into the write it was (ADR 0018): the tenant and its
/// normalized profiles, as the gateway made them from the request the record holds.
pub trait RecordDecoder: Send + Sync {
    fn decode(
        &self,
        record: &[u8],
    ) -> std::result::Result<(String, Vec<NormalizedProfile>), String>;
}

/// The write-ahead log's settings.
#[derive(Clone)]
pub struct LogConfig {
    /// `<data-dir>/wal`: a directory per shard, and the file naming the log ([`log_id`]).
    pub dir: PathBuf,
    /// The log's id, which with a shard number names its checkpoint in the metastore
    /// ([`log_id`]; set by [`crate::Storage`]).
    pub id: String,
    /// How often a shard cuts a segment of the writes it acknowledged from the log.
    pub segment_interval: Duration,
    /// A log file takes appends until it is about this large.
    pub max_file_bytes: u64,
    /// How long a group of records waits for more writes before it is appended and synced,
    /// while more are to be expected (writes announced by [`Writer::expect_write`], or the
    /// last group held several); zero appends a group as soon as no write waits in the
    /// shard's queue. Each `fdatasync` costs the server CPU besides the device's flush: at 32
    /// requests in flight `kiln bench`'s groups held about six records without waiting, and 2 ms
    /// halved the syncs (docs/performance.md, "Log group linger"). A write waits at most this
    /// much longer for its acknowledgement (tokio's timer rounds up to the next millisecond),
    /// and only under a concurrent load: a sender writing alone is not kept waiting.
    pub group_linger: Duration,
    pub decoder: Arc<dyn RecordDecoder>,
}

impl std::fmt::Debug for LogConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogConfig")
            .field("dir", &self.dir)
            .field("id", &self.id)
            .field("segment_interval", &self.segment_interval)
            .field("max_file_bytes", &self.max_file_bytes)
            .field("group_linger", &self.group_linger)
            .finish_non_exhaustive()
    }
}

impl LogConfig {
    /// Defaults in `dir`: a segment every second, files of 64 MiB, groups that wait 2 ms for
    /// writes under way.
    pub fn new(dir: impl Into<PathBuf>, decoder: Arc<dyn RecordDecoder>) -> Self {
        Self {
            dir: dir.into(),
            id: String::new(),
            segment_interval: Duration::from_secs(1),
            max_file_bytes: 64 << 20,
            group_linger: Duration::from_millis(2),
            decoder,
        }
    }
}

/// The id of the log in `dir` (made once, kept in `dir/id`): checkpoints are recorded under it
/// and a shard's number, so processes sharing a metastore keep theirs apart. Refuses a log that
/// holds records of more than `shards` shards (started with fewer shards than it was written
/// with: those records would not be replayed).
pub fn log_id(dir: &Path, shards: u32) -> Result<String> {
    std::fs::create_dir_all(dir).map_err(crate::error::io(dir))?;
    if let Some(shard) = shards_holding_records(dir)?
        .into_iter()
        .find(|s| *s >= shards)
    {
        return Err(Error::Config(format!(
            "the write-ahead log in {} holds records of shard {shard}: start with at least {} \
             shards to replay them",
            dir.display(),
            shard + 1
        )));
    }
    let path = dir.join("id");
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => return Ok(id.trim().to_owned()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(crate::error::io(&path)(e)),
    }
    let id = ulid::Ulid::generate().to_string();
    let tmp = dir.join("id.tmp");
    std::fs::write(&tmp, &id)
        .and_then(|()| std::fs::File::open(&tmp)?.sync_all())
        .and_then(|()| std::fs::rename(&tmp, &path))
        .and_then(|()| std::fs::File::open(dir)?.sync_all())
        .map_err(crate::error::io(&path))?;
    Ok(id)
}

/// The shards whose directories in the log `dir` hold records (none where `dir` is absent).
fn shards_holding_records(dir: &Path) -> Result<Vec<u32>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(crate::error::io(dir)(e)),
    };
    let mut shards = Vec::new();
    for entry in entries {
        let path = entry.map_err(crate::error::io(dir))?.path();
        let Some(shard) = path
            .file_name()
            .and_then(|n| n.to_str()?.parse::<u32>().ok())
        else {
            continue;
        };
        let holds = std::fs::read_dir(&path)
            .map_err(crate::error::io(&path))?
            .filter_map(|e| e.ok())
            .any(|e| e.path().extension().is_some_and(|x| x == "kwal"));
        if holds {
            shards.push(shard);
        }
    }
    Ok(shards)
}

/// How many shards the log in `dir` holds records of (the highest shard holding one, plus
/// one; 0 for an empty or absent log, or one that cannot be read: [`log_id`] says why).
pub fn log_shards(dir: &Path) -> u32 {
    shards_holding_records(dir)
        .ok()
        .and_then(|shards| shards.into_iter().max())
        .map_or(0, |s| s.saturating_add(1))
}

impl Default for WriterConfig {
    fn default() -> Self {
        Self {
            shards: 1,
            flush_interval: Duration::from_millis(50),
            flush_bytes: 32 << 20,
            flush_linger: Duration::from_millis(3),
            clock: Clock::default(),
            log: None,
        }
    }
}

type Ack = oneshot::Sender<Result<(), (ErrorKind, String)>>;

enum Command {
    Write {
        tenant: String,
        profiles: Vec<NormalizedProfile>,
        /// The write's write-ahead log record, where the gateway logs its format.
        record: Option<Vec<u8>>,
        /// Dropped once the shard has the write ([`Writer::expect_write`]).
        expected: Option<ExpectedWrite>,
        ack: Ack,
    },
    /// Cut and register what the shard buffers, and answer once it is registered.
    Flush {
        done: oneshot::Sender<()>,
    },
    /// A query's barrier: cut what the shard buffers into a segment its queries can read
    /// ([`Unregistered`]), and answer before it is registered.
    Barrier {
        done: oneshot::Sender<()>,
    },
    Close {
        done: oneshot::Sender<()>,
    },
    /// The oldest pending write has waited the flush interval (internal to a shard's loop).
    Tick,
}

/// Handle to the shard tasks.
#[derive(Debug, Clone)]
pub struct Writer {
    shards: Vec<mpsc::Sender<Command>>,
    /// Per shard, whether it buffers writes it acknowledged from its log (a barrier cuts them).
    buffered: Vec<Arc<Buffered>>,
    /// Per logged shard, answered once its log is open and replayed ([`Writer::ready`]).
    ready: Arc<std::sync::Mutex<Vec<oneshot::Receiver<Result<()>>>>>,
    logged: bool,
    tasks: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    drainer: Arc<std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>>,
    ctx: Arc<FlushContext>,
}

impl std::fmt::Debug for FlushContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlushContext").finish_non_exhaustive()
    }
}

/// Puts what the spool holds into the store, if anything; a store still down is tried again
/// next time.
async fn drain_spool(ctx: &FlushContext) {
    let Some(spool) = &ctx.spool else {
        return;
    };
    if spool.is_empty() {
        return;
    }
    match spool.drain(&ctx.store, ctx.metastore.as_ref()).await {
        Ok(n) if n > 0 => {
            tracing::info!(segments = n, "spooled segments drained to the object store")
        }
        Ok(_) => {}
        Err(e) => debug!(error = %e, "the spool waits: the object store is still unreachable"),
    }
    ctx.store.metrics().spool_bytes.set(spool.bytes() as i64);
}

struct FlushContext {
    store: ObjectStorage,
    metastore: Arc<dyn Metastore>,
    clock: Clock,
    spool: Option<Arc<Spool>>,
    /// The query engine whose symbol cache gets each registered segment's symbols (where this
    /// process answers queries).
    warm: Option<Caches>,
    /// Segments a logged shard built and has not registered yet, read by this process's
    /// queries ([`Unregistered`]).
    unregistered: Arc<Unregistered>,
    /// Writes on their way to a shard ([`Writer::expect_write`]).
    expected: Arc<Expected>,
    /// How many ingest processes share the cluster's writes ([`Writer::scale_segment_interval`]).
    interval_scale: AtomicU32,
}

/// The longest a scaled segment interval grows to ([`Writer::scale_segment_interval`]), unless
/// the interval itself is longer: it bounds how late a query process sees a write.
pub const MAX_SCALED_SEGMENT_INTERVAL: Duration = Duration::from_secs(5);

/// A logged shard's segment interval when `processes` ingest processes share the cluster's
/// writes: `interval` × `processes`, at most [`MAX_SCALED_SEGMENT_INTERVAL`] (or `interval`
/// where that is longer).
pub fn scaled_segment_interval(interval: Duration, processes: u32) -> Duration {
    let scaled = interval.saturating_mul(processes.max(1));
    scaled.min(MAX_SCALED_SEGMENT_INTERVAL.max(interval))
}

/// The count of writes on their way to a shard, and a wake-up for the shards when it falls to
/// zero.
#[derive(Debug, Default)]
struct Expected {
    count: AtomicUsize,
    none: tokio::sync::Notify,
}

/// A write on its way to the writer, from its request's start until a shard has it
/// ([`Writer::expect_write`]): while any is, a logged shard holding records lets its group wait
/// up to [`LogConfig::group_linger`] for more before it appends and syncs them (PostgreSQL's
/// `commit_delay` with `commit_siblings`, counted by the writes under way; the shard also
/// waits after a group of several writes). Dropping it (the request refused, or its write
/// handed over) ends the expectation.
#[derive(Debug)]
pub struct ExpectedWrite(Arc<Expected>);

impl Drop for ExpectedWrite {
    fn drop(&mut self) {
        // The last one (a request refused, or a write handed over): a group waiting for it
        // goes now.
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.none.notify_waiters();
        }
    }
}

/// How often the drainer looks at the spool.
const DRAIN_INTERVAL: Duration = Duration::from_secs(1);

impl Writer {
    /// Starts the shard tasks.
    pub fn start(
        config: &WriterConfig,
        store: ObjectStorage,
        metastore: Arc<dyn Metastore>,
        spool: Option<Arc<Spool>>,
        warm: Option<Caches>,
    ) -> Self {
        let ctx = Arc::new(FlushContext {
            store,
            metastore,
            clock: config.clock.clone(),
            spool,
            warm,
            unregistered: Arc::default(),
            expected: Arc::default(),
            interval_scale: AtomicU32::new(1),
        });
        let mut tasks = Vec::new();
        let drainer = ctx.spool.as_ref().map(|_| {
            let ctx = Arc::clone(&ctx);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(DRAIN_INTERVAL).await;
                    drain_spool(&ctx).await;
                }
            })
        });
        let mut buffered = Vec::new();
        let mut ready = Vec::new();
        let shards = (0..config.shards.max(1))
            .map(|shard| {
                let (tx, rx) = mpsc::channel(1024);
                let flag = Arc::new(Buffered::default());
                buffered.push(Arc::clone(&flag));
                let ctx = Arc::clone(&ctx);
                let answer = config.log.is_some().then(|| {
                    let (answer, wait) = oneshot::channel();
                    ready.push(wait);
                    answer
                });
                let task = tokio::spawn(supervise(shard, rx, ctx, config.clone(), flag, answer));
                tasks.push(task);
                tx
            })
            .collect();
        let writer = Self {
            shards,
            buffered,
            ready: Arc::new(std::sync::Mutex::new(ready)),
            logged: config.log.is_some(),
            tasks: Arc::new(std::sync::Mutex::new(tasks)),
            drainer: Arc::new(std::sync::Mutex::new(drainer)),
            ctx,
        };
        if writer.logged
            && let Some(query) = &writer.ctx.warm
        {
            query.set_write_barrier(writer.barrier_handle());
        }
        writer
    }

    /// Tells the logged shards how many ingest processes share the cluster's writes (the
    /// gateway sets it from membership; 1 alone). Each then cuts a segment every
    /// [`scaled_segment_interval`]: a process that takes a third of the writes cuts a third as
    /// often, so the cluster writes about as many segments a second as one process would. Each
    /// segment costs symbols, a Parquet writer, a PUT, a metastore commit and a share of an L0
    /// merge whatever its size: three ingest processes at the unscaled interval spent 1.4× the
    /// CPU a byte of one (docs/performance.md, "Segment cadence in a cluster").
    pub fn scale_segment_interval(&self, processes: u32) {
        self.ctx
            .interval_scale
            .store(processes.max(1), Ordering::Relaxed);
    }

    /// Drains the spool now (tests; the drainer does it every second).
    pub async fn drain_spool(&self) {
        drain_spool(&self.ctx).await;
    }

    /// Waits until every shard has opened its write-ahead log and registered what it replayed
    /// (at once without a log); the first error, if any. Answers once.
    pub async fn ready(&self) -> Result<()> {
        let waits = std::mem::take(&mut *self.ready.lock().expect("ready lock"));
        for wait in waits {
            wait.await.map_err(|_| Error::ShuttingDown)??;
        }
        Ok(())
    }

    /// Whether writes are acknowledged from a write-ahead log (and so take a record).
    pub fn logs_writes(&self) -> bool {
        self.logged
    }

    /// Cuts a segment of every write a shard acknowledged from its log and still buffers, and
    /// waits until it and every segment before it are registered: what reads the metastore
    /// next (a deletion, the bytes stored) sees every write acknowledged before this call.
    /// Nothing to do without a log. (A query's barrier does not wait for the registration:
    /// [`WriteBarrier`].)
    pub async fn barrier(&self) {
        if self.logged {
            self.flush().await;
        }
    }

    fn barrier_handle(&self) -> WriteBarrier {
        let shards = self
            .shards
            .iter()
            .zip(&self.buffered)
            .map(|(queue, buffered)| {
                Arc::new(ShardHandle {
                    queue: queue.downgrade(),
                    buffered: Arc::clone(buffered),
                    cuts: self.ctx.store.metrics().barrier_cuts.clone(),
                }) as Arc<dyn ShardCut>
            })
            .collect();
        WriteBarrier::new(shards, Arc::clone(&self.ctx.unregistered))
    }

    /// Writes profiles of one request and waits until all are durable. They land in the same
    /// block, so they are stored all together or not at all.
    pub async fn write(&self, tenant: &str, profiles: Vec<NormalizedProfile>) -> Result<()> {
        self.write_logged(tenant, profiles, None, None).await
    }

    /// Announces a write that is coming (its request has started), until the
    /// returned guard is dropped or handed to [`Writer::write_logged`]: a logged shard lets a
    /// group of records wait briefly for the writes under way, so that one `fdatasync`
    /// acknowledges more of them.
    pub fn expect_write(&self) -> ExpectedWrite {
        self.ctx.expected.count.fetch_add(1, Ordering::AcqRel);
        ExpectedWrite(Arc::clone(&self.ctx.expected))
    }

    /// Like [`Writer::write`]; with a write-ahead log, `record` (the request the profiles were
    /// decoded from, [`RecordDecoder`]) is appended to it and the write is acknowledged once the
    /// log is synced. Without a record, or without a log, the write waits for its segment.
    /// `expected`: this write's [`Writer::expect_write`], dropped once its shard has it.
    #[tracing::instrument(name = "storage.write", skip_all, fields(tenant = %tenant, profiles = profiles.len()))]
    pub async fn write_logged(
        &self,
        tenant: &str,
        profiles: Vec<NormalizedProfile>,
        record: Option<Vec<u8>>,
        expected: Option<ExpectedWrite>,
    ) -> Result<()> {
        check_times(&profiles, crate::clock::now_ms() as i64 * 1_000_000)?;
        let Some(first) = profiles.iter().find_map(|p| p.series.first()) else {
            return Ok(());
        };
        let service = first.labels.get(LABEL_SERVICE_NAME).unwrap_or_default();
        let key = xxhash_rust::xxh3::xxh3_64(format!("{tenant}\0{service}").as_bytes());
        let shard = &self.shards[(key % self.shards.len() as u64) as usize];
        let (ack, done) = oneshot::channel();
        shard
            .send(Command::Write {
                tenant: tenant.to_owned(),
                profiles,
                record: record.filter(|_| self.logged),
                expected,
                ack,
            })
            .await
            .map_err(|_| Error::ShuttingDown)?;
        done.await
            .map_err(|_| Error::Unanswered)?
            .map_err(|(kind, message)| Error::Flush { kind, message })
    }

    /// Flushes every shard now and waits for it.
    pub async fn flush(&self) {
        let mut waits = Vec::new();
        for shard in &self.shards {
            let (done, wait) = oneshot::channel();
            if shard.send(Command::Flush { done }).await.is_ok() {
                waits.push(wait);
            }
        }
        for w in waits {
            let _ = w.await;
        }
    }

    /// Flushes every shard and stops the shard tasks; later writes fail with
    /// [`Error::ShuttingDown`]. Returns once every task has exited (and released the metastore).
    pub async fn close(&self) {
        for shard in &self.shards {
            let (done, wait) = oneshot::channel();
            if shard.send(Command::Close { done }).await.is_ok() {
                let _ = wait.await;
            }
        }
        let tasks = std::mem::take(&mut *self.tasks.lock().expect("writer tasks lock"));
        for t in tasks {
            let _ = t.await;
        }
        // The spool stays on disk: the next process drains it.
        let drainer = self.drainer.lock().expect("drainer lock").take();
        if let Some(d) = drainer {
            d.abort();
            // Awaited, so its hold on the metastore is gone when `close` returns.
            let _ = d.await;
        }
    }
}

/// What the write barrier holds of one shard: its queue (weakly: the writer's own handles keep
/// it open) and whether it buffers writes acknowledged from its log.
struct ShardHandle {
    queue: mpsc::WeakSender<Command>,
    buffered: Arc<Buffered>,
    /// `kiln_storage_barrier_cuts_total`.
    cuts: prometheus_client::metrics::counter::Counter,
}

impl ShardCut for ShardHandle {
    fn cut(&self, scope: Option<Scope<'_>>) -> BoxFuture<'_, Option<oneshot::Receiver<()>>> {
        let wanted = match scope {
            Some(scope) => self.buffered.holds(scope),
            None => self.buffered.any(),
        };
        Box::pin(async move {
            if !wanted {
                return None;
            }
            let queue = self.queue.upgrade()?;
            let (done, wait) = oneshot::channel();
            queue.send(Command::Barrier { done }).await.ok()?;
            self.cuts.inc();
            Some(wait)
        })
    }
}

/// How many times a shard that panics is started again before it is left stopped.
const SHARD_RESTARTS: u32 = 5;

/// Runs a shard's loop ([`run_shard`], or [`logged::run`] with a log) and starts it again
/// when it panics (a bug), up to [`SHARD_RESTARTS`] times; past that, its writes are refused
/// (503) until the process restarts. A panic drops what the shard held: writes it had not
/// acknowledged are answered with an error (the client retries), and with a log the restarted
/// shard replays the log above its checkpoint, as a start after a crash does, so the writes it
/// had acknowledged from the log are registered again, once.
async fn supervise(
    shard: u32,
    mut rx: mpsc::Receiver<Command>,
    ctx: Arc<FlushContext>,
    config: WriterConfig,
    buffered: Arc<Buffered>,
    mut ready: Option<oneshot::Sender<Result<()>>>,
) {
    use futures::FutureExt;
    let mut panics = 0u32;
    loop {
        let run = async {
            if config.log.is_some() {
                // At a restart nothing waits for the shard to be ready.
                let answer = ready.take().unwrap_or_else(|| oneshot::channel().0);
                let buffered = Arc::clone(&buffered);
                logged::run(
                    shard,
                    &mut rx,
                    Arc::clone(&ctx),
                    config.clone(),
                    buffered,
                    answer,
                )
                .await;
            } else {
                run_shard(shard, &mut rx, Arc::clone(&ctx), config.clone()).await;
            }
        };
        let Err(panic) = std::panic::AssertUnwindSafe(run).catch_unwind().await else {
            return;
        };
        panics += 1;
        ctx.store.metrics().shard_panics.inc();
        let message = panic
            .downcast_ref::<&str>()
            .map(|m| m.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        // Its segments not yet registered go with it: the restart replays their writes.
        ctx.unregistered.remove_shard(shard).await;
        buffered.clear();
        if panics > SHARD_RESTARTS {
            error!(shard, panics, panic = %message,
                "a write shard panicked again; it is not started again, and its writes are \
                 refused until the process restarts");
            return;
        }
        error!(shard, panics, panic = %message,
            "a write shard panicked; starting it again (the writes it had not acknowledged are \
             refused)");
    }
}
