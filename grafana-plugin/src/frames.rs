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
use kiln_proto::flamegraph::{self, FlameGraphError};
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
/// datasource does, with [`flamegraph::decode`]) and lists it depth-first, root first.
pub fn nested_set(fg: &FlameGraph) -> Result<Vec<NestedNode>, FlameGraphError> {
    let nodes = flamegraph::decode(fg)?;
    // Decoded nodes come level by level, left to right: children are listed in order.
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    let mut roots = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        match n.parent {
            Some(p) => children[p].push(i),
            None => roots.push(i),
        }
    }
    let mut out = Vec::with_capacity(nodes.len());
    let mut stack: Vec<usize> = roots.into_iter().rev().collect();
    while let Some(i) = stack.pop() {
        let n = &nodes[i];
        out.push(NestedNode {
            level: n.level as i64,
            value: n.total,
            self_value: n.self_value,
            label: fg.names[n.name].clone(),
        });
        stack.extend(children[i].iter().rev());
    }
    Ok(out)
}

/// Why a frame could not be built.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// Kiln's flame graph does not decode.
    #[error("flame graph: {0}")]
    FlameGraph(#[from] FlameGraphError),
    /// Arrow refused the columns or the IPC encoding failed.
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
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
pub fn flamegraph_frame(ref_id: &str, fg: &FlameGraph, unit: &str) -> Result<Vec<u8>, FrameError> {
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
    Ok(ipc(schema, cols)?)
}

/// One time-series frame: `points` are (Unix ms, value).
pub fn series_frame(
    ref_id: &str,
    value_name: &str,
    labels: &[(String, String)],
    points: &[(i64, f64)],
    unit: &str,
) -> Result<Vec<u8>, FrameError> {
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
    Ok(ipc(schema, cols)?)
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
    fn malformed_levels_are_refused() {
        let fg = |levels: Vec<Vec<i64>>| FlameGraph {
            names: vec!["total".into(), "main".into()],
            levels: levels.into_iter().map(|values| Level { values }).collect(),
            total: 10,
            max_self: 10,
        };
        // main ends after its parent.
        let escaping = fg(vec![vec![0, 10, 0, 0], vec![5, 6, 6, 1]]);
        assert_eq!(
            nested_set(&escaping),
            Err(FlameGraphError::EscapesParent {
                level: 1,
                offset: 5
            })
        );
        assert!(matches!(
            flamegraph_frame("A", &escaping, "ns"),
            Err(FrameError::FlameGraph(
                FlameGraphError::EscapesParent { .. }
            ))
        ));
        assert!(nested_set(&fg(vec![vec![0, 10, 0]])).is_err());
        assert!(nested_set(&fg(vec![vec![0, 10, 0, 7]])).is_err());
        assert_eq!(nested_set(&FlameGraph::default()), Ok(Vec::new()));
    }

    #[test]
    fn units() {
        assert_eq!(unit_of("process_cpu:cpu:nanoseconds:cpu:nanoseconds"), "ns");
        assert_eq!(unit_of("memory:alloc_space:bytes:space:bytes"), "bytes");
        assert_eq!(unit_of("memory:alloc_objects:count:space:bytes"), "short");
    }
}
