//! Bounded decompression: a small body cannot inflate past the configured limit.

use std::io::Read;

use crate::{Error, Result};

/// The gzip magic bytes.
pub const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// True when `data` starts with the gzip magic.
pub fn is_gzip(data: &[u8]) -> bool {
    data.len() >= 2 && data[..2] == GZIP_MAGIC
}

/// The inflated size a gzip stream's trailer states (ISIZE: the last member's size modulo
/// 4 GiB); a hint only, as a sender can write anything there. `None` when `data` is not gzip.
pub fn gzip_size_hint(data: &[u8]) -> Option<usize> {
    let n = data.len();
    (is_gzip(data) && n >= 18)
        .then(|| u32::from_le_bytes(data[n - 4..].try_into().expect("four bytes")) as usize)
}

/// Inflates a gzip stream (several members allowed), failing with [`Error::TooLarge`] as soon as the
/// output passes `limit` bytes. Memory stays bounded by `limit` whatever the input claims.
pub fn gunzip_limited(data: &[u8], limit: usize) -> Result<Vec<u8>> {
    let decoder = flate2::read::MultiGzDecoder::new(data);
    // The trailer's ISIZE (the last member's size mod 4 GiB) sizes the output, so it is not
    // grown by doubling (each step a copy, and the freed halves resident until the allocator
    // purges them); it is only a hint, as a sender can write anything there.
    let hint = gzip_size_hint(data).unwrap_or(0);
    let mut out = Vec::with_capacity(hint.max(data.len()).min(limit.saturating_add(1)));
    let read = decoder
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| Error::Gzip(e.to_string()))?;
    if read > limit {
        return Err(Error::TooLarge { limit });
    }
    Ok(out)
}

/// Returns `data` inflated if it is gzip, or as it is otherwise, within `limit` bytes either way.
pub fn maybe_gunzip(data: &[u8], limit: usize) -> Result<std::borrow::Cow<'_, [u8]>> {
    if is_gzip(data) {
        return gunzip_limited(data, limit).map(std::borrow::Cow::Owned);
    }
    if data.len() > limit {
        return Err(Error::TooLarge { limit });
    }
    Ok(std::borrow::Cow::Borrowed(data))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(data).unwrap();
        enc.finish().unwrap()
    }

    #[test]
    fn inflates_within_limit() {
        let body = gzip(b"hello world");
        assert_eq!(gunzip_limited(&body, 11).unwrap(), b"hello world");
        assert_eq!(&*maybe_gunzip(b"plain", 5).unwrap(), b"plain");
    }

    #[test]
    fn bomb_is_refused() {
        let body = gzip(&vec![0u8; 10 << 20]);
        assert!(body.len() < 64 << 10);
        assert!(matches!(
            gunzip_limited(&body, 1 << 20),
            Err(Error::TooLarge { limit }) if limit == 1 << 20
        ));
    }

    #[test]
    fn truncated_gzip_is_an_error() {
        let body = gzip(&[7u8; 4096]);
        let err = gunzip_limited(&body[..body.len() / 2], 1 << 20).unwrap_err();
        assert!(matches!(err, Error::Gzip(_)), "{err}");
    }
}
