use crate::Error;
use std::path::{Path, PathBuf};

use super::*;

/// Every record and skipped byte of an opened log.
#[derive(Debug)]
struct All {
    records: Vec<Frame>,
    skipped_bytes: u64,
}

/// When the tests' groups are appended (Unix ms).
const AT: u64 = 1_700_000_000_000;

/// [`Log::open`], its replay read whole.
fn open_all(dir: &Path, checkpoint: u64, max_file_bytes: u64) -> crate::Result<(Log, All)> {
    let (log, mut replay) = Log::open(dir, checkpoint, max_file_bytes)?;
    let mut all = All {
        records: Vec::new(),
        skipped_bytes: 0,
    };
    while let Some(file) = replay.next_file()? {
        all.records.extend(file.records);
        all.skipped_bytes += file.skipped_bytes;
    }
    Ok((log, all))
}

fn payloads(replay: &All) -> Vec<(u64, String)> {
    replay
        .records
        .iter()
        .map(|f| (f.seq, String::from_utf8(f.payload.clone()).unwrap()))
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
        bytes.extend_from_slice(&frame_crc(first, Some(AT), b"x").to_le_bytes());
        bytes.extend_from_slice(&first.to_le_bytes());
        bytes.extend_from_slice(&AT.to_le_bytes());
        bytes.push(b'x');
    }
    let (records, end) = read_file(&bytes, first);
    assert_eq!(
        records,
        [Frame {
            seq: u64::MAX,
            received_ms: AT,
            payload: &b"x"[..]
        }]
    );
    assert_eq!(end, HEADER_BYTES + FRAME_BYTES + 1);
    // A log holding it cannot number another record: it does not open.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(format!("{first:020}.{EXTENSION}")), &bytes).unwrap();
    let err = open_all(dir.path(), 0, 1 << 20).unwrap_err();
    assert!(err.to_string().contains("exhausted"), "{err}");
}

#[test]
fn records_read_back_above_the_checkpoint_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, replay) = open_all(dir.path(), 0, 1 << 20).unwrap();
    assert!(replay.records.is_empty());
    assert_eq!(log.append([rec("a"), rec("b")], AT).unwrap(), 2);
    assert_eq!(log.append([], AT).unwrap(), 2, "nothing appended");
    assert_eq!(log.append([rec("c")], AT).unwrap(), 3);
    drop(log);
    let (mut log, replay) = open_all(dir.path(), 1, 1 << 20).unwrap();
    assert_eq!(
        payloads(&replay),
        [(2, "b".into()), (3, "c".into())],
        "above checkpoint 1"
    );
    assert_eq!(replay.skipped_bytes, 0);
    // The next process goes on from the last record, in a file of its own.
    assert_eq!(log.append([rec("d")], AT).unwrap(), 4);
    assert_eq!(log.files().count(), 2);
    drop(log);
    let (_, replay) = open_all(dir.path(), 0, 1 << 20).unwrap();
    assert_eq!(replay.records.len(), 4);
    // A checkpoint past every record (the metastore is ahead of the log's files).
    let (mut log, replay) = open_all(dir.path(), 10, 1 << 20).unwrap();
    assert!(replay.records.is_empty());
    assert_eq!(log.append([rec("e")], AT).unwrap(), 11);
}

#[test]
fn files_a_checkpoint_covers_are_deleted_when_the_log_opens() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = open_all(dir.path(), 0, 1 << 20).unwrap();
    log.append([rec("a"), rec("b")], AT).unwrap();
    drop(log);
    let (mut log, _) = open_all(dir.path(), 0, 1 << 20).unwrap();
    log.append([rec("c")], AT).unwrap();
    drop(log);
    // The first file (records 1 and 2) is covered, the second (3) is not.
    let (log, replay) = open_all(dir.path(), 2, 1 << 20).unwrap();
    assert_eq!(payloads(&replay), [(3, "c".into())]);
    assert_eq!(log.files().count(), 1);
    drop(log);
    // Everything covered: no file is left to read again, whatever checkpoint comes next.
    let (log, replay) = open_all(dir.path(), 3, 1 << 20).unwrap();
    assert!(replay.records.is_empty());
    assert_eq!(log.files().count(), 0);
    drop(log);
    let (_, replay) = open_all(dir.path(), 0, 1 << 20).unwrap();
    assert!(
        replay.records.is_empty(),
        "the files are gone from the disk"
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn a_torn_group_is_skipped_wherever_the_file_was_cut() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = open_all(dir.path(), 0, 1 << 20).unwrap();
    log.append([rec("kept")], AT).unwrap();
    let path = log.files().next().unwrap().to_owned();
    let whole = std::fs::metadata(&path).unwrap().len();
    log.append([rec("torn-1"), rec("torn-2")], AT).unwrap();
    drop(log);
    let full = std::fs::read(&path).unwrap();
    for cut in whole as usize..full.len() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(path.file_name().unwrap()), &full[..cut]).unwrap();
        let (mut log, replay) = open_all(d.path(), 0, 1 << 20).unwrap();
        let kept = payloads(&replay);
        assert!(
            kept == [(1, "kept".into())] || kept == [(1, "kept".into()), (2, "torn-1".into())],
            "cut at {cut}: {kept:?}"
        );
        assert_eq!(
            replay.skipped_bytes,
            (cut - whole as usize - if kept.len() == 2 { FRAME_BYTES + 6 } else { 0 }) as u64
        );
        // Appends go on after what was read, never reusing a number a reader saw.
        assert_eq!(
            log.append([rec("next")], AT).unwrap(),
            kept.len() as u64 + 1
        );
        let (_, again) = open_all(d.path(), 0, 1 << 20).unwrap();
        assert_eq!(again.records.last().unwrap().seq, kept.len() as u64 + 1);
    }
}

#[test]
fn a_failed_group_is_answered_with_an_error_and_the_next_goes_to_a_new_file() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        kiln_otel::skip::missing("/dev/full");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = open_all(dir.path(), 0, 1 << 20).unwrap();
    assert_eq!(log.append([rec("a")], AT).unwrap(), 1);
    // The disk fills up under the open file: writes to /dev/full fail with ENOSPC.
    log.current.as_mut().unwrap().0 = full;
    let err = log.append([rec("b")], AT).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    // The failed group's number is not given again; its bytes, had any been written,
    // would end the old file where a reader stops.
    assert_eq!(log.append([rec("c")], AT).unwrap(), 3);
    assert_eq!(log.files().count(), 2);
    drop(log);
    let (_, replay) = open_all(dir.path(), 0, 1 << 20).unwrap();
    assert_eq!(payloads(&replay), [(1, "a".into()), (3, "c".into())]);
}

#[test]
fn a_damaged_frame_ends_its_file_and_not_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = open_all(dir.path(), 0, 1).unwrap();
    // Files of one group each (the size limit is 1 byte).
    log.append([rec("one"), rec("two")], AT).unwrap();
    log.append([rec("three")], AT).unwrap();
    let paths: Vec<PathBuf> = log.files().map(Path::to_owned).collect();
    assert_eq!(paths.len(), 2);
    drop(log);
    let mut bytes = std::fs::read(&paths[0]).unwrap();
    // The first frame's payload: "one" fails its CRC, so "two" is not read either.
    bytes[HEADER_BYTES + FRAME_BYTES] ^= 0x20;
    std::fs::write(&paths[0], &bytes).unwrap();
    let (_, replay) = open_all(dir.path(), 0, 1).unwrap();
    assert_eq!(payloads(&replay), [(3, "three".into())]);
    assert_eq!(
        replay.skipped_bytes,
        (bytes.len() - HEADER_BYTES) as u64,
        "both frames of the damaged file"
    );
    // A file whose header is not a log's is skipped whole.
    std::fs::write(&paths[1], b"KWAX").unwrap();
    let (_, replay) = open_all(dir.path(), 0, 1).unwrap();
    assert!(replay.records.is_empty());
}

#[test]
fn releasing_deletes_only_files_wholly_at_or_below_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = open_all(dir.path(), 0, 1).unwrap();
    log.append([rec("1"), rec("2")], AT).unwrap();
    log.append([rec("3")], AT).unwrap();
    log.append([rec("4"), rec("5")], AT).unwrap();
    assert_eq!(log.files().count(), 3);
    assert_eq!(
        log.release_through(1).unwrap(),
        0,
        "record 2 is not held yet"
    );
    assert_eq!(log.release_through(3).unwrap(), 2);
    assert_eq!(log.files().count(), 1);
    let (_, replay) = open_all(dir.path(), 3, 1).unwrap();
    assert_eq!(payloads(&replay), [(4, "4".into()), (5, "5".into())]);
    assert_eq!(log.release_through(5).unwrap(), 1);
    assert_eq!(log.files().count(), 0);
    // Releasing with no file left (a segment of writes without records) deletes nothing.
    assert_eq!(log.release_through(5).unwrap(), 0);
    assert_eq!(log.release_through(9).unwrap(), 0);
    // After every file is gone the numbers go on.
    assert_eq!(log.append([rec("6")], AT).unwrap(), 6);
    drop(log);
    let (_, replay) = open_all(dir.path(), 5, 1).unwrap();
    assert_eq!(payloads(&replay), [(6, "6".into())]);
}

#[test]
fn any_bytes_as_a_log_file_read_without_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = open_all(dir.path(), 0, 1 << 20).unwrap();
    for i in 0..20u8 {
        log.append([vec![i; usize::from(i) * 7].as_slice()], AT)
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
        let (_, replay) = open_all(dir.path(), 0, 1 << 20).unwrap();
        // Whatever reads back is a run of the records as written, from the first.
        for (n, f) in replay.records.iter().enumerate() {
            assert_eq!(f.seq, n as u64 + 1, "round {round}");
            assert_eq!(f.payload, vec![n as u8; n * 7], "round {round}");
            assert_eq!(f.received_ms, AT, "round {round}");
        }
    }
}

/// A newest file without a whole frame (the process died after making its header) keeps its
/// number: the next process appends to a file of its own, and nothing is lost.
#[test]
fn a_newest_file_without_records_keeps_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = open_all(dir.path(), 0, 1 << 20).unwrap();
    log.append([rec("a")], AT).unwrap();
    drop(log);
    let mut header = MAGIC.to_vec();
    header.extend_from_slice(&VERSION.to_le_bytes());
    header.extend_from_slice(&0u16.to_le_bytes());
    header.extend_from_slice(&2u64.to_le_bytes());
    std::fs::write(dir.path().join(format!("{:020}.{EXTENSION}", 2)), &header).unwrap();
    let (mut log, replay) = open_all(dir.path(), 0, 1 << 20).unwrap();
    assert_eq!(payloads(&replay), [(1, "a".into())]);
    assert_eq!(log.append([rec("b")], AT).unwrap(), 3);
    drop(log);
    let (_, replay) = open_all(dir.path(), 0, 1 << 20).unwrap();
    assert_eq!(payloads(&replay), [(1, "a".into()), (3, "b".into())]);
}

/// What a replay cannot use is kept under `aside/`: a damaged file whole (its bytes as they
/// were, after the log deletes it), a record by itself.
#[test]
fn damaged_files_and_records_are_kept_aside() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = open_all(dir.path(), 0, 1 << 20).unwrap();
    log.append([rec("a"), rec("b")], AT).unwrap();
    let path = log.files().next().unwrap().to_owned();
    drop(log);
    let bytes = std::fs::read(&path).unwrap();
    let kept = set_aside_file(&path).unwrap();
    assert_eq!(
        kept,
        dir.path().join(ASIDE_DIR).join(path.file_name().unwrap())
    );
    let (mut log, _) = open_all(dir.path(), 0, 1 << 20).unwrap();
    log.release_through(2).unwrap();
    assert!(!path.exists());
    assert_eq!(std::fs::read(&kept).unwrap(), bytes);
    let record = set_aside_record(dir.path(), 7, b"poison").unwrap();
    assert_eq!(
        record,
        dir.path().join(ASIDE_DIR).join(format!("{:020}.record", 7))
    );
    assert_eq!(std::fs::read(&record).unwrap(), b"poison");
    // The log does not read its aside directory as files of its own.
    let (_, replay) = open_all(dir.path(), 0, 1 << 20).unwrap();
    assert!(replay.records.is_empty());
}

/// Frames keep the time their group was appended; a version 1 file (frames without it) reads
/// with the file's modification time, which no record of it is younger than.
#[test]
fn records_keep_when_they_were_received() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = open_all(dir.path(), 0, 1).unwrap();
    log.append([rec("a")], AT).unwrap();
    log.append([rec("b")], AT + 5).unwrap();
    drop(log);
    let (_, replay) = open_all(dir.path(), 0, 1).unwrap();
    let times: Vec<u64> = replay.records.iter().map(|f| f.received_ms).collect();
    assert_eq!(times, [AT, AT + 5]);

    let old = tempfile::tempdir().unwrap();
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&VERSION_UNTIMED.to_le_bytes());
    bytes.extend_from_slice(&0u16.to_le_bytes());
    bytes.extend_from_slice(&1u64.to_le_bytes());
    bytes.extend_from_slice(&1u32.to_le_bytes());
    bytes.extend_from_slice(&frame_crc(1, None, b"x").to_le_bytes());
    bytes.extend_from_slice(&1u64.to_le_bytes());
    bytes.push(b'x');
    let path = old.path().join(format!("{:020}.{EXTENSION}", 1));
    std::fs::write(&path, &bytes).unwrap();
    let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
    let modified_ms = modified
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let (mut log, replay) = open_all(old.path(), 0, 1 << 20).unwrap();
    assert_eq!(payloads(&replay), [(1, "x".into())]);
    assert_eq!(replay.records[0].received_ms, modified_ms);
    // Appends go to a new file of the current version.
    assert_eq!(log.append([rec("y")], AT).unwrap(), 2);
}
