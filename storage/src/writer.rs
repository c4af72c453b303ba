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
pub mod spool;
pub mod wal;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kiln_otel::model::{LABEL_SERVICE_NAME, NormalizedProfile};
use tokio::sync::{mpsc, oneshot};
use tracing::{Instrument, debug, error};

use parquet::arrow::arrow_reader::ArrowReaderMetadata;

use crate::caches::unregistered::Unregistered;
use crate::format::block::{DatasetBuilder, DatasetCapacity, assemble_object};
use crate::format::meta::{BlockMeta, Clock, object_path};
use crate::format::symbols::SymbolTable;
use crate::metastore::{LogCheckpoint, Metastore};
use crate::metrics::OutcomeLabels;
use crate::query::QueryEngine;
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
    /// requests in flight `kiln bench`'s groups held ~7 records without waiting, and 2 ms
    /// halved the syncs (docs/performance.md, 2026-11-30, sixth). A write waits at most this
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
    for entry in std::fs::read_dir(dir).map_err(crate::error::io(dir))? {
        let path = entry.map_err(crate::error::io(dir))?.path();
        let shard = path
            .file_name()
            .and_then(|n| n.to_str()?.parse::<u32>().ok());
        let Some(shard) = shard.filter(|s| *s >= shards) else {
            continue;
        };
        let holds = std::fs::read_dir(&path)
            .map_err(crate::error::io(&path))?
            .filter_map(|e| e.ok())
            .any(|e| e.path().extension().is_some_and(|x| x == "kwal"));
        if holds {
            return Err(Error::Config(format!(
                "the write-ahead log in {} holds records of shard {shard}: start with at least \
                 {} shards to replay them",
                dir.display(),
                shard + 1
            )));
        }
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
    buffered: Vec<Arc<AtomicBool>>,
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
    warm: Option<QueryEngine>,
    /// Segments a logged shard built and has not registered yet, read by this process's
    /// queries ([`Unregistered`]).
    unregistered: Arc<Unregistered>,
    /// Writes on their way to a shard ([`Writer::expect_write`]).
    expected: Arc<Expected>,
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
        warm: Option<QueryEngine>,
    ) -> Self {
        let ctx = Arc::new(FlushContext {
            store,
            metastore,
            clock: config.clock.clone(),
            spool,
            warm,
            unregistered: Arc::default(),
            expected: Arc::default(),
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
                let flag = Arc::new(AtomicBool::new(false));
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
        WriteBarrier {
            shards: self
                .shards
                .iter()
                .map(mpsc::Sender::downgrade)
                .zip(self.buffered.iter().cloned())
                .collect(),
            unregistered: Arc::clone(&self.ctx.unregistered),
        }
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
        check_times(&profiles, crate::query::now_ms() as i64 * 1_000_000)?;
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

/// What a query engine holds of the writer in its process: the shards' queues (weakly: the
/// writer's own handles keep them open), their buffered flags, and the segments built and not
/// yet registered.
#[derive(Debug, Clone)]
pub(crate) struct WriteBarrier {
    shards: Vec<(mpsc::WeakSender<Command>, Arc<AtomicBool>)>,
    unregistered: Arc<Unregistered>,
}

impl WriteBarrier {
    /// Has every shard that buffers writes cut them into a segment, and waits for the cuts
    /// (not their registration): every write acknowledged before this call is then in a
    /// registered block or in [`Self::unregistered`].
    pub(crate) async fn wait(&self) {
        let mut waits = Vec::new();
        for (shard, buffered) in &self.shards {
            if !buffered.load(Ordering::Acquire) {
                continue;
            }
            let Some(shard) = shard.upgrade() else {
                continue;
            };
            let (done, wait) = oneshot::channel();
            if shard.send(Command::Barrier { done }).await.is_ok() {
                waits.push(wait);
            }
        }
        for w in waits {
            let _ = w.await;
        }
    }

    /// The segments built and not yet registered.
    pub(crate) fn unregistered(&self) -> &Unregistered {
        &self.unregistered
    }
}

struct Pending {
    builder: DatasetBuilder,
    acks: Vec<Ack>,
}

/// Per tenant, what its dataset held at the shard's last flush
/// ([`DatasetBuilder::capacity_hint`]); the tenant's next dataset starts with room for as much.
/// A tenant absent from a flush loses its hint.
type Hints = BTreeMap<String, DatasetCapacity>;

/// Adds a write to the shard's buffer, with the acknowledgement that waits for its segment
/// (none for a write acknowledged from the log); returns the bytes it added.
fn buffer(
    pending: &mut BTreeMap<String, Pending>,
    hints: &Hints,
    tenant: String,
    profiles: &[NormalizedProfile],
    ack: Option<Ack>,
) -> usize {
    #[cfg(feature = "testing")]
    if tenant == testing::PANICKING_TENANT {
        panic!("a write shard's panic, injected by a test");
    }
    let p = pending.entry(tenant.clone()).or_insert_with(|| {
        // Looked up once per tenant and flush, when its dataset starts.
        let hint = hints.get(&tenant).copied().unwrap_or_default();
        Pending {
            builder: DatasetBuilder::with_capacity(tenant, hint),
            acks: Vec::new(),
        }
    });
    let before = p.builder.estimated_bytes();
    for profile in profiles {
        p.builder.add(profile);
    }
    p.acks.extend(ack);
    p.builder.estimated_bytes().saturating_sub(before)
}

/// A shard's loop. A write waits at most `flush_interval` (from the first write of a batch),
/// until the buffer passes `flush_bytes`, or until the writes pause ([`Arrivals`]). Flushes
/// run one at a time, and writes that arrive during one, or within `flush_linger` of each
/// other after it, are flushed together without waiting another interval (group commit):
/// under load, acknowledgements follow the flushes back to back.
async fn run_shard(
    shard: u32,
    rx: &mut mpsc::Receiver<Command>,
    ctx: Arc<FlushContext>,
    config: WriterConfig,
) {
    let mut pending: BTreeMap<String, Pending> = BTreeMap::new();
    let mut hints = Hints::new();
    let mut size = 0usize;
    // When the oldest buffered write has waited `flush_interval`.
    let mut flush_at: Option<tokio::time::Instant> = None;
    // When the writes have paused long enough that the batch is taken as complete.
    let mut quiet_at: Option<tokio::time::Instant> = None;
    let mut arrivals = Arrivals::new(&config);
    loop {
        let cmd = next_command(rx, flush_at, quiet_at).await;
        match cmd {
            Some(Command::Write {
                tenant,
                profiles,
                ack,
                ..
            }) => {
                size += buffer(&mut pending, &hints, tenant, &profiles, Some(ack));
                let now = tokio::time::Instant::now();
                flush_at.get_or_insert(now + config.flush_interval);
                quiet_at = arrivals.arrive(now).map(|quiet| now + quiet);
            }
            Some(Command::Tick) => {}
            Some(Command::Flush { done } | Command::Barrier { done }) => {
                flush(shard, &ctx, &mut pending, &mut hints).await;
                (size, flush_at, quiet_at) = (0, None, None);
                let _ = done.send(());
                continue;
            }
            None | Some(Command::Close { .. }) => {
                flush(shard, &ctx, &mut pending, &mut hints).await;
                rx.close();
                if let Some(Command::Close { done }) = cmd {
                    let _ = done.send(());
                }
                return;
            }
        }
        let now = tokio::time::Instant::now();
        let due = flush_at.is_some_and(|at| at <= now) || quiet_at.is_some_and(|at| at <= now);
        if !due && size < config.flush_bytes {
            continue;
        }
        // Group commit: flush, then take what queued up meanwhile and flush it at once, until
        // nothing waits.
        loop {
            flush(shard, &ctx, &mut pending, &mut hints).await;
            (size, flush_at, quiet_at) = (0, None, None);
            let mut control = None;
            // The writers this flush answered send their next writes within moments: gather
            // them until none comes for the linger (at most a flush interval), rather than
            // flushing the first of them alone or leaving them to wait out a new interval.
            let cap = tokio::time::Instant::now() + config.flush_interval;
            while size < config.flush_bytes {
                let next = match rx.try_recv() {
                    Ok(cmd) => Some(cmd),
                    Err(mpsc::error::TryRecvError::Empty) if !config.flush_linger.is_zero() => {
                        let until = (tokio::time::Instant::now() + config.flush_linger).min(cap);
                        // Quiet for the linger: `None`, flush.
                        tokio::time::timeout_at(until, rx.recv())
                            .await
                            .ok()
                            .flatten()
                    }
                    Err(_) => None,
                };
                match next {
                    Some(Command::Write {
                        tenant,
                        profiles,
                        ack,
                        ..
                    }) => {
                        arrivals.arrive(tokio::time::Instant::now());
                        size += buffer(&mut pending, &hints, tenant, &profiles, Some(ack));
                        // `try_recv` never yields: under load hundreds of writes queue here,
                        // and the worker's other tasks (queries) would wait for all of them.
                        tokio::task::consume_budget().await;
                    }
                    Some(other) => {
                        control = Some(other);
                        break;
                    }
                    None => break,
                }
            }
            match control {
                Some(Command::Flush { done } | Command::Barrier { done }) => {
                    flush(shard, &ctx, &mut pending, &mut hints).await;
                    size = 0;
                    let _ = done.send(());
                }
                Some(Command::Close { done }) => {
                    flush(shard, &ctx, &mut pending, &mut hints).await;
                    rx.close();
                    let _ = done.send(());
                    return;
                }
                Some(Command::Write { .. } | Command::Tick) | None => {}
            }
            if pending.is_empty() {
                break;
            }
        }
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
    buffered: Arc<AtomicBool>,
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
        buffered.store(false, Ordering::Release);
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

/// A shard's next command, or [`Command::Tick`] at the earlier of two deadlines (none: wait
/// for a command).
async fn next_command(
    rx: &mut mpsc::Receiver<Command>,
    a: Option<tokio::time::Instant>,
    b: Option<tokio::time::Instant>,
) -> Option<Command> {
    let wake = match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    match wake {
        None => rx.recv().await,
        Some(at) => tokio::select! {
            cmd = rx.recv() => cmd,
            () = tokio::time::sleep_until(at) => Some(Command::Tick),
        },
    }
}

/// How a shard's writes arrive: the mean gap between them, to tell a batch that is complete
/// (its senders all wait for their acknowledgements) from a pause in a steady stream.
struct Arrivals {
    last: Option<tokio::time::Instant>,
    /// Moving mean of the gaps, in seconds (each gap at most a flush interval).
    mean_gap: f64,
    linger: Duration,
    interval: Duration,
}

impl Arrivals {
    /// A pause this many mean gaps long ends a batch: writes that arrive independently of
    /// each other (many agents, each on its own timer) pause that long once in about 400
    /// gaps, so their batches still fill a flush interval.
    const QUIET_GAPS: f64 = 6.0;

    fn new(config: &WriterConfig) -> Self {
        Self {
            last: None,
            mean_gap: config.flush_interval.as_secs_f64(),
            linger: config.flush_linger,
            interval: config.flush_interval,
        }
    }

    /// Counts a write arriving at `now`; returns how long a pause after it ends the batch, if
    /// shorter than the flush interval (never without a linger).
    fn arrive(&mut self, now: tokio::time::Instant) -> Option<Duration> {
        if let Some(last) = self.last.replace(now) {
            let gap = now.duration_since(last).min(self.interval).as_secs_f64();
            self.mean_gap += 0.1 * (gap - self.mean_gap);
        }
        let quiet = self
            .linger
            .max(Duration::from_secs_f64(Self::QUIET_GAPS * self.mean_gap));
        (!self.linger.is_zero() && quiet < self.interval).then_some(quiet)
    }
}

async fn flush(
    shard: u32,
    ctx: &FlushContext,
    pending: &mut BTreeMap<String, Pending>,
    hints: &mut Hints,
) {
    let pending = std::mem::take(pending);
    if pending.is_empty() {
        return;
    }
    *hints = pending
        .iter()
        .map(|(tenant, p)| (tenant.clone(), p.builder.capacity_hint()))
        .collect();
    let span = tracing::info_span!(
        "storage.flush",
        shard,
        tenants = pending.len(),
        writes = tracing::field::Empty,
        rows = tracing::field::Empty,
        bytes = tracing::field::Empty,
    );
    flush_pending(shard, ctx, pending).instrument(span).await;
}

/// Writes one flush's pending datasets and answers the writes waiting for it.
async fn flush_pending(shard: u32, ctx: &FlushContext, pending: BTreeMap<String, Pending>) {
    let span = tracing::Span::current();
    let started = Instant::now();
    let (builders, acks): (Vec<DatasetBuilder>, Vec<Vec<Ack>>) =
        pending.into_values().map(|p| (p.builder, p.acks)).unzip();
    span.record("writes", acks.iter().map(Vec::len).sum::<usize>());
    let result = flush_segment(shard, ctx, builders).await;
    match &result {
        Ok(Some(flushed)) => observe_flush(ctx, started, Ok(flushed)),
        Ok(None) => {}
        Err(e) => observe_flush(ctx, started, Err(e)),
    }
    let result = result.map(|_| ()).map_err(|e| (e.kind(), e.to_string()));
    for ack in acks.into_iter().flatten() {
        let _ = ack.send(result.clone());
    }
}

/// Counts a flush's outcome in the metrics, logs it, and records it in the flush's span.
fn observe_flush(ctx: &FlushContext, started: Instant, outcome: Result<&Flushed, &Error>) {
    let metrics = ctx.store.metrics();
    let span = tracing::Span::current();
    match outcome {
        Ok(f) => {
            span.record("rows", f.rows).record("bytes", f.bytes);
            metrics
                .flush_duration
                .observe(started.elapsed().as_secs_f64());
            metrics.flush_bytes.observe(f.bytes as f64);
            metrics.flush_rows.inc_by(f.rows);
            let outcome = if f.spooled { "spooled" } else { "ok" };
            metrics
                .flushes
                .get_or_create(&OutcomeLabels { outcome })
                .inc();
            debug!(
                segment = %f.id, tenants = f.tenants, rows = f.rows, bytes = f.bytes,
                spooled = f.spooled, elapsed_ms = started.elapsed().as_millis() as u64,
                "segment flushed"
            );
        }
        Err(e) => {
            metrics
                .flushes
                .get_or_create(&OutcomeLabels { outcome: "error" })
                .inc();
            error!(error = %e, "segment flush failed");
        }
    }
}

/// What a flush wrote.
struct Flushed {
    id: String,
    tenants: usize,
    rows: u64,
    bytes: usize,
    /// The object store was unreachable: the segment waits in the spool.
    spooled: bool,
}

/// A segment built from a flush's datasets, not yet in the store and the metastore.
struct Built {
    path: String,
    object: bytes::Bytes,
    metas: Vec<BlockMeta>,
    /// What the query engine's caches get of each block before it is visible (taken by the
    /// first attempt to register it).
    warmed: Vec<(Arc<SymbolTable>, Option<ArrowReaderMetadata>)>,
    flushed: Flushed,
}

/// Encodes every tenant's dataset of one flush as one segment object (none when they hold
/// nothing).
/// `logs`: where the shard's write-ahead log stands once the segment holds what it buffered
/// (none for a shard without a log), written into the segment's footer.
async fn build_segment(
    shard: u32,
    ctx: &FlushContext,
    builders: Vec<DatasetBuilder>,
    logs: Vec<LogCheckpoint>,
) -> Result<Option<Built>> {
    let builders: Vec<DatasetBuilder> = builders.into_iter().filter(|b| !b.is_empty()).collect();
    if builders.is_empty() {
        return Ok(None);
    }
    let id =
        ulid::Ulid::from_parts(ctx.clock.now_ms(), ulid::Ulid::generate().random()).to_string();
    let id_for_task = id.clone();
    let warm = ctx.warm.is_some();
    let (object, metas, warmed) = tokio::task::spawn_blocking(move || -> Result<_> {
        let mut datasets = builders
            .into_iter()
            .map(DatasetBuilder::finish)
            .collect::<Result<Vec<_>>>()?;
        for d in &mut datasets {
            d.meta.logs = logs.clone();
        }
        // What a query reads first of each block, as it would read it (the metadata left to
        // the first query should it not parse: the segment is written all the same).
        let warmed = if warm {
            datasets
                .iter()
                .map(|d| {
                    let metadata = QueryEngine::samples_metadata(&d.samples).ok();
                    (Arc::clone(&d.table), metadata)
                })
                .collect()
        } else {
            Vec::new()
        };
        let (object, metas) = assemble_object(&id_for_task, shard, 0, datasets);
        Ok((object, metas, warmed))
    })
    .await
    .map_err(|e| Error::Task(e.to_string()))??;
    let flushed = Flushed {
        bytes: object.len(),
        rows: metas.iter().map(|m| m.rows).sum(),
        tenants: metas.len(),
        id: id.clone(),
        spooled: false,
    };
    Ok(Some(Built {
        path: object_path(0, shard, "", &id),
        object,
        metas,
        warmed,
        flushed,
    }))
}

/// Puts a built segment into the object store (or, when `spool` and the store is
/// unreachable, into the spool: its datasets are registered once drained) and registers its
/// datasets, with `checkpoint` when given, in one metastore transaction. May be tried again
/// with the same segment: the same object goes to the same path.
async fn publish_segment(
    ctx: &FlushContext,
    built: &mut Built,
    spool: bool,
    checkpoint: Option<&LogCheckpoint>,
) -> Result<()> {
    match ctx
        .store
        .put_durable(&built.path, built.object.clone())
        .await
    {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::Unavailable && spool && ctx.spool.is_some() => {
            let spool = ctx.spool.as_ref().expect("checked");
            spool
                .append(built.object.clone())
                .await
                .inspect_err(|_| error!(error = %e, "the object store is unreachable"))?;
            ctx.store.metrics().spool_bytes.set(spool.bytes() as i64);
            built.flushed.spooled = true;
            return Ok(());
        }
        Err(e) => return Err(e),
    }
    warm(ctx, built).await;
    match checkpoint {
        None => ctx.metastore.add_blocks(built.metas.clone()).await,
        Some(c) => {
            ctx.metastore
                .add_blocks_checkpointed(built.metas.clone(), c)
                .await
        }
    }
}

/// Gives the query engine what it reads first of a segment's blocks, before they are visible:
/// a query that finds them finds their symbols cached. Once per segment.
async fn warm(ctx: &FlushContext, built: &mut Built) {
    if let Some(query) = &ctx.warm {
        for (meta, (table, metadata)) in built.metas.iter().zip(std::mem::take(&mut built.warmed)) {
            query.warm_object(meta, &built.object);
            query.warm_symbols(meta, table).await;
            if let Some(metadata) = metadata {
                query.warm_samples_metadata(meta, metadata).await;
            }
        }
    }
}

/// Writes every tenant's dataset of one flush as one segment object, then registers all of
/// them in one metastore transaction; or spools the segment when the store is unreachable.
async fn flush_segment(
    shard: u32,
    ctx: &FlushContext,
    builders: Vec<DatasetBuilder>,
) -> Result<Option<Flushed>> {
    let Some(mut built) = build_segment(shard, ctx, builders, Vec::new()).await? else {
        return Ok(None);
    };
    publish_segment(ctx, &mut built, true, None).await?;
    Ok(Some(built.flushed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrivals(linger_ms: u64) -> Arrivals {
        Arrivals::new(&WriterConfig {
            flush_linger: Duration::from_millis(linger_ms),
            ..WriterConfig::default()
        })
    }

    /// Feeds writes `gap` apart; returns the pause that would end the batch after the last.
    fn steady(a: &mut Arrivals, gap: Duration, writes: u32) -> Option<Duration> {
        let t0 = tokio::time::Instant::now();
        (0..writes).fold(None, |_, i| a.arrive(t0 + gap * i))
    }

    #[test]
    fn a_pause_ends_a_batch_only_where_writes_come_fast() {
        // A shard's first write: nothing known, the flush interval governs.
        let mut a = arrivals(3);
        assert_eq!(a.arrive(tokio::time::Instant::now()), None);
        // Writes a millisecond apart (senders answering their acknowledgements): six gaps'
        // pause ends the batch.
        let quiet = steady(&mut a, Duration::from_millis(1), 100).expect("a pause");
        assert!(
            quiet >= Duration::from_millis(5) && quiet < Duration::from_millis(8),
            "{quiet:?}"
        );
        // Never shorter than the linger.
        let mut a = arrivals(20);
        assert_eq!(
            steady(&mut a, Duration::from_millis(1), 100),
            Some(Duration::from_millis(20))
        );
        // Writes 20 ms apart (agents on their own timers, 50 a second): a pause that long is
        // no sign the batch is complete; the flush interval governs.
        let mut a = arrivals(3);
        assert_eq!(steady(&mut a, Duration::from_millis(20), 100), None);
        // After a fast stream, an idle minute: the flush interval governs again.
        let mut a = arrivals(3);
        assert!(steady(&mut a, Duration::from_millis(1), 100).is_some());
        let later = tokio::time::Instant::now() + Duration::from_secs(60);
        a.arrive(later);
        assert!(a.arrive(later + Duration::from_secs(60)).is_none());
        // No linger, no early flush.
        let mut a = arrivals(0);
        assert_eq!(steady(&mut a, Duration::from_millis(1), 100), None);
    }
}
