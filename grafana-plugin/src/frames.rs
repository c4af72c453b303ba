//! Grafana data frames, encoded as Grafana's Go SDK does: one Arrow IPC *file* per frame, the
//! frame name and `refId` in the schema metadata, frame meta as JSON under `meta`, field labels
//! and config as JSON field metadata.
//!
//! - Flame graphs: a nested set in depth-first pre-order, fields `level`, `value`, `self`,
//!   `label` (row 0 is the `total` root), frame `response`, preferred visualisation `flamegraph`,
//!   as Grafana's Pyroscope datasource builds it.
//! - Series: one frame per series, fields `time` and a float value field named after the sample
//!   type with the series labels, preferred visualisation `graph`.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{
    ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, TimestampNanosecondArray,
};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use arrow::ipc::writer::FileWriter;
use kiln_proto::querier::v1::FlameGraph;

/// Grafana's unit for a profile type's sample unit.
pub fn unit_of(profile_type_id: &str) -> &str {
    match profile_type_id.split(':').nth(2).unwrap_or("") {
        "nanoseconds" => "ns",
        "count" | "" => "short",
        "bytes" => "bytes",
        other => other,
    }
}

/// One node of a flame graph in nested-set form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NestedNode {
    pub level: i64,
    pub value: i64,
    pub self_value: i64,
    pub label: String,
}

/// Rebuilds the tree from Pyroscope's `FlameGraph` levels (interval containment, as Grafana's
/// datasource does) and lists it depth-first, root first.
pub fn nested_set(fg: &FlameGraph) -> Result<Vec<NestedNode>, String> {
    struct Node {
        offset: i64,
        total: i64,
        self_value: i64,
        name: usize,
        children: Vec<usize>,
    }
    let mut levels: Vec<Vec<Node>> = Vec::with_capacity(fg.levels.len());
    for (d, level) in fg.levels.iter().enumerate() {
        if !level.values.len().is_multiple_of(4) {
            return Err(format!(
                "level {d} has {} values, not a multiple of 4",
                level.values.len()
            ));
        }
        let mut nodes: Vec<Node> = Vec::new();
        let mut right = 0i64;
        let mut parent = 0usize;
        for v in level.values.chunks_exact(4) {
            let offset = right + v[0];
            right = offset + v[1];
            let name = usize::try_from(v[3])
                .ok()
                .filter(|n| *n < fg.names.len())
                .ok_or_else(|| format!("level {d}: name index {} out of range", v[3]))?;
            if d > 0 {
                // The parent is the node of the level above whose interval holds this one.
                let up = &mut levels[d - 1];
                while parent < up.len() && up[parent].offset + up[parent].total <= offset {
                    parent += 1;
                }
                let Some(p) = up.get_mut(parent) else {
                    return Err(format!("level {d}: the node at {offset} has no parent"));
                };
                p.children.push(nodes.len());
            }
            nodes.push(Node {
                offset,
                total: v[1],
                self_value: v[2],
                name,
                children: Vec::new(),
            });
        }
        levels.push(nodes);
    }
    let mut out = Vec::new();
    let Some(roots) = levels.first() else {
        return Ok(out);
    };
    let mut stack: Vec<(usize, usize)> = (0..roots.len()).rev().map(|i| (0, i)).collect();
    while let Some((d, i)) = stack.pop() {
        let n = &levels[d][i];
        out.push(NestedNode {
            level: d as i64,
            value: n.total,
            self_value: n.self_value,
            label: fg.names[n.name].clone(),
        });
        stack.extend(n.children.iter().rev().map(|&c| (d + 1, c)));
    }
    Ok(out)
}

fn ipc(schema: Schema, columns: Vec<ArrayRef>) -> Result<Vec<u8>, arrow::error::ArrowError> {
    let schema = Arc::new(schema);
    let batch = RecordBatch::try_new(Arc::clone(&schema), columns)?;
    let mut w = FileWriter::try_new(Vec::new(), &schema)?;
    w.write(&batch)?;
    w.finish()?;
    w.into_inner()
}

fn frame_metadata(name: &str, ref_id: &str, meta: serde_json::Value) -> HashMap<String, String> {
    HashMap::from([
        ("name".to_owned(), name.to_owned()),
        ("refId".to_owned(), ref_id.to_owned()),
        ("meta".to_owned(), meta.to_string()),
    ])
}

fn config(unit: &str) -> HashMap<String, String> {
    HashMap::from([(
        "config".to_owned(),
        serde_json::json!({ "unit": unit }).to_string(),
    )])
}

/// The flame graph frame.
pub fn flamegraph_frame(ref_id: &str, fg: &FlameGraph, unit: &str) -> Result<Vec<u8>, String> {
    let nodes = nested_set(fg)?;
    let schema = Schema::new_with_metadata(
        vec![
            Field::new("level", DataType::Int64, false),
            Field::new("value", DataType::Int64, false).with_metadata(config(unit)),
            Field::new("self", DataType::Int64, false).with_metadata(config(unit)),
            Field::new("label", DataType::Utf8, false),
        ],
        frame_metadata(
            "response",
            ref_id,
            serde_json::json!({ "preferredVisualisationType": "flamegraph" }),
        ),
    );
    let cols: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(nodes.iter().map(|n| n.level))),
        Arc::new(Int64Array::from_iter_values(nodes.iter().map(|n| n.value))),
        Arc::new(Int64Array::from_iter_values(
            nodes.iter().map(|n| n.self_value),
        )),
        Arc::new(StringArray::from_iter_values(
            nodes.iter().map(|n| n.label.as_str()),
        )),
    ];
    ipc(schema, cols).map_err(|e| e.to_string())
}

/// One time-series frame: `points` are (Unix ms, value).
pub fn series_frame(
    ref_id: &str,
    value_name: &str,
    labels: &[(String, String)],
    points: &[(i64, f64)],
    unit: &str,
) -> Result<Vec<u8>, String> {
    let labels_json: serde_json::Map<String, serde_json::Value> = labels
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    let mut value_meta = config(unit);
    value_meta.insert(
        "labels".into(),
        serde_json::Value::Object(labels_json).to_string(),
    );
    let schema = Schema::new_with_metadata(
        vec![
            Field::new(
                "time",
                DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
                false,
            ),
            Field::new(value_name, DataType::Float64, false).with_metadata(value_meta),
        ],
        frame_metadata(
            "series",
            ref_id,
            serde_json::json!({ "preferredVisualisationType": "graph" }),
        ),
    );
    let cols: Vec<ArrayRef> = vec![
        Arc::new(
            TimestampNanosecondArray::from_iter_values(
                points.iter().map(|(t, _)| t.saturating_mul(1_000_000)),
            )
            .with_timezone("UTC"),
        ),
        Arc::new(Float64Array::from_iter_values(
            points.iter().map(|(_, v)| *v),
        )),
    ];
    ipc(schema, cols).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use kiln_proto::querier::v1::Level;

    use super::*;

    #[test]
    fn nested_set_is_depth_first_from_pyroscope_levels() {
        // total(10) -> main(10, self 2) -> a(3), b(5)
        let fg = FlameGraph {
            names: vec!["total".into(), "main".into(), "a".into(), "b".into()],
            levels: vec![
                Level {
                    values: vec![0, 10, 0, 0],
                },
                Level {
                    values: vec![0, 10, 2, 1],
                },
                Level {
                    values: vec![2, 3, 3, 2, 0, 5, 5, 3],
                },
            ],
            total: 10,
            max_self: 5,
        };
        let rows = nested_set(&fg).unwrap();
        let got: Vec<(i64, i64, i64, &str)> = rows
            .iter()
            .map(|n| (n.level, n.value, n.self_value, n.label.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (0, 10, 0, "total"),
                (1, 10, 2, "main"),
                (2, 3, 3, "a"),
                (2, 5, 5, "b")
            ]
        );
        let bytes = flamegraph_frame("A", &fg, "ns").unwrap();
        let reader =
            arrow::ipc::reader::FileReader::try_new(std::io::Cursor::new(bytes), None).unwrap();
        let schema = reader.schema();
        assert_eq!(schema.metadata()["refId"], "A");
        assert!(schema.metadata()["meta"].contains("flamegraph"));
        assert_eq!(schema.field(1).metadata()["config"], r#"{"unit":"ns"}"#);
    }

    #[test]
    fn units() {
        assert_eq!(unit_of("process_cpu:cpu:nanoseconds:cpu:nanoseconds"), "ns");
        assert_eq!(unit_of("memory:alloc_space:bytes:space:bytes"), "bytes");
        assert_eq!(unit_of("memory:alloc_objects:count:space:bytes"), "short");
    }
}
