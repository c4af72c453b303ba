//! The metadata's protobuf, `kiln.storage.v1.BlockMeta`, written from [`BlockMeta`]s and read
//! back into them without prost's message in between. As that message, a million-series entry
//! is a vector of label ids per series and an owned copy of every distinct label string, a few
//! hundred megabytes while a compaction's output is registered or an entry is decoded (ADR
//! 0017); written and read here, it costs its bytes and the decoded entry.
//!
//! The message is the one prost would write but for its string table (field 8): it follows the
//! datasets (field 9), because a string's id is known only once the series naming it are
//! written, and it holds a dataset's label table whole, so label ids are the table's own plus
//! an offset rather than looked up string by string (a string may then be there twice).
//! Protobuf readers take fields in any order, so prost reads these bytes, and entries and
//! footers written by earlier builds read here as before.

use std::collections::HashMap;
use std::sync::Arc;

use prost::encoding::{
    DecodeContext, WireType, decode_key, decode_varint, encode_key, encode_varint,
    encoded_len_varint, skip_field,
};

use super::{
    BLOCK_FORMAT_VERSION, BlockMeta, LogCheckpoint, MIN_BLOCK_FORMAT_VERSION, Rollup, Section,
    SeriesMeta,
};
use crate::error::DecodeError;
use crate::format::series_labels::{LabelTable, LabelTableBuilder};

#[cfg(test)]
mod tests;

/// The string table being written: strings looked up by value, each once, numbered as first
/// met ("" is 0), and label tables appended whole.
struct Strings<'a> {
    ids: hashbrown::HashMap<&'a str, u32>,
    list: Vec<&'a str>,
}

impl<'a> Strings<'a> {
    fn new() -> Self {
        let mut t = Self {
            ids: Default::default(),
            list: Vec::new(),
        };
        t.get("");
        t
    }

    /// Appends every string of `table`, returning the id of its first: its label ids plus that
    /// are the entry's ids, with no lookup (the strings may repeat one of the map's).
    fn append(&mut self, table: &'a LabelTable) -> u32 {
        let base = self.list.len() as u32;
        self.list
            .extend((0..table.strings() as u32).map(|i| table.string(i)));
        base
    }

    fn get(&mut self, s: &'a str) -> u32 {
        let next = self.list.len() as u32;
        let id = *self.ids.entry(s).or_insert(next);
        if id == next {
            self.list.push(s);
        }
        id
    }
}

fn put_varint(tag: u32, v: u64, out: &mut Vec<u8>) {
    if v != 0 {
        encode_key(tag, WireType::Varint, out);
        encode_varint(v, out);
    }
}

fn put_bytes(tag: u32, v: &[u8], out: &mut Vec<u8>) {
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(v.len() as u64, out);
    out.extend_from_slice(v);
}

/// A packed repeated varint field (omitted when empty).
fn put_packed(tag: u32, values: impl Iterator<Item = u64> + Clone, out: &mut Vec<u8>) {
    let len: usize = values.clone().map(encoded_len_varint).sum();
    if len == 0 {
        return;
    }
    encode_key(tag, WireType::LengthDelimited, out);
    encode_varint(len as u64, out);
    for v in values {
        encode_varint(v, out);
    }
}

/// Writes the metadata of an object holding `datasets` (all of one object: same id, shard and
/// level), its size given as `size`.
pub(super) fn encode<'a>(datasets: &'a [BlockMeta], size: u64) -> Vec<u8> {
    let first = datasets.first();
    let mut out = Vec::new();
    put_varint(
        1,
        first
            .map_or(BLOCK_FORMAT_VERSION, |d| d.format_version)
            .into(),
        &mut out,
    );
    if let Some(id) = first.map(|d| d.id.as_str()).filter(|id| !id.is_empty()) {
        put_bytes(2, id.as_bytes(), &mut out);
    }
    put_varint(3, first.map_or(0, |d| d.shard).into(), &mut out);
    put_varint(4, first.map_or(0, |d| d.level).into(), &mut out);
    let min = datasets.iter().map(|d| d.min_time_nanos).min().unwrap_or(0);
    let max = datasets.iter().map(|d| d.max_time_nanos).max().unwrap_or(0);
    put_varint(5, min as u64, &mut out);
    put_varint(6, max as u64, &mut out);
    put_varint(7, size, &mut out);
    let mut strings = Strings::new();
    let mut series = Vec::new();
    let mut ids = Vec::new();
    for d in datasets {
        debug_assert_eq!(Some(&d.id), first.map(|f| &f.id), "one object's datasets");
        // The dataset is written in place, then its key and length go in front of it.
        let start = out.len();
        put_varint(1, strings.get(&d.tenant).into(), &mut out);
        put_varint(2, d.min_time_nanos as u64, &mut out);
        put_varint(3, d.max_time_nanos as u64, &mut out);
        put_varint(4, d.samples.offset, &mut out);
        put_varint(5, d.samples.size, &mut out);
        put_varint(6, d.symbols.offset, &mut out);
        put_varint(7, d.symbols.size, &mut out);
        put_varint(8, d.rows, &mut out);
        put_varint(9, d.profiles, &mut out);
        // Profile types first, so their ids stay small (one byte in every series); a series
        // mostly shares its type with the one before it, and so its id.
        let mut last_type: Option<(&Arc<str>, u32)> = None;
        let mut type_id = |strings: &mut Strings<'a>, t: &'a Arc<str>| match last_type {
            Some((last, id)) if Arc::ptr_eq(last, t) => id,
            _ => {
                let id = strings.get(t);
                last_type = Some((t, id));
                id
            }
        };
        for s in &d.series {
            type_id(&mut strings, &s.profile_type);
        }
        // Series that share one label table of their own (as decoded, merged or written, they
        // all do) take their ids from it; others are looked up string by string. A table whose
        // pairs are not all this dataset's is shared with other series, maybe another
        // tenant's, and its strings are not written whole.
        let table = d.series.first().map(|s| s.labels.table());
        let base = table
            .filter(|t| {
                d.series.iter().all(|s| Arc::ptr_eq(s.labels.table(), t))
                    && t.pairs() == d.series.iter().map(|s| s.labels.len()).sum::<usize>()
            })
            .map(|t| strings.append(t));
        for s in &d.series {
            series.clear();
            put_varint(
                1,
                type_id(&mut strings, &s.profile_type).into(),
                &mut series,
            );
            ids.clear();
            match base {
                Some(base) => {
                    for &(k, v) in s.labels.ids() {
                        ids.extend([base + k, base + v]);
                    }
                }
                None => {
                    for (k, v) in s.labels.iter() {
                        ids.extend([strings.get(k), strings.get(v)]);
                    }
                }
            }
            put_packed(2, ids.iter().map(|&i| u64::from(i)), &mut series);
            put_varint(3, s.min_time_nanos as u64, &mut series);
            put_varint(4, s.max_time_nanos as u64, &mut series);
            put_varint(5, s.first_row, &mut series);
            put_varint(6, s.rows, &mut series);
            put_bytes(10, &series, &mut out);
        }
        for c in &d.compacted_from {
            put_bytes(11, c.as_bytes(), &mut out);
        }
        put_varint(12, d.stack_nodes, &mut out);
        for r in &d.rollups {
            series.clear();
            put_varint(1, r.resolution_nanos as u64, &mut series);
            put_varint(2, r.section.offset, &mut series);
            put_varint(3, r.section.size, &mut series);
            put_packed(4, r.series_rows.iter().map(|x| x.start), &mut series);
            put_packed(
                5,
                r.series_rows.iter().map(|x| x.end - x.start),
                &mut series,
            );
            put_bytes(13, &series, &mut out);
        }
        let mut head = Vec::with_capacity(8);
        encode_key(9, WireType::LengthDelimited, &mut head);
        encode_varint((out.len() - start) as u64, &mut head);
        out.splice(start..start, head);
    }
    for s in &strings.list {
        put_bytes(8, s.as_bytes(), &mut out);
    }
    for c in first.map_or(&[][..], |d| d.logs.as_slice()) {
        series.clear();
        put_bytes(1, c.log.as_bytes(), &mut series);
        put_varint(2, c.seq, &mut series);
        put_bytes(10, &series, &mut out);
    }
    out
}

/// A field's value, read as its wire type says.
enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

/// How a message's known field is written.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Varint,
    Bytes,
    /// A packed list of varints, whose values may also come one by one.
    Packed,
}

/// The kinds of a message's fields 1 to `last`: `varints` and `packed` name theirs, the others
/// are length-delimited.
struct Fields {
    varints: &'static [u32],
    packed: &'static [u32],
    last: u32,
}

impl Fields {
    fn kind(&self, tag: u32) -> Option<Kind> {
        if self.varints.contains(&tag) {
            Some(Kind::Varint)
        } else if self.packed.contains(&tag) {
            Some(Kind::Packed)
        } else if (1..=self.last).contains(&tag) {
            Some(Kind::Bytes)
        } else {
            None
        }
    }
}

const BLOCK_META: Fields = Fields {
    varints: &[1, 3, 4, 5, 6, 7],
    packed: &[],
    last: 10,
};
const LOG_CHECKPOINT: Fields = Fields {
    varints: &[2],
    packed: &[],
    last: 2,
};
const DATASET: Fields = Fields {
    varints: &[1, 2, 3, 4, 5, 6, 7, 8, 9, 12],
    packed: &[],
    last: 13,
};
const SERIES: Fields = Fields {
    varints: &[1, 3, 4, 5, 6],
    packed: &[2],
    last: 6,
};
const ROLLUP: Fields = Fields {
    varints: &[1, 2, 3],
    packed: &[4, 5],
    last: 5,
};

/// Reads the fields of one message in `buf`, handing the known ones to `f` and skipping the
/// rest; a known field written with another wire type than its own is refused, as prost does.
fn fields<'a>(
    mut buf: &'a [u8],
    message: &Fields,
    mut f: impl FnMut(u32, Value<'a>) -> Result<(), DecodeError>,
) -> Result<(), DecodeError> {
    while !buf.is_empty() {
        let (tag, wire) = decode_key(&mut buf).map_err(protobuf)?;
        let Some(kind) = message.kind(tag) else {
            skip_field(wire, tag, &mut buf, DecodeContext::default()).map_err(protobuf)?;
            continue;
        };
        let value = match (wire, kind) {
            (WireType::Varint, Kind::Varint | Kind::Packed) => {
                Value::Varint(decode_varint(&mut buf).map_err(protobuf)?)
            }
            (WireType::LengthDelimited, Kind::Bytes | Kind::Packed) => {
                let len = decode_varint(&mut buf).map_err(protobuf)?;
                if len > buf.len() as u64 {
                    return Err(DecodeError::Wire("a field runs past its message"));
                }
                let (v, rest) = buf.split_at(len as usize);
                buf = rest;
                Value::Bytes(v)
            }
            _ => return Err(DecodeError::Wire("a field has the wrong wire type")),
        };
        f(tag, value)?;
    }
    Ok(())
}

fn protobuf(source: prost::DecodeError) -> DecodeError {
    DecodeError::Protobuf {
        what: "block metadata",
        source,
    }
}

fn utf8(v: &[u8]) -> Result<&str, DecodeError> {
    std::str::from_utf8(v).map_err(|_| DecodeError::Wire("a string is not UTF-8"))
}

/// Appends the values of a packed (or single) varint list field to `out`.
fn push_varints(v: Value<'_>, out: &mut Vec<u64>) -> Result<(), DecodeError> {
    match v {
        Value::Varint(x) => out.push(x),
        Value::Bytes(mut b) => {
            while !b.is_empty() {
                out.push(decode_varint(&mut b).map_err(protobuf)?);
            }
        }
    }
    Ok(())
}

/// A varint field's value ([`fields`] reads a field of kind [`Kind::Varint`] as one).
fn varint(v: Value<'_>) -> u64 {
    match v {
        Value::Varint(x) => x,
        Value::Bytes(_) => 0,
    }
}

/// A length-delimited field's value ([`fields`] reads a field of kind [`Kind::Bytes`] as one).
fn bytes(v: Value<'_>) -> &[u8] {
    match v {
        Value::Bytes(b) => b,
        Value::Varint(_) => &[],
    }
}

/// The datasets of an object's metadata `data`, checked.
pub(super) fn decode(data: &[u8]) -> Result<Vec<BlockMeta>, DecodeError> {
    let (mut version, mut id, mut shard, mut level, mut size) = (0u32, "", 0u32, 0u32, 0u64);
    let mut strings: Vec<&str> = Vec::new();
    let mut datasets: Vec<&[u8]> = Vec::new();
    let mut logs = Vec::new();
    fields(data, &BLOCK_META, |tag, v| {
        match tag {
            1 => version = varint(v) as u32,
            2 => id = utf8(bytes(v))?,
            3 => shard = varint(v) as u32,
            4 => level = varint(v) as u32,
            7 => size = varint(v),
            8 => strings.push(utf8(bytes(v))?),
            9 => datasets.push(bytes(v)),
            10 => {
                let mut c = LogCheckpoint {
                    log: String::new(),
                    seq: 0,
                };
                fields(bytes(v), &LOG_CHECKPOINT, |tag, v| {
                    match tag {
                        1 => c.log = utf8(bytes(v))?.to_owned(),
                        2 => c.seq = varint(v),
                        _ => {}
                    }
                    Ok(())
                })?;
                logs.push(c);
            }
            _ => {}
        }
        Ok(())
    })?;
    if !(MIN_BLOCK_FORMAT_VERSION..=BLOCK_FORMAT_VERSION).contains(&version) {
        return Err(DecodeError::Version {
            what: "block format",
            version,
            supported: BLOCK_FORMAT_VERSION,
        });
    }
    if ulid::Ulid::from_string(id).is_err() {
        return Err(DecodeError::BlockId(id.to_owned()));
    }
    // prost reads a uint32 field as the low 32 bits of its varint.
    let string = |i: u64| -> Result<&str, DecodeError> {
        strings
            .get(i as u32 as usize)
            .copied()
            .ok_or(DecodeError::StringIndex(i as u32))
    };
    let mut out = Vec::with_capacity(datasets.len());
    for data in datasets {
        let mut d = BlockMeta {
            format_version: version,
            id: id.to_owned(),
            tenant: String::new(),
            shard,
            level,
            min_time_nanos: 0,
            max_time_nanos: 0,
            object_size: size,
            samples: Section::default(),
            symbols: Section::default(),
            series: Vec::new(),
            rows: 0,
            profiles: 0,
            stack_nodes: 0,
            compacted_from: Vec::new(),
            rollups: Vec::new(),
            index: Default::default(),
            logs: logs.clone(),
            received_ms: 0,
        };
        let mut tenant = 0;
        // The dataset's series share one label table and their profile type ids.
        let mut table = LabelTableBuilder::default();
        let mut types: HashMap<u32, Arc<str>> = HashMap::new();
        let mut parts = Vec::new();
        let mut labels = Vec::new();
        let mut pairs = Vec::new();
        let mut rollups = Vec::new();
        fields(data, &DATASET, |tag, v| {
            match tag {
                1 => tenant = varint(v),
                2 => d.min_time_nanos = varint(v) as i64,
                3 => d.max_time_nanos = varint(v) as i64,
                4 => d.samples.offset = varint(v),
                5 => d.samples.size = varint(v),
                6 => d.symbols.offset = varint(v),
                7 => d.symbols.size = varint(v),
                8 => d.rows = varint(v),
                9 => d.profiles = varint(v),
                10 => {
                    let mut s = SeriesMeta {
                        labels: Default::default(),
                        profile_type: "".into(),
                        min_time_nanos: 0,
                        max_time_nanos: 0,
                        first_row: 0,
                        rows: 0,
                    };
                    let mut profile_type = 0;
                    labels.clear();
                    fields(bytes(v), &SERIES, |tag, v| {
                        match tag {
                            1 => profile_type = varint(v),
                            2 => push_varints(v, &mut labels)?,
                            3 => s.min_time_nanos = varint(v) as i64,
                            4 => s.max_time_nanos = varint(v) as i64,
                            5 => s.first_row = varint(v),
                            6 => s.rows = varint(v),
                            _ => {}
                        }
                        Ok(())
                    })?;
                    if labels.len() % 2 != 0 {
                        return Err(DecodeError::OddLabels);
                    }
                    pairs.clear();
                    for kv in labels.chunks_exact(2) {
                        pairs.push((string(kv[0])?, string(kv[1])?));
                    }
                    table.add(pairs.iter().copied());
                    let profile_type = profile_type as u32;
                    s.profile_type = match types.get(&profile_type) {
                        Some(t) => Arc::clone(t),
                        None => {
                            let t: Arc<str> = string(profile_type.into())?.into();
                            types.insert(profile_type, Arc::clone(&t));
                            t
                        }
                    };
                    parts.push(s);
                }
                11 => d.compacted_from.push(utf8(bytes(v))?.to_owned()),
                12 => d.stack_nodes = varint(v),
                13 => rollups.push(bytes(v)),
                _ => {}
            }
            Ok(())
        })?;
        for (s, labels) in parts.iter_mut().zip(table.finish()) {
            s.labels = labels;
        }
        d.series = parts;
        let rows: u64 = d.series.iter().map(|x| x.rows).sum();
        if rows != d.rows {
            return Err(DecodeError::Rows {
                series: rows,
                dataset: d.rows,
            });
        }
        d.tenant = string(tenant)?.to_owned();
        d.rollups = rollups
            .into_iter()
            .map(|r| decode_rollup(r, d.series.len()))
            .collect::<Result<_, _>>()?;
        out.push(d);
    }
    Ok(out)
}

fn decode_rollup(data: &[u8], series: usize) -> Result<Rollup, DecodeError> {
    let (mut resolution, mut section) = (0i64, Section::default());
    let (mut first_rows, mut rows) = (Vec::new(), Vec::new());
    fields(data, &ROLLUP, |tag, v| {
        match tag {
            1 => resolution = varint(v) as i64,
            2 => section.offset = varint(v),
            3 => section.size = varint(v),
            4 => push_varints(v, &mut first_rows)?,
            5 => push_varints(v, &mut rows)?,
            _ => {}
        }
        Ok(())
    })?;
    if first_rows.len() != series || rows.len() != series {
        return Err(DecodeError::RollupSeries {
            rollup: rows.len(),
            dataset: series,
        });
    }
    if resolution < 0 {
        return Err(DecodeError::RollupResolution(resolution));
    }
    Ok(Rollup {
        resolution_nanos: resolution,
        section,
        series_rows: first_rows
            .iter()
            .zip(&rows)
            .map(|(&first, &n)| first..first.saturating_add(n))
            .collect(),
    })
}
