//! The shard loop that acknowledges writes once their segment is stored and registered
//! (`--ack-from store`), with its group commit by arrivals; [`super::logged`] is its peer.

use crate::format::block::DatasetBuilder;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tracing::Instrument;

use super::segment::{Hints, Pending, buffer, flush_segment, next_command, observe_flush};
use super::*;

/// A shard's loop. A write waits at most `flush_interval` (from the first write of a batch),
/// until the buffer passes `flush_bytes`, or until the writes pause ([`Arrivals`]). Flushes
/// run one at a time, and writes that arrive during one, or within `flush_linger` of each
/// other after it, are flushed together without waiting another interval (group commit):
/// under load, acknowledgements follow the flushes back to back.
pub(super) async fn run_shard(
    shard: u32,
    rx: &mut mpsc::Receiver<Command>,
    ctx: Arc<FlushContext>,
    config: WriterConfig,
) {
    let mut pending: BTreeMap<String, Pending> = BTreeMap::new();
    let mut hints = Hints::new();
    let mut size = 0usize;
    // When the oldest buffered write has waited `flush_interval`.
    let mut flush_at: Option<tokio::time::Instant> = None;
    // When the writes have paused long enough that the batch is taken as complete.
    let mut quiet_at: Option<tokio::time::Instant> = None;
    let mut arrivals = Arrivals::new(&config);
    loop {
        let cmd = next_command(rx, flush_at, quiet_at).await;
        match cmd {
            Some(Command::Write {
                tenant,
                profiles,
                ack,
                ..
            }) => {
                size += buffer(
                    &mut pending,
                    &hints,
                    tenant,
                    &profiles,
                    Some(ack),
                    ctx.clock.now_ms(),
                );
                let now = tokio::time::Instant::now();
                flush_at.get_or_insert(now + config.flush_interval);
                quiet_at = arrivals.arrive(now).map(|quiet| now + quiet);
            }
            Some(Command::Tick) => {}
            Some(Command::Flush { done } | Command::Barrier { done }) => {
                flush(shard, &ctx, &mut pending, &mut hints).await;
                (size, flush_at, quiet_at) = (0, None, None);
                let _ = done.send(());
                continue;
            }
            None | Some(Command::Close { .. }) => {
                flush(shard, &ctx, &mut pending, &mut hints).await;
                rx.close();
                if let Some(Command::Close { done }) = cmd {
                    let _ = done.send(());
                }
                return;
            }
        }
        let now = tokio::time::Instant::now();
        let due = flush_at.is_some_and(|at| at <= now) || quiet_at.is_some_and(|at| at <= now);
        if !due && size < config.flush_bytes {
            continue;
        }
        // Group commit: flush, then take what queued up meanwhile and flush it at once, until
        // nothing waits.
        loop {
            flush(shard, &ctx, &mut pending, &mut hints).await;
            (size, flush_at, quiet_at) = (0, None, None);
            let mut control = None;
            // The writers this flush answered send their next writes within moments: gather
            // them until none comes for the linger (at most a flush interval), rather than
            // flushing the first of them alone or leaving them to wait out a new interval.
            let cap = tokio::time::Instant::now() + config.flush_interval;
            while size < config.flush_bytes {
                let next = match rx.try_recv() {
                    Ok(cmd) => Some(cmd),
                    Err(mpsc::error::TryRecvError::Empty) if !config.flush_linger.is_zero() => {
                        let until = (tokio::time::Instant::now() + config.flush_linger).min(cap);
                        // Quiet for the linger: `None`, flush.
                        tokio::time::timeout_at(until, rx.recv())
                            .await
                            .ok()
                            .flatten()
                    }
                    Err(_) => None,
                };
                match next {
                    Some(Command::Write {
                        tenant,
                        profiles,
                        ack,
                        ..
                    }) => {
                        arrivals.arrive(tokio::time::Instant::now());
                        size += buffer(
                            &mut pending,
                            &hints,
                            tenant,
                            &profiles,
                            Some(ack),
                            ctx.clock.now_ms(),
                        );
                        // `try_recv` never yields: under load hundreds of writes queue here,
                        // and the worker's other tasks (queries) would wait for all of them.
                        tokio::task::consume_budget().await;
                    }
                    Some(other) => {
                        control = Some(other);
                        break;
                    }
                    None => break,
                }
            }
            match control {
                Some(Command::Flush { done } | Command::Barrier { done }) => {
                    flush(shard, &ctx, &mut pending, &mut hints).await;
                    size = 0;
                    let _ = done.send(());
                }
                Some(Command::Close { done }) => {
                    flush(shard, &ctx, &mut pending, &mut hints).await;
                    rx.close();
                    let _ = done.send(());
                    return;
                }
                Some(Command::Write { .. } | Command::Tick) | None => {}
            }
            if pending.is_empty() {
                break;
            }
        }
    }
}

/// How a shard's writes arrive: the mean gap between them, to tell a batch that is complete
/// (its senders all wait for their acknowledgements) from a pause in a steady stream.
struct Arrivals {
    last: Option<tokio::time::Instant>,
    /// Moving mean of the gaps, in seconds (each gap at most a flush interval).
    mean_gap: f64,
    linger: Duration,
    interval: Duration,
}

impl Arrivals {
    /// A pause this many mean gaps long ends a batch: writes that arrive independently of
    /// each other (many agents, each on its own timer) pause that long once in about 400
    /// gaps, so their batches still fill a flush interval.
    const QUIET_GAPS: f64 = 6.0;

    fn new(config: &WriterConfig) -> Self {
        Self {
            last: None,
            mean_gap: config.flush_interval.as_secs_f64(),
            linger: config.flush_linger,
            interval: config.flush_interval,
        }
    }

    /// Counts a write arriving at `now`; returns how long a pause after it ends the batch, if
    /// shorter than the flush interval (never without a linger).
    fn arrive(&mut self, now: tokio::time::Instant) -> Option<Duration> {
        if let Some(last) = self.last.replace(now) {
            let gap = now.duration_since(last).min(self.interval).as_secs_f64();
            self.mean_gap += 0.1 * (gap - self.mean_gap);
        }
        let quiet = self
            .linger
            .max(Duration::from_secs_f64(Self::QUIET_GAPS * self.mean_gap));
        (!self.linger.is_zero() && quiet < self.interval).then_some(quiet)
    }
}

async fn flush(
    shard: u32,
    ctx: &FlushContext,
    pending: &mut BTreeMap<String, Pending>,
    hints: &mut Hints,
) {
    let pending = std::mem::take(pending);
    if pending.is_empty() {
        return;
    }
    *hints = pending
        .iter()
        .map(|(tenant, p)| (tenant.clone(), p.builder.capacity_hint()))
        .collect();
    let span = tracing::info_span!(
        "storage.flush",
        shard,
        tenants = pending.len(),
        writes = tracing::field::Empty,
        rows = tracing::field::Empty,
        bytes = tracing::field::Empty,
    );
    flush_pending(shard, ctx, pending).instrument(span).await;
}

/// Writes one flush's pending datasets and answers the writes waiting for it.
async fn flush_pending(shard: u32, ctx: &FlushContext, pending: BTreeMap<String, Pending>) {
    let span = tracing::Span::current();
    let started = Instant::now();
    let (builders, acks): (Vec<DatasetBuilder>, Vec<Vec<Ack>>) =
        pending.into_values().map(|p| (p.builder, p.acks)).unzip();
    span.record("writes", acks.iter().map(Vec::len).sum::<usize>());
    let result = flush_segment(shard, ctx, builders).await;
    match &result {
        Ok(Some(flushed)) => observe_flush(ctx, started, Ok(flushed)),
        Ok(None) => {}
        Err(e) => observe_flush(ctx, started, Err(e)),
    }
    let result = result.map(|_| ()).map_err(|e| (e.kind(), e.to_string()));
    for ack in acks.into_iter().flatten() {
        let _ = ack.send(result.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrivals(linger_ms: u64) -> Arrivals {
        Arrivals::new(&WriterConfig {
            flush_linger: Duration::from_millis(linger_ms),
            ..WriterConfig::default()
        })
    }

    /// Feeds writes `gap` apart; returns the pause that would end the batch after the last.
    fn steady(a: &mut Arrivals, gap: Duration, writes: u32) -> Option<Duration> {
        let t0 = tokio::time::Instant::now();
        (0..writes).fold(None, |_, i| a.arrive(t0 + gap * i))
    }

    #[test]
    fn a_pause_ends_a_batch_only_where_writes_come_fast() {
        // A shard's first write: nothing known, the flush interval governs.
        let mut a = arrivals(3);
        assert_eq!(a.arrive(tokio::time::Instant::now()), None);
        // Writes a millisecond apart (senders answering their acknowledgements): six gaps'
        // pause ends the batch.
        let quiet = steady(&mut a, Duration::from_millis(1), 100).expect("a pause");
        assert!(
            quiet >= Duration::from_millis(5) && quiet < Duration::from_millis(8),
            "{quiet:?}"
        );
        // Never shorter than the linger.
        let mut a = arrivals(20);
        assert_eq!(
            steady(&mut a, Duration::from_millis(1), 100),
            Some(Duration::from_millis(20))
        );
        // Writes 20 ms apart (agents on their own timers, 50 a second): a pause that long is
        // no sign the batch is complete; the flush interval governs.
        let mut a = arrivals(3);
        assert_eq!(steady(&mut a, Duration::from_millis(20), 100), None);
        // After a fast stream, an idle minute: the flush interval governs again.
        let mut a = arrivals(3);
        assert!(steady(&mut a, Duration::from_millis(1), 100).is_some());
        let later = tokio::time::Instant::now() + Duration::from_secs(60);
        a.arrive(later);
        assert!(a.arrive(later + Duration::from_secs(60)).is_none());
        // No linger, no early flush.
        let mut a = arrivals(0);
        assert_eq!(steady(&mut a, Duration::from_millis(1), 100), None);
    }
}
