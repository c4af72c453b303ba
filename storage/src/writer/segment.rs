//! What both shard loops share: the per-tenant buffers of a shard, its next command, and a
//! segment built from the buffers, put in the store and registered.

use crate::caches::Caches;
use crate::format::block::{DatasetBuilder, DatasetCapacity, assemble_object};
use crate::format::meta::{BlockMeta, object_path};
use crate::format::symbols::SymbolTable;
use crate::metastore::LogCheckpoint;
use crate::metrics::OutcomeLabels;
use crate::{Error, ErrorKind, Result};
use kiln_otel::model::NormalizedProfile;
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;
use tracing::{debug, error};

use super::*;

pub(super) struct Pending {
    pub(super) builder: DatasetBuilder,
    pub(super) acks: Vec<Ack>,
}

/// Per tenant, what its dataset held at the shard's last flush
/// ([`DatasetBuilder::capacity_hint`]); the tenant's next dataset starts with room for as much.
/// A tenant absent from a flush loses its hint.
pub(super) type Hints = BTreeMap<String, DatasetCapacity>;

/// Adds a write received at `received_ms` (Unix ms) to the shard's buffer, with the
/// acknowledgement that waits for its segment (none for a write acknowledged from the log);
/// returns the bytes it added.
pub(super) fn buffer(
    pending: &mut BTreeMap<String, Pending>,
    hints: &Hints,
    tenant: String,
    profiles: &[NormalizedProfile],
    ack: Option<Ack>,
    received_ms: u64,
) -> usize {
    #[cfg(feature = "testing")]
    if tenant == testing::PANICKING_TENANT {
        panic!("a write shard's panic, injected by a test");
    }
    let p = pending.entry(tenant.clone()).or_insert_with(|| {
        // Looked up once per tenant and flush, when its dataset starts.
        let hint = hints.get(&tenant).copied().unwrap_or_default();
        Pending {
            builder: DatasetBuilder::with_capacity(tenant, hint),
            acks: Vec::new(),
        }
    });
    let before = p.builder.estimated_bytes();
    for profile in profiles {
        p.builder.add(profile);
    }
    p.builder.received(received_ms);
    p.acks.extend(ack);
    p.builder.estimated_bytes().saturating_sub(before)
}

/// A shard's next command, or [`Command::Tick`] at the earlier of two deadlines (none: wait
/// for a command).
pub(super) async fn next_command(
    rx: &mut mpsc::Receiver<Command>,
    a: Option<tokio::time::Instant>,
    b: Option<tokio::time::Instant>,
) -> Option<Command> {
    let wake = match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    match wake {
        None => rx.recv().await,
        Some(at) => tokio::select! {
            cmd = rx.recv() => cmd,
            () = tokio::time::sleep_until(at) => Some(Command::Tick),
        },
    }
}

/// Counts a flush's outcome in the metrics, logs it, and records it in the flush's span.
pub(super) fn observe_flush(
    ctx: &FlushContext,
    started: Instant,
    outcome: Result<&Flushed, &Error>,
) {
    let metrics = ctx.store.metrics();
    let span = tracing::Span::current();
    match outcome {
        Ok(f) => {
            span.record("rows", f.rows).record("bytes", f.bytes);
            metrics
                .flush_duration
                .observe(started.elapsed().as_secs_f64());
            metrics.flush_bytes.observe(f.bytes as f64);
            metrics.flush_rows.inc_by(f.rows);
            let outcome = if f.spooled { "spooled" } else { "ok" };
            metrics
                .flushes
                .get_or_create(&OutcomeLabels { outcome })
                .inc();
            debug!(
                segment = %f.id, tenants = f.tenants, rows = f.rows, bytes = f.bytes,
                spooled = f.spooled, elapsed_ms = started.elapsed().as_millis() as u64,
                "segment flushed"
            );
        }
        Err(e) => {
            metrics
                .flushes
                .get_or_create(&OutcomeLabels { outcome: "error" })
                .inc();
            error!(error = %e, "segment flush failed");
        }
    }
}

/// What a flush wrote.
pub(super) struct Flushed {
    pub(super) id: String,
    pub(super) tenants: usize,
    pub(super) rows: u64,
    pub(super) bytes: usize,
    /// The object store was unreachable: the segment waits in the spool.
    pub(super) spooled: bool,
}

/// A segment built from a flush's datasets, not yet in the store and the metastore.
pub(super) struct Built {
    pub(super) path: String,
    pub(super) object: bytes::Bytes,
    pub(super) metas: Vec<BlockMeta>,
    /// What the query engine's caches get of each block before it is visible (taken by the
    /// first attempt to register it).
    pub(super) warmed: Vec<(Arc<SymbolTable>, Option<ArrowReaderMetadata>)>,
    pub(super) flushed: Flushed,
}

/// Encodes every tenant's dataset of one flush as one segment object (none when they hold
/// nothing).
/// `logs`: where the shard's write-ahead log stands once the segment holds what it buffered
/// (none for a shard without a log), written into the segment's footer.
pub(super) async fn build_segment(
    shard: u32,
    ctx: &FlushContext,
    builders: Vec<DatasetBuilder>,
    logs: Vec<LogCheckpoint>,
) -> Result<Option<Built>> {
    let builders: Vec<DatasetBuilder> = builders.into_iter().filter(|b| !b.is_empty()).collect();
    if builders.is_empty() {
        return Ok(None);
    }
    let failing = &ctx.store.metrics().fail_segment_builds;
    if failing
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
    {
        return Err(Error::Task(
            "a segment build failed (injected by a test)".into(),
        ));
    }
    let id =
        ulid::Ulid::from_parts(ctx.clock.now_ms(), ulid::Ulid::generate().random()).to_string();
    let id_for_task = id.clone();
    let warm = ctx.warm.is_some();
    let (object, metas, warmed) = tokio::task::spawn_blocking(move || -> Result<_> {
        let mut datasets = builders
            .into_iter()
            .map(DatasetBuilder::finish)
            .collect::<Result<Vec<_>>>()?;
        for d in &mut datasets {
            d.meta.logs = logs.clone();
        }
        // What a query reads first of each block, as it would read it (the metadata left to
        // the first query should it not parse: the segment is written all the same).
        let warmed = if warm {
            datasets
                .iter()
                .map(|d| {
                    let metadata = Caches::samples_metadata(&d.samples).ok();
                    (Arc::clone(&d.table), metadata)
                })
                .collect()
        } else {
            Vec::new()
        };
        let (object, metas) = assemble_object(&id_for_task, shard, 0, datasets);
        Ok((object, metas, warmed))
    })
    .await
    .map_err(|e| Error::Task(e.to_string()))??;
    let flushed = Flushed {
        bytes: object.len(),
        rows: metas.iter().map(|m| m.rows).sum(),
        tenants: metas.len(),
        id: id.clone(),
        spooled: false,
    };
    Ok(Some(Built {
        path: object_path(0, shard, "", &id),
        object,
        metas,
        warmed,
        flushed,
    }))
}

/// Puts a built segment into the object store (or, when `spool` and the store is
/// unreachable, into the spool: its datasets are registered once drained) and registers its
/// datasets, with `checkpoint` when given, in one metastore transaction. May be tried again
/// with the same segment: the same object goes to the same path.
pub(super) async fn publish_segment(
    ctx: &FlushContext,
    built: &mut Built,
    spool: bool,
    checkpoint: Option<&LogCheckpoint>,
) -> Result<()> {
    match ctx
        .store
        .put_durable(&built.path, built.object.clone())
        .await
    {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::Unavailable && spool && ctx.spool.is_some() => {
            let spool = ctx.spool.as_ref().expect("checked");
            spool
                .append(built.object.clone())
                .await
                .inspect_err(|_| error!(error = %e, "the object store is unreachable"))?;
            ctx.store.metrics().spool_bytes.set(spool.bytes() as i64);
            built.flushed.spooled = true;
            return Ok(());
        }
        Err(e) => return Err(e),
    }
    warm(ctx, built).await;
    match checkpoint {
        None => ctx.metastore.add_blocks(built.metas.clone()).await,
        Some(c) => {
            ctx.metastore
                .add_blocks_checkpointed(built.metas.clone(), c)
                .await
        }
    }
}

/// Gives the query engine what it reads first of a segment's blocks, before they are visible:
/// a query that finds them finds their symbols cached. Once per segment.
pub(super) async fn warm(ctx: &FlushContext, built: &mut Built) {
    if let Some(query) = &ctx.warm {
        for (meta, (table, metadata)) in built.metas.iter().zip(std::mem::take(&mut built.warmed)) {
            query.warm_object(meta, &built.object);
            query.warm_symbols(meta, table).await;
            if let Some(metadata) = metadata {
                query.warm_samples_metadata(meta, metadata).await;
            }
        }
    }
}

/// Writes every tenant's dataset of one flush as one segment object, then registers all of
/// them in one metastore transaction; or spools the segment when the store is unreachable.
pub(super) async fn flush_segment(
    shard: u32,
    ctx: &FlushContext,
    builders: Vec<DatasetBuilder>,
) -> Result<Option<Flushed>> {
    let Some(mut built) = build_segment(shard, ctx, builders, Vec::new()).await? else {
        return Ok(None);
    };
    publish_segment(ctx, &mut built, true, None).await?;
    Ok(Some(built.flushed))
}
