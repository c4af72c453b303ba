//! Prometheus remote write 1.0 (protobuf, snappy block format) through a bounded on-disk queue:
//! how the samples of recording rules reach a Prometheus-compatible receiver (Prometheus with
//! `--web.enable-remote-write-receiver`, Mimir, …).
//!
//! ```text
//!  sealed samples ─► push: encode, snappy ─► <dir>/<seq>.batch (durable, FIFO; past the
//!                                              │  budget the largest tenant's oldest dropped)
//!                                              ▼
//!                        run: POST dest.url ─► 2xx: deleted, counted sent
//!                                            ├ 5xx, 429, no answer: kept, retried later
//!                                            └ any other status: deleted, counted rejected
//! ```
//!
//! [`RemoteWriteQueue::push`] encodes the samples ([`encode`]) and writes one batch file per call
//! (temporary name, fsync, rename, fsync of the directory) before it returns, so a push survives
//! a crash. Past the queue's byte budget batches are deleted and their samples counted as
//! dropped: the oldest of the tenant that holds the most bytes first, so a tenant whose
//! receiver is away fills only its share while others send. The batch just pushed is always
//! kept, even alone over the budget.
//!
//! [`RemoteWriteQueue::run`] sends batches in order *per destination* (Prometheus refuses
//! samples older than those it has, so a series' samples must arrive in order). Each destination
//! backs off on its own (250 ms doubling to 30 s, a success resets it; `Retry-After` is honoured,
//! within the cap): while one receiver is down, the batches of others still go. One request is
//! in flight at a time, so an unresponsive receiver holds the others back for at most the
//! request timeout ([`REQUEST_TIMEOUT`]) per attempt.
//!
//! A batch file holds:
//!
//! ```text
//!  kiln-remote-write 1\n
//!  {"destination":{"url":"…","tenant":"…"},"samples":N,"body_bytes":M}\n
//!  M bytes: the snappy-compressed (block format) prometheus.WriteRequest, sent as it is
//! ```
//!
//! Files are named `<seq>.batch`, `seq` a zero-padded 20-digit counter, so their names sort in
//! push order. A `*.tmp` file (a push cut short) was never acknowledged and is deleted at open;
//! a batch whose header does not read back or whose length is not what the header says is set
//! aside as `*.corrupt`, logged and counted ([`QueueStats::batches_corrupt`]). A sent batch is
//! deleted without an fsync of the directory: after a crash it may be sent again, which a
//! receiver takes as duplicates (same values) or refuses as out of order (counted as rejected).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::fs::File;
use std::future::Future;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use kiln_proto::prometheus as pb;
use prost::Message;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{debug, info, warn};

#[cfg(test)]
mod tests;

/// Time one remote write request may take, from connecting to the end of the answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// First wait after a failed send to a destination; each further failure doubles it.
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(250);

/// Longest wait between two attempts at one destination (`Retry-After` included).
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The protocol version sent in `X-Prometheus-Remote-Write-Version`.
const REMOTE_WRITE_VERSION: &str = "0.1.0";

/// The first line of every batch file: the format and its version.
const MAGIC: &[u8] = b"kiln-remote-write 1\n";

/// Longest header line read back.
const MAX_HEADER_BYTES: u64 = 64 * 1024;

/// Bytes of a refusing receiver's answer that are logged.
const LOGGED_BODY_BYTES: usize = 200;

const BATCH_EXTENSION: &str = "batch";
const TMP_EXTENSION: &str = "tmp";
const CORRUPT_EXTENSION: &str = "corrupt";

/// One sample of a recording rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The series' labels, `__name__` among them, in any order; names must be distinct (a
    /// repeated name keeps its first value).
    pub labels: Vec<(String, String)>,
    /// Milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
    /// The counter's value.
    pub value: f64,
}

/// Where a batch is sent: a remote write endpoint and the tenant it is written as.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Destination {
    /// The receiver's remote write URL (Prometheus: `…/api/v1/write`, Mimir: `…/api/v1/push`).
    pub url: String,
    /// Sent as `X-Scope-OrgID` (the header is left out when empty).
    pub tenant: String,
}

/// Why the queue could not take or keep a batch.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// Reading or writing the queue's directory failed.
    #[error("i/o error at {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A batch file is not what the queue wrote (set aside at open).
    #[error("remote write batch {path} is unreadable: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    /// The encoded request passes snappy's block size limit (about 4 GiB).
    #[error("a remote write request of {bytes} bytes is too large to compress")]
    TooLarge { bytes: usize },
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> QueueError + '_ {
    move |source| QueueError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Encodes `samples` as one snappy-compressed (block format) `prometheus.WriteRequest`: one
/// `TimeSeries` per label set (labels sorted by name, series in label order), each series'
/// samples in timestamp order, and `COUNTER` metadata for each distinct `__name__`.
pub fn encode(samples: &[Sample]) -> Result<Vec<u8>, QueueError> {
    let request = write_request(samples);
    let raw = request.encode_to_vec();
    snap::raw::Encoder::new()
        .compress_vec(&raw)
        .map_err(|_| QueueError::TooLarge { bytes: raw.len() })
}

fn write_request(samples: &[Sample]) -> pb::WriteRequest {
    let mut series: BTreeMap<Vec<(String, String)>, Vec<(i64, f64)>> = BTreeMap::new();
    let mut names = BTreeSet::new();
    for s in samples {
        let mut labels = s.labels.clone();
        labels.sort_by(|a, b| a.0.cmp(&b.0));
        labels.dedup_by(|later, first| later.0 == first.0);
        if let Some((_, name)) = labels.iter().find(|(n, _)| n == "__name__") {
            names.insert(name.clone());
        }
        series
            .entry(labels)
            .or_default()
            .push((s.timestamp_ms, s.value));
    }
    let timeseries = series
        .into_iter()
        .map(|(labels, mut points)| {
            points.sort_by_key(|&(t, _)| t);
            pb::TimeSeries {
                labels: labels
                    .into_iter()
                    .map(|(name, value)| pb::Label { name, value })
                    .collect(),
                samples: points
                    .into_iter()
                    .map(|(timestamp, value)| pb::Sample { value, timestamp })
                    .collect(),
            }
        })
        .collect();
    let metadata = names
        .into_iter()
        .map(|name| pb::MetricMetadata {
            r#type: pb::metric_metadata::MetricType::Counter as i32,
            metric_family_name: name,
            help: String::new(),
            unit: String::new(),
        })
        .collect();
    pb::WriteRequest {
        timeseries,
        metadata,
    }
}

/// What the queue has done since it opened; every counter only grows, except
/// [`QueueStats::pending_bytes`]. Batches left by a previous run count as sent, dropped or
/// rejected when they go, not as queued.
#[derive(Debug, Default)]
pub struct QueueStats {
    samples_queued: AtomicU64,
    samples_sent: AtomicU64,
    samples_dropped: AtomicU64,
    samples_rejected: AtomicU64,
    send_failures: AtomicU64,
    batches_corrupt: AtomicU64,
    pending_bytes: AtomicU64,
}

impl QueueStats {
    /// Samples pushed (written to disk).
    pub fn samples_queued(&self) -> u64 {
        self.samples_queued.load(Ordering::Relaxed)
    }

    /// Samples a receiver accepted (answered 2xx).
    pub fn samples_sent(&self) -> u64 {
        self.samples_sent.load(Ordering::Relaxed)
    }

    /// Samples deleted unsent because the queue was over its byte budget.
    pub fn samples_dropped(&self) -> u64 {
        self.samples_dropped.load(Ordering::Relaxed)
    }

    /// Samples a receiver refused for good (a 4xx other than 429), or that could not be sent at
    /// all (an invalid URL or tenant).
    pub fn samples_rejected(&self) -> u64 {
        self.samples_rejected.load(Ordering::Relaxed)
    }

    /// Send attempts that failed and will be retried (5xx, 429, no answer).
    pub fn send_failures(&self) -> u64 {
        self.send_failures.load(Ordering::Relaxed)
    }

    /// Batch files that did not read back and were set aside as `*.corrupt`.
    pub fn batches_corrupt(&self) -> u64 {
        self.batches_corrupt.load(Ordering::Relaxed)
    }

    /// Bytes of the batch files waiting to be sent.
    pub fn pending_bytes(&self) -> u64 {
        self.pending_bytes.load(Ordering::Relaxed)
    }
}

/// A batch file's second line.
#[derive(Debug, Serialize, Deserialize)]
struct Header {
    destination: Destination,
    samples: u64,
    body_bytes: u64,
}

/// A batch waiting in the queue.
#[derive(Debug, Clone)]
struct Batch {
    seq: u64,
    path: PathBuf,
    dest: Destination,
    samples: u64,
    /// Where the request body starts in the file.
    body_at: u64,
    /// The whole file.
    bytes: u64,
}

#[derive(Debug, Default)]
struct State {
    /// Oldest first.
    batches: VecDeque<Batch>,
    next_seq: u64,
    bytes: u64,
    /// The batch being sent, which the budget does not drop.
    in_flight: Option<u64>,
}

impl State {
    /// Removes batches until the queue is within `max_bytes`, and returns them. The tenant
    /// holding the most bytes loses its oldest batch first, so one tenant's backlog never
    /// drops another's samples while it holds more than they do. The newest batch and the one
    /// in flight are kept.
    fn evict(&mut self, max_bytes: u64) -> Vec<Batch> {
        let mut evicted = Vec::new();
        if self.bytes <= max_bytes {
            return evicted;
        }
        let last = self.batches.back().map(|b| b.seq);
        let keep = |b: &Batch| Some(b.seq) == last || Some(b.seq) == self.in_flight;
        let mut by_tenant: HashMap<String, u64> = HashMap::new();
        for b in self.batches.iter().filter(|b| !keep(b)) {
            *by_tenant.entry(b.dest.tenant.clone()).or_default() += b.bytes;
        }
        let mut gone: HashSet<u64> = HashSet::new();
        let mut over = self.bytes - max_bytes;
        // Each tenant's evictable batches, oldest first.
        let mut queues: HashMap<&str, VecDeque<&Batch>> = HashMap::new();
        for b in self.batches.iter().filter(|b| !keep(b)) {
            queues
                .entry(b.dest.tenant.as_str())
                .or_default()
                .push_back(b);
        }
        while over > 0 {
            // The most bytes pays; of equals, the one with the oldest batch.
            let Some(tenant) = queues
                .iter()
                .filter_map(|(&t, q)| Some((t, q.front()?.seq)))
                .max_by_key(|&(t, oldest)| (by_tenant[t], std::cmp::Reverse(oldest)))
                .map(|(t, _)| t)
            else {
                break;
            };
            let Some(b) = queues.get_mut(tenant).and_then(VecDeque::pop_front) else {
                break;
            };
            gone.insert(b.seq);
            over = over.saturating_sub(b.bytes);
            if let Some(bytes) = by_tenant.get_mut(tenant) {
                *bytes -= b.bytes;
            }
        }
        let mut kept = VecDeque::with_capacity(self.batches.len());
        for b in std::mem::take(&mut self.batches) {
            if gone.contains(&b.seq) {
                self.bytes -= b.bytes;
                evicted.push(b);
            } else {
                kept.push_back(b);
            }
        }
        self.batches = kept;
        evicted
    }

    fn remove(&mut self, seq: u64) -> Option<Batch> {
        let i = self.batches.iter().position(|b| b.seq == seq)?;
        let b = self.batches.remove(i)?;
        self.bytes -= b.bytes;
        Some(b)
    }
}

/// A durable FIFO of remote write batches in one directory, and the sender that drains it
/// ([`RemoteWriteQueue::run`]).
#[derive(Debug)]
pub struct RemoteWriteQueue {
    dir: PathBuf,
    max_bytes: u64,
    state: Mutex<State>,
    /// One push at a time, so files are created in sequence order.
    pushing: Mutex<()>,
    wake: Notify,
    stats: QueueStats,
    initial_backoff: Duration,
    max_backoff: Duration,
}

/// What one attempt at a batch came to.
pub(crate) enum Outcome {
    Sent,
    /// Worth another try after the wait (the `Retry-After` the receiver asked for, if any).
    Retry {
        reason: String,
        retry_after: Option<Duration>,
    },
    /// Never to be sent: deleted.
    Rejected {
        reason: String,
    },
    /// The file did not read back: set aside.
    Unreadable {
        reason: String,
    },
}

/// A destination's backoff.
#[derive(Debug, Clone, Copy)]
struct Retry {
    delay: Duration,
    at: Instant,
}

impl RemoteWriteQueue {
    /// Opens the queue in `dir` (creating it) with a budget of `max_bytes` for its batch files,
    /// taking the batches a previous process left. A file that does not read back is set aside
    /// and counted; a push cut short (`*.tmp`) is deleted. Blocking file IO.
    pub fn open(dir: impl Into<PathBuf>, max_bytes: u64) -> Result<Self, QueueError> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let stats = QueueStats::default();
        let mut state = State::default();
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(io(&dir))? {
            let path = entry.map_err(io(&dir))?.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let Some((stem, extension)) = name.split_once('.') else {
                continue;
            };
            let Some(seq) = parse_seq(stem) else {
                continue;
            };
            // Past every name seen, set-aside files included, so no name is reused.
            state.next_seq = state.next_seq.max(seq.saturating_add(1));
            match extension {
                BATCH_EXTENSION => found.push((seq, path)),
                TMP_EXTENSION => {
                    debug!(path = %path.display(), "deleting a remote write batch cut short");
                    if let Err(e) = std::fs::remove_file(&path) {
                        warn!(
                            path = %path.display(),
                            error = %e,
                            "cannot delete an unfinished remote write batch"
                        );
                    }
                }
                _ => {}
            }
        }
        found.sort();
        for (seq, path) in found {
            match read_header(&path) {
                Ok((header, body_at)) => {
                    let bytes = body_at + header.body_bytes;
                    state.bytes += bytes;
                    state.batches.push_back(Batch {
                        seq,
                        path,
                        dest: header.destination,
                        samples: header.samples,
                        body_at,
                        bytes,
                    });
                }
                Err(e) => {
                    set_aside(&path, &e.to_string());
                    stats.batches_corrupt.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if !state.batches.is_empty() {
            info!(
                dir = %dir.display(),
                batches = state.batches.len(),
                bytes = state.bytes,
                "remote write batches left by the previous run will be sent"
            );
        }
        let queue = Self {
            dir,
            max_bytes,
            state: Mutex::new(state),
            pushing: Mutex::new(()),
            wake: Notify::new(),
            stats,
            initial_backoff: INITIAL_BACKOFF,
            max_backoff: MAX_BACKOFF,
        };
        // A smaller budget than the last run's applies at once.
        let evicted = queue.lock().evict(max_bytes);
        queue.drop_batches(evicted);
        queue.publish_bytes();
        Ok(queue)
    }

    /// Sets the backoff after a failed send: `initial`, doubled on each further failure up to
    /// `cap` (defaults [`INITIAL_BACKOFF`], [`MAX_BACKOFF`]).
    pub fn with_backoff(mut self, initial: Duration, cap: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = cap.max(initial);
        self
    }

    /// The queue's counters.
    pub fn stats(&self) -> &QueueStats {
        &self.stats
    }

    /// Batches waiting to be sent.
    pub fn pending(&self) -> usize {
        self.lock().batches.len()
    }

    /// Encodes `samples` for `dest` and writes them as one batch, on disk (fsynced, directory
    /// included) before this returns; then, over the budget, deletes the oldest batches (never
    /// this one) and counts their samples as dropped. Empty `samples` are a no-op.
    ///
    /// Blocking file IO: async callers run it in `tokio::task::spawn_blocking`.
    pub fn push(&self, dest: &Destination, samples: &[Sample]) -> Result<(), QueueError> {
        if samples.is_empty() {
            return Ok(());
        }
        let body = encode(samples)?;
        let header = Header {
            destination: dest.clone(),
            samples: samples.len() as u64,
            body_bytes: body.len() as u64,
        };
        let mut head = MAGIC.to_vec();
        serde_json::to_writer(&mut head, &header).map_err(|e| QueueError::Io {
            path: self.dir.clone(),
            source: e.into(),
        })?;
        head.push(b'\n');

        let _one_at_a_time = self.pushing.lock().expect("remote write push lock");
        let seq = {
            let mut state = self.lock();
            let seq = state.next_seq;
            state.next_seq += 1;
            seq
        };
        let path = self.dir.join(format!("{seq:020}.{BATCH_EXTENSION}"));
        let tmp = self.dir.join(format!("{seq:020}.{TMP_EXTENSION}"));
        if let Err(e) = write_durably(&self.dir, &tmp, &path, &[&head, &body]) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        self.stats
            .samples_queued
            .fetch_add(header.samples, Ordering::Relaxed);
        let evicted = {
            let mut state = self.lock();
            let bytes = (head.len() + body.len()) as u64;
            state.bytes += bytes;
            state.batches.push_back(Batch {
                seq,
                path,
                dest: header.destination,
                samples: header.samples,
                body_at: head.len() as u64,
                bytes,
            });
            state.evict(self.max_bytes)
        };
        self.drop_batches(evicted);
        self.publish_bytes();
        self.wake.notify_one();
        Ok(())
    }

    /// Sends the queued batches until `shutdown` resolves, waking when [`Self::push`] adds
    /// one. A request in flight at shutdown is abandoned; its batch stays for the next run.
    /// `client` should have no overall timeout shorter than [`REQUEST_TIMEOUT`], which each
    /// request sets.
    pub async fn run(self: Arc<Self>, client: reqwest::Client, shutdown: impl Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut retries: HashMap<Destination, Retry> = HashMap::new();
        loop {
            let (next, wait_until) = self.next_batch(&retries);
            let Some(batch) = next else {
                let notified = self.wake.notified();
                let sleep = async {
                    match wait_until {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = notified => {}
                    () = sleep => {}
                    () = &mut shutdown => return,
                }
                continue;
            };
            let outcome = tokio::select! {
                outcome = send(&client, &batch) => outcome,
                () = &mut shutdown => {
                    self.lock().in_flight = None;
                    return;
                }
            };
            self.settle(&batch, outcome, &mut retries).await;
        }
    }

    /// The oldest batch of each destination is next in line; the oldest of those whose
    /// destination is not backing off is returned (marked in flight), else the time the first
    /// backoff ends.
    fn next_batch(
        &self,
        retries: &HashMap<Destination, Retry>,
    ) -> (Option<Batch>, Option<Instant>) {
        let now = Instant::now();
        let mut state = self.lock();
        let mut seen: HashSet<&Destination> = HashSet::new();
        let mut wait_until: Option<Instant> = None;
        let mut chosen = None;
        for b in &state.batches {
            if !seen.insert(&b.dest) {
                continue;
            }
            match retries.get(&b.dest) {
                Some(r) if r.at > now => {
                    wait_until = Some(wait_until.map_or(r.at, |w| w.min(r.at)));
                }
                _ => {
                    chosen = Some(b.clone());
                    break;
                }
            }
        }
        if let Some(b) = &chosen {
            state.in_flight = Some(b.seq);
        }
        (chosen, wait_until)
    }

    /// Deletes, keeps or sets aside `batch` after an attempt, and counts it.
    async fn settle(
        &self,
        batch: &Batch,
        outcome: Outcome,
        retries: &mut HashMap<Destination, Retry>,
    ) {
        let url = redacted(&batch.dest.url);
        let tenant = &batch.dest.tenant;
        match outcome {
            Outcome::Sent => {
                retries.remove(&batch.dest);
                self.stats
                    .samples_sent
                    .fetch_add(batch.samples, Ordering::Relaxed);
                debug!(%tenant, %url, samples = batch.samples, "remote write batch sent");
                self.forget(batch).await;
            }
            Outcome::Retry {
                reason,
                retry_after,
            } => {
                self.stats.send_failures.fetch_add(1, Ordering::Relaxed);
                let delay = match retries.get(&batch.dest) {
                    Some(r) => (r.delay * 2).min(self.max_backoff),
                    None => self.initial_backoff,
                };
                let wait = retry_after.map_or(delay, |r| r.min(self.max_backoff).max(delay));
                retries.insert(
                    batch.dest.clone(),
                    Retry {
                        delay,
                        at: Instant::now() + wait,
                    },
                );
                warn!(%tenant, %url, %reason, retry_in = ?wait, "remote write failed; retrying");
                self.lock().in_flight = None;
            }
            Outcome::Rejected { reason } => {
                // The receiver answered: it is up, whatever it thought of this batch.
                retries.remove(&batch.dest);
                self.stats
                    .samples_rejected
                    .fetch_add(batch.samples, Ordering::Relaxed);
                warn!(
                    %tenant,
                    %url,
                    %reason,
                    samples = batch.samples,
                    "remote write batch rejected; deleted"
                );
                self.forget(batch).await;
            }
            Outcome::Unreadable { reason } => {
                self.stats.batches_corrupt.fetch_add(1, Ordering::Relaxed);
                let path = batch.path.clone();
                let _ = tokio::task::spawn_blocking(move || set_aside(&path, &reason)).await;
                let mut state = self.lock();
                state.in_flight = None;
                state.remove(batch.seq);
                drop(state);
                self.publish_bytes();
            }
        }
    }

    /// Deletes a batch that is done with.
    async fn forget(&self, batch: &Batch) {
        if let Err(e) = tokio::fs::remove_file(&batch.path).await
            && e.kind() != std::io::ErrorKind::NotFound
        {
            warn!(
                path = %batch.path.display(),
                error = %e,
                "cannot delete a finished remote write batch"
            );
        }
        let mut state = self.lock();
        state.in_flight = None;
        state.remove(batch.seq);
        drop(state);
        self.publish_bytes();
    }

    /// Deletes batches the budget evicted, counting their samples as dropped.
    fn drop_batches(&self, evicted: Vec<Batch>) {
        for b in evicted {
            self.stats
                .samples_dropped
                .fetch_add(b.samples, Ordering::Relaxed);
            warn!(
                tenant = %b.dest.tenant,
                url = %redacted(&b.dest.url),
                samples = b.samples,
                max_bytes = self.max_bytes,
                "remote write queue over its budget; oldest batch dropped unsent"
            );
            if let Err(e) = std::fs::remove_file(&b.path)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                warn!(
                    path = %b.path.display(),
                    error = %e,
                    "cannot delete a dropped remote write batch"
                );
            }
        }
    }

    fn publish_bytes(&self) {
        let bytes = self.lock().bytes;
        self.stats.pending_bytes.store(bytes, Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("remote write queue lock")
    }
}

/// POSTs one batch.
async fn send(client: &reqwest::Client, batch: &Batch) -> Outcome {
    let data = match tokio::fs::read(&batch.path).await {
        Ok(data) => data,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Outcome::Unreadable {
                reason: e.to_string(),
            };
        }
        // Out of file descriptors and the like: the file is still there for another try.
        Err(e) => {
            return Outcome::Retry {
                reason: format!("cannot read the batch: {e}"),
                retry_after: None,
            };
        }
    };
    if data.len() as u64 != batch.bytes {
        return Outcome::Unreadable {
            reason: format!("{} bytes where {} were written", data.len(), batch.bytes),
        };
    }
    let body = Bytes::from(data).slice(batch.body_at as usize..);
    post(client, &batch.dest, body).await
}

/// POSTs one encoded request ([`encode`]) to `dest`.
pub(crate) async fn post(client: &reqwest::Client, dest: &Destination, body: Bytes) -> Outcome {
    let mut request = client
        .post(&dest.url)
        .timeout(REQUEST_TIMEOUT)
        .header(http::header::CONTENT_ENCODING, "snappy")
        .header(http::header::CONTENT_TYPE, "application/x-protobuf")
        .header("X-Prometheus-Remote-Write-Version", REMOTE_WRITE_VERSION)
        .header(
            http::header::USER_AGENT,
            concat!("kiln/", env!("CARGO_PKG_VERSION")),
        );
    if !dest.tenant.is_empty() {
        match http::HeaderValue::from_str(&dest.tenant) {
            Ok(v) => request = request.header("X-Scope-OrgID", v),
            Err(_) => {
                return Outcome::Rejected {
                    reason: "the tenant is not a valid X-Scope-OrgID header value".into(),
                };
            }
        }
    }
    let response = match request.body(body).send().await {
        Ok(r) => r,
        Err(e) if e.is_builder() => {
            return Outcome::Rejected {
                reason: format!("invalid request: {e}"),
            };
        }
        Err(e) => {
            return Outcome::Retry {
                reason: e.to_string(),
                retry_after: None,
            };
        }
    };
    let status = response.status();
    if status.is_success() {
        return Outcome::Sent;
    }
    if status.is_server_error() || status == http::StatusCode::TOO_MANY_REQUESTS {
        let retry_after = response
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        return Outcome::Retry {
            reason: format!("the receiver answered {status}"),
            retry_after,
        };
    }
    let body = body_start(response).await;
    Outcome::Rejected {
        reason: format!("the receiver answered {status}: {body}"),
    }
}

/// The first [`LOGGED_BODY_BYTES`] of an answer, as text.
async fn body_start(mut response: reqwest::Response) -> String {
    let mut start = Vec::new();
    while start.len() < LOGGED_BODY_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => start.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    start.truncate(LOGGED_BODY_BYTES);
    String::from_utf8_lossy(&start).trim().to_string()
}

/// A URL without its user name and password, for logs.
pub(crate) fn redacted(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.to_string()
        }
        Err(_) => url.to_string(),
    }
}

/// A 20-digit sequence number.
fn parse_seq(stem: &str) -> Option<u64> {
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok()
}

/// Writes `parts` to `tmp`, fsyncs it, renames it to `path` and fsyncs `dir`.
fn write_durably(dir: &Path, tmp: &Path, path: &Path, parts: &[&[u8]]) -> Result<(), QueueError> {
    let mut file = File::create_new(tmp).map_err(io(tmp))?;
    for part in parts {
        file.write_all(part).map_err(io(tmp))?;
    }
    file.sync_all().map_err(io(tmp))?;
    drop(file);
    std::fs::rename(tmp, path).map_err(io(path))?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

/// Reads a batch file's header; returns it and where the body starts.
fn read_header(path: &Path) -> Result<(Header, u64), QueueError> {
    let corrupt = |reason: String| QueueError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let file = File::open(path).map_err(io(path))?;
    let len = file.metadata().map_err(io(path))?.len();
    let mut reader = BufReader::new(file.take(MAX_HEADER_BYTES));
    let mut magic = Vec::new();
    reader.read_until(b'\n', &mut magic).map_err(io(path))?;
    if magic != MAGIC {
        return Err(corrupt(
            "not a remote write batch, or of an unknown version".into(),
        ));
    }
    let mut line = Vec::new();
    reader.read_until(b'\n', &mut line).map_err(io(path))?;
    if line.last() != Some(&b'\n') {
        return Err(corrupt("the header is cut short".into()));
    }
    let header: Header =
        serde_json::from_slice(&line).map_err(|e| corrupt(format!("the header: {e}")))?;
    let body_at = (magic.len() + line.len()) as u64;
    if body_at.checked_add(header.body_bytes) != Some(len) {
        return Err(corrupt(format!(
            "{len} bytes, where the header says {}",
            body_at.saturating_add(header.body_bytes)
        )));
    }
    Ok((header, body_at))
}

/// Renames a batch that does not read back to `*.corrupt`, for an operator to look at.
fn set_aside(path: &Path, reason: &str) {
    let aside = path.with_extension(CORRUPT_EXTENSION);
    match std::fs::rename(path, &aside) {
        Ok(()) => warn!(
            path = %aside.display(),
            %reason,
            "unreadable remote write batch set aside; its samples are not sent"
        ),
        Err(e) => warn!(
            path = %path.display(),
            %reason,
            error = %e,
            "unreadable remote write batch cannot be set aside"
        ),
    }
}
