//! A file backend that fails its writes on demand: the disk-full test of the embedded metastore.

use std::path::Path;
use std::sync::Arc;

use super::*;

/// A file backend whose writes fail with "no space left on device" while `full` is set: the
/// disk-full test of the embedded metastore.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug)]
pub struct DiskFault {
    inner: redb::backends::FileBackend,
    full: Arc<std::sync::atomic::AtomicBool>,
}

#[cfg(any(test, feature = "testing"))]
impl DiskFault {
    /// A factory for [`EmbeddedMetastore::open_with_backend`] sharing one `full` switch.
    pub fn factory(full: Arc<std::sync::atomic::AtomicBool>) -> BackendFactory {
        Arc::new(move |path: &Path| {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)?;
            let inner = redb::backends::FileBackend::new(file).map_err(std::io::Error::other)?;
            Ok(DiskFault {
                inner,
                full: Arc::clone(&full),
            })
        })
    }

    fn check(&self) -> std::io::Result<()> {
        if self.full.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(std::io::Error::from(std::io::ErrorKind::StorageFull));
        }
        Ok(())
    }
}

#[cfg(any(test, feature = "testing"))]
impl redb::StorageBackend for DiskFault {
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.check()?;
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.check()?;
        self.inner.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.check()?;
        self.inner.write(offset, data)
    }
    fn close(&self) -> std::io::Result<()> {
        self.inner.close()
    }
    fn try_lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> std::result::Result<bool, redb::BackendError> {
        self.inner.try_lock_range(start, end)
    }
    fn try_lock_shared_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> std::result::Result<bool, redb::BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }
    fn lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> std::result::Result<(), redb::BackendError> {
        self.inner.lock_range(start, end)
    }
    fn lock_shared_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> std::result::Result<(), redb::BackendError> {
        self.inner.lock_shared_range(start, end)
    }
    fn unlock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> std::result::Result<(), redb::BackendError> {
        self.inner.unlock_range(start, end)
    }
    fn query_lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> std::result::Result<bool, redb::BackendError> {
        self.inner.query_lock_range(start, end)
    }
}
