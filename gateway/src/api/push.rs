//! `push.v1.PusherService/Push`, Pyroscope's push API (what Grafana Alloy sends): the request's
//! handling ([`push`]) and its two front ends, Connect ([`connect_handler`]) and gRPC (the
//! [`PusherService`] of [`crate::transport::grpc::Grpc`]).

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use kiln_otel::model::{LABEL_SERVICE_NAME, Labels};
use kiln_otel::{IngestMeta, normalize, pprof};
use kiln_proto::push::v1::pusher_service_server::PusherService;
use kiln_proto::push::v1::{PushRequest, PushResponse};
use tonic::{Request, Response, Status};

use crate::app::AppRef;
use crate::app::budget;
use crate::app::wal::{PprofPart, Record, RecordBody};
use crate::app::write::{decode, store};
use crate::auth::{Scope, TenantId};
use crate::error::ApiError;
use crate::tenants::TenantLimits;
use crate::time::now_nanos;
use crate::transport::caller::Writes;
use crate::transport::connect::{connect_error, connect_ok};
use crate::transport::grpc::Grpc;

/// Stores a push request: every sample is decoded and normalized before anything is
/// written, so a bad sample refuses the whole request and nothing of it is stored.
pub async fn push(app: &AppRef, tenant: &TenantId, req: PushRequest) -> Result<(), ApiError> {
    // Announced from the start: a group of log records waits briefly for it.
    let expected = app.storage.expect_write();
    let limits: TenantLimits = app.limits(tenant);
    let normalize_limits = limits.normalize();
    let now = now_nanos();
    // The samples' bytes as sent; inflating them grows the share (each gzip trailer read once,
    // by the inflation: the trailers' sizes are the senders' word only).
    let sent: usize = req
        .series
        .iter()
        .flat_map(|s| &s.samples)
        .map(|s| s.raw_profile.len())
        .sum();
    let mut share = app.decode_budget.take(sent).await?;
    let mut req = req;
    let mut held = 0usize;
    for sample in req.series.iter_mut().flat_map(|s| s.samples.iter_mut()) {
        let raw = std::mem::take(&mut sample.raw_profile);
        sample.raw_profile =
            budget::maybe_inflate(&mut share, raw, limits.max_decompressed_bytes, held).await?;
        held += sample.raw_profile.len();
        if held > limits.max_decompressed_bytes {
            return Err(ApiError::too_large(format!(
                "the push request decompresses to more than {} bytes",
                limits.max_decompressed_bytes
            )));
        }
    }
    // What the samples decode to, all of them held until stored.
    let max_decoded = pprof::decoded_limit(limits.max_decompressed_bytes);
    let mut decoded = 0usize;
    // Each sample's walk, kept so decoding does not walk it again.
    let mut walked = Vec::new();
    for sample in req.series.iter().flat_map(|s| s.samples.iter()) {
        let checked = budget::checked(
            sample.raw_profile.clone(),
            Some(&kiln_proto::wire::PPROF_PROFILE),
            max_decoded,
        )
        .await?;
        decoded += checked.estimate();
        walked.push(checked);
        if decoded > max_decoded {
            return Err(kiln_otel::Error::DecodesTooLarge {
                estimate: decoded,
                max: max_decoded,
                factor: pprof::DECODED_FACTOR,
            }
            .into());
        }
    }
    share.cover(decoded).await?;
    let bytes = walked.iter().map(|w| w.bytes().len()).sum();
    // Each series' metadata: its labels, the request's time.
    let mut metas = Vec::with_capacity(req.series.len());
    for (i, series) in req.series.iter_mut().enumerate() {
        let mut labels = Labels::default();
        for pair in std::mem::take(&mut series.labels) {
            if pair.name.is_empty() {
                return Err(ApiError::invalid(format!(
                    "series {i} has a label with no name"
                )));
            }
            labels.set(pair.name, pair.value);
        }
        labels.set_default(LABEL_SERVICE_NAME, kiln_otel::model::UNKNOWN_SERVICE);
        metas.push(IngestMeta {
            labels,
            time_nanos: now,
            ..Default::default()
        });
    }
    let record = Record {
        limits: normalize_limits,
        max_decompressed_bytes: limits.max_decompressed_bytes,
        body: RecordBody::Pprof(
            req.series
                .iter()
                .zip(&metas)
                .flat_map(|(series, meta)| {
                    series.samples.iter().map(|sample| PprofPart {
                        meta: meta.clone(),
                        dotnet: false,
                        body: sample.raw_profile.clone(),
                    })
                })
                .collect(),
        ),
    };
    let profiles = decode(bytes, move || {
        let mut walked = walked.into_iter();
        let mut total = 0usize;
        let mut out = Vec::new();
        for (i, (series, meta)) in req.series.into_iter().zip(metas).enumerate() {
            for j in 0..series.samples.len() {
                let checked = walked.next().expect("a walk per sample");
                let (profile, size) = pprof::decode_checked(checked, limits.max_decompressed_bytes)
                    .map_err(|e| ApiError::from(e).context(format!("series {i} sample {j}")))?;
                total += size;
                if total > limits.max_decompressed_bytes {
                    return Err(ApiError::too_large(format!(
                        "the push request decompresses to more than {} bytes",
                        limits.max_decompressed_bytes
                    )));
                }
                let n = normalize::normalize_pprof(&profile, &meta, &normalize_limits)
                    .map_err(|e| ApiError::from(e).context(format!("series {i} sample {j}")))?;
                out.push(n);
            }
        }
        Ok((out, total))
    })
    .await?;
    store(
        app,
        tenant,
        profiles.0,
        profiles.1,
        Some(record),
        Some(expected),
    )
    .await
}

/// `POST /push.v1.PusherService/Push`.
pub async fn connect_handler(
    State(app): State<AppRef>,
    Writes(tenant): Writes,
    headers: HeaderMap,
    body: Body,
) -> axum::response::Response {
    let result = async {
        let body =
            crate::transport::http::admit(&app, &tenant, body, app.limits(&tenant).max_body_bytes)
                .await?;
        let call = crate::transport::connect::prepare(&app, &headers, body, tenant).await?;
        app.metrics.received(&call.tenant, call.body.len());
        let req: kiln_proto::push::v1::PushRequest = call.codec.decode(&call.body)?;
        push(&app, &call.tenant, req).await?;
        Ok::<_, ApiError>((
            call.codec,
            call.codec.encode(&kiln_proto::push::v1::PushResponse {})?,
        ))
    }
    .await;
    match result {
        Ok((codec, body)) => connect_ok(codec, body),
        Err(e) => connect_error(&e),
    }
}

#[tonic::async_trait]
impl PusherService for Grpc {
    async fn push(&self, req: Request<PushRequest>) -> Result<Response<PushResponse>, Status> {
        let tenant = self.tenant(&req, Scope::Write)?;
        push(&self.app, &tenant, req.into_inner()).await?;
        Ok(Response::new(PushResponse {}))
    }
}
