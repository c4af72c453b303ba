//! Base64, standard and URL-safe alphabets (RFC 4648), as OTLP/JSON bytes, HTTP Basic
//! credentials and JWT segments need it.

const STD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn encode_with(data: &[u8], table: &[u8; 64], pad: bool) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(table[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else if pad {
                out.push('=');
            }
        }
    }
    out
}

/// Standard alphabet, padded.
pub fn encode(data: &[u8]) -> String {
    encode_with(data, STD, true)
}

/// URL-safe alphabet, unpadded (JWT segments).
pub fn encode_url(data: &[u8]) -> String {
    encode_with(data, URL, false)
}

/// Decodes either alphabet, padded or not; `None` on any other character.
pub fn decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut buf, mut bits) = (0u32, 0);
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            b'=' => break,
            _ => return None,
        };
        buf = (buf << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buf >> bits) as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn known_values() {
        assert_eq!(encode(b"alice:s3cret"), "YWxpY2U6czNjcmV0");
        assert_eq!(encode(b"u:p"), "dTpw");
        assert_eq!(encode_url(&[0xfb, 0xff]), "-_8");
        assert_eq!(decode("dTpw").unwrap(), b"u:p");
        assert!(decode("a*b").is_none());
    }

    proptest! {
        #[test]
        fn round_trips(data in prop::collection::vec(any::<u8>(), 0..100)) {
            prop_assert_eq!(decode(&encode(&data)).unwrap(), data.clone());
            prop_assert_eq!(decode(&encode_url(&data)).unwrap(), data);
        }
    }
}
