use super::*;

/// A crate's `src` of `files` (path, text) in a temporary directory.
fn crate_of(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let p = dir.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    dir
}

const ROOMS: &[(&str, &[&str])] = &[("base", &["error"]), ("low", &["low"]), ("high", &["high"])];

fn layered(low_text: &str) -> tempfile::TempDir {
    crate_of(&[
        ("lib.rs", "pub mod error; pub mod high; pub mod low;"),
        ("error.rs", "pub struct Error;"),
        ("low.rs", low_text),
        (
            "high.rs",
            "use crate::low::Thing; pub fn f(_: Thing) -> crate::error::Error { crate::error::Error }",
        ),
    ])
}

#[test]
fn uses_down_the_rooms_pass() {
    let dir =
        layered("pub struct Thing; pub fn g() -> crate::error::Error { crate::error::Error }");
    assert_eq!(check(dir.path(), ROOMS), vec![]);
}

#[test]
fn a_use_up_the_rooms_is_named_with_its_file() {
    let dir = layered("use crate::high::f; pub struct Thing;");
    let breaches = check(dir.path(), ROOMS);
    assert!(
        breaches
            .iter()
            .any(|b| matches!(b, Breach::Upward { from_room, to_room, at }
            if from_room == "low" && to_room == "high" && at.file == Path::new("low.rs")
                && at.path == "crate::high::f")),
        "{breaches:?}"
    );
    // And the two rooms now make a cycle.
    assert!(
        breaches
            .iter()
            .any(|b| matches!(b, Breach::Cycle { parent, .. } if parent.is_empty())),
        "{breaches:?}"
    );
}

#[test]
fn paths_in_code_and_groups_count_as_uses() {
    let in_code = layered("pub struct Thing; fn g() { let _ = crate::high::f; }");
    assert!(!check(in_code.path(), ROOMS).is_empty());
    let grouped = layered("use crate::{error::Error, high::{self}}; pub struct Thing;");
    assert!(!check(grouped.path(), ROOMS).is_empty());
}

#[test]
fn test_code_and_comments_are_not_uses() {
    let dir = layered(
        "//! Used by [`crate::high`].\n\
         pub struct Thing;\n\
         #[cfg(test)] mod tests { use crate::high::f; }\n\
         #[cfg(test)] fn t() { crate::high::f(Thing); }\n\
         #[cfg(test)] mod more;",
    );
    std::fs::create_dir_all(dir.path().join("low")).unwrap();
    std::fs::write(dir.path().join("low/tests.rs"), "use crate::high::f;").unwrap();
    assert_eq!(check(dir.path(), ROOMS), vec![]);
}

#[test]
fn a_cycle_between_submodules_is_found_through_super() {
    let dir = crate_of(&[
        ("lib.rs", "pub mod error; pub mod high; pub mod low;"),
        ("error.rs", ""),
        ("high.rs", ""),
        ("low.rs", "mod a; mod b;"),
        ("low/a.rs", "use super::b::B; pub struct A;"),
        ("low/b.rs", "pub struct B; fn f(_: super::a::A) {}"),
    ]);
    let breaches = check(dir.path(), ROOMS);
    assert!(
        matches!(&breaches[..], [Breach::Cycle { parent, uses }]
            if parent == &["low".to_owned()] && uses.len() == 2),
        "{breaches:?}"
    );
}

#[test]
fn a_child_may_use_its_parent_and_a_module_in_no_room_is_named() {
    let dir = crate_of(&[
        ("lib.rs", "pub mod error; pub mod low; pub mod stray;"),
        ("error.rs", ""),
        ("low.rs", "mod a; pub struct Top;"),
        ("low/a.rs", "use super::Top; use crate::low::Top as T;"),
        ("stray.rs", ""),
    ]);
    assert_eq!(
        check(dir.path(), ROOMS),
        vec![Breach::Unlisted {
            module: "stray".into()
        }]
    );
}
