use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;

fn tree(stacks: &[(&[&str], i64)]) -> FlameTree {
    let mut t = FlameTree::default();
    for (s, v) in stacks {
        t.add_stack(s.iter().copied(), *v);
    }
    t
}

fn row<'a>(table: &'a t::FunctionTable, name: &str) -> &'a t::FunctionStats {
    table
        .functions
        .iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("no row {name}: {table:?}"))
}

#[test]
fn function_table_counts_recursion_once_per_stack() {
    let t = tree(&[
        (&["main", "a", "b", "a", "c"], 3),
        (&["main", "a"], 2),
        (&["main", "b"], 4),
        (&["gc"], 1),
    ]);
    let table = function_table(&t);
    assert_eq!(table.total, 10);
    assert_eq!(table.total_functions, 5);
    let stats = |name| {
        let r = row(&table, name);
        (r.self_, r.total)
    };
    assert_eq!(stats("main"), (0, 9));
    assert_eq!(stats("a"), (2, 5), "a's recursive stack counts once");
    assert_eq!(stats("b"), (4, 7));
    assert_eq!(stats("c"), (3, 3));
    assert_eq!(stats("gc"), (1, 1));
    let order: Vec<&str> = table.functions.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(order, ["b", "c", "a", "gc", "main"]);

    let mut limited = table.clone();
    limit_table(&mut limited, 2);
    assert_eq!(limited.functions, table.functions[..2]);
    assert_eq!((limited.total, limited.total_functions), (10, 5));
    let mut all = table.clone();
    limit_table(&mut all, 0);
    assert_eq!(all, table);
    assert_eq!(
        function_table(&FlameTree::default()),
        t::FunctionTable::default()
    );
}

#[test]
fn joined_tables_align_both_sides_before_the_limit() {
    let left = function_table(&tree(&[(&["main", "old"], 6), (&["main", "both"], 2)]));
    let right = function_table(&tree(&[(&["main", "new"], 5), (&["main", "both"], 4)]));
    let pairs = join_tables(&left, &right, DiffRanking::LargerSelf);
    let names: Vec<&str> = pairs.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["old", "new", "both", "main"]);
    let old = &pairs[0];
    assert_eq!(
        (old.left.self_, old.right.self_, old.right.name.as_str()),
        (6, 0, "old")
    );
    let both = &pairs[2];
    assert_eq!((both.left.total, both.right.total), (2, 4));
    // By share: main is 100% of both sides, then old (75% of left), new (5/9 of right).
    let mut by_share = join_tables(&left, &right, DiffRanking::LargerShare);
    by_share.truncate(3);
    let names: Vec<&str> = by_share.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["main", "old", "new"]);
}

fn node_names(n: &t::CallTreeNode) -> Vec<(String, i64, i64, bool)> {
    n.children
        .iter()
        .map(|c| (c.name.clone(), c.total, c.self_, c.has_children))
        .collect()
}

#[test]
fn function_trees_follow_the_selection_and_depth() {
    let t = tree(&[
        (&["main", "a", "f", "x", "y"], 3),
        (&["main", "b", "f"], 2),
        (&["main", "b", "f", "x"], 1),
        (&["main", "a"], 4),
    ]);
    let s = |v: &str| v.to_owned();
    // The whole tree from the root: one level.
    let whole = function_tree(&t, &[], Selection::RootPath, false, true, 1);
    assert!(whole.callers.is_none());
    let root = whole.callees.unwrap().root.unwrap();
    assert_eq!(
        (root.name.as_str(), root.total, root.has_children),
        ("", 10, true)
    );
    assert_eq!(node_names(&root), [(s("main"), 10, 0, true)]);
    assert!(root.children[0].children.is_empty(), "one level only");
    // An exact path, two levels.
    let path = function_tree(&t, &["main", "a"], Selection::RootPath, false, true, 2);
    let a = path.callees.unwrap().root.unwrap();
    assert_eq!((a.name.as_str(), a.total, a.self_), ("a", 7, 4));
    assert_eq!(node_names(&a), [(s("f"), 3, 0, true)]);
    assert_eq!(node_names(&a.children[0]), [(s("x"), 3, 0, true)]);
    assert!(a.children[0].children[0].children.is_empty());
    // Depth 0: the root alone, saying it has children.
    let bare = function_tree(&t, &["main"], Selection::RootPath, false, true, 0);
    let bare = bare.callees.unwrap().root.unwrap();
    assert!(bare.children.is_empty() && bare.has_children);
    // A function wherever it is: both occurrences of f, merged.
    let f = function_tree(&t, &["f"], Selection::FunctionChain, true, true, 3);
    let callees = f.callees.unwrap().root.unwrap();
    assert_eq!(
        (callees.name.as_str(), callees.total, callees.self_),
        ("f", 6, 2)
    );
    assert_eq!(node_names(&callees), [(s("x"), 4, 1, true)]);
    assert_eq!(node_names(&callees.children[0]), [(s("y"), 3, 3, false)]);
    let callers = f.callers.unwrap().root.unwrap();
    assert_eq!(
        (callers.name.as_str(), callers.total, callers.self_),
        ("f", 6, 2)
    );
    assert_eq!(
        node_names(&callers),
        [(s("a"), 3, 0, true), (s("b"), 3, 0, true)]
    );
    assert_eq!(node_names(&callers.children[0]), [(s("main"), 3, 0, false)]);
    // A chain: the callers of `b → f` are b's callers, the root is b.
    let chain = function_tree(&t, &["b", "f"], Selection::FunctionChain, true, true, 5);
    let up = chain.callers.unwrap().root.unwrap();
    assert_eq!((up.name.as_str(), up.total, up.self_), ("b", 3, 0));
    assert_eq!(node_names(&up), [(s("main"), 3, 0, false)]);
    let down = chain.callees.unwrap().root.unwrap();
    assert_eq!((down.name.as_str(), down.total, down.self_), ("f", 3, 2));
    // Nothing matches: the directions asked for are there, without a root.
    let none = function_tree(&t, &["zzz"], Selection::FunctionChain, true, true, 1);
    assert_eq!(none.callers, Some(t::CallTree::default()));
    assert_eq!(none.callees, Some(t::CallTree::default()));
    let none = function_tree(&t, &["a", "main"], Selection::RootPath, false, true, 1);
    assert_eq!(none.callees, Some(t::CallTree::default()));
}

/// The sandwich as `name total self [truncated]` lines, indented by depth.
fn render(report: &q::SandwichReport, node: &q::SandwichNode) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![(node, 0)];
    while let Some((n, depth)) = todo.pop() {
        out.push(format!(
            "{}{} {} {}{}",
            "  ".repeat(depth),
            report.names[n.name_index as usize],
            n.total,
            n.self_,
            if n.truncated { " truncated" } else { "" }
        ));
        todo.extend(n.children.iter().rev().map(|c| (c, depth + 1)));
    }
    out
}

#[test]
fn sandwich_has_every_caller_and_callee() {
    let t = tree(&[
        (&["main", "a", "f", "x"], 3),
        (&["main", "b", "f"], 2),
        (&["main", "b", "f", "x"], 1),
        (&["main", "a"], 4),
    ]);
    let s = sandwich(&t, "f", 0);
    assert_eq!((s.total, s.self_), (6, 2));
    let callers = s.callers.as_ref().unwrap();
    assert_eq!(
        render(&s, callers),
        [
            "f 6 0",
            "  a 3 0",
            "    main 3 0",
            "  b 3 0",
            "    main 3 0"
        ]
    );
    let callees = s.callees.as_ref().unwrap();
    assert_eq!(render(&s, callees), ["f 6 2", "  x 4 4"]);
    assert_eq!(s.names[0], "f");

    // A function the profile never saw: zero roots; an empty profile: nothing.
    let unseen = sandwich(&t, "nope", 10);
    assert_eq!(unseen.names, ["nope"]);
    assert_eq!(unseen.callers, Some(q::SandwichNode::default()));
    assert_eq!(unseen.callees, Some(q::SandwichNode::default()));
    assert_eq!(
        sandwich(&FlameTree::default(), "f", 10),
        q::SandwichReport::default()
    );
}

#[test]
fn sandwich_counts_recursion_once_in_total_and_per_occurrence_in_halves() {
    let t = tree(&[(&["main", "r", "r", "leaf"], 5), (&["main", "r"], 1)]);
    let s = sandwich(&t, "r", 0);
    assert_eq!((s.total, s.self_), (6, 1));
    // Both occurrences: the outer one (6) and the inner one (5).
    assert_eq!(
        render(&s, s.callers.as_ref().unwrap()),
        ["r 11 0", "  main 6 0", "  r 5 0", "    main 5 0"]
    );
    assert_eq!(
        render(&s, s.callees.as_ref().unwrap()),
        ["r 11 1", "  leaf 5 5", "  r 5 0", "    leaf 5 5"]
    );
}

#[test]
fn sandwich_halves_are_cut_separately_with_a_stand_in() {
    let mut stacks: Vec<(Vec<String>, i64)> = vec![(vec!["main".into(), "f".into()], 1)];
    for i in 0..20 {
        stacks.push((
            vec!["main".into(), "f".into(), format!("callee{i:02}")],
            i + 1,
        ));
    }
    stacks.push((vec!["main".into(), "f".into(), "fat".into()], 1000));
    let mut t = FlameTree::default();
    for (s, v) in &stacks {
        t.add_stack(s.iter().map(String::as_str), *v);
    }
    let s = sandwich(&t, "f", 3);
    let callees = s.callees.as_ref().unwrap();
    let lines = render(&s, callees);
    assert_eq!(
        lines,
        [
            "f 1211 1",
            "  fat 1000 1000",
            "  callee19 20 20",
            "  other 190 190 truncated"
        ]
    );
    let kept: i64 = callees.children.iter().map(|c| c.total).sum::<i64>() + callees.self_;
    assert_eq!(kept, callees.total, "the stand-in keeps the half whole");
    // The callers half is small and whole: the budget is not shared.
    assert_eq!(
        render(&s, s.callers.as_ref().unwrap()),
        ["f 1211 0", "  main 1211 0"]
    );
    assert_eq!(s.total, 1211);
}

#[test]
fn sandwich_halves_stop_at_the_depth_limit() {
    // One chain far deeper than the limit below `f` (as a location with thousands of inlined
    // lines makes it): the half stops at the limit with a stand-in carrying the rest.
    let deep: Vec<String> = std::iter::once("f".to_owned())
        .chain((0..MAX_SANDWICH_DEPTH * 3).map(|i| format!("g{i}")))
        .collect();
    let mut t = FlameTree::default();
    t.add_stack(deep.iter().map(String::as_str), 7);
    let s = sandwich(&t, "f", 0);
    let mut node = s.callees.as_ref().unwrap();
    let mut depth = 0;
    while let Some(child) = node.children.first() {
        assert_eq!(node.children.len(), 1);
        assert_eq!(child.total, 7, "every level keeps the whole value");
        node = child;
        depth += 1;
    }
    assert_eq!(depth, MAX_SANDWICH_DEPTH + 1);
    assert!(node.truncated);
    assert_eq!(s.names[node.name_index as usize], "other");
    assert_eq!((node.total, node.self_), (7, 7));
}

/// Stacks over a small alphabet, so that recursion and shared callers are common.
fn stacks() -> impl Strategy<Value = Vec<(Vec<String>, i64)>> {
    prop::collection::vec(
        (
            prop::collection::vec(
                prop::sample::select(vec!["a", "b", "c", "d", "other"]),
                1..7,
            )
            .prop_map(|v| v.into_iter().map(String::from).collect::<Vec<_>>()),
            1i64..1000,
        ),
        0..40,
    )
}

fn build(stacks: &[(Vec<String>, i64)]) -> FlameTree {
    let mut t = FlameTree::default();
    for (s, v) in stacks {
        t.add_stack(s.iter().map(String::as_str), *v);
    }
    t
}

/// Sum of a sandwich half's node values, checking that no node's children exceed it.
fn check_half(node: &q::SandwichNode, callees: bool) -> Result<usize, TestCaseError> {
    let mut count = 0;
    let mut todo = vec![node];
    while let Some(n) = todo.pop() {
        count += 1;
        let children: i64 = n.children.iter().map(|c| c.total).sum();
        if callees {
            prop_assert_eq!(children + n.self_, n.total);
        } else {
            prop_assert!(children <= n.total);
        }
        todo.extend(&n.children);
    }
    Ok(count)
}

proptest! {
    /// The table is the naive per-stack count: self sums to the profile's total, a function's
    /// total is the sum of the stacks containing it, and a limit changes no value.
    #[test]
    fn function_table_matches_a_naive_count(stacks in stacks(), limit in 0usize..6) {
        let t = build(&stacks);
        let mut model: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
        for (s, v) in &stacks {
            let distinct: BTreeSet<&str> = s.iter().map(String::as_str).collect();
            for name in distinct {
                model.entry(name).or_default().1 += v;
            }
            model.entry(s.last().unwrap()).or_default().0 += v;
        }
        let table = function_table(&t);
        prop_assert_eq!(table.functions.iter().map(|f| f.self_).sum::<i64>(), t.total());
        prop_assert_eq!(table.total, stacks.iter().map(|s| s.1).sum::<i64>());
        prop_assert_eq!(table.total_functions as usize, model.len());
        for f in &table.functions {
            prop_assert_eq!(Some(&(f.self_, f.total)), model.get(f.name.as_str()), "{}", f.name);
        }
        let mut limited = table.clone();
        limit_table(&mut limited, limit);
        prop_assert_eq!((limited.total, limited.total_functions), (table.total, table.total_functions));
        let n = if limit == 0 { table.functions.len() } else { limit.min(table.functions.len()) };
        prop_assert_eq!(&limited.functions[..], &table.functions[..n]);
        // Joined with itself: every row twice the same, the limit on the joined rows.
        let joined = join_tables(&table, &table, DiffRanking::LargerSelf);
        prop_assert_eq!(joined.len(), table.functions.len());
        for (p, f) in joined.iter().zip(&table.functions) {
            prop_assert_eq!((&p.left, &p.right), (f, f));
        }
    }

    /// A sandwich's total and self are the function table's; the callers' root is the sum of
    /// its occurrences (the table's total when it does not recurse); cutting a half keeps its
    /// root and its values whole.
    #[test]
    fn sandwich_agrees_with_the_table(stacks in stacks(), max_nodes in prop::sample::select(vec![0usize, 1, 2, 4, 1000])) {
        let t = build(&stacks);
        let table = function_table(&t);
        for f in ["a", "b", "other"] {
            let s = sandwich(&t, f, max_nodes);
            let Some(r) = table.functions.iter().find(|r| r.name == f) else {
                prop_assert_eq!(s.total, 0);
                continue;
            };
            prop_assert_eq!((s.total, s.self_), (r.total, r.self_));
            let occurrences: i64 = stacks
                .iter()
                .map(|(st, v)| st.iter().filter(|n| n.as_str() == f).count() as i64 * v)
                .sum();
            let callers = s.callers.as_ref().unwrap();
            let callees = s.callees.as_ref().unwrap();
            prop_assert_eq!(callers.total, occurrences);
            prop_assert_eq!(callees.total, occurrences);
            prop_assert_eq!(callees.self_, r.self_);
            let recursive = stacks.iter().any(|(st, _)| st.iter().filter(|n| n.as_str() == f).count() > 1);
            if !recursive {
                prop_assert_eq!(callers.total, r.total);
            }
            let whole = sandwich(&t, f, 0);
            prop_assert_eq!(whole.callers.as_ref().unwrap().total, callers.total);
            check_half(callees, true)?;
            check_half(callers, false)?;
            // A budget as large as the whole half cuts nothing.
            let whole_callees = whole.callees.as_ref().unwrap();
            if max_nodes >= check_half(whole_callees, true)? {
                prop_assert_eq!(render(&s, callees), render(&whole, whole_callees));
            }
        }
    }
}

proptest! {
    /// A function's call tree is its sandwich a few levels deep: the same root values on both
    /// sides, callee levels that add up, and the whole tree from the root path `[]`.
    #[test]
    fn function_trees_agree_with_sandwiches(stacks in stacks(), depth in 0usize..4) {
        let t = build(&stacks);
        for f in ["a", "b"] {
            let s = sandwich(&t, f, 0);
            let tree = function_tree(&t, &[f], Selection::FunctionChain, true, true, depth);
            let (callers, callees) = (tree.callers.unwrap(), tree.callees.unwrap());
            match (callers.root, callees.root) {
                (Some(up), Some(down)) => {
                    prop_assert_eq!(up.total, s.callers.as_ref().unwrap().total);
                    prop_assert_eq!(down.total, s.callees.as_ref().unwrap().total);
                    prop_assert_eq!(down.self_, s.self_);
                    let mut todo = vec![&down];
                    while let Some(n) = todo.pop() {
                        if !n.children.is_empty() {
                            let below: i64 = n.children.iter().map(|c| c.total).sum();
                            prop_assert_eq!(below + n.self_, n.total);
                        }
                        prop_assert_eq!(n.has_children, n.total != n.self_);
                        todo.extend(&n.children);
                    }
                }
                (None, None) => prop_assert_eq!(s.total, 0),
                other => prop_assert!(false, "one side without a root: {other:?}"),
            }
        }
        let whole = function_tree(&t, &[], Selection::RootPath, false, true, 64);
        let root = whole.callees.unwrap().root;
        prop_assert_eq!(root.map(|r| r.total).unwrap_or(0), t.total());
    }
}
