//! Ingest: Pyroscope's `/ingest` (pprof raw or multipart, JFR raw or multipart, speedscope,
//! folded, lines). The handler reads what every format shares (the query string, the media
//! type, the body within its limits, its `Content-Encoding`), then hands the upload to its
//! format's handler, found in one table ([`FORMATS`]). Every format ends in [`store`], the
//! write path every write API shares, which answers only once the data is durable.

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use bytes::Bytes;
use kiln_otel::labels::{AppName, parse_app_name};
use kiln_otel::model::{LABEL_SERVICE_NAME, Labels};
use kiln_otel::normalize::NormalizeLimits;
use kiln_otel::{IngestMeta, folded, jfr, normalize, pprof, speedscope};

use futures::future::BoxFuture;
use kiln_otel::model::NormalizedProfile;

use crate::app::AppRef;
use crate::app::budget::{self, Share};
use crate::app::wal::{PprofPart, Record, RecordBody};
use crate::app::write::{blocking, decode, store};
use crate::error::ApiError;
use crate::tenants::TenantLimits;
use crate::time::{now_nanos, parse_time};
use crate::transport::caller::Writes;
use crate::transport::http::{admit, decode_content_encoding, media_type, read_body};

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

/// Media types `/ingest` accepts (the body's format comes from `format`); JSON only for
/// speedscope (`format=speedscope`, or none, as speedscope is recognized by its content).
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

/// One format of `/ingest`: the `format=` values that name it, and its handler.
struct Format {
    names: &'static [&'static str],
    /// Whether the body may be a multipart form (`multipart/form-data`).
    multipart: Multipart,
    read: fn(Upload) -> BoxFuture<'static, Result<Read, ApiError>>,
}

/// What a format does with a multipart form.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Multipart {
    /// Reads its parts.
    Parts,
    /// Reads the whole body as the format (`format=pprof` or `speedscope` are never a form).
    Ignored,
    /// Refuses it.
    Refused,
}

/// Every format, found by its `format=` value; none (`""`) is a multipart pprof upload, a
/// speedscope document or folded text, by the body.
const FORMATS: &[Format] = &[
    Format {
        names: &["pprof"],
        multipart: Multipart::Ignored,
        read: |u| Box::pin(pprof_body(u)),
    },
    Format {
        names: &[""],
        multipart: Multipart::Parts,
        read: |u| Box::pin(unnamed(u)),
    },
    Format {
        names: &["jfr"],
        multipart: Multipart::Parts,
        read: |u| Box::pin(jfr_body(u)),
    },
    Format {
        names: &["speedscope"],
        multipart: Multipart::Ignored,
        read: |u| Box::pin(speedscope_body(u)),
    },
    Format {
        names: &["folded", "groups", "collapsed"],
        multipart: Multipart::Refused,
        read: |u| Box::pin(text_body(u, false)),
    },
    Format {
        names: &["lines"],
        multipart: Multipart::Refused,
        read: |u| Box::pin(text_body(u, true)),
    },
];

impl Format {
    /// The format `format=` names, given whether the body is a multipart form.
    fn of(name: &str, multipart: bool) -> Result<&'static Format, ApiError> {
        FORMATS
            .iter()
            .find(|f| f.names.contains(&name))
            .filter(|f| !(multipart && f.multipart == Multipart::Refused))
            .ok_or_else(|| {
                ApiError::invalid(format!(
                    "format {name:?} is not supported; use pprof, jfr, speedscope, folded or \
                     lines (or no format with a multipart/form-data pprof upload)"
                ))
            })
    }

    /// Whether a body of this format goes to the write-ahead log as it came (pprof, alone or
    /// in Pyroscope's multipart upload): its write is announced from the request's start.
    fn logged(&self, multipart: bool) -> bool {
        self.names == ["pprof"] || (self.names == [""] && multipart)
    }
}

/// An upload as its format's handler reads it: the body (its `Content-Encoding` undone), what
/// the query string says, and the request's share of the decode budget.
struct Upload {
    name: AppName,
    meta: IngestMeta,
    body: Bytes,
    /// The body's media type, when it is a multipart form.
    form: Option<mime::Mime>,
    share: Share,
    limits: TenantLimits,
    /// `sampleRate`, when given.
    explicit_rate: Option<u32>,
    /// `spyName=dotnetspy`: the .NET profiler's pprof is repaired.
    dotnet: bool,
    /// No `spyName`: a multipart upload's sample type config may tell the .NET profiler.
    unknown_spy: bool,
}

impl Upload {
    fn sample_rate(&self) -> u32 {
        self.explicit_rate.unwrap_or(100)
    }

    fn form(&self) -> Result<&mime::Mime, ApiError> {
        self.form
            .as_ref()
            .ok_or_else(|| ApiError::invalid("the body is not a multipart form"))
    }
}

/// What a format's handler made of an upload: the profile, the bytes it decoded, its
/// write-ahead log record (pprof), and the share held until it is stored.
struct Read {
    profile: NormalizedProfile,
    decompressed: usize,
    record: Option<Record>,
    share: Share,
}

/// `POST /ingest`: Pyroscope's ingestion API.
pub async fn ingest_handler(
    State(app): State<AppRef>,
    Writes(tenant): Writes,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let params = query_params(&uri)?;
    // Refusals of the media type and format wait for the body to be admitted or read: a client
    // that writes it all before reading sees the answer, not a reset.
    let media = media_type(&headers);
    let multipart = media
        .as_ref()
        .ok()
        .and_then(Option::as_ref)
        .is_some_and(|m| m.essence_str() == "multipart/form-data");
    let format_name = params.get("format").map(String::as_str).unwrap_or("");
    let format = Format::of(format_name, multipart);
    let expected = format
        .as_ref()
        .is_ok_and(|f| f.logged(multipart))
        .then(|| app.storage.expect_write());
    let limits = app.limits(&tenant);
    let body = admit(&app, &tenant, body, limits.max_body_bytes).await?;
    let media = media?;
    if let Some(m) = &media {
        let json_ok =
            m.essence_str() == "application/json" && matches!(format_name, "" | "speedscope");
        if !ACCEPTED.contains(&m.essence_str()) && !json_ok {
            return Err(ApiError::unsupported_media_type(format!(
                "content type {:?} is not accepted by /ingest; send the profile as \
                 application/octet-stream (pprof, JFR, folded, lines), application/json \
                 (speedscope) or multipart/form-data (pprof, JFR)",
                m.essence_str()
            )));
        }
    }
    let body = read_body(body, limits.max_body_bytes).await?;
    app.metrics.received(&tenant, body.len());
    // Held until what the profile became is stored; grown as the body is inflated.
    let mut share = app.decode_budget.take(body.len()).await?;
    let body =
        decode_content_encoding(&headers, body, limits.max_decompressed_bytes, &mut share).await?;
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
    let format = format?;
    let upload = upload(
        &params,
        body,
        multipart.then_some(media).flatten(),
        share,
        limits,
    )?;
    let read = (format.read)(upload).await?;
    let _share = read.share;
    store(
        &app,
        &tenant,
        vec![read.profile],
        read.decompressed,
        read.record,
        expected,
    )
    .await?;
    Ok(StatusCode::OK)
}

/// The upload the query string describes: `name` (required), `from`, `until`, `sampleRate`,
/// `spyName`.
fn upload(
    params: &HashMap<String, String>,
    body: Bytes,
    form: Option<mime::Mime>,
    share: Share,
    limits: TenantLimits,
) -> Result<Upload, ApiError> {
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
    let spy = params
        .get("spyName")
        .filter(|s| !s.is_empty())
        .cloned()
        .unwrap_or_else(|| "unknown".into());
    let mut meta = IngestMeta {
        labels: Labels::default(),
        time_nanos: from,
        duration_nanos: until.saturating_sub(from).max(0),
        display_names: HashMap::new(),
    };
    Ok(Upload {
        name,
        // The .NET profiler's pprof names functions it does not define; repaired for it alone.
        dotnet: spy == pprof::DOTNET_SPY,
        unknown_spy: spy == "unknown",
        meta: {
            meta.labels.set(LABEL_SPY.into(), spy);
            meta
        },
        body,
        form,
        share,
        limits,
        explicit_rate,
    })
}

/// `format=pprof`: the body is a pprof profile, gzipped or not.
async fn pprof_body(mut u: Upload) -> Result<Read, ApiError> {
    apply_app_labels(&mut u.meta, &u.name);
    let body = std::mem::take(&mut u.body);
    pprof_profile(u, body, 0).await
}

/// No format: a multipart pprof upload (Pyroscope's SDKs), a speedscope document, or folded
/// text.
async fn unnamed(mut u: Upload) -> Result<Read, ApiError> {
    if u.form.is_none() {
        if speedscope::looks_like_speedscope(&u.body) {
            return speedscope_body(u).await;
        }
        return text_body(u, false).await;
    }
    apply_app_labels(&mut u.meta, &u.name);
    let body = std::mem::take(&mut u.body);
    let (profile, sample_type_config) = read_multipart(u.form()?, body).await?;
    let held = sample_type_config.as_ref().map_or(0, Bytes::len);
    if let Some(config) = sample_type_config {
        let (names, keys) = parse_sample_type_config(&config)?;
        // As Pyroscope tells them: no spy, and the .NET profiler's `inuse-space` in the config
        // (its releases before 0.8.5 sent no spyName).
        u.dotnet |= u.unknown_spy && keys.iter().any(|k| k == DOTNET_CONFIG_KEY);
        u.meta.display_names = names;
    }
    pprof_profile(u, profile, held).await
}

/// A pprof profile (`held`: bytes the request holds besides), inflated and walked once within
/// the request's share, its record kept for the write-ahead log, then decoded.
async fn pprof_profile(mut u: Upload, profile: Bytes, held: usize) -> Result<Read, ApiError> {
    let max_decompressed = u.limits.max_decompressed_bytes;
    let profile = budget::maybe_inflate(&mut u.share, profile, max_decompressed, held).await?;
    let profile = budget::checked(
        profile,
        Some(&kiln_proto::wire::PPROF_PROFILE),
        pprof::decoded_limit(max_decompressed),
    )
    .await?;
    u.share.cover(held + profile.estimate()).await?;
    let normalize_limits = u.limits.normalize();
    let (meta, dotnet) = (u.meta, u.dotnet);
    let record = pprof_record(
        &meta,
        dotnet,
        profile.bytes(),
        normalize_limits,
        max_decompressed,
    );
    let (profile, decompressed) = decode(profile.bytes().len(), move || {
        let (mut p, size) = pprof::decode_checked(profile, max_decompressed)?;
        if dotnet {
            pprof::repair_dotnet(&mut p);
        }
        Ok((
            normalize::normalize_pprof(&p, &meta, &normalize_limits)?,
            size,
        ))
    })
    .await?;
    Ok(Read {
        profile,
        decompressed,
        record: Some(record),
        share: u.share,
    })
}

/// `format=jfr`: a JFR recording, alone or in a multipart form with its labels.
async fn jfr_body(mut u: Upload) -> Result<Read, ApiError> {
    let body = std::mem::take(&mut u.body);
    let (recording, labels) = if u.form.is_some() {
        let mut parts = read_multipart_parts(u.form()?, body).await?;
        let recording = parts
            .remove("jfr")
            .ok_or_else(|| ApiError::invalid("the multipart body has no \"jfr\" part"))?;
        (recording, parts.remove("labels"))
    } else {
        (body, None)
    };
    apply_jfr_app_labels(&mut u.meta, &u.name);
    let max_decompressed = u.limits.max_decompressed_bytes;
    let recording = budget::maybe_inflate(&mut u.share, recording, max_decompressed, 0).await?;
    let labels = match labels.filter(|l| !l.is_empty()) {
        Some(l) => {
            Some(budget::maybe_inflate(&mut u.share, l, max_decompressed, recording.len()).await?)
        }
        None => None,
    };
    let (meta, rate, limits) = (u.meta, u.explicit_rate, u.limits.normalize());
    let (profile, decompressed) = blocking(move || {
        let labels = match labels {
            Some(l) => jfr::LabelsSnapshot::decode(&l)?,
            None => jfr::LabelsSnapshot::default(),
        };
        let p = jfr::parse(&recording, &labels, rate, &meta, &limits)?;
        Ok((p, recording.len()))
    })
    .await?;
    Ok(Read {
        profile,
        decompressed,
        record: None,
        share: u.share,
    })
}

/// `format=speedscope`: a speedscope JSON document.
async fn speedscope_body(u: Upload) -> Result<Read, ApiError> {
    let rate = u.sample_rate();
    let (body, name, meta, limits) = (u.body, u.name, u.meta, u.limits.normalize());
    let (profile, decompressed) = blocking(move || {
        let p = speedscope::parse(&body, &name, rate, &meta, &limits)?;
        Ok((p, body.len()))
    })
    .await?;
    Ok(Read {
        profile,
        decompressed,
        record: None,
        share: u.share,
    })
}

/// `format=folded` (`groups`, `collapsed`): `frame;frame count` lines; `format=lines`: one
/// stack per line, each counted once.
async fn text_body(u: Upload, lines: bool) -> Result<Read, ApiError> {
    let rate = u.sample_rate();
    let (body, name, meta, limits) = (u.body, u.name, u.meta, u.limits.normalize());
    let (profile, decompressed) = blocking(move || {
        let text = std::str::from_utf8(&body)
            .map_err(|_| ApiError::invalid("the profile text is not valid UTF-8"))?;
        let stacks = if lines {
            folded::parse_lines(text)
        } else {
            folded::parse_folded(text)?
        };
        let p = folded::from_text_stacks(&stacks, &name, rate, &meta, &limits)?;
        Ok((p, body.len()))
    })
    .await?;
    Ok(Read {
        profile,
        decompressed,
        record: None,
        share: u.share,
    })
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
    form: &mime::Mime,
    body: Bytes,
) -> Result<HashMap<String, Bytes>, ApiError> {
    let boundary = form
        .get_param(mime::BOUNDARY)
        .map(|b| b.as_str().to_owned())
        .ok_or_else(|| ApiError::invalid("bad multipart content type: no boundary"))?;
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
    form: &mime::Mime,
    body: Bytes,
) -> Result<(Bytes, Option<Bytes>), ApiError> {
    let mut parts = read_multipart_parts(form, body).await?;
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
