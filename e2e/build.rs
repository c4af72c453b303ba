//! Sets `cfg(kiln_corpus)` when the real profiles of `../shared/corpus` are there, so the tests
//! that read them run, and are reported as ignored (skipped) rather than passed when they are not.

use std::path::Path;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(kiln_corpus)");
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus");
    if corpus.is_dir() {
        println!("cargo::rustc-cfg=kiln_corpus");
        // Rerun when the corpus changes (or goes away).
        println!("cargo::rerun-if-changed={}", corpus.display());
    } else {
        // Absent: checked again on a clean build or when this script changes, not on every
        // build (watching a path that does not exist would rebuild the tests each time).
        println!("cargo::rerun-if-changed=build.rs");
    }
}
