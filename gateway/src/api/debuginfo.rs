//! Debug files in, for naming native frames (ADR 0013), by three APIs:
//!
//! - Kiln's own: `POST /api/v1/debuginfo?name=…` with the ELF file as the body (gzip allowed),
//!   `GET /api/v1/debuginfo`, `DELETE /api/v1/debuginfo/{id}` (an id of the file, or its
//!   content hash); `kiln debuginfo upload` is its client;
//! - Parca's `parca.debuginfo.v1alpha1.DebuginfoService`, as the Parca agent uses it:
//!   `ShouldInitiateUpload`, `InitiateUpload` (the gRPC strategy), the client-streamed `Upload`,
//!   `MarkUploadFinished` (gRPC; the unary calls over Connect too);
//! - Pyroscope's `debuginfo.v1alpha1.DebuginfoService`: its first clients' bidirectional
//!   `Upload` (gRPC), and the later `ShouldInitiateUpload`, `POST
//!   /debuginfo.v1alpha1.DebuginfoService/Upload/{gnu_build_id}`, `UploadFinished`,
//!   `ListDebuginfo`, `DeleteDebuginfo` (gRPC and Connect).
//!
//! Every upload arrives into a file on local disk (a part at a time, within the tenant's
//! `max_debuginfo_file_bytes`), and is then checked and stored by the symbolizer's store: a
//! tenant's files are its own. The upload protocols' sessions ([`Uploads`]) are per process, and
//! so are the upload slots ([`UploadSlots`]): each process bounds the uploads it runs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt;
use kiln_proto::debuginfo::v1alpha1 as py;
use kiln_proto::parca::debuginfo::v1alpha1 as pa;
use kiln_symbolize::store::{StoredFile, UploadError, UploadLimits};
use serde::Deserialize;
use tokio::io::AsyncWriteExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Status, Streaming};

use crate::app::AppRef;
use crate::app::uploads::{Pending, Slot};
use crate::auth::{Scope, TenantId};
use crate::error::{ApiError, ErrorKind};
use crate::transport::caller::{Credentials, Reads, Writes};
use crate::transport::connect::{Service, connect_error, connect_ok, prepare};
use crate::transport::grpc::Grpc;

/// Parca's service, over Connect (its unary calls) and gRPC.
pub const PARCA_SERVICE: Service = Service {
    name: "parca.debuginfo.v1alpha1.DebuginfoService",
    methods: &[
        "parca.debuginfo.v1alpha1.DebuginfoService/ShouldInitiateUpload",
        "parca.debuginfo.v1alpha1.DebuginfoService/InitiateUpload",
        "parca.debuginfo.v1alpha1.DebuginfoService/MarkUploadFinished",
        "parca.debuginfo.v1alpha1.DebuginfoService/Upload",
    ],
    absent: None,
};

/// Pyroscope's service, over Connect (its unary calls) and gRPC.
pub const PYROSCOPE_SERVICE: Service = Service {
    name: "debuginfo.v1alpha1.DebuginfoService",
    methods: &[
        "debuginfo.v1alpha1.DebuginfoService/ShouldInitiateUpload",
        "debuginfo.v1alpha1.DebuginfoService/UploadFinished",
        "debuginfo.v1alpha1.DebuginfoService/ListDebuginfo",
        "debuginfo.v1alpha1.DebuginfoService/DeleteDebuginfo",
        "debuginfo.v1alpha1.DebuginfoService/Upload",
    ],
    absent: None,
};

/// Pyroscope's upload of the bytes: `POST {PYROSCOPE_UPLOAD_PATH}/{gnu_build_id}`.
pub const PYROSCOPE_UPLOAD_PATH: &str = "/debuginfo.v1alpha1.DebuginfoService/Upload";

/// What the Parca agent compares its answer with to wait and ask again (verbatim, as Parca
/// writes it).
pub const REASON_UPLOAD_IN_PROGRESS: &str =
    "A previous upload is still in-progress and not stale yet (only stale uploads can be retried).";
const REASON_FIRST_TIME: &str = "First time we see this Build ID, and it does not exist in debuginfod, therefore please upload!";
const REASON_EXISTS: &str =
    "Debuginfo already exists and is not marked as invalid, therefore no new upload is needed.";
const REASON_NOT_DEBUGINFO: &str =
    "Kiln keeps debug information only: no sources, source maps or executables for disassembly.";
const REASON_NO_GNU_ID: &str = "Empty GNU build ID, therefore no upload is needed.";

fn limits(app: &AppRef, tenant: &TenantId) -> UploadLimits {
    let l = app.limits(tenant);
    UploadLimits {
        max_file_bytes: l.max_debuginfo_file_bytes,
        max_tenant_bytes: l.max_debuginfo_bytes,
        max_inflated_bytes: l.max_debuginfo_inflated_bytes,
    }
}

impl From<UploadError> for ApiError {
    fn from(e: UploadError) -> Self {
        match e {
            UploadError::Invalid(m) => ApiError::invalid(m),
            UploadError::NoSymbols => ApiError::new(ErrorKind::Unprocessable, e.to_string()),
            UploadError::FileTooLarge { .. }
            | UploadError::TenantFull { .. }
            | UploadError::Inflates(_) => ApiError::too_large(e.to_string()),
            UploadError::Busy(m) => ApiError::new(ErrorKind::Unavailable, m)
                .retry_after(crate::app::budget::RETRY_AFTER_SECS),
            UploadError::Storage(s) => s.into(),
            UploadError::Io(io) => ApiError::internal(io),
        }
    }
}

/// A file an upload is written into, removed when dropped, with the upload's slot.
struct Incoming {
    path: tempfile::TempPath,
    /// Written in parts of 1 MiB: a hop to a blocking thread per part, not per received chunk.
    file: tokio::io::BufWriter<tokio::fs::File>,
    written: u64,
    limit: u64,
    /// Its bytes of the process's scratch space.
    charge: crate::app::uploads::ScratchCharge,
    slot: Option<Slot>,
    /// The SHA-256 of what was written, as it arrives (the store needs it, and reading the
    /// file again for it would cost a burst of a core at the end).
    hasher: sha2::Sha256,
}

impl Incoming {
    /// The file of a new upload of `tenant`, once the upload has a slot
    /// ([`UploadSlots`]): 429 or 503 when it finds none.
    async fn new(app: &AppRef, tenant: &TenantId) -> Result<Self, ApiError> {
        let l = app.limits(tenant);
        let slot = app
            .debuginfo_uploads
            .slots
            .take(tenant, l.max_debuginfo_uploads)
            .await?;
        let mut file = Self::create(app, l.max_debuginfo_file_bytes).await?;
        file.slot = Some(slot);
        Ok(file)
    }

    async fn create(app: &AppRef, limit: u64) -> Result<Self, ApiError> {
        let dir = incoming_dir(app.storage.data_dir());
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(ApiError::internal)?;
        let named = tempfile::NamedTempFile::new_in(&dir).map_err(ApiError::internal)?;
        let (file, path) = named.into_parts();
        Ok(Self {
            path,
            file: tokio::io::BufWriter::with_capacity(1 << 20, tokio::fs::File::from_std(file)),
            written: 0,
            limit,
            charge: app.debuginfo_uploads.scratch.charge(),
            slot: None,
            hasher: sha2::Digest::new(),
        })
    }

    async fn write(&mut self, chunk: &[u8]) -> Result<(), ApiError> {
        self.written += chunk.len() as u64;
        if self.written > self.limit {
            return Err(ApiError::too_large(format!(
                "the debug file is larger than the tenant's limit of {} bytes \
                 (max_debuginfo_file_bytes)",
                self.limit
            )));
        }
        if !self.charge.add(chunk.len() as u64) {
            return Err(self.charge.full());
        }
        if let Some(slot) = &self.slot {
            slot.pace.charge(chunk.len()).await;
        }
        sha2::Digest::update(&mut self.hasher, chunk);
        self.file.write_all(chunk).await.map_err(ApiError::internal)
    }

    /// The complete file: flushed, and inflated if it is gzip (within the same limit).
    async fn finish(mut self, app: &AppRef) -> Result<Self, ApiError> {
        self.file.flush().await.map_err(ApiError::internal)?;
        let mut magic = [0u8; 2];
        let path: &Path = &self.path;
        let gzip = {
            use std::io::Read;
            std::fs::File::open(path)
                .and_then(|mut f| f.read_exact(&mut magic))
                .is_ok()
                && magic == [0x1f, 0x8b]
        };
        if !gzip {
            return Ok(self);
        }
        let mut inflated = Incoming::create(app, self.limit).await?;
        inflated.slot = self.slot.take();
        let (from, to, limit) = (
            self.path.to_path_buf(),
            inflated.path.to_path_buf(),
            self.limit,
        );
        let charge =
            std::mem::replace(&mut inflated.charge, app.debuginfo_uploads.scratch.charge());
        let (written, hasher, charge) = tokio::task::spawn_blocking(move || {
            use std::io::Read;
            let input = std::fs::File::open(&from).map_err(ApiError::internal)?;
            let mut reader = flate2::read::MultiGzDecoder::new(input).take(limit + 1);
            let mut out = Hashing {
                file: std::fs::File::create(&to).map_err(ApiError::internal)?,
                hasher: sha2::Digest::new(),
                charge,
            };
            let n = std::io::copy(&mut reader, &mut out).map_err(|e| {
                if e.kind() == std::io::ErrorKind::StorageFull {
                    out.charge.full()
                } else {
                    ApiError::invalid(format!("the body is not valid gzip: {e}"))
                }
            })?;
            if n > limit {
                return Err(ApiError::too_large(format!(
                    "the debug file inflates past the tenant's limit of {limit} bytes \
                     (max_debuginfo_file_bytes)"
                )));
            }
            Ok((n, out.hasher, out.charge))
        })
        .await
        .map_err(ApiError::internal)??;
        Ok(Self {
            written,
            hasher,
            charge,
            ..inflated
        })
    }

    /// The SHA-256 of the complete file, lowercase hex.
    fn sha256(&self) -> String {
        kiln_symbolize::elf::hex(&sha2::Digest::finalize(self.hasher.clone()))
    }
}

/// A file written through a hash of its bytes, charged to the scratch space.
struct Hashing {
    file: std::fs::File,
    hasher: sha2::Sha256,
    charge: crate::app::uploads::ScratchCharge,
}

impl std::io::Write for Hashing {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        if !self.charge.add(n as u64) {
            return Err(std::io::ErrorKind::StorageFull.into());
        }
        sha2::Digest::update(&mut self.hasher, &buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// Stores a complete upload for `tenant`, named `name`, found also by `claimed`; a GNU build id
/// the uploader named it by must be the file's.
async fn store(
    app: &AppRef,
    tenant: &TenantId,
    name: &str,
    file: &Incoming,
    claimed: &[String],
    gnu: Option<&str>,
) -> Result<StoredFile, ApiError> {
    let stored = app
        .symbolizer
        .store()
        .add_hashed(
            tenant,
            name,
            &file.path,
            Some(file.sha256()),
            claimed,
            limits(app, tenant),
        )
        .await?;
    if let Some(want) = gnu.filter(|g| !g.is_empty())
        && stored.gnu_build_id.as_deref() != Some(&want.to_ascii_lowercase())
    {
        // Stored under the wrong name: taken back.
        if let Some(gone) = app
            .symbolizer
            .store()
            .delete(tenant, &stored.sha256)
            .await?
        {
            app.symbolizer.forget(tenant, &gone).await;
        }
        return Err(ApiError::invalid(format!(
            "the file's GNU build id is {:?}, not {want} as the upload said",
            stored.gnu_build_id
        )));
    }
    app.symbolizer.changed(tenant);
    tracing::info!(tenant = %tenant, sha256 = %stored.sha256, name = %stored.name, ids = ?stored.ids, "debug file stored");
    Ok(stored)
}

/// Most of a refused body read and thrown away, so that a client that writes its whole body
/// before reading sees the refusal, not a reset connection.
const DRAIN_BYTES: u64 = 256 << 20;
const DRAIN_TIME: Duration = Duration::from_secs(10);

/// Reads an HTTP body into a file. A body over the limit is refused (413) after the rest of it
/// is read and thrown away ([`drain`]).
async fn receive_body(app: &AppRef, tenant: &TenantId, body: Body) -> Result<Incoming, ApiError> {
    // An upload without a slot is refused before its body is read: reading it would cost the
    // server what the slots are there to bound. A client still writing sees the connection
    // close, and retries as after a 429.
    let mut file = Incoming::new(app, tenant).await?;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::invalid(format!("cannot read the request body: {e}")))?;
        if let Err(e) = file.write(&chunk).await {
            return Err(drain(stream, e).await);
        }
    }
    file.finish(app).await
}

/// Reads the rest of a refused body and throws it away (up to [`DRAIN_BYTES`], for
/// [`DRAIN_TIME`] at most); `refusal` is the answer.
async fn drain(mut stream: axum::body::BodyDataStream, refusal: ApiError) -> ApiError {
    let mut drained = 0u64;
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        while let Some(Ok(c)) = stream.next().await {
            drained += c.len() as u64;
            if drained > DRAIN_BYTES {
                break;
            }
        }
    })
    .await;
    refusal
}

/// `?name=` of `POST /api/v1/debuginfo`.
#[derive(Debug, Deserialize)]
pub struct UploadParams {
    #[serde(default)]
    name: Option<String>,
}

/// `POST /api/v1/debuginfo`: stores the body (an ELF file, gzip allowed) and answers with what
/// it is and the ids it is found by.
pub async fn http_upload(
    State(app): State<AppRef>,
    Writes(tenant): Writes,
    Query(params): Query<UploadParams>,
    body: Body,
) -> Result<Json<StoredFile>, ApiError> {
    let file = receive_body(&app, &tenant, body).await?;
    let name = params.name.unwrap_or_else(|| "upload".into());
    Ok(Json(store(&app, &tenant, &name, &file, &[], None).await?))
}

/// `GET /api/v1/debuginfo`: the tenant's files, newest first.
pub async fn http_list(
    State(app): State<AppRef>,
    Reads(tenant): Reads,
) -> Result<Json<serde_json::Value>, ApiError> {
    let files = app.symbolizer.store().list(&tenant).await?;
    Ok(Json(serde_json::json!({ "files": files })))
}

/// `DELETE /api/v1/debuginfo/{id}`: removes the file an id names (or of that content hash).
pub async fn http_delete(
    State(app): State<AppRef>,
    Writes(tenant): Writes,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let deleted = delete(&app, &tenant, &id).await?;
    Ok(Json(serde_json::json!({ "deleted": deleted })))
}

async fn delete(app: &AppRef, tenant: &TenantId, id: &str) -> Result<StoredFile, ApiError> {
    let Some(gone) = app.symbolizer.store().delete(tenant, id.trim()).await? else {
        return Err(ApiError::new(
            ErrorKind::NotFound,
            format!("no debug file {id:?}"),
        ));
    };
    app.symbolizer.forget(tenant, &gone).await;
    tracing::info!(tenant = %tenant, sha256 = %gone.sha256, "debug file deleted");
    Ok(gone)
}

// ---- Parca's DebuginfoService ----

/// Whether the Parca agent should upload `build_id` (for `force`, even if stored).
async fn parca_should(
    app: &AppRef,
    tenant: &TenantId,
    build_id: &str,
    force: bool,
    kind: i32,
) -> Result<(bool, &'static str), ApiError> {
    if build_id.len() <= 2 {
        return Err(ApiError::invalid("build_id is too short"));
    }
    if kind != pa::DebuginfoType::DebuginfoUnspecified as i32 {
        return Ok((false, REASON_NOT_DEBUGINFO));
    }
    if let Some(p) = app.debuginfo_uploads.get(tenant, build_id).await?
        && p.stored.is_none()
        && !force
    {
        return Ok((false, REASON_UPLOAD_IN_PROGRESS));
    }
    if !force
        && app
            .symbolizer
            .store()
            .find(tenant, build_id)
            .await?
            .is_some()
    {
        return Ok((false, REASON_EXISTS));
    }
    Ok((true, REASON_FIRST_TIME))
}

async fn parca_should_initiate(
    app: &AppRef,
    tenant: &TenantId,
    req: pa::ShouldInitiateUploadRequest,
) -> Result<pa::ShouldInitiateUploadResponse, ApiError> {
    let (should, reason) = parca_should(app, tenant, &req.build_id, req.force, req.r#type).await?;
    Ok(pa::ShouldInitiateUploadResponse {
        should_initiate_upload: should,
        reason: reason.into(),
    })
}

async fn parca_initiate(
    app: &AppRef,
    tenant: &TenantId,
    req: pa::InitiateUploadRequest,
) -> Result<pa::InitiateUploadResponse, ApiError> {
    if req.hash.is_empty() || req.size == 0 {
        return Err(ApiError::invalid(
            "an upload needs the file's hash and size",
        ));
    }
    let (should, reason) = parca_should(app, tenant, &req.build_id, req.force, req.r#type).await?;
    if !should {
        let kind = if reason == REASON_EXISTS {
            ErrorKind::AlreadyExists
        } else {
            ErrorKind::FailedPrecondition
        };
        return Err(ApiError::new(kind, reason));
    }
    let max = limits(app, tenant).max_file_bytes;
    if u64::try_from(req.size).map_or(true, |s| s > max) {
        return Err(ApiError::invalid(format!(
            "the file is {} bytes, more than the tenant's limit of {max} bytes",
            req.size
        )));
    }
    let upload_id = uuid::Uuid::new_v4().to_string();
    let gnu = (req.build_id_type == pa::BuildIdType::Gnu as i32).then(|| req.build_id.clone());
    app.debuginfo_uploads
        .start(
            tenant,
            &req.build_id,
            Pending {
                gnu,
                ..Pending::new(
                    upload_id.clone(),
                    req.build_id.clone(),
                    vec![req.build_id.clone(), req.hash.clone()],
                )
            },
        )
        .await?;
    Ok(pa::InitiateUploadResponse {
        upload_instructions: Some(pa::UploadInstructions {
            build_id: req.build_id,
            upload_id,
            upload_strategy: pa::upload_instructions::UploadStrategy::Grpc as i32,
            signed_url: String::new(),
            r#type: req.r#type,
        }),
    })
}

async fn parca_mark_finished(
    app: &AppRef,
    tenant: &TenantId,
    req: pa::MarkUploadFinishedRequest,
) -> Result<pa::MarkUploadFinishedResponse, ApiError> {
    let Some(p) = app.debuginfo_uploads.get(tenant, &req.build_id).await? else {
        return Err(ApiError::new(
            ErrorKind::NotFound,
            format!("no upload of {} was initiated", req.build_id),
        ));
    };
    if p.upload_id != req.upload_id {
        return Err(ApiError::invalid("the upload id is not the one initiated"));
    }
    if p.stored.is_none() {
        return Err(ApiError::new(
            ErrorKind::FailedPrecondition,
            "the upload's bytes have not arrived",
        ));
    }
    app.debuginfo_uploads.finish(tenant, &req.build_id).await?;
    Ok(pa::MarkUploadFinishedResponse {})
}

/// The streamed upload: an `UploadInfo`, then chunks.
async fn parca_upload(
    app: &AppRef,
    tenant: &TenantId,
    mut inbound: Streaming<pa::UploadRequest>,
) -> Result<pa::UploadResponse, ApiError> {
    let broken = |e: Status| ApiError::invalid(format!("the upload stream broke: {}", e.message()));
    let first = inbound
        .message()
        .await
        .map_err(broken)?
        .ok_or_else(|| ApiError::invalid("the upload stream is empty"))?;
    let Some(pa::upload_request::Data::Info(info)) = first.data else {
        return Err(ApiError::invalid("an upload starts with its UploadInfo"));
    };
    let Some(p) = app.debuginfo_uploads.get(tenant, &info.build_id).await? else {
        return Err(ApiError::new(
            ErrorKind::FailedPrecondition,
            format!("no upload of {} was initiated", info.build_id),
        ));
    };
    if p.upload_id != info.upload_id {
        return Err(ApiError::invalid("the upload id is not the one initiated"));
    }
    let mut file = Incoming::new(app, tenant).await?;
    while let Some(msg) = inbound.message().await.map_err(broken)? {
        match msg.data {
            Some(pa::upload_request::Data::ChunkData(chunk)) => file.write(&chunk).await?,
            _ => {
                return Err(ApiError::invalid(
                    "after its UploadInfo, an upload sends chunks",
                ));
            }
        }
    }
    let file = file.finish(app).await?;
    let stored = store(app, tenant, &p.name, &file, &p.claimed, p.gnu.as_deref()).await?;
    app.debuginfo_uploads
        .stored(tenant, &info.build_id, stored)
        .await?;
    Ok(pa::UploadResponse {
        build_id: info.build_id,
        size: file.written,
    })
}

#[tonic::async_trait]
impl pa::debuginfo_service_server::DebuginfoService for Grpc {
    async fn upload(
        &self,
        req: Request<Streaming<pa::UploadRequest>>,
    ) -> Result<tonic::Response<pa::UploadResponse>, Status> {
        let tenant = self.tenant(&req, Scope::Write)?;
        let result = parca_upload(&self.app, &tenant, req.into_inner()).await;
        crate::transport::grpc::answer(result)
    }

    async fn should_initiate_upload(
        &self,
        req: Request<pa::ShouldInitiateUploadRequest>,
    ) -> Result<tonic::Response<pa::ShouldInitiateUploadResponse>, Status> {
        let tenant = self.tenant(&req, Scope::Write)?;
        let result = parca_should_initiate(&self.app, &tenant, req.into_inner()).await;
        crate::transport::grpc::answer(result)
    }

    async fn initiate_upload(
        &self,
        req: Request<pa::InitiateUploadRequest>,
    ) -> Result<tonic::Response<pa::InitiateUploadResponse>, Status> {
        let tenant = self.tenant(&req, Scope::Write)?;
        let result = parca_initiate(&self.app, &tenant, req.into_inner()).await;
        crate::transport::grpc::answer(result)
    }

    async fn mark_upload_finished(
        &self,
        req: Request<pa::MarkUploadFinishedRequest>,
    ) -> Result<tonic::Response<pa::MarkUploadFinishedResponse>, Status> {
        let tenant = self.tenant(&req, Scope::Write)?;
        let result = parca_mark_finished(&self.app, &tenant, req.into_inner()).await;
        crate::transport::grpc::answer(result)
    }
}

// ---- Pyroscope's debuginfo.v1alpha1 ----

/// Pyroscope's check of an announced file; on yes, the upload session is opened.
async fn pyroscope_should(
    app: &AppRef,
    tenant: &TenantId,
    file: Option<py::FileMetadata>,
) -> Result<py::ShouldInitiateUploadResponse, ApiError> {
    let file = file.unwrap_or_default();
    let answer = |should: bool, reason: &str| py::ShouldInitiateUploadResponse {
        should_initiate_upload: should,
        reason: reason.into(),
    };
    let gnu = file.gnu_build_id.to_ascii_lowercase();
    if gnu.is_empty() {
        return Ok(answer(false, REASON_NO_GNU_ID));
    }
    if !(2..=40).contains(&gnu.len()) || !gnu.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::invalid(format!(
            "gnu_build_id {gnu:?} is not 2 to 40 hexadecimal digits"
        )));
    }
    if !matches!(file.r#type, 1 | 2) {
        return Err(ApiError::invalid(
            "type must be TYPE_EXECUTABLE_FULL or TYPE_EXECUTABLE_NO_TEXT",
        ));
    }
    if let Some(p) = app.debuginfo_uploads.get(tenant, &gnu).await?
        && p.stored.is_none()
    {
        return Ok(answer(false, REASON_UPLOAD_IN_PROGRESS));
    }
    if app.symbolizer.store().find(tenant, &gnu).await?.is_some() {
        return Ok(answer(false, REASON_EXISTS));
    }
    let claimed = [file.otel_file_id, file.go_build_id]
        .into_iter()
        .filter(|i| !i.is_empty())
        .collect();
    app.debuginfo_uploads
        .start(
            tenant,
            &gnu.clone(),
            Pending {
                gnu: Some(gnu.clone()),
                ..Pending::new(
                    String::new(),
                    if file.name.is_empty() {
                        gnu.clone()
                    } else {
                        file.name
                    },
                    claimed,
                )
            },
        )
        .await?;
    Ok(answer(true, REASON_FIRST_TIME))
}

async fn pyroscope_finished(
    app: &AppRef,
    tenant: &TenantId,
    req: py::UploadFinishedRequest,
) -> Result<py::UploadFinishedResponse, ApiError> {
    let gnu = req.gnu_build_id.to_ascii_lowercase();
    let Some(p) = app.debuginfo_uploads.get(tenant, &gnu).await? else {
        return Err(ApiError::new(
            ErrorKind::NotFound,
            format!("no upload of {gnu} was started"),
        ));
    };
    if p.stored.is_none() {
        return Err(ApiError::new(
            ErrorKind::FailedPrecondition,
            "the file's bytes have not arrived",
        ));
    }
    app.debuginfo_uploads.finish(tenant, &gnu).await?;
    Ok(py::UploadFinishedResponse {})
}

fn timestamp(ms: u64) -> pbjson_types::Timestamp {
    pbjson_types::Timestamp {
        seconds: (ms / 1000) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

async fn pyroscope_list(
    app: &AppRef,
    tenant: &TenantId,
) -> Result<py::ListDebuginfoResponse, ApiError> {
    use py::object_metadata::State;
    let mut object: Vec<py::ObjectMetadata> = app
        .symbolizer
        .store()
        .list(tenant)
        .await?
        .into_iter()
        .map(|f| py::ObjectMetadata {
            file: Some(py::FileMetadata {
                gnu_build_id: f.gnu_build_id.clone().unwrap_or_default(),
                go_build_id: f.go_build_id.clone().unwrap_or_default(),
                otel_file_id: f.file_id.clone(),
                name: f.name.clone(),
                r#type: if f.kind == "executable" {
                    py::file_metadata::Type::ExecutableFull as i32
                } else {
                    py::file_metadata::Type::ExecutableNoText as i32
                },
            }),
            state: State::Uploaded as i32,
            started_at: Some(timestamp(f.uploaded_unix_ms)),
            finished_at: Some(timestamp(f.uploaded_unix_ms)),
            size_bytes: f.size as i64,
        })
        .collect();
    for (id, p) in app.debuginfo_uploads.of_tenant(tenant).await? {
        object.push(py::ObjectMetadata {
            file: Some(py::FileMetadata {
                gnu_build_id: id,
                name: p.name,
                ..Default::default()
            }),
            state: State::Uploading as i32,
            started_at: Some(timestamp(p.started_unix_ms)),
            ..Default::default()
        });
    }
    Ok(py::ListDebuginfoResponse { object })
}

/// `POST /debuginfo.v1alpha1.DebuginfoService/Upload/{gnu_build_id}`: the bytes of a file
/// `ShouldInitiateUpload` asked for (412 when it did not).
pub async fn pyroscope_http_upload(
    State(app): State<AppRef>,
    Writes(tenant): Writes,
    UrlPath(gnu): UrlPath<String>,
    body: Body,
) -> Result<Response, ApiError> {
    let gnu = gnu.to_ascii_lowercase();
    let Some(p) = app.debuginfo_uploads.get(&tenant, &gnu).await? else {
        return Err(ApiError::new(
            ErrorKind::FailedPrecondition,
            format!("no upload of {gnu} was started (call ShouldInitiateUpload first)"),
        ));
    };
    let file = receive_body(&app, &tenant, body).await?;
    let stored = store(&app, &tenant, &p.name, &file, &p.claimed, Some(&gnu)).await?;
    app.debuginfo_uploads.stored(&tenant, &gnu, stored).await?;
    Ok(axum::http::StatusCode::OK.into_response())
}

/// The first generation's bidirectional upload: init, Kiln's answer, chunks until the client
/// closes its side.
async fn pyroscope_stream(
    app: &AppRef,
    tenant: &TenantId,
    mut inbound: Streaming<py::UploadRequest>,
    tx: &tokio::sync::mpsc::Sender<Result<py::UploadResponse, Status>>,
) -> Result<(), ApiError> {
    let broken = |e: Status| ApiError::invalid(format!("the upload stream broke: {}", e.message()));
    let first = inbound
        .message()
        .await
        .map_err(broken)?
        .ok_or_else(|| ApiError::invalid("the upload stream is empty"))?;
    let Some(py::upload_request::Data::Init(init)) = first.data else {
        return Err(ApiError::invalid("an upload starts with its init message"));
    };
    let answer = pyroscope_should(app, tenant, init.file.clone()).await?;
    let go_on = answer.should_initiate_upload;
    tx.send(Ok(py::UploadResponse {
        data: Some(py::upload_response::Data::Init(answer)),
    }))
    .await
    .map_err(|_| ApiError::invalid("the client went away"))?;
    if !go_on {
        return Ok(());
    }
    let gnu = init
        .file
        .map(|f| f.gnu_build_id.to_ascii_lowercase())
        .unwrap_or_default();
    let p = app
        .debuginfo_uploads
        .get(tenant, &gnu)
        .await?
        .ok_or_else(|| ApiError::internal("the upload session went away"))?;
    let mut file = Incoming::new(app, tenant).await?;
    while let Some(msg) = inbound.message().await.map_err(broken)? {
        match msg.data {
            Some(py::upload_request::Data::Chunk(c)) if !c.chunk.is_empty() => {
                file.write(&c.chunk).await?
            }
            _ => {
                return Err(ApiError::invalid(
                    "after init, an upload sends non-empty chunks",
                ));
            }
        }
    }
    let file = file.finish(app).await?;
    let result = store(app, tenant, &p.name, &file, &p.claimed, Some(&gnu)).await;
    // The stream's end is the upload's end: no UploadFinished follows.
    app.debuginfo_uploads.finish(tenant, &gnu).await?;
    result.map(|_| ())
}

#[tonic::async_trait]
impl py::debuginfo_service_server::DebuginfoService for Grpc {
    type UploadStream = ReceiverStream<Result<py::UploadResponse, Status>>;

    async fn upload(
        &self,
        req: Request<Streaming<py::UploadRequest>>,
    ) -> Result<tonic::Response<Self::UploadStream>, Status> {
        let tenant = self.tenant(&req, Scope::Write)?;
        let app = self.app.clone();
        let inbound = req.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        tokio::spawn(async move {
            if let Err(e) = pyroscope_stream(&app, &tenant, inbound, &tx).await {
                let _ = tx.send(Err(Status::from(e))).await;
            }
        });
        Ok(tonic::Response::new(ReceiverStream::new(rx)))
    }

    async fn should_initiate_upload(
        &self,
        req: Request<py::ShouldInitiateUploadRequest>,
    ) -> Result<tonic::Response<py::ShouldInitiateUploadResponse>, Status> {
        let tenant = self.tenant(&req, Scope::Write)?;
        let result = pyroscope_should(&self.app, &tenant, req.into_inner().file).await;
        crate::transport::grpc::answer(result)
    }

    async fn upload_finished(
        &self,
        req: Request<py::UploadFinishedRequest>,
    ) -> Result<tonic::Response<py::UploadFinishedResponse>, Status> {
        let tenant = self.tenant(&req, Scope::Write)?;
        let result = pyroscope_finished(&self.app, &tenant, req.into_inner()).await;
        crate::transport::grpc::answer(result)
    }

    async fn list_debuginfo(
        &self,
        req: Request<py::ListDebuginfoRequest>,
    ) -> Result<tonic::Response<py::ListDebuginfoResponse>, Status> {
        let tenant = self.tenant(&req, Scope::Read)?;
        let result = pyroscope_list(&self.app, &tenant).await;
        crate::transport::grpc::answer(result)
    }

    async fn delete_debuginfo(
        &self,
        req: Request<py::DeleteDebuginfoRequest>,
    ) -> Result<tonic::Response<py::DeleteDebuginfoResponse>, Status> {
        let tenant = self.tenant(&req, Scope::Write)?;
        let id = req.into_inner().gnu_build_id.to_ascii_lowercase();
        let result = delete(&self.app, &tenant, &id)
            .await
            .map(|_| py::DeleteDebuginfoResponse {});
        crate::transport::grpc::answer(result)
    }
}

// ---- Connect front end of both services' unary calls ----

/// `POST /{service}/{method}` of both debuginfo services over Connect.
pub async fn connect_handler(
    State(app): State<AppRef>,
    credentials: Credentials,
    UrlPath(method): UrlPath<String>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let service = crate::transport::connect::service_of(&uri);
    let scope = if method == "ListDebuginfo" {
        Scope::Read
    } else {
        Scope::Write
    };
    let result = async {
        let tenant = credentials.tenant(scope)?;
        let call = prepare(&app, &headers, body, tenant).await?;
        let (codec, tenant, body) = (call.codec, call.tenant, call.body);
        let out: Bytes =
            match (service.as_str(), method.as_str()) {
                (s, "ShouldInitiateUpload") if s == PARCA_SERVICE.name => codec
                    .encode(&parca_should_initiate(&app, &tenant, codec.decode(&body)?).await?)?,
                (s, "InitiateUpload") if s == PARCA_SERVICE.name => {
                    codec.encode(&parca_initiate(&app, &tenant, codec.decode(&body)?).await?)?
                }
                (s, "MarkUploadFinished") if s == PARCA_SERVICE.name => codec
                    .encode(&parca_mark_finished(&app, &tenant, codec.decode(&body)?).await?)?,
                (s, "ShouldInitiateUpload") if s == PYROSCOPE_SERVICE.name => {
                    let req: py::ShouldInitiateUploadRequest = codec.decode(&body)?;
                    codec.encode(&pyroscope_should(&app, &tenant, req.file).await?)?
                }
                (s, "UploadFinished") if s == PYROSCOPE_SERVICE.name => {
                    codec.encode(&pyroscope_finished(&app, &tenant, codec.decode(&body)?).await?)?
                }
                (s, "ListDebuginfo") if s == PYROSCOPE_SERVICE.name => {
                    let _: py::ListDebuginfoRequest = codec.decode(&body)?;
                    codec.encode(&pyroscope_list(&app, &tenant).await?)?
                }
                (s, "DeleteDebuginfo") if s == PYROSCOPE_SERVICE.name => {
                    let req: py::DeleteDebuginfoRequest = codec.decode(&body)?;
                    delete(&app, &tenant, &req.gnu_build_id.to_ascii_lowercase()).await?;
                    codec.encode(&py::DeleteDebuginfoResponse {})?
                }
                (_, "Upload") => {
                    return Err(ApiError::new(
                        ErrorKind::Unimplemented,
                        "Upload is a stream: call it over gRPC (or POST the file to \
                     /debuginfo.v1alpha1.DebuginfoService/Upload/<gnu build id>)",
                    ));
                }
                _ => {
                    return Err(ApiError::new(
                        ErrorKind::NotFound,
                        format!("no method {service}/{method}"),
                    ));
                }
            };
        Ok::<_, ApiError>((codec, out))
    }
    .await;
    match result {
        Ok((codec, body)) => connect_ok(codec, body),
        Err(e) => connect_error(&e),
    }
}

/// Where uploads are written while they arrive (under the data directory).
pub fn incoming_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("debuginfo-incoming")
}
