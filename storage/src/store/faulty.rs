//! A fault-injecting [`ObjectStore`] for tests: puts, reads or deletes fail on demand with the
//! error an unreachable store gives, and succeed again when the fault is lifted; puts, and reads
//! under a prefix, can also be held (a slow store) until released.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

/// Wraps a store; every fault is off until set.
#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    /// Puts (and multipart uploads) fail.
    pub fail_puts: AtomicBool,
    /// Gets fail.
    pub fail_gets: AtomicBool,
    /// Deletes fail.
    pub fail_deletes: AtomicBool,
    /// Puts that were refused.
    pub refused_puts: AtomicU64,
    /// Puts wait while this is set.
    pub hold_puts: AtomicBool,
    /// Puts waiting now.
    pub held_puts: AtomicU64,
    /// Puts passed to the inner store.
    pub puts: AtomicU64,
    /// Reads of objects under this prefix wait while it is set.
    hold_gets_under: Mutex<Option<String>>,
    /// Reads waiting now.
    pub held_gets: AtomicU64,
}

impl FaultyStore {
    /// A store that passes everything to `inner` until a fault is set.
    pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
        Self {
            inner,
            fail_puts: AtomicBool::new(false),
            fail_gets: AtomicBool::new(false),
            fail_deletes: AtomicBool::new(false),
            refused_puts: AtomicU64::new(0),
            hold_puts: AtomicBool::new(false),
            held_puts: AtomicU64::new(0),
            puts: AtomicU64::new(0),
            hold_gets_under: Mutex::new(None),
            held_gets: AtomicU64::new(0),
        }
    }

    /// Holds reads of objects whose path starts with `prefix` until called with `None`.
    pub fn hold_gets_under(&self, prefix: Option<&str>) {
        *self
            .hold_gets_under
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = prefix.map(str::to_owned);
    }

    /// Waits while reads of `location` are held.
    async fn hold_get(&self, location: &Path) {
        let held = || {
            self.hold_gets_under
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_deref()
                .is_some_and(|p| location.as_ref().starts_with(p))
        };
        if !held() {
            return;
        }
        self.held_gets.fetch_add(1, Ordering::SeqCst);
        while held() {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        self.held_gets.fetch_sub(1, Ordering::SeqCst);
    }

    /// Waits while puts are held.
    async fn hold(&self) {
        if !self.hold_puts.load(Ordering::SeqCst) {
            return;
        }
        self.held_puts.fetch_add(1, Ordering::SeqCst);
        while self.hold_puts.load(Ordering::SeqCst) {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        self.held_puts.fetch_sub(1, Ordering::SeqCst);
    }

    /// Sets or lifts every fault at once.
    pub fn set_down(&self, down: bool) {
        self.fail_puts.store(down, Ordering::SeqCst);
        self.fail_gets.store(down, Ordering::SeqCst);
        self.fail_deletes.store(down, Ordering::SeqCst);
    }

    fn fault(path: &Path) -> object_store::Error {
        object_store::Error::Generic {
            store: "faulty",
            source: format!("injected fault at {path}: connection refused").into(),
        }
    }

    fn check(&self, flag: &AtomicBool, path: &Path) -> object_store::Result<()> {
        if flag.load(Ordering::SeqCst) {
            return Err(Self::fault(path));
        }
        Ok(())
    }
}

impl std::fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

#[async_trait::async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        if self.fail_puts.load(Ordering::SeqCst) {
            self.refused_puts.fetch_add(1, Ordering::SeqCst);
            return Err(Self::fault(location));
        }
        self.hold().await;
        self.puts.fetch_add(1, Ordering::SeqCst);
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        if self.fail_puts.load(Ordering::SeqCst) {
            self.refused_puts.fetch_add(1, Ordering::SeqCst);
            return Err(Self::fault(location));
        }
        self.hold().await;
        self.puts.fetch_add(1, Ordering::SeqCst);
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.check(&self.fail_gets, location)?;
        self.hold_get(location).await;
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        self.check(&self.fail_gets, location)?;
        self.hold_get(location).await;
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        if self.fail_deletes.load(Ordering::SeqCst) {
            return locations
                .map(|p| p.and_then(|p| Err(Self::fault(&p))))
                .boxed();
        }
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        if self.fail_gets.load(Ordering::SeqCst) {
            let p = prefix.cloned().unwrap_or_default();
            return futures::stream::once(async move { Err(Self::fault(&p)) }).boxed();
        }
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        if self.fail_gets.load(Ordering::SeqCst) {
            return Err(Self::fault(&prefix.cloned().unwrap_or_default()));
        }
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.check(&self.fail_puts, to)?;
        self.inner.copy_opts(from, to, options).await
    }
}
