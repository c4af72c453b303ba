//! Tests that cannot run say so to the test command, never pass in silence: `scripts/test.sh`
//! finds [`MARKER`] in a test's output, counts the test as skipped and names it. Where the test
//! command installed everything (`CI` set), a missing tool is a failure; `../shared` may be
//! absent anywhere.

use std::path::Path;

/// What a skipped test prints, then its reason.
pub const MARKER: &str = "KILN-SKIPPED:";

/// Says that the test cannot run without `what` (a tool, a device), which the test command
/// installs. Under `CI` it panics: there, the absence is a failure.
#[track_caller]
pub fn missing(what: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "{what} is missing, and under CI the test command installs it \
         (scripts/install-test-deps.sh): a test that needs it cannot be skipped there"
    );
    eprintln!("{MARKER} {what} is missing (scripts/install-test-deps.sh installs it)");
}

/// Says that the test cannot run without `what` of `../shared` (the corpus, the fuzz findings),
/// which a checkout may not have.
pub fn shared_absent(what: &Path) {
    eprintln!("{MARKER} {} is absent (../shared)", what.display());
}
