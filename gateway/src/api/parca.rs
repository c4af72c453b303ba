//! `parca.profilestore.v1alpha1.ProfileStoreService`, the Parca agent's write API:
//!
//! - `WriteRaw` (pprof series): the push API's handling ([`crate::api::push::push`]);
//! - `WriteArrow` (an Arrow IPC stream, LZ4 buffers allowed, stacks inline: schema v2, or a v1
//!   sample record with its locations record);
//! - `Write`, the bidirectional stream of schema v1: the agent sends a sample record naming its
//!   stacks by 16-byte id, Kiln answers with the ids it does not know, the agent sends their
//!   stacks in a locations record. Kiln remembers stacks per tenant in a [`StackCache`](crate::app::StackCache), so a
//!   steady agent sends each stack once (Parca's own server asks for every id every time).
//!
//! `WriteRaw` and `WriteArrow` are served over gRPC and Connect (binary and JSON); `Write` over
//! gRPC only (a bidirectional stream; Connect would need HTTP/2 end to end and the agent speaks
//! gRPC). A `Write` stream is answered with OK only once its profile is durable.
//!
//! The cache holds the stacks themselves, not a note that storage has them: a hit is resolved from
//! the cache, and an id the cache evicted is simply asked for again. Ids are the agent's content
//! hashes, so a stack cached for a tenant stays right for that tenant. The cache's key includes
//! the tenant: one tenant's ids never resolve another's stacks.
//!
//! Kiln extends the round trip in one compatible way: after asking, it reads locations records
//! until every id asked for is resolved (the agent sends exactly one; `kiln upload` may send the
//! several records of an offline file that hold them) and refuses the stream if the client closes
//! with ids still missing.

use std::collections::HashSet;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use bytes::Bytes;
use kiln_otel::parca::{self as format, Stack, StackId};
use kiln_proto::parca::profilestore::v1alpha1 as pb;
use kiln_proto::parca::profilestore::v1alpha1::profile_store_service_server::ProfileStoreService;
use kiln_proto::push::v1 as push;
use kiln_proto::types::v1::LabelPair;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::app::AppRef;
use crate::app::write::{blocking, store};
use crate::auth::{Scope, TenantId};
use crate::error::ApiError;
use crate::time::now_nanos;
use crate::transport::caller::Writes;
use crate::transport::connect::{connect_error, connect_ok};
use crate::transport::grpc::Grpc;

/// `parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw`.
pub const WRITE_RAW: &str = "parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw";
/// `parca.profilestore.v1alpha1.ProfileStoreService/Write`.
pub const WRITE: &str = "parca.profilestore.v1alpha1.ProfileStoreService/Write";
/// `parca.profilestore.v1alpha1.ProfileStoreService/WriteArrow`.
pub const WRITE_ARROW: &str = "parca.profilestore.v1alpha1.ProfileStoreService/WriteArrow";

/// How long a `Write` stream may take from its first message to its last.
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);

/// The header naming a batch of `kiln upload` (file, batch, content hash): a batch whose id was
/// stored for the tenant before is answered OK without being stored again, so an upload resumed
/// after an interruption (which resends the batch it was sending) never duplicates data.
pub const UPLOAD_ID_HEADER: &str = "kiln-upload-id";

/// An upload id joined with a hash of the content it names: the same id with other bytes (a
/// client's mistake, or another batch) is not taken for a batch stored already.
fn with_content(id: String, content: &[u8]) -> String {
    format!("{id}#{:016x}", xxhash_rust::xxh3::xxh3_64(content))
}

/// The batch a request names in [`UPLOAD_ID_HEADER`], if any.
fn upload_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get(UPLOAD_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 256)
        .map(str::to_owned)
}

/// Stores a `WriteRaw` request: each series' pprof profiles with its labels, as `push.v1` does
/// (the deprecated `tenant` field is ignored: the tenant is the credentials'; executable info is
/// for symbolization, which Kiln leaves to query time).
pub async fn write_raw(
    app: &AppRef,
    tenant: &TenantId,
    req: pb::WriteRawRequest,
) -> Result<(), ApiError> {
    let series = req
        .series
        .into_iter()
        .map(|s| push::RawProfileSeries {
            labels: s
                .labels
                .map(|l| l.labels)
                .unwrap_or_default()
                .into_iter()
                .map(|l| LabelPair {
                    name: l.name,
                    value: l.value,
                })
                .collect(),
            samples: s
                .samples
                .into_iter()
                .map(|r| push::RawSample {
                    raw_profile: r.raw_profile,
                    id: String::new(),
                })
                .collect(),
            annotations: Vec::new(),
        })
        .collect();
    crate::api::push::push(app, tenant, push::PushRequest { series }).await
}

fn refuse_oversize(app: &AppRef, tenant: &TenantId, len: usize) -> Result<(), ApiError> {
    let max = app.limits(tenant).max_decompressed_bytes;
    if len > max {
        return Err(ApiError::too_large(format!(
            "the Arrow record is {len} bytes, more than the tenant's limit of {max} bytes"
        )));
    }
    Ok(())
}

/// Stores a `WriteArrow` request: every sample record of the IPC stream, v1 records resolving
/// their stacks from the stream's locations records (and the cache).
pub async fn write_arrow(
    app: &AppRef,
    tenant: &TenantId,
    ipc: Bytes,
    upload_id: Option<String>,
) -> Result<(), ApiError> {
    // On a task of its own: a client that goes away (an uploader killed mid-request) drops the
    // request's future, and a store already handed to the writer would then complete without
    // its upload id being marked stored; the resent batch would be stored twice.
    let (app, tenant) = (app.clone(), tenant.clone());
    let key = upload_id.map(|id| with_content(id, &ipc));
    tokio::spawn(async move {
        app.upload_ids
            .once(&tenant, key, store_arrow(&app, &tenant, ipc))
            .await
    })
    .await
    .map_err(ApiError::internal)?
}

async fn store_arrow(app: &AppRef, tenant: &TenantId, ipc: Bytes) -> Result<(), ApiError> {
    refuse_oversize(app, tenant, ipc.len())?;
    let _share = app.decode_budget.take(ipc.len()).await?;
    let tenant_limits = app.limits(tenant);
    let (limits, max_bytes) = (
        tenant_limits.normalize(),
        tenant_limits.max_decompressed_bytes,
    );
    let cache = app.stacks.clone();
    let owner = tenant.clone();
    let now = now_nanos();
    let (profiles, size) = blocking(move || {
        let batches = format::read_ipc(&ipc, max_bytes)?;
        let size: usize = batches.iter().map(|b| b.get_array_memory_size()).sum();
        let mut stacks: kiln_otel::normalize::kernel::FastMap<StackId, Stack> = Default::default();
        let mut records = Vec::new();
        for b in &batches {
            if format::is_locations_record(b) {
                for (id, stack) in format::decode_locations_record(b)? {
                    cache.insert(&owner, id, stack.clone());
                    stacks.insert(id, stack);
                }
            } else {
                records.push(format::decode_sample_record(b)?);
            }
        }
        let mut profiles = Vec::new();
        for r in &records {
            for id in r.stack_ids() {
                if !stacks.contains_key(&id)
                    && let Some(s) = cache.get(&owner, &id)
                {
                    stacks.insert(id, s);
                }
            }
            profiles.push(format::normalize(r, |id| stacks.get(id), now, &limits)?);
        }
        Ok((profiles, size))
    })
    .await?;
    store(app, tenant, profiles, size, None, None).await
}

fn broken(s: Status) -> ApiError {
    ApiError::invalid(format!("the Write stream broke: {}", s.message()))
}

/// The first message of a `Write` stream: its sample record.
async fn first_of(inbound: &mut Streaming<pb::WriteRequest>) -> Result<pb::WriteRequest, ApiError> {
    inbound
        .message()
        .await
        .map_err(broken)?
        .ok_or_else(|| ApiError::invalid("the Write stream ended before its sample record"))
}

/// One `Write` stream: samples, the ids asked for, their stacks; stored before it ends. What
/// the stream holds is counted as it arrives: one decode-budget share grown with each message,
/// the tenant's `max_decompressed_bytes` over all of them (413), its ingest rate checked before
/// each message is decoded (429); only stacks asked for are taken (400 otherwise), and they
/// join the known-stack cache once the profile is stored.
async fn write_stream(
    app: &AppRef,
    tenant: &TenantId,
    first: pb::WriteRequest,
    mut inbound: Streaming<pb::WriteRequest>,
    answers: &mpsc::Sender<Result<pb::WriteResponse, Status>>,
) -> Result<(), ApiError> {
    app.metrics.received(tenant, first.record.len());
    refuse_oversize(app, tenant, first.record.len())?;
    let max_bytes = app.limits(tenant).max_decompressed_bytes;
    let mut share = app.decode_budget.take(first.record.len()).await?;
    let record = blocking(move || {
        let batches = format::read_ipc(&first.record, max_bytes)?;
        let batch = match batches.as_slice() {
            [b] => b,
            _ => {
                return Err(ApiError::invalid(format!(
                    "a Write stream's first message holds one sample record, not {}",
                    batches.len()
                )));
            }
        };
        let size = batch.get_array_memory_size();
        Ok((format::decode_sample_record(batch)?, size))
    })
    .await?;
    let (record, mut size) = record;
    let held = |size: usize| {
        if size > max_bytes {
            return Err(ApiError::too_large(format!(
                "the Write stream holds more than the tenant's limit of {max_bytes} bytes"
            )));
        }
        Ok(size)
    };
    share.cover(held(size)?).await?;
    let mut known: kiln_otel::normalize::kernel::FastMap<StackId, Stack> = Default::default();
    let mut unknown = Vec::new();
    for id in record.stack_ids() {
        match app.stacks.get(tenant, &id) {
            Some(stack) => {
                known.insert(id, stack);
            }
            None => unknown.push(id),
        }
    }
    app.metrics
        .parca_stack_cache_hits
        .inc_by(known.len() as u64);
    app.metrics
        .parca_stack_cache_misses
        .inc_by(unknown.len() as u64);
    let mut sent = Vec::new();
    if !unknown.is_empty() {
        let ask = format::unknown_ids_record(&unknown)?;
        answers
            .send(Ok(pb::WriteResponse { record: ask.into() }))
            .await
            .map_err(|_| ApiError::invalid("the client left the Write stream"))?;
        let mut missing: HashSet<StackId> = unknown.into_iter().collect();
        while !missing.is_empty() {
            let Some(msg) = inbound.message().await.map_err(broken)? else {
                break;
            };
            app.metrics.received(tenant, msg.record.len());
            app.tenants.check_ingest(tenant)?;
            share
                .cover(held(size.saturating_add(msg.record.len()))?)
                .await?;
            let (stacks, bytes) = blocking(move || {
                let mut out = Vec::new();
                let mut bytes = 0;
                for b in format::read_ipc(&msg.record, max_bytes)? {
                    if !format::is_locations_record(&b) {
                        return Err(ApiError::invalid(
                            "a Write stream's later messages are locations records",
                        ));
                    }
                    bytes += b.get_array_memory_size();
                    out.extend(format::decode_locations_record(&b)?);
                }
                Ok((out, bytes))
            })
            .await?;
            size += bytes;
            share.cover(held(size)?).await?;
            // Only the stacks asked for are taken: others (a `kiln upload` frame holds every
            // stack new at its batch, some asked for by another process) are left, so a
            // stream cannot fill the tenant's stack cache with stacks no sample names.
            for (id, stack) in stacks {
                if missing.remove(&id) {
                    sent.push((id, stack.clone()));
                    known.insert(id, stack);
                }
            }
        }
        if !missing.is_empty() {
            let some = missing.iter().next().map(format::hex).unwrap_or_default();
            return Err(ApiError::invalid(format!(
                "the client did not send {} of the stacks asked for (one is {some})",
                missing.len()
            )));
        }
    }
    let limits = app.limits(tenant).normalize();
    let now = now_nanos();
    let profile = blocking(move || {
        Ok(format::normalize(
            &record,
            |id| known.get(id),
            now,
            &limits,
        )?)
    })
    .await?;
    store(app, tenant, vec![profile], size, None, None).await?;
    for (id, stack) in sent {
        app.stacks.insert(tenant, id, stack);
    }
    Ok(())
}

/// Answers a Connect unary call of this service: admits, decodes, runs `f`.
async fn connect_unary<Req, Resp, F, Fut>(
    app: AppRef,
    tenant: TenantId,
    headers: HeaderMap,
    body: Body,
    f: F,
) -> axum::response::Response
where
    Req: prost::Message + Default + serde::de::DeserializeOwned,
    Resp: prost::Message + serde::Serialize,
    F: FnOnce(AppRef, TenantId, Req) -> Fut,
    Fut: std::future::Future<Output = Result<Resp, ApiError>>,
{
    let result = async {
        let body =
            crate::transport::http::admit(&app, &tenant, body, app.limits(&tenant).max_body_bytes)
                .await?;
        let call = crate::transport::connect::prepare(&app, &headers, body, tenant).await?;
        app.metrics.received(&call.tenant, call.body.len());
        let req: Req = call.codec.decode(&call.body)?;
        let resp = f(app.clone(), call.tenant, req).await?;
        Ok::<_, ApiError>((call.codec, call.codec.encode(&resp)?))
    }
    .await;
    match result {
        Ok((codec, body)) => connect_ok(codec, body),
        Err(e) => connect_error(&e),
    }
}

/// `POST /parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw`.
pub async fn connect_write_raw(
    State(app): State<AppRef>,
    Writes(tenant): Writes,
    headers: HeaderMap,
    body: Body,
) -> axum::response::Response {
    connect_unary(app, tenant, headers, body, |app, tenant, req| async move {
        write_raw(&app, &tenant, req).await?;
        Ok(pb::WriteRawResponse {})
    })
    .await
}

/// `POST /parca.profilestore.v1alpha1.ProfileStoreService/WriteArrow`.
pub async fn connect_write_arrow(
    State(app): State<AppRef>,
    Writes(tenant): Writes,
    headers: HeaderMap,
    body: Body,
) -> axum::response::Response {
    let upload_id = upload_id(&headers);
    connect_unary(
        app,
        tenant,
        headers,
        body,
        |app, tenant, req: pb::WriteArrowRequest| async move {
            write_arrow(&app, &tenant, req.ipc_buffer, upload_id).await?;
            Ok(pb::WriteArrowResponse {})
        },
    )
    .await
}

#[tonic::async_trait]
impl ProfileStoreService for Grpc {
    async fn write_raw(
        &self,
        req: Request<pb::WriteRawRequest>,
    ) -> Result<Response<pb::WriteRawResponse>, Status> {
        let tenant = self.tenant(&req, Scope::Write)?;
        write_raw(&self.app, &tenant, req.into_inner()).await?;
        Ok(Response::new(pb::WriteRawResponse {}))
    }

    type WriteStream = ReceiverStream<Result<pb::WriteResponse, Status>>;

    async fn write(
        &self,
        req: Request<Streaming<pb::WriteRequest>>,
    ) -> Result<Response<Self::WriteStream>, Status> {
        let tenant = self.tenant(&req, Scope::Write)?;
        let upload_id = upload_id(&req.metadata().clone().into_headers());
        let app = self.app.clone();
        let mut inbound = req.into_inner();
        let (tx, rx) = mpsc::channel(2);
        tokio::spawn(async move {
            let result = tokio::time::timeout(WRITE_TIMEOUT, async {
                let first = first_of(&mut inbound).await?;
                let key = upload_id.map(|id| with_content(id, &first.record));
                app.upload_ids
                    .once(
                        &tenant,
                        key,
                        write_stream(&app, &tenant, first, inbound, &tx),
                    )
                    .await
            })
            .await
            .unwrap_or_else(|_| {
                Err(ApiError::new(
                    crate::error::ErrorKind::InvalidInput,
                    format!(
                        "the Write stream took longer than {} s",
                        WRITE_TIMEOUT.as_secs()
                    ),
                ))
            });
            if let Err(e) = result {
                let _ = tx.send(Err(Status::from(e))).await;
            }
            // Dropping `tx` ends the stream with OK: the profile is stored.
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn write_arrow(
        &self,
        req: Request<pb::WriteArrowRequest>,
    ) -> Result<Response<pb::WriteArrowResponse>, Status> {
        let tenant = self.tenant(&req, Scope::Write)?;
        let upload_id = upload_id(&req.metadata().clone().into_headers());
        let body = req.into_inner().ipc_buffer;
        self.app.metrics.received(&tenant, body.len());
        write_arrow(&self.app, &tenant, body, upload_id).await?;
        Ok(Response::new(pb::WriteArrowResponse {}))
    }
}
