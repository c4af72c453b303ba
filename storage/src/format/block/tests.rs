use arrow::array::{AsArray, FixedSizeBinaryArray, RecordBatch};
use bytes::Bytes;
use kiln_otel::model::NormalizedProfile;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use std::sync::Arc;

use std::collections::HashSet;

use arrow::datatypes::{Int64Type, UInt32Type};
use kiln_otel::model::ProfileType;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use super::builder::write_parquet;
use super::rows::sort_by_series_and_time;
use super::*;
use crate::format::symbols::SymbolTable;
use crate::testing::{frames, profile};

proptest::proptest! {
    /// Sorting the runs of one (series, timestamp) is the stable sort of the rows.
    #[test]
    fn rows_sorted_by_their_runs_as_a_stable_sort_sorts_them(
        keys in proptest::collection::vec((0u32..4, 0i64..3, 1usize..4), 0..40),
    ) {
        let mut rows = Vec::new();
        for (series, timestamp, n) in keys {
            for _ in 0..n {
                rows.push(Row {
                    series,
                    timestamp,
                    stack: rows.len() as u32,
                    value: 1,
                    span_id: 0,
                    trace_id: None,
                    labels: None,
                    profile_id: None,
                });
            }
        }
        let mut expected = rows.clone();
        expected.sort_by_key(|r| (r.series, r.timestamp));
        proptest::prop_assert_eq!(sort_by_series_and_time(rows), expected);
    }
}

/// A segment's optional columns that hold nothing are written uncompressed, the rest with
/// LZ4 (no codec context to make per column chunk); the file reads back the same, and
/// tells which columns it left blank.
#[test]
fn blank_columns_are_written_uncompressed() {
    use parquet::file::reader::FileReader;
    let row = |i: u32, span: u64, labels: bool| Row {
        series: 0,
        timestamp: i64::from(i),
        stack: i,
        value: 1,
        span_id: span,
        trace_id: None,
        labels: labels.then(|| Arc::from("thread=1")),
        profile_id: Some([i as u8; 16]),
    };
    let blank_of = |rows: &[Row]| {
        let mut b = RowBatchBuilder::default();
        rows.iter().for_each(|r| b.push(r));
        let batch = b.finish().expect("a batch");
        let file = write_parquet(&batch).unwrap();
        let reader =
            parquet::file::serialized_reader::SerializedFileReader::new(file.clone()).unwrap();
        let compressed: Vec<bool> = reader.metadata().row_groups()[0]
            .columns()
            .iter()
            .map(|c| match c.compression() {
                Compression::UNCOMPRESSED => false,
                Compression::LZ4_RAW => true,
                other => panic!("a segment's column chunk in {other:?}"),
            })
            .collect();
        let back: Vec<RecordBatch> = ParquetRecordBatchReaderBuilder::try_new(file)
            .unwrap()
            .build()
            .unwrap()
            .map(|b| b.unwrap())
            .collect();
        assert_eq!(back, std::slice::from_ref(&batch));
        let blank = Blank::of_parquet(reader.metadata());
        assert_eq!(blank, Blank::of_batch(&batch));
        (blank, compressed)
    };
    // Spans 0, no trace ids, no labels: those three blank, profile ids not.
    let (blank, compressed) = blank_of(&(0..50).map(|i| row(i, 0, false)).collect::<Vec<_>>());
    assert_eq!(blank, Blank::rollup(true));
    assert_eq!(
        compressed,
        [true, true, true, true, false, false, false, true]
    );
    // One span and one row's labels: only trace ids blank.
    let mut rows: Vec<Row> = (0..50).map(|i| row(i, 0, false)).collect();
    rows[7].span_id = 42;
    rows[9].labels = Some(Arc::from("thread=2"));
    let (blank, compressed) = blank_of(&rows);
    assert_eq!(
        compressed,
        [true, true, true, true, true, false, true, true]
    );
    assert_eq!(blank.and(Blank::rollup(false)), blank);
    assert_eq!(Blank::rollup(true).and(blank), blank);
    // A file written with every column compressed (as before this rule) leaves none blank.
    let mut b = RowBatchBuilder::default();
    (0..10).for_each(|i| b.push(&row(i, 0, false)));
    let batch = b.finish().expect("a batch");
    let mut out = Vec::new();
    let props = writer_properties(1024, Pages::Fresh, Blank::NONE).unwrap();
    let mut w = ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let reader =
        parquet::file::serialized_reader::SerializedFileReader::new(Bytes::from(out)).unwrap();
    assert_eq!(Blank::of_parquet(reader.metadata()), Blank::NONE);
    // Merged blocks' pages stay zstd.
    for c in reader.metadata().row_groups()[0].columns() {
        assert!(matches!(c.compression(), Compression::ZSTD(_)));
    }
}

/// A batch builder used again after `finish` (as a compaction output or a rollup uses
/// one, its room kept) makes the batches fresh builders make, in either mode.
#[test]
fn a_batch_builder_used_again_makes_the_same_batches() {
    let row = |i: u32| Row {
        series: i % 3,
        timestamp: 1_000 + i64::from(i),
        stack: i * 7,
        value: i64::from(i) * 10 + 1,
        span_id: u64::from(i % 2) * 99,
        trace_id: i.is_multiple_of(3).then_some([i as u8; 16]),
        labels: (i % 4 == 1).then(|| Arc::from(format!("thread={i}").as_str())),
        profile_id: (!i.is_multiple_of(5)).then_some([7; 16]),
    };
    let rows: Vec<Row> = (0..40).map(row).collect();
    // Batches of 17, 17 and 6 rows: the second fills the room the first left, the third
    // stays within it.
    let parts: Vec<&[Row]> = rows.chunks(17).collect();
    for totals in [false, true] {
        let fresh = || {
            if totals {
                RowBatchBuilder::profile_totals()
            } else {
                RowBatchBuilder::default()
            }
        };
        let push = |b: &mut RowBatchBuilder, part: &[Row]| {
            for (i, r) in part.iter().enumerate() {
                if totals {
                    b.push_total(r, i as u64 * 3);
                } else {
                    b.push(r);
                }
            }
        };
        let mut reused = fresh();
        for (i, part) in parts.iter().enumerate() {
            push(&mut reused, part);
            let got = if i + 1 == parts.len() {
                std::mem::take(&mut reused).into_batch().expect("a batch")
            } else {
                reused.finish().expect("a batch")
            };
            assert!(reused.is_empty());
            let mut once = fresh();
            push(&mut once, part);
            let want = once.finish().expect("a batch");
            assert_eq!(got, want, "batch {i}, profile totals: {totals}");
            assert_eq!(got.num_rows(), part.len());
            // The id columns are arrow's own array of those ids, nulls where none.
            for (column, id) in [
                (
                    col::TRACE_ID,
                    (|r: &Row| r.trace_id) as fn(&Row) -> Option<[u8; 16]>,
                ),
                (col::PROFILE_ID, |r: &Row| r.profile_id),
            ] {
                let ids =
                    FixedSizeBinaryArray::try_from_sparse_iter_with_size(part.iter().map(id), 16)
                        .expect("16-byte ids");
                assert_eq!(got.column(column).as_fixed_size_binary(), &ids);
            }
        }
    }
}

/// A dataset started with room for another's contents (as a shard starts a tenant's next
/// segment) holds and writes the same.
#[test]
fn a_dataset_with_room_reserved_builds_the_same() {
    let stacks = [(frames("main;a;b"), 1), (frames("main;c"), 2)];
    let profiles: Vec<NormalizedProfile> = (0..6)
        .map(|i| profile(&format!("svc{}", i % 2), &stacks, 1_000 * (i + 1)))
        .collect();
    let build = |mut b: DatasetBuilder| {
        for p in &profiles {
            b.add(p);
        }
        b
    };
    let first = build(DatasetBuilder::new("t"));
    let hint = first.capacity_hint();
    assert_ne!(hint, DatasetCapacity::default());
    let again = build(DatasetBuilder::with_capacity("t", hint));
    assert_eq!(again.capacity_hint(), hint);
    assert_eq!(again.estimated_bytes(), first.estimated_bytes());
    let (a, b) = (
        first.finish().expect("built"),
        again.finish().expect("built"),
    );
    assert_eq!(a.symbols, b.symbols);
    assert_eq!(a.meta.series, b.meta.series);
    assert_eq!(a.meta.rows, b.meta.rows);
    // A block's table, read back, asks for the room its writer held (a compaction output
    // starts with the largest of its sources').
    let table = SymbolTable::decode(&a.symbols).expect("decodes");
    assert_eq!(table.capacity_hint(), hint.symbols);
}

/// A series met again, in the same profile or a later one, is the same series; one that
/// differs in a label or in its profile type is another.
#[test]
fn a_series_met_again_is_found_by_its_type_and_labels() {
    let stacks = [(frames("main;a"), 1), (frames("main;b"), 2)];
    let mut builder = DatasetBuilder::new("t");
    let first = profile("svc", &stacks, 1_000);
    builder.add(&first);
    builder.add(&profile("svc", &stacks, 2_000));
    builder.add(&profile("other", &stacks, 3_000));
    let mut labelled = profile("svc", &stacks, 4_000);
    labelled.series[0].labels.set("pod".into(), "p1".into());
    builder.add(&labelled);
    let mut typed = profile("svc", &stacks, 5_000);
    typed.series[0].profile_type =
        ProfileType::parse("process_cpu:samples:count:cpu:nanoseconds").expect("a type");
    builder.add(&typed);
    builder.add(&profile("svc", &stacks, 6_000));
    let built = builder.finish().expect("built");
    let mut got: Vec<(String, String, String, u64, i64, i64)> = built
        .meta
        .series
        .iter()
        .map(|s| {
            (
                s.profile_type.to_string(),
                s.label("service_name").unwrap_or_default().to_owned(),
                s.label("pod").unwrap_or_default().to_owned(),
                s.rows,
                s.min_time_nanos,
                s.max_time_nanos,
            )
        })
        .collect();
    got.sort();
    let cpu = first.series[0].profile_type.id();
    let samples = typed.series[0].profile_type.id();
    let row = |t: &str, svc: &str, pod: &str, rows, min, max| {
        (t.to_owned(), svc.to_owned(), pod.to_owned(), rows, min, max)
    };
    let mut want = vec![
        row(&cpu, "svc", "", 6, 1_000, 6_000),
        row(&cpu, "other", "", 2, 3_000, 3_000),
        row(&cpu, "svc", "p1", 2, 4_000, 4_000),
        row(&samples, "svc", "", 2, 5_000, 5_000),
    ];
    want.sort();
    assert_eq!(got, want);
}

/// A profile's series share their stacks (the walk of each distinct stack is reused across
/// series): every row still names its own sample's stack, in every series, including a
/// stack only one series has and a series whose samples come in another order.
#[test]
fn series_of_one_profile_share_stacks_and_each_row_keeps_its_own() {
    let stacks = [
        (frames("main;a;b"), 1),
        (frames("main;a;c"), 2),
        (frames("main;d"), 3),
    ];
    let mut p = profile("svc", &stacks, 1_000);
    let mut second = p.series[0].clone();
    second.profile_type =
        ProfileType::parse("process_cpu:samples:count:cpu:nanoseconds").expect("a profile type");
    second.samples.reverse();
    for s in &mut second.samples {
        s.value *= 10;
    }
    // Only this series has the root alone (a prefix of the others' stacks).
    let mut root = second.samples[0].clone();
    root.stack = vec![*root.stack.last().expect("a frame")];
    root.value = 70;
    second.samples.push(root);
    p.series.push(second);

    let mut builder = DatasetBuilder::new("t");
    builder.add(&p);
    let built = builder.finish().expect("built");
    let symbols = SymbolTable::decode(&built.symbols).expect("symbols");
    let mut got = HashSet::new();
    let mut locations = Vec::new();
    let reader = ParquetRecordBatchReaderBuilder::try_new(built.samples.clone())
        .expect("parquet")
        .build()
        .expect("reader");
    for batch in reader {
        let batch = batch.expect("batch");
        let series = batch.column(0).as_primitive::<UInt32Type>();
        let stack = batch.column(2).as_primitive::<UInt32Type>();
        let value = batch.column(3).as_primitive::<Int64Type>();
        for r in 0..batch.num_rows() {
            symbols.stack_locations(stack.value(r), &mut locations);
            let names: Vec<&str> = locations
                .iter()
                .rev()
                .flat_map(|&l| symbols.location_function_names(l))
                .collect();
            let id = &built.meta.series[series.value(r) as usize].profile_type;
            let sample_type = id.split(':').nth(1).expect("a profile type id");
            got.insert((sample_type.to_owned(), names.join(";"), value.value(r)));
        }
    }
    let want: HashSet<(String, String, i64)> = [
        ("cpu", "main;a;b", 1),
        ("cpu", "main;a;c", 2),
        ("cpu", "main;d", 3),
        ("samples", "main;a;b", 10),
        ("samples", "main;a;c", 20),
        ("samples", "main;d", 30),
        ("samples", "main", 70),
    ]
    .into_iter()
    .map(|(t, s, v)| (t.to_owned(), s.to_owned(), v))
    .collect();
    assert_eq!(got, want);
}

/// Profile ids are version 7 UUIDs, distinct across threads, with the process's bits the
/// same in each and the counter in the last five bytes.
#[test]
fn profile_ids_are_distinct_version_7_uuids() {
    let ids: Vec<[u8; 16]> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..4)
            .map(|_| s.spawn(|| (0..10_000).map(|_| new_profile_id()).collect::<Vec<_>>()))
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect()
    });
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), ids.len());
    for id in &ids {
        let uuid = uuid::Uuid::from_bytes(*id);
        assert_eq!(uuid.get_version_num(), 7);
        assert_eq!(uuid.get_variant(), uuid::Variant::RFC4122);
        assert_eq!(id[6] & 0x0f, ids[0][6] & 0x0f, "the process's bits");
        assert_eq!(id[7..11], ids[0][7..11], "the process's bits");
    }
    let counter = |id: &[u8; 16]| {
        let mut n = [0u8; 8];
        n[3..].copy_from_slice(&id[11..]);
        u64::from_be_bytes(n)
    };
    let (a, b) = (new_profile_id(), new_profile_id());
    let step = counter(&b).wrapping_sub(counter(&a)) & ((1 << 40) - 1);
    assert!((1..1 << 30).contains(&step), "one process counts up");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let (secs, _) = uuid::Uuid::from_bytes(b).get_timestamp().unwrap().to_unix();
    assert!(secs.abs_diff(now / 1000) <= 1, "the time comes first");
}
