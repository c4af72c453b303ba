//! A write shard's write-ahead log (ADR 0018; [`crate::writer`]'s logged shards): records
//! appended and synced in groups, read back after a restart above a checkpoint, and deleted by
//! whole files once a registered segment holds them. A record is opaque here: the gateway's are
//! a request's body as its decoder read it, with what decoding took from the request
//! (`kiln_otel::record`), since encoding the normalized profiles again took 13.6–19.3 % of the
//! server's CPU in the variants profiled (docs/performance.md, 2026-11-30).
//!
//! A log is a directory of files named by the sequence number of their first record
//! (`00000000000000000001.kwal`), each a header and frames:
//!
//! ```text
//!  header:  b"KWAL" | u16 LE version (1) | u16 LE 0 | u64 LE first sequence number
//!  frame:   u32 LE payload length | u32 LE CRC-32 of the sequence number and payload
//!           | u64 LE sequence number | payload (a record)
//! ```
//!
//! Sequence numbers rise by one from frame to frame and from file to file. A group of records
//! is written and synced (`fdatasync`) before any of them is acknowledged, so what a crash tears
//! was never acknowledged: reading a file stops at its first frame that is short, fails its CRC
//! or breaks the sequence, and the frames before it are the file's records. A process that opens
//! the log appends to a new file, so every file but the newest ends where its writer stopped.
//! The bytes a read skips are counted ([`Replay::skipped_bytes`]): after a crash they are a
//! torn group, otherwise damage.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::error::io;
use crate::{Error, Result};

const MAGIC: &[u8; 4] = b"KWAL";
const VERSION: u16 = 1;
const HEADER_BYTES: usize = 16;
const FRAME_BYTES: usize = 16;
const EXTENSION: &str = "kwal";

/// What an opened log held above the checkpoint.
#[derive(Debug, Default)]
pub struct Replay {
    /// Records above the checkpoint, by sequence number, oldest first.
    pub records: Vec<(u64, Vec<u8>)>,
    /// Bytes of files after the last whole frame (torn groups, or damage).
    pub skipped_bytes: u64,
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
        let mut replay = Replay::default();
        let mut last = checkpoint;
        for (first, path) in &files {
            let mut bytes = Vec::new();
            std::fs::File::open(path)
                .and_then(|mut f| f.read_to_end(&mut bytes))
                .map_err(io(path))?;
            let (records, whole) = read_file(&bytes, *first);
            replay.skipped_bytes += (bytes.len() - whole) as u64;
            for (seq, payload) in records {
                last = last.max(seq);
                if seq > checkpoint {
                    replay.records.push((seq, payload.to_vec()));
                }
            }
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
        Ok((log, replay))
    }

    /// Appends `records` in order and syncs them; returns the sequence number of the last (of
    /// the one before them when there are none). Once this returns they survive a crash.
    pub fn append<'a>(&mut self, records: impl IntoIterator<Item = &'a [u8]>) -> Result<u64> {
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
                .extend_from_slice(&frame_crc(seq, payload).to_le_bytes());
            self.buf.extend_from_slice(&seq.to_le_bytes());
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

fn frame_crc(seq: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&seq.to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// The records of one file whose first record is `first`, and the bytes they end at (the
/// header's end when there are none, 0 when the header is bad).
pub(crate) fn read_file(bytes: &[u8], first: u64) -> (Vec<(u64, &[u8])>, usize) {
    let header_ok = bytes.len() >= HEADER_BYTES
        && &bytes[..4] == MAGIC
        && bytes[4..6] == VERSION.to_le_bytes()
        && bytes[8..16] == first.to_le_bytes();
    if !header_ok {
        return (Vec::new(), 0);
    }
    let mut records = Vec::new();
    let mut at = HEADER_BYTES;
    let mut expect = first;
    while let Some(frame) = bytes.get(at..at + FRAME_BYTES) {
        let len = u32::from_le_bytes(frame[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(frame[4..8].try_into().expect("4 bytes"));
        let seq = u64::from_le_bytes(frame[8..16].try_into().expect("8 bytes"));
        let start = at + FRAME_BYTES;
        let Some(payload) = bytes.get(start..start.saturating_add(len)) else {
            break;
        };
        if seq != expect || frame_crc(seq, payload) != crc {
            break;
        }
        records.push((seq, payload));
        at = start + len;
        // No record follows the last number there is.
        let Some(next) = expect.checked_add(1) else {
            break;
        };
        expect = next;
    }
    (records, at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payloads(replay: &Replay) -> Vec<(u64, String)> {
        replay
            .records
            .iter()
            .map(|(s, p)| (*s, String::from_utf8(p.clone()).unwrap()))
            .collect()
    }

    fn rec(s: &str) -> &[u8] {
        s.as_bytes()
    }

    #[test]
    fn a_file_read_stops_after_the_last_sequence_number_there_is() {
        let first = u64::MAX;
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&VERSION.to_le_bytes());
        bytes.extend_from_slice(&0u16.to_le_bytes());
        bytes.extend_from_slice(&first.to_le_bytes());
        // Two frames numbered u64::MAX: a damaged file, not a reason to overflow.
        for _ in 0..2 {
            bytes.extend_from_slice(&1u32.to_le_bytes());
            bytes.extend_from_slice(&frame_crc(first, b"x").to_le_bytes());
            bytes.extend_from_slice(&first.to_le_bytes());
            bytes.push(b'x');
        }
        let (records, end) = read_file(&bytes, first);
        assert_eq!(records, [(u64::MAX, &b"x"[..])]);
        assert_eq!(end, HEADER_BYTES + FRAME_BYTES + 1);
        // A log holding it cannot number another record: it does not open.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(format!("{first:020}.{EXTENSION}")), &bytes).unwrap();
        let err = Log::open(dir.path(), 0, 1 << 20).unwrap_err();
        assert!(err.to_string().contains("exhausted"), "{err}");
    }

    #[test]
    fn records_read_back_above_the_checkpoint_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, replay) = Log::open(dir.path(), 0, 1 << 20).unwrap();
        assert!(replay.records.is_empty());
        assert_eq!(log.append([rec("a"), rec("b")]).unwrap(), 2);
        assert_eq!(log.append([]).unwrap(), 2, "nothing appended");
        assert_eq!(log.append([rec("c")]).unwrap(), 3);
        drop(log);
        let (mut log, replay) = Log::open(dir.path(), 1, 1 << 20).unwrap();
        assert_eq!(
            payloads(&replay),
            [(2, "b".into()), (3, "c".into())],
            "above checkpoint 1"
        );
        assert_eq!(replay.skipped_bytes, 0);
        // The next process goes on from the last record, in a file of its own.
        assert_eq!(log.append([rec("d")]).unwrap(), 4);
        assert_eq!(log.files().count(), 2);
        drop(log);
        let (_, replay) = Log::open(dir.path(), 0, 1 << 20).unwrap();
        assert_eq!(replay.records.len(), 4);
        // A checkpoint past every record (the metastore is ahead of the log's files).
        let (mut log, replay) = Log::open(dir.path(), 10, 1 << 20).unwrap();
        assert!(replay.records.is_empty());
        assert_eq!(log.append([rec("e")]).unwrap(), 11);
    }

    #[test]
    fn files_a_checkpoint_covers_are_deleted_when_the_log_opens() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = Log::open(dir.path(), 0, 1 << 20).unwrap();
        log.append([rec("a"), rec("b")]).unwrap();
        drop(log);
        let (mut log, _) = Log::open(dir.path(), 0, 1 << 20).unwrap();
        log.append([rec("c")]).unwrap();
        drop(log);
        // The first file (records 1 and 2) is covered, the second (3) is not.
        let (log, replay) = Log::open(dir.path(), 2, 1 << 20).unwrap();
        assert_eq!(payloads(&replay), [(3, "c".into())]);
        assert_eq!(log.files().count(), 1);
        drop(log);
        // Everything covered: no file is left to read again, whatever checkpoint comes next.
        let (log, replay) = Log::open(dir.path(), 3, 1 << 20).unwrap();
        assert!(replay.records.is_empty());
        assert_eq!(log.files().count(), 0);
        drop(log);
        let (_, replay) = Log::open(dir.path(), 0, 1 << 20).unwrap();
        assert!(
            replay.records.is_empty(),
            "the files are gone from the disk"
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_torn_group_is_skipped_wherever_the_file_was_cut() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = Log::open(dir.path(), 0, 1 << 20).unwrap();
        log.append([rec("kept")]).unwrap();
        let path = log.files().next().unwrap().to_owned();
        let whole = std::fs::metadata(&path).unwrap().len();
        log.append([rec("torn-1"), rec("torn-2")]).unwrap();
        drop(log);
        let full = std::fs::read(&path).unwrap();
        for cut in whole as usize..full.len() {
            let d = tempfile::tempdir().unwrap();
            std::fs::write(d.path().join(path.file_name().unwrap()), &full[..cut]).unwrap();
            let (mut log, replay) = Log::open(d.path(), 0, 1 << 20).unwrap();
            let kept = payloads(&replay);
            assert!(
                kept == [(1, "kept".into())] || kept == [(1, "kept".into()), (2, "torn-1".into())],
                "cut at {cut}: {kept:?}"
            );
            assert_eq!(
                replay.skipped_bytes,
                (cut - whole as usize - if kept.len() == 2 { 22 } else { 0 }) as u64
            );
            // Appends go on after what was read, never reusing a number a reader saw.
            assert_eq!(log.append([rec("next")]).unwrap(), kept.len() as u64 + 1);
            let (_, again) = Log::open(d.path(), 0, 1 << 20).unwrap();
            assert_eq!(again.records.last().unwrap().0, kept.len() as u64 + 1);
        }
    }

    #[test]
    fn a_failed_group_is_answered_with_an_error_and_the_next_goes_to_a_new_file() {
        let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
            kiln_otel::skip::missing("/dev/full");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = Log::open(dir.path(), 0, 1 << 20).unwrap();
        assert_eq!(log.append([rec("a")]).unwrap(), 1);
        // The disk fills up under the open file: writes to /dev/full fail with ENOSPC.
        log.current.as_mut().unwrap().0 = full;
        let err = log.append([rec("b")]).unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err}");
        // The failed group's number is not given again; its bytes, had any been written,
        // would end the old file where a reader stops.
        assert_eq!(log.append([rec("c")]).unwrap(), 3);
        assert_eq!(log.files().count(), 2);
        drop(log);
        let (_, replay) = Log::open(dir.path(), 0, 1 << 20).unwrap();
        assert_eq!(payloads(&replay), [(1, "a".into()), (3, "c".into())]);
    }

    #[test]
    fn a_damaged_frame_ends_its_file_and_not_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = Log::open(dir.path(), 0, 1).unwrap();
        // Files of one group each (the size limit is 1 byte).
        log.append([rec("one"), rec("two")]).unwrap();
        log.append([rec("three")]).unwrap();
        let paths: Vec<PathBuf> = log.files().map(Path::to_owned).collect();
        assert_eq!(paths.len(), 2);
        drop(log);
        let mut bytes = std::fs::read(&paths[0]).unwrap();
        // The first frame's payload: "one" fails its CRC, so "two" is not read either.
        bytes[HEADER_BYTES + FRAME_BYTES] ^= 0x20;
        std::fs::write(&paths[0], &bytes).unwrap();
        let (_, replay) = Log::open(dir.path(), 0, 1).unwrap();
        assert_eq!(payloads(&replay), [(3, "three".into())]);
        assert_eq!(
            replay.skipped_bytes,
            (bytes.len() - HEADER_BYTES) as u64,
            "both frames of the damaged file"
        );
        // A file whose header is not a log's is skipped whole.
        std::fs::write(&paths[1], b"KWAX").unwrap();
        let (_, replay) = Log::open(dir.path(), 0, 1).unwrap();
        assert!(replay.records.is_empty());
    }

    #[test]
    fn releasing_deletes_only_files_wholly_at_or_below_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = Log::open(dir.path(), 0, 1).unwrap();
        log.append([rec("1"), rec("2")]).unwrap();
        log.append([rec("3")]).unwrap();
        log.append([rec("4"), rec("5")]).unwrap();
        assert_eq!(log.files().count(), 3);
        assert_eq!(
            log.release_through(1).unwrap(),
            0,
            "record 2 is not held yet"
        );
        assert_eq!(log.release_through(3).unwrap(), 2);
        assert_eq!(log.files().count(), 1);
        let (_, replay) = Log::open(dir.path(), 3, 1).unwrap();
        assert_eq!(payloads(&replay), [(4, "4".into()), (5, "5".into())]);
        assert_eq!(log.release_through(5).unwrap(), 1);
        assert_eq!(log.files().count(), 0);
        // Releasing with no file left (a segment of writes without records) deletes nothing.
        assert_eq!(log.release_through(5).unwrap(), 0);
        assert_eq!(log.release_through(9).unwrap(), 0);
        // After every file is gone the numbers go on.
        assert_eq!(log.append([rec("6")]).unwrap(), 6);
        drop(log);
        let (_, replay) = Log::open(dir.path(), 5, 1).unwrap();
        assert_eq!(payloads(&replay), [(6, "6".into())]);
    }

    #[test]
    fn any_bytes_as_a_log_file_read_without_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = Log::open(dir.path(), 0, 1 << 20).unwrap();
        for i in 0..20u8 {
            log.append([vec![i; usize::from(i) * 7].as_slice()])
                .unwrap();
        }
        let path = log.files().next().unwrap().to_owned();
        drop(log);
        let good = std::fs::read(&path).unwrap();
        // xorshift, seeded: the damage is random but repeatable.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..500 {
            let mut bytes = good.clone();
            for _ in 0..1 + next() % 4 {
                let at = (next() as usize) % bytes.len();
                match next() % 3 {
                    0 => bytes[at] ^= 1 << (next() % 8),
                    1 => bytes.truncate(at.max(1)),
                    _ => bytes[at] = next() as u8,
                }
            }
            if round % 50 == 0 {
                bytes = (0..next() % 4096).map(|_| next() as u8).collect();
            }
            std::fs::write(&path, &bytes).unwrap();
            let (_, replay) = Log::open(dir.path(), 0, 1 << 20).unwrap();
            // Whatever reads back is a run of the records as written, from the first.
            for (n, (seq, payload)) in replay.records.iter().enumerate() {
                assert_eq!(*seq, n as u64 + 1, "round {round}");
                assert_eq!(*payload, vec![n as u8; n * 7], "round {round}");
            }
        }
    }
}
