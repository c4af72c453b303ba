//! The spool: where acknowledged segments wait while the object store is unreachable.
//!
//! A flush whose segment the object store refuses as unavailable appends the segment to a spool
//! file on local disk, within a byte budget, and its writes are acknowledged once the record is
//! on disk; past the budget they are refused (503) as they were before the spool. A drainer
//! ([`Spool::drain`], run by the storage's upkeep) puts spooled segments into the store when it
//! answers again and registers their datasets in the metastore; only then is a file deleted. The
//! data becomes queryable once drained.
//!
//! A spool file is written as the Parca agent writes its offline files (the offline-mode seed):
//!
//! ```text
//!  header:  b"KSPL" | u16 BE version (1) | u16 BE 0 | u32 BE records | u32 BE drained
//!  records: u32 BE length | the segment object (its footer names its path and datasets)
//! ```
//!
//! A record is appended and fsynced *before* the header's count is advanced (and fsynced), so a
//! count never covers bytes that are not on disk; a reader trusts the count and ignores a torn
//! tail. The drainer advances (and fsyncs) `drained` after each record is in the store and the
//! metastore, so a drain that stops half way resumes after the last record it finished, never
//! registering a segment twice (which, after compaction had consumed it, would count its samples
//! twice); redoing the one record it was at puts the same object at the same path and finds its
//! datasets registered. A file too short for its header (a crash while creating it) holds
//! nothing acknowledged and is removed; a file that does not read back is set aside as
//! `*.corrupt`, logged, and the drain goes on with the next. A record whose segment does not
//! decode (acknowledged data the drain cannot place) is counted
//! (`kiln_storage_spool_undecodable_records_total`) and logged; the file's other records are
//! drained, and the file is then set aside as `*.corrupt` rather than deleted, so the record's
//! bytes stay for an operator.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bytes::Bytes;

use crate::error::io;
use crate::format::meta::{FOOTER_TRAILER_BYTES, decode_footer, footer_len};
use crate::metastore::Metastore;
use crate::store::ObjectStorage;
use crate::{Error, Result};

#[cfg(test)]
mod tests;

const MAGIC: &[u8; 4] = b"KSPL";
const VERSION: u16 = 1;
const HEADER_BYTES: u64 = 16;
/// Offsets of the header's counts.
const RECORDS_AT: u64 = 8;
const DRAINED_AT: u64 = 12;
const EXTENSION: &str = "kspool";

/// Spool settings.
#[derive(Debug, Clone)]
pub struct SpoolConfig {
    pub dir: PathBuf,
    /// Bytes the spool's files may hold; 0 turns the spool off.
    pub max_bytes: u64,
}

/// The spool of one storage.
#[derive(Debug)]
pub struct Spool {
    config: SpoolConfig,
    state: Mutex<State>,
    /// One drain at a time.
    draining: tokio::sync::Mutex<()>,
}

#[derive(Debug, Default)]
struct State {
    /// The file appends go to (none until the first, and after each drain seals it).
    current: Option<OpenFile>,
    /// Bytes of every spool file.
    bytes: u64,
}

#[derive(Debug)]
struct OpenFile {
    path: PathBuf,
    file: std::fs::File,
    records: u32,
    len: u64,
}

impl Spool {
    /// Opens the spool in `config.dir` (creating it), counting the files a previous process left.
    pub fn open(config: SpoolConfig) -> Result<Self> {
        std::fs::create_dir_all(&config.dir).map_err(io(&config.dir))?;
        let bytes = spool_files(&config.dir)?
            .iter()
            .map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
            .sum();
        Ok(Self {
            config,
            state: Mutex::new(State {
                current: None,
                bytes,
            }),
            draining: tokio::sync::Mutex::new(()),
        })
    }

    /// Bytes the spool holds now.
    pub fn bytes(&self) -> u64 {
        self.state.lock().expect("spool lock").bytes
    }

    /// Appends a segment object durably. Refused (unavailable) when it would pass the budget.
    pub async fn append(self: &std::sync::Arc<Self>, object: Bytes) -> Result<()> {
        let spool = std::sync::Arc::clone(self);
        tokio::task::spawn_blocking(move || spool.append_blocking(&object))
            .await
            .map_err(|e| Error::Task(e.to_string()))?
    }

    fn append_blocking(&self, object: &[u8]) -> Result<()> {
        let mut state = self.state.lock().expect("spool lock");
        let record = 4 + object.len() as u64;
        let new_file = if state.current.is_none() {
            HEADER_BYTES
        } else {
            0
        };
        if state.bytes + new_file + record > self.config.max_bytes {
            return Err(Error::SpoolFull {
                bytes: state.bytes,
                max: self.config.max_bytes,
            });
        }
        if state.current.is_none() {
            state.current = Some(self.create_file()?);
            state.bytes += HEADER_BYTES;
        }
        let f = state.current.as_mut().expect("opened above");
        let len = u32::try_from(object.len()).map_err(|_| Error::SpoolFull {
            bytes: object.len() as u64,
            max: u64::from(u32::MAX),
        })?;
        let at = f.len;
        let write = |f: &mut OpenFile| -> std::io::Result<()> {
            f.file.seek(SeekFrom::Start(at))?;
            f.file.write_all(&len.to_be_bytes())?;
            f.file.write_all(object)?;
            // The record is on disk before the count covers it.
            f.file.sync_data()?;
            f.file.seek(SeekFrom::Start(RECORDS_AT))?;
            f.file.write_all(&(f.records + 1).to_be_bytes())?;
            f.file.sync_data()
        };
        if let Err(e) = write(f) {
            // The file may be torn past its count: seal it, later appends start a new one.
            let path = f.path.clone();
            state.current = None;
            return Err(io(&path)(e));
        }
        f.records += 1;
        f.len += record;
        state.bytes += record;
        Ok(())
    }

    fn create_file(&self) -> Result<OpenFile> {
        let name = format!("{}.{EXTENSION}", next_file_id());
        let path = self.config.dir.join(name);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io(&path))?;
        let mut header = Vec::with_capacity(HEADER_BYTES as usize);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&VERSION.to_be_bytes());
        header.extend_from_slice(&0u16.to_be_bytes());
        header.extend_from_slice(&0u32.to_be_bytes());
        header.extend_from_slice(&0u32.to_be_bytes());
        file.write_all(&header).map_err(io(&path))?;
        file.sync_all().map_err(io(&path))?;
        // The directory entry too, so the file outlives a crash.
        sync_dir(&self.config.dir)?;
        Ok(OpenFile {
            path,
            file,
            records: 0,
            len: HEADER_BYTES,
        })
    }

    /// True when spooled segments wait for the store.
    pub fn is_empty(&self) -> bool {
        self.bytes() == 0
    }

    /// Seals the current file and lists the spool's files under the lock appends take: every
    /// file listed is sealed, and appends from now on go to a new file.
    fn seal(&self) -> Result<Vec<PathBuf>> {
        let mut state = self.state.lock().expect("spool lock");
        state.current = None;
        spool_files(&self.config.dir)
    }

    /// Puts every spooled segment into the store and registers its datasets, oldest file first;
    /// deletes each file once all its records are in. Stops at the first failure (the store is
    /// still unreachable): what is left is drained next time. Returns the segments drained.
    pub async fn drain(&self, store: &ObjectStorage, metastore: &dyn Metastore) -> Result<usize> {
        let _one = self.draining.lock().await;
        let files = self.seal()?;
        let mut drained = 0;
        for path in files {
            let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            let p = path.clone();
            let file = tokio::task::spawn_blocking(move || read_file(&p))
                .await
                .map_err(|e| Error::Task(e.to_string()))?;
            let file = match file {
                Ok(f) => f,
                Err(e) => {
                    self.set_aside(&path, size, &e, store)?;
                    continue;
                }
            };
            let mut undecodable = 0;
            for (i, object) in file
                .records
                .into_iter()
                .enumerate()
                .skip(file.drained as usize)
            {
                let metas = match decode_object(&object, &path) {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::error!(path = %path.display(), record = i, error = %e, "a spooled segment does not decode: its file will be set aside");
                        store.metrics().spool_undecodable_records.inc();
                        undecodable += 1;
                        Vec::new()
                    }
                };
                if let Some(first) = metas.first() {
                    store.put_durable(&first.path(), object).await?;
                    for m in metas {
                        match metastore.add_blocks(vec![m]).await {
                            Ok(()) | Err(Error::BlockExists { .. }) => {}
                            Err(e) => return Err(e),
                        }
                    }
                    drained += 1;
                }
                let p = path.clone();
                tokio::task::spawn_blocking(move || mark_drained(&p, i as u32 + 1))
                    .await
                    .map_err(|e| Error::Task(e.to_string()))??;
            }
            if undecodable > 0 {
                let e = Error::Spool {
                    path: path.display().to_string(),
                    reason: format!("{undecodable} segment(s) do not decode"),
                };
                self.set_aside(&path, size, &e, store)?;
                continue;
            }
            std::fs::remove_file(&path).map_err(io(&path))?;
            sync_dir(&self.config.dir)?;
            let mut state = self.state.lock().expect("spool lock");
            state.bytes = state.bytes.saturating_sub(size);
        }
        Ok(drained)
    }

    /// A file that does not read back: removed when it is too short to hold a record (a crash
    /// while it was created, before anything was acknowledged into it), else renamed
    /// `*.corrupt` and logged; either way the drain goes on.
    fn set_aside(&self, path: &Path, size: u64, e: &Error, store: &ObjectStorage) -> Result<()> {
        if size < HEADER_BYTES {
            std::fs::remove_file(path).map_err(io(path))?;
        } else {
            tracing::error!(path = %path.display(), error = %e, "a spool file set aside as .corrupt");
            store.metrics().spool_files_set_aside.inc();
            let aside = path.with_extension("corrupt");
            std::fs::rename(path, &aside).map_err(io(path))?;
        }
        sync_dir(&self.config.dir)?;
        let mut state = self.state.lock().expect("spool lock");
        state.bytes = state.bytes.saturating_sub(size);
        Ok(())
    }
}

/// The spool files of `dir`, oldest first (their names are ULIDs).
/// A file name that sorts after every earlier one of this process, within a millisecond too
/// (plain ULIDs of one millisecond order at random): the drain replays files in name order.
fn next_file_id() -> ulid::Ulid {
    static GENERATOR: std::sync::Mutex<ulid::Generator> =
        std::sync::Mutex::new(ulid::Generator::new());
    let mut g = GENERATOR.lock().unwrap_or_else(|e| e.into_inner());
    // The random part overflows only after 2^80 ids in one millisecond.
    g.generate().unwrap_or_else(|_| ulid::Ulid::generate())
}

fn spool_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == EXTENSION))
        .collect();
    out.sort();
    Ok(out)
}

/// Fsyncs a directory, so the files created or removed in it stay so after a crash.
fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))
}

/// Records that the first `n` records of a sealed file are in the store.
fn mark_drained(path: &Path, n: u32) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(io(path))?;
    f.seek(SeekFrom::Start(DRAINED_AT))
        .and_then(|_| f.write_all(&n.to_be_bytes()))
        .and_then(|()| f.sync_data())
        .map_err(io(path))
}

/// A spool file's records (as many as its header counts: a torn tail is ignored) and how many
/// of them are drained.
struct SpoolFile {
    records: Vec<Bytes>,
    drained: u32,
}

fn read_file(path: &Path) -> Result<SpoolFile> {
    let corrupt = |reason: &str| Error::Spool {
        path: path.display().to_string(),
        reason: reason.to_owned(),
    };
    let mut data = Vec::new();
    std::fs::File::open(path)
        .and_then(|mut f| f.read_to_end(&mut data))
        .map_err(io(path))?;
    if data.len() < HEADER_BYTES as usize || &data[..4] != MAGIC {
        return Err(corrupt("not a spool file"));
    }
    let version = u16::from_be_bytes([data[4], data[5]]);
    if version != VERSION {
        return Err(corrupt(&format!("unsupported spool version {version}")));
    }
    let count = u32::from_be_bytes(data[8..12].try_into().expect("4 bytes"));
    let drained = u32::from_be_bytes(data[12..16].try_into().expect("4 bytes"));
    let data = Bytes::from(data);
    let mut at = HEADER_BYTES as usize;
    let mut out = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let Some(len) = data.get(at..at + 4) else {
            return Err(corrupt("a counted record is missing"));
        };
        let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
        at += 4;
        if data.len() < at + len {
            return Err(corrupt("a counted record is truncated"));
        }
        out.push(data.slice(at..at + len));
        at += len;
    }
    Ok(SpoolFile {
        records: out,
        drained: drained.min(count),
    })
}

/// The datasets of a spooled segment object, from its footer.
fn decode_object(object: &[u8], path: &Path) -> Result<Vec<crate::format::meta::BlockMeta>> {
    let corrupt = |e: crate::DecodeError| Error::Spool {
        path: path.display().to_string(),
        reason: format!("a spooled segment does not decode: {e}"),
    };
    if object.len() < FOOTER_TRAILER_BYTES {
        return Err(Error::Spool {
            path: path.display().to_string(),
            reason: "a spooled segment is too short".into(),
        });
    }
    let n = footer_len(&object[object.len() - FOOTER_TRAILER_BYTES..]).map_err(corrupt)?;
    if n > object.len() {
        return Err(Error::Spool {
            path: path.display().to_string(),
            reason: "a spooled segment's footer is longer than it".into(),
        });
    }
    decode_footer(&object[object.len() - n..], object.len() as u64).map_err(corrupt)
}
