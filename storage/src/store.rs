//! The object store Kiln writes blocks to, with durable puts on the local file system.

#[cfg(any(test, feature = "testing"))]
pub mod faulty;

use crate::metrics::{InstrumentedStore, StorageMetrics};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt, WriteMultipart};
use tokio::io::AsyncReadExt;

use crate::{Error, Result};

/// `KILN_{prefix}…` environment variables as `object_store` configuration keys
/// (`KILN_AWS_ENDPOINT_URL` → `aws_endpoint_url`).
fn kiln_env(prefix: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = std::env::vars()
        .filter_map(|(k, v)| {
            let key = k.strip_prefix("KILN_")?;
            key.starts_with(prefix)
                .then(|| (key.to_ascii_lowercase(), v))
        })
        .collect();
    out.sort();
    out
}

/// Whether `url` (as [`ObjectStorage::from_url`] takes it) names a remote object store, whose
/// puts wait a network round trip: any scheme other than `file://` and `memory://`; a plain
/// path is the local file system.
pub fn is_remote_url(url: &str) -> bool {
    url.split_once("://")
        .is_some_and(|(scheme, _)| !matches!(scheme, "file" | "memory"))
}

/// An object store plus, when it is the local file system, its root for fsync.
#[derive(Debug, Clone)]
pub struct ObjectStorage {
    store: Arc<dyn ObjectStore>,
    /// The local file system store and its root, for fsync.
    local: Option<(Arc<LocalFileSystem>, PathBuf)>,
    /// The storage engine's metrics, reached by every part that shares this store.
    metrics: Arc<StorageMetrics>,
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
            metrics: Arc::default(),
        })
    }

    /// The store a URL names, with `data_dir` for relative and default paths:
    ///
    /// - a path or `file:///path`: the local file system (puts are fsynced);
    /// - `s3://bucket/prefix` (any S3-compatible endpoint), `gs://bucket/prefix`,
    ///   `az://container/prefix` (also `azure://`, `abfs://`): credentials, region and
    ///   endpoint from `object_store`'s environment variables (`AWS_ACCESS_KEY_ID`,
    ///   `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`, `GOOGLE_SERVICE_ACCOUNT`, `AZURE_STORAGE_ACCOUNT_NAME`,
    ///   …), each also settable as `KILN_…` (`KILN_AWS_ENDPOINT_URL`), which wins;
    /// - `memory://`: in memory, for tests.
    ///
    /// Requests to remote stores are retried with exponential backoff for up to
    /// `retry_timeout`; a store still failing then is answered "unavailable" (503).
    pub fn from_url(url: &str, retry_timeout: std::time::Duration) -> Result<Self> {
        Self::from_url_with(url, retry_timeout, &[])
    }

    /// [`Self::from_url`] with configuration keys (`aws_endpoint_url`, …) that win over the
    /// environment's.
    pub fn from_url_with(
        url: &str,
        retry_timeout: std::time::Duration,
        options: &[(String, String)],
    ) -> Result<Self> {
        use object_store::RetryConfig;
        use object_store::prefix::PrefixStore;

        let config_err = |what: &str, e: object_store::Error| {
            Error::Config(format!("object store {url}: {what}: {e}"))
        };
        let Some((scheme, rest)) = url.split_once("://") else {
            return Self::local(Path::new(url));
        };
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let prefix = prefix.trim_matches('/');
        let retry = RetryConfig {
            max_retries: 10,
            retry_timeout,
            ..RetryConfig::default()
        };
        let store: Arc<dyn ObjectStore> = match scheme {
            "file" => return Self::local(Path::new(&format!("/{}", rest.trim_start_matches('/')))),
            "memory" => with_prefix(object_store::memory::InMemory::new(), prefix),
            "s3" | "s3a" => {
                let mut b = object_store::aws::AmazonS3Builder::from_env();
                for (key, value) in kiln_env("AWS_").iter().chain(options) {
                    if let Ok(key) = key.parse() {
                        b = b.with_config(key, value);
                    }
                }
                let b = b.with_bucket_name(bucket).with_retry(retry);
                let store = b.build().map_err(|e| config_err("S3", e))?;
                with_prefix(store, prefix)
            }
            "gs" => {
                let mut b = object_store::gcp::GoogleCloudStorageBuilder::from_env();
                for (key, value) in kiln_env("GOOGLE_").iter().chain(options) {
                    if let Ok(key) = key.parse() {
                        b = b.with_config(key, value);
                    }
                }
                let b = b.with_bucket_name(bucket).with_retry(retry);
                let store = b.build().map_err(|e| config_err("GCS", e))?;
                with_prefix(store, prefix)
            }
            "az" | "azure" | "abfs" | "abfss" => {
                let mut b = object_store::azure::MicrosoftAzureBuilder::from_env();
                for (key, value) in kiln_env("AZURE_").iter().chain(options) {
                    if let Ok(key) = key.parse() {
                        b = b.with_config(key, value);
                    }
                }
                let b = b.with_container_name(bucket).with_retry(retry);
                let store = b.build().map_err(|e| config_err("Azure", e))?;
                with_prefix(store, prefix)
            }
            other => {
                return Err(Error::Config(format!(
                    "object store {url}: unknown scheme {other:?} (use a path, file://, s3://, \
                     gs://, az:// or memory://)"
                )));
            }
        };
        fn with_prefix<S: ObjectStore>(store: S, prefix: &str) -> Arc<dyn ObjectStore> {
            if prefix.is_empty() {
                Arc::new(store)
            } else {
                Arc::new(PrefixStore::new(store, prefix))
            }
        }
        Ok(Self::remote(store))
    }

    /// Any other store (S3, GCS, Azure, in-memory); puts are durable when the store says so.
    pub fn remote(store: Arc<dyn ObjectStore>) -> Self {
        Self {
            store,
            local: None,
            metrics: Arc::default(),
        }
    }

    /// The same storage with its operations counted, sized and timed in `metrics`, which the
    /// writer, compactor and query engine sharing it report to as well.
    pub fn instrumented(mut self, metrics: Arc<StorageMetrics>) -> Self {
        self.store = Arc::new(InstrumentedStore::new(
            Arc::clone(&self.store),
            Arc::clone(&metrics),
        ));
        self.metrics = metrics;
        self
    }

    /// The storage engine's metrics.
    pub fn metrics(&self) -> &Arc<StorageMetrics> {
        &self.metrics
    }

    /// The same storage doing its I/O through `store` (a wrapper of this one's, such as a
    /// fault injector), still fsyncing the local files it writes.
    pub fn with_store(mut self, store: Arc<dyn ObjectStore>) -> Self {
        self.store = store;
        self
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
        self.sync(path, &location).await
    }

    /// Uploads a local file as an object in parts of a few MiB (so memory does not grow with
    /// its size); on the local file system the result is fsynced before this returns.
    pub async fn put_file_durable(&self, path: &str, file: &Path) -> Result<()> {
        let location = ObjectPath::from(path);
        let os = |source| Error::ObjectStore {
            path: path.to_owned(),
            source,
        };
        let io = |source| Error::Io {
            path: file.display().to_string(),
            source,
        };
        let mut f = tokio::fs::File::open(file).await.map_err(io)?;
        let upload = self.store.put_multipart(&location).await.map_err(os)?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
        let mut buf = vec![0u8; PART_BYTES];
        loop {
            let n = f.read(&mut buf).await.map_err(io)?;
            if n == 0 {
                break;
            }
            writer.wait_for_capacity(2).await.map_err(os)?;
            writer.write(&buf[..n]);
        }
        writer.finish().await.map_err(os)?;
        self.sync(path, &location).await
    }

    async fn sync(&self, path: &str, location: &ObjectPath) -> Result<()> {
        if let Some((local, root)) = &self.local {
            let root = root.clone();
            let file = local
                .path_to_filesystem(location)
                .map_err(|source| Error::ObjectStore {
                    path: path.to_owned(),
                    source,
                })?;
            tokio::task::spawn_blocking(move || sync_path(&root, &file))
                .await
                .map_err(|e| Error::Task(e.to_string()))??;
        }
        Ok(())
    }

    /// Whether this is the local file system (whose pages the OS caches).
    pub fn is_local(&self) -> bool {
        self.local.is_some()
    }

    /// Reads a byte range of an object.
    pub async fn get_range(&self, path: &str, range: std::ops::Range<u64>) -> Result<Bytes> {
        self.store
            .get_range(&ObjectPath::from(path), range)
            .await
            .map_err(|source| Error::ObjectStore {
                path: path.to_owned(),
                source,
            })
    }

    /// Every object under `prefix`.
    pub async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        let prefix = ObjectPath::from(prefix);
        self.store
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|source| Error::ObjectStore {
                path: prefix.to_string(),
                source,
            })
    }

    /// Removes files of uploads a crash interrupted (the local store stages a put as
    /// `{path}#{n}` and renames it when complete) that are older than `grace`. Returns how many
    /// went; other stores clean up after themselves (S3 multipart uploads expire by policy).
    pub fn remove_stale_uploads(&self, grace: std::time::Duration) -> Result<usize> {
        let Some((_, root)) = &self.local else {
            return Ok(0);
        };
        remove_stale_files(root, grace, &|name| {
            name.rsplit_once('#')
                .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
    }

    /// Whether the store answers (readiness checks): one `HEAD` of an object that need not
    /// exist; "not found" is an answer.
    pub async fn probe(&self) -> Result<()> {
        let path = ObjectPath::from("kiln-probe");
        match self.store.head(&path).await {
            Ok(_) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(source) => Err(Error::ObjectStore {
                path: path.to_string(),
                source,
            }),
        }
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

    /// Copies an object into a local file, a part at a time (memory does not grow with its
    /// size): written to `<file>.part`, synced, then renamed, so `file` is whole or absent.
    /// Returns the bytes written.
    pub async fn get_to_file(&self, path: &str, file: &Path) -> Result<u64> {
        use futures::StreamExt;
        use tokio::io::AsyncWriteExt;
        let os = |source| Error::ObjectStore {
            path: path.to_owned(),
            source,
        };
        let io = |source| Error::Io {
            path: file.display().to_string(),
            source,
        };
        let result = self.store.get(&ObjectPath::from(path)).await.map_err(os)?;
        let part = file.with_extension("part");
        let mut out = tokio::fs::File::create(&part).await.map_err(io)?;
        let mut stream = result.into_stream();
        let mut written = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(os)?;
            out.write_all(&chunk).await.map_err(io)?;
            written += chunk.len() as u64;
        }
        out.sync_all().await.map_err(io)?;
        drop(out);
        tokio::fs::rename(&part, file).await.map_err(io)?;
        Ok(written)
    }

    /// Where an object lives on disk when this is the local file system store (`None` for a
    /// remote store): readers may map it in place rather than copy it.
    pub fn local_file(&self, path: &str) -> Option<PathBuf> {
        let (local, _) = self.local.as_ref()?;
        local.path_to_filesystem(&ObjectPath::from(path)).ok()
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

/// Removes files under `dir` (recursively) whose name `doomed` selects and that were last
/// modified more than `grace` ago. Returns how many went.
pub fn remove_stale_files(
    dir: &Path,
    grace: std::time::Duration,
    doomed: &dyn Fn(&str) -> bool,
) -> Result<usize> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| Error::Io { path, source }
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io(dir)(e)),
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry.map_err(io(dir))?;
        let path = entry.path();
        let meta = entry.metadata().map_err(io(&path))?;
        if meta.is_dir() {
            removed += remove_stale_files(&path, grace, doomed)?;
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let old = meta
            .modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age >= grace);
        if old && doomed(&name) {
            match std::fs::remove_file(&path) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(&path)(e)),
            }
        }
    }
    Ok(removed)
}

/// Part size of multipart uploads.
const PART_BYTES: usize = 8 << 20;

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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn opts(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[tokio::test]
    async fn urls_name_their_stores() {
        let t = Duration::from_secs(1);
        let dir = tempfile::tempdir().unwrap();
        let local = ObjectStorage::from_url(dir.path().to_str().unwrap(), t).unwrap();
        assert!(local.local.is_some());
        let file = ObjectStorage::from_url(&format!("file://{}", dir.path().display()), t).unwrap();
        assert!(file.local.is_some());
        let s3 = ObjectStorage::from_url_with(
            "s3://bucket/some/prefix",
            t,
            &opts(&[
                ("aws_region", "us-east-1"),
                ("aws_access_key_id", "k"),
                ("aws_secret_access_key", "s"),
            ]),
        )
        .unwrap();
        assert!(s3.local.is_none());
        assert!(format!("{:?}", s3.inner()).contains("bucket"));
        let az = ObjectStorage::from_url_with(
            "az://container/p",
            t,
            &opts(&[("azure_storage_use_emulator", "true")]),
        )
        .unwrap();
        assert!(format!("{:?}", az.inner()).contains("container"));
        // `is_remote_url` agrees with what `from_url` opens.
        assert!(!is_remote_url(dir.path().to_str().unwrap()) && local.is_local());
        assert!(!is_remote_url(&format!("file://{}", dir.path().display())) && file.is_local());
        assert!(is_remote_url("s3://bucket/some/prefix") && !s3.is_local());
        assert!(is_remote_url("az://container/p"));
        assert!(!is_remote_url("memory://bucket"));
        for bad in ["ftp://x/y", "postgres://a/b"] {
            let err = ObjectStorage::from_url(bad, t).unwrap_err();
            assert!(matches!(err, Error::Config(_)), "{bad}: {err}");
        }
    }

    /// A prefix in the URL keeps every object under it.
    #[tokio::test]
    async fn memory_store_with_prefix_round_trips() {
        let s = ObjectStorage::from_url("memory://bucket/pre/fix", Duration::from_secs(1)).unwrap();
        s.put_durable("segments/0/a.kblk", Bytes::from_static(b"abc"))
            .await
            .unwrap();
        assert_eq!(s.get("segments/0/a.kblk").await.unwrap().as_ref(), b"abc");
        assert_eq!(s.list("segments").await.unwrap().len(), 1);
    }
}
