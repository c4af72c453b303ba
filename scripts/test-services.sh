#!/usr/bin/env bash
# Starts the servers Kiln's tests run against, on 127.0.0.1 only, and prints the environment
# that points the tests at them:
#
#   eval "$(bash scripts/test-services.sh)"        # start (again, from a clean slate)
#   bash scripts/test-services.sh stop
#
# - PostgreSQL (Debian's `postgresql`, installed by install-test-deps.sh): a private cluster in
#   a temporary directory on port KILN_TEST_POSTGRES_PORT (55432). Its server refuses to run as
#   root, so as root it runs as the `postgres` user. Each test creates its own database.
# - An S3-compatible server: moto's server (PyPI `moto[server]`, in the test venv) on port
#   KILN_TEST_S3_PORT (55433) with the bucket `kiln-test`. Each test uses its own prefix.
# Everything else goes to stderr, so only the exports reach `eval`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pg_port="${KILN_TEST_POSTGRES_PORT:-55432}"
pg_dir="${TMPDIR:-/tmp}/kiln-test-postgres-$pg_port"
s3_port="${KILN_TEST_S3_PORT:-55433}"
s3_dir="${TMPDIR:-/tmp}/kiln-test-s3-$s3_port"
venv="${KILN_TEST_VENV:-${CARGO_TARGET_DIR:-$root/target}/test-venv}"

pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
if [ -z "$pg_bin" ] || [ ! -x "$pg_bin/initdb" ]; then
  echo "test-services: PostgreSQL is not installed (scripts/install-test-deps.sh installs it)" >&2
  exit 1
fi

as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

stop_pg() {
  if [ -f "$pg_dir/data/postmaster.pid" ]; then
    as_pg "$pg_bin/pg_ctl" -D "$pg_dir/data" -m immediate -w stop >&2 || true
  fi
  rm -rf "$pg_dir"
}

stop_s3() {
  if [ -f "$s3_dir/pid" ]; then
    kill "$(cat "$s3_dir/pid")" 2>/dev/null || true
  fi
  rm -rf "$s3_dir"
}

if [ "${1:-start}" = stop ]; then
  stop_pg
  stop_s3
  exit 0
fi

stop_pg
stop_s3
mkdir -p "$pg_dir"
[ "$(id -u)" = 0 ] && chown postgres "$pg_dir"
as_pg "$pg_bin/initdb" -D "$pg_dir/data" -U kiln --auth=trust -E UTF8 --no-instructions >/dev/null
# A test server: no fsync (the tests kill kiln, never PostgreSQL), connections for parallel tests.
as_pg "$pg_bin/pg_ctl" -D "$pg_dir/data" -l "$pg_dir/server.log" -w \
  -o "-p $pg_port -k $pg_dir -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=400" \
  start >&2

if [ ! -x "$venv/bin/moto_server" ]; then
  echo "test-services: $venv/bin/moto_server is missing (scripts/install-test-deps.sh installs it)" >&2
  exit 1
fi
mkdir -p "$s3_dir"
setsid "$venv/bin/moto_server" -H 127.0.0.1 -p "$s3_port" >"$s3_dir/server.log" 2>&1 < /dev/null &
echo $! > "$s3_dir/pid"
"$venv/bin/python" - "$s3_port" <<'PY' >&2
import sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/kiln-test"
for _ in range(100):
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="PUT"), timeout=2)
        print("test-services: S3 (moto) ready with bucket kiln-test")
        break
    except OSError:
        time.sleep(0.2)
else:
    sys.exit("test-services: moto_server did not start")
PY

echo "export KILN_TEST_POSTGRES_URL=postgres://kiln@127.0.0.1:$pg_port/postgres"
echo "export KILN_TEST_S3_ENDPOINT=http://127.0.0.1:$s3_port"
echo "export KILN_TEST_S3_BUCKET=kiln-test"
