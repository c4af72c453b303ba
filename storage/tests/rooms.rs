//! The storage engine's rooms, bottom to top (docs/ARCHITECTURE.md): a module uses only its own
//! room and those below it, and no modules use each other in a cycle.

/// Bottom to top.
const ROOMS: &[(&str, &[&str])] = &[
    ("base", &["error", "clock", "metrics", "selector"]),
    ("format", &["format"]),
    ("store", &["store"]),
    ("metastore", &["metastore"]),
    ("caches", &["caches"]),
    ("writer", &["writer"]),
    ("query", &["query"]),
    ("compaction", &["compaction"]),
    ("facade", &["storage"]),
    // What tests and fuzz targets build on: anything below.
    ("support", &["testing", "fuzz"]),
];

#[test]
fn rooms() {
    kiln_rooms::assert_rooms(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        ROOMS,
    );
}
