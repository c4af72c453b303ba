//! The function projections of `SelectMergeStacktraces` and `Diff` (ADR 0010), what Grafana
//! Profiles Drilldown asks for once `GetFeatureFlags` says `functionProjections`:
//!
//! - `PROFILE_FORMAT_FUNCTIONS`: every function's exact self and total (`functions`), limited to
//!   `format_options.functions.limit` rows, or `max_nodes` rows;
//! - `PROFILE_FORMAT_FUNCTION_TREE`: the callers and/or callees of the call site
//!   (`stack_trace_selector.call_site`, root first) as `format_options.function_tree` asks;
//! - `PROFILE_FORMAT_SANDWICH`: every caller and callee of `sandwich_function`, `max_nodes`
//!   per half.
//!
//! The values come from the whole merged tree (label selector, time range, span, trace and
//! profile id selectors as for a flame graph; the call site selects stacks for FUNCTIONS and SANDWICH as it
//! does for a flame graph). `Diff` answers FUNCTIONS two ways, as the app's two clients ask: a
//! `left.format` of FUNCTIONS or FUNCTION_TREE gets both sides' projections side by side
//! (`functions.left`/`right`, `function_tree.left`/`right`), a request `format` of FUNCTIONS one
//! joined table (`functions.functions`, `left_total`, `right_total`).

use kiln_proto::querier::v1 as q;
use kiln_proto::types::v1 as t;
use kiln_storage::query::FlameTree;
use kiln_storage::query::functions::{self, DiffRanking, FunctionPair, Selection};

use super::{MergeRequest, Querier, call_site};
use crate::auth::TenantSet;
use crate::error::ApiError;

/// The deepest function tree a client may ask for.
const MAX_TREE_DEPTH: i32 = 128;

/// A checked projection request.
#[derive(Debug, Clone, PartialEq)]
enum Projection {
    /// At most this many rows (0: all).
    Functions {
        limit: usize,
    },
    Tree(TreeOptions),
    /// Nodes per half.
    Sandwich {
        function: String,
        max_nodes: usize,
    },
}

/// A checked `format_options.function_tree`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct TreeOptions {
    selection: Selection,
    callers: bool,
    callees: bool,
    max_depth: usize,
}

impl TreeOptions {
    /// The function tree of a query's merged tree, from its call site.
    fn tree(&self, tree: &FlameTree, call_site: &[String]) -> t::FunctionTree {
        let path: Vec<&str> = call_site.iter().map(String::as_str).collect();
        functions::function_tree(
            tree,
            &path,
            self.selection,
            self.callers,
            self.callees,
            self.max_depth,
        )
    }
}

impl Querier {
    /// `SelectMergeStacktraces` with a projection format (FUNCTIONS, FUNCTION_TREE, SANDWICH).
    pub(super) async fn select_projection(
        &self,
        tenants: &TenantSet,
        r: &q::SelectMergeStacktracesRequest,
    ) -> Result<q::SelectMergeStacktracesResponse, ApiError> {
        let projection = self.projection(tenants, r, r.format)?;
        let m = MergeRequest::of_stacktraces(r)?;
        let tree = self.merged_tree(tenants, &m).await?;
        let mut out = q::SelectMergeStacktracesResponse::default();
        match project(tree, &m.call_site, &projection) {
            Projected::Functions(table) => out.functions = Some(table),
            Projected::Tree(tree) => out.function_tree = Some(tree),
            Projected::Sandwich(sandwich) => out.sandwich = Some(sandwich),
        }
        Ok(out)
    }

    /// `Diff` with FUNCTIONS or FUNCTION_TREE (see the module's summary); `None` for a flame
    /// graph diff.
    pub(super) async fn diff_projection(
        &self,
        tenants: &TenantSet,
        r: &q::DiffRequest,
    ) -> Result<Option<q::DiffResponse>, ApiError> {
        let joined = match q::ProfileFormat::try_from(r.format) {
            Ok(q::ProfileFormat::Unspecified | q::ProfileFormat::Flamegraph) => false,
            Ok(q::ProfileFormat::Functions) => true,
            other => {
                let name = other.map_or_else(|_| r.format.to_string(), |f| f.as_str_name().into());
                return Err(ApiError::invalid(format!(
                    "Diff answers the formats FLAMEGRAPH and FUNCTIONS, not {name}"
                )));
            }
        };
        let sides_format = r.left.as_ref().map(|l| l.format).unwrap_or_default();
        let side_by_side = [
            q::ProfileFormat::Functions as i32,
            q::ProfileFormat::FunctionTree as i32,
        ]
        .contains(&sides_format);
        if !joined && !side_by_side {
            return Ok(None);
        }
        let (Some(left), Some(right)) = (&r.left, &r.right) else {
            return Err(ApiError::invalid("Diff needs a left and a right query"));
        };
        if left.profile_type_id != right.profile_type_id {
            return Err(ApiError::invalid(format!(
                "the two sides of a diff must have one profile type, not {:?} and {:?}",
                left.profile_type_id, right.profile_type_id
            )));
        }
        // The left side's format and options apply to both; each side has its own call site.
        let side = if side_by_side {
            Some(self.projection(tenants, left, sides_format)?)
        } else {
            None
        };
        if let (Some(Projection::Tree(_)), Some(o)) = (
            &side,
            left.format_options
                .as_ref()
                .and_then(|o| o.function_tree.as_ref()),
        ) {
            tree_projection(o, call_site(right.stack_trace_selector.as_ref()).len())?;
        }
        let joined_limit = if joined {
            self.row_limit(tenants, 0, r.max_nodes)?
        } else {
            0
        };
        let (lm, rm) = (
            MergeRequest::of_stacktraces(left)?,
            MergeRequest::of_stacktraces(right)?,
        );
        let (left_tree, right_tree) = futures::try_join!(
            self.merged_tree(tenants, &lm),
            self.merged_tree(tenants, &rm)
        )?;
        let mut out = q::DiffResponse::default();
        if let Some(Projection::Tree(o)) = &side {
            out.function_tree = Some(q::FunctionTreeDiff {
                left: Some(o.tree(&left_tree, &lm.call_site)),
                right: Some(o.tree(&right_tree, &rm.call_site)),
            });
        }
        let side_limit = match side {
            Some(Projection::Functions { limit }) => Some(limit),
            _ => None,
        };
        if joined || side_limit.is_some() {
            let l = table(left_tree, &lm.call_site);
            let r = table(right_tree, &rm.call_site);
            let mut diff = side_limit
                .map(|limit| side_by_side_tables(&l, &r, limit))
                .unwrap_or_default();
            if joined {
                diff.functions = joined_rows(&l, &r, joined_limit);
                diff.left_total = l.total;
                diff.right_total = r.total;
            }
            out.functions = Some(diff);
        }
        Ok(Some(out))
    }

    /// Checks what a request asks `format` (a projection) for.
    fn projection(
        &self,
        tenants: &TenantSet,
        r: &q::SelectMergeStacktracesRequest,
        format: i32,
    ) -> Result<Projection, ApiError> {
        let path = call_site(r.stack_trace_selector.as_ref());
        if path.iter().any(String::is_empty) {
            return Err(ApiError::invalid(
                "call_site needs a function name in every location",
            ));
        }
        let options = r.format_options.as_ref();
        match q::ProfileFormat::try_from(format) {
            Ok(q::ProfileFormat::Functions) => {
                let limit = options
                    .and_then(|o| o.functions.as_ref())
                    .map(|f| f.limit)
                    .unwrap_or_default();
                Ok(Projection::Functions {
                    limit: self.row_limit(tenants, limit, r.max_nodes)?,
                })
            }
            Ok(q::ProfileFormat::FunctionTree) => {
                let Some(o) = options.and_then(|o| o.function_tree.as_ref()) else {
                    return Err(ApiError::invalid(
                        "PROFILE_FORMAT_FUNCTION_TREE needs format_options.function_tree",
                    ));
                };
                tree_projection(o, path.len()).map(Projection::Tree)
            }
            Ok(q::ProfileFormat::Sandwich) => {
                let function = r.sandwich_function.clone().unwrap_or_default();
                if function.is_empty() {
                    return Err(ApiError::invalid(
                        "sandwich_function is required for PROFILE_FORMAT_SANDWICH",
                    ));
                }
                Ok(Projection::Sandwich {
                    function,
                    max_nodes: self.max_nodes(tenants, r.max_nodes)?,
                })
            }
            _ => Err(ApiError::invalid(format!(
                "format {format} is not a function projection"
            ))),
        }
    }

    /// A function table's row limit: `format_options.functions.limit`, else `max_nodes` (within
    /// the tenant's flame graph node limit); 0 for neither: every row.
    fn row_limit(
        &self,
        tenants: &TenantSet,
        limit: i64,
        max_nodes: Option<i64>,
    ) -> Result<usize, ApiError> {
        if limit < 0 {
            return Err(ApiError::invalid("the function limit must not be negative"));
        }
        if limit > 0 {
            return Ok(usize::try_from(limit).unwrap_or(usize::MAX));
        }
        match max_nodes {
            None | Some(0) => Ok(0),
            n => self.max_nodes(tenants, n),
        }
    }
}

/// Checks `format_options.function_tree` for a call site of `path_len` functions.
fn tree_projection(o: &t::FunctionTreeOptions, path_len: usize) -> Result<TreeOptions, ApiError> {
    use t::FunctionTreeDirection as D;
    use t::FunctionTreeSelection as S;
    let (callers, callees) = match D::try_from(o.direction) {
        Ok(D::Callees) => (false, true),
        Ok(D::Callers) => (true, false),
        Ok(D::Both) => (true, true),
        _ => {
            return Err(ApiError::invalid(
                "function_tree.direction must be CALLEES, CALLERS or BOTH",
            ));
        }
    };
    let depth = o.max_depth.unwrap_or(1);
    if !(0..=MAX_TREE_DEPTH).contains(&depth) {
        return Err(ApiError::invalid(format!(
            "function_tree.max_depth must be between 0 and {MAX_TREE_DEPTH}"
        )));
    }
    let selection = match S::try_from(o.selection) {
        Ok(S::RootPath) if callers => {
            return Err(ApiError::invalid(
                "FUNCTION_TREE_SELECTION_ROOT_PATH answers CALLEES only",
            ));
        }
        Ok(S::RootPath) => Selection::RootPath,
        Ok(S::FunctionChain) if path_len == 0 => {
            return Err(ApiError::invalid(
                "FUNCTION_TREE_SELECTION_FUNCTION_CHAIN needs a function in stack_trace_selector.call_site",
            ));
        }
        Ok(S::FunctionChain) if callers && callees && path_len != 1 => {
            return Err(ApiError::invalid(
                "FUNCTION_TREE_DIRECTION_BOTH needs exactly one function in the call site",
            ));
        }
        Ok(S::FunctionChain) => Selection::FunctionChain,
        _ => {
            return Err(ApiError::invalid(
                "function_tree.selection must be ROOT_PATH or FUNCTION_CHAIN",
            ));
        }
    };
    Ok(TreeOptions {
        selection,
        callers,
        callees,
        max_depth: depth as usize,
    })
}

enum Projected {
    Functions(t::FunctionTable),
    Tree(t::FunctionTree),
    Sandwich(q::SandwichReport),
}

/// A checked projection of a query's merged tree and call site.
fn project(tree: FlameTree, call_site: &[String], p: &Projection) -> Projected {
    let path: Vec<&str> = call_site.iter().map(String::as_str).collect();
    match p {
        Projection::Functions { limit } => {
            let mut table = functions::function_table(&tree.focus(&path));
            functions::limit_table(&mut table, *limit);
            Projected::Functions(table)
        }
        Projection::Tree(o) => Projected::Tree(o.tree(&tree, call_site)),
        Projection::Sandwich {
            function,
            max_nodes,
        } => Projected::Sandwich(functions::sandwich(
            &tree.focus(&path),
            function,
            *max_nodes,
        )),
    }
}

/// The whole function table of a query's stacks through its call site.
fn table(tree: FlameTree, call_site: &[String]) -> t::FunctionTable {
    let path: Vec<&str> = call_site.iter().map(String::as_str).collect();
    functions::function_table(&tree.focus(&path))
}

/// Both sides' tables with aligned rows: the same functions in the same order, ranked by the
/// larger self value of the two, at most `limit` (0: all); `total_functions` counts the joined
/// functions.
fn side_by_side_tables(
    left: &t::FunctionTable,
    right: &t::FunctionTable,
    limit: usize,
) -> q::FunctionTableDiff {
    let mut pairs = functions::join_tables(left, right, DiffRanking::LargerSelf);
    let count = pairs.len() as i64;
    if limit > 0 {
        pairs.truncate(limit);
    }
    let side = |total: i64, rows: Vec<t::FunctionStats>| t::FunctionTable {
        functions: rows,
        total,
        total_functions: count,
    };
    let (l, r): (Vec<_>, Vec<_>) = pairs
        .into_iter()
        .map(|FunctionPair { left, right, .. }| (left, right))
        .unzip();
    q::FunctionTableDiff {
        left: Some(side(left.total, l)),
        right: Some(side(right.total, r)),
        ..Default::default()
    }
}

/// One row per function with both sides' values, ranked by the larger share of its side's
/// total, at most `limit` (0: all).
fn joined_rows(
    left: &t::FunctionTable,
    right: &t::FunctionTable,
    limit: usize,
) -> Vec<q::FunctionDiffRow> {
    let mut pairs = functions::join_tables(left, right, DiffRanking::LargerShare);
    if limit > 0 {
        pairs.truncate(limit);
    }
    pairs
        .into_iter()
        .map(|p| q::FunctionDiffRow {
            name: p.name,
            left_self: p.left.self_,
            left_total: p.left.total,
            right_self: p.right.self_,
            right_total: p.right.total,
        })
        .collect()
}
