//! An Arrow IPC stream from a client is checked before arrow reads it. arrow trusts what a
//! stream says of itself: a buffer's offset and length inside its message body (it slices,
//! and asserts, past the end), and a compressed buffer's uncompressed size (it allocates that
//! much up front, and its LZ4 reader inflates past it to the end of the frame). One forged
//! length aborted the process for want of 478 PB (the fuzz entry `parca_arrow` found it).
//!
//! [`check`] walks the stream's messages: every buffer must lie inside its body, and the
//! uncompressed sizes of a stream's buffers together must stay within the caller's limit. An
//! LZ4 buffer is inflated here, bounded, to prove its size (ZSTD's decoder stops at the size it
//! is given, so its declared size is enough); that doubles the LZ4 decompression work, which
//! is small beside the rest of decoding.

use std::io::Read;

use arrow::ipc::{CompressionType, MessageHeader, RecordBatch as IpcBatch, root_as_message};

use crate::{Error, Result};

/// The uncompressed length prefix that marks a buffer stored uncompressed.
const NOT_COMPRESSED: i64 = -1;

fn invalid(why: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("invalid Arrow IPC stream: {why}"))
}

/// Checks every message of an IPC stream; `max_bytes` bounds the buffers' total size once
/// decompressed.
pub fn check(stream: &[u8], max_bytes: usize) -> Result<()> {
    let mut budget = max_bytes;
    let mut pos = 0usize;
    let read_i32 = |at: usize| -> Option<i32> {
        stream
            .get(at..at + 4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    loop {
        // A message: [0xFFFFFFFF] metadata length, metadata (flatbuffer), body. A length of 0
        // ends the stream; running out of bytes is arrow's error to report.
        let Some(mut len) = read_i32(pos) else {
            return Ok(());
        };
        pos += 4;
        if len == -1 {
            let Some(l) = read_i32(pos) else {
                return Ok(());
            };
            len = l;
            pos += 4;
        }
        if len == 0 {
            return Ok(());
        }
        let len = usize::try_from(len).map_err(|_| invalid("a negative metadata length"))?;
        let meta = stream
            .get(pos..pos.saturating_add(len))
            .ok_or_else(|| invalid("a message's metadata runs past the end"))?;
        pos += len;
        let message = root_as_message(meta).map_err(|e| invalid(format!("bad metadata: {e}")))?;
        let body_len =
            usize::try_from(message.bodyLength()).map_err(|_| invalid("a negative body length"))?;
        let body = stream
            .get(pos..pos.saturating_add(body_len))
            .ok_or_else(|| invalid("a message's body runs past the end"))?;
        pos += body_len;
        let batch = match message.header_type() {
            MessageHeader::RecordBatch => message.header_as_record_batch(),
            MessageHeader::DictionaryBatch => {
                message.header_as_dictionary_batch().and_then(|d| d.data())
            }
            _ => None,
        };
        if let Some(batch) = batch {
            check_batch(&batch, body, &mut budget, max_bytes)?;
        }
    }
}

fn check_batch(batch: &IpcBatch<'_>, body: &[u8], budget: &mut usize, max: usize) -> Result<()> {
    let codec = batch.compression().map(|c| c.codec());
    let over = || Error::TooLarge { limit: max };
    for buffer in batch.buffers().into_iter().flatten() {
        let (offset, length) = (buffer.offset(), buffer.length());
        let data = usize::try_from(offset)
            .ok()
            .zip(usize::try_from(length).ok())
            .and_then(|(o, l)| body.get(o..o.checked_add(l)?))
            .ok_or_else(|| {
                invalid(format!(
                    "a buffer ({offset}, {length}) lies outside its body"
                ))
            })?;
        let Some(codec) = codec else {
            *budget = budget.checked_sub(data.len()).ok_or_else(over)?;
            continue;
        };
        if data.is_empty() {
            continue;
        }
        let (prefix, compressed) = data
            .split_first_chunk::<8>()
            .ok_or_else(|| invalid("a compressed buffer is shorter than its length prefix"))?;
        let declared = i64::from_le_bytes(*prefix);
        if declared == NOT_COMPRESSED {
            *budget = budget.checked_sub(compressed.len()).ok_or_else(over)?;
            continue;
        }
        let declared = usize::try_from(declared)
            .map_err(|_| invalid(format!("an uncompressed length of {declared}")))?;
        *budget = budget.checked_sub(declared).ok_or_else(over)?;
        if codec == CompressionType::LZ4_FRAME {
            let mut decoder =
                lz4_flex::frame::FrameDecoder::new(compressed).take(declared as u64 + 1);
            let inflated = std::io::copy(&mut decoder, &mut std::io::sink())
                .map_err(|e| invalid(format!("an LZ4 buffer does not inflate: {e}")))?;
            if inflated != declared as u64 {
                return Err(invalid(format!(
                    "an LZ4 buffer declares {declared} bytes but holds {}",
                    if inflated > declared as u64 {
                        "more".to_owned()
                    } else {
                        inflated.to_string()
                    }
                )));
            }
        }
    }
    Ok(())
}
