#!/usr/bin/env bash
# Starts the servers Kiln's tests run against, on 127.0.0.1 only, and prints the environment
# that points the tests at them:
#
#   eval "$(bash scripts/test-services.sh)"        # start (again, from a clean slate)
#   bash scripts/test-services.sh stop
#
# - PostgreSQL (Debian's `postgresql`, installed by install-test-deps.sh): a private cluster in
#   a temporary directory on port KILN_TEST_POSTGRES_PORT (55432). Its server refuses to run as
#   root, so as root it runs as the `postgres` user. Each test creates its own database. It
#   takes TLS too (`ssl=on`), with a CA, server and client certificates in KILN_TEST_POSTGRES_TLS.
# - An S3-compatible server: moto's server (PyPI `moto[server]`, in the test venv) on port
#   KILN_TEST_S3_PORT (55433) with the bucket `kiln-test`. Each test uses its own prefix.
# - The object stores users run besides (npm, under e2e/servers): Microsoft's Azurite blob
#   emulator on KILN_TEST_AZURITE_PORT (55434, container `kiln-test`, in memory, telemetry off)
#   and s3rver, a second S3 implementation, on KILN_TEST_S3RVER_PORT (55435, bucket `kiln-test`).
# Everything else goes to stderr, so only the exports reach `eval`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pg_port="${KILN_TEST_POSTGRES_PORT:-55432}"
pg_dir="${TMPDIR:-/tmp}/kiln-test-postgres-$pg_port"
s3_port="${KILN_TEST_S3_PORT:-55433}"
s3_dir="${TMPDIR:-/tmp}/kiln-test-s3-$s3_port"
venv="${KILN_TEST_VENV:-${CARGO_TARGET_DIR:-$root/target}/test-venv}"
az_port="${KILN_TEST_AZURITE_PORT:-55434}"
s3rver_port="${KILN_TEST_S3RVER_PORT:-55435}"
stores_dir="${TMPDIR:-/tmp}/kiln-test-stores-$az_port"
servers="$root/e2e/servers/node_modules/.bin"

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

stop_stores() {
  for pid in "$stores_dir"/*.pid; do
    [ -f "$pid" ] && kill "$(cat "$pid")" 2>/dev/null || true
  done
  rm -rf "$stores_dir"
}

if [ "${1:-start}" = stop ]; then
  stop_pg
  stop_s3
  stop_stores
  exit 0
fi

stop_pg
stop_s3
stop_stores
mkdir -p "$pg_dir"
[ "$(id -u)" = 0 ] && chown postgres "$pg_dir"
as_pg "$pg_bin/initdb" -D "$pg_dir/data" -U kiln --auth=trust -E UTF8 --no-instructions >/dev/null
# TLS with a CA of its own (server certificate for 127.0.0.1 and localhost, a client
# certificate for the tests of sslcert), so sslmode's checks run against a real server.
tls="$pg_dir/tls"
mkdir -p "$tls"
openssl req -x509 -newkey rsa:2048 -nodes -days 7 -subj "/CN=kiln test CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -keyout "$tls/ca.key" -out "$tls/ca.pem" 2>/dev/null
for who in server client; do
  if [ "$who" = server ]; then
    ext="subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth"
  else
    ext="extendedKeyUsage=clientAuth"
  fi
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kiln-$who" \
    -keyout "$tls/$who.key" -out "$tls/$who.csr" 2>/dev/null
  openssl x509 -req -in "$tls/$who.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" -CAcreateserial \
    -days 7 -out "$tls/$who.pem" \
    -extfile <(printf "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n$ext\n") 2>/dev/null
done
chmod 600 "$tls"/*.key
[ "$(id -u)" = 0 ] && chown -R postgres "$tls"
# A test server: no fsync (the tests kill kiln, never PostgreSQL), connections for parallel tests.
as_pg "$pg_bin/pg_ctl" -D "$pg_dir/data" -l "$pg_dir/server.log" -w \
  -o "-p $pg_port -k $pg_dir -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=400 -c ssl=on -c ssl_cert_file=$tls/server.pem -c ssl_key_file=$tls/server.key -c ssl_ca_file=$tls/ca.pem" \
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

if [ ! -x "$servers/azurite-blob" ] || [ ! -x "$servers/s3rver" ]; then
  echo "test-services: Azurite and s3rver are missing (scripts/install-test-deps.sh installs them)" >&2
  exit 1
fi
mkdir -p "$stores_dir/s3rver"
setsid "$servers/azurite-blob" --blobHost 127.0.0.1 --blobPort "$az_port" --inMemoryPersistence \
  --disableTelemetry --skipApiVersionCheck --silent \
  >"$stores_dir/azurite.log" 2>&1 < /dev/null &
echo $! > "$stores_dir/azurite.pid"
setsid "$servers/s3rver" --address 127.0.0.1 --port "$s3rver_port" --directory "$stores_dir/s3rver" \
  --configure-bucket kiln-test --silent >"$stores_dir/s3rver.log" 2>&1 < /dev/null &
echo $! > "$stores_dir/s3rver.pid"
"$venv/bin/python" - "$az_port" "$s3rver_port" <<'PY' >&2
# Azurite's container, created with the emulator's well-known account key (SharedKey), and
# s3rver's bucket, which it makes itself: wait until both answer.
import base64, hashlib, hmac, sys, time, urllib.error, urllib.request
from email.utils import formatdate
az, s3 = sys.argv[1], sys.argv[2]
account = "devstoreaccount1"
key = base64.b64decode("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==")
def create_container():
    date, version = formatdate(usegmt=True), "2021-08-06"
    to_sign = "\n".join(["PUT"] + [""] * 11 + [
        f"x-ms-date:{date}\nx-ms-version:{version}",
        f"/{account}/{account}/kiln-test\nrestype:container"])
    sig = base64.b64encode(hmac.new(key, to_sign.encode(), hashlib.sha256).digest()).decode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{az}/{account}/kiln-test?restype=container", method="PUT",
        headers={"x-ms-date": date, "x-ms-version": version, "Content-Length": "0",
                 "Authorization": f"SharedKey {account}:{sig}"})
    urllib.request.urlopen(req, timeout=2)
for what, ready in [
    ("Azurite", create_container),
    ("s3rver", lambda: urllib.request.urlopen(f"http://127.0.0.1:{s3}/kiln-test", timeout=2)),
]:
    for _ in range(150):
        try:
            ready()
            print(f"test-services: {what} ready with kiln-test")
            break
        except urllib.error.HTTPError as e:
            if what == "Azurite" and e.code == 409:  # the container is there
                print(f"test-services: {what} ready with kiln-test")
                break
            time.sleep(0.2)
        except OSError:
            time.sleep(0.2)
    else:
        sys.exit(f"test-services: {what} did not start")
PY

echo "export KILN_TEST_POSTGRES_URL=postgres://kiln@127.0.0.1:$pg_port/postgres"
echo "export KILN_TEST_POSTGRES_TLS=$tls"
echo "export KILN_TEST_S3_ENDPOINT=http://127.0.0.1:$s3_port"
echo "export KILN_TEST_S3_BUCKET=kiln-test"
echo "export KILN_TEST_AZURITE_ENDPOINT=http://127.0.0.1:$az_port"
echo "export KILN_TEST_S3RVER_ENDPOINT=http://127.0.0.1:$s3rver_port"
