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
# A build of the test graph takes about 15 GiB. A cached target on a full disk would fail the
# run part-way: start cold instead, which fits in CI's hour.
if [ -n "${CI:-}" ] && [ -d "$target/debug" ]; then
  free_kib=$(df -Pk "$target" | awk 'NR == 2 { print $4 }')
  if [ "${free_kib:-0}" -lt $((20 * 1024 * 1024)) ]; then
    echo "test.sh: $((free_kib / 1024)) MiB free; removing the cached build in $target/debug"
    rm -rf "$target/debug"
  fi
fi
export KILN_TEST_VENV="${KILN_TEST_VENV:-$target/test-venv}"
export KILN_TEST_GO115_DIR="${KILN_TEST_GO115_DIR:-$target/go1.15}"
export KILN_TEST_GO115="$KILN_TEST_GO115_DIR/usr/lib/go-1.15/bin/go"
export CARGO_INCREMENTAL=0
export CARGO_TERM_COLOR=never

started=$(date +%s)
bash "$root/scripts/install-test-deps.sh"
# PostgreSQL and an S3-compatible server on 127.0.0.1, stopped when the run ends.
services=$(bash "$root/scripts/test-services.sh")
eval "$services"
trap 'bash "$root/scripts/test-services.sh" stop' EXIT

cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
# The libraries and binaries alone: without the test targets' features (kiln-storage's `testing`),
# as `cargo build --release` builds them, where an import only tests use is unused.
cargo clippy --workspace -- -D warnings

if ! command -v cargo-nextest >/dev/null 2>&1; then
  echo "test.sh: cargo-nextest not found; installing it"
  cargo install --locked cargo-nextest
fi
# One build of the test graph only (a separate `cargo build` would rebuild it with other features).
cargo nextest run --workspace --no-fail-fast "$@" 2>&1 | tee "$target/nextest.log"
rust_passed=$(sed -n 's/.* tests\{0,1\} run: \([0-9]*\) passed.*/\1/p' "$target/nextest.log" | tail -n 1)
# The tests that did not run: ignored by the build (../shared or a JDK absent), or returned
# after saying so (kiln_otel::skip). They are named, and counted as skipped, not passed.
cargo nextest list --workspace --run-ignored only --message-format oneline "$@" \
  > "$target/ignored.txt" 2>/dev/null || : > "$target/ignored.txt"
python3 "$root/scripts/skipped.py" "$root/target/nextest/default/junit.xml" "$target/ignored.txt" \
  > "$target/skipped.txt"
ran_but_skipped=$(sed -n 's/^ran-but-skipped //p' "$target/skipped.txt")
skipped=$(sed -n 's/^skipped \([0-9]*\)$/\1/p' "$target/skipped.txt")
rust_passed=$(( ${rust_passed:-0} - ran_but_skipped ))

# The Grafana plugin: frontend build and unit tests, packaging with the backend binary the test
# build made, and the flame graph frame the plugin produced in the e2e run drawn by
# @grafana/flamegraph in headless Chromium.
echo "test.sh: Grafana plugin frontend"
KILN_PLUGIN_BIN="$target/debug/gpx_kiln" bash "$root/grafana-plugin/build.sh" 2>&1 | tee "$target/plugin-build.log"
(cd "$root/grafana-plugin/frontend" && npm test) 2>&1 | tee "$target/frontend-test.log"
jest_passed=$(sed -n 's/^Tests: *\([0-9]*\) passed.*/\1/p' "$target/plugin-build.log" "$target/frontend-test.log" | awk '{ s += $1 } END { print s + 0 }')
frame="$target/debug/grafana-flamegraph-frame.json"
if [ -f "$frame" ]; then
  (cd "$root/grafana-plugin/frontend/render-test" && { [ -d node_modules ] || npm ci --no-audit --no-fund; } \
    && node run.mjs "$frame" graf_checkout)
else
  echo "test.sh: $frame is missing (the e2e Grafana test writes it)" >&2
  exit 1
fi
echo "test.sh: done in $(( $(date +%s) - started )) s"
grep '^skipped: ' "$target/skipped.txt" | sed 's/^/test.sh: /' || true
# Under CI the test command installed every tool: only ../shared may be absent.
if [ -n "${CI:-}" ] && [ "$skipped" -gt 0 ] && [ -d "$root/../shared" ]; then
  echo "test.sh: $skipped test(s) did not run under CI, where nothing they need may be missing" >&2
  exit 1
fi
# Every step above stops the script on a failure, so reaching here means none failed.
echo "all: $(( rust_passed + ${jest_passed:-0} + 1 )) passed, 0 failed, $skipped skipped"
