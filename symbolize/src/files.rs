//! Local copies of debug files, to memory-map: on the local file system store the object itself
//! is mapped in place; from a remote store a file is copied once into a cache directory bounded
//! in bytes (the least recently used copies are deleted past it).

use std::path::PathBuf;
use std::sync::Arc;

use kiln_storage::store::ObjectStorage;

/// The local copies.
#[derive(Clone)]
pub struct LocalFiles {
    store: ObjectStorage,
    dir: PathBuf,
    /// Copies by object path; the weight is the file's size.
    copies: moka::future::Cache<String, Arc<PathBuf>>,
}

impl std::fmt::Debug for LocalFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalFiles")
            .field("dir", &self.dir)
            .finish()
    }
}

impl LocalFiles {
    /// Copies go to `dir` (emptied now: copies of an earlier run are not tracked), at most
    /// `max_bytes` of them.
    pub fn new(store: ObjectStorage, dir: PathBuf, max_bytes: u64) -> std::io::Result<Self> {
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir)?;
        let copies = moka::future::Cache::builder()
            .max_capacity(max_bytes)
            .weigher(|_: &String, path: &Arc<PathBuf>| {
                std::fs::metadata(path.as_ref())
                    .map_or(1, |m| u32::try_from(m.len()).unwrap_or(u32::MAX))
            })
            .eviction_listener(|_, path: Arc<PathBuf>, _| {
                // A file still mapped stays readable until unmapped (Unix).
                let _ = std::fs::remove_file(path.as_ref());
            })
            .build();
        Ok(Self { store, dir, copies })
    }

    /// A local path holding the object at `object` (copied once if the store is remote).
    pub async fn get(&self, object: &str) -> Result<PathBuf, kiln_storage::Error> {
        if let Some(path) = self.store.local_file(object) {
            return Ok(path);
        }
        let store = self.store.clone();
        let digest = <sha2::Sha256 as sha2::Digest>::digest(object.as_bytes());
        let file = self.dir.join(crate::elf::hex(&digest));
        let key = object.to_owned();
        self.copies
            .try_get_with(key.clone(), async move {
                store.get_to_file(&key, &file).await?;
                Ok::<_, kiln_storage::Error>(Arc::new(file))
            })
            .await
            .map(|p| p.as_ref().clone())
            .map_err(|e: Arc<kiln_storage::Error>| {
                Arc::try_unwrap(e).unwrap_or_else(|e| kiln_storage::Error::Task(e.to_string()))
            })
    }

    /// Forgets a copy (its object was deleted).
    pub async fn forget(&self, object: &str) {
        self.copies.invalidate(object).await;
    }
}
