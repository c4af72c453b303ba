//! The Parca agent's Arrow write formats → [`NormalizedProfile`].
//!
//! Two record shapes arrive (parca-dev/parca-agent `reporter/arrow.go`, `reporter/arrow_v2.go`;
//! the server side is parca-dev/parca `pkg/normalizer/arrow.go`, `arrow_v2.go`), told apart by the
//! schema metadata `parca_write_schema_version`:
//!
//! - **v1** (`Write` stream): a sample record whose rows name their stack by a 16-byte
//!   `stacktrace_id`, and a separate *locations record* (`stacktrace_id`, `is_complete`,
//!   `locations: List<Struct>`) with the stacks the server asked for;
//! - **v2** (`WriteArrow`): a sample record with the stacks inline (`stacktrace:
//!   ListView<Dictionary<Struct location>>`).
//!
//! Columns are read by name and through any of the encodings the agent uses (run-end encoded,
//! dictionary, view and plain arrays), so both versions share one reader. Rows map to Kiln's model
//! as Parca maps them: `producer` is the profile name (`__name__`), `sample_type`/`sample_unit`
//! and `period_type`/`period_unit` make the profile type, `duration` is kept (0 means a
//! cumulative profile), values are stored as sent, `labels.*` are series labels except the
//! agent's per-sample ones ([`SAMPLE_LABELS`]), which stay with each sample.

use std::io::Cursor;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BinaryArray, RecordBatch, StructArray};
use arrow::datatypes::{
    DataType, Field, Int8Type, Int16Type, Int32Type, Int64Type, Schema, TimeUnit,
    TimestampNanosecondType, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;

use crate::labels::validate_series_labels;
use crate::model::{
    Function, LABEL_NAME, LABEL_SERVICE_NAME, Labels, Line, Lines, Location, Mapping,
    NormalizedProfile, ProfileType, Series, Symbols, UNKNOWN_SERVICE,
};
use crate::normalize::NormalizeLimits;
use crate::normalize::kernel::{self, FastMap, SampleKey, SeriesBuilder, UnsymbolizedFunctions};
use crate::{Error, Result};

/// A stack's id: the agent's 16-byte trace hash.
pub type StackId = [u8; 16];

/// The schema metadata key naming a record's version (`v1`, `v2`).
pub const SCHEMA_VERSION_KEY: &str = "parca_write_schema_version";

/// Label names the agent sets per sample (the CPU and thread a sample was taken on): kept with
/// each sample, so a process is one series however many threads it has.
pub const SAMPLE_LABELS: [&str; 3] = ["cpu", "thread_id", "thread_comm"];

/// One year of nanoseconds: an earlier row time is taken for a missing one.
const NANOS_1971: i64 = 365 * 24 * 3600 * 1_000_000_000;

/// Label column prefix of v1 sample records.
const LABEL_PREFIX: &str = "labels.";

/// A function of a frame.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ParcaFunction {
    pub name: String,
    pub system_name: String,
    pub filename: String,
    pub start_line: i64,
}

/// One line of a frame (several: inlined functions, innermost first).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ParcaLine {
    pub line: i64,
    pub function: Option<ParcaFunction>,
}

/// A frame's mapping.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ParcaMapping {
    pub file: String,
    pub build_id: String,
    pub start: u64,
    pub limit: u64,
    pub offset: u64,
}

/// A self-contained frame: no lines means an unsymbolized native frame.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ParcaFrame {
    pub address: u64,
    pub frame_type: String,
    pub mapping: Option<ParcaMapping>,
    pub lines: Vec<ParcaLine>,
}

/// A stack, leaf first, shared between records and the gateway's known-stack cache.
pub type Stack = Arc<[ParcaFrame]>;

/// The bytes a stack holds (what a cache of stacks is bounded by): its strings and fixed parts.
pub fn stack_weight(stack: &Stack) -> usize {
    let function = |f: &ParcaFunction| f.name.len() + f.system_name.len() + f.filename.len() + 8;
    stack
        .iter()
        .map(|frame| {
            48 + frame.frame_type.len()
                + frame
                    .mapping
                    .as_ref()
                    .map_or(0, |m| m.file.len() + m.build_id.len() + 24)
                + frame
                    .lines
                    .iter()
                    .map(|l| 8 + l.function.as_ref().map_or(0, function))
                    .sum::<usize>()
        })
        .sum::<usize>()
        + 32
}

/// Where a sample's stack is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StackRef {
    /// A v1 row: by id, in a locations record or a cache.
    Id(StackId),
    /// A v2 row: an index into [`SampleRecord::stacks`].
    Inline(u32),
}

/// The series-level columns of a row.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct SeriesKey {
    /// `labels.*` but [`SAMPLE_LABELS`], sorted by name, empty values left out.
    pub labels: Vec<(String, String)>,
    pub producer: String,
    pub sample_type: String,
    pub sample_unit: String,
    pub period_type: String,
    pub period_unit: String,
    pub period: i64,
    /// Nanoseconds; 0 means a cumulative profile.
    pub duration: i64,
}

/// A row of a sample record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleRow {
    /// Index into [`SampleRecord::keys`].
    pub key: u32,
    /// Index into [`SampleRecord::sample_labels`].
    pub sample_labels: u32,
    pub stack: StackRef,
    pub value: i64,
    /// Unix nanoseconds.
    pub timestamp: i64,
}

/// A decoded sample record (v1 or v2).
#[derive(Debug, Clone, Default)]
pub struct SampleRecord {
    pub keys: Vec<SeriesKey>,
    /// Distinct per-sample label sets, sorted by name.
    pub sample_labels: Vec<Vec<(String, String)>>,
    pub rows: Vec<SampleRow>,
    /// The inline stacks of a v2 record.
    pub stacks: Vec<Stack>,
}

impl SampleRecord {
    /// The distinct stack ids of a v1 record's rows, in the order first seen.
    pub fn stack_ids(&self) -> Vec<StackId> {
        let mut seen = FastMap::default();
        let mut ids = Vec::new();
        for row in &self.rows {
            if let StackRef::Id(id) = row.stack
                && seen.insert(id, ()).is_none()
            {
                ids.push(id);
            }
        }
        ids
    }
}

/// The record batches of an Arrow IPC stream (compressed buffers too), after [`ipc::check`]:
/// every buffer inside its message, at most `max_bytes` of them once decompressed.
///
/// arrow's reader asserts, rather than returning an error, on malformed layouts the check does
/// not foresee; such a panic is contained here and answered as invalid input (the reader's
/// state is local to this call, so nothing is left half-changed).
pub fn read_ipc(bytes: &[u8], max_bytes: usize) -> Result<Vec<RecordBatch>> {
    ipc::check(bytes, max_bytes)?;
    std::panic::catch_unwind(|| read_ipc_unguarded(bytes)).unwrap_or_else(|_| {
        Err(Error::Invalid(
            "invalid Arrow IPC stream: a buffer lies outside its message".into(),
        ))
    })
}

fn read_ipc_unguarded(bytes: &[u8]) -> Result<Vec<RecordBatch>> {
    let reader = StreamReader::try_new(Cursor::new(bytes), None)
        .map_err(|e| Error::Invalid(format!("invalid Arrow IPC stream: {e}")))?;
    reader
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::Invalid(format!("invalid Arrow IPC stream: {e}")))
}

/// The record's `parca_write_schema_version`.
pub fn schema_version(batch: &RecordBatch) -> Option<&str> {
    batch
        .schema_ref()
        .metadata()
        .get(SCHEMA_VERSION_KEY)
        .map(String::as_str)
}

/// Whether a record is a v1 locations record (rather than a sample record).
pub fn is_locations_record(batch: &RecordBatch) -> bool {
    batch.schema_ref().column_with_name("locations").is_some()
        && batch.schema_ref().column_with_name("value").is_none()
}

fn invalid(what: impl std::fmt::Display) -> Error {
    Error::Invalid(what.to_string())
}

fn column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef> {
    batch
        .column_by_name(name)
        .ok_or_else(|| invalid(format!("the record has no column {name:?}")))
}

fn check_row(arr: &dyn Array, i: usize) -> Result<()> {
    if i >= arr.len() {
        return Err(invalid(format!(
            "row {i} past the column's {} rows",
            arr.len()
        )));
    }
    Ok(())
}

/// For a run-end encoded or dictionary array, its values and the index of row `i` in them
/// (`None` for a null key); `None` when the array is neither.
type Unwrapped<'a> = Option<(&'a ArrayRef, Option<usize>)>;

fn unwrap_index(arr: &dyn Array, i: usize) -> Result<Unwrapped<'_>> {
    Ok(match arr.data_type() {
        DataType::RunEndEncoded(ends, _) => {
            check_row(arr, i)?;
            let (values, p) = match ends.data_type() {
                DataType::Int16 => {
                    let r = arr.as_run::<Int16Type>();
                    (r.values(), r.get_physical_index(i))
                }
                DataType::Int32 => {
                    let r = arr.as_run::<Int32Type>();
                    (r.values(), r.get_physical_index(i))
                }
                DataType::Int64 => {
                    let r = arr.as_run::<Int64Type>();
                    (r.values(), r.get_physical_index(i))
                }
                other => return Err(invalid(format!("run ends of type {other}"))),
            };
            Some((values, Some(p)))
        }
        DataType::Dictionary(_, _) => {
            check_row(arr, i)?;
            let d = arr.as_any_dictionary();
            if d.keys().is_null(i) {
                return Ok(Some((d.values(), None)));
            }
            let k = int_at(d.keys(), i)?.unwrap_or(-1);
            let k = usize::try_from(k)
                .ok()
                .filter(|&k| k < d.values().len())
                .ok_or_else(|| invalid(format!("dictionary key {k} out of range")))?;
            Some((d.values(), Some(k)))
        }
        _ => None,
    })
}

/// Dictionaries and run-end encodings inside each other that Kiln reads through (the agent
/// uses two at most).
const MAX_ENCODING_DEPTH: usize = 8;

/// Row `i` of `arr` through its dictionaries and run-end encodings, without recursion: the
/// plain array and the row in it, `None` for a null key.
fn resolve(mut arr: &dyn Array, mut i: usize) -> Result<Option<(&dyn Array, usize)>> {
    for _ in 0..=MAX_ENCODING_DEPTH {
        match unwrap_index(arr, i)? {
            None => return Ok(Some((arr, i))),
            Some((_, None)) => return Ok(None),
            Some((values, Some(j))) => {
                arr = values.as_ref();
                i = j;
            }
        }
    }
    Err(invalid(format!(
        "a column nests more than {MAX_ENCODING_DEPTH} dictionary or run-end encodings"
    )))
}

/// The bytes of a string or binary value at row `i` (`None` when null).
fn bytes_at(arr: &dyn Array, i: usize) -> Result<Option<&[u8]>> {
    let Some((arr, i)) = resolve(arr, i)? else {
        return Ok(None);
    };
    check_row(arr, i)?;
    if arr.is_null(i) {
        return Ok(None);
    }
    Ok(Some(match arr.data_type() {
        DataType::Utf8 => arr.as_string::<i32>().value(i).as_bytes(),
        DataType::LargeUtf8 => arr.as_string::<i64>().value(i).as_bytes(),
        DataType::Utf8View => arr.as_string_view().value(i).as_bytes(),
        DataType::Binary => arr.as_binary::<i32>().value(i),
        DataType::LargeBinary => arr.as_binary::<i64>().value(i),
        DataType::BinaryView => arr.as_binary_view().value(i),
        DataType::FixedSizeBinary(_) => arr.as_fixed_size_binary().value(i),
        other => return Err(invalid(format!("a string column of type {other}"))),
    }))
}

fn str_at(arr: &dyn Array, i: usize) -> Result<String> {
    Ok(bytes_at(arr, i)?
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default())
}

/// The integer at row `i` (`None` when null); unsigned values past `i64::MAX` are refused.
fn int_at(arr: &dyn Array, i: usize) -> Result<Option<i64>> {
    let Some((arr, i)) = resolve(arr, i)? else {
        return Ok(None);
    };
    check_row(arr, i)?;
    if arr.is_null(i) {
        return Ok(None);
    }
    let big = |v: u64| i64::try_from(v).map_err(|_| invalid(format!("value {v} past 63 bits")));
    Ok(Some(match arr.data_type() {
        DataType::Int8 => i64::from(arr.as_primitive::<Int8Type>().value(i)),
        DataType::Int16 => i64::from(arr.as_primitive::<Int16Type>().value(i)),
        DataType::Int32 => i64::from(arr.as_primitive::<Int32Type>().value(i)),
        DataType::Int64 => arr.as_primitive::<Int64Type>().value(i),
        DataType::UInt8 => i64::from(arr.as_primitive::<UInt8Type>().value(i)),
        DataType::UInt16 => i64::from(arr.as_primitive::<UInt16Type>().value(i)),
        DataType::UInt32 => i64::from(arr.as_primitive::<UInt32Type>().value(i)),
        DataType::UInt64 => big(arr.as_primitive::<UInt64Type>().value(i))?,
        DataType::Timestamp(TimeUnit::Nanosecond, _) => {
            arr.as_primitive::<TimestampNanosecondType>().value(i)
        }
        other => return Err(invalid(format!("an integer column of type {other}"))),
    }))
}

/// An address or mapping bound: a u64 column read without the 63-bit limit of [`int_at`].
fn u64_at(arr: &dyn Array, i: usize) -> Result<u64> {
    let Some((arr, i)) = resolve(arr, i)? else {
        return Ok(0);
    };
    check_row(arr, i)?;
    if arr.is_null(i) {
        return Ok(0);
    }
    match arr.data_type() {
        DataType::UInt64 => Ok(arr.as_primitive::<UInt64Type>().value(i)),
        _ => Ok(int_at(arr, i)?.unwrap_or(0) as u64),
    }
}

/// The range of list `i` in its child values, for list and list-view arrays; `None` when null.
fn list_range(arr: &dyn Array, i: usize) -> Result<Option<(&ArrayRef, usize, usize)>> {
    check_row(arr, i)?;
    if arr.is_null(i) {
        return Ok(None);
    }
    let (values, start, len) = match arr.data_type() {
        DataType::List(_) => {
            let l = arr.as_list::<i32>();
            let o = l.value_offsets();
            (l.values(), i64::from(o[i]), i64::from(o[i + 1] - o[i]))
        }
        DataType::LargeList(_) => {
            let l = arr.as_list::<i64>();
            let o = l.value_offsets();
            (l.values(), o[i], o[i + 1] - o[i])
        }
        DataType::ListView(_) => {
            let l = arr.as_list_view::<i32>();
            (
                l.values(),
                i64::from(l.value_offsets()[i]),
                i64::from(l.value_sizes()[i]),
            )
        }
        DataType::LargeListView(_) => {
            let l = arr.as_list_view::<i64>();
            (l.values(), l.value_offsets()[i], l.value_sizes()[i])
        }
        other => return Err(invalid(format!("a list column of type {other}"))),
    };
    let start = usize::try_from(start).map_err(|_| invalid("a negative list offset"))?;
    let len = usize::try_from(len).map_err(|_| invalid("a negative list size"))?;
    if start.checked_add(len).is_none_or(|end| end > values.len()) {
        return Err(invalid("a list past its values"));
    }
    Ok(Some((values, start, start + len)))
}

/// The struct (and its row) at row `i`, through dictionaries and run-end encoding.
fn struct_at(arr: &dyn Array, i: usize) -> Result<Option<(&StructArray, usize)>> {
    let Some((arr, i)) = resolve(arr, i)? else {
        return Ok(None);
    };
    check_row(arr, i)?;
    if arr.is_null(i) {
        return Ok(None);
    }
    let s = arr
        .as_struct_opt()
        .ok_or_else(|| invalid(format!("a struct column of type {}", arr.data_type())))?;
    Ok(Some((s, i)))
}

fn field<'a>(s: &'a StructArray, name: &str) -> Option<&'a ArrayRef> {
    s.column_by_name(name)
}

/// Decodes the frame at row `i` of a location struct column (v1 or v2 layout).
fn frame_at(locations: &dyn Array, i: usize) -> Result<ParcaFrame> {
    let Some((loc, i)) = struct_at(locations, i)? else {
        return Ok(ParcaFrame::default());
    };
    let address = match field(loc, "address") {
        Some(a) => u64_at(a.as_ref(), i)?,
        None => return Err(invalid("a location has no address")),
    };
    let text = |name: &str| -> Result<String> {
        match field(loc, name) {
            Some(a) => str_at(a.as_ref(), i),
            None => Ok(String::new()),
        }
    };
    let number = |name: &str| -> Result<u64> {
        match field(loc, name) {
            Some(a) => u64_at(a.as_ref(), i),
            None => Ok(0),
        }
    };
    let file = text("mapping_file")?;
    let build_id = text("mapping_build_id")?;
    let (start, limit, offset) = (
        number("mapping_start")?,
        number("mapping_limit")?,
        number("mapping_offset")?,
    );
    let has_mapping = !file.is_empty() || !build_id.is_empty() || start != 0 || limit != 0;
    let mapping = has_mapping.then_some(ParcaMapping {
        file,
        build_id,
        start,
        limit,
        offset,
    });
    let mut lines = Vec::new();
    if let Some(list) = field(loc, "lines")
        && let Some((values, from, to)) = list_range(list.as_ref(), i)?
    {
        let line_struct = values
            .as_struct_opt()
            .ok_or_else(|| invalid("a location's lines are not structs"))?;
        for j in from..to {
            lines.push(line_at(line_struct, j)?);
        }
    }
    Ok(ParcaFrame {
        address,
        frame_type: text("frame_type")?,
        mapping,
        lines,
    })
}

fn line_at(line: &StructArray, j: usize) -> Result<ParcaLine> {
    let number = match field(line, "line") {
        Some(a) => int_at(a.as_ref(), j)?.unwrap_or(0),
        None => 0,
    };
    let text = |s: &StructArray, name: &str, row: usize| -> Result<String> {
        match field(s, name) {
            Some(a) => str_at(a.as_ref(), row),
            None => Ok(String::new()),
        }
    };
    let int = |s: &StructArray, name: &str, row: usize| -> Result<i64> {
        match field(s, name) {
            Some(a) => Ok(int_at(a.as_ref(), row)?.unwrap_or(0)),
            None => Ok(0),
        }
    };
    // v2: `function: Dictionary<Struct{system_name, filename, start_line}>`.
    let function = if let Some(f) = field(line, "function") {
        match struct_at(f.as_ref(), j)? {
            Some((fs, k)) => {
                let system_name = text(fs, "system_name", k)?;
                Some(ParcaFunction {
                    name: system_name.clone(),
                    system_name,
                    filename: text(fs, "filename", k)?,
                    start_line: int(fs, "start_line", k)?,
                })
            }
            None => None,
        }
    } else {
        // v1: `function_name`, `function_system_name`, `function_filename`, `function_start_line`.
        let name = text(line, "function_name", j)?;
        let system_name = text(line, "function_system_name", j)?;
        let filename = text(line, "function_filename", j)?;
        let start_line = int(line, "function_start_line", j)?;
        if name.is_empty() && system_name.is_empty() && filename.is_empty() {
            None
        } else {
            Some(ParcaFunction {
                name: if name.is_empty() {
                    system_name.clone()
                } else {
                    name
                },
                system_name,
                filename,
                start_line,
            })
        }
    };
    Ok(ParcaLine {
        line: number,
        function,
    })
}

/// Decodes a sample record of either version.
pub fn decode_sample_record(batch: &RecordBatch) -> Result<SampleRecord> {
    let version = schema_version(batch).unwrap_or("v1");
    if version != "v1" && version != "v2" {
        return Err(invalid(format!(
            "unsupported {SCHEMA_VERSION_KEY} {version:?}"
        )));
    }
    let n = batch.num_rows();
    let value = column(batch, "value")?;
    let producer = column(batch, "producer")?;
    let sample_type = column(batch, "sample_type")?;
    let sample_unit = column(batch, "sample_unit")?;
    let period_type = column(batch, "period_type")?;
    let period_unit = column(batch, "period_unit")?;
    let period = column(batch, "period")?;
    let duration = column(batch, "duration")?;
    let timestamp = column(batch, "timestamp")?;
    let stack_ids = batch.column_by_name("stacktrace_id");
    let inline = batch.column_by_name("stacktrace");

    // Label columns: v1 `labels.<name>` columns, v2 one `labels` struct.
    let mut label_cols: Vec<(String, &ArrayRef)> = Vec::new();
    for (f, col) in batch.schema_ref().fields().iter().zip(batch.columns()) {
        if let Some(name) = f.name().strip_prefix(LABEL_PREFIX) {
            label_cols.push((name.to_owned(), col));
        } else if f.name() == "labels"
            && let Some(s) = col.as_struct_opt()
        {
            for (lf, lc) in s.fields().iter().zip(s.columns()) {
                label_cols.push((lf.name().clone(), lc));
            }
        }
    }
    label_cols.sort_by(|a, b| a.0.cmp(&b.0));
    if label_cols.iter().any(|(name, _)| name.is_empty()) {
        return Err(invalid("a label column has no name"));
    }

    let mut record = SampleRecord::default();
    let mut keys: FastMap<SeriesKey, u32> = FastMap::default();
    let mut sample_label_sets: FastMap<Vec<(String, String)>, u32> = FastMap::default();
    let mut inline_stacks: FastMap<(usize, usize), u32> = FastMap::default();
    let mut frames: FastMap<usize, ParcaFrame> = FastMap::default();
    let mut labels = Vec::new();
    let mut sample_labels = Vec::new();
    for row in 0..n {
        labels.clear();
        sample_labels.clear();
        for (name, col) in &label_cols {
            let v = str_at(col.as_ref(), row)?;
            if v.is_empty() {
                continue;
            }
            if SAMPLE_LABELS.contains(&name.as_str()) {
                sample_labels.push((name.clone(), v));
            } else {
                labels.push((name.clone(), v));
            }
        }
        let producer = str_at(producer.as_ref(), row)?;
        if producer.is_empty() {
            return Err(invalid(format!("row {row} has no producer")));
        }
        let key = SeriesKey {
            labels: labels.clone(),
            producer,
            sample_type: str_at(sample_type.as_ref(), row)?,
            sample_unit: str_at(sample_unit.as_ref(), row)?,
            period_type: str_at(period_type.as_ref(), row)?,
            period_unit: str_at(period_unit.as_ref(), row)?,
            period: int_at(period.as_ref(), row)?.unwrap_or(0),
            duration: int_at(duration.as_ref(), row)?.unwrap_or(0),
        };
        if key.sample_type.is_empty() {
            return Err(invalid(format!("row {row} has no sample_type")));
        }
        let next = keys.len() as u32;
        let key = *keys.entry(key).or_insert(next);
        let next = sample_label_sets.len() as u32;
        let sl = *sample_label_sets
            .entry(sample_labels.clone())
            .or_insert(next);
        let stack = match (inline, stack_ids) {
            (Some(st), _) => {
                let (values, from, to) = list_range(st.as_ref(), row)?.unwrap_or((st, 0, 0));
                let next = record.stacks.len() as u32;
                let i = *inline_stacks.entry((from, to)).or_insert(next);
                if i == next {
                    let mut stack = Vec::with_capacity(to - from);
                    for j in from..to {
                        // A location dictionary's rows decode once per record.
                        let loc = match unwrap_index(values.as_ref(), j)? {
                            Some((_, Some(k))) => k,
                            _ => j,
                        };
                        let frame = match frames.get(&loc) {
                            Some(f) => f.clone(),
                            None => {
                                let f = frame_at(values.as_ref(), j)?;
                                frames.insert(loc, f.clone());
                                f
                            }
                        };
                        stack.push(frame);
                    }
                    record.stacks.push(stack.into());
                }
                StackRef::Inline(i)
            }
            (None, Some(ids)) => {
                let id = bytes_at(ids.as_ref(), row)?.unwrap_or_default();
                let id: StackId = id.try_into().map_err(|_| {
                    invalid(format!(
                        "row {row}: a stacktrace_id of {} bytes, not 16",
                        id.len()
                    ))
                })?;
                StackRef::Id(id)
            }
            (None, None) => return Err(invalid("the record has no column \"stacktrace_id\"")),
        };
        record.rows.push(SampleRow {
            key,
            sample_labels: sl,
            stack,
            value: int_at(value.as_ref(), row)?.unwrap_or(0),
            timestamp: int_at(timestamp.as_ref(), row)?.unwrap_or(0),
        });
    }
    record.keys = vec![SeriesKey::default(); keys.len()];
    for (k, i) in keys {
        record.keys[i as usize] = k;
    }
    record.sample_labels = vec![Vec::new(); sample_label_sets.len()];
    for (k, i) in sample_label_sets {
        record.sample_labels[i as usize] = k;
    }
    Ok(record)
}

/// Decodes a v1 locations record: each row's stack id and stack.
pub fn decode_locations_record(batch: &RecordBatch) -> Result<Vec<(StackId, Stack)>> {
    let ids = column(batch, "stacktrace_id")?;
    let locations = column(batch, "locations")?;
    let mut out = Vec::with_capacity(batch.num_rows());
    for row in 0..batch.num_rows() {
        let id = bytes_at(ids.as_ref(), row)?.unwrap_or_default();
        let id: StackId = id.try_into().map_err(|_| {
            invalid(format!(
                "locations row {row}: a stacktrace_id of {} bytes, not 16",
                id.len()
            ))
        })?;
        let mut stack = Vec::new();
        if let Some((values, from, to)) = list_range(locations.as_ref(), row)? {
            for j in from..to {
                stack.push(frame_at(values.as_ref(), j)?);
            }
        }
        out.push((id, stack.into()));
    }
    Ok(out)
}

/// The stack ids of a locations record (without decoding the stacks).
pub fn locations_record_ids(batch: &RecordBatch) -> Result<Vec<StackId>> {
    let ids = column(batch, "stacktrace_id")?;
    (0..batch.num_rows())
        .map(|row| {
            let id = bytes_at(ids.as_ref(), row)?.unwrap_or_default();
            id.try_into()
                .map_err(|_| invalid(format!("a stacktrace_id of {} bytes", id.len())))
        })
        .collect()
}

/// The server's request for stacks: an IPC stream of one `stacktrace_id: Binary` column with the
/// v1 schema metadata, as Parca sends it.
pub fn unknown_ids_record(ids: &[StackId]) -> Result<Vec<u8>> {
    let schema = Arc::new(
        Schema::new(vec![Field::new("stacktrace_id", DataType::Binary, false)]).with_metadata(
            [(SCHEMA_VERSION_KEY.to_owned(), "v1".to_owned())]
                .into_iter()
                .collect(),
        ),
    );
    let column = BinaryArray::from_iter_values(ids.iter().map(|id| id.as_slice()));
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(column)])
        .map_err(|e| invalid(format!("cannot build the stack request: {e}")))?;
    let mut buf = Vec::new();
    let mut w = StreamWriter::try_new(&mut buf, &schema)
        .map_err(|e| invalid(format!("cannot write the stack request: {e}")))?;
    w.write(&batch)
        .and_then(|()| w.finish())
        .map_err(|e| invalid(format!("cannot write the stack request: {e}")))?;
    drop(w);
    Ok(buf)
}

/// Reads a stack request ([`unknown_ids_record`]); an empty message asks for nothing.
pub fn read_unknown_ids(bytes: &[u8]) -> Result<Vec<StackId>> {
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    let mut ids = Vec::new();
    // Kiln's own answer (to `kiln upload`), within the gRPC message limit.
    for batch in read_ipc(bytes, 64 << 20)? {
        ids.extend(locations_record_ids(&batch)?);
    }
    Ok(ids)
}

/// Builds a profile of a sample record whose v1 stacks are resolved by `stack_of` (v2 records
/// carry their own). A row whose stack is not found refuses the record. A series' time is its
/// earliest row's (`now_nanos` when rows carry none).
pub fn normalize<'a>(
    record: &'a SampleRecord,
    stack_of: impl Fn(&StackId) -> Option<&'a Stack>,
    now_nanos: i64,
    limits: &NormalizeLimits,
) -> Result<NormalizedProfile> {
    kernel::check_sample_count(record.rows.len(), limits)?;
    let mut symbols = Symbols::default();
    let mut functions: FastMap<&'a ParcaFunction, u32> = FastMap::default();
    let mut mappings: FastMap<&'a ParcaMapping, u32> = FastMap::default();
    let mut locations: FastMap<&'a ParcaFrame, u32> = FastMap::default();
    let mut unsymbolized = UnsymbolizedFunctions::default();
    let mut resolved: FastMap<StackRef, Vec<u32>> = FastMap::default();
    let mut builder: SeriesBuilder<u32> = SeriesBuilder::new(1);
    let mut first_time: FastMap<u32, i64> = FastMap::default();
    for (i, row) in record.rows.iter().enumerate() {
        if !resolved.contains_key(&row.stack) {
            let stack: &'a Stack = match row.stack {
                StackRef::Inline(s) => record
                    .stacks
                    .get(s as usize)
                    .ok_or_else(|| invalid(format!("row {i} refers to a missing stack")))?,
                StackRef::Id(id) => stack_of(&id).ok_or_else(|| {
                    invalid(format!(
                        "row {i} refers to stack {}, which was not sent",
                        hex(&id)
                    ))
                })?,
            };
            let mut out = Vec::new();
            kernel::fill_stack(
                &mut out,
                stack.iter(),
                limits.max_stack_depth,
                |frame| -> Result<u32> {
                    if let Some(&l) = locations.get(frame) {
                        return Ok(l);
                    }
                    let mapping = frame.mapping.as_ref().map(|m| {
                        *mappings.entry(m).or_insert_with(|| {
                            symbols.mappings.push(Mapping {
                                memory_start: m.start,
                                memory_limit: m.limit,
                                file_offset: m.offset,
                                filename: m.file.clone(),
                                build_id: m.build_id.clone(),
                                has_functions: false,
                            });
                            symbols.mappings.len() as u32 - 1
                        })
                    });
                    let mut lines = Lines::with_capacity(frame.lines.len().max(1));
                    for line in &frame.lines {
                        let Some(f) = &line.function else { continue };
                        let function = *functions.entry(f).or_insert_with(|| {
                            symbols.functions.push(Function {
                                name: f.name.as_str().into(),
                                system_name: f.system_name.as_str().into(),
                                filename: f.filename.as_str().into(),
                                start_line: f.start_line,
                            });
                            symbols.functions.len() as u32 - 1
                        });
                        lines.push(Line {
                            function,
                            line: line.line,
                        });
                    }
                    if let Some(m) = mapping
                        && !lines.is_empty()
                    {
                        symbols.mappings[m as usize].has_functions = true;
                    }
                    if lines.is_empty() {
                        lines.push(unsymbolized.line(&mut symbols, mapping, frame.address));
                    }
                    let l = symbols.locations.len() as u32;
                    symbols.locations.push(Location {
                        mapping,
                        address: frame.address,
                        lines,
                        frame_type: frame.frame_type.clone(),
                    });
                    locations.insert(frame, l);
                    Ok(l)
                },
            )?;
            resolved.insert(row.stack, out);
        }
        if row.value <= 0 {
            continue;
        }
        let first = first_time.entry(row.key).or_insert(row.timestamp);
        *first = (*first).min(row.timestamp);
        let stack = &resolved[&row.stack];
        let series = builder.series(&row.key);
        let labels = record
            .sample_labels
            .get(row.sample_labels as usize)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let key = builder.hash(SampleKey {
            stack,
            span_id: 0,
            trace_id: None,
            timestamp_nanos: 0,
            labels,
        });
        builder.add(series, 0, &key, row.value, i)?;
    }
    let mut series = Vec::new();
    for (k, mut per_type) in builder.finish() {
        let samples = per_type.pop().unwrap_or_default();
        if samples.is_empty() {
            continue;
        }
        let key = &record.keys[k as usize];
        let mut labels = Labels::from_pairs(key.labels.iter().cloned());
        labels.set(LABEL_NAME.to_owned(), key.producer.clone());
        labels.set_default(LABEL_SERVICE_NAME, UNKNOWN_SERVICE);
        validate_series_labels(&labels, &limits.labels)?;
        series.push(Series {
            labels,
            profile_type: ProfileType {
                name: key.producer.clone(),
                sample_type: key.sample_type.clone(),
                sample_unit: key.sample_unit.clone(),
                period_type: key.period_type.clone(),
                period_unit: key.period_unit.clone(),
            },
            // A row without a time (or a 1970 one) takes the request's.
            time_nanos: first_time
                .get(&k)
                .copied()
                .filter(|&t| t >= NANOS_1971)
                .unwrap_or(now_nanos),
            duration_nanos: key.duration,
            samples,
        });
    }
    Ok(NormalizedProfile { symbols, series })
}

/// A stack id in hex, for messages.
pub fn hex(id: &StackId) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

pub mod ipc;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

#[cfg(test)]
mod tests;
