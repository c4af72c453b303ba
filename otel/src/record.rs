//! The gateway's write-ahead log records (ADR 0018): a write as the request brought it, so that after a crash
//! it is decoded and normalized again by the same code, with the same time and limits, rather
//! than encoded a second time as normalized profiles (which cost 13.6–19.3 % of the server's
//! CPU where measured: docs/performance.md, "Write-ahead log records").
//!
//! A record holds the body the decoder was given (a pprof's bytes, gzipped or not; an OTLP
//! export request as protobuf or JSON) with what decoding it took from the request: the
//! tenant, the normalize limits in force, the request's time and, for pprof, the metadata its
//! normalization reads (labels from the app name or push series, `from`/`until`, sample-type
//! display names, the .NET repair):
//!
//! ```text
//!  b"KREC" | u8 version (1) | u8 kind (1 pprof parts, 2 OTLP) | str tenant
//!  | u64 × 7 limits (stack depth, samples, sample label names, label names per series,
//!    label name length, label value length, decompressed bytes)
//!  pprof:  u32 parts, each: labels | i64 time | i64 duration | display names | u8 .NET | bytes
//!  OTLP:   i64 now | u8 JSON | bytes
//!  str, bytes: u32 length | the bytes; labels, display names: u32 count | (str, str) each
//! ```
//!
//! All integers little-endian. Formats the gateway does not log (JFR, speedscope, folded text,
//! Parca's writes, the self-profile) are written without a record and acknowledged once their
//! segment is registered. Records are read back from the log's files, which a reader trusts
//! only as far as their CRCs: [`Record::decode`] takes any bytes (fuzz entry `record`).

use std::collections::HashMap;

use bytes::Bytes;

use crate::labels::LabelLimits;
use crate::model::{Labels, NormalizedProfile};
use crate::normalize::{IngestMeta, NormalizeLimits, normalize_pprof};
use crate::{otlp, otlp_json, pprof};

const MAGIC: &[u8; 4] = b"KREC";
const VERSION: u8 = 1;
const KIND_PPROF: u8 = 1;
const KIND_OTLP: u8 = 2;

/// A write's request, as its decoder took it.
#[derive(Debug, Clone)]
pub struct Record {
    pub limits: NormalizeLimits,
    /// The tenant's decompressed-size limit the body was decoded under.
    pub max_decompressed_bytes: usize,
    pub body: RecordBody,
}

#[derive(Debug, Clone)]
pub enum RecordBody {
    /// pprof profiles (`/ingest`, `push.v1`), each normalized with its own metadata.
    Pprof(Vec<PprofPart>),
    /// An OTLP export request, converted at `now_nanos`.
    Otlp {
        body: Bytes,
        json: bool,
        now_nanos: i64,
    },
}

/// One pprof profile of a record.
#[derive(Debug, Clone)]
pub struct PprofPart {
    pub meta: IngestMeta,
    /// Repaired as the .NET profiler's ([`pprof::repair_dotnet`]).
    pub dotnet: bool,
    /// The profile as decoded (gzipped or not).
    pub body: Bytes,
}

impl Record {
    /// The bytes of the bodies it holds.
    pub fn body_bytes(&self) -> usize {
        match &self.body {
            RecordBody::Pprof(parts) => parts.iter().map(|p| p.body.len()).sum(),
            RecordBody::Otlp { body, .. } => body.len(),
        }
    }

    /// The record of `tenant`'s write.
    pub fn encode(&self, tenant: &str) -> Vec<u8> {
        let parts = match &self.body {
            RecordBody::Pprof(parts) => parts.len(),
            RecordBody::Otlp { .. } => 1,
        };
        let mut out = Vec::with_capacity(self.body_bytes() + 64 * parts + 128);
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.push(match self.body {
            RecordBody::Pprof(_) => KIND_PPROF,
            RecordBody::Otlp { .. } => KIND_OTLP,
        });
        put_bytes(&mut out, tenant.as_bytes());
        let l = &self.limits;
        for n in [
            l.max_stack_depth,
            l.max_samples,
            l.max_sample_label_names,
            l.labels.max_label_names_per_series,
            l.labels.max_label_name_length,
            l.labels.max_label_value_length,
            self.max_decompressed_bytes,
        ] {
            out.extend_from_slice(&(n as u64).to_le_bytes());
        }
        match &self.body {
            RecordBody::Pprof(parts) => {
                out.extend_from_slice(&(parts.len() as u32).to_le_bytes());
                for p in parts {
                    put_pairs(&mut out, p.meta.labels.iter());
                    out.extend_from_slice(&p.meta.time_nanos.to_le_bytes());
                    out.extend_from_slice(&p.meta.duration_nanos.to_le_bytes());
                    let mut names: Vec<_> = p.meta.display_names.iter().collect();
                    names.sort();
                    put_pairs(&mut out, names.into_iter().map(|(k, v)| (&**k, &**v)));
                    out.push(u8::from(p.dotnet));
                    put_bytes(&mut out, &p.body);
                }
            }
            RecordBody::Otlp {
                body,
                json,
                now_nanos,
            } => {
                out.extend_from_slice(&now_nanos.to_le_bytes());
                out.push(u8::from(*json));
                put_bytes(&mut out, body);
            }
        }
        out
    }

    /// Reads a record back: the tenant and the record. Any bytes: a record that does not read
    /// is an error, never a panic.
    pub fn decode(bytes: &[u8]) -> Result<(String, Record), String> {
        let mut r = Reader(bytes);
        if r.take(4)? != MAGIC {
            return Err("not a record (bad magic)".into());
        }
        let version = r.u8()?;
        if version != VERSION {
            return Err(format!("record version {version} is not known"));
        }
        let kind = r.u8()?;
        let tenant = r.str()?;
        let mut n = [0usize; 7];
        for v in &mut n {
            *v = usize::try_from(r.u64()?).map_err(|_| "a limit is out of range")?;
        }
        let limits = NormalizeLimits {
            max_stack_depth: n[0],
            max_samples: n[1],
            max_sample_label_names: n[2],
            labels: LabelLimits {
                max_label_names_per_series: n[3],
                max_label_name_length: n[4],
                max_label_value_length: n[5],
            },
        };
        let body = match kind {
            KIND_PPROF => {
                let count = r.u32()?;
                let mut parts = Vec::new();
                for _ in 0..count {
                    let mut labels = Labels::default();
                    for (k, v) in r.pairs()? {
                        labels.set(k, v);
                    }
                    let time_nanos = r.i64()?;
                    let duration_nanos = r.i64()?;
                    let display_names: HashMap<String, String> = r.pairs()?.into_iter().collect();
                    let dotnet = r.u8()? != 0;
                    let body = Bytes::copy_from_slice(r.bytes()?);
                    parts.push(PprofPart {
                        meta: IngestMeta {
                            labels,
                            time_nanos,
                            duration_nanos,
                            display_names,
                        },
                        dotnet,
                        body,
                    });
                }
                RecordBody::Pprof(parts)
            }
            KIND_OTLP => {
                let now_nanos = r.i64()?;
                let json = r.u8()? != 0;
                let body = Bytes::copy_from_slice(r.bytes()?);
                RecordBody::Otlp {
                    body,
                    json,
                    now_nanos,
                }
            }
            other => return Err(format!("record kind {other} is not known")),
        };
        if !r.0.is_empty() {
            return Err(format!("{} bytes after the record", r.0.len()));
        }
        Ok((
            tenant,
            Record {
                limits,
                max_decompressed_bytes: n[6],
                body,
            },
        ))
    }

    /// Decodes and normalizes the record's profiles as the request's decoder did.
    pub fn profiles(&self) -> Result<Vec<NormalizedProfile>, String> {
        let mut profiles = match &self.body {
            RecordBody::Pprof(parts) => parts
                .iter()
                .map(|p| {
                    let (mut profile, _) =
                        pprof::decode_sized(p.body.clone(), self.max_decompressed_bytes)
                            .map_err(|e| e.to_string())?;
                    if p.dotnet {
                        pprof::repair_dotnet(&mut profile);
                    }
                    normalize_pprof(&profile, &p.meta, &self.limits).map_err(|e| e.to_string())
                })
                .collect::<Result<Vec<_>, String>>()?,
            RecordBody::Otlp {
                body,
                json,
                now_nanos,
            } => {
                let req = if *json {
                    otlp_json::parse_request(body).map_err(|e| e.to_string())?
                } else {
                    // As the gateway reads it: an older layout rewritten first.
                    let (_, body) = otlp::layout::to_current(body).map_err(|e| e.to_string())?;
                    kiln_proto::wire::decode(&body[..]).map_err(|e| e.to_string())?
                };
                let converted =
                    otlp::convert(&req, *now_nanos, &self.limits).map_err(|e| e.to_string())?;
                vec![converted.profile]
            }
        };
        for p in &mut profiles {
            p.inject_service_version();
        }
        Ok(profiles)
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

fn put_pairs<'a>(out: &mut Vec<u8>, pairs: impl Iterator<Item = (&'a str, &'a str)>) {
    let at = out.len();
    out.extend_from_slice(&0u32.to_le_bytes());
    let mut count = 0u32;
    for (k, v) in pairs {
        put_bytes(out, k.as_bytes());
        put_bytes(out, v.as_bytes());
        count += 1;
    }
    out[at..at + 4].copy_from_slice(&count.to_le_bytes());
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("the record ends early".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn i64(&mut self) -> Result<i64, String> {
        Ok(self.u64()? as i64)
    }

    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    fn str(&mut self) -> Result<String, String> {
        std::str::from_utf8(self.bytes()?)
            .map(str::to_owned)
            .map_err(|_| "a string is not UTF-8".into())
    }

    /// `count` pairs; the count is checked against what is left (each pair takes 8 bytes at
    /// least) before anything is read.
    fn pairs(&mut self) -> Result<Vec<(String, String)>, String> {
        let count = self.u32()? as usize;
        if count > self.0.len() / 8 {
            return Err("more pairs than the record holds".into());
        }
        (0..count).map(|_| Ok((self.str()?, self.str()?))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> NormalizeLimits {
        NormalizeLimits::default()
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let mut meta = IngestMeta {
            time_nanos: 1_700_000_000_000_000_000,
            duration_nanos: 10_000_000_000,
            ..IngestMeta::default()
        };
        meta.labels.set("service_name".into(), "api".into());
        meta.labels.set("pod".into(), "p-1".into());
        meta.display_names.insert("samples".into(), "cpu".into());
        let record = Record {
            limits: limits(),
            max_decompressed_bytes: 1 << 20,
            body: RecordBody::Pprof(vec![
                PprofPart {
                    meta: meta.clone(),
                    dotnet: true,
                    body: Bytes::from_static(b"\x1f\x8b..."),
                },
                PprofPart {
                    meta,
                    dotnet: false,
                    body: Bytes::new(),
                },
            ]),
        };
        let bytes = record.encode("tenant-a");
        let (tenant, back) = Record::decode(&bytes).unwrap();
        assert_eq!(tenant, "tenant-a");
        assert_eq!(back.encode("tenant-a"), bytes);
        assert_eq!(back.max_decompressed_bytes, 1 << 20);
        let RecordBody::Pprof(parts) = &back.body else {
            panic!("{back:?}")
        };
        assert_eq!(parts.len(), 2);
        assert!(parts[0].dotnet && !parts[1].dotnet);
        assert_eq!(parts[0].meta.labels.get("pod"), Some("p-1"));
        assert_eq!(parts[0].meta.display_names["samples"], "cpu");
        assert_eq!(&parts[0].body[..], b"\x1f\x8b...");

        let otlp = Record {
            limits: limits(),
            max_decompressed_bytes: 7,
            body: RecordBody::Otlp {
                body: Bytes::from_static(b"{}"),
                json: true,
                now_nanos: 42,
            },
        };
        let bytes = otlp.encode("b");
        let (tenant, back) = Record::decode(&bytes).unwrap();
        assert_eq!(tenant, "b");
        assert_eq!(back.encode("b"), bytes);
    }

    #[test]
    fn a_damaged_record_is_an_error() {
        let record = Record {
            limits: limits(),
            max_decompressed_bytes: 1 << 20,
            body: RecordBody::Otlp {
                body: Bytes::from_static(b"body"),
                json: false,
                now_nanos: 1,
            },
        };
        let bytes = record.encode("t");
        // Every truncation, and a byte after the end.
        for n in 0..bytes.len() {
            assert!(Record::decode(&bytes[..n]).is_err(), "cut at {n}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Record::decode(&longer).is_err());
        let mut kind = bytes.clone();
        kind[5] = 9;
        assert!(Record::decode(&kind).unwrap_err().contains("kind 9"));
        // A count of pairs larger than the record is refused before anything is allocated.
        let mut pprof = Record {
            body: RecordBody::Pprof(vec![PprofPart {
                meta: IngestMeta::default(),
                dotnet: false,
                body: Bytes::new(),
            }]),
            ..record
        }
        .encode("t");
        let at = 4 + 1 + 1 + 4 + 1 + 7 * 8 + 4;
        pprof[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Record::decode(&pprof).unwrap_err().contains("pairs"));
    }
}
