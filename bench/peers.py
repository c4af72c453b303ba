#!/usr/bin/env python3
"""The peers of `kiln bench --peers`: the same sample rows in DuckDB and in ClickHouse (chDB),
the same flame-graph, series and label-value queries, and bytes at rest; JSON on stdout.

Input (written by `kiln bench`): samples.parquet (service, pod, ts ns, stack_id, value),
stacks.parquet (stack_id, path: the trie node ids of the root-first stack) and nodes.parquet
(node_id, parent_id, name). Each peer gets the design its users would give it: samples sorted
by (service, ts), stacks stored once as a trie, a flame graph computed as the full tree of node
totals with names (what Kiln answers), and, for comparison, the cheaper sum by stack id.

usage: peers.py --dir DIR --end-ns NS --service NAME [--runs N]
"""

import argparse
import json
import os
import sys
import time

HOUR = 3_600_000_000_000
MINUTE = 60_000_000_000


def timed(fn, runs):
    ms = []
    out = None
    for _ in range(runs):
        t = time.perf_counter()
        out = fn()
        ms.append((time.perf_counter() - t) * 1000.0)
    ms.sort()
    pick = lambda q: ms[min(len(ms) * q // 100, len(ms) - 1)]
    return {"p50_ms": pick(50), "p99_ms": pick(99)}, out


# How far the unaligned hour ends before the data's end (Grafana's "last hour" ends now).
UNALIGNED_SHIFT = 433_000_000_000


def windows(end):
    return {
        "flame_1h": (end - HOUR, end),
        "flame_12h": (end - 12 * HOUR, end),
        "flame_1h_unaligned": (end - HOUR - UNALIGNED_SHIFT, end - UNALIGNED_SHIFT),
        "flame_30d": (end - 30 * 24 * HOUR, end),
    }


def duckdb_peer(d, end, service, runs):
    import duckdb

    path = os.path.join(d, "peer.duckdb")
    for f in (path, path + ".wal"):
        if os.path.exists(f):
            os.remove(f)
    con = duckdb.connect(path)
    t = time.perf_counter()
    con.execute(f"CREATE TABLE nodes AS SELECT * FROM read_parquet('{d}/nodes.parquet')")
    con.execute(f"CREATE TABLE stacks AS SELECT * FROM read_parquet('{d}/stacks.parquet')")
    con.execute(
        "CREATE TABLE samples AS SELECT service::VARCHAR AS service, pod::VARCHAR AS pod, ts, "
        f"stack_id, value FROM read_parquet('{d}/samples.parquet') ORDER BY service, ts"
    )
    con.execute("CHECKPOINT")
    load_s = time.perf_counter() - t
    rows = con.execute("SELECT count(*) FROM samples").fetchone()[0]
    size = sum(os.path.getsize(f) for f in (path, path + ".wal") if os.path.exists(f))

    def flame(start, stop):
        return con.execute(
            """
            WITH agg AS (
                SELECT stack_id, sum(value) AS v FROM samples
                WHERE service = ? AND ts >= ? AND ts < ? GROUP BY stack_id),
            totals AS (
                SELECT node_id, sum(v) AS total
                FROM (SELECT unnest(path) AS node_id, v FROM agg JOIN stacks USING (stack_id))
                GROUP BY node_id)
            SELECT n.name, n.parent_id, t.total FROM totals t JOIN nodes n USING (node_id)
            """,
            [service, start, stop],
        ).fetchall()

    def by_stack(start, stop):
        return con.execute(
            "SELECT stack_id, sum(value) FROM samples WHERE service = ? AND ts >= ? AND ts < ? "
            "GROUP BY stack_id",
            [service, start, stop],
        ).fetchall()

    out = {"load_s": load_s, "rows": rows, "bytes": size, "bytes_per_row": size / max(rows, 1)}
    for key, (start, stop) in windows(end).items():
        out[key], _ = timed(lambda: flame(start, stop), runs)
        out[key + "_by_stack"], result = timed(lambda: by_stack(start, stop), runs)
        out[key + "_total"] = sum(v for _, v in result)
    out["series_12h"], _ = timed(
        lambda: con.execute(
            "SELECT pod, ts // ? AS m, sum(value) FROM samples "
            "WHERE service = ? AND ts >= ? AND ts < ? GROUP BY pod, m",
            [MINUTE, service, end - 12 * HOUR, end],
        ).fetchall(),
        runs,
    )
    out["label_values"], _ = timed(
        lambda: con.execute(
            "SELECT DISTINCT pod FROM samples WHERE service = ? AND ts >= ? AND ts < ?",
            [service, end - 12 * HOUR, end],
        ).fetchall(),
        runs,
    )
    con.close()
    return out


def chdb_peer(d, end, service, runs):
    from chdb import session

    path = os.path.join(d, "peer.chdb")
    s = session.Session(path)
    q = lambda sql: s.query(sql, "CSV")
    t = time.perf_counter()
    q("DROP DATABASE IF EXISTS bench")
    q("CREATE DATABASE bench")
    q(
        "CREATE TABLE bench.samples (service LowCardinality(String), pod LowCardinality(String), "
        "ts Int64 CODEC(Delta, ZSTD(1)), stack_id UInt32 CODEC(ZSTD(1)), value Int64 CODEC(ZSTD(1))) "
        "ENGINE = MergeTree ORDER BY (service, ts)"
    )
    q(
        "INSERT INTO bench.samples SELECT toString(service), toString(pod), ts, stack_id, value "
        f"FROM file('{d}/samples.parquet', Parquet)"
    )
    q(
        "CREATE TABLE bench.stacks (stack_id UInt32, path Array(UInt32)) "
        "ENGINE = MergeTree ORDER BY stack_id"
    )
    q(f"INSERT INTO bench.stacks SELECT stack_id, path FROM file('{d}/stacks.parquet', Parquet)")
    q(
        "CREATE TABLE bench.nodes (node_id UInt32, parent_id UInt32, name String) "
        "ENGINE = MergeTree ORDER BY node_id"
    )
    q(f"INSERT INTO bench.nodes SELECT node_id, parent_id, name FROM file('{d}/nodes.parquet', Parquet)")
    for table in ("samples", "stacks", "nodes"):
        q(f"OPTIMIZE TABLE bench.{table} FINAL")
    load_s = time.perf_counter() - t
    rows = int(str(q("SELECT count() FROM bench.samples")).strip())
    size = int(
        str(q("SELECT sum(bytes_on_disk) FROM system.parts WHERE database = 'bench' AND active")).strip()
    )

    def flame(start, stop):
        return q(
            f"""
            WITH agg AS (
                SELECT stack_id, sum(value) AS v FROM bench.samples
                WHERE service = '{service}' AND ts >= {start} AND ts < {stop} GROUP BY stack_id)
            SELECT n.name, n.parent_id, t.total FROM (
                SELECT node_id, sum(v) AS total FROM agg
                INNER JOIN bench.stacks AS s USING (stack_id)
                ARRAY JOIN s.path AS node_id GROUP BY node_id) AS t
            INNER JOIN bench.nodes AS n USING (node_id)
            """
        )

    def by_stack(start, stop):
        return q(
            f"SELECT stack_id, sum(value) FROM bench.samples WHERE service = '{service}' "
            f"AND ts >= {start} AND ts < {stop} GROUP BY stack_id"
        )

    out = {"load_s": load_s, "rows": rows, "bytes": size, "bytes_per_row": size / max(rows, 1)}
    for key, (start, stop) in windows(end).items():
        out[key], _ = timed(lambda: flame(start, stop), runs)
        out[key + "_by_stack"], result = timed(lambda: by_stack(start, stop), runs)
        out[key + "_total"] = sum(int(line.split(",")[1]) for line in str(result).splitlines() if line)
    out["series_12h"], _ = timed(
        lambda: q(
            f"SELECT pod, intDiv(ts, {MINUTE}) AS m, sum(value) FROM bench.samples "
            f"WHERE service = '{service}' AND ts >= {end - 12 * HOUR} AND ts < {end} GROUP BY pod, m"
        ),
        runs,
    )
    out["label_values"], _ = timed(
        lambda: q(
            f"SELECT DISTINCT pod FROM bench.samples WHERE service = '{service}' "
            f"AND ts >= {end - 12 * HOUR} AND ts < {end}"
        ),
        runs,
    )
    s.close()
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--end-ns", type=int, required=True)
    p.add_argument("--service", required=True)
    p.add_argument("--runs", type=int, default=20)
    a = p.parse_args()
    d = os.path.abspath(a.dir)
    print("peers: DuckDB", file=sys.stderr)
    duck = duckdb_peer(d, a.end_ns, a.service, a.runs)
    print("peers: chDB", file=sys.stderr)
    ch = chdb_peer(d, a.end_ns, a.service, a.runs)
    json.dump({"duckdb": duck, "chdb": ch}, sys.stdout)


if __name__ == "__main__":
    main()
