#!/bin/sh
# Lays out Kiln's image under ROOT: the binary at /usr/local/bin/kiln, user and group kiln
# (10001) without a shell, and /data owned by it. The Dockerfile runs it with ROOT=/; the test
# command runs it on a scratch directory (e2e/tests/e2e/deploy.rs).
# Usage: layout.sh BINARY ROOT
set -eu
bin=$1
root=$2
install -d "$root/usr/local/bin" "$root/data" "$root/etc"
install -m 0755 "$bin" "$root/usr/local/bin/kiln"
if [ "$root" = "/" ]; then
    groupadd --system --gid 10001 kiln
    useradd --system --uid 10001 --gid 10001 --home-dir /data --shell /usr/sbin/nologin kiln
    chown 10001:10001 /data
else
    # A scratch root: the user's line as useradd writes it, for the test to read.
    echo "kiln:x:10001:10001::/data:/usr/sbin/nologin" >> "$root/etc/passwd"
fi
