//! pprof decoding: bounded decompression, then protobuf.

use kiln_proto::google::v1::Profile;
use prost::Message;

use crate::compress::maybe_gunzip;
use crate::{Error, Result};

/// Decodes a pprof profile, gzip-compressed or plain, refusing to inflate past `max_bytes`.
pub fn decode(data: &[u8], max_bytes: usize) -> Result<Profile> {
    decode_sized(data, max_bytes).map(|(p, _)| p)
}

/// Like [`decode`], also returning the decompressed size.
pub fn decode_sized(data: &[u8], max_bytes: usize) -> Result<(Profile, usize)> {
    if data.is_empty() {
        return Err(Error::Invalid("the profile is empty".into()));
    }
    let raw = maybe_gunzip(data, max_bytes)?;
    let profile = Profile::decode(&*raw).map_err(|e| Error::Protobuf(e.to_string()))?;
    Ok((profile, raw.len()))
}

/// Encodes a profile as plain protobuf.
pub fn encode(profile: &Profile) -> Vec<u8> {
    profile.encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_truncated_are_errors() {
        assert!(matches!(decode(b"", 1024), Err(Error::Invalid(_))));
        let mut p = Profile {
            string_table: vec!["".into(), "cpu".into(), "nanoseconds".into()],
            ..Default::default()
        };
        p.sample_type
            .push(kiln_proto::google::v1::ValueType { r#type: 1, unit: 2 });
        let bytes = encode(&p);
        assert_eq!(decode(&bytes, 1024).unwrap(), p);
        let err = decode(&bytes[..bytes.len() - 3], 1024).unwrap_err();
        assert!(matches!(err, Error::Protobuf(_)), "{err}");
    }
}
