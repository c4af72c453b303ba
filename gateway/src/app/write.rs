//! The write path every write API ends in: decoding off the async workers (`blocking`; small
//! bodies on the request's task, `decode`) and
//! [`store`], which charges the tenant's rate and series limits and answers only once the
//! profiles are durable.

use kiln_otel::model::NormalizedProfile;
use kiln_storage::writer::ExpectedWrite;

use crate::app::AppRef;
use crate::app::wal::Record;
use crate::auth::TenantId;
use crate::error::ApiError;

/// Writes normalized profiles for a tenant after its rate and series limits, the service's
/// source version written into their mappings' build ids; returns once all are durable.
/// `decompressed_bytes` is what the rate limit charges. `record` is the request they were
/// decoded from, where its format is logged: with a write-ahead log, the write is durable once
/// the record is (ADR 0018). `expected`: the write's announcement, taken when its request
/// came in ([`kiln_storage::Storage::expect_write`]), handed to the writer with the write.
pub async fn store(
    app: &AppRef,
    tenant: &TenantId,
    mut profiles: Vec<NormalizedProfile>,
    decompressed_bytes: usize,
    record: Option<Record>,
    expected: Option<ExpectedWrite>,
) -> Result<(), ApiError> {
    app.tenants
        .charge_ingest(tenant, decompressed_bytes as u64)?;
    let hashes: Vec<u64> = profiles
        .iter()
        .flat_map(|p| p.series.iter())
        .map(|s| kiln_storage::series_hash(&s.profile_type.id(), s.labels.iter()))
        .collect();
    admit_series(app, tenant, &hashes).await?;
    for p in &mut profiles {
        p.inject_service_version();
    }
    let samples: usize = profiles.iter().map(NormalizedProfile::sample_count).sum();
    let series: usize = profiles.iter().map(|p| p.series.len()).sum();
    // The recording rules' sums of these profiles, added once they are durable (and held
    // against rule changes until then: `crate::recording`).
    let evaluation = app
        .recording
        .begin(&app.storage, &app.tenants, tenant, &profiles)
        .await?;
    // Stored and added in a task of its own: a request cancelled mid-flush (the client gone)
    // is still stored by the writer, and so its sums are still added.
    let record = record
        .filter(|r| app.storage.logs_writes() && r.body_bytes() <= MAX_RECORD_BYTES)
        .map(|r| r.encode(tenant));
    let task = {
        let (app, tenant) = (AppRef::clone(app), tenant.clone());
        let work = async move {
            app.storage
                .write_logged(&tenant, profiles, record, expected)
                .await?;
            evaluation
                .commit(
                    &app.storage,
                    &tenant,
                    app.limits(&tenant).max_recording_series,
                    &app.recording.stats,
                )
                .await
        };
        // In the request's span, as if it ran in place (its `storage.write` is the request's).
        tokio::spawn(tracing::Instrument::in_current_span(work))
    };
    task.await.map_err(ApiError::internal)??;
    app.metrics.decompressed(tenant, decompressed_bytes);
    app.metrics.stored(tenant, series, samples);
    Ok(())
}

/// Admits a write's series against the tenant's `max_series`. Where processes share the
/// metastore, it counts the series of all of them (exact for the cluster), asked only about
/// series new to this process; alone, this process counts them, seeded from the last hour's
/// blocks.
async fn admit_series(app: &AppRef, tenant: &TenantId, hashes: &[u64]) -> Result<(), ApiError> {
    let metastore = app.storage.metastore();
    if metastore.shared() {
        let unseen = app.tenants.unseen_series(tenant, hashes);
        if !unseen.is_empty() {
            let max = app.limits(tenant).max_series;
            let window = crate::tenants::ACTIVE_SERIES_WINDOW;
            if !metastore.admit_series(tenant, &unseen, max, window).await? {
                return Err(crate::tenants::series_limit(tenant, max));
            }
        }
        app.tenants.saw_series(tenant, hashes);
        return Ok(());
    }
    if !app.tenants.series_loaded(tenant) {
        let window = crate::tenants::ACTIVE_SERIES_WINDOW.as_nanos() as i64;
        let since = crate::time::now_nanos().saturating_sub(window);
        let known = app.storage.series_hashes(tenant, since).await?;
        app.tenants.seed_series(tenant, known);
    }
    app.tenants.admit_series(tenant, hashes)
}

/// Writes whose bodies (as decoded) are larger than this are acknowledged once their segment
/// is registered rather than from the write-ahead log: their record would hold a second copy of
/// a large body in memory until appended (an amplified body inflates to tens of megabytes).
pub(crate) const MAX_RECORD_BYTES: usize = 4 << 20;

/// Bodies up to this size (uncompressed) are decoded and normalized on the request's own task
/// ([`decode`]): at about 50 instructions a byte that is ~0.2 ms for the ~15 kB of an SDK's
/// pprof, while handing the body to a blocking thread and back wakes a sleeping thread and
/// switches to it twice: inline decoding gave 0.85× the server's CPU on the `small` bench
/// (docs/performance.md, "Decoding on the request's task").
pub(crate) const INLINE_DECODE_BYTES: usize = 32 << 10;

/// Decodes (and normalizes) a body of `bytes` bytes: on the request's own task when it is at
/// most [`INLINE_DECODE_BYTES`], else on a blocking thread ([`blocking`]); in an
/// `ingest.decode` span of the request either way.
pub(crate) async fn decode<T: Send + 'static>(
    bytes: usize,
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    inline_up_to(INLINE_DECODE_BYTES, bytes, f).await
}

/// Runs `f`, the work on `bytes` bytes, on the request's own task when they are at most
/// `limit`, else on a blocking thread ([`blocking`]); in an `ingest.decode` span of the request
/// either way. `limit` is where `f` would hold an async worker longer than a handoff costs.
pub(crate) async fn inline_up_to<T: Send + 'static>(
    limit: usize,
    bytes: usize,
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    if bytes <= limit {
        return tracing::info_span!("ingest.decode").in_scope(f);
    }
    blocking(f).await
}

/// Runs CPU-heavy decoding off the async workers, in an `ingest.decode` span of the request.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let span = tracing::info_span!("ingest.decode");
    tokio::task::spawn_blocking(move || span.in_scope(f))
        .await
        .map_err(ApiError::internal)?
}
