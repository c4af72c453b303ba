//! A shard that acknowledges writes from its write-ahead log (ADR 0018).
//!
//! A write's record (the request as the gateway received it, [`super::RecordDecoder`]) is
//! appended to the shard's log ([`crate::writer::wal`]) with every other write waiting, in one group and
//! one `fdatasync`, and the writes are then acknowledged; their profiles wait in the shard's
//! dataset builders. A segment is cut every [`super::LogConfig::segment_interval`], when the
//! buffer passes `flush_bytes`, and when a query in this process asks for a barrier
//! ([`super::WriteBarrier`]); from its cut until its registration the process's queries read it
//! from memory ([`crate::caches::unregistered`]). The metastore transaction that registers it
//! also records the shard's checkpoint, the last record it holds, and the log's files at or
//! below it are then deleted. At start the shard reads its records above the checkpoint,
//! decodes them back into writes and cuts a segment of them before it takes new writes.
//!
//! A segment the store or the metastore refuses is kept, built, and tried again every
//! [`RETRY`], in order, ahead of later segments (its writes are in the log meanwhile); past
//! [`BACKLOG_FLUSHES`] flushes' bytes of such segments, new writes are refused (503). A group
//! the log fails to append is not acknowledged from the log: its writes wait for their segment
//! as they do without a log. Writes without a record (formats the gateway does not log) wait
//! for their segment too, cut within the flush interval.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tracing::{Instrument, debug, error, info, warn};

use super::segment::{
    Built, Hints, Pending, buffer, build_segment, next_command, observe_flush, publish_segment,
    warm,
};
use super::{Ack, Command, FlushContext, LogConfig, WriterConfig};
use crate::caches::barrier::Buffered;
use crate::metastore::LogCheckpoint;
use crate::writer::wal::{self, Log};
use crate::{Error, ErrorKind, Result};

/// How often a segment the store or metastore refused is tried again.
const RETRY: Duration = Duration::from_secs(1);
/// Unregistered segments' bytes, in `flush_bytes`, past which new writes are refused.
const BACKLOG_FLUSHES: usize = 4;
/// A group of records this large is appended even while more writes wait.
const GROUP_BYTES: usize = 8 << 20;

/// A segment waiting to be registered, with what it answers.
struct Unpublished {
    /// `None`: records that held no samples; only the checkpoint is recorded.
    built: Option<Built>,
    /// The last record the segment holds.
    through: u64,
    /// Writes that wait for the segment (those not acknowledged from the log).
    acks: Vec<Ack>,
    attempts: u32,
    /// When the segment was cut.
    started: Instant,
    /// Its `storage.flush` span, from the cut to its registration.
    span: tracing::Span,
}

struct Shard {
    id: u32,
    ctx: Arc<FlushContext>,
    config: WriterConfig,
    log: Log,
    name: String,
    interval: Duration,
    /// Set from a write's buffering until its segment is built (readable by queries): a
    /// query's barrier ([`super::WriteBarrier`]) must then cut it, or wait for the cut under
    /// way.
    buffered: Arc<Buffered>,
    pending: BTreeMap<String, Pending>,
    hints: Hints,
    size: usize,
    /// When the buffered writes are cut into a segment.
    cut_at: Option<tokio::time::Instant>,
    /// Records of buffered writes not yet appended, and the writes they acknowledge.
    records: Vec<Vec<u8>>,
    record_bytes: usize,
    /// When the first of `records` arrived.
    group_at: tokio::time::Instant,
    /// [`super::LogConfig::group_linger`].
    group_linger: Duration,
    /// How many records the last group appended held: more than one means writes come
    /// concurrently, and the next group waits for company.
    last_group: usize,
    waiting: Vec<(String, Ack)>,
    /// The last record appended whose write is buffered (or in a segment).
    logged_through: u64,
    /// The last checkpoint registered.
    recorded: u64,
    backlog: VecDeque<Unpublished>,
    retry_at: Option<tokio::time::Instant>,
}

/// Opens a shard's log, replays what it holds above the checkpoint, and runs the shard; `ready`
/// answers once the replayed writes are in a registered segment (or the log failed to open).
pub(super) async fn run(
    shard: u32,
    rx: &mut mpsc::Receiver<Command>,
    ctx: Arc<FlushContext>,
    config: WriterConfig,
    buffered: Arc<Buffered>,
    ready: oneshot::Sender<Result<()>>,
) {
    let log_config = config.log.clone().expect("a logged shard has a log");
    let name = format!("{}/{shard}", log_config.id);
    let opened = open(&ctx, &log_config, shard, &name).await;
    let (log, replay) = match opened {
        Ok(o) => o,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let checkpoint = replay.checkpoint;
    let mut s = Shard {
        id: shard,
        ctx,
        interval: log_config.segment_interval,
        config,
        log,
        name,
        buffered,
        pending: BTreeMap::new(),
        hints: Hints::new(),
        size: 0,
        cut_at: None,
        records: Vec::new(),
        record_bytes: 0,
        group_at: tokio::time::Instant::now(),
        group_linger: log_config.group_linger,
        last_group: 0,
        waiting: Vec::new(),
        logged_through: checkpoint,
        recorded: checkpoint,
        backlog: VecDeque::new(),
        retry_at: None,
    };
    if let Err(e) = s.replay(&log_config, replay).await {
        let _ = ready.send(Err(e));
        return;
    }
    let _ = ready.send(Ok(()));
    s.run(rx).await;
}

/// What a shard's log holds above its checkpoint.
struct Replay {
    checkpoint: u64,
    files: wal::Replay,
}

async fn open(
    ctx: &FlushContext,
    config: &LogConfig,
    shard: u32,
    name: &str,
) -> Result<(Log, Replay)> {
    let checkpoint = ctx.metastore.log_checkpoint(name).await?;
    let dir = config.dir.join(shard.to_string());
    let max_file_bytes = config.max_file_bytes;
    let (log, replay) =
        tokio::task::spawn_blocking(move || Log::open(&dir, checkpoint, max_file_bytes))
            .await
            .map_err(|e| Error::Task(e.to_string()))??;
    Ok((
        log,
        Replay {
            checkpoint,
            files: replay,
        },
    ))
}

impl Shard {
    /// Decodes the records an earlier process left above the checkpoint back into writes and
    /// registers them in segments, before any new write. The log is read a file at a time, so
    /// a long outage's log is replayed in the memory of one file and one segment. What cannot
    /// be used is set aside before the checkpoint passes it ([`wal::ASIDE_DIR`]); if it cannot
    /// be kept, the replay stops and the shard does not start.
    async fn replay(&mut self, config: &LogConfig, replay: Replay) -> Result<()> {
        let mut files = replay.files;
        let started = Instant::now();
        let (mut count, mut undecodable) = (0usize, 0usize);
        loop {
            let (back, file) = tokio::task::spawn_blocking(move || {
                let file = files.next_file();
                (files, file)
            })
            .await
            .map_err(|e| Error::Task(e.to_string()))?;
            files = back;
            let Some(file) = file? else {
                break;
            };
            if file.skipped_bytes > 0 && file.newest {
                // After a crash, the torn last group (never acknowledged).
                warn!(
                    shard = self.id,
                    file = %file.path.display(),
                    skipped_bytes = file.skipped_bytes,
                    "the write-ahead log ends in bytes that do not read as records; skipped"
                );
            } else if file.skipped_bytes > 0 {
                let path = file.path.clone();
                let kept = blocking(move || wal::set_aside_file(&path)).await?;
                self.ctx.store.metrics().log_files_set_aside.inc();
                error!(shard = self.id, file = %file.path.display(), kept = %kept.display(),
                    skipped_bytes = file.skipped_bytes,
                    "a write-ahead log file is damaged before its end: the records after the \
                     damage are not replayed; the file is kept (docs/operations.md, \
                     \"A damaged log file\")");
            }
            if count == 0 && !file.records.is_empty() {
                info!(
                    shard = self.id,
                    first = file.records[0].seq,
                    "replaying the write-ahead log"
                );
            }
            for wal::Frame {
                seq,
                received_ms,
                payload: record,
            } in file.records
            {
                count += 1;
                let decoder = Arc::clone(&config.decoder);
                let (record, decoded) = blocking(move || {
                    let decoded = decoder.decode(&record);
                    Ok((record, decoded))
                })
                .await?;
                match decoded {
                    Ok((tenant, profiles)) => {
                        self.size += buffer(
                            &mut self.pending,
                            &self.hints,
                            tenant,
                            &profiles,
                            None,
                            received_ms,
                        );
                    }
                    Err(e) => {
                        let dir = self.log.dir().to_owned();
                        let kept =
                            blocking(move || wal::set_aside_record(&dir, seq, &record)).await?;
                        undecodable += 1;
                        self.ctx.store.metrics().log_undecodable_records.inc();
                        error!(shard = self.id, seq, error = %e, kept = %kept.display(),
                            "a write-ahead log record does not decode; its write is not \
                             replayed and the record is kept (docs/operations.md, \
                             \"A poison record\")");
                    }
                }
                self.ctx.store.metrics().log_replayed_records.inc();
                self.logged_through = seq;
                if self.size >= self.config.flush_bytes {
                    self.cut().await;
                }
            }
        }
        if count == 0 {
            return Ok(());
        }
        self.cut().await;
        if let Some(stuck) = self.backlog.front() {
            let through = stuck.through;
            return Err(Error::Flush {
                kind: ErrorKind::Unavailable,
                message: format!(
                    "the write-ahead log's records up to {through} could not be registered \
                     after a replay (the object store or metastore refused them)"
                ),
            });
        }
        info!(
            shard = self.id,
            records = count,
            undecodable,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "write-ahead log replayed"
        );
        Ok(())
    }

    async fn run(&mut self, rx: &mut mpsc::Receiver<Command>) {
        loop {
            // A group of records is appended once no more writes wait and none is under way
            // (or the group has waited for them long enough), or once it is large (under a
            // stream that never pauses, its writes would otherwise wait for the cut).
            let linger = self.linger();
            if !self.records.is_empty()
                && ((rx.is_empty() && linger.is_none()) || self.record_bytes >= GROUP_BYTES)
            {
                self.commit();
            }
            let cmd = match linger.filter(|_| !self.records.is_empty()) {
                None => next_command(rx, self.cut_at, self.retry_at).await,
                Some(until) => {
                    // Woken when the last announced write ends; registered only while a group
                    // waits (it locks the `Notify`), then the count read again, so an end
                    // between the first read and the registration is not missed.
                    let expected = Arc::clone(&self.ctx.expected);
                    let mut none = std::pin::pin!(expected.none.notified());
                    none.as_mut().enable();
                    if self.linger().is_none() {
                        Some(Command::Tick)
                    } else {
                        tokio::select! {
                            cmd = next_command(rx, self.cut_at, self.retry_at) => cmd,
                            () = tokio::time::sleep_until(until) => Some(Command::Tick),
                            () = none => Some(Command::Tick),
                        }
                    }
                }
            };
            match cmd {
                Some(Command::Write {
                    tenant,
                    profiles,
                    record,
                    expected,
                    ack,
                }) => {
                    // The write is here: no longer one to wait for.
                    drop(expected);
                    self.write(tenant, &profiles, record, ack);
                }
                Some(Command::Tick) => {}
                Some(Command::Flush { done }) => {
                    self.commit();
                    self.cut().await;
                    let _ = done.send(());
                    continue;
                }
                Some(Command::Barrier { done }) => {
                    // The query needs the acknowledged writes only: those whose records wait
                    // are cut without them, and answered once their segment is registered.
                    self.defer_waiting();
                    self.build().await;
                    let _ = done.send(());
                    if self.retry_at.is_none() {
                        self.publish().await;
                    }
                    continue;
                }
                None | Some(Command::Close { .. }) => {
                    self.commit();
                    self.cut().await;
                    rx.close();
                    if !self.backlog.is_empty() {
                        warn!(
                            shard = self.id,
                            segments = self.backlog.len(),
                            "closing with segments the store or metastore refused; the \
                             write-ahead log keeps their writes for the next start"
                        );
                    }
                    for u in self.backlog.drain(..) {
                        for ack in u.acks {
                            let _ = ack.send(Err((
                                ErrorKind::Unavailable,
                                "the storage is shutting down".into(),
                            )));
                        }
                    }
                    if let Some(Command::Close { done }) = cmd {
                        let _ = done.send(());
                    }
                    return;
                }
            }
            let now = tokio::time::Instant::now();
            if self.cut_at.is_some_and(|at| at <= now) || self.size >= self.config.flush_bytes {
                self.commit();
                self.cut().await;
            } else if self.retry_at.is_some_and(|at| at <= now) {
                self.publish().await;
            }
        }
    }

    /// Until when the waiting group of records waits for more: `None` once it may be
    /// appended (no group, a large one, or the group linger past its first record:
    /// [`super::LogConfig::group_linger`]), and when no other write is to be expected: none
    /// announced ([`super::Writer::expect_write`]) and the last group a lone write's. The
    /// announcements see the requests in the gateway's handlers; the last group sees the
    /// rest of a concurrent load (requests still on their way in, senders between their
    /// acknowledgement and their next write), while a sender whose writes follow each other
    /// alone is never kept waiting.
    fn linger(&self) -> Option<tokio::time::Instant> {
        if self.records.is_empty()
            || self.record_bytes >= GROUP_BYTES
            || (self.last_group < 2 && self.ctx.expected.count.load(Ordering::Acquire) == 0)
        {
            return None;
        }
        let until = self.group_at + self.group_linger;
        (tokio::time::Instant::now() < until).then_some(until)
    }

    /// Buffers a write; its record waits for the next group.
    fn write(
        &mut self,
        tenant: String,
        profiles: &[kiln_otel::model::NormalizedProfile],
        record: Option<Vec<u8>>,
        ack: Ack,
    ) {
        let backlog: usize = self
            .backlog
            .iter()
            .filter_map(|u| u.built.as_ref())
            .map(|b| b.object.len())
            .sum();
        if backlog > BACKLOG_FLUSHES * self.config.flush_bytes {
            let _ = ack.send(Err((
                ErrorKind::Unavailable,
                format!(
                    "{backlog} bytes of segments wait for the object store or metastore; \
                     writes are refused until they are registered"
                ),
            )));
            return;
        }
        let now = tokio::time::Instant::now();
        let received_ms = self.ctx.clock.now_ms();
        // Before it is acknowledged: a query of its tenant and range cuts it from here on.
        self.buffered.add(&tenant, sample_range(profiles));
        match record {
            Some(record) => {
                self.size += buffer(
                    &mut self.pending,
                    &self.hints,
                    tenant.clone(),
                    profiles,
                    None,
                    received_ms,
                );
                self.record_bytes += record.len();
                if self.records.is_empty() {
                    self.group_at = now;
                }
                self.records.push(record);
                self.waiting.push((tenant, ack));
                let (interval, scale) = (self.interval, &self.ctx.interval_scale);
                self.cut_at.get_or_insert_with(|| {
                    now + super::scaled_segment_interval(interval, scale.load(Ordering::Relaxed))
                });
            }
            None => {
                self.size += buffer(
                    &mut self.pending,
                    &self.hints,
                    tenant,
                    profiles,
                    Some(ack),
                    received_ms,
                );
                let at = now + self.config.flush_interval;
                self.cut_at = Some(self.cut_at.map_or(at, |c| c.min(at)));
            }
        }
    }

    /// Appends the waiting records in one group and acknowledges their writes; when the log
    /// fails, their writes wait for their segment instead.
    fn commit(&mut self) {
        if self.records.is_empty() {
            return;
        }
        let records = std::mem::take(&mut self.records);
        self.record_bytes = 0;
        self.last_group = records.len();
        let log = &mut self.log;
        let now_ms = self.ctx.clock.now_ms();
        let appended = blocking_in_place(|| log.append(records.iter().map(Vec::as_slice), now_ms));
        let metrics = self.ctx.store.metrics();
        match appended {
            Ok(seq) => {
                self.logged_through = seq;
                metrics.log_appends.inc();
                metrics
                    .log_bytes
                    .inc_by(records.iter().map(|r| r.len() as u64).sum());
                for (_, ack) in self.waiting.drain(..) {
                    let _ = ack.send(Ok(()));
                }
            }
            Err(e) => {
                error!(shard = self.id, error = %e,
                    "the write-ahead log refused a group; its writes wait for their segment");
                // The group's numbers are burned, and whole frames of it may have reached the
                // disk: the segment holding its writes covers them, so they are not replayed.
                self.logged_through = self.log.last_seq();
                self.defer_waiting();
                let at = tokio::time::Instant::now() + self.config.flush_interval;
                self.cut_at = Some(self.cut_at.map_or(at, |c| c.min(at)));
            }
        }
    }

    /// Leaves the records waiting for a group out of the log: their writes wait for the
    /// segment that holds them instead.
    fn defer_waiting(&mut self) {
        self.records.clear();
        self.record_bytes = 0;
        for (tenant, ack) in self.waiting.drain(..) {
            if let Some(p) = self.pending.get_mut(&tenant) {
                p.acks.push(ack);
            }
        }
    }

    /// Builds a segment of what the shard buffers and registers it (after any segments
    /// waiting before it).
    async fn cut(&mut self) {
        self.build().await;
        self.publish().await;
    }

    /// Builds a segment of what the shard buffers, readable by this process's queries at once
    /// ([`crate::caches::unregistered`]), to be registered after any segments waiting before it.
    async fn build(&mut self) {
        let started = Instant::now();
        self.cut_at = None;
        self.size = 0;
        let pending = std::mem::take(&mut self.pending);
        if pending.is_empty() && !self.needs_checkpoint() {
            self.buffered.clear();
            return;
        }
        self.hints = pending
            .iter()
            .map(|(tenant, p)| (tenant.clone(), p.builder.capacity_hint()))
            .collect();
        let (builders, acks): (Vec<_>, Vec<Vec<Ack>>) =
            pending.into_values().map(|p| (p.builder, p.acks)).unzip();
        let acks: Vec<Ack> = acks.into_iter().flatten().collect();
        let span = tracing::info_span!(
            "storage.flush",
            shard = self.id,
            writes = acks.len(),
            rows = tracing::field::Empty,
            bytes = tracing::field::Empty,
        );
        let logs = vec![LogCheckpoint {
            log: self.name.clone(),
            seq: self.logged_through,
        }];
        let built = build_segment(self.id, &self.ctx, builders, logs)
            .instrument(span.clone())
            .await;
        match built {
            Ok(mut built) => {
                if let Some(b) = &mut built {
                    warm(&self.ctx, b).await;
                    self.ctx.unregistered.insert(&b.metas, &b.object);
                }
                if built.is_some() || !acks.is_empty() || self.needs_checkpoint() {
                    self.backlog.push_back(Unpublished {
                        built,
                        through: self.logged_through,
                        acks,
                        attempts: 0,
                        started,
                        span,
                    });
                }
            }
            Err(e) if matches!(&e, Error::Task(m) if m.contains("cancelled")) => {
                // The runtime is shutting down under the build: no checkpoint passes the
                // records now, so they are replayed at the next start.
                for ack in acks {
                    let _ = ack.send(Err((e.kind(), e.to_string())));
                }
            }
            Err(e) => {
                // Not seen: encoding what the builders accepted does not fail. The writes it
                // held that were acknowledged from the log are not dropped: their records are
                // kept aside before a later segment's checkpoint passes them. The others are
                // answered with the error (their clients retry).
                let from = self.backlog.back().map_or(self.recorded, |u| u.through) + 1;
                let through = self.logged_through;
                let log = &self.log;
                let kept = blocking_in_place(|| log.set_aside_records(from, through));
                match kept {
                    Ok(n) => {
                        self.ctx
                            .store
                            .metrics()
                            .log_records_set_aside
                            .inc_by(n as u64);
                        error!(shard = self.id, from, through, records = n, error = %e,
                            kept = %self.log.dir().join(wal::ASIDE_DIR).display(),
                            "a segment could not be encoded; its writes acknowledged from the \
                             log are not stored, and their records are kept (docs/operations.md, \
                             \"A poison record\")");
                    }
                    Err(aside) => {
                        error!(shard = self.id, from, through, error = %e, aside = %aside,
                            "a segment could not be encoded, and its records could not be kept: \
                             its writes acknowledged from the log are lost");
                    }
                }
                for ack in acks {
                    let _ = ack.send(Err((e.kind(), e.to_string())));
                }
            }
        }
        // What the shard buffered is readable now (it takes no write while it builds).
        self.buffered.clear();
    }

    /// Whether records were appended past the last checkpoint recorded or waiting.
    fn needs_checkpoint(&self) -> bool {
        let last = self.backlog.back().map_or(self.recorded, |u| u.through);
        last < self.logged_through
    }

    /// Registers the waiting segments in order, each with its checkpoint, and deletes the log
    /// files they cover; stops at the first refused, to try again in [`RETRY`].
    async fn publish(&mut self) {
        self.retry_at = None;
        while let Some(u) = self.backlog.front_mut() {
            let started = u.started;
            let checkpoint = LogCheckpoint {
                log: self.name.clone(),
                seq: u.through,
            };
            let span = u.span.clone();
            let result = match &mut u.built {
                Some(built) => {
                    publish_segment(&self.ctx, built, false, Some(&checkpoint))
                        .instrument(span.clone())
                        .await
                }
                None => {
                    self.ctx
                        .metastore
                        .add_blocks_checkpointed(Vec::new(), &checkpoint)
                        .await
                }
            };
            // A retry that finds its blocks registered: the earlier attempt committed, with
            // its checkpoint, and only its answer was lost.
            let result = match result {
                Err(Error::BlockExists { .. }) if u.attempts > 0 => Ok(()),
                other => other,
            };
            u.attempts += 1;
            match result {
                Ok(()) => {
                    if let Some(built) = &u.built {
                        span.in_scope(|| observe_flush(&self.ctx, started, Ok(&built.flushed)));
                    }
                    let u = self.backlog.pop_front().expect("the front");
                    if let Some(built) = &u.built {
                        self.ctx.unregistered.remove(&built.metas).await;
                    }
                    self.recorded = u.through;
                    for ack in u.acks {
                        let _ = ack.send(Ok(()));
                    }
                    let log = &mut self.log;
                    if let Err(e) = blocking_in_place(|| log.release_through(u.through)) {
                        warn!(shard = self.id, error = %e,
                            "write-ahead log files could not be deleted; tried again later");
                    }
                }
                Err(e) => {
                    if u.attempts == 1 {
                        span.in_scope(|| observe_flush(&self.ctx, started, Err(&e)));
                    } else {
                        debug!(shard = self.id, attempts = u.attempts, error = %e,
                            "a segment is still refused");
                    }
                    self.retry_at = Some(tokio::time::Instant::now() + RETRY);
                    return;
                }
            }
        }
    }
}

/// Runs blocking file work on this worker thread, telling a multi-threaded runtime to move its
/// other tasks elsewhere meanwhile (a current-thread runtime, in tests, just runs it).
fn blocking_in_place<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::current().runtime_flavor() {
        tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// The range of a write's sample times (Unix nanoseconds, inclusive), as queries select them.
fn sample_range(profiles: &[kiln_otel::model::NormalizedProfile]) -> (i64, i64) {
    let mut range = (i64::MAX, i64::MIN);
    for series in profiles.iter().flat_map(|p| &p.series) {
        range = (
            range.0.min(series.time_nanos),
            range.1.max(series.time_nanos),
        );
        for x in series.samples.iter().filter(|x| x.timestamp_nanos != 0) {
            range = (
                range.0.min(x.timestamp_nanos),
                range.1.max(x.timestamp_nanos),
            );
        }
    }
    range
}

/// Runs blocking file IO (or decoding) off the runtime's threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Task(e.to_string()))?
}
