//! Sets `cfg(kiln_corpus)` when the real profiles of `../shared/corpus` are there, and
//! `cfg(kiln_jdk)` when a JDK (`java`, `javac` and `jfr`) is on the `PATH`, so the tests that need
//! them run, and are reported as ignored (skipped) rather than passed when they are not.

use std::path::Path;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(kiln_corpus)");
    println!("cargo::rustc-check-cfg=cfg(kiln_jdk)");
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
    // The JDK: `scripts/install-test-deps.sh` installs Debian's openjdk-17-jdk-headless.
    println!("cargo::rerun-if-env-changed=PATH");
    let on_path = |tool: &str| {
        std::env::var_os("PATH")
            .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).is_file()))
    };
    if ["java", "javac", "jfr"].iter().all(|t| on_path(t)) {
        println!("cargo::rustc-cfg=kiln_jdk");
    }
}
