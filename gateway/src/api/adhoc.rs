//! Ad-hoc profiles (`adhocprofiles.v1.AdHocProfileService`): profile files a user uploads in
//! the Profiles Drilldown app's upload tab to look at, kept per tenant apart from the ingested
//! data and drawn as Pyroscope's flamebearer JSON.
//!
//! ```text
//!  Upload{name, profile: base64} ─► decode (bounded) ─► sniff the format ─► one tree per
//!      profile type ─► stored as it came: tenants/<tenant>/adhoc/<ULID>-<name> ─► first type drawn
//!  Get{id, profile_type} ─► the stored file ─► the same parse ─► that type drawn
//!  List ─► the folder's names: id, name and upload time (the ULID's) ─► newest first
//!  Diff{left_id, right_id} ─► both parsed ─► a "double" flamebearer of one shared type
//! ```
//!
//! The format comes from the content: gzip or zstd is undone first; then a JFR recording (`FLR\0`),
//! JSON (speedscope, or a flamebearer as `/pyroscope/render` and Pyroscope's exports write it),
//! text (folded: `a;b;c 12` per line), or else pprof. The file is kept as uploaded and parsed
//! again on every read, as Pyroscope does, so the name and time live in the id alone.
//!
//! Profile types are named as Pyroscope names them: a pprof's sample types (`cpu`,
//! `alloc_space`, …), a folded file's own name; a JFR recording or speedscope file lists its
//! sample types (the full profile type id where two share one). A tenant keeps at most
//! `max_adhoc_profiles` uploads (the oldest go first); each is bounded by `max_body_bytes` as
//! sent and `max_decompressed_bytes` decoded.

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;
use kiln_otel::compress::maybe_inflate;
use kiln_otel::labels::AppName;
use kiln_otel::model::{LABEL_SERVICE_NAME, Labels, NormalizedProfile, ProfileType};
use kiln_otel::{IngestMeta, folded, jfr, normalize, pprof, speedscope};
use kiln_proto::adhocprofiles::v1 as pb;
use kiln_proto::querier::v1::{FlameGraph, Level};
use kiln_storage::query::FlameTree;
use serde::Deserialize;
use ulid::Ulid;

use crate::api::querier::Querier;
use crate::api::render::flamebearer as fb;
use crate::app::AppRef;
use crate::auth::{TenantId, TenantSet};
use crate::error::{ApiError, ErrorKind};
use crate::tenants::TenantLimits;
use crate::transport::caller::Reads;
use crate::transport::connect::{Call, Service, connect_error, connect_ok, prepare};

/// The service, its methods named as the telemetry layer names them.
pub const SERVICE: Service = Service {
    name: "adhocprofiles.v1.AdHocProfileService",
    methods: &[
        "adhocprofiles.v1.AdHocProfileService/Upload",
        "adhocprofiles.v1.AdHocProfileService/Get",
        "adhocprofiles.v1.AdHocProfileService/List",
        "adhocprofiles.v1.AdHocProfileService/Diff",
    ],
    absent: None,
};

/// `POST /adhocprofiles.v1.AdHocProfileService/{method}`.
pub async fn handler(
    State(app): State<AppRef>,
    Reads(tenant): Reads,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let result = async {
        let Call {
            codec,
            tenant,
            body,
            share: _share,
        } = prepare(&app, &headers, body, tenant).await?;
        let out = match method.as_str() {
            "Upload" => {
                let req: pb::AdHocProfilesUploadRequest = codec.decode(&body)?;
                codec.encode(&upload(&app, &tenant, req).await?)?
            }
            "Get" => {
                let req: pb::AdHocProfilesGetRequest = codec.decode(&body)?;
                codec.encode(&get(&app, &tenant, req).await?)?
            }
            "List" => {
                let _: pb::AdHocProfilesListRequest = codec.decode(&body)?;
                codec.encode(&list(&app, &tenant).await?)?
            }
            "Diff" => {
                let req: pb::AdHocProfilesDiffRequest = codec.decode(&body)?;
                codec.encode(&diff(&app, &tenant, req).await?)?
            }
            _ => {
                return Err(ApiError::new(
                    ErrorKind::Unimplemented,
                    format!("{} has no method {method:?} in Kiln", SERVICE.name),
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

/// The tenant-document folder of the uploads.
const FOLDER: &str = "adhoc";
/// Longest name an id keeps (bytes, after [`sanitize`]).
const MAX_NAME_BYTES: usize = 200;
/// Characters of a ULID, the head of every id.
const ULID_LEN: usize = 26;

/// One profile type of an uploaded file, ready to draw.
#[derive(Debug)]
struct Drawn {
    /// Its name in `profile_types`, and what `profile_type` picks it by.
    label: String,
    /// Its profile type, when the file has them (not a folded or flamebearer file); its id
    /// picks it too.
    profile_type: Option<ProfileType>,
    metadata: fb::Metadata,
    tree: FlameTree,
}

/// Stores an upload and draws its first profile type.
pub async fn upload(
    app: &AppRef,
    tenant: &TenantId,
    req: pb::AdHocProfilesUploadRequest,
) -> Result<pb::AdHocProfilesGetResponse, ApiError> {
    let limits = app.limits(tenant);
    let max_nodes =
        Querier::new(app.clone()).max_nodes(&TenantSet::one(tenant.clone()), req.max_nodes)?;
    let data = decode_base64(&req.profile, limits.max_decompressed_bytes)?;
    // Uploads are the tenant's traffic too: counted in its usage and charged to its ingest rate.
    app.tenants.charge_ingest(tenant, data.len() as u64)?;
    app.metrics.adhoc_uploaded(tenant, data.len());
    let name = sanitize(&req.name);
    let (parsed, data) =
        parse_bounded(app, tenant, name.clone(), Bytes::from(data), &limits).await?;
    make_room(app, tenant, limits.max_adhoc_profiles).await?;
    let ulid = Ulid::generate();
    let id = format!("{ulid}-{name}");
    app.storage
        .put_tenant_document(tenant, &document(&id), data)
        .await?;
    answer(id, name, ulid.timestamp_ms(), &parsed, None, max_nodes)
}

/// Draws a stored upload in the profile type asked for (the first one when that is absent or
/// unknown, as Pyroscope answers).
pub async fn get(
    app: &AppRef,
    tenant: &TenantId,
    req: pb::AdHocProfilesGetRequest,
) -> Result<pb::AdHocProfilesGetResponse, ApiError> {
    let max_nodes =
        Querier::new(app.clone()).max_nodes(&TenantSet::one(tenant.clone()), req.max_nodes)?;
    let (name, uploaded_at, parsed) = load(app, tenant, &req.id).await?;
    answer(
        req.id,
        name,
        uploaded_at,
        &parsed,
        req.profile_type.as_deref(),
        max_nodes,
    )
}

/// The tenant's uploads, newest first.
pub async fn list(
    app: &AppRef,
    tenant: &TenantId,
) -> Result<pb::AdHocProfilesListResponse, ApiError> {
    let mut profiles: Vec<pb::AdHocProfilesProfileMetadata> = stored(app, tenant)
        .await?
        .into_iter()
        .map(|(id, ulid, name)| pb::AdHocProfilesProfileMetadata {
            uploaded_at: ulid_ms(ulid),
            name,
            id,
        })
        .collect();
    profiles.sort_by(|a, b| (b.uploaded_at, &b.id).cmp(&(a.uploaded_at, &a.id)));
    Ok(pb::AdHocProfilesListResponse { profiles })
}

/// Two stored uploads drawn as one diff: both in the profile type asked for (each's first when
/// none is), which must be the same.
pub async fn diff(
    app: &AppRef,
    tenant: &TenantId,
    req: pb::AdHocProfilesDiffRequest,
) -> Result<pb::AdHocProfilesDiffResponse, ApiError> {
    let max_nodes =
        Querier::new(app.clone()).max_nodes(&TenantSet::one(tenant.clone()), req.max_nodes)?;
    let ((_, _, left), (_, _, right)) = futures::try_join!(
        load(app, tenant, &req.left_id),
        load(app, tenant, &req.right_id)
    )?;
    let common: Vec<String> = left
        .iter()
        .filter(|l| right.iter().any(|r| r.label == l.label))
        .map(|l| l.label.clone())
        .collect();
    if common.is_empty() {
        return Err(ApiError::invalid(format!(
            "the two profiles have no profile type in common ({:?} and {:?})",
            labels(&left),
            labels(&right)
        )));
    }
    let wanted = req.profile_type.as_deref();
    let (l, r) = (pick(&left, wanted), pick(&right, wanted));
    if l.label != r.label {
        return Err(ApiError::invalid(format!(
            "the left profile is drawn as {:?} and the right as {:?}; ask for one of the types \
             both have: {common:?}",
            l.label, r.label
        )));
    }
    let mut p = fb::diff(&l.tree, &r.tree, max_nodes, &ProfileType::default())
        .map_err(ApiError::internal)?;
    p.metadata = fb::Metadata {
        format: "double",
        ..l.metadata.clone()
    };
    Ok(pb::AdHocProfilesDiffResponse {
        profile_types: common,
        flamebearer_profile: serde_json::to_string(&p).map_err(ApiError::internal)?,
    })
}

fn labels(parsed: &[Drawn]) -> Vec<&str> {
    parsed.iter().map(|d| d.label.as_str()).collect()
}

/// The profile type `wanted` names, or the first.
fn pick<'a>(parsed: &'a [Drawn], wanted: Option<&str>) -> &'a Drawn {
    wanted
        .and_then(|w| {
            parsed
                .iter()
                .find(|d| d.label == w || d.profile_type.as_ref().is_some_and(|t| t.id() == w))
        })
        .unwrap_or(&parsed[0])
}

fn answer(
    id: String,
    name: String,
    uploaded_at: u64,
    parsed: &[Drawn],
    wanted: Option<&str>,
    max_nodes: usize,
) -> Result<pb::AdHocProfilesGetResponse, ApiError> {
    let drawn = pick(parsed, wanted);
    let mut p = fb::single(
        &drawn.tree.to_flamegraph(max_nodes),
        &ProfileType::default(),
    );
    p.metadata = drawn.metadata.clone();
    Ok(pb::AdHocProfilesGetResponse {
        id,
        name,
        uploaded_at: ulid_ms_i64(uploaded_at),
        profile_type: drawn.label.clone(),
        profile_types: parsed.iter().map(|d| d.label.clone()).collect(),
        flamebearer_profile: serde_json::to_string(&p).map_err(ApiError::internal)?,
    })
}

fn ulid_ms(ulid: Ulid) -> i64 {
    ulid_ms_i64(ulid.timestamp_ms())
}

fn ulid_ms_i64(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

fn document(id: &str) -> String {
    format!("{FOLDER}/{id}")
}

/// A stored upload, parsed: its name, upload time (Unix ms) and profile types.
async fn load(
    app: &AppRef,
    tenant: &TenantId,
    id: &str,
) -> Result<(String, u64, Vec<Drawn>), ApiError> {
    let (ulid, name) = parse_id(id)?;
    let not_found = || ApiError::new(ErrorKind::NotFound, format!("profile {id} not found"));
    let ulid = ulid.ok_or_else(not_found)?;
    let data = app
        .storage
        .tenant_document(tenant, &document(id))
        .await?
        .ok_or_else(not_found)?;
    let limits = app.limits(tenant);
    let name = name.to_owned();
    let (parsed, _) = parse_bounded(app, tenant, name.clone(), data, &limits).await?;
    Ok((name, ulid.timestamp_ms(), parsed))
}

/// [`parse`] on a blocking thread, within the tenant's query slots and the process's decode
/// budget (an upload or a draw costs what a query and an ingest of its size cost). Gives the
/// data back.
async fn parse_bounded(
    app: &AppRef,
    tenant: &TenantId,
    name: String,
    data: Bytes,
    limits: &TenantLimits,
) -> Result<(Vec<Drawn>, Bytes), ApiError> {
    let _slot = app.tenants.query_slot(tenant).await?;
    let _share = app
        .decode_budget
        .take(crate::app::budget::decoded_size(
            &data,
            limits.max_decompressed_bytes,
        ))
        .await?;
    let limits = limits.clone();
    crate::app::write::blocking(move || Ok((parse(&name, &data, &limits)?, data))).await
}

/// An id's ULID (`None` when it has none: no upload has that id) and name. Ids are
/// `<ULID>-<name>` with `[A-Za-z0-9._-]` only; anything else is refused, as Pyroscope does.
fn parse_id(id: &str) -> Result<(Option<Ulid>, &str), ApiError> {
    if id.is_empty() || !id.bytes().all(valid_byte) {
        return Err(ApiError::invalid(format!(
            "id {id:?} is invalid: it can only contain [a-zA-Z0-9_-.]"
        )));
    }
    let ulid = id
        .get(..ULID_LEN)
        .filter(|_| id.as_bytes().get(ULID_LEN) == Some(&b'-'))
        .and_then(|u| Ulid::from_string(u).ok());
    Ok((ulid, id.get(ULID_LEN + 1..).unwrap_or_default()))
}

/// The tenant's uploads: (id, ULID, name).
async fn stored(app: &AppRef, tenant: &TenantId) -> Result<Vec<(String, Ulid, String)>, ApiError> {
    Ok(app
        .storage
        .list_tenant_documents(tenant, FOLDER)
        .await?
        .into_iter()
        .filter_map(|(id, _size)| {
            let (ulid, name) = parse_id(&id).ok()?;
            let (ulid, name) = (ulid?, name.to_owned());
            Some((id, ulid, name))
        })
        .collect())
}

/// Removes the oldest uploads until another one fits under `max` (0: no limit). Processes
/// sharing a store may race here and keep one or two more for a while.
async fn make_room(app: &AppRef, tenant: &TenantId, max: usize) -> Result<(), ApiError> {
    if max == 0 {
        return Ok(());
    }
    let mut all = stored(app, tenant).await?;
    if all.len() < max {
        return Ok(());
    }
    all.sort_by_key(|(_, ulid, _)| *ulid);
    let excess = all.len() + 1 - max;
    for (id, _, _) in all.into_iter().take(excess) {
        app.storage
            .delete_tenant_document(tenant, &document(&id))
            .await?;
    }
    Ok(())
}

fn valid_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_')
}

/// A name fit for an id: characters outside `[a-zA-Z0-9._-]` become `_` (as Pyroscope does),
/// cut to [`MAX_NAME_BYTES`].
fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii() && valid_byte(c as u8) {
                c
            } else {
                '_'
            }
        })
        .take(MAX_NAME_BYTES)
        .collect()
}

/// The upload's bytes from base64 (a `data:…;base64,` head, as a browser's file reader writes
/// it, is dropped), refused past `max` bytes.
fn decode_base64(profile: &str, max: usize) -> Result<Vec<u8>, ApiError> {
    let text = profile.trim();
    let text = match text.strip_prefix("data:") {
        Some(rest) => rest.split_once(',').map_or(rest, |(_, data)| data),
        None => text,
    };
    if text.is_empty() {
        return Err(ApiError::invalid("the profile is empty"));
    }
    if text.len() / 4 * 3 > max.saturating_add(3) {
        return Err(ApiError::too_large(format!(
            "the profile is about {} bytes, more than the limit of {max} bytes",
            text.len() / 4 * 3
        )));
    }
    kiln_otel::base64::decode(text).ok_or_else(|| {
        ApiError::invalid("the profile is not base64: send the file's bytes in standard base64")
    })
}

/// Reads an uploaded file into its profile types, in the file's order.
fn parse(name: &str, data: &[u8], limits: &TenantLimits) -> Result<Vec<Drawn>, ApiError> {
    let max = limits.max_decompressed_bytes;
    if data.len() > max {
        return Err(ApiError::too_large(format!(
            "the profile is {} bytes, more than the limit of {max} bytes",
            data.len()
        )));
    }
    let body = maybe_inflate(data, max).map_err(ApiError::from)?;
    let body: &[u8] = &body;
    if body.is_empty() {
        return Err(ApiError::invalid("the profile is empty"));
    }
    let mut normalize_limits = limits.normalize();
    // An upload is bounded by its size; it never becomes stored samples.
    normalize_limits.max_samples = 0;
    let meta = IngestMeta {
        labels: Labels::from_pairs([(LABEL_SERVICE_NAME, "adhoc")]),
        time_nanos: crate::time::now_nanos(),
        ..Default::default()
    };
    let (format, parsed) = if body.starts_with(b"FLR\0") {
        let read = jfr::parse(
            body,
            &jfr::LabelsSnapshot::default(),
            None,
            &meta,
            &normalize_limits,
        );
        ("JFR", read.map(|p| by_type(&p)).map_err(ApiError::from))
    } else if body.trim_ascii_start().starts_with(b"{") {
        if speedscope::looks_like_speedscope(body) {
            let app_name = AppName {
                app: "adhoc".into(),
                labels: Labels::default(),
            };
            let read = speedscope::parse(body, &app_name, 100, &meta, &normalize_limits);
            (
                "speedscope",
                read.map(|p| by_type(&p)).map_err(ApiError::from),
            )
        } else {
            ("flamebearer JSON", read_flamebearer(body))
        }
    } else if let Some(text) = as_text(body) {
        ("folded text", read_folded(name, text))
    } else {
        ("pprof", read_pprof(body, max, &meta, &normalize_limits))
    };
    let parsed = parsed.map_err(|e| {
        e.context(format!(
            "the profile was read as {format} (Kiln reads pprof, JFR, speedscope, flamebearer \
             JSON and folded text)"
        ))
    })?;
    if parsed.is_empty() {
        return Err(ApiError::invalid("no profile was found in the file"));
    }
    Ok(parsed)
}

/// The text of a file that is text: UTF-8 without control characters but tabs and newlines.
fn as_text(body: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(body).ok()?;
    text.chars()
        .all(|c| !c.is_control() || matches!(c, '\n' | '\r' | '\t'))
        .then_some(text)
}

/// Folded text as Pyroscope reads a collapsed file: values as they are, one profile type
/// named after the file.
fn read_folded(name: &str, text: &str) -> Result<Vec<Drawn>, ApiError> {
    let stacks = folded::parse_folded(text)?;
    let mut tree = FlameTree::default();
    for (frames, value) in &stacks {
        tree.add_stack(frames.iter().copied(), *value);
    }
    Ok(vec![Drawn {
        label: name.to_owned(),
        profile_type: None,
        metadata: fb::Metadata {
            format: "single",
            spy_name: "unknown".into(),
            sample_rate: 100,
            units: String::new(),
            name: name.to_owned(),
        },
        tree,
    }])
}

/// A pprof file: every sample type, in its order, even one no sample has a value of.
fn read_pprof(
    body: &[u8],
    max: usize,
    meta: &IngestMeta,
    limits: &kiln_otel::NormalizeLimits,
) -> Result<Vec<Drawn>, ApiError> {
    let p = pprof::decode(body, max)?;
    let normalized = normalize::normalize_pprof(&p, meta, limits)?;
    let mut trees = by_type(&normalized);
    let string = |i: i64| {
        usize::try_from(i)
            .ok()
            .and_then(|i| p.string_table.get(i))
            .and_then(|s| std::str::from_utf8(s).ok())
            .map(str::to_owned)
            .unwrap_or_default()
    };
    let mut out: Vec<Drawn> = Vec::new();
    for vt in &p.sample_type {
        let (sample_type, unit) = (string(vt.r#type), string(vt.unit));
        if out.iter().any(|d| d.label == sample_type) {
            continue;
        }
        let at = trees.iter().position(|d| {
            d.profile_type
                .as_ref()
                .is_some_and(|t| t.sample_type == sample_type)
        });
        out.push(match at {
            Some(i) => Drawn {
                label: sample_type,
                ..trees.remove(i)
            },
            None => Drawn {
                metadata: fb::metadata(
                    "single",
                    &ProfileType {
                        sample_type: sample_type.clone(),
                        sample_unit: unit,
                        ..Default::default()
                    },
                ),
                label: sample_type,
                profile_type: None,
                tree: FlameTree::default(),
            },
        });
    }
    Ok(out)
}

/// One tree per profile type of a normalized profile, in the order they first appear; each
/// named by its sample type, or by its full id where two types share a sample type.
fn by_type(p: &NormalizedProfile) -> Vec<Drawn> {
    let mut order: Vec<ProfileType> = Vec::new();
    let mut trees: HashMap<ProfileType, FlameTree> = HashMap::new();
    let mut frames: Vec<&str> = Vec::new();
    for s in &p.series {
        let tree = trees.entry(s.profile_type.clone()).or_insert_with(|| {
            order.push(s.profile_type.clone());
            FlameTree::default()
        });
        for sample in &s.samples {
            frames.clear();
            frames.extend(p.symbols.frame_names(&sample.stack));
            frames.reverse();
            tree.add_stack(frames.iter().copied(), sample.value);
        }
    }
    let shared = |t: &ProfileType| {
        order
            .iter()
            .filter(|o| o.sample_type == t.sample_type)
            .count()
            > 1
    };
    order
        .iter()
        .map(|t| Drawn {
            label: if shared(t) {
                t.id()
            } else {
                t.sample_type.clone()
            },
            profile_type: Some(t.clone()),
            metadata: fb::metadata("single", t),
            tree: trees.remove(t).unwrap_or_default(),
        })
        .collect()
}

/// A flamebearer file (`/pyroscope/render`'s JSON, Pyroscope's exports), "single" format.
fn read_flamebearer(body: &[u8]) -> Result<Vec<Drawn>, ApiError> {
    #[derive(Deserialize)]
    struct File {
        flamebearer: Body,
        #[serde(default)]
        metadata: Meta,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Body {
        names: Vec<String>,
        levels: Vec<Vec<i64>>,
        #[serde(default)]
        num_ticks: i64,
        #[serde(default)]
        max_self: i64,
    }
    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase", default)]
    struct Meta {
        format: String,
        spy_name: String,
        sample_rate: u32,
        units: String,
        name: String,
    }
    let file: File = serde_json::from_slice(body).map_err(|e| {
        ApiError::invalid(format!(
            "JSON that is neither speedscope nor a flamebearer: {e}"
        ))
    })?;
    if !matches!(file.metadata.format.as_str(), "" | "single") {
        return Err(ApiError::invalid(format!(
            "flamebearer format {:?} is not supported; upload a \"single\" profile",
            file.metadata.format
        )));
    }
    let fg = FlameGraph {
        names: file.flamebearer.names,
        levels: file
            .flamebearer
            .levels
            .into_iter()
            .map(|values| Level { values })
            .collect(),
        total: file.flamebearer.num_ticks,
        max_self: file.flamebearer.max_self,
    };
    let stacks = kiln_storage::query::tree::flamegraph_stacks(&fg)
        .map_err(|e| ApiError::invalid(format!("the flamebearer is malformed: {e}")))?;
    let mut tree = FlameTree::default();
    for (stack, value) in &stacks {
        tree.add_stack(stack.iter().map(String::as_str), *value);
    }
    let m = file.metadata;
    Ok(vec![Drawn {
        label: m.name.clone(),
        profile_type: None,
        metadata: fb::Metadata {
            format: "single",
            spy_name: m.spy_name,
            sample_rate: if m.sample_rate == 0 {
                100
            } else {
                m.sample_rate
            },
            units: m.units,
            name: m.name,
        },
        tree,
    }])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_a_ulid_and_a_safe_name() {
        assert_eq!(
            sanitize("my cpu/profile (1).pb.gz"),
            "my_cpu_profile__1_.pb.gz"
        );
        assert_eq!(sanitize("héllo"), "h_llo");
        assert_eq!(sanitize(&"x".repeat(500)).len(), MAX_NAME_BYTES);
        let ulid = Ulid::generate();
        let id = format!("{ulid}-cpu.pprof");
        let (got, name) = parse_id(&id).unwrap();
        assert_eq!(got, Some(ulid));
        assert_eq!(name, "cpu.pprof");
        assert_eq!(parse_id("no-ulid-here").unwrap().0, None);
        for bad in ["", "../etc", "a/b", "a b"] {
            let e = parse_id(bad).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidInput, "{bad:?}");
        }
    }

    #[test]
    fn base64_as_browsers_send_it() {
        assert_eq!(decode_base64("aGk=", 100).unwrap(), b"hi");
        assert_eq!(
            decode_base64("data:application/octet-stream;base64,aGk=", 100).unwrap(),
            b"hi"
        );
        assert_eq!(
            decode_base64("not base64!", 100).unwrap_err().kind,
            ErrorKind::InvalidInput
        );
        assert_eq!(
            decode_base64(&"QUFB".repeat(100), 30).unwrap_err().kind,
            ErrorKind::PayloadTooLarge
        );
    }

    #[test]
    fn formats_are_told_apart_by_content() {
        let limits = TenantLimits::default();
        let folded = parse("stacks.txt", b"main;a 3\nmain;b 5\n", &limits).unwrap();
        assert_eq!(labels(&folded), ["stacks.txt"]);
        assert_eq!(folded[0].tree.total(), 8);
        assert_eq!(folded[0].metadata.spy_name, "unknown");

        let fg = FlameTree::default();
        let mut t = fg.clone();
        t.add_stack(["main", "x"], 7);
        let json = serde_json::to_vec(&fb::single(
            &t.to_flamegraph(100),
            &ProfileType {
                sample_type: "cpu".into(),
                sample_unit: "nanoseconds".into(),
                ..Default::default()
            },
        ))
        .unwrap();
        let back = parse("x.json", &json, &limits).unwrap();
        assert_eq!(labels(&back), ["cpu"]);
        assert_eq!(back[0].tree.stacks(), t.stacks());

        for bad in [&b"main;a x\n"[..], b"{\"nope\":1}", b"\x0a\x02\x08"] {
            let e = parse("f", bad, &limits).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidInput, "{}", e.message);
            assert!(e.message.contains("read as"), "{}", e.message);
        }
    }
}
