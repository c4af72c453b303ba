//! Bounded decompression: a small body cannot inflate past the configured limit.
//!
//! Two codecs, told apart by their magic bytes: gzip (RFC 1952, several members allowed) and
//! zstd (RFC 8878, several frames allowed). A zstd decoder refuses a window past
//! [`ZSTD_WINDOW_LOG_MAX`], so what it holds besides its output is bounded too.

use std::io::Read;

use crate::{Error, Result};

/// The gzip magic bytes.
pub const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// A zstd frame's magic number, as it is on the wire (little endian 0xFD2FB528).
pub const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// The largest zstd window a decoder accepts: 2^23 bytes (8 MiB), what RFC 8878 asks an HTTP
/// decoder to support. A frame that wants more is refused rather than given the memory.
pub const ZSTD_WINDOW_LOG_MAX: u32 = 23;

/// A compression format Kiln inflates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Gzip,
    Zstd,
}

impl Codec {
    /// The codec `data` starts with the magic of, if any.
    pub fn of(data: &[u8]) -> Option<Self> {
        if data.starts_with(&GZIP_MAGIC) {
            Some(Self::Gzip)
        } else if data.starts_with(&ZSTD_MAGIC) {
            Some(Self::Zstd)
        } else {
            None
        }
    }

    /// The inflated size `data` states: gzip's trailer (the last member's size modulo 4 GiB),
    /// or the first zstd frame's content size. A hint only: a sender can write anything there.
    pub fn size_hint(self, data: &[u8]) -> Option<usize> {
        match self {
            Self::Gzip => gzip_size_hint(data),
            Self::Zstd => zstd::zstd_safe::get_frame_content_size(data)
                .ok()
                .flatten()
                .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        }
    }

    /// The bytes a decoder may hold besides its output and its fixed state: zstd's window (what
    /// its frames may ask for, bounded by [`ZSTD_WINDOW_LOG_MAX`] and by `limit`). Gzip's window
    /// is fixed at 32 KiB, part of the decoder's state.
    pub fn working_set(self, limit: usize) -> usize {
        match self {
            Self::Gzip => 0,
            Self::Zstd => (1usize << ZSTD_WINDOW_LOG_MAX).min(limit.max(1 << 10)),
        }
    }

    /// A reader of `data` inflated (all its members or frames).
    pub fn decoder<'a>(self, data: &'a [u8]) -> Result<Box<dyn Read + Send + 'a>> {
        Ok(match self {
            Self::Gzip => Box::new(flate2::read::MultiGzDecoder::new(data)),
            Self::Zstd => {
                let mut decoder =
                    zstd::stream::read::Decoder::with_buffer(data).map_err(|e| self.error(&e))?;
                decoder
                    .window_log_max(ZSTD_WINDOW_LOG_MAX)
                    .map_err(|e| self.error(&e))?;
                Box::new(decoder)
            }
        })
    }

    /// The error of a corrupt or truncated stream of this codec.
    pub fn error(self, e: &std::io::Error) -> Error {
        match self {
            Self::Gzip => Error::Gzip(e.to_string()),
            Self::Zstd => Error::Zstd(e.to_string()),
        }
    }
}

/// True when `data` starts with the gzip magic.
pub fn is_gzip(data: &[u8]) -> bool {
    Codec::of(data) == Some(Codec::Gzip)
}

/// True when `data` starts with the magic of a codec Kiln inflates (gzip or zstd).
pub fn is_compressed(data: &[u8]) -> bool {
    Codec::of(data).is_some()
}

/// The inflated size a gzip stream's trailer states (ISIZE: the last member's size modulo
/// 4 GiB); a hint only, as a sender can write anything there. `None` when `data` is not gzip.
pub fn gzip_size_hint(data: &[u8]) -> Option<usize> {
    let n = data.len();
    (is_gzip(data) && n >= 18)
        .then(|| u32::from_le_bytes(data[n - 4..].try_into().expect("four bytes")) as usize)
}

/// Inflates `data` of `codec`, failing with [`Error::TooLarge`] as soon as the output passes
/// `limit` bytes. Memory stays bounded by `limit` (and the codec's working set) whatever the
/// input claims.
pub fn inflate_limited(codec: Codec, data: &[u8], limit: usize) -> Result<Vec<u8>> {
    let decoder = codec.decoder(data)?;
    // The stated size sizes the output, so it is not grown by doubling (each step a copy, and
    // the freed halves resident until the allocator purges them); it is only a hint.
    let hint = codec.size_hint(data).unwrap_or(0);
    let mut out = Vec::with_capacity(hint.max(data.len()).min(limit.saturating_add(1)));
    let read = decoder
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| codec.error(&e))?;
    if read > limit {
        return Err(Error::TooLarge { limit });
    }
    Ok(out)
}

/// Inflates a gzip stream (several members allowed): [`inflate_limited`] for gzip.
pub fn gunzip_limited(data: &[u8], limit: usize) -> Result<Vec<u8>> {
    inflate_limited(Codec::Gzip, data, limit)
}

/// Returns `data` inflated if it is gzip or zstd, or as it is otherwise, within `limit` bytes
/// either way.
pub fn maybe_inflate(data: &[u8], limit: usize) -> Result<std::borrow::Cow<'_, [u8]>> {
    if let Some(codec) = Codec::of(data) {
        return inflate_limited(codec, data, limit).map(std::borrow::Cow::Owned);
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
        assert_eq!(&*maybe_inflate(b"plain", 5).unwrap(), b"plain");
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

    fn zstd(data: &[u8], level: i32) -> Vec<u8> {
        zstd::stream::encode_all(data, level).unwrap()
    }

    #[test]
    fn zstd_inflates_within_limit_and_frames_join() {
        // One-shot compression states the content size (as Go's EncodeAll does); a stream
        // encoder's frame does not.
        let mut body = zstd::bulk::compress(b"hello ", 3).unwrap();
        body.extend(zstd(b"world", 19));
        assert_eq!(Codec::of(&body), Some(Codec::Zstd));
        assert_eq!(Codec::Zstd.size_hint(&body), Some(6));
        assert_eq!(&*maybe_inflate(&body, 11).unwrap(), b"hello world");
    }

    #[test]
    fn zstd_bomb_is_refused() {
        let body = zstd(&vec![0u8; 64 << 20], 3);
        assert!(body.len() < 64 << 10, "{}", body.len());
        assert!(matches!(
            maybe_inflate(&body, 1 << 20),
            Err(Error::TooLarge { limit }) if limit == 1 << 20
        ));
    }

    #[test]
    fn a_zstd_window_past_the_cap_is_refused() {
        // A frame compressed with a 128 MiB window (long-distance matching) over enough input
        // to need it states that window; the decoder refuses it instead of allocating it.
        let data: Vec<u8> = (0..32u32 << 20)
            .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
            .collect();
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
        enc.long_distance_matching(true).unwrap();
        enc.window_log(27).unwrap();
        std::io::Write::write_all(&mut enc, &data).unwrap();
        let body = enc.finish().unwrap();
        let err = inflate_limited(Codec::Zstd, &body, 64 << 20).unwrap_err();
        assert!(matches!(err, Error::Zstd(_)), "{err}");
    }

    #[test]
    fn corrupt_zstd_is_an_error() {
        let body = zstd(&[7u8; 4096], 3);
        let err = maybe_inflate(&body[..body.len() / 2], 1 << 20).unwrap_err();
        assert!(matches!(err, Error::Zstd(_)), "{err}");
        let mut bad = ZSTD_MAGIC.to_vec();
        bad.extend([0xff; 16]);
        assert!(matches!(maybe_inflate(&bad, 1 << 20), Err(Error::Zstd(_))));
    }
}
