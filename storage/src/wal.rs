//! Records of the write-ahead log that ADR 0018 proposes: one write (a tenant and the
//! normalized profiles of one request) as bytes, and back.
//!
//! A record holds what [`crate::writer::Writer::write`] was given, after decoding,
//! normalization and the request's checks, so replaying it needs no ingest path of the gateway
//! and gives the same rows whatever format the request came in. Integers are LEB128 varints
//! (signed ones zigzag-coded), strings a varint length and UTF-8 bytes, lists a varint count and
//! their items:
//!
//! ```text
//!  record   := version (u8, 1) | tenant: str | profiles: list of profile
//!  profile  := functions: list of (name: str, system_name: str, filename: str, start_line: sint)
//!              mappings:  list of (memory_start, memory_limit, file_offset: uint,
//!                                  filename: str, build_id: str, has_functions: u8)
//!              locations: list of (mapping: uint (0 none, else index + 1), address: uint,
//!                                  frame_type: str, lines: list of (function: uint, line: sint))
//!              series:    list of series
//!  series   := labels: list of (name: str, value: str) | profile type: 5 × str
//!              | time_nanos: sint | duration_nanos: sint | samples: list of sample
//!  sample   := stack: list of uint (location indices, leaf first) | value: sint | span_id: uint
//!              | trace: u8 (0 none, 1 then 16 bytes) | timestamp_nanos: sint
//!              | labels: list of (name: str, value: str)
//! ```
//!
//! The log's own framing (length, CRC, sequence number) wraps a record and is not part of it.
//! [`decode_write`] reads bytes from disk, which a torn or damaged file can make anything: it
//! checks every index against its table (a location's mapping and functions, a sample's
//! locations), so what it returns is safe to add to a dataset, and it sizes each list by the
//! bytes left, so a forged count allocates no more than the record could hold.

pub mod log;

use kiln_otel::model::{
    Function, Labels, Line, Location, Mapping, NormalizedProfile, ProfileType, Sample, Series,
    SharedStr, Symbols,
};

use crate::error::DecodeError;

/// Version of the record encoding.
pub const RECORD_VERSION: u8 = 1;

const WHAT: &str = "write-ahead log record";

/// Appends the record of a write of `profiles` by `tenant` to `out`.
pub fn encode_write(tenant: &str, profiles: &[NormalizedProfile], out: &mut Vec<u8>) {
    out.push(RECORD_VERSION);
    put_str(out, tenant);
    put_uint(out, profiles.len() as u64);
    for p in profiles {
        encode_profile(p, out);
    }
}

fn encode_profile(p: &NormalizedProfile, out: &mut Vec<u8>) {
    let s = &p.symbols;
    put_uint(out, s.functions.len() as u64);
    for f in &s.functions {
        put_str(out, &f.name);
        put_str(out, &f.system_name);
        put_str(out, &f.filename);
        put_sint(out, f.start_line);
    }
    put_uint(out, s.mappings.len() as u64);
    for m in &s.mappings {
        put_uint(out, m.memory_start);
        put_uint(out, m.memory_limit);
        put_uint(out, m.file_offset);
        put_str(out, &m.filename);
        put_str(out, &m.build_id);
        out.push(u8::from(m.has_functions));
    }
    put_uint(out, s.locations.len() as u64);
    for l in &s.locations {
        put_uint(out, l.mapping.map_or(0, |m| u64::from(m) + 1));
        put_uint(out, l.address);
        put_str(out, &l.frame_type);
        put_uint(out, l.lines.len() as u64);
        for line in &l.lines {
            put_uint(out, u64::from(line.function));
            put_sint(out, line.line);
        }
    }
    put_uint(out, p.series.len() as u64);
    for series in &p.series {
        put_pairs(out, series.labels.len(), series.labels.iter());
        let t = &series.profile_type;
        for part in [
            &t.name,
            &t.sample_type,
            &t.sample_unit,
            &t.period_type,
            &t.period_unit,
        ] {
            put_str(out, part);
        }
        put_sint(out, series.time_nanos);
        put_sint(out, series.duration_nanos);
        put_uint(out, series.samples.len() as u64);
        for sample in &series.samples {
            put_uint(out, sample.stack.len() as u64);
            for &loc in &sample.stack {
                put_uint(out, u64::from(loc));
            }
            put_sint(out, sample.value);
            put_uint(out, sample.span_id);
            match &sample.trace_id {
                Some(id) => {
                    out.push(1);
                    out.extend_from_slice(id);
                }
                None => out.push(0),
            }
            put_sint(out, sample.timestamp_nanos);
            put_pairs(
                out,
                sample.labels.len(),
                sample.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            );
        }
    }
}

fn put_uint(out: &mut Vec<u8>, v: u64) {
    prost::encoding::encode_varint(v, out);
}

fn put_sint(out: &mut Vec<u8>, v: i64) {
    put_uint(out, ((v << 1) ^ (v >> 63)) as u64);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_uint(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn put_pairs<'a>(out: &mut Vec<u8>, len: usize, pairs: impl Iterator<Item = (&'a str, &'a str)>) {
    put_uint(out, len as u64);
    for (k, v) in pairs {
        put_str(out, k);
        put_str(out, v);
    }
}

/// Reads a record [`encode_write`] wrote: the tenant and its profiles.
pub fn decode_write(bytes: &[u8]) -> Result<(String, Vec<NormalizedProfile>), DecodeError> {
    let mut r = Reader(bytes);
    let version = r.u8()?;
    if version != RECORD_VERSION {
        return Err(DecodeError::Version {
            what: WHAT,
            version: u32::from(version),
            supported: u32::from(RECORD_VERSION),
        });
    }
    let tenant = r.str()?.to_owned();
    // The smallest profile is its four empty lists.
    let n = r.count(4)?;
    let mut profiles = Vec::with_capacity(n);
    for _ in 0..n {
        profiles.push(decode_profile(&mut r)?);
    }
    if !r.0.is_empty() {
        return Err(DecodeError::Record("bytes after its end"));
    }
    Ok((tenant, profiles))
}

fn decode_profile(r: &mut Reader<'_>) -> Result<NormalizedProfile, DecodeError> {
    let n = r.count(4)?;
    let mut functions = Vec::with_capacity(n);
    for _ in 0..n {
        functions.push(Function {
            name: SharedStr::from(r.str()?),
            system_name: SharedStr::from(r.str()?),
            filename: SharedStr::from(r.str()?),
            start_line: r.sint()?,
        });
    }
    let n = r.count(6)?;
    let mut mappings = Vec::with_capacity(n);
    for _ in 0..n {
        mappings.push(Mapping {
            memory_start: r.uint()?,
            memory_limit: r.uint()?,
            file_offset: r.uint()?,
            filename: r.str()?.to_owned(),
            build_id: r.str()?.to_owned(),
            has_functions: r.flag()?,
        });
    }
    let n = r.count(4)?;
    let mut locations = Vec::with_capacity(n);
    for _ in 0..n {
        let mapping = match r.uint()? {
            0 => None,
            m if m <= mappings.len() as u64 => Some((m - 1) as u32),
            _ => return Err(DecodeError::OutOfRange("a location's mapping")),
        };
        let address = r.uint()?;
        let frame_type = r.str()?.to_owned();
        let lines = r.count(2)?;
        let mut location = Location {
            mapping,
            address,
            lines: Default::default(),
            frame_type,
        };
        for _ in 0..lines {
            let function = r.index(functions.len(), "a line's function")?;
            location.lines.push(Line {
                function,
                line: r.sint()?,
            });
        }
        locations.push(location);
    }
    // The smallest series: no labels, five empty strings, two times and no samples.
    let n = r.count(9)?;
    let mut series = Vec::with_capacity(n);
    for _ in 0..n {
        let labels = Labels::from_pairs(r.pairs()?);
        let profile_type = ProfileType {
            name: r.str()?.to_owned(),
            sample_type: r.str()?.to_owned(),
            sample_unit: r.str()?.to_owned(),
            period_type: r.str()?.to_owned(),
            period_unit: r.str()?.to_owned(),
        };
        let time_nanos = r.sint()?;
        let duration_nanos = r.sint()?;
        // The smallest sample: an empty stack, value, span, no trace, timestamp, no labels.
        let n = r.count(6)?;
        let mut samples = Vec::with_capacity(n);
        for _ in 0..n {
            let depth = r.count(1)?;
            let mut stack = Vec::with_capacity(depth);
            for _ in 0..depth {
                stack.push(r.index(locations.len(), "a sample's location")?);
            }
            let value = r.sint()?;
            let span_id = r.uint()?;
            let trace_id = match r.u8()? {
                0 => None,
                1 => Some(r.array()?),
                _ => return Err(DecodeError::Record("a sample's trace flag is not 0 or 1")),
            };
            samples.push(Sample {
                stack,
                value,
                span_id,
                trace_id,
                timestamp_nanos: r.sint()?,
                labels: r.pairs()?,
            });
        }
        series.push(Series {
            labels,
            profile_type,
            time_nanos,
            duration_nanos,
            samples,
        });
    }
    Ok(NormalizedProfile {
        symbols: Symbols {
            functions,
            locations,
            mappings,
        },
        series,
    })
}

/// The fuzz entry of [`decode_write`] (`fuzz/fuzz_targets/wal_record.rs`,
/// `storage/tests/wal_records.rs`): whatever decodes reads back the same once encoded again, and
/// a dataset takes it without a panic.
pub fn fuzz(data: &[u8]) {
    let Ok(write) = decode_write(data) else {
        return;
    };
    let mut again = Vec::new();
    encode_write(&write.0, &write.1, &mut again);
    assert_eq!(
        decode_write(&again).as_ref(),
        Ok(&write),
        "a record re-encoded"
    );
    let (tenant, profiles) = write;
    let mut dataset = crate::block::DatasetBuilder::new(tenant);
    for p in &profiles {
        dataset.add(p);
    }
}

/// What is left of a record.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::Truncated(WHAT));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn flag(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError::Record("a flag is not 0 or 1")),
        }
    }

    fn uint(&mut self) -> Result<u64, DecodeError> {
        prost::encoding::decode_varint(&mut self.0)
            .map_err(|source| DecodeError::Protobuf { what: WHAT, source })
    }

    fn sint(&mut self) -> Result<i64, DecodeError> {
        let v = self.uint()?;
        Ok(((v >> 1) as i64) ^ -((v & 1) as i64))
    }

    /// A list's count, refused when the bytes left could not hold that many items of at least
    /// `min_bytes` each.
    fn count(&mut self, min_bytes: usize) -> Result<usize, DecodeError> {
        let n = self.uint()?;
        if n > (self.0.len() / min_bytes) as u64 {
            return Err(DecodeError::Truncated(WHAT));
        }
        Ok(n as usize)
    }

    /// An index into a table of `len` entries.
    fn index(&mut self, len: usize, what: &'static str) -> Result<u32, DecodeError> {
        match self.uint()? {
            i if i < len as u64 => Ok(i as u32),
            _ => Err(DecodeError::OutOfRange(what)),
        }
    }

    fn str(&mut self) -> Result<&'a str, DecodeError> {
        let n = self.count(1)?;
        std::str::from_utf8(self.take(n)?).map_err(|_| DecodeError::Record("a string is not UTF-8"))
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        Ok(self.take(N)?.try_into().expect("took N bytes"))
    }

    fn pairs(&mut self) -> Result<Vec<(String, String)>, DecodeError> {
        let n = self.count(2)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push((self.str()?.to_owned(), self.str()?.to_owned()));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use kiln_otel::model::smallvec;

    use super::*;

    fn rich() -> NormalizedProfile {
        let f = |name: &str| Function {
            name: name.into(),
            system_name: format!("sys.{name}").as_str().into(),
            filename: "main.go".into(),
            start_line: -3,
        };
        let series = |ty: &str, value: i64| Series {
            labels: Labels::from_pairs([("service_name", "api"), ("pod", "a-1")]),
            profile_type: ProfileType {
                name: "process_cpu".into(),
                sample_type: ty.into(),
                sample_unit: "nanoseconds".into(),
                period_type: "cpu".into(),
                period_unit: "nanoseconds".into(),
            },
            time_nanos: 1_700_000_000_000_000_000,
            duration_nanos: 10_000_000_000,
            samples: vec![
                Sample {
                    stack: vec![0, 1, 2],
                    value,
                    span_id: u64::MAX,
                    trace_id: Some([7; 16]),
                    timestamp_nanos: 1_700_000_000_500_000_000,
                    labels: vec![("thread.name".into(), "main".into())],
                },
                Sample {
                    stack: vec![],
                    value: -value,
                    ..Default::default()
                },
            ],
        };
        NormalizedProfile {
            symbols: Symbols {
                functions: vec![f("main"), f("run"), f("ünïcode")],
                locations: vec![
                    Location {
                        mapping: Some(0),
                        address: 0x4010,
                        lines: smallvec![
                            Line {
                                function: 2,
                                line: 7
                            },
                            Line {
                                function: 1,
                                line: 0
                            }
                        ],
                        frame_type: "native".into(),
                    },
                    Location {
                        mapping: None,
                        address: 0,
                        lines: smallvec![Line {
                            function: 0,
                            line: i64::MIN
                        }],
                        frame_type: String::new(),
                    },
                    Location {
                        mapping: Some(1),
                        address: u64::MAX,
                        lines: Default::default(),
                        frame_type: "kernel".into(),
                    },
                ],
                mappings: vec![
                    Mapping {
                        memory_start: 0x1000,
                        memory_limit: 0x9000,
                        file_offset: 0,
                        filename: "/usr/bin/api".into(),
                        build_id: "abcdef".into(),
                        has_functions: true,
                    },
                    Mapping::default(),
                ],
            },
            series: vec![series("cpu", 10), series("samples", i64::MAX)],
        }
    }

    #[test]
    fn a_write_reads_back_as_written() {
        let profiles = vec![rich(), NormalizedProfile::default(), rich()];
        let mut bytes = Vec::new();
        encode_write("tenant-a", &profiles, &mut bytes);
        let (tenant, got) = decode_write(&bytes).unwrap();
        assert_eq!(tenant, "tenant-a");
        assert_eq!(got, profiles);
        let mut empty = Vec::new();
        encode_write("", &[], &mut empty);
        assert_eq!(decode_write(&empty).unwrap(), (String::new(), Vec::new()));
    }

    #[test]
    fn every_prefix_and_every_flipped_byte_is_refused_or_safe_to_add() {
        let mut bytes = Vec::new();
        encode_write("t", &[rich()], &mut bytes);
        for end in 0..bytes.len() {
            assert!(
                decode_write(&bytes[..end]).is_err(),
                "a prefix of {end} bytes"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode_write(&longer).is_err(), "a trailing byte");
        let mut decoded = 0;
        for at in 0..bytes.len() {
            for mask in [0x01, 0x80, 0xff] {
                let mut bad = bytes.clone();
                bad[at] ^= mask;
                // Whatever decodes has every index in range: a dataset takes it.
                decoded += usize::from(decode_write(&bad).is_ok());
                fuzz(&bad);
            }
        }
        // Flipped values, times and names still decode: the dataset path ran.
        assert!(
            decoded > bytes.len() / 2,
            "{decoded} of {} decoded",
            3 * bytes.len()
        );
    }

    #[test]
    fn references_outside_their_tables_are_refused() {
        let cases: [(&str, fn(&mut NormalizedProfile)); 3] = [
            ("a line's function", |p| {
                p.symbols.locations[0].lines[0].function = 3
            }),
            ("a location's mapping", |p| {
                p.symbols.locations[0].mapping = Some(2)
            }),
            ("a sample's location", |p| {
                p.series[0].samples[0].stack = vec![3]
            }),
        ];
        for (what, break_it) in cases {
            let mut p = rich();
            break_it(&mut p);
            let mut bytes = Vec::new();
            encode_write("t", &[p], &mut bytes);
            assert_eq!(
                decode_write(&bytes).unwrap_err(),
                DecodeError::OutOfRange(what)
            );
        }
    }

    #[test]
    fn a_forged_count_allocates_nothing_past_the_record() {
        let mut bytes = vec![RECORD_VERSION];
        put_str(&mut bytes, "t");
        put_uint(&mut bytes, u64::MAX);
        assert_eq!(
            decode_write(&bytes).unwrap_err(),
            DecodeError::Truncated(WHAT)
        );
        let mut other = vec![RECORD_VERSION + 1];
        put_str(&mut other, "t");
        assert!(matches!(
            decode_write(&other).unwrap_err(),
            DecodeError::Version { version: 2, .. }
        ));
    }
}
