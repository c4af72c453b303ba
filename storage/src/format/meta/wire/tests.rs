//! prost's own path, as earlier builds wrote and read the metadata, is the oracle: prost
//! reads these bytes into the message it would have built itself, and whatever prost's path
//! reads (or refuses), this reader reads (or refuses) alike.

use super::{
    BLOCK_FORMAT_VERSION, BlockMeta, LogCheckpoint, MIN_BLOCK_FORMAT_VERSION, Rollup, Section,
    SeriesMeta,
};
use crate::error::DecodeError;
use crate::format::series_labels::LabelTableBuilder;
use prost::encoding::{WireType, encode_key, encode_varint};
use std::sync::Arc;

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
            received_ms: 0,
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
                prop::collection::vec(prop::collection::vec((0..1u64 << 50, 0..1u64 << 20), n), 3),
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
                received_ms: 0,
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
        received_ms: 0,
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
