//! The formats the query APIs draw a merged tree in besides the querier's own: Pyroscope's
//! flamebearer JSON ([`flamebearer`]: `/pyroscope/render`, `render-diff`, `Diff`, ad-hoc
//! profiles) and pprof's Graphviz DOT call graph ([`dot`]: `/pyroscope/render?format=dot` and
//! `SelectMergeStacktraces`' DOT format).

pub mod dot;
pub mod flamebearer;
#[cfg(test)]
mod tests;

use kiln_otel::model::ProfileType;

use crate::error::ApiError;

/// The nodes of the merged tree the DOT graph is drawn from, at least.
pub(crate) const DOT_SOURCE_NODES: usize = 512;

/// The DOT text of a merged tree: at most `max_nodes` nodes, drawn from its `source_nodes`
/// largest (the rest folded into `other`), as Pyroscope draws from a merged profile.
pub(crate) fn dot_text(
    tree: &kiln_storage::query::FlameTree,
    source_nodes: usize,
    max_nodes: usize,
    profile_type: &ProfileType,
    start: i64,
    end: i64,
) -> Result<String, ApiError> {
    let stacks = kiln_storage::query::tree::flamegraph_stacks(&tree.to_flamegraph(source_nodes))
        .map_err(ApiError::internal)?;
    Ok(dot::render(
        &stacks,
        max_nodes,
        &dot::Meta {
            sample_type: &profile_type.sample_type,
            sample_unit: &profile_type.sample_unit,
            start_ms: start,
            end_ms: end,
        },
    ))
}
