//! The budget of decoded bytes in flight: what bounds ingest memory across requests.
//!
//! Each ingest request holds a share of the budget from before it inflates and decodes its
//! profile until what it produced is stored. The share starts at the size the request states
//! (gzip's trailer or zstd's frame header, which a sender writes as it likes) and grows as
//! bytes are actually produced: a body is inflated in steps of [`STEP`] ([`inflate`]), each
//! covered by the share before it is written, so a forged size or a stream of many members or
//! frames cannot inflate past what the budget holds. A request that finds the budget spent waits up to [`WAIT`] for others to
//! finish, then is answered 503 with `Retry-After`: the server is busy, not the tenant over its
//! rate (that is 429). A request larger than the whole budget takes all of it, so it still
//! runs, alone.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use kiln_otel::compress::Codec;

use crate::error::{ApiError, ErrorKind};

/// How long a request waits for budget before it is refused.
pub const WAIT: Duration = Duration::from_secs(2);

/// Seconds a refused client is asked to wait.
pub const RETRY_AFTER_SECS: u64 = 1;

/// The budget's unit: permits are KiB, so a `u32` of them covers 4 TiB.
const UNIT: usize = 1024;

/// A budget of decoded bytes shared by all ingest requests of a process.
#[derive(Debug, Clone)]
pub struct DecodeBudget {
    permits: Arc<Semaphore>,
    total: u32,
}

/// A request's share of the budget, given back when dropped.
#[derive(Debug)]
pub struct Share {
    permit: Option<OwnedSemaphorePermit>,
    budget: DecodeBudget,
}

/// The bytes one step of [`inflate`] may produce before the share is grown again.
pub const STEP: usize = 1 << 20;

impl DecodeBudget {
    /// A budget of `bytes` (at least 1 MiB; 0 means no bound).
    pub fn new(bytes: usize) -> Self {
        let total = if bytes == 0 {
            0
        } else {
            u32::try_from(bytes.max(1 << 20) / UNIT).unwrap_or(u32::MAX)
        };
        Self {
            permits: Arc::new(Semaphore::new(total as usize)),
            total,
        }
    }

    /// Takes `bytes` of the budget, waiting up to [`WAIT`] for it.
    pub async fn take(&self, bytes: usize) -> Result<Share, ApiError> {
        let mut share = self.empty_share();
        share.cover(bytes.max(1)).await?;
        Ok(share)
    }

    /// A share of nothing yet, grown by [`Share::cover`] when the request inflates or decodes
    /// something (a Connect query's plain body never waits for the budget).
    pub fn empty_share(&self) -> Share {
        Share {
            permit: None,
            budget: self.clone(),
        }
    }

    /// Permits of `bytes`, at least one and at most the whole budget.
    fn permits_for(&self, bytes: usize) -> u32 {
        u32::try_from(bytes.div_ceil(UNIT))
            .unwrap_or(u32::MAX)
            .clamp(1, self.total)
    }

    /// Bytes of the budget in use now.
    pub fn in_use(&self) -> usize {
        (self.total as usize - self.permits.available_permits()) * UNIT
    }
}

/// Opening a debug file reserves what its compressed sections inflate to (ADR 0013).
#[async_trait::async_trait]
impl kiln_symbolize::budget::InflateBudget for DecodeBudget {
    async fn reserve(&self, bytes: u64) -> Result<kiln_symbolize::budget::Reservation, String> {
        let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
        // Its own words: the caller may be a query, which stores nothing either way.
        self.take(bytes)
            .await
            .map(|share| Box::new(share) as kiln_symbolize::budget::Reservation)
            .map_err(|_| {
                "the server is decoding as much as it may at once \
                 (--max-inflight-decode-bytes); retry later"
                    .to_owned()
            })
    }
}

impl Share {
    /// Bytes of the budget this share holds.
    pub fn bytes(&self) -> usize {
        self.permit.as_ref().map_or(0, |p| p.num_permits() * UNIT)
    }

    /// Grows the share to hold `bytes` in all (at most the whole budget), waiting up to
    /// [`WAIT`] for the difference; a share holding that much already is left as it is.
    pub async fn cover(&mut self, bytes: usize) -> Result<(), ApiError> {
        let budget = &self.budget;
        if budget.total == 0 {
            return Ok(());
        }
        let want = budget.permits_for(bytes);
        let held = self.permit.as_ref().map_or(0, |p| p.num_permits() as u32);
        if want <= held {
            return Ok(());
        }
        let more = budget.permits.clone().acquire_many_owned(want - held);
        match tokio::time::timeout(WAIT, more).await {
            Ok(Ok(more)) => {
                match &mut self.permit {
                    Some(p) => p.merge(more),
                    None => self.permit = Some(more),
                }
                Ok(())
            }
            _ => Err(ApiError::new(
                ErrorKind::Unavailable,
                "the server is decoding as much as it may at once; nothing was stored, retry later",
            )
            .retry_after(RETRY_AFTER_SECS)),
        }
    }
}

/// Inflates `data` of `codec` (several gzip members or zstd frames allowed), the share grown
/// before each allocation to cover `held` (the bytes the request holds besides), `data`, the
/// decoder's working set and the output: what a request inflates is in the budget however its
/// stated size lies. The stated size (gzip's trailer, zstd's frame header), true for an honest
/// sender, is one buffer of that size; output past it comes in steps of [`STEP`] bytes, each
/// covered before it is written, joined at the end (covered too). Fails 413 past `limit` bytes
/// of output.
pub async fn inflate(
    share: &mut Share,
    codec: Codec,
    data: &[u8],
    limit: usize,
    held: usize,
) -> Result<Vec<u8>, ApiError> {
    let mut decoder = codec.decoder(data)?;
    let base = held
        .saturating_add(data.len())
        .saturating_add(codec.working_set(limit));
    let too_large = || ApiError::from(kiln_otel::Error::TooLarge { limit });
    let hint = codec
        .size_hint(data)
        .unwrap_or(0)
        .min(limit.saturating_add(1));
    share.cover(base.saturating_add(hint)).await?;
    let mut out = Vec::with_capacity(hint);
    let mut total = read_into(codec, &mut decoder, &mut out, hint)?;
    let mut steps: Vec<Vec<u8>> = Vec::new();
    loop {
        if total > limit {
            return Err(too_large());
        }
        // One byte tells whether there is more, before a step is covered: an honest stream ends
        // here without asking the budget for a step it does not need.
        let mut first = Vec::with_capacity(1);
        if read_into(codec, &mut decoder, &mut first, 1)? == 0 {
            break;
        }
        let holding = out.capacity() + steps.len() * STEP;
        share.cover(base.saturating_add(holding + STEP)).await?;
        let mut step = Vec::with_capacity(STEP);
        step.extend_from_slice(&first);
        total += 1 + read_into(codec, &mut decoder, &mut step, STEP - 1)?;
        steps.push(step);
        // A long inflation leaves the worker to other tasks between steps.
        tokio::task::yield_now().await;
    }
    drop(decoder);
    if steps.is_empty() {
        return Ok(out);
    }
    let holding = out.capacity() + steps.len() * STEP;
    share.cover(base.saturating_add(holding + total)).await?;
    let mut all = Vec::with_capacity(total);
    all.extend_from_slice(&out);
    drop(out);
    for step in steps {
        all.extend_from_slice(&step);
    }
    Ok(all)
}

/// [`inflate`] of a gzip stream.
pub async fn gunzip(
    share: &mut Share,
    data: &[u8],
    limit: usize,
    held: usize,
) -> Result<Vec<u8>, ApiError> {
    inflate(share, Codec::Gzip, data, limit, held).await
}

/// Reads up to `room` more bytes of `decoder` into `buf`; the bytes read.
fn read_into(
    codec: Codec,
    decoder: &mut impl std::io::Read,
    buf: &mut Vec<u8>,
    room: usize,
) -> Result<usize, ApiError> {
    use std::io::Read;
    Ok(decoder
        .take(room as u64)
        .read_to_end(buf)
        .map_err(|e| codec.error(&e))?)
}

/// `data` inflated by [`inflate`] if it starts with gzip's or zstd's magic, or as it is.
pub async fn maybe_inflate(
    share: &mut Share,
    data: bytes::Bytes,
    limit: usize,
    held: usize,
) -> Result<bytes::Bytes, ApiError> {
    let Some(codec) = Codec::of(&data) else {
        return Ok(data);
    };
    Ok(inflate(share, codec, &data, limit, held).await?.into())
}

/// What decoding protobuf `body` may hold ([`kiln_proto::wire::decoded_estimate`], walked on a
/// blocking thread when it is large): its bytes and a slot per field, as many times its size
/// as a body of empty messages is. `schema`: the message type, when the body's is known (the
/// walk then steps over strings and packed runs: [`kiln_proto::wire::check_with_schema`]).
/// Refused (413) past `max_decoded`, before any of it is decoded; the caller grows its share to
/// cover it.
pub async fn decoded_estimate(
    body: bytes::Bytes,
    schema: Option<&'static kiln_proto::wire::Schema>,
    max_decoded: usize,
) -> Result<usize, ApiError> {
    Ok(checked(body, schema, max_decoded).await?.estimate())
}

/// Bodies up to this size are walked on the request's own task rather than a blocking thread:
/// the walk reads an SDK's pprof at ~400 MB/s (so ~0.15 ms at this size), while handing a body
/// to a blocking thread and back wakes a thread and switches to it twice, which `perf` put at
/// ~2 % of the server's CPU on the `small` bench (bodies of ~15 kB).
const INLINE_WALK_BYTES: usize = 64 << 10;

/// [`decoded_estimate`], keeping the walked body ([`kiln_proto::wire::Checked`]) so decoding it
/// later does not walk it again.
pub async fn checked(
    body: bytes::Bytes,
    schema: Option<&'static kiln_proto::wire::Schema>,
    max_decoded: usize,
) -> Result<kiln_proto::wire::Checked, ApiError> {
    let body_len = body.len();
    let walk = move || {
        match schema {
            Some(schema) => kiln_proto::wire::check_with_schema(body, schema),
            None => kiln_proto::wire::check(body),
        }
        .map_err(|e| ApiError::invalid(e.to_string()))
    };
    let checked = crate::app::write::inline_up_to(INLINE_WALK_BYTES, body_len, walk).await?;
    if checked.estimate() > max_decoded {
        return Err(kiln_otel::Error::DecodesTooLarge {
            estimate: checked.estimate(),
            max: max_decoded,
            factor: kiln_otel::pprof::DECODED_FACTOR,
        }
        .into());
    }
    Ok(checked)
}

/// The bytes decoding `body` produces, as far as can be told before doing it, for a caller
/// that inflates it outside [`inflate`] (ad-hoc uploads), which reads the stated size itself.
/// A compressed body states its inflated size (gzip's trailer, zstd's frame header): a hint a
/// sender could falsify, so it is taken as at least the body and at most `limit`, which
/// inflation enforces, plus the decoder's working set.
pub fn decoded_size(body: &[u8], limit: usize) -> usize {
    let n = body.len();
    match Codec::of(body) {
        Some(codec) => {
            let stated = codec.size_hint(body).unwrap_or(n);
            stated.max(n).min(limit.max(n)) + codec.working_set(limit)
        }
        None => n,
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[tokio::test]
    async fn shares_are_bounded_and_given_back() {
        let budget = DecodeBudget::new(4 << 20);
        let a = budget.take(3 << 20).await.unwrap();
        assert_eq!(budget.in_use(), 3 << 20);
        // 2 MiB more does not fit: refused 503 after the wait.
        let err = budget.take(2 << 20).await.unwrap_err();
        assert_eq!(err.kind, ErrorKind::Unavailable);
        assert_eq!(err.retry_after, Some(RETRY_AFTER_SECS));
        // ... but does once the first share is dropped; more than the budget takes all of it.
        drop(a);
        let b = budget.take(2 << 20).await.unwrap();
        drop(b);
        let all = budget.take(1 << 30).await.unwrap();
        assert_eq!(budget.in_use(), 4 << 20);
        drop(all);
        assert_eq!(budget.in_use(), 0);
        // 0 is no bound.
        let none = DecodeBudget::new(0);
        let _s = none.take(1 << 40).await.unwrap();
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(data).unwrap();
        enc.finish().unwrap()
    }

    #[tokio::test]
    async fn inflation_is_covered_however_the_trailer_lies() {
        let budget = DecodeBudget::new(16 << 20);
        let raw = vec![7u8; 6 << 20];
        // Two members: the trailer states the last one's size only (1 MiB of 6).
        let mut two = gzip(&raw[..5 << 20]);
        two.extend(gzip(&raw[5 << 20..]));
        assert_eq!(decoded_size(&two, 64 << 20), 1 << 20);
        let mut share = budget.take(decoded_size(&two, 64 << 20)).await.unwrap();
        let out = gunzip(&mut share, &two, 64 << 20, 0).await.unwrap();
        assert_eq!(out, raw);
        assert!(
            share.bytes() >= out.len(),
            "{} < {}",
            share.bytes(),
            out.len()
        );
        assert_eq!(budget.in_use(), share.bytes());
        drop(share);
        // A budget held by others: the liar waits, then is refused 503 (nothing inflated past
        // what it holds), where reserving by its trailer would have let it run.
        let others = budget.take(12 << 20).await.unwrap();
        let mut share = budget.take(decoded_size(&two, 64 << 20)).await.unwrap();
        let err = gunzip(&mut share, &two, 64 << 20, 0).await.unwrap_err();
        assert_eq!(err.kind, ErrorKind::Unavailable);
        drop((others, share));
        // Past the limit: 413.
        let mut share = budget.take(1).await.unwrap();
        let err = gunzip(&mut share, &two, 4 << 20, 0).await.unwrap_err();
        assert_eq!(err.kind, ErrorKind::PayloadTooLarge);
        // An honest trailer: one buffer of its size.
        let one = gzip(&raw);
        let mut share = budget.take(decoded_size(&one, 64 << 20)).await.unwrap();
        let out = gunzip(&mut share, &one, 64 << 20, 0).await.unwrap();
        assert_eq!(out.capacity(), raw.len());
        assert!(share.bytes() >= raw.len());
        // ... and no step past it was asked of the budget.
        assert!(
            share.bytes() < raw.len() + one.len() + STEP,
            "{}",
            share.bytes()
        );
    }

    #[test]
    fn decoded_size_reads_the_gzip_trailer() {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(&vec![7u8; 1 << 20]).unwrap();
        let gz = enc.finish().unwrap();
        assert!(gz.len() < 8192);
        assert_eq!(decoded_size(&gz, 64 << 20), 1 << 20);
        assert_eq!(decoded_size(&gz, 1000), 1000.max(gz.len()));
        assert_eq!(decoded_size(b"plain body", 4), 10);
    }

    #[tokio::test]
    async fn zstd_is_inflated_in_the_budget_as_gzip_is() {
        let budget = DecodeBudget::new(64 << 20);
        let raw: Vec<u8> = (0..6u32 << 20).map(|i| (i % 251) as u8).collect();
        // Two frames: the first frame's header states its size only (1 MiB of 6).
        let mut two = zstd::bulk::compress(&raw[..1 << 20], 3).unwrap();
        two.extend(zstd::stream::encode_all(&raw[1 << 20..], 3).unwrap());
        let stated = decoded_size(&two, 64 << 20);
        assert_eq!(stated, (1 << 20) + Codec::Zstd.working_set(64 << 20));
        let mut share = budget.take(stated).await.unwrap();
        let bytes = bytes::Bytes::from(two.clone());
        let out = maybe_inflate(&mut share, bytes, 64 << 20, 0).await.unwrap();
        assert_eq!(&out[..], &raw[..]);
        assert!(share.bytes() >= out.len() + Codec::Zstd.working_set(64 << 20));
        drop(share);
        // A bomb: 64 MiB of zeros in a few kB, refused 413 at the limit.
        let bomb = zstd::stream::encode_all(&vec![0u8; 64 << 20][..], 3).unwrap();
        assert!(bomb.len() < 64 << 10);
        let mut share = budget.take(1).await.unwrap();
        let err = inflate(&mut share, Codec::Zstd, &bomb, 4 << 20, 0)
            .await
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::PayloadTooLarge);
        assert!(share.bytes() < 16 << 20, "{}", share.bytes());
        // Corrupt: 400, naming the codec.
        let mut share = budget.take(1).await.unwrap();
        let err = inflate(&mut share, Codec::Zstd, &two[..two.len() / 3], 64 << 20, 0)
            .await
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidInput, "{err:?}");
        assert!(err.message.contains("zstd"), "{}", err.message);
    }
}
