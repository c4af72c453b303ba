//! `kiln upload`: sends the Parca agent's offline recordings (`--offline-mode-storage-path`) to
//! a Kiln, as `parca-agent --offline-mode-upload` does, and also the newer one-frame layout that
//! Parca's own uploader cannot read.
//!
//! A file (`<unix seconds>-<pid>.padata`, or `.padata.zst` once the agent rotated and compressed
//! it) is an 8-byte header — magic `A6 E7 CC CA`, `u16` big-endian version 0, `u16` big-endian
//! batch count — then frames of a `u32` big-endian length and an Arrow IPC stream. A v1 batch is
//! two frames (a sample record naming stacks by id, then a locations record of the stacks not
//! logged earlier in the file); a v2 batch is one self-contained record. The agent fsyncs a batch
//! before it advances the count, so the count is trusted and bytes past it (a torn tail) ignored.
//!
//! Files go in timestamp order. v1 batches go through the `Write` round trip: the locations
//! frames of the file that hold the ids Kiln asks for are sent as they are (Kiln reads locations
//! records until it has every id asked for); v2 batches go as `WriteArrow`.
//!
//! **Resuming.** After each batch Kiln acknowledged, `<file>.progress` (next to the file) is
//! rewritten atomically with the number of batches done; a restarted upload skips them. Every
//! batch carries a `kiln-upload-id` header (file name, batch, hash of its bytes), and Kiln answers
//! a batch it stored under that id before with OK without storing it again, so the one batch that
//! may have been acknowledged between the last progress record and an interruption is not
//! duplicated. A file is deleted only once all its batches are acknowledged; its progress record
//! goes after it. Retryable answers (`RESOURCE_EXHAUSTED` — 429 — and the 5xx ones, or a lost
//! connection) are retried with exponential backoff.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use kiln_otel::parca as format;
use kiln_proto::parca::profilestore::v1alpha1 as pb;
use kiln_proto::parca::profilestore::v1alpha1::profile_store_service_client::ProfileStoreServiceClient;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use crate::api::parca::UPLOAD_ID_HEADER;

/// `kiln upload` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct UploadArgs {
    /// The agent's offline storage directory (`--offline-mode-storage-path`).
    #[arg(long, env = "KILN_UPLOAD_DIR")]
    pub dir: PathBuf,
    /// Kiln's address, e.g. `http://127.0.0.1:4040` (gRPC over h2c).
    #[arg(long, env = "KILN_UPLOAD_URL")]
    pub url: String,
    /// A bearer token with the write scope (`--auth jwt` or `static`).
    #[arg(long, env = "KILN_UPLOAD_TOKEN")]
    pub token: Option<String>,
    /// The tenant, sent as `X-Scope-OrgID` (for `--auth trusted-header`).
    #[arg(long, env = "KILN_UPLOAD_TENANT")]
    pub tenant: Option<String>,
    /// Attempts of one batch before giving up on retryable answers (429, 5xx, no connection).
    #[arg(long, env = "KILN_UPLOAD_RETRIES", default_value_t = 10)]
    pub retries: u32,
    /// At most this many batches a second, to spare the server (0 = as fast as it answers).
    #[arg(long, env = "KILN_UPLOAD_RATE", default_value_t = 0.0)]
    pub rate: f64,
    /// No progress bar even on a terminal.
    #[arg(long, env = "KILN_UPLOAD_QUIET")]
    pub quiet: bool,
}

const MAGIC: [u8; 4] = [0xA6, 0xE7, 0xCC, 0xCA];
const DATA: &str = ".padata";
const COMPRESSED: &str = ".padata.zst";
const PROGRESS: &str = ".progress";
/// Most bytes one record of an offline file may hold once its buffers are decompressed.
const MAX_RECORD_BYTES: usize = 256 << 20;

/// An offline file to upload.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Recording {
    /// `<seconds>-<pid>`.
    stem: String,
    seconds: u64,
    /// The file read: the `.padata` when both it and its `.padata.zst` are there (a compression
    /// the agent did not finish), else the one there is.
    path: PathBuf,
    /// Both files, deleted once uploaded.
    all: Vec<PathBuf>,
}

impl Recording {
    fn progress_path(&self, dir: &Path) -> PathBuf {
        dir.join(format!("{}{PROGRESS}", self.stem))
    }
}

/// The recordings of `dir` in timestamp order; removes progress records of files gone.
fn recordings(dir: &Path) -> anyhow::Result<Vec<Recording>> {
    let mut by_stem: std::collections::BTreeMap<String, Vec<PathBuf>> = Default::default();
    let mut progress = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if let Some(stem) = name
            .strip_suffix(COMPRESSED)
            .or_else(|| name.strip_suffix(DATA))
        {
            by_stem.entry(stem.to_owned()).or_default().push(path);
        } else if let Some(stem) = name.strip_suffix(PROGRESS) {
            progress.push((stem.to_owned(), path));
        }
    }
    for (stem, path) in progress {
        if !by_stem.contains_key(&stem) {
            let _ = std::fs::remove_file(path);
        }
    }
    let mut out: Vec<Recording> = by_stem
        .into_iter()
        .map(|(stem, mut all)| {
            all.sort();
            let path = all
                .iter()
                .find(|p| p.to_string_lossy().ends_with(DATA))
                .unwrap_or(&all[0])
                .clone();
            let seconds = stem
                .split('-')
                .next()
                .and_then(|s| s.parse().ok())
                .unwrap_or(u64::MAX);
            Recording {
                stem,
                seconds,
                path,
                all,
            }
        })
        .collect();
    out.sort_by(|a, b| (a.seconds, &a.stem).cmp(&(b.seconds, &b.stem)));
    Ok(out)
}

/// One batch of a file.
#[derive(Debug, Clone)]
enum Batch {
    /// A v1 sample record (its frame's bytes); its stacks are in [`Parsed::locations`].
    V1 { samples: Bytes },
    /// A v2 record.
    V2(Bytes),
}

/// A parsed file: its batches (as many as the header counts) and its locations frames by id.
#[derive(Debug, Default)]
struct Parsed {
    batches: Vec<Batch>,
    locations: Vec<Bytes>,
    /// Stack id → index into `locations` (the first frame that has it).
    location_of: std::collections::HashMap<format::StackId, usize>,
}

/// Reads a recording's bytes per the format; bytes past the counted batches (a torn tail) are
/// ignored.
fn parse(bytes: Bytes) -> anyhow::Result<Parsed> {
    if bytes.len() < 8 || bytes[..4] != MAGIC {
        bail!("not a Parca agent offline file (no A6E7CCCA magic)");
    }
    let version = u16::from_be_bytes([bytes[4], bytes[5]]);
    if version != 0 {
        bail!("offline file version {version}: only version 0 is known");
    }
    let count = u16::from_be_bytes([bytes[6], bytes[7]]) as usize;
    let mut at = 8usize;
    let mut frame = || -> anyhow::Result<Bytes> {
        let Some(len) = bytes.get(at..at + 4) else {
            bail!("the file ends inside a counted batch (at byte {at})");
        };
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        if bytes.len() - (at + 4) < len {
            bail!("the file ends inside a counted batch (frame of {len} bytes at byte {at})");
        }
        let body = bytes.slice(at + 4..at + 4 + len);
        at += 4 + len;
        Ok(body)
    };
    let mut parsed = Parsed::default();
    for b in 0..count {
        let first = frame().with_context(|| format!("batch {b}"))?;
        let batches =
            format::read_ipc(&first, MAX_RECORD_BYTES).with_context(|| format!("batch {b}"))?;
        let Some(record) = batches.first() else {
            bail!("batch {b} has an empty record");
        };
        if format::schema_version(record) == Some("v2") {
            parsed.batches.push(Batch::V2(first));
            continue;
        }
        let locations = frame().with_context(|| format!("batch {b}'s locations"))?;
        let index = parsed.locations.len();
        for batch in
            format::read_ipc(&locations, MAX_RECORD_BYTES).with_context(|| format!("batch {b}"))?
        {
            for id in format::locations_record_ids(&batch)? {
                parsed.location_of.entry(id).or_insert(index);
            }
        }
        parsed.locations.push(locations);
        parsed.batches.push(Batch::V1 { samples: first });
    }
    Ok(parsed)
}

fn read_recording(r: &Recording) -> anyhow::Result<Bytes> {
    let raw = std::fs::read(&r.path).with_context(|| format!("reading {}", r.path.display()))?;
    if r.path.to_string_lossy().ends_with(COMPRESSED) {
        // A torn zstd stream (a copy cut short) keeps what decodes: the count decides.
        let mut out = Vec::new();
        let mut decoder = zstd::stream::read::Decoder::new(raw.as_slice())?;
        let result = std::io::copy(&mut decoder, &mut out);
        if let Err(e) = result
            && out.len() < 8
        {
            return Err(e).with_context(|| format!("decompressing {}", r.path.display()));
        }
        return Ok(out.into());
    }
    Ok(raw.into())
}

fn read_progress(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Writes the batches done, atomically (a temporary file renamed over the record), durably.
fn write_progress(dir: &Path, path: &Path, done: usize) -> anyhow::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("progress.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    writeln!(f, "{done}")?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

/// Whether a gRPC answer is worth another attempt (429 and the 5xx ones; no connection).
fn retryable(s: &tonic::Status) -> bool {
    use tonic::Code;
    matches!(
        s.code(),
        Code::ResourceExhausted
            | Code::Unavailable
            | Code::Internal
            | Code::Unknown
            | Code::DeadlineExceeded
            | Code::Aborted
    )
}

struct Uploader {
    client: ProfileStoreServiceClient<Channel>,
    args: UploadArgs,
}

impl Uploader {
    fn request<T>(&self, msg: T, upload_id: &str) -> anyhow::Result<tonic::Request<T>> {
        let mut req = tonic::Request::new(msg);
        let md = req.metadata_mut();
        if let Some(t) = &self.args.token {
            md.insert("authorization", format!("Bearer {t}").parse()?);
        }
        if let Some(t) = &self.args.tenant {
            md.insert("x-scope-orgid", t.parse()?);
        }
        md.insert(UPLOAD_ID_HEADER, upload_id.parse()?);
        Ok(req)
    }

    /// Sends one batch until Kiln acknowledges it (retrying what is retryable).
    async fn send(&self, parsed: &Parsed, batch: &Batch, upload_id: &str) -> anyhow::Result<u64> {
        let mut delay = Duration::from_millis(250);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let result = match batch {
                Batch::V2(record) => self.write_arrow(record, upload_id).await,
                Batch::V1 { samples } => self.write(parsed, samples, upload_id).await,
            };
            match result {
                Ok(bytes) => return Ok(bytes),
                Err(s) if retryable(&s) && attempt < self.args.retries => {
                    tracing::warn!(code = ?s.code(), message = s.message(), attempt, "retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(30));
                }
                Err(s) => bail!("Kiln refused the batch: {:?}: {}", s.code(), s.message()),
            }
        }
    }

    async fn write_arrow(&self, record: &Bytes, upload_id: &str) -> Result<u64, tonic::Status> {
        let req = self
            .request(
                pb::WriteArrowRequest {
                    ipc_buffer: record.clone(),
                },
                upload_id,
            )
            .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
        self.client.clone().write_arrow(req).await?;
        Ok(record.len() as u64)
    }

    /// The `Write` round trip; the stream ending with OK is Kiln's acknowledgement.
    async fn write(
        &self,
        parsed: &Parsed,
        samples: &Bytes,
        upload_id: &str,
    ) -> Result<u64, tonic::Status> {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let mut sent = samples.len() as u64;
        tx.send(pb::WriteRequest {
            record: samples.clone(),
        })
        .await
        .map_err(|_| tonic::Status::unavailable("the stream closed"))?;
        let req = self
            .request(ReceiverStream::new(rx), upload_id)
            .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
        let mut inbound = self.client.clone().write(req).await?.into_inner();
        if let Some(ask) = inbound.message().await? {
            let ids = format::read_unknown_ids(&ask.record)
                .map_err(|e| tonic::Status::internal(e.to_string()))?;
            let mut frames: Vec<usize> = ids
                .iter()
                .filter_map(|id| parsed.location_of.get(id).copied())
                .collect();
            frames.sort_unstable();
            frames.dedup();
            for f in frames {
                sent += parsed.locations[f].len() as u64;
                if tx
                    .send(pb::WriteRequest {
                        record: parsed.locations[f].clone(),
                    })
                    .await
                    .is_err()
                {
                    break;
                }
            }
        }
        drop(tx);
        while inbound.message().await?.is_some() {}
        Ok(sent)
    }
}

/// Runs `kiln upload`.
pub async fn run(args: UploadArgs) -> anyhow::Result<()> {
    let files = recordings(&args.dir)?;
    let channel = Channel::from_shared(args.url.clone())
        .with_context(|| format!("--url {}", args.url))?
        .connect_lazy();
    let uploader = Uploader {
        client: ProfileStoreServiceClient::new(channel)
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(usize::MAX),
        args: args.clone(),
    };
    let total: u64 = files
        .iter()
        .filter_map(|f| std::fs::metadata(&f.path).ok())
        .map(|m| m.len())
        .sum();
    let bar = if args.quiet || !std::io::stderr().is_terminal() {
        indicatif::ProgressBar::hidden()
    } else {
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg} [{bar:30}] {binary_bytes}/{binary_total_bytes} ({binary_bytes_per_sec}, {eta})",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar
    };
    let started = Instant::now();
    let (mut batches_sent, mut bytes_sent) = (0u64, 0u64);
    let pace = (args.rate > 0.0).then(|| Duration::from_secs_f64(1.0 / args.rate));
    for (n, file) in files.iter().enumerate() {
        let size = std::fs::metadata(&file.path).map_or(0, |m| m.len());
        let parsed = read_recording(file)
            .and_then(parse)
            .with_context(|| format!("{}", file.path.display()))?;
        let progress = file.progress_path(&args.dir);
        let done = read_progress(&progress).min(parsed.batches.len());
        for (b, batch) in parsed.batches.iter().enumerate().skip(done) {
            let batch_started = Instant::now();
            let content = match batch {
                Batch::V1 { samples } => samples,
                Batch::V2(r) => r,
            };
            let upload_id = format!(
                "{}:{b}:{:016x}",
                file.stem,
                xxhash_rust::xxh3::xxh3_64(content)
            );
            bytes_sent += uploader
                .send(&parsed, batch, &upload_id)
                .await
                .with_context(|| format!("{} batch {b}", file.path.display()))?;
            batches_sent += 1;
            write_progress(&args.dir, &progress, b + 1)?;
            bar.set_message(format!(
                "file {}/{} batch {}/{} ({} batches sent)",
                n + 1,
                files.len(),
                b + 1,
                parsed.batches.len(),
                batches_sent
            ));
            if let Some(pace) = pace {
                tokio::time::sleep(pace.saturating_sub(batch_started.elapsed())).await;
            }
        }
        // Every batch acknowledged: the file goes, then its progress record.
        for p in &file.all {
            std::fs::remove_file(p).with_context(|| format!("removing {}", p.display()))?;
        }
        let _ = std::fs::remove_file(&progress);
        bar.inc(size);
    }
    bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64().max(1e-3);
    println!(
        "uploaded {} files, {batches_sent} batches, {bytes_sent} bytes in {secs:.1} s ({:.0} bytes/s)",
        files.len(),
        bytes_sent as f64 / secs
    );
    Ok(())
}

#[cfg(test)]
mod tests;
