//! Span, trace and profile ids as hex: how pprof labels, query parameters, exemplars and
//! OTLP/JSON write them.
//!
//! A span id is 8 bytes read as a little-endian u64 (as Pyroscope does), 0 meaning none; a trace
//! id is 16 bytes, all zeros meaning none.

/// Parses a span id as Pyroscope does: 16 hex digits, read as a little-endian u64; anything else is 0.
pub fn parse_span_id(s: &str) -> u64 {
    let mut bytes = [0u8; 8];
    match hex_into(s, &mut bytes) {
        Some(()) => u64::from_le_bytes(bytes),
        None => 0,
    }
}

/// Formats a span id as 16 hex digits (the inverse of [`parse_span_id`]).
pub fn format_span_id(id: u64) -> String {
    to_hex(&id.to_le_bytes())
}

/// Parses a 32-hex-digit trace id; all zeros is no trace id.
pub fn parse_trace_id(s: &str) -> Option<[u8; 16]> {
    let mut bytes = [0u8; 16];
    hex_into(s, &mut bytes)?;
    (bytes != [0u8; 16]).then_some(bytes)
}

/// Formats a trace id as 32 hex digits (the inverse of [`parse_trace_id`]).
pub fn format_trace_id(id: &[u8; 16]) -> String {
    to_hex(id)
}

/// Lowercase hex of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 15) as usize] as char);
    }
    s
}

/// The bytes of an even number of hex digits (either case); `None` for anything else.
pub fn hex_decode(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let mut out = vec![0u8; s.len() / 2];
    hex_into(s, &mut out)?;
    Some(out)
}

/// Fills `out` from exactly `2 * out.len()` hex digits.
fn hex_into(s: &str, out: &mut [u8]) -> Option<()> {
    let digits = s.as_bytes();
    if digits.len() != 2 * out.len() {
        return None;
    }
    for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        let hi = (pair[0] as char).to_digit(16)?;
        let lo = (pair[1] as char).to_digit(16)?;
        *byte = (hi * 16 + lo) as u8;
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_ids_round_trip() {
        assert_eq!(parse_span_id("0123456789abcdef"), 0xefcdab8967452301);
        assert_eq!(
            format_span_id(parse_span_id("0123456789abcdef")),
            "0123456789abcdef"
        );
        assert_eq!(parse_span_id("xyz"), 0);
        assert_eq!(parse_span_id("0123456789abcdeg"), 0);
        assert!(parse_trace_id("00000000000000000000000000000000").is_none());
    }

    #[test]
    fn trace_ids_round_trip() {
        let t = parse_trace_id("000102030405060708090A0B0C0D0E0F").unwrap();
        assert_eq!(t[15], 15);
        assert_eq!(format_trace_id(&t), "000102030405060708090a0b0c0d0e0f");
        assert!(parse_trace_id("000102030405060708090a0b0c0d0e").is_none());
        assert!(parse_trace_id("000102030405060708090a0b0c0d0e0f00").is_none());
    }

    #[test]
    fn hex_decode_is_strict() {
        assert_eq!(hex_decode("00ff10"), Some(vec![0, 255, 16]));
        assert_eq!(hex_decode(""), Some(vec![]));
        assert_eq!(hex_decode("0"), None, "odd length");
        assert_eq!(hex_decode("+f+f"), None, "a sign is not a digit");
        assert_eq!(hex_decode("zz"), None);
        assert_eq!(hex_decode("é1"), None, "multi-byte characters");
        assert_eq!(parse_span_id("éééééééé"), 0);
    }
}
