//! Prometheus remote write 1.0 (protobuf, snappy block format) through a bounded on-disk queue:
//! how the samples of recording rules reach a Prometheus-compatible receiver (Prometheus with
//! `--web.enable-remote-write-receiver`, Mimir, …).
//!
//! ```text
//!  sealed samples ─► push: encode, snappy ─► <dir>/<seq>.batch (durable, FIFO;
//!                                              │  oldest dropped past the budget)
//!                                              ▼
//!                        run: POST dest.url ─► 2xx: deleted, counted sent
//!                                            ├ 5xx, 429, no answer: kept, retried later
//!                                            └ any other status: deleted, counted rejected
//! ```
//!
//! [`RemoteWriteQueue::push`] encodes the samples ([`encode`]) and writes one batch file per call
//! (temporary name, fsync, rename, fsync of the directory) before it returns, so a push survives
//! a crash. Past the queue's byte budget the oldest batches are deleted and their samples
//! counted as dropped; the batch just pushed is always kept, even alone over the budget.
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
    /// Removes the oldest batches (except the newest and the one in flight) until the queue is
    /// within `max_bytes`, and returns them.
    fn evict(&mut self, max_bytes: u64) -> Vec<Batch> {
        let mut evicted = Vec::new();
        let mut i = 0;
        while self.bytes > max_bytes && i + 1 < self.batches.len() {
            if Some(self.batches[i].seq) == self.in_flight {
                i += 1;
                continue;
            }
            if let Some(b) = self.batches.remove(i) {
                self.bytes -= b.bytes;
                evicted.push(b);
            }
        }
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
enum Outcome {
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
    let mut request = client
        .post(&batch.dest.url)
        .timeout(REQUEST_TIMEOUT)
        .header(http::header::CONTENT_ENCODING, "snappy")
        .header(http::header::CONTENT_TYPE, "application/x-protobuf")
        .header("X-Prometheus-Remote-Write-Version", REMOTE_WRITE_VERSION)
        .header(
            http::header::USER_AGENT,
            concat!("kiln/", env!("CARGO_PKG_VERSION")),
        );
    if !batch.dest.tenant.is_empty() {
        match http::HeaderValue::from_str(&batch.dest.tenant) {
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
fn redacted(url: &str) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    use axum::extract::State as AxumState;
    use http::{HeaderMap, StatusCode};

    fn sample(name: &str, job: &str, t: i64, v: f64) -> Sample {
        Sample {
            labels: vec![("job".into(), job.into()), ("__name__".into(), name.into())],
            timestamp_ms: t,
            value: v,
        }
    }

    fn dest(url: &str, tenant: &str) -> Destination {
        Destination {
            url: url.into(),
            tenant: tenant.into(),
        }
    }

    fn decode(body: &[u8]) -> pb::WriteRequest {
        let raw = snap::raw::Decoder::new()
            .decompress_vec(body)
            .expect("snappy block format");
        pb::WriteRequest::decode(&raw[..]).expect("a WriteRequest")
    }

    fn labels(ts: &pb::TimeSeries) -> Vec<(&str, &str)> {
        ts.labels
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect()
    }

    #[test]
    fn encode_groups_sorts_and_describes() {
        let body = encode(&[
            sample("cpu_total", "b", 20, 2.0),
            sample("cpu_total", "a", 10, 1.0),
            sample("alloc_total", "a", 5, 7.0),
            sample("cpu_total", "b", 10, 1.5),
        ])
        .unwrap();
        let req = decode(&body);
        assert_eq!(req.timeseries.len(), 3);
        assert_eq!(
            labels(&req.timeseries[0]),
            [("__name__", "alloc_total"), ("job", "a")]
        );
        assert_eq!(
            labels(&req.timeseries[1]),
            [("__name__", "cpu_total"), ("job", "a")]
        );
        let b = &req.timeseries[2];
        assert_eq!(labels(b), [("__name__", "cpu_total"), ("job", "b")]);
        let points: Vec<(i64, f64)> = b.samples.iter().map(|s| (s.timestamp, s.value)).collect();
        assert_eq!(points, [(10, 1.5), (20, 2.0)]);
        let meta: Vec<(&str, i32)> = req
            .metadata
            .iter()
            .map(|m| (m.metric_family_name.as_str(), m.r#type))
            .collect();
        let counter = pb::metric_metadata::MetricType::Counter as i32;
        assert_eq!(meta, [("alloc_total", counter), ("cpu_total", counter)]);
    }

    #[test]
    fn encode_keeps_the_first_of_a_repeated_label() {
        let mut s = sample("m", "a", 1, 1.0);
        s.labels.push(("job".into(), "z".into()));
        let req = decode(&encode(&[s]).unwrap());
        assert_eq!(
            labels(&req.timeseries[0]),
            [("__name__", "m"), ("job", "a")]
        );
    }

    #[test]
    fn queue_survives_reopen_and_sets_torn_files_aside() {
        let dir = tempfile::tempdir().unwrap();
        let a = dest("http://a/api/v1/write", "t1");
        let q = RemoteWriteQueue::open(dir.path(), 1 << 20).unwrap();
        q.push(&a, &[]).unwrap();
        assert_eq!(q.pending(), 0);
        q.push(&a, &[sample("m", "x", 1, 1.0)]).unwrap();
        q.push(&a, &[sample("m", "x", 2, 2.0), sample("m", "y", 2, 3.0)])
            .unwrap();
        let bytes = q.stats().pending_bytes();
        assert!(bytes > 0);
        assert_eq!(q.stats().samples_queued(), 3);
        drop(q);

        // A torn batch, a push cut short, and a file that is not the queue's.
        std::fs::write(
            dir.path().join("00000000000000000007.batch"),
            b"kiln-remote-write 1\n{\"destin",
        )
        .unwrap();
        std::fs::write(dir.path().join("00000000000000000008.tmp"), b"half").unwrap();
        std::fs::write(dir.path().join("README"), b"not a batch").unwrap();

        let q = RemoteWriteQueue::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(q.pending(), 2);
        assert_eq!(q.stats().pending_bytes(), bytes);
        assert_eq!(q.stats().batches_corrupt(), 1);
        assert!(dir.path().join("00000000000000000007.corrupt").exists());
        assert!(!dir.path().join("00000000000000000008.tmp").exists());
        assert!(dir.path().join("README").exists());

        // Numbering goes on past every file seen, so the order holds.
        q.push(&a, &[sample("m", "x", 3, 3.0)]).unwrap();
        let seqs: Vec<u64> = q.lock().batches.iter().map(|b| b.seq).collect();
        assert_eq!(seqs, [0, 1, 9]);
        let last = q.lock().batches[2].clone();
        let (header, _) = read_header(&last.path).unwrap();
        assert_eq!(header.destination, a);
        assert_eq!(header.samples, 1);
    }

    #[test]
    fn over_budget_drops_the_oldest() {
        let dir = tempfile::tempdir().unwrap();
        let a = dest("http://a/api/v1/write", "t1");
        let one = |t| vec![sample("m", "x", t, 1.0)];
        let probe = RemoteWriteQueue::open(dir.path().join("probe"), u64::MAX).unwrap();
        probe.push(&a, &one(1)).unwrap();
        let size = probe.stats().pending_bytes();

        // Room for two batches of this size.
        let q = RemoteWriteQueue::open(dir.path().join("q"), 2 * size + size / 2).unwrap();
        for t in 1..=4 {
            q.push(&a, &one(t)).unwrap();
        }
        assert_eq!(q.pending(), 2);
        assert_eq!(q.stats().samples_dropped(), 2);
        assert_eq!(q.stats().pending_bytes(), 2 * size);
        let seqs: Vec<u64> = q.lock().batches.iter().map(|b| b.seq).collect();
        assert_eq!(seqs, [2, 3]);
        let files = std::fs::read_dir(dir.path().join("q")).unwrap().count();
        assert_eq!(files, 2);

        // A batch larger than the whole budget is kept, alone.
        let big: Vec<Sample> = (0..200)
            .map(|t| sample("m", &format!("job-{t}"), t, (t as f64).sqrt()))
            .collect();
        q.push(&a, &big).unwrap();
        assert_eq!(q.pending(), 1);
        assert_eq!(q.stats().samples_dropped(), 4);
        assert!(q.stats().pending_bytes() > 2 * size);

        // Reopened with a smaller budget, the queue keeps only what fits (and the newest).
        let r = RemoteWriteQueue::open(dir.path().join("r"), u64::MAX).unwrap();
        for t in 1..=3 {
            r.push(&a, &one(t)).unwrap();
        }
        drop(r);
        let r = RemoteWriteQueue::open(dir.path().join("r"), size).unwrap();
        assert_eq!(r.pending(), 1);
        assert_eq!(r.stats().samples_dropped(), 2);
        assert_eq!(r.lock().batches[0].seq, 2);
    }

    /// A remote write receiver answering with `script`'s statuses, then 204.
    #[derive(Default)]
    struct Receiver {
        script: Mutex<HashMap<String, VecDeque<StatusCode>>>,
        /// Every request: tenant, headers, decoded body and the status answered.
        seen: Mutex<Vec<(String, HeaderMap, pb::WriteRequest, StatusCode)>>,
    }

    async fn receive(
        AxumState(r): AxumState<Arc<Receiver>>,
        headers: HeaderMap,
        body: Bytes,
    ) -> (StatusCode, String) {
        let tenant = headers
            .get("x-scope-orgid")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let status = r
            .script
            .lock()
            .unwrap()
            .get_mut(&tenant)
            .and_then(|s| s.pop_front())
            .unwrap_or(StatusCode::NO_CONTENT);
        let req = decode(&body);
        r.seen.lock().unwrap().push((tenant, headers, req, status));
        let body = if status.is_success() {
            String::new()
        } else {
            "out of order sample".repeat(20)
        };
        (status, body)
    }

    async fn start_receiver(script: &[(&str, &[StatusCode])]) -> (Arc<Receiver>, String) {
        let receiver = Arc::new(Receiver::default());
        for (tenant, statuses) in script {
            receiver
                .script
                .lock()
                .unwrap()
                .insert(tenant.to_string(), statuses.iter().copied().collect());
        }
        let app = axum::Router::new()
            .route("/api/v1/write", axum::routing::post(receive))
            .with_state(Arc::clone(&receiver));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/api/v1/write", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (receiver, url)
    }

    fn client() -> reqwest::Client {
        reqwest::Client::builder().no_proxy().build().unwrap()
    }

    async fn until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn short(q: RemoteWriteQueue) -> Arc<RemoteWriteQueue> {
        Arc::new(q.with_backoff(Duration::from_millis(10), Duration::from_millis(40)))
    }

    #[tokio::test]
    async fn sends_in_order_exactly_once_through_retries() {
        let unavailable = StatusCode::SERVICE_UNAVAILABLE;
        let (receiver, url) = start_receiver(&[("t1", &[unavailable, unavailable])]).await;
        let dir = tempfile::tempdir().unwrap();
        let q = short(RemoteWriteQueue::open(dir.path(), 1 << 20).unwrap());
        let a = dest(&url, "t1");
        for t in 1..=3 {
            q.push(&a, &[sample("m", "x", t, t as f64)]).unwrap();
        }
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let runner = tokio::spawn(Arc::clone(&q).run(client(), async {
            let _ = stopped.await;
        }));
        until("the queue is empty", || q.pending() == 0).await;
        // A push while running is sent promptly.
        q.push(&a, &[sample("m", "x", 4, 4.0)]).unwrap();
        until("the late batch is sent", || q.pending() == 0).await;
        let _ = stop.send(());
        runner.await.unwrap();

        let seen = receiver.seen.lock().unwrap();
        let statuses: Vec<u16> = seen.iter().map(|s| s.3.as_u16()).collect();
        assert_eq!(statuses, [503, 503, 204, 204, 204, 204]);
        let delivered: Vec<i64> = seen
            .iter()
            .filter(|s| s.3.is_success())
            .map(|s| s.2.timeseries[0].samples[0].timestamp)
            .collect();
        assert_eq!(delivered, [1, 2, 3, 4]);
        for (tenant, headers, _, _) in seen.iter() {
            assert_eq!(tenant, "t1");
            assert_eq!(headers["content-encoding"], "snappy");
            assert_eq!(headers["content-type"], "application/x-protobuf");
            assert_eq!(headers["x-prometheus-remote-write-version"], "0.1.0");
            assert_eq!(
                headers["user-agent"],
                concat!("kiln/", env!("CARGO_PKG_VERSION"))
            );
        }
        assert_eq!(q.stats().samples_sent(), 4);
        assert_eq!(q.stats().send_failures(), 2);
        assert_eq!(q.stats().samples_rejected(), 0);
        assert_eq!(q.stats().pending_bytes(), 0);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[tokio::test]
    async fn a_refused_batch_is_counted_and_removed() {
        // Too many requests is worth a retry; a bad request is not.
        let script = [StatusCode::TOO_MANY_REQUESTS, StatusCode::BAD_REQUEST];
        let (receiver, url) = start_receiver(&[("t1", &script)]).await;
        let dir = tempfile::tempdir().unwrap();
        let q = short(RemoteWriteQueue::open(dir.path(), 1 << 20).unwrap());
        let a = dest(&url, "t1");
        q.push(&a, &[sample("m", "x", 1, 1.0), sample("m", "y", 1, 1.0)])
            .unwrap();
        q.push(&a, &[sample("m", "x", 2, 2.0)]).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let runner = tokio::spawn(Arc::clone(&q).run(client(), async {
            let _ = stopped.await;
        }));
        until("the queue is empty", || q.pending() == 0).await;
        let _ = stop.send(());
        runner.await.unwrap();

        assert_eq!(q.stats().samples_rejected(), 2);
        assert_eq!(q.stats().samples_sent(), 1);
        assert_eq!(q.stats().send_failures(), 1);
        let seen = receiver.seen.lock().unwrap();
        let attempts: Vec<(u16, i64)> = seen
            .iter()
            .map(|s| (s.3.as_u16(), s.2.timeseries[0].samples[0].timestamp))
            .collect();
        assert_eq!(attempts, [(429, 1), (400, 1), (204, 2)]);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[tokio::test]
    async fn a_failing_destination_does_not_hold_back_another() {
        let down = [StatusCode::INTERNAL_SERVER_ERROR; 1000];
        let (receiver, url) = start_receiver(&[("down", &down)]).await;
        let dir = tempfile::tempdir().unwrap();
        let q = short(RemoteWriteQueue::open(dir.path(), 1 << 20).unwrap());
        let (bad, good) = (dest(&url, "down"), dest(&url, "up"));
        q.push(&bad, &[sample("m", "x", 1, 1.0)]).unwrap();
        q.push(&good, &[sample("m", "x", 1, 1.0)]).unwrap();
        q.push(&bad, &[sample("m", "x", 2, 2.0)]).unwrap();
        q.push(&good, &[sample("m", "x", 2, 2.0)]).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let runner = tokio::spawn(Arc::clone(&q).run(client(), async {
            let _ = stopped.await;
        }));
        until("the healthy destination is served", || {
            q.stats().samples_sent() == 2
        })
        .await;
        until("the failing destination is retried", || {
            q.stats().send_failures() >= 3
        })
        .await;
        let _ = stop.send(());
        runner.await.unwrap();

        assert_eq!(q.pending(), 2);
        let seen = receiver.seen.lock().unwrap();
        // The failing destination's second batch never went before its first.
        assert!(
            seen.iter()
                .filter(|s| s.0 == "down")
                .all(|s| s.2.timeseries[0].samples[0].timestamp == 1)
        );
        let up: Vec<i64> = seen
            .iter()
            .filter(|s| s.0 == "up")
            .map(|s| s.2.timeseries[0].samples[0].timestamp)
            .collect();
        assert_eq!(up, [1, 2]);
    }

    #[test]
    fn urls_are_logged_without_credentials() {
        assert_eq!(
            redacted("https://user:secret@mimir.example/api/v1/push"),
            "https://mimir.example/api/v1/push"
        );
    }
}
