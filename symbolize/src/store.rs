//! A tenant's debug files: kept in the object store among the tenant's documents (so they go
//! with the tenant, and no other tenant reads them), stored once per content, found by every id
//! they carry.
//!
//! ```text
//! tenants/<tenant>/debuginfo/files/<sha256>       the file
//! tenants/<tenant>/debuginfo/meta/<sha256>.json   what it is (StoredFile)
//! tenants/<tenant>/debuginfo/ids/<sha256 of id>    the files an id names (JSON list of sha256)
//! ```
//!
//! The file is written first and the metadata last, so a listed file is whole; a crash between
//! leaves an unlisted object that the next upload of the same content completes.

use std::path::Path;

use kiln_storage::store::ObjectStorage;
use kiln_storage::tenant_document_path;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::budget::BudgetSlot;
use crate::debug_file::{Inflation, OpenLimits};
use crate::elf::{ElfInfo, FileKind, hex};
use crate::{DebugFile, identify_file};

/// A stored debug file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredFile {
    /// Of the content: what it is stored under.
    pub sha256: String,
    /// The name it was uploaded with (a path's last part).
    pub name: String,
    pub size: u64,
    /// `executable`, `debug-only` or `symbols-only`.
    pub kind: String,
    pub gnu_build_id: Option<String>,
    pub go_build_id: Option<String>,
    /// The OpenTelemetry profiler's file id of these bytes.
    pub file_id: String,
    /// Every id it is found by: its own, and those its uploader named it by (the Parca agent
    /// names an upload by the file id of the program it stripped it from).
    pub ids: Vec<String>,
    pub has_dwarf: bool,
    pub has_gopclntab: bool,
    pub uploaded_unix_ms: u64,
}

impl StoredFile {
    /// How well it names frames: DWARF, then Go's table, then symbols only.
    fn rank(&self) -> u8 {
        u8::from(self.has_dwarf) * 2 + u8::from(self.has_gopclntab)
    }
}

/// Bounds on uploads (`tenants.toml`: `max_debuginfo_file_bytes`, `max_debuginfo_bytes`,
/// `max_debuginfo_inflated_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UploadLimits {
    pub max_file_bytes: u64,
    pub max_tenant_bytes: u64,
    /// Bytes one file's compressed sections may inflate to (within
    /// [`crate::debug_file::MAX_INFLATION_RATIO`] times its size).
    pub max_inflated_bytes: u64,
}

/// Why an upload was refused, or failed.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error("{0}")]
    Invalid(String),
    #[error("the file has no symbols: no DWARF, symbol table or Go line table")]
    NoSymbols,
    #[error("the file is {size} bytes, more than the limit of {limit} bytes a file")]
    FileTooLarge { size: u64, limit: u64 },
    #[error(
        "the tenant's debug files would come to {total} bytes, more than its limit of {limit} bytes"
    )]
    TenantFull { total: u64, limit: u64 },
    /// Its compressed sections would inflate past the limits ([`crate::Error::Inflates`]).
    #[error("{0}")]
    Inflates(String),
    /// The server's decode budget stayed spent: nothing was stored, try again later.
    #[error("{0}")]
    Busy(String),
    #[error(transparent)]
    Storage(#[from] kiln_storage::Error),
    #[error("cannot read the upload: {0}")]
    Io(std::io::Error),
}

const FILES: &str = "debuginfo/files";
const META: &str = "debuginfo/meta";
const IDS: &str = "debuginfo/ids";

/// A tenant's debug files in the object store.
#[derive(Debug, Clone)]
pub struct DebugStore {
    store: ObjectStorage,
    budget: BudgetSlot,
}

fn not_found(e: &kiln_storage::Error) -> bool {
    matches!(
        e,
        kiln_storage::Error::ObjectStore {
            source: object_store::Error::NotFound { .. },
            ..
        }
    )
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The document name of an id: its SHA-256 (ids hold `/`, as Go's do, and a hex-encoded Go id
/// is longer than a file name may be).
fn id_document(id: &str) -> String {
    format!("{IDS}/{}", hex(&Sha256::digest(id.as_bytes())))
}

/// A file's content hash, read a part at a time.
fn sha256_of(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(hex(&h.finalize()));
        }
        h.update(&buf[..n]);
    }
}

impl From<crate::Error> for UploadError {
    fn from(e: crate::Error) -> Self {
        match e {
            crate::Error::Inflates { .. } => Self::Inflates(e.to_string()),
            e => Self::Invalid(e.to_string()),
        }
    }
}

/// Reads a file's identity and checks that its symbols can be read: the DWARF of a damaged
/// file is refused here rather than found wanting at query time. Compressed sections inflate
/// within `limits` (the caller reserved what they declare, [`inspect_reserved`]).
pub fn inspect(path: &Path, limits: OpenLimits) -> Result<ElfInfo, UploadError> {
    let info = identify_file(path)?;
    if !info.has_symbols() {
        return Err(UploadError::NoSymbols);
    }
    let file = DebugFile::open(path, limits)?;
    for address in file.probe_addresses() {
        let _ = file.resolve(*address);
    }
    if file.dwarf_broken() {
        return Err(UploadError::Invalid(
            "a damaged ELF file: its DWARF cannot be read".into(),
        ));
    }
    Ok(info)
}

/// [`inspect`] on a blocking thread, after what the file's compressed sections declare is
/// checked against `limits` and reserved from `budget` (held until the check ends).
pub async fn inspect_reserved(
    path: &Path,
    limits: OpenLimits,
    budget: &BudgetSlot,
) -> Result<ElfInfo, UploadError> {
    let joined = |e: tokio::task::JoinError| UploadError::Io(std::io::Error::other(e));
    let owned = path.to_owned();
    // Identified first: a file that is no ELF, or damaged, is refused for what it is.
    let inflation = tokio::task::spawn_blocking(move || {
        identify_file(&owned)?;
        Inflation::of_file(&owned)
    })
    .await
    .map_err(joined)??;
    inflation.check(limits)?;
    let _reserved = budget
        .reserve(inflation.bytes)
        .await
        .map_err(UploadError::Busy)?;
    let owned = path.to_owned();
    tokio::task::spawn_blocking(move || inspect(&owned, limits))
        .await
        .map_err(joined)?
}

impl DebugStore {
    /// The files in `store`; checking an upload reserves from `budget`.
    pub fn new(store: ObjectStorage, budget: BudgetSlot) -> Self {
        Self { store, budget }
    }

    /// The object path of a stored file.
    pub fn object_path(&self, tenant: &str, sha256: &str) -> String {
        tenant_document_path(tenant, &format!("{FILES}/{sha256}"))
    }

    /// A small document of the tenant's, `None` when absent.
    async fn document(
        &self,
        tenant: &str,
        name: &str,
    ) -> Result<Option<bytes::Bytes>, kiln_storage::Error> {
        match self.store.get(&tenant_document_path(tenant, name)).await {
            Ok(b) => Ok(Some(b)),
            Err(e) if not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn put_document(
        &self,
        tenant: &str,
        name: &str,
        data: Vec<u8>,
    ) -> Result<(), kiln_storage::Error> {
        self.store
            .put_durable(&tenant_document_path(tenant, name), data.into())
            .await
    }

    async fn delete_document(&self, tenant: &str, name: &str) -> Result<(), kiln_storage::Error> {
        self.store.delete(&tenant_document_path(tenant, name)).await
    }

    /// Stores the file at `path` (a complete upload on local disk) for `tenant` under its own ids
    /// and `claimed` ones. An id that claims to be the GNU build id must be the file's. The same
    /// content uploaded again is stored once, its ids joined.
    pub async fn add(
        &self,
        tenant: &str,
        name: &str,
        path: &Path,
        claimed: &[String],
        limits: UploadLimits,
    ) -> Result<StoredFile, UploadError> {
        self.add_hashed(tenant, name, path, None, claimed, limits)
            .await
    }

    /// [`Self::add`] of a file whose SHA-256 (lowercase hex) its receiver computed as the bytes
    /// arrived, so it is not read again for it.
    pub async fn add_hashed(
        &self,
        tenant: &str,
        name: &str,
        path: &Path,
        sha256: Option<String>,
        claimed: &[String],
        limits: UploadLimits,
    ) -> Result<StoredFile, UploadError> {
        let size = std::fs::metadata(path).map_err(UploadError::Io)?.len();
        if size > limits.max_file_bytes {
            return Err(UploadError::FileTooLarge {
                size,
                limit: limits.max_file_bytes,
            });
        }
        let open = OpenLimits {
            max_inflated_bytes: limits.max_inflated_bytes,
        };
        let info = inspect_reserved(path, open, &self.budget).await?;
        let sha256 = match sha256 {
            Some(sha) => sha,
            None => {
                let owned = path.to_owned();
                tokio::task::spawn_blocking(move || sha256_of(&owned))
                    .await
                    .map_err(|e| UploadError::Io(std::io::Error::other(e.to_string())))?
                    .map_err(UploadError::Io)?
            }
        };
        let mut ids = info.ids();
        for c in claimed {
            let c = c.trim();
            if !c.is_empty() && !ids.iter().any(|i| i == c) {
                ids.push(c.to_owned());
            }
        }
        let existing = self.list(tenant).await?;
        if let Some(mut same) = existing.iter().find(|f| f.sha256 == sha256).cloned() {
            // Stored already: only new ids are added.
            let new: Vec<String> = ids.into_iter().filter(|i| !same.ids.contains(i)).collect();
            if !new.is_empty() {
                for id in &new {
                    self.link(tenant, id, &sha256).await?;
                }
                same.ids.extend(new);
                self.put_meta(tenant, &same).await?;
            }
            return Ok(same);
        }
        let total = existing.iter().map(|f| f.size).sum::<u64>() + size;
        if total > limits.max_tenant_bytes {
            return Err(UploadError::TenantFull {
                total,
                limit: limits.max_tenant_bytes,
            });
        }
        let stored = StoredFile {
            sha256: sha256.clone(),
            name: name.rsplit('/').next().unwrap_or(name).to_owned(),
            size,
            kind: info.kind.as_str().to_owned(),
            gnu_build_id: info.gnu_build_id.clone(),
            go_build_id: info.go_build_id.clone(),
            file_id: info.file_id.clone(),
            ids,
            has_dwarf: info.has_dwarf,
            has_gopclntab: info.has_gopclntab,
            uploaded_unix_ms: now_ms(),
        };
        self.store
            .put_file_durable(&self.object_path(tenant, &sha256), path)
            .await?;
        for id in &stored.ids {
            self.link(tenant, id, &sha256).await?;
        }
        self.put_meta(tenant, &stored).await?;
        Ok(stored)
    }

    async fn put_meta(&self, tenant: &str, f: &StoredFile) -> Result<(), UploadError> {
        let json = serde_json::to_vec(f).expect("a stored file serializes");
        self.put_document(tenant, &format!("{META}/{}.json", f.sha256), json)
            .await?;
        Ok(())
    }

    /// The files `id` names (content hashes).
    async fn linked(&self, tenant: &str, id: &str) -> Result<Vec<String>, kiln_storage::Error> {
        Ok(self
            .document(tenant, &id_document(id))
            .await?
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default())
    }

    async fn link(&self, tenant: &str, id: &str, sha256: &str) -> Result<(), UploadError> {
        let mut shas = self.linked(tenant, id).await?;
        if !shas.iter().any(|s| s == sha256) {
            shas.push(sha256.to_owned());
            let json = serde_json::to_vec(&shas).expect("a list serializes");
            self.put_document(tenant, &id_document(id), json).await?;
        }
        Ok(())
    }

    async fn meta(
        &self,
        tenant: &str,
        sha: &str,
    ) -> Result<Option<StoredFile>, kiln_storage::Error> {
        Ok(self
            .document(tenant, &format!("{META}/{sha}.json"))
            .await?
            .and_then(|b| serde_json::from_slice(&b).ok()))
    }

    /// The tenant's files, newest first.
    pub async fn list(&self, tenant: &str) -> Result<Vec<StoredFile>, kiln_storage::Error> {
        let mut out = Vec::new();
        let prefix = tenant_document_path(tenant, META);
        for object in self.store.list(&prefix).await? {
            let Some(sha) = object
                .location
                .filename()
                .and_then(|n| n.strip_suffix(".json"))
                .map(str::to_owned)
            else {
                continue;
            };
            let sha = sha.as_str();
            if let Some(f) = self.meta(tenant, sha).await? {
                out.push(f);
            }
        }
        out.sort_by(|a, b| {
            b.uploaded_unix_ms
                .cmp(&a.uploaded_unix_ms)
                .then(a.sha256.cmp(&b.sha256))
        });
        Ok(out)
    }

    /// The best file `id` names for `tenant` (DWARF before Go's table before symbols only;
    /// the newest of equals), or its content hash.
    pub async fn find(
        &self,
        tenant: &str,
        id: &str,
    ) -> Result<Option<StoredFile>, kiln_storage::Error> {
        let mut best: Option<StoredFile> = None;
        for sha in self.linked(tenant, id).await? {
            // Also a file's content hash names it (the delete API takes either).
            if let Some(f) = self.meta(tenant, &sha).await? {
                let better = best.as_ref().is_none_or(|b| {
                    (f.rank(), f.uploaded_unix_ms) > (b.rank(), b.uploaded_unix_ms)
                });
                if better {
                    best = Some(f);
                }
            }
        }
        if best.is_none() && id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
            best = self.meta(tenant, &id.to_ascii_lowercase()).await?;
        }
        Ok(best)
    }

    /// Deletes the file `id` names (an id of it or its content hash), with its ids; `None` when
    /// there is none.
    pub async fn delete(
        &self,
        tenant: &str,
        id: &str,
    ) -> Result<Option<StoredFile>, kiln_storage::Error> {
        let Some(file) = self.find(tenant, id).await? else {
            return Ok(None);
        };
        // The metadata first: from then on the file is not listed.
        self.delete_document(tenant, &format!("{META}/{}.json", file.sha256))
            .await?;
        for id in &file.ids {
            let mut shas = self.linked(tenant, id).await?;
            shas.retain(|s| s != &file.sha256);
            if shas.is_empty() {
                self.delete_document(tenant, &id_document(id)).await?;
            } else {
                let json = serde_json::to_vec(&shas).expect("a list serializes");
                self.put_document(tenant, &id_document(id), json).await?;
            }
        }
        self.store
            .delete(&self.object_path(tenant, &file.sha256))
            .await?;
        Ok(Some(file))
    }
}

/// Whether a string is a plausible GNU build id (hex, 2 to 40 digits... or longer: some linkers
/// write longer ones).
pub fn is_hex_id(id: &str) -> bool {
    (2..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The kind a file is stored as.
pub fn kind_of(s: &StoredFile) -> Option<FileKind> {
    FileKind::parse(&s.kind)
}
