#!/usr/bin/env bash
# Installs everything Kiln's tests need on a Debian machine: Go (for runtime/pprof and the
# symbolization tests' Go programs), g++, binutils and debuginfod (symbolization), openssl
# (test keys), Prometheus (the recording rules' remote-write receiver), PostgreSQL and a JDK (java, javac and jfr: the JFR test records a Java program with
# the JDK's own flight recorder) and haproxy (the cluster test's load balancer) from apt, the Python clients (pyroscope-io, pyroscope-otel, py-spy,
# the opentelemetry-proto stubs with grpcio), moto's S3 server and kubernetes-validate (the
# deployment manifests' schemas) in a venv under the build
# directory, @pyroscope/nodejs under e2e/clients/node, playwright-core (drives Debian's chromium
# through the web UI) under e2e/clients/browser, Microsoft's Azurite and s3rver (object
# store servers besides moto) under e2e/servers, Debian's chromium for the flame graph render
# test and graphviz (`dot`) for the DOT render test (the plugin frontend's npm packages are installed
# by grafana-plugin/build.sh and test.sh), and Go 1.15 from Debian 11's archive under the build
# directory (its programs carry Go's 1.2 line table layout, which no current Go writes).
# Idempotent: a second run only checks.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

need_apt=()
command -v go >/dev/null 2>&1 || need_apt+=(golang-go)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
command -v jfr >/dev/null 2>&1 || need_apt+=(openjdk-17-jdk-headless)
[ -x /usr/bin/chromium ] || need_apt+=(chromium)
command -v dot >/dev/null 2>&1 || need_apt+=(graphviz)
# Native symbolization's tests: programs built with gcc, g++ (and rustc, go), split with binutils'
# objcopy and strip, named by binutils' addr2line, served by Debian's debuginfod.
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
command -v addr2line >/dev/null 2>&1 && command -v objcopy >/dev/null 2>&1 || need_apt+=(binutils)
command -v debuginfod >/dev/null 2>&1 || need_apt+=(debuginfod)
# Recording rules' tests: a real Prometheus takes Kiln's remote writes.
command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt+=(postgresql)
# The cluster test: Debian's haproxy in front of six processes (deploy/haproxy/kiln.cfg).
[ -x /usr/sbin/haproxy ] || command -v haproxy >/dev/null 2>&1 || need_apt+=(haproxy)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "install-test-deps: apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

venv="${KILN_TEST_VENV:-${CARGO_TARGET_DIR:-$root/target}/test-venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import pyroscope, pyroscope.otel, grpc, opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2_grpc" 2>/dev/null || [ ! -x "$venv/bin/py-spy" ] || [ ! -x "$venv/bin/moto_server" ] || [ ! -x "$venv/bin/kubernetes-validate" ] || ! "$venv/bin/python" -c "import duckdb, chdb, mcp" 2>/dev/null; then
  echo "install-test-deps: pip install into $venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$root/e2e/clients/python/requirements.txt"
fi

if [ ! -d "$root/e2e/clients/node/node_modules/@pyroscope/nodejs" ] || [ ! -d "$root/e2e/clients/node/node_modules/@connectrpc/connect-node" ]; then
  echo "install-test-deps: npm ci in e2e/clients/node"
  (cd "$root/e2e/clients/node" && npm ci --no-audit --no-fund --loglevel=error)
fi
if [ ! -d "$root/e2e/clients/browser/node_modules/playwright-core" ]; then
  echo "install-test-deps: npm ci in e2e/clients/browser (playwright-core, for the web UI's tests)"
  (cd "$root/e2e/clients/browser" && npm ci --no-audit --no-fund --loglevel=error)
fi
if [ ! -x "$root/e2e/servers/node_modules/.bin/azurite-blob" ] || [ ! -x "$root/e2e/servers/node_modules/.bin/s3rver" ]; then
  echo "install-test-deps: npm ci in e2e/servers (Azurite, s3rver)"
  (cd "$root/e2e/servers" && npm ci --no-audit --no-fund --loglevel=error)
fi
# Go 1.15 (Debian 11's golang-1.15), unpacked beside the venv: pinned by hash.
go115="${KILN_TEST_GO115_DIR:-${CARGO_TARGET_DIR:-$root/target}/go1.15}"
if [ ! -x "$go115/usr/lib/go-1.15/bin/go" ]; then
  echo "install-test-deps: Go 1.15 from Debian 11 into $go115"
  mkdir -p "$go115"
  pool=http://deb.debian.org/debian/pool/main/g/golang-1.15
  for deb in \
    "golang-1.15-go_1.15.15-1~deb11u4_amd64.deb 33f6680406698b60370322aa5710be199006b3d66fbb0974b44da012de3aa82a" \
    "golang-1.15-src_1.15.15-1~deb11u4_amd64.deb e580f570f706d801191f9a17e55156736fc5979a6a878bab9304ca007ae29941"; do
    set -- $deb
    curl -sSf --retry 3 -o "$go115/$1" "$pool/$1"
    echo "$2  $go115/$1" | sha256sum -c --quiet -
    dpkg-deb -x "$go115/$1" "$go115"
    rm "$go115/$1"
  done
fi

echo "install-test-deps: ready (go $(go version | awk '{print $3}'), $(java -version 2>&1 | head -1), venv $venv)"
