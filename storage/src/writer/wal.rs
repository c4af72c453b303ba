//! A write shard's write-ahead log (ADR 0018; [`crate::writer`]'s logged shards): records
//! appended and synced in groups, read back after a restart above a checkpoint, and deleted by
//! whole files once a registered segment holds them. A record is opaque here: the gateway's are
//! a request's body as its decoder read it, with what decoding took from the request
//! (`kiln_otel::record`), since encoding the normalized profiles again took 13.6–19.3 % of the
//! server's CPU in the variants profiled (docs/performance.md, "Write-ahead log records").
//!
//! A log is a directory of files named by the sequence number of their first record
//! (`00000000000000000001.kwal`), each a header and frames:
//!
//! ```text
//!  header:  b"KWAL" | u16 LE version (2) | u16 LE 0 | u64 LE first sequence number
//!  frame:   u32 LE payload length | u32 LE CRC-32 of the rest | u64 LE sequence number
//!           | u64 LE received (Unix ms) | payload (a record)
//! ```
//!
//! A frame's time is when its group was appended: a tenant's deletion refuses what was received
//! before it, replayed or not ([`crate::metastore::Metastore::delete_tenant`]). Version 1 files
//! (frames without the time) are read with the file's modification time, a bound above it.
//!
//! Sequence numbers rise by one from frame to frame and from file to file. A group of records
//! is written and synced (`fdatasync`) before any of them is acknowledged, so what a crash tears
//! was never acknowledged: reading a file stops at its first frame that is short, fails its CRC
//! or breaks the sequence, and the frames before it are the file's records. A process that opens
//! the log appends to a new file, so every file but the newest ends where its writer stopped.
//! The bytes a read skips are counted ([`FileReplay::skipped_bytes`]): in the newest file after
//! a crash they are a torn group, otherwise damage. A replay keeps what it cannot use under
//! [`ASIDE_DIR`] before the checkpoint passes it: a damaged file whole, a record that does not
//! decode by itself.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::error::io;
use crate::{Error, Result};

#[cfg(test)]
mod tests;

const MAGIC: &[u8; 4] = b"KWAL";
const VERSION: u16 = 2;
/// Files written before frames carried their time.
const VERSION_UNTIMED: u16 = 1;
const HEADER_BYTES: usize = 16;
const FRAME_BYTES: usize = 24;
const FRAME_BYTES_UNTIMED: usize = 16;
const EXTENSION: &str = "kwal";

/// The directory under a log's where what a replay could not use is kept: records that do
/// not decode (`<seq>.record`) and files damaged before their end (`<first>.kwal`).
pub const ASIDE_DIR: &str = "aside";

/// What an opened log holds above the checkpoint: its files, read one at a time
/// ([`Replay::next_file`]), so a replay holds one file's records in memory, not the log's.
#[derive(Debug, Default)]
pub struct Replay {
    checkpoint: u64,
    /// Files left to read (first sequence number, path), oldest first.
    files: std::collections::VecDeque<(u64, PathBuf)>,
}

/// A record as a log file holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame<P = Vec<u8>> {
    pub seq: u64,
    /// When its group was appended (Unix ms); 0 in a version 1 file, which does not say.
    pub received_ms: u64,
    pub payload: P,
}

/// One file's records above the checkpoint.
#[derive(Debug)]
pub struct FileReplay {
    pub path: PathBuf,
    /// Records above the checkpoint, by sequence number, oldest first. A version 1 file's
    /// carry the file's modification time, after each was received.
    pub records: Vec<Frame>,
    /// Bytes after the file's last whole frame (a torn group, or damage).
    pub skipped_bytes: u64,
    /// Whether this is the newest file, whose end a crash may tear. Bytes skipped in an older
    /// file are damage (or a failed group's, never acknowledged).
    pub newest: bool,
}

impl Replay {
    /// Reads the next file. Blocking file IO.
    pub fn next_file(&mut self) -> Result<Option<FileReplay>> {
        let Some((first, path)) = self.files.pop_front() else {
            return Ok(None);
        };
        let mut bytes = Vec::new();
        let mut file = std::fs::File::open(&path).map_err(io(&path))?;
        file.read_to_end(&mut bytes).map_err(io(&path))?;
        let modified_ms = file
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(u64::MAX, |d| d.as_millis() as u64);
        let (records, whole) = read_file(&bytes, first);
        let records = records
            .into_iter()
            .filter(|f| f.seq > self.checkpoint)
            .map(|f| Frame {
                seq: f.seq,
                received_ms: if f.received_ms == 0 {
                    modified_ms
                } else {
                    f.received_ms
                },
                payload: f.payload.to_vec(),
            })
            .collect();
        Ok(Some(FileReplay {
            skipped_bytes: (bytes.len() - whole) as u64,
            records,
            newest: self.files.is_empty(),
            path,
        }))
    }
}

/// Keeps a copy of `path` (a damaged log file) under the log's [`ASIDE_DIR`], durably, and
/// returns where; a hard link where the file system allows one. Blocking file IO.
pub fn set_aside_file(path: &Path) -> Result<PathBuf> {
    let dir = path.parent().unwrap_or(Path::new(".")).join(ASIDE_DIR);
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let to = dir.join(path.file_name().unwrap_or_default());
    if !to.exists() && std::fs::hard_link(path, &to).is_err() {
        std::fs::copy(path, &to).map_err(io(&to))?;
        std::fs::File::open(&to)
            .and_then(|f| f.sync_all())
            .map_err(io(&to))?;
    }
    std::fs::File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(io(&dir))?;
    Ok(to)
}

/// Keeps record `seq` of the log in `dir` (one that does not decode) under its
/// [`ASIDE_DIR`], durably, and returns where. Blocking file IO.
pub fn set_aside_record(dir: &Path, seq: u64, payload: &[u8]) -> Result<PathBuf> {
    let aside = dir.join(ASIDE_DIR);
    std::fs::create_dir_all(&aside).map_err(io(&aside))?;
    let to = aside.join(format!("{seq:020}.record"));
    std::fs::write(&to, payload)
        .and_then(|()| std::fs::File::open(&to)?.sync_all())
        .and_then(|()| std::fs::File::open(&aside)?.sync_all())
        .map_err(io(&to))?;
    Ok(to)
}

/// A shard's log.
#[derive(Debug)]
pub struct Log {
    dir: PathBuf,
    /// Each file's first sequence number and path, oldest first; the last takes appends.
    files: Vec<(u64, PathBuf)>,
    /// The file appends go to, and its length (none until the first append, and after a
    /// release that deleted it).
    current: Option<(std::fs::File, u64)>,
    next_seq: u64,
    max_file_bytes: u64,
    /// A group's frame headers (16 bytes a record), reused.
    buf: Vec<u8>,
}

impl Log {
    /// Opens the log in `dir` (creating it), reads the records an earlier process left above
    /// `checkpoint` (the last sequence number a registered segment holds) and deletes the files
    /// wholly at or below it. Appends go to a new file of at most about `max_file_bytes`.
    pub fn open(dir: &Path, checkpoint: u64, max_file_bytes: u64) -> Result<(Self, Replay)> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io(dir))? {
            let path = entry.map_err(io(dir))?.path();
            if path.extension().and_then(|e| e.to_str()) != Some(EXTENSION) {
                continue;
            }
            let first = path
                .file_stem()
                .and_then(|s| s.to_str())
                .and_then(|s| s.parse::<u64>().ok());
            if let Some(first) = first {
                files.push((first, path));
            }
        }
        files.sort();
        // Every record of an older file is numbered below the newest file's first, so the
        // newest file alone tells where numbering goes on. A newest file without a whole
        // frame keeps its number taken (a new file of that name could not be made).
        let mut last = checkpoint;
        if let Some((first, path)) = files.last() {
            let mut bytes = Vec::new();
            std::fs::File::open(path)
                .and_then(|mut f| f.read_to_end(&mut bytes))
                .map_err(io(path))?;
            let (records, _) = read_file(&bytes, *first);
            last = last.max(records.last().map_or(*first, |f| f.seq));
        }
        // Only a damaged or forged file names the last number there is.
        let next_seq = last.checked_add(1).ok_or_else(|| {
            io(dir)(std::io::Error::other(
                "the log's sequence numbers are exhausted",
            ))
        })?;
        let mut log = Self {
            dir: dir.to_owned(),
            files,
            current: None,
            next_seq,
            max_file_bytes,
            buf: Vec::new(),
        };
        // Files a registered segment already holds whole (a crash came between the segment's
        // registration and their deletion) go now: left, they would wait for the shard's next
        // segment, and a metastore rebuilt without the checkpoint would replay them again.
        log.release_through(checkpoint)?;
        let replay = Replay {
            checkpoint,
            files: log.files.iter().cloned().collect(),
        };
        Ok((log, replay))
    }

    /// The log's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Keeps the records numbered `from..=through` under [`ASIDE_DIR`] (a segment that held
    /// their writes could not be made), read back from the log's files; returns how many.
    /// Blocking file IO.
    pub fn set_aside_records(&self, from: u64, through: u64) -> Result<usize> {
        let mut kept = 0;
        for (first, path) in &self.files {
            let mut bytes = Vec::new();
            std::fs::File::open(path)
                .and_then(|mut f| f.read_to_end(&mut bytes))
                .map_err(io(path))?;
            let (records, _) = read_file(&bytes, *first);
            for Frame { seq, payload, .. } in records {
                if (from..=through).contains(&seq) {
                    set_aside_record(&self.dir, seq, payload)?;
                    kept += 1;
                }
            }
        }
        Ok(kept)
    }

    /// Appends `records` in order, received at `received_ms` (Unix ms), and syncs them; returns
    /// the sequence number of the last (of the one before them when there are none). Once this
    /// returns they survive a crash.
    pub fn append<'a>(
        &mut self,
        records: impl IntoIterator<Item = &'a [u8]>,
        received_ms: u64,
    ) -> Result<u64> {
        // The frames' headers are made in `buf`; the payloads are written from where they are
        // (one `writev` of headers and payloads), not copied after them.
        self.buf.clear();
        let payloads: Vec<&[u8]> = records.into_iter().collect();
        let mut seq = self.next_seq;
        for payload in &payloads {
            let len = u32::try_from(payload.len()).map_err(|_| {
                Error::InvalidWrite("a write is too large for the write-ahead log".into())
            })?;
            self.buf.extend_from_slice(&len.to_le_bytes());
            self.buf
                .extend_from_slice(&frame_crc(seq, Some(received_ms), payload).to_le_bytes());
            self.buf.extend_from_slice(&seq.to_le_bytes());
            self.buf.extend_from_slice(&received_ms.to_le_bytes());
            seq += 1;
        }
        if seq == self.next_seq {
            return Ok(seq - 1);
        }
        if self
            .current
            .as_ref()
            .is_none_or(|(_, len)| *len >= self.max_file_bytes)
        {
            self.start_file()?;
        }
        let path = &self.files.last().expect("a file was started").1;
        let (file, len) = self.current.as_mut().expect("a file was started");
        let mut slices: Vec<std::io::IoSlice<'_>> = self
            .buf
            .chunks_exact(FRAME_BYTES)
            .zip(&payloads)
            .flat_map(|(header, payload)| {
                [
                    std::io::IoSlice::new(header),
                    std::io::IoSlice::new(payload),
                ]
            })
            .collect();
        let bytes = self.buf.len() + payloads.iter().map(|p| p.len()).sum::<usize>();
        let written = write_all_vectored(file, &mut slices).and_then(|()| file.sync_data());
        // The group's numbers are used either way: a failed group may have left whole frames
        // (replayed after a restart, as a write whose answer was lost is retried), and after it
        // the file ends in bytes a reader stops at, so the next group goes to a new file.
        self.next_seq = seq;
        if let Err(e) = written {
            let e = io(path)(e);
            self.current = None;
            return Err(e);
        }
        *len += bytes as u64;
        Ok(seq - 1)
    }

    /// Starts a file for the records from `next_seq` on, its name made durable.
    fn start_file(&mut self) -> Result<()> {
        let path = self.dir.join(format!("{:020}.{EXTENSION}", self.next_seq));
        let mut header = Vec::with_capacity(HEADER_BYTES);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&VERSION.to_le_bytes());
        header.extend_from_slice(&0u16.to_le_bytes());
        header.extend_from_slice(&self.next_seq.to_le_bytes());
        let mut file = std::fs::OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)
            .map_err(io(&path))?;
        let made = file
            .write_all(&header)
            .and_then(|()| file.sync_all())
            .and_then(|()| std::fs::File::open(&self.dir)?.sync_all());
        if let Err(e) = made {
            // Not left behind: the next group tries the same name again.
            let _ = std::fs::remove_file(&path);
            return Err(io(&path)(e));
        }
        self.files.push((self.next_seq, path));
        self.current = Some((file, HEADER_BYTES as u64));
        Ok(())
    }

    /// The sequence number of the last record appended or read (numbers of a failed group
    /// included), or the checkpoint the log opened at.
    pub fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }

    /// Deletes the files whose every record is at or below `seq` (a registered segment holds
    /// them); returns how many.
    pub fn release_through(&mut self, seq: u64) -> Result<usize> {
        // A file's records end where the next file's begin; the newest file's at `next_seq`.
        let ends: Vec<u64> = self
            .files
            .iter()
            .skip(1)
            .map(|(first, _)| *first)
            .chain([self.next_seq])
            .take(self.files.len())
            .collect();
        let done = ends.iter().take_while(|&&end| end <= seq + 1).count();
        for (_, path) in self.files.drain(..done) {
            std::fs::remove_file(&path).map_err(io(&path))?;
        }
        if self.files.is_empty() {
            self.current = None;
        }
        Ok(done)
    }

    /// The log's files, oldest first.
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|(_, p)| p.as_path())
    }
}

/// `Write::write_all` of `slices` in as few `writev` calls as the kernel takes them.
fn write_all_vectored(
    file: &mut std::fs::File,
    mut slices: &mut [std::io::IoSlice<'_>],
) -> std::io::Result<()> {
    // Empty slices first (an empty record) are dropped, so a write of nothing means the
    // file took nothing (`WriteZero`), never that only empty slices were left.
    std::io::IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        match file.write_vectored(slices) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => std::io::IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A frame's CRC: of its sequence number, its time (none in a version 1 file) and payload.
fn frame_crc(seq: u64, received_ms: Option<u64>, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&seq.to_le_bytes());
    if let Some(ms) = received_ms {
        h.update(&ms.to_le_bytes());
    }
    h.update(payload);
    h.finalize()
}

/// The records of one file whose first record is `first`, and the bytes they end at (the
/// header's end when there are none, 0 when the header is bad).
pub(crate) fn read_file(bytes: &[u8], first: u64) -> (Vec<Frame<&[u8]>>, usize) {
    let version = bytes.get(4..6).map(|v| u16::from_le_bytes([v[0], v[1]]));
    let timed = version == Some(VERSION);
    let header_ok = bytes.len() >= HEADER_BYTES
        && &bytes[..4] == MAGIC
        && (timed || version == Some(VERSION_UNTIMED))
        && bytes[8..16] == first.to_le_bytes();
    if !header_ok {
        return (Vec::new(), 0);
    }
    let frame_bytes = if timed {
        FRAME_BYTES
    } else {
        FRAME_BYTES_UNTIMED
    };
    let mut records = Vec::new();
    let mut at = HEADER_BYTES;
    let mut expect = first;
    while let Some(frame) = bytes.get(at..at + frame_bytes) {
        let len = u32::from_le_bytes(frame[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(frame[4..8].try_into().expect("4 bytes"));
        let seq = u64::from_le_bytes(frame[8..16].try_into().expect("8 bytes"));
        let received_ms =
            timed.then(|| u64::from_le_bytes(frame[16..24].try_into().expect("8 bytes")));
        let start = at + frame_bytes;
        let Some(payload) = bytes.get(start..start.saturating_add(len)) else {
            break;
        };
        if seq != expect || frame_crc(seq, received_ms, payload) != crc {
            break;
        }
        records.push(Frame {
            seq,
            received_ms: received_ms.unwrap_or(0),
            payload,
        });
        at = start + len;
        // No record follows the last number there is.
        let Some(next) = expect.checked_add(1) else {
            break;
        };
        expect = next;
    }
    (records, at)
}
