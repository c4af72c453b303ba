#!/usr/bin/env bash
# Kiln's one test command: installs what the tests need (Go, pyroscope-io, py-spy,
# @pyroscope/nodejs), then builds and runs every test of the workspace with cargo-nextest.
# Usage: scripts/test.sh [extra nextest args]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

# CI runs in a fresh clone: keep the build outside it so a repeat run on the same machine is
# incremental. Locally, ./target as usual.
if [ -n "${CI:-}" ] && [ -z "${CARGO_TARGET_DIR:-}" ]; then
  export CARGO_TARGET_DIR="${HOME:-/root}/.cache/kiln/target"
fi
target="${CARGO_TARGET_DIR:-$root/target}"
export KILN_TEST_VENV="${KILN_TEST_VENV:-$target/test-venv}"
export CARGO_INCREMENTAL=0
export CARGO_TERM_COLOR=never

started=$(date +%s)
bash "$root/scripts/install-test-deps.sh"

cargo fmt --all --check

if ! command -v cargo-nextest >/dev/null 2>&1; then
  echo "test.sh: cargo-nextest not found; installing it"
  cargo install --locked cargo-nextest
fi
# One build of the test graph only (a separate `cargo build` would rebuild it with other features).
cargo nextest run --workspace --no-fail-fast "$@"
echo "test.sh: done in $(( $(date +%s) - started )) s"
