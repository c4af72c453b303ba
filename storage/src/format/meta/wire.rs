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

#[cfg(test)]
mod tests {
    //! prost's own path, as earlier builds wrote and read the metadata, is the oracle: prost
    //! reads these bytes into the message it would have built itself, and whatever prost's path
    //! reads (or refuses), this reader reads (or refuses) alike.

    use std::collections::HashMap;

    use kiln_proto::kiln::storage::v1 as pb;
    use proptest::prelude::*;
    use prost::Message;

    use super::*;
    use crate::format::series_labels::SeriesLabels;

    #[derive(Default)]
    struct StringTable {
        strings: Vec<String>,
        index: HashMap<String, u32>,
    }

    impl StringTable {
        fn new() -> Self {
            let mut t = Self::default();
            t.get("");
            t
        }

        fn get(&mut self, s: &str) -> u32 {
            if let Some(&i) = self.index.get(s) {
                return i;
            }
            let i = self.strings.len() as u32;
            self.strings.push(s.to_owned());
            self.index.insert(s.to_owned(), i);
            i
        }
    }

    /// The message prost would write for `datasets`, as builds before this reader made it.
    fn prost_message(datasets: &[BlockMeta]) -> pb::BlockMeta {
        let mut strings = StringTable::new();
        let first = datasets.first();
        let mut out = pb::BlockMeta {
            format_version: first.map_or(BLOCK_FORMAT_VERSION, |d| d.format_version),
            id: first.map(|d| d.id.clone()).unwrap_or_default(),
            shard: first.map_or(0, |d| d.shard),
            level: first.map_or(0, |d| d.level),
            min_time: datasets.iter().map(|d| d.min_time_nanos).min().unwrap_or(0),
            max_time: datasets.iter().map(|d| d.max_time_nanos).max().unwrap_or(0),
            size: first.map_or(0, |d| d.object_size),
            strings: Vec::new(),
            datasets: Vec::with_capacity(datasets.len()),
            logs: first
                .map(|d| {
                    d.logs
                        .iter()
                        .map(|c| pb::LogCheckpoint {
                            log: c.log.clone(),
                            seq: c.seq,
                        })
                        .collect()
                })
                .unwrap_or_default(),
        };
        for d in datasets {
            debug_assert_eq!(d.id, out.id, "one object's datasets");
            out.datasets.push(pb::Dataset {
                tenant: strings.get(&d.tenant),
                min_time: d.min_time_nanos,
                max_time: d.max_time_nanos,
                samples_offset: d.samples.offset,
                samples_size: d.samples.size,
                symbols_offset: d.symbols.offset,
                symbols_size: d.symbols.size,
                rows: d.rows,
                profiles: d.profiles,
                series: d
                    .series
                    .iter()
                    .map(|s| pb::Series {
                        profile_type: strings.get(&s.profile_type),
                        labels: s
                            .labels
                            .iter()
                            .flat_map(|(k, v)| [strings.get(k), strings.get(v)])
                            .collect(),
                        min_time: s.min_time_nanos,
                        max_time: s.max_time_nanos,
                        first_row: s.first_row,
                        rows: s.rows,
                    })
                    .collect(),
                compacted_from: d.compacted_from.clone(),
                stack_nodes: d.stack_nodes,
                rollups: d
                    .rollups
                    .iter()
                    .map(|r| pb::Rollup {
                        resolution: r.resolution_nanos,
                        offset: r.section.offset,
                        size: r.section.size,
                        series_first_row: r.series_rows.iter().map(|x| x.start).collect(),
                        series_rows: r.series_rows.iter().map(|x| x.end - x.start).collect(),
                    })
                    .collect(),
            });
        }
        out.strings = strings.strings;
        out
    }

    /// The datasets of prost's message, as builds before this reader read them.
    fn prost_datasets(msg: &pb::BlockMeta) -> Result<Vec<BlockMeta>, DecodeError> {
        if !(MIN_BLOCK_FORMAT_VERSION..=BLOCK_FORMAT_VERSION).contains(&msg.format_version) {
            return Err(DecodeError::Version {
                what: "block format",
                version: msg.format_version,
                supported: BLOCK_FORMAT_VERSION,
            });
        }
        if ulid::Ulid::from_string(&msg.id).is_err() {
            return Err(DecodeError::BlockId(msg.id.clone()));
        }
        let s = |i: u32| -> Result<String, DecodeError> {
            msg.strings
                .get(i as usize)
                .cloned()
                .ok_or(DecodeError::StringIndex(i))
        };
        let text = |i: u32| -> Result<&str, DecodeError> {
            msg.strings
                .get(i as usize)
                .map(String::as_str)
                .ok_or(DecodeError::StringIndex(i))
        };
        let mut out = Vec::with_capacity(msg.datasets.len());
        for d in &msg.datasets {
            // The dataset's series share one label table and their profile type ids.
            let mut table = LabelTableBuilder::default();
            let mut types: HashMap<u32, Arc<str>> = HashMap::new();
            let mut parts = Vec::with_capacity(d.series.len());
            for x in &d.series {
                if x.labels.len() % 2 != 0 {
                    return Err(DecodeError::OddLabels);
                }
                let pairs = x
                    .labels
                    .chunks_exact(2)
                    .map(|kv| Ok((text(kv[0])?, text(kv[1])?)))
                    .collect::<Result<Vec<_>, DecodeError>>()?;
                table.add(pairs);
                let profile_type = match types.get(&x.profile_type) {
                    Some(t) => Arc::clone(t),
                    None => {
                        let t: Arc<str> = text(x.profile_type)?.into();
                        types.insert(x.profile_type, Arc::clone(&t));
                        t
                    }
                };
                parts.push((profile_type, x));
            }
            let series: Vec<SeriesMeta> = parts
                .into_iter()
                .zip(table.finish())
                .map(|((profile_type, x), labels)| SeriesMeta {
                    labels,
                    profile_type,
                    min_time_nanos: x.min_time,
                    max_time_nanos: x.max_time,
                    first_row: x.first_row,
                    rows: x.rows,
                })
                .collect();
            let rows: u64 = series.iter().map(|x| x.rows).sum();
            if rows != d.rows {
                return Err(DecodeError::Rows {
                    series: rows,
                    dataset: d.rows,
                });
            }
            out.push(BlockMeta {
                format_version: msg.format_version,
                id: msg.id.clone(),
                tenant: s(d.tenant)?,
                shard: msg.shard,
                level: msg.level,
                min_time_nanos: d.min_time,
                max_time_nanos: d.max_time,
                object_size: msg.size,
                samples: Section {
                    offset: d.samples_offset,
                    size: d.samples_size,
                },
                symbols: Section {
                    offset: d.symbols_offset,
                    size: d.symbols_size,
                },
                series,
                rows: d.rows,
                profiles: d.profiles,
                stack_nodes: d.stack_nodes,
                compacted_from: d.compacted_from.clone(),
                rollups: d
                    .rollups
                    .iter()
                    .map(|r| prost_rollup(r, d.series.len()))
                    .collect::<Result<_, DecodeError>>()?,
                index: Default::default(),
                logs: msg
                    .logs
                    .iter()
                    .map(|c| LogCheckpoint {
                        log: c.log.clone(),
                        seq: c.seq,
                    })
                    .collect(),
            });
        }
        Ok(out)
    }

    fn prost_rollup(r: &pb::Rollup, series: usize) -> Result<Rollup, DecodeError> {
        if r.series_first_row.len() != series || r.series_rows.len() != series {
            return Err(DecodeError::RollupSeries {
                rollup: r.series_rows.len(),
                dataset: series,
            });
        }
        if r.resolution < 0 {
            return Err(DecodeError::RollupResolution(r.resolution));
        }
        Ok(Rollup {
            resolution_nanos: r.resolution,
            section: Section {
                offset: r.offset,
                size: r.size,
            },
            series_rows: r
                .series_first_row
                .iter()
                .zip(&r.series_rows)
                .map(|(&first, &n)| first..first.saturating_add(n))
                .collect(),
        })
    }

    /// `msg` with its strings numbered as prost's path numbers them (each once, as first met),
    /// so messages that name the same strings by other ids compare equal.
    fn canonical(msg: &pb::BlockMeta) -> pb::BlockMeta {
        let mut strings = StringTable::new();
        let mut out = msg.clone();
        let mut s = |i: &mut u32| *i = strings.get(&msg.strings[*i as usize]);
        for d in &mut out.datasets {
            s(&mut d.tenant);
            for x in &mut d.series {
                s(&mut x.profile_type);
                x.labels.iter_mut().for_each(&mut s);
            }
        }
        out.strings = strings.strings;
        out
    }

    fn prost_decode(data: &[u8]) -> Option<Vec<BlockMeta>> {
        prost_datasets(&pb::BlockMeta::decode(data).ok()?).ok()
    }

    const STRINGS: &[&str] = &["", "a", "service_name", "pod", "é", "api", "p:c:n:c:n", "x"];

    fn series() -> impl Strategy<Value = SeriesMeta> {
        (
            prop::collection::vec((0..STRINGS.len(), 0..STRINGS.len()), 0..4),
            0..STRINGS.len(),
            any::<i64>(),
            any::<i64>(),
            0..1u64 << 40,
            0..1000u64,
        )
            .prop_map(|(labels, t, min, max, first_row, rows)| {
                let mut labels: Vec<(&str, &str)> = labels
                    .into_iter()
                    .map(|(k, v)| (STRINGS[k], STRINGS[v]))
                    .collect();
                labels.sort();
                SeriesMeta {
                    labels: SeriesLabels::new(labels),
                    profile_type: STRINGS[t].into(),
                    min_time_nanos: min,
                    max_time_nanos: max,
                    first_row,
                    rows,
                }
            })
    }

    fn dataset(id: String) -> impl Strategy<Value = BlockMeta> {
        (
            (
                0..STRINGS.len(),
                any::<i64>(),
                any::<i64>(),
                any::<[u64; 4]>(),
            ),
            prop::collection::vec(series(), 0..6),
            (
                any::<u64>(),
                any::<u64>(),
                prop::collection::vec("[a-z0-9@]{0,6}", 0..3),
            ),
            prop::collection::vec((0..i64::MAX, any::<u64>(), any::<u64>()), 0..3),
            any::<u64>(),
        )
            .prop_flat_map(move |(head, series, counts, rollups, seed)| {
                let n = series.len();
                let id = id.clone();
                (
                    Just((head, series, counts, rollups, seed, id)),
                    prop::collection::vec(
                        prop::collection::vec((0..1u64 << 50, 0..1u64 << 20), n),
                        3,
                    ),
                )
            })
            .prop_map(|((head, mut series, counts, rollups, seed, id), ranges)| {
                // Most datasets' series share one label table, as decoded or merged ones do.
                if seed % 4 != 0 {
                    let mut table = LabelTableBuilder::default();
                    for s in &series {
                        table.add(s.labels.iter());
                    }
                    for (s, labels) in series.iter_mut().zip(table.finish()) {
                        s.labels = labels;
                    }
                }
                let (tenant, min, max, sections) = head;
                let (profiles, stack_nodes, compacted_from) = counts;
                BlockMeta {
                    format_version: BLOCK_FORMAT_VERSION,
                    id,
                    tenant: STRINGS[tenant].into(),
                    shard: 3,
                    level: 1,
                    min_time_nanos: min,
                    max_time_nanos: max,
                    object_size: 0,
                    samples: Section {
                        offset: sections[0],
                        size: sections[1],
                    },
                    symbols: Section {
                        offset: sections[2],
                        size: sections[3],
                    },
                    rows: series.iter().map(|s| s.rows).sum(),
                    series,
                    profiles,
                    stack_nodes,
                    compacted_from,
                    rollups: rollups
                        .into_iter()
                        .zip(ranges)
                        .map(|((resolution_nanos, offset, size), rows)| Rollup {
                            resolution_nanos,
                            section: Section { offset, size },
                            series_rows: rows.iter().map(|&(a, n)| a..a + n).collect(),
                        })
                        .collect(),
                    index: Default::default(),
                    logs: Vec::new(),
                }
            })
    }

    fn object() -> impl Strategy<Value = (Vec<BlockMeta>, u64)> {
        let id = ulid::Ulid::from_parts(1_700_000_000_000, 7).to_string();
        let logs = prop::collection::vec((0..3u8, any::<u64>()), 0..3);
        (prop::collection::vec(dataset(id), 1..4), any::<u64>(), logs).prop_map(
            |(mut datasets, size, logs)| {
                // An object's datasets share its logs.
                let logs: Vec<LogCheckpoint> = logs
                    .into_iter()
                    .map(|(shard, seq)| LogCheckpoint {
                        log: format!("01J0000000000000000000LOG0/{shard}"),
                        seq,
                    })
                    .collect();
                for d in &mut datasets {
                    d.logs = logs.clone();
                }
                (datasets, size)
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        #[test]
        fn prost_reads_what_is_written_as_the_message_it_would_write((datasets, size) in object()) {
            let mut want = prost_message(&datasets);
            want.size = size;
            let bytes = encode(&datasets, size);
            let got = pb::BlockMeta::decode(&bytes[..]).unwrap();
            prop_assert_eq!(canonical(&got), canonical(&want));
        }

        #[test]
        fn what_either_writes_reads_back((mut datasets, size) in object()) {
            for d in &mut datasets {
                d.object_size = size;
            }
            prop_assert_eq!(&decode(&encode(&datasets, size)).unwrap(), &datasets);
            let mut msg = prost_message(&datasets);
            msg.size = size;
            prop_assert_eq!(&decode(&msg.encode_to_vec()).unwrap(), &datasets);
        }

        /// Damaged bytes: read, or refused, as prost's path reads or refuses them.
        #[test]
        fn damaged_bytes_read_as_prost_reads_them(
            (datasets, size) in object(),
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0..6u8), 1..3),
            prost_order in any::<bool>(),
        ) {
            let mut bytes = if prost_order {
                let mut msg = prost_message(&datasets);
                msg.size = size;
                msg.encode_to_vec()
            } else {
                encode(&datasets, size)
            };
            for (at, byte, how) in edits {
                let i = at.index(bytes.len() + 1);
                match how {
                    0..4 if i < bytes.len() => bytes[i] = byte,
                    4 => bytes.insert(i, byte),
                    _ => bytes.truncate(i),
                }
            }
            prop_assert_eq!(decode(&bytes).ok(), prost_decode(&bytes));
        }
    }

    /// A dataset's profile types are numbered before its label table's strings, so they stay
    /// one byte in every series however many strings the labels have.
    #[test]
    fn profile_types_keep_small_ids_beside_a_large_label_table() {
        let id = ulid::Ulid::from_parts(1_700_000_000_000, 7).to_string();
        let mut table = LabelTableBuilder::default();
        let pods: Vec<String> = (0..300).map(|i| format!("pod-{i}")).collect();
        for p in &pods {
            table.add([("pod", p.as_str())]);
        }
        let mut d = tests_meta(&id);
        d.series = table
            .finish()
            .into_iter()
            .enumerate()
            .map(|(i, labels)| SeriesMeta {
                labels,
                profile_type: if i % 2 == 0 { "cpu" } else { "alloc" }.into(),
                min_time_nanos: 1,
                max_time_nanos: 2,
                first_row: i as u64,
                rows: 1,
            })
            .collect();
        d.rows = 300;
        let msg = pb::BlockMeta::decode(&encode(std::slice::from_ref(&d), 0)[..]).unwrap();
        assert!(msg.datasets[0].series.iter().all(|s| s.profile_type < 128));
        assert_eq!(decode(&msg.encode_to_vec()).unwrap(), vec![d]);
    }

    /// Series whose table also holds other series' labels (another dataset's, say) are written
    /// string by string: none of the other series' strings reach the bytes.
    #[test]
    fn a_label_table_shared_beyond_the_dataset_is_not_written_whole() {
        let id = ulid::Ulid::from_parts(1_700_000_000_000, 7).to_string();
        let mut table = LabelTableBuilder::default();
        table.add([("pod", "mine")]);
        table.add([("pod", "someone-elses")]);
        let labels = table.finish();
        let mut d = tests_meta(&id);
        d.series = vec![SeriesMeta {
            labels: labels[0].clone(),
            profile_type: "cpu".into(),
            min_time_nanos: 1,
            max_time_nanos: 2,
            first_row: 0,
            rows: 1,
        }];
        d.rows = 1;
        let bytes = encode(std::slice::from_ref(&d), 0);
        assert!(!bytes.windows(13).any(|w| w == b"someone-elses"));
        assert_eq!(decode(&bytes).unwrap(), vec![d]);
    }

    fn tests_meta(id: &str) -> BlockMeta {
        BlockMeta {
            format_version: BLOCK_FORMAT_VERSION,
            id: id.into(),
            tenant: "t".into(),
            shard: 0,
            level: 1,
            min_time_nanos: 1,
            max_time_nanos: 2,
            object_size: 0,
            samples: Section::default(),
            symbols: Section::default(),
            series: Vec::new(),
            rows: 0,
            profiles: 1,
            stack_nodes: 0,
            compacted_from: Vec::new(),
            rollups: Vec::new(),
            index: Default::default(),
            logs: Vec::new(),
        }
    }

    #[test]
    fn a_packed_list_may_come_value_by_value_and_unknown_fields_are_skipped() {
        let id = ulid::Ulid::from_parts(1_700_000_000_000, 7).to_string();
        let mut msg = pb::BlockMeta {
            format_version: BLOCK_FORMAT_VERSION,
            id,
            strings: vec!["".into(), "t".into(), "k".into(), "v".into(), "p".into()],
            ..Default::default()
        };
        msg.datasets.push(pb::Dataset {
            tenant: 1,
            rows: 5,
            ..Default::default()
        });
        let mut dataset = msg.datasets[0].encode_to_vec();
        // The series with its labels one by one (tag 2, varint), then an unknown group.
        let mut s = Vec::new();
        encode_key(1, WireType::Varint, &mut s);
        encode_varint(4, &mut s);
        for l in [2, 3] {
            encode_key(2, WireType::Varint, &mut s);
            encode_varint(l, &mut s);
        }
        encode_key(6, WireType::Varint, &mut s);
        encode_varint(5, &mut s);
        encode_key(20, WireType::StartGroup, &mut s);
        encode_key(1, WireType::Varint, &mut s);
        encode_varint(9, &mut s);
        encode_key(20, WireType::EndGroup, &mut s);
        put_bytes(10, &s, &mut dataset);
        msg.datasets.clear();
        let mut bytes = msg.encode_to_vec();
        put_bytes(9, &dataset, &mut bytes);
        put_bytes(99, b"later", &mut bytes);
        let got = decode(&bytes).unwrap();
        assert_eq!(got[0].tenant, "t");
        assert_eq!(got[0].series[0].labels, SeriesLabels::new([("k", "v")]));
        assert_eq!(&*got[0].series[0].profile_type, "p");
        assert_eq!(prost_decode(&bytes), Some(got));
    }
}
