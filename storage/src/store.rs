//! The object store Kiln writes blocks to, with durable puts on the local file system.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};

use crate::{Error, Result};

/// An object store plus, when it is the local file system, its root for fsync.
#[derive(Debug, Clone)]
pub struct ObjectStorage {
    store: Arc<dyn ObjectStore>,
    /// The local file system store and its root, for fsync.
    local: Option<(Arc<LocalFileSystem>, PathBuf)>,
}

impl ObjectStorage {
    /// A local-file-system store rooted at `root` (created if missing).
    pub fn local(root: &Path) -> Result<Self> {
        std::fs::create_dir_all(root).map_err(|source| Error::Io {
            path: root.display().to_string(),
            source,
        })?;
        let root = root.canonicalize().map_err(|source| Error::Io {
            path: root.display().to_string(),
            source,
        })?;
        let store =
            LocalFileSystem::new_with_prefix(&root).map_err(|source| Error::ObjectStore {
                path: root.display().to_string(),
                source,
            })?;
        let store = Arc::new(store);
        Ok(Self {
            store: store.clone(),
            local: Some((store, root)),
        })
    }

    /// Any other store (S3, GCS, Azure, in-memory); puts are durable when the store says so.
    pub fn remote(store: Arc<dyn ObjectStore>) -> Self {
        Self { store, local: None }
    }

    /// The underlying store.
    pub fn inner(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// Writes an object; on the local file system the file and its directories are fsynced
    /// before this returns.
    pub async fn put_durable(&self, path: &str, data: Bytes) -> Result<()> {
        let location = ObjectPath::from(path);
        self.store
            .put(&location, data.into())
            .await
            .map_err(|source| Error::ObjectStore {
                path: path.to_owned(),
                source,
            })?;
        if let Some((local, root)) = &self.local {
            let root = root.clone();
            // The file the store wrote: object paths are percent-encoded on disk.
            let file =
                local
                    .path_to_filesystem(&location)
                    .map_err(|source| Error::ObjectStore {
                        path: path.to_owned(),
                        source,
                    })?;
            tokio::task::spawn_blocking(move || sync_path(&root, &file))
                .await
                .map_err(|e| Error::Flush(e.to_string()))??;
        }
        Ok(())
    }

    /// Deletes an object; a missing one is not an error.
    pub async fn delete(&self, path: &str) -> Result<()> {
        match self.store.delete(&ObjectPath::from(path)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(source) => Err(Error::ObjectStore {
                path: path.to_owned(),
                source,
            }),
        }
    }

    /// Reads a whole object.
    pub async fn get(&self, path: &str) -> Result<Bytes> {
        let location = ObjectPath::from(path);
        let result = self
            .store
            .get(&location)
            .await
            .map_err(|source| Error::ObjectStore {
                path: path.to_owned(),
                source,
            })?;
        result.bytes().await.map_err(|source| Error::ObjectStore {
            path: path.to_owned(),
            source,
        })
    }
}

/// fsyncs `file` and every directory from its parent up to `root`.
fn sync_path(root: &Path, file: &Path) -> Result<()> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| Error::Io { path, source }
    };
    std::fs::File::open(file)
        .and_then(|f| f.sync_all())
        .map_err(io(file))?;
    let mut dir = file.parent();
    while let Some(d) = dir {
        std::fs::File::open(d)
            .and_then(|f| f.sync_all())
            .map_err(io(d))?;
        if d == root {
            break;
        }
        dir = d.parent();
    }
    Ok(())
}
