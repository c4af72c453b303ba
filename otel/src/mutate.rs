//! Seeded mutations of valid inputs, the kinds that found Kiln's crashes: bit flips, truncation,
//! repeated ranges, corrupted and over-long varints, nested protobuf groups, splices of another
//! seed, gzip wrapping. The same seed gives the same bytes, so a failure is reproduced by its
//! seed. Used by the fuzz-entry test and the e2e mutation run; `cargo fuzz` does its own.

use std::io::Write;

/// SplitMix64: small, fast, and the same on every platform.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }
}

/// What a mutation did, for the failure message.
pub type Mutation = String;

/// One mutation of `input` (a seed), which may splice in a piece of `other` (another seed).
pub fn mutate(rng: &mut Rng, input: &[u8], other: &[u8]) -> (Vec<u8>, Mutation) {
    let kind = rng.below(11);
    mutate_as(rng, input, other, kind)
}

fn mutate_as(rng: &mut Rng, input: &[u8], other: &[u8], kind: usize) -> (Vec<u8>, Mutation) {
    let mut out = input.to_vec();
    let len = out.len();
    let what = match kind {
        0 => {
            let flips = 1 + rng.below(8);
            for _ in 0..flips {
                if len > 0 {
                    let i = rng.below(len);
                    out[i] ^= 1 << rng.below(8);
                }
            }
            format!("bitflip x{flips}")
        }
        1 => {
            const INTERESTING: [u8; 6] = [0x00, 0xff, 0x7f, 0x80, 0x0b, 0x0c];
            let at = rng.below(len.max(1));
            if len > 0 {
                out[at] = INTERESTING[rng.below(INTERESTING.len())];
            }
            format!("byte at {at}")
        }
        2 => {
            let at = rng.below(len.max(1));
            out.truncate(at);
            format!("truncate at {at}")
        }
        3 => {
            let start = rng.below(len.max(1));
            let n = 1 + rng.below(64.min(len - start.min(len)).max(1));
            let times = 2 + rng.below(100);
            let piece: Vec<u8> = out[start.min(len)..(start + n).min(len)].to_vec();
            let mut dup = out[..start.min(len)].to_vec();
            for _ in 0..times {
                dup.extend_from_slice(&piece);
            }
            dup.extend_from_slice(&out[(start + n).min(len)..]);
            out = dup;
            format!("dup {n}x{times} at {start}")
        }
        4 => {
            // A length or varint field made huge, negative or over-long.
            const VARINTS: [&[u8]; 4] = [
                &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
                &[0xff, 0xff, 0xff, 0xff, 0x0f],
                &[
                    0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00,
                ],
                &[0xfe, 0xff, 0xff, 0xff, 0x07],
            ];
            let at = rng.below(len.max(1)).min(len);
            let v = VARINTS[rng.below(VARINTS.len())];
            let end = (at + 1).min(len);
            out.splice(at..end, v.iter().copied());
            format!("varint at {at}")
        }
        5 => {
            // Nested groups of an unknown field, closed or not, at a field boundary or anywhere.
            let n = [10, 100, 1_000, 100_000][rng.below(4)];
            let closed = rng.below(2) == 0;
            let mut groups = [0xa3, 0x06].repeat(n);
            if closed {
                groups.extend([0xa4, 0x06].repeat(n));
            }
            let at = if rng.below(2) == 0 {
                len
            } else {
                rng.below(len.max(1))
            };
            out.splice(at..at, groups);
            format!("groups {n} closed={closed} at {at}")
        }
        6 => {
            // Nested length-delimited messages (field 1) wrapped around the input.
            let n = [8, 40, 1_000][rng.below(3)];
            for _ in 0..n {
                let mut wrapped = vec![0x0a];
                let mut l = out.len() as u64;
                while l >= 0x80 {
                    wrapped.push((l as u8) | 0x80);
                    l >>= 7;
                }
                wrapped.push(l as u8);
                wrapped.extend_from_slice(&out);
                out = wrapped;
            }
            format!("wrapped {n} deep")
        }
        7 => {
            let at = rng.below(len.max(1)).min(len);
            let start = rng.below(other.len().max(1)).min(other.len());
            let n = rng.below(other.len() - start + 1);
            out.splice(at..at, other[start..start + n].iter().copied());
            format!("splice {n} bytes at {at}")
        }
        8 => {
            let start = rng.below(len.max(1)).min(len);
            let n = rng.below(len - start + 1);
            out.drain(start..start + n);
            format!("delete {n} at {start}")
        }
        9 => {
            let at = rng.below(len.max(1)).min(len);
            let n = 1 + rng.below(32);
            let noise: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            out.splice(at..at, noise);
            format!("insert {n} at {at}")
        }
        _ => {
            // gzip of a mutation of another kind, sometimes cut short.
            let inner_kind = rng.below(10);
            let (inner, what) = mutate_as(rng, input, other, inner_kind);
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            let _ = enc.write_all(&inner);
            out = enc.finish().unwrap_or_default();
            if rng.below(2) == 0 {
                let at = rng.below(out.len().max(1));
                out.truncate(at);
                format!("gzip({what}) cut at {at}")
            } else {
                format!("gzip({what})")
            }
        }
    };
    (out, what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_bytes() {
        let seed = b"\x0a\x03abc\x10\x01 some more bytes of a seed";
        for s in 0..200 {
            let a = mutate(&mut Rng::new(s), seed, b"other");
            let b = mutate(&mut Rng::new(s), seed, b"other");
            assert_eq!(a, b);
        }
        // Empty inputs are mutated too, without panicking.
        for s in 0..200 {
            let _ = mutate(&mut Rng::new(s), b"", b"");
        }
    }
}
