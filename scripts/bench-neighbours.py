#!/usr/bin/env python3
"""One tenant's queries against another's writes, on one `kiln serve`.

Tenant A writes small gzipped pprof profiles at a steady rate, acknowledged from the
write-ahead log (the default on a local store). Each phase measures A's acknowledgement latency and the segments the
server cut per second: first with nobody querying, then while tenant B asks for its own
flame graph at 50 Hz, then while A asks for its own at 50 Hz. Run it against two builds to
compare them; each run's figures are ratios within that run.

    python3 scripts/bench-neighbours.py target/release/kiln [--seconds 20] [--rate 100]
"""

import argparse
import gzip
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

CPU = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body, headers):
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()
        return resp.status


def metric(base, name):
    req = urllib.request.Request(base + "/metrics", headers={"X-Scope-OrgID": "ops"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            head, value = line.rsplit(" ", 1)
            if head == name or head.startswith(name + "{"):
                total += float(value)
    return total


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(number, payload):
    """A length-delimited protobuf field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def number(field_number, n):
    return varint(field_number << 3) + varint(n)


def pprof(time_nanos):
    """A small CPU profile as Go's runtime/pprof writes one (gzip): two stacks of three frames."""
    strings = ["", "cpu", "nanoseconds", "main", "work", "leaf", "idle"]
    p = field(1, number(1, 1) + number(2, 2))  # sample_type cpu/nanoseconds
    for stack, value in (([3, 2, 1], 30_000_000), ([4, 1], 10_000_000)):
        packed = b"".join(varint(i) for i in stack)
        p += field(2, field(1, packed) + field(2, varint(value)))
    for i, name in enumerate([3, 4, 5, 6], start=1):
        p += field(4, number(1, i) + field(4, number(1, i)))  # location -> function i
        p += field(5, number(1, i) + number(2, name))  # function i named
    for s in strings:
        p += field(6, s.encode())
    p += number(9, time_nanos) + number(10, 10_000_000_000)
    p += field(11, number(1, 1) + number(2, 2)) + number(12, 10_000_000)
    return gzip.compress(p, compresslevel=1)


def ingest(base, tenant, pod, secs):
    """One profile over `/ingest` as pprof, which the server acknowledges from its log."""
    url = f"{base}/ingest?name=shop.cpu%7Bpod%3D{pod}%7D&from={secs}&format=pprof"
    return post(url, pprof(secs * 1_000_000_000), {"X-Scope-OrgID": tenant})


def flame(base, tenant, now_ms):
    body = json.dumps(
        {
            "profileTypeID": CPU,
            "labelSelector": '{service_name="shop"}',
            "start": now_ms - 3_600_000,
            "end": now_ms + 60_000,
        }
    ).encode()
    return post(
        f"{base}/querier.v1.QuerierService/SelectMergeStacktraces",
        body,
        {"X-Scope-OrgID": tenant, "Content-Type": "application/json"},
    )


def phase(base, seconds, rate, querier):
    """A's writes for `seconds` at `rate` a second; `querier` (a tenant or None) at 50 Hz."""
    stop = threading.Event()
    acks = []
    lock = threading.Lock()
    queries = [0]

    def writer(i, writers):
        interval = writers / rate
        start = time.monotonic() + i * interval / writers
        n = 0
        while not stop.is_set():
            due = start + n * interval
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            t = time.monotonic()
            ingest(base, "team-a", f"p{i}", int(time.time()))
            with lock:
                acks.append((time.monotonic() - t) * 1000)
            n += 1

    def query():
        while not stop.is_set():
            t = time.monotonic()
            flame(base, querier, int(time.time() * 1000))
            queries[0] += 1
            pause = 0.02 - (time.monotonic() - t)
            if pause > 0:
                time.sleep(pause)

    writers = 8
    threads = [threading.Thread(target=writer, args=(i, writers)) for i in range(writers)]
    if querier:
        threads.append(threading.Thread(target=query))
    segments = metric(base, "kiln_storage_flushes_total")
    cuts = metric(base, "kiln_storage_barrier_cuts_total")
    started = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    acks.sort()
    return {
        "queries_by": querier or "-",
        "query_hz": round(queries[0] / elapsed, 1),
        "writes_per_s": round(len(acks) / elapsed, 1),
        "ack_p50_ms": round(statistics.median(acks), 2),
        "ack_p99_ms": round(acks[int(len(acks) * 0.99) - 1], 2),
        "segments_per_s": round(
            (metric(base, "kiln_storage_flushes_total") - segments) / elapsed, 2
        ),
        "barrier_cuts_per_s": round(
            (metric(base, "kiln_storage_barrier_cuts_total") - cuts) / elapsed, 2
        ),
    }


def main():
    args = argparse.ArgumentParser()
    args.add_argument("kiln")
    args.add_argument("--seconds", type=float, default=20)
    args.add_argument("--rate", type=float, default=100)
    a = args.parse_args()
    data = tempfile.mkdtemp(prefix="kiln-neighbours-")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(os.path.join(data, "kiln.log"), "w")
    server = subprocess.Popen(
        [
            a.kiln,
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
            "--data-dir",
            os.path.join(data, "data"),
            "--auth",
            "trusted-header",
            "--admin-tenant",
            "ops",
            "--self-profile",
            "false",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        for _ in range(200):
            try:
                with urllib.request.urlopen(base + "/ready", timeout=1):
                    break
            except OSError:
                time.sleep(0.1)
        now = int(time.time())
        ingest(base, "team-b", "b", now - 60)
        rows = [phase(base, a.seconds, a.rate, q) for q in (None, "team-b", "team-a")]
        keys = list(rows[0])
        print("| " + " | ".join(keys) + " |")
        print("|" + "---|" * len(keys))
        for r in rows:
            print("| " + " | ".join(str(r[k]) for k in keys) + " |")
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
