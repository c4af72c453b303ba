//! Ingest: Pyroscope's `/ingest` (pprof raw or multipart, JFR raw or multipart, speedscope,
//! folded, lines). Every format ends in [`store`], the write path every write API shares,
//! which answers only once the data is durable.

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use bytes::Bytes;
use kiln_otel::labels::{AppName, parse_app_name};
use kiln_otel::model::{LABEL_SERVICE_NAME, Labels};
use kiln_otel::normalize::NormalizeLimits;
use kiln_otel::{IngestMeta, folded, jfr, normalize, pprof, speedscope};

use crate::app::AppRef;
use crate::app::budget;
use crate::app::wal::{PprofPart, Record, RecordBody};
use crate::app::write::{blocking, decode, store};
use crate::auth::{Scope, TenantId};
use crate::error::ApiError;
use crate::time::{now_nanos, parse_time};
use crate::transport::http::{admit, decode_content_encoding, read_body};

/// Labels Pyroscope adds to every `/ingest` series.
const LABEL_SPY: &str = "pyroscope_spy";

/// Decodes the query string strictly: percent-decoded values must be UTF-8.
fn query_params(uri: &Uri) -> Result<HashMap<String, String>, ApiError> {
    let mut out = HashMap::new();
    for pair in uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let decode = |s: &str| -> Result<String, ApiError> {
            let s = s.replace('+', " ");
            percent_encoding::percent_decode_str(&s)
                .decode_utf8()
                .map(|c| c.into_owned())
                .map_err(|_| ApiError::invalid(format!("query parameter {k:?} is not valid UTF-8")))
        };
        out.insert(decode(k)?, decode(v)?);
    }
    Ok(out)
}

/// Content types `/ingest` accepts (the body format comes from `format`); JSON only for
/// speedscope (`format=speedscope`, or none, as speedscope is recognized by its content).
fn check_ingest_content_type(
    headers: &HeaderMap,
    format: &str,
) -> Result<Option<String>, ApiError> {
    let Some(ct) = headers.get(header::CONTENT_TYPE) else {
        return Ok(None);
    };
    let ct = ct
        .to_str()
        .map_err(|_| ApiError::invalid("the content type is not valid text"))?;
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    const ACCEPTED: [&str; 8] = [
        "application/octet-stream",
        "binary/octet-stream",
        "application/x-protobuf",
        "application/protobuf",
        "application/vnd.google.protobuf",
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data",
    ];
    let json_ok = essence == "application/json" && matches!(format, "" | "speedscope");
    if !ACCEPTED.contains(&essence.as_str()) && !json_ok {
        return Err(ApiError::unsupported_media_type(format!(
            "content type {essence:?} is not accepted by /ingest; send the profile as \
             application/octet-stream (pprof, JFR, folded, lines), application/json \
             (speedscope) or multipart/form-data (pprof, JFR)"
        )));
    }
    Ok(Some(ct.to_owned()))
}

/// `POST /ingest`: Pyroscope's ingestion API.
pub async fn ingest_handler(
    State(app): State<AppRef>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let result = match app.authenticate(&headers, Scope::Write) {
        Ok(tenant) => ingest(&app, &tenant, &uri, &headers, body)
            .await
            .inspect_err(|e| app.metrics.refused(&tenant, e.reason())),
        Err(e) => Err(e),
    };
    result.map(|()| StatusCode::OK)
}

/// Whether the request says its body is a multipart form.
fn says_multipart(headers: &HeaderMap) -> bool {
    headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.to_ascii_lowercase().starts_with("multipart/form-data"))
}

async fn ingest(
    app: &AppRef,
    tenant: &TenantId,
    uri: &Uri,
    headers: &HeaderMap,
    body: Body,
) -> Result<(), ApiError> {
    let params = query_params(uri)?;
    let format = params.get("format").map(String::as_str).unwrap_or("");
    // The write announced from the request's start where its format is logged (pprof, alone
    // or in Pyroscope's multipart upload): a group of log records waits briefly for it while
    // it is read and decoded.
    let logged = format == "pprof" || (format.is_empty() && says_multipart(headers));
    let expected = logged.then(|| app.storage.expect_write());
    let limits = app.limits(tenant);
    let body = admit(app, tenant, body, limits.max_body_bytes).await?;
    let content_type = check_ingest_content_type(headers, format)?;
    let body = read_body(body, limits.max_body_bytes).await?;
    app.metrics.received(tenant, body.len());
    // Held until what the profile became is stored.
    let mut share = app
        .decode_budget
        .take(budget::decoded_size(&body, limits.max_decompressed_bytes))
        .await?;
    let body =
        decode_content_encoding(headers, body, limits.max_decompressed_bytes, &mut share).await?;
    if body.len() > limits.max_decompressed_bytes {
        return Err(ApiError::too_large(format!(
            "the profile is {} bytes, more than the limit of {} bytes",
            body.len(),
            limits.max_decompressed_bytes
        )));
    }
    if body.is_empty() {
        return Err(ApiError::invalid("the request body is empty"));
    }
    let name = params.get("name").ok_or_else(|| {
        ApiError::invalid("the name parameter is required (app{label=value,...})")
    })?;
    let name = parse_app_name(name)?;
    let now = now_nanos();
    let time_param = |key: &str| -> Result<Option<i64>, ApiError> {
        params
            .get(key)
            .filter(|v| !v.is_empty())
            .map(|v| {
                parse_time(v, now).ok_or_else(|| {
                    ApiError::invalid(format!(
                        "{key}={v:?} is not a time (Unix s/ms/µs/ns or now-1h)"
                    ))
                })
            })
            .transpose()
    };
    let from = time_param("from")?.unwrap_or(now);
    let until = time_param("until")?.unwrap_or(from);
    let explicit_rate: Option<u32> = match params.get("sampleRate").filter(|v| !v.is_empty()) {
        None => None,
        Some(v) => Some(
            v.parse()
                .ok()
                .filter(|r| *r <= 1_000_000_000)
                .ok_or_else(|| {
                    ApiError::invalid(format!(
                        "sampleRate={v:?} is not an integer from 0 to 1e9 (Hz)"
                    ))
                })?,
        ),
    };
    let sample_rate = explicit_rate.unwrap_or(100);
    let spy = params
        .get("spyName")
        .filter(|s| !s.is_empty())
        .cloned()
        .unwrap_or_else(|| "unknown".into());
    // The .NET profiler's pprof names functions it does not define; repaired for it alone.
    let dotnet = spy == pprof::DOTNET_SPY;
    // Or, as Pyroscope tells them, a multipart upload of no spy whose sample type config has
    // the .NET profiler's `inuse-space` (its releases before 0.8.5 sent no spyName).
    let unknown_spy = spy == "unknown";
    let is_multipart = content_type
        .as_deref()
        .is_some_and(|ct| ct.to_ascii_lowercase().starts_with("multipart/form-data"));

    let mut meta = IngestMeta {
        labels: Labels::default(),
        time_nanos: from,
        duration_nanos: until.saturating_sub(from).max(0),
        display_names: HashMap::new(),
    };
    meta.labels.set(LABEL_SPY.into(), spy);

    let normalize_limits = limits.normalize();
    let max_decompressed = limits.max_decompressed_bytes;
    // The write-ahead log's record, for the formats it takes (pprof).
    let mut record = None;
    let (profile, decompressed) = match (format, is_multipart) {
        ("pprof", _) => {
            apply_app_labels(&mut meta, &name);
            let body = budget::maybe_gunzip(&mut share, body, max_decompressed, 0).await?;
            let body = budget::checked(
                body,
                Some(&kiln_proto::wire::PPROF_PROFILE),
                pprof::decoded_limit(max_decompressed),
            )
            .await?;
            share.cover(body.estimate()).await?;
            let meta = meta.clone();
            record = Some(pprof_record(
                &meta,
                dotnet,
                body.bytes(),
                normalize_limits,
                max_decompressed,
            ));
            decode(body.bytes().len(), move || {
                let (mut p, size) = pprof::decode_checked(body, max_decompressed)?;
                if dotnet {
                    pprof::repair_dotnet(&mut p);
                }
                Ok((
                    normalize::normalize_pprof(&p, &meta, &normalize_limits)?,
                    size,
                ))
            })
            .await?
        }
        ("", true) => {
            apply_app_labels(&mut meta, &name);
            let ct = content_type.unwrap_or_default();
            let (profile, sample_type_config) = read_multipart(&ct, body).await?;
            let held = sample_type_config.as_ref().map_or(0, Bytes::len);
            let profile = budget::maybe_gunzip(&mut share, profile, max_decompressed, held).await?;
            let profile = budget::checked(
                profile,
                Some(&kiln_proto::wire::PPROF_PROFILE),
                pprof::decoded_limit(max_decompressed),
            )
            .await?;
            share.cover(held + profile.estimate()).await?;
            let mut dotnet = dotnet;
            if let Some(config) = sample_type_config {
                let (names, keys) = parse_sample_type_config(&config)?;
                dotnet |= unknown_spy && keys.iter().any(|k| k == DOTNET_CONFIG_KEY);
                meta.display_names = names;
            }
            record = Some(pprof_record(
                &meta,
                dotnet,
                profile.bytes(),
                normalize_limits,
                max_decompressed,
            ));
            decode(profile.bytes().len(), move || {
                let (mut p, size) = pprof::decode_checked(profile, max_decompressed)?;
                if dotnet {
                    pprof::repair_dotnet(&mut p);
                }
                Ok((
                    normalize::normalize_pprof(&p, &meta, &normalize_limits)?,
                    size,
                ))
            })
            .await?
        }
        ("jfr", _) => {
            let (recording, labels) = if is_multipart {
                let ct = content_type.unwrap_or_default();
                let mut parts = read_multipart_parts(&ct, body).await?;
                let recording = parts
                    .remove("jfr")
                    .ok_or_else(|| ApiError::invalid("the multipart body has no \"jfr\" part"))?;
                (recording, parts.remove("labels"))
            } else {
                (body, None)
            };
            apply_jfr_app_labels(&mut meta, &name);
            let recording =
                budget::maybe_gunzip(&mut share, recording, max_decompressed, 0).await?;
            let labels = match labels.filter(|l| !l.is_empty()) {
                Some(l) => Some(
                    budget::maybe_gunzip(&mut share, l, max_decompressed, recording.len()).await?,
                ),
                None => None,
            };
            blocking(move || {
                let labels = match labels {
                    Some(l) => jfr::LabelsSnapshot::decode(&l)?,
                    None => jfr::LabelsSnapshot::default(),
                };
                let p = jfr::parse(&recording, &labels, explicit_rate, &meta, &normalize_limits)?;
                Ok((p, recording.len()))
            })
            .await?
        }
        ("speedscope", _) | ("", false)
            if format == "speedscope" || speedscope::looks_like_speedscope(&body) =>
        {
            blocking(move || {
                let p = speedscope::parse(&body, &name, sample_rate, &meta, &normalize_limits)?;
                Ok((p, body.len()))
            })
            .await?
        }
        ("" | "folded" | "groups" | "collapsed", false) | ("lines", false) => {
            let lines = format == "lines";
            blocking(move || {
                let text = std::str::from_utf8(&body)
                    .map_err(|_| ApiError::invalid("the profile text is not valid UTF-8"))?;
                let stacks = if lines {
                    folded::parse_lines(text)
                } else {
                    folded::parse_folded(text)?
                };
                let p = folded::from_text_stacks(
                    &stacks,
                    &name,
                    sample_rate,
                    &meta,
                    &normalize_limits,
                )?;
                Ok((p, body.len()))
            })
            .await?
        }
        (other, _) => {
            return Err(ApiError::invalid(format!(
                "format {other:?} is not supported; use pprof, jfr, speedscope, folded or lines \
                 (or no format with a multipart/form-data pprof upload)"
            )));
        }
    };
    store(app, tenant, vec![profile], decompressed, record, expected).await
}

/// The write-ahead log record of one pprof upload.
fn pprof_record(
    meta: &IngestMeta,
    dotnet: bool,
    body: &Bytes,
    limits: NormalizeLimits,
    max_decompressed_bytes: usize,
) -> Record {
    Record {
        limits,
        max_decompressed_bytes,
        body: RecordBody::Pprof(vec![PprofPart {
            meta: meta.clone(),
            dotnet,
            body: body.clone(),
        }]),
    }
}

/// `name{k=v}` labels for pprof uploads: the app name is the service name unless a label says so.
fn apply_app_labels(meta: &mut IngestMeta, name: &AppName) {
    for (k, v) in name.labels.iter() {
        meta.labels.set(k.to_owned(), v.to_owned());
    }
    meta.labels.set_default(LABEL_SERVICE_NAME, &name.app);
}

/// `name{k=v}` labels for JFR uploads, as Pyroscope's JFR path sets them: the app name is the
/// service name, or `app_name` when a label names the service.
fn apply_jfr_app_labels(meta: &mut IngestMeta, name: &AppName) {
    for (k, v) in name.labels.iter() {
        meta.labels.set(k.to_owned(), v.to_owned());
    }
    if meta.labels.get(LABEL_SERVICE_NAME).is_some() {
        meta.labels.set_default("app_name", &name.app);
    } else {
        meta.labels.set(LABEL_SERVICE_NAME.into(), name.app.clone());
    }
}

/// The parts of a multipart upload by name (the last of a name wins).
async fn read_multipart_parts(
    content_type: &str,
    body: Bytes,
) -> Result<HashMap<String, Bytes>, ApiError> {
    let boundary = multer::parse_boundary(content_type)
        .map_err(|e| ApiError::invalid(format!("bad multipart content type: {e}")))?;
    let stream = futures::stream::once(async move { Ok::<_, std::convert::Infallible>(body) });
    let mut mp = multer::Multipart::new(stream, boundary);
    let mut parts = HashMap::new();
    while let Some(field) = mp
        .next_field()
        .await
        .map_err(|e| ApiError::invalid(format!("malformed multipart body: {e}")))?
    {
        let name = field.name().unwrap_or_default().to_owned();
        let data = field
            .bytes()
            .await
            .map_err(|e| ApiError::invalid(format!("malformed multipart part {name:?}: {e}")))?;
        parts.insert(name, data);
    }
    Ok(parts)
}

/// The `profile` part (required) and `sample_type_config` part of a multipart pprof upload.
async fn read_multipart(
    content_type: &str,
    body: Bytes,
) -> Result<(Bytes, Option<Bytes>), ApiError> {
    let mut parts = read_multipart_parts(content_type, body).await?;
    if parts.contains_key("prev_profile") {
        return Err(ApiError::invalid(
            "prev_profile is not supported: upgrade the client to send delta profiles",
        ));
    }
    let profile = parts
        .remove("profile")
        .ok_or_else(|| ApiError::invalid("the multipart body has no \"profile\" part"))?;
    Ok((profile, parts.remove("sample_type_config")))
}

/// `sample_type_config`: `{"<sample type>": {"display-name": "...", ...}}` → display names, and
/// every key it has.
fn parse_sample_type_config(
    data: &[u8],
) -> Result<(HashMap<String, String>, Vec<String>), ApiError> {
    let v: HashMap<String, serde_json::Value> = serde_json::from_slice(data)
        .map_err(|e| ApiError::invalid(format!("sample_type_config is not valid JSON: {e}")))?;
    let keys = v.keys().cloned().collect();
    let names = v
        .into_iter()
        .filter_map(|(k, cfg)| {
            cfg.get("display-name")
                .and_then(|d| d.as_str())
                .filter(|d| !d.is_empty())
                .map(|d| (k, d.to_owned()))
        })
        .collect();
    Ok((names, keys))
}

/// The sample type config key by which Pyroscope tells a .NET profiler that sent no spyName.
const DOTNET_CONFIG_KEY: &str = "inuse-space";
