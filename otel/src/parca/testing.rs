//! Builders of the Parca agent's Arrow records, with the agent's schemas column for column
//! (parca-dev/parca-agent `reporter/arrow.go` for v1, `reporter/arrow_v2.go` for v2), and of its
//! offline `.padata` files (`reporter/parca_reporter.go`), for tests here and in other crates.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BinaryArray, BooleanArray, DictionaryArray, FixedSizeBinaryArray, Int64Array,
    ListArray, ListViewArray, RecordBatch, RunArray, StringArray, StringViewArray, StructArray,
    TimestampNanosecondArray, UInt32Array, UInt64Array,
};
use arrow::buffer::{OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, Field, Fields, Int32Type, Schema, TimeUnit, UInt32Type};
use arrow::ipc::CompressionType;
use arrow::ipc::writer::{IpcWriteOptions, StreamWriter};

use super::{SCHEMA_VERSION_KEY, StackId};

/// A frame of a test stack: a symbolized function, or a native address in a mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TestFrame {
    Function { name: String, file: String },
    Native { address: u64, mapping: String },
}

impl TestFrame {
    pub fn function(name: &str) -> Self {
        Self::Function {
            name: name.to_owned(),
            file: format!("{name}.go"),
        }
    }
}

/// A sample row.
#[derive(Debug, Clone)]
pub struct TestSample {
    pub labels: Vec<(String, String)>,
    /// Leaf first.
    pub stack: Vec<TestFrame>,
    pub value: i64,
    pub timestamp: i64,
}

/// A stack's id as the agent would hash it (any 16 bytes do; these are a hash of the names).
pub fn stack_id(stack: &[TestFrame]) -> StackId {
    let mut h1: u64 = 0xcbf2_9ce4_8422_2325;
    let mut h2: u64 = 0x9e37_79b9_7f4a_7c15;
    for f in stack {
        let s = format!("{f:?}");
        for b in s.bytes() {
            h1 = (h1 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            h2 = (h2 ^ u64::from(b))
                .wrapping_mul(0xff51_afd7_ed55_8ccd)
                .rotate_left(7);
        }
    }
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&h1.to_be_bytes());
    id[8..].copy_from_slice(&h2.to_be_bytes());
    id
}

/// The profile type columns of a record: the agent's CPU samples unless changed.
#[derive(Debug, Clone)]
pub struct TestType {
    pub producer: String,
    pub sample_type: String,
    pub sample_unit: String,
    pub period_type: String,
    pub period_unit: String,
    pub period: i64,
    pub duration: i64,
}

impl Default for TestType {
    fn default() -> Self {
        Self {
            producer: "parca_agent".into(),
            sample_type: "samples".into(),
            sample_unit: "count".into(),
            period_type: "cpu".into(),
            period_unit: "nanoseconds".into(),
            period: 1_000_000_000 / 19,
            duration: 1_000_000_000,
        }
    }
}

fn metadata(version: &str) -> HashMap<String, String> {
    [(SCHEMA_VERSION_KEY.to_owned(), version.to_owned())]
        .into_iter()
        .collect()
}

/// Run ends of equal neighbours in `values` (a run per distinct stretch), and the run values.
fn runs<T: PartialEq + Clone>(values: &[T]) -> (Vec<i32>, Vec<T>) {
    let mut ends = Vec::new();
    let mut vals: Vec<T> = Vec::new();
    for (i, v) in values.iter().enumerate() {
        if vals.last() == Some(v) {
            *ends.last_mut().expect("a run") = i as i32 + 1;
        } else {
            vals.push(v.clone());
            ends.push(i as i32 + 1);
        }
    }
    (ends, vals)
}

fn ree(ends: Vec<i32>, values: &dyn Array) -> ArrayRef {
    Arc::new(
        RunArray::<Int32Type>::try_new(&ends.into_iter().collect(), values).expect("valid runs"),
    )
}

/// `REE<Int32, Dictionary<Uint32, Binary>>` (v1 strings), null for `None`.
fn ree_dict_binary(values: &[Option<String>]) -> ArrayRef {
    let (ends, vals) = runs(values);
    let mut dict: Vec<&str> = Vec::new();
    let keys: UInt32Array = vals
        .iter()
        .map(|v| {
            v.as_deref()
                .map(|v| match dict.iter().position(|d| *d == v) {
                    Some(p) => p as u32,
                    None => {
                        dict.push(v);
                        dict.len() as u32 - 1
                    }
                })
        })
        .collect();
    let values = BinaryArray::from_iter_values(dict.iter().map(|s| s.as_bytes()));
    let d = DictionaryArray::<UInt32Type>::try_new(keys, Arc::new(values)).expect("valid dict");
    ree(ends, &d)
}

/// `REE<Int32, Dictionary<Uint32, Utf8>>` (v2 labels).
fn ree_dict_string(values: &[Option<String>]) -> ArrayRef {
    let (ends, vals) = runs(values);
    let mut dict: Vec<&str> = Vec::new();
    let keys: UInt32Array = vals
        .iter()
        .map(|v| {
            v.as_deref()
                .map(|v| match dict.iter().position(|d| *d == v) {
                    Some(p) => p as u32,
                    None => {
                        dict.push(v);
                        dict.len() as u32 - 1
                    }
                })
        })
        .collect();
    let d = DictionaryArray::<UInt32Type>::try_new(keys, Arc::new(StringArray::from(dict)))
        .expect("valid dict");
    ree(ends, &d)
}

/// `REE<Int32, Utf8>` (v2 type columns).
fn ree_string(values: &[Option<String>]) -> ArrayRef {
    let (ends, vals) = runs(values);
    ree(ends, &StringArray::from(vals))
}

fn ree_i64(values: &[i64]) -> ArrayRef {
    let (ends, vals) = runs(values);
    ree(ends, &Int64Array::from(vals))
}

fn ree_u64(values: &[u64]) -> ArrayRef {
    let (ends, vals) = runs(values);
    ree(ends, &UInt64Array::from(vals))
}

fn dict_binary_type() -> DataType {
    DataType::Dictionary(Box::new(DataType::UInt32), Box::new(DataType::Binary))
}

fn ree_type(values: DataType) -> DataType {
    DataType::RunEndEncoded(
        Arc::new(Field::new("run_ends", DataType::Int32, false)),
        Arc::new(Field::new("values", values, true)),
    )
}

fn label_names(samples: &[TestSample]) -> Vec<String> {
    let mut names: Vec<String> = samples
        .iter()
        .flat_map(|s| s.labels.iter().map(|(k, _)| k.clone()))
        .collect();
    names.sort();
    names.dedup();
    names
}

fn label_values(samples: &[TestSample], name: &str) -> Vec<Option<String>> {
    samples
        .iter()
        .map(|s| {
            s.labels
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        })
        .collect()
}

/// A v1 sample record (`SampleWriter.NewRecord`): `labels.*` columns, then `stacktrace_id`,
/// `value`, `producer`, `sample_type`, `sample_unit`, `period_type`, `period_unit`,
/// `temporality`, `period`, `duration`, `timestamp`.
pub fn v1_sample_record(samples: &[TestSample], ty: &TestType) -> RecordBatch {
    let n = samples.len();
    let mut fields = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    for name in label_names(samples) {
        fields.push(Field::new(
            format!("labels.{name}"),
            ree_type(dict_binary_type()),
            true,
        ));
        columns.push(ree_dict_binary(&label_values(samples, &name)));
    }
    let (ends, vals) = runs(
        &samples
            .iter()
            .map(|s| stack_id(&s.stack))
            .collect::<Vec<_>>(),
    );
    let mut dict: Vec<StackId> = Vec::new();
    let keys: UInt32Array = vals
        .iter()
        .map(|v| {
            Some(match dict.iter().position(|d| d == v) {
                Some(p) => p as u32,
                None => {
                    dict.push(*v);
                    dict.len() as u32 - 1
                }
            })
        })
        .collect();
    let d = DictionaryArray::<UInt32Type>::try_new(
        keys,
        Arc::new(BinaryArray::from_iter_values(
            dict.iter().map(|d| d.as_slice()),
        )),
    )
    .expect("valid dict");
    fields.push(Field::new(
        "stacktrace_id",
        ree_type(dict_binary_type()),
        true,
    ));
    columns.push(ree(ends, &d));
    fields.push(Field::new("value", DataType::Int64, true));
    columns.push(Arc::new(Int64Array::from_iter_values(
        samples.iter().map(|s| s.value),
    )));
    let same = |v: &str| vec![Some(v.to_owned()); n];
    for (name, v) in [
        ("producer", same(&ty.producer)),
        ("sample_type", same(&ty.sample_type)),
        ("sample_unit", same(&ty.sample_unit)),
        ("period_type", same(&ty.period_type)),
        ("period_unit", same(&ty.period_unit)),
        (
            "temporality",
            if ty.duration == 0 {
                vec![None; n]
            } else {
                same("delta")
            },
        ),
    ] {
        fields.push(Field::new(name, ree_type(dict_binary_type()), true));
        columns.push(ree_dict_binary(&v));
    }
    for (name, v) in [
        ("period", vec![ty.period; n]),
        ("duration", vec![ty.duration; n]),
        (
            "timestamp",
            samples.iter().map(|s| s.timestamp).collect::<Vec<_>>(),
        ),
    ] {
        fields.push(Field::new(name, ree_type(DataType::Int64), true));
        columns.push(ree_i64(&v));
    }
    let schema = Schema::new(fields).with_metadata(metadata("v1"));
    RecordBatch::try_new(Arc::new(schema), columns).expect("a valid v1 sample record")
}

/// The v1 `lines` struct fields.
fn v1_line_fields() -> Fields {
    Fields::from(vec![
        Field::new("line", DataType::Int64, true),
        Field::new("column", DataType::UInt64, true),
        Field::new("function_name", dict_binary_type(), true),
        Field::new("function_system_name", dict_binary_type(), true),
        Field::new("function_filename", ree_type(dict_binary_type()), true),
        Field::new("function_start_line", DataType::Int64, true),
    ])
}

/// The v1 location struct fields (`LocationsField`).
fn v1_location_fields() -> Fields {
    Fields::from(vec![
        Field::new("address", DataType::UInt64, true),
        Field::new("frame_type", ree_type(dict_binary_type()), true),
        Field::new("mapping_start", ree_type(DataType::UInt64), true),
        Field::new("mapping_limit", ree_type(DataType::UInt64), true),
        Field::new("mapping_offset", ree_type(DataType::UInt64), true),
        Field::new("mapping_file", ree_type(dict_binary_type()), true),
        Field::new("mapping_build_id", ree_type(dict_binary_type()), true),
        Field::new(
            "lines",
            DataType::List(Arc::new(Field::new(
                "item",
                DataType::Struct(v1_line_fields()),
                true,
            ))),
            true,
        ),
    ])
}

fn dict_binary(values: &[Option<String>]) -> ArrayRef {
    let mut dict: Vec<&str> = Vec::new();
    let keys: UInt32Array = values
        .iter()
        .map(|v| {
            v.as_deref()
                .map(|v| match dict.iter().position(|d| *d == v) {
                    Some(p) => p as u32,
                    None => {
                        dict.push(v);
                        dict.len() as u32 - 1
                    }
                })
        })
        .collect();
    Arc::new(
        DictionaryArray::<UInt32Type>::try_new(
            keys,
            Arc::new(BinaryArray::from_iter_values(
                dict.iter().map(|s| s.as_bytes()),
            )),
        )
        .expect("valid dict"),
    )
}

/// A v1 locations record (`LocationsWriter.NewRecord`): `stacktrace_id`, `is_complete`,
/// `locations`; mapping start, limit and offset are 0 as the agent sends them.
pub fn v1_locations_record(stacks: &[Vec<TestFrame>]) -> RecordBatch {
    let mut addresses = Vec::new();
    let mut frame_types = Vec::new();
    let mut files = Vec::new();
    let mut build_ids = Vec::new();
    let mut loc_offsets = vec![0i32];
    let mut line_offsets = vec![0i32];
    let mut line_numbers = Vec::new();
    let mut names = Vec::new();
    let mut filenames = Vec::new();
    for stack in stacks {
        for f in stack {
            match f {
                TestFrame::Function { name, file } => {
                    addresses.push(0x1000u64);
                    frame_types.push(Some("go".to_owned()));
                    files.push(Some("/app/server".to_owned()));
                    build_ids.push(Some("b1d".to_owned()));
                    line_numbers.push(42i64);
                    names.push(Some(name.clone()));
                    filenames.push(Some(file.clone()));
                }
                TestFrame::Native { address, mapping } => {
                    addresses.push(*address);
                    frame_types.push(Some("native".to_owned()));
                    files.push(Some(mapping.clone()));
                    build_ids.push(None);
                }
            }
            line_offsets.push(line_numbers.len() as i32);
        }
        loc_offsets.push(addresses.len() as i32);
    }
    let n_lines = line_numbers.len();
    let lines = StructArray::new(
        v1_line_fields(),
        vec![
            Arc::new(Int64Array::from(line_numbers)),
            Arc::new(UInt64Array::from(vec![0u64; n_lines])),
            dict_binary(&names),
            dict_binary(&names),
            ree_dict_binary(&filenames),
            Arc::new(Int64Array::from(vec![1i64; n_lines])),
        ],
        None,
    );
    let n_locs = addresses.len();
    let lines = ListArray::new(
        Arc::new(Field::new("item", DataType::Struct(v1_line_fields()), true)),
        OffsetBuffer::new(ScalarBuffer::from(line_offsets)),
        Arc::new(lines),
        None,
    );
    let locations = StructArray::new(
        v1_location_fields(),
        vec![
            Arc::new(UInt64Array::from(addresses)),
            ree_dict_binary(&frame_types),
            ree_u64(&vec![0; n_locs]),
            ree_u64(&vec![0; n_locs]),
            ree_u64(&vec![0; n_locs]),
            ree_dict_binary(&files),
            ree_dict_binary(&build_ids),
            Arc::new(lines),
        ],
        None,
    );
    let locations_field = Field::new(
        "locations",
        DataType::List(Arc::new(Field::new(
            "item",
            DataType::Struct(v1_location_fields()),
            true,
        ))),
        true,
    );
    let locations = ListArray::new(
        Arc::new(Field::new(
            "item",
            DataType::Struct(v1_location_fields()),
            true,
        )),
        OffsetBuffer::new(ScalarBuffer::from(loc_offsets)),
        Arc::new(locations),
        None,
    );
    let ids = BinaryArray::from_iter_values(stacks.iter().map(|s| stack_id(s)));
    let schema = Schema::new(vec![
        Field::new("stacktrace_id", DataType::Binary, true),
        Field::new("is_complete", DataType::Boolean, true),
        locations_field,
    ])
    .with_metadata(metadata("v1"));
    RecordBatch::try_new(
        Arc::new(schema),
        vec![
            Arc::new(ids),
            Arc::new(BooleanArray::from(vec![true; stacks.len()])),
            Arc::new(locations),
        ],
    )
    .expect("a valid v1 locations record")
}

fn dict_string_type() -> DataType {
    DataType::Dictionary(Box::new(DataType::UInt32), Box::new(DataType::Utf8))
}

fn dict_string(values: &[Option<String>]) -> ArrayRef {
    let mut dict: Vec<&str> = Vec::new();
    let keys: UInt32Array = values
        .iter()
        .map(|v| {
            v.as_deref()
                .map(|v| match dict.iter().position(|d| *d == v) {
                    Some(p) => p as u32,
                    None => {
                        dict.push(v);
                        dict.len() as u32 - 1
                    }
                })
        })
        .collect();
    Arc::new(
        DictionaryArray::<UInt32Type>::try_new(keys, Arc::new(StringArray::from(dict)))
            .expect("valid dict"),
    )
}

/// `FunctionFieldTypeV2`.
fn v2_function_fields() -> Fields {
    Fields::from(vec![
        Field::new("system_name", DataType::Utf8View, true),
        Field::new("filename", dict_string_type(), true),
        Field::new("start_line", DataType::UInt64, false),
    ])
}

/// `LineFieldTypeV2`.
fn v2_line_fields() -> Fields {
    Fields::from(vec![
        Field::new("line", DataType::UInt64, false),
        Field::new("column", DataType::UInt64, false),
        Field::new(
            "function",
            DataType::Dictionary(
                Box::new(DataType::UInt32),
                Box::new(DataType::Struct(v2_function_fields())),
            ),
            false,
        ),
    ])
}

/// `LocationTypeV2`.
fn v2_location_fields() -> Fields {
    Fields::from(vec![
        Field::new("address", DataType::UInt64, false),
        Field::new("frame_type", dict_string_type(), true),
        Field::new("mapping_file", dict_string_type(), true),
        Field::new("mapping_build_id", dict_string_type(), true),
        Field::new(
            "lines",
            DataType::ListView(Arc::new(Field::new(
                "item",
                DataType::Struct(v2_line_fields()),
                true,
            ))),
            true,
        ),
    ])
}

/// A v2 sample record (`SampleWriterV2.NewRecord`): `labels` struct, `stacktrace`
/// (`ListView<Dictionary<Uint32, Location>>`, identical stacks sharing offset and size, locations
/// deduplicated), `stacktrace_id` (UUID extension), `value`, the type columns as
/// `REE<Int32, Utf8>`, `period`, `duration` (`REE<Int32, Uint64>`), `timestamp` (ns, UTC).
pub fn v2_sample_record(samples: &[TestSample], ty: &TestType) -> RecordBatch {
    let n = samples.len();
    // Locations, functions and stacks deduplicated as the agent's dictionary builders do.
    let mut locs: Vec<TestFrame> = Vec::new();
    let mut funcs: Vec<(String, String)> = Vec::new();
    let mut stack_of: Vec<(Vec<TestFrame>, i32, i32)> = Vec::new();
    let mut indices: Vec<u32> = Vec::new();
    let mut offsets = Vec::with_capacity(n);
    let mut sizes = Vec::with_capacity(n);
    for s in samples {
        if let Some((_, o, z)) = stack_of.iter().find(|(st, _, _)| *st == s.stack) {
            offsets.push(*o);
            sizes.push(*z);
            continue;
        }
        let o = indices.len() as i32;
        for f in &s.stack {
            let i = match locs.iter().position(|l| l == f) {
                Some(i) => i,
                None => {
                    locs.push(f.clone());
                    locs.len() - 1
                }
            };
            indices.push(i as u32);
        }
        let z = s.stack.len() as i32;
        stack_of.push((s.stack.clone(), o, z));
        offsets.push(o);
        sizes.push(z);
    }
    let mut addresses = Vec::new();
    let mut frame_types = Vec::new();
    let mut files = Vec::new();
    let mut build_ids = Vec::new();
    let mut line_offsets = Vec::new();
    let mut line_sizes = Vec::new();
    let mut line_funcs = Vec::new();
    let mut line_numbers = Vec::new();
    for l in &locs {
        line_offsets.push(line_funcs.len() as i32);
        match l {
            TestFrame::Function { name, file } => {
                addresses.push(0x1000u64);
                frame_types.push(Some("go".to_owned()));
                files.push(Some("/app/server".to_owned()));
                build_ids.push(Some("b1d".to_owned()));
                let key = (name.clone(), file.clone());
                let f = match funcs.iter().position(|x| *x == key) {
                    Some(f) => f,
                    None => {
                        funcs.push(key);
                        funcs.len() - 1
                    }
                };
                line_funcs.push(f as u32);
                line_numbers.push(42u64);
                line_sizes.push(1);
            }
            TestFrame::Native { address, mapping } => {
                addresses.push(*address);
                frame_types.push(Some("native".to_owned()));
                files.push(Some(mapping.clone()));
                build_ids.push(None);
                line_sizes.push(0);
            }
        }
    }
    let functions = StructArray::new(
        v2_function_fields(),
        vec![
            Arc::new(StringViewArray::from_iter_values(
                funcs.iter().map(|(n, _)| n.as_str()),
            )),
            dict_string(
                &funcs
                    .iter()
                    .map(|(_, f)| Some(f.clone()))
                    .collect::<Vec<_>>(),
            ),
            Arc::new(UInt64Array::from(vec![1u64; funcs.len()])),
        ],
        None,
    );
    let n_lines = line_funcs.len();
    let function_dict =
        DictionaryArray::<UInt32Type>::try_new(UInt32Array::from(line_funcs), Arc::new(functions))
            .expect("valid function dict");
    let lines = StructArray::new(
        v2_line_fields(),
        vec![
            Arc::new(UInt64Array::from(line_numbers)),
            Arc::new(UInt64Array::from(vec![0u64; n_lines])),
            Arc::new(function_dict),
        ],
        None,
    );
    // A location without lines is null (the server symbolizes it).
    let lines_nulls =
        arrow::buffer::NullBuffer::from(line_sizes.iter().map(|&z| z > 0).collect::<Vec<bool>>());
    let lines = ListViewArray::new(
        Arc::new(Field::new("item", DataType::Struct(v2_line_fields()), true)),
        ScalarBuffer::from(line_offsets),
        ScalarBuffer::from(line_sizes),
        Arc::new(lines),
        Some(lines_nulls),
    );
    let locations = StructArray::new(
        v2_location_fields(),
        vec![
            Arc::new(UInt64Array::from(addresses)),
            dict_string(&frame_types),
            dict_string(&files),
            dict_string(&build_ids),
            Arc::new(lines),
        ],
        None,
    );
    let location_dict_type = DataType::Dictionary(
        Box::new(DataType::UInt32),
        Box::new(DataType::Struct(v2_location_fields())),
    );
    let location_dict =
        DictionaryArray::<UInt32Type>::try_new(UInt32Array::from(indices), Arc::new(locations))
            .expect("valid location dict");
    let stacktrace = ListViewArray::new(
        Arc::new(Field::new("item", location_dict_type.clone(), true)),
        ScalarBuffer::from(offsets),
        ScalarBuffer::from(sizes),
        Arc::new(location_dict),
        None,
    );

    let names = label_names(samples);
    let label_fields: Vec<Field> = names
        .iter()
        .map(|k| Field::new(k, ree_type(dict_string_type()), true))
        .collect();
    let label_columns: Vec<ArrayRef> = names
        .iter()
        .map(|k| ree_dict_string(&label_values(samples, k)))
        .collect();
    let labels = if label_fields.is_empty() {
        StructArray::new_empty_fields(n, None)
    } else {
        StructArray::new(Fields::from(label_fields.clone()), label_columns, None)
    };
    let uuid_field = Field::new("stacktrace_id", DataType::FixedSizeBinary(16), true)
        .with_metadata(
            [("ARROW:extension:name".to_owned(), "arrow.uuid".to_owned())]
                .into_iter()
                .collect(),
        );
    let ids = FixedSizeBinaryArray::try_from_iter(samples.iter().map(|s| stack_id(&s.stack)))
        .expect("16-byte ids");
    let same = |v: &str| vec![Some(v.to_owned()); n];
    let mut fields = vec![
        Field::new(
            "labels",
            DataType::Struct(Fields::from(label_fields)),
            false,
        ),
        Field::new(
            "stacktrace",
            DataType::ListView(Arc::new(Field::new("item", location_dict_type, true))),
            true,
        ),
        uuid_field,
        Field::new("value", DataType::Int64, true),
    ];
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(labels),
        Arc::new(stacktrace),
        Arc::new(ids),
        Arc::new(Int64Array::from_iter_values(
            samples.iter().map(|s| s.value),
        )),
    ];
    for (name, v) in [
        ("producer", same(&ty.producer)),
        ("sample_type", same(&ty.sample_type)),
        ("sample_unit", same(&ty.sample_unit)),
        ("period_type", same(&ty.period_type)),
        ("period_unit", same(&ty.period_unit)),
        (
            "temporality",
            if ty.duration == 0 {
                vec![None; n]
            } else {
                same("delta")
            },
        ),
    ] {
        fields.push(Field::new(name, ree_type(DataType::Utf8), true));
        columns.push(ree_string(&v));
    }
    fields.push(Field::new("period", ree_type(DataType::Int64), true));
    columns.push(ree_i64(&vec![ty.period; n]));
    fields.push(Field::new("duration", ree_type(DataType::UInt64), true));
    columns.push(ree_u64(&vec![ty.duration as u64; n]));
    fields.push(Field::new(
        "timestamp",
        DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
        true,
    ));
    columns.push(Arc::new(
        TimestampNanosecondArray::from_iter_values(samples.iter().map(|s| s.timestamp))
            .with_timezone("UTC"),
    ));
    let schema = Schema::new(fields).with_metadata(metadata("v2"));
    RecordBatch::try_new(Arc::new(schema), columns).expect("a valid v2 sample record")
}

/// The record as an Arrow IPC stream, its buffers LZ4-compressed when `lz4` (as the agent sends
/// `WriteArrow`).
pub fn ipc(batch: &RecordBatch, lz4: bool) -> Vec<u8> {
    let options = IpcWriteOptions::default()
        .try_with_compression(lz4.then_some(CompressionType::LZ4_FRAME))
        .expect("lz4 is built in");
    let mut buf = Vec::new();
    let mut w = StreamWriter::try_new_with_options(&mut buf, &batch.schema(), options)
        .expect("a stream writer");
    w.write(batch).expect("the record writes");
    w.finish().expect("the stream ends");
    drop(w);
    buf
}

/// One batch of an offline file: v1 (sample record, locations record) or v2 (one record).
#[derive(Debug, Clone)]
pub enum PadataBatch {
    V1 {
        samples: Vec<u8>,
        locations: Vec<u8>,
    },
    V2(Vec<u8>),
}

/// An offline `.padata` file's bytes: the header (magic, version 0, `n_batches`), then each
/// batch's frames (`u32` big-endian length + an IPC stream). `torn_tail` appends the start of a
/// batch the header does not count, as a crash between write and fsync leaves it.
pub fn padata(batches: &[PadataBatch], torn_tail: bool) -> Vec<u8> {
    let mut out = vec![0xA6, 0xE7, 0xCC, 0xCA, 0, 0];
    out.extend_from_slice(&(batches.len() as u16).to_be_bytes());
    let frame = |out: &mut Vec<u8>, bytes: &[u8]| {
        out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        out.extend_from_slice(bytes);
    };
    for b in batches {
        match b {
            PadataBatch::V1 { samples, locations } => {
                frame(&mut out, samples);
                frame(&mut out, locations);
            }
            PadataBatch::V2(record) => frame(&mut out, record),
        }
    }
    if torn_tail {
        let bytes = batches.first().map_or_else(
            || vec![0xFF; 64],
            |b| match b {
                PadataBatch::V1 { samples, .. } => samples.clone(),
                PadataBatch::V2(r) => r.clone(),
            },
        );
        out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        out.extend_from_slice(&bytes[..bytes.len() / 2]);
    }
    out
}
