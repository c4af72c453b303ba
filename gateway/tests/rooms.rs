//! The gateway's rooms, bottom to top (docs/ARCHITECTURE.md): a module uses only its own room
//! and those below it, and no modules use each other in a cycle.

/// Bottom to top.
const ROOMS: &[(&str, &[&str])] = &[
    ("base", &["error", "time", "units", "metrics"]),
    ("auth", &["auth"]),
    ("tenants", &["tenants"]),
    ("recording", &["recording"]),
    ("app", &["app"]),
    ("transport", &["transport"]),
    ("api", &["api"]),
    ("server", &["server"]),
    ("cli", &["cli"]),
];

#[test]
fn rooms() {
    kiln_rooms::assert_rooms(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        ROOMS,
    );
}
