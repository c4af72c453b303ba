#!/usr/bin/env python3
"""The peers of `kiln bench --peers`: the same sample rows in DuckDB and in ClickHouse (chDB),
the same flame-graph, series and label-value queries, and bytes at rest; JSON on stdout.

Input (written by `kiln bench`): samples.parquet (service, pod, ts ns, stack_id, value),
stacks.parquet (stack_id, path: the trie node ids of the root-first stack), nodes.parquet
(node_id, parent_id, name) and queries.json (the queries Kiln was timed on: key, kind of
flame / series / label_values, services selected (none: all), start and end ns, step_nanos).
Each peer gets the design its users would give it: samples sorted by (service, ts), stacks
stored once as a trie, a flame graph computed as the full tree of node totals with names (what
Kiln answers), and, for comparison, the cheaper sum by stack id (which gives the total).

usage: peers.py --dir DIR --queries FILE [--runs N]
"""

import argparse
import json
import os
import sys
import time


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


def where(query):
    """The query's selection as SQL: its services (names the bench made: no quoting needed)
    and its time range."""
    clauses = [f"ts >= {query['start']}", f"ts < {query['end']}"]
    if query["services"]:
        names = ", ".join(f"'{s}'" for s in query["services"])
        clauses.insert(0, f"service IN ({names})")
    return " AND ".join(clauses)


def duckdb_peer(d, queries, runs):
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

    def flame(w):
        return con.execute(
            f"""
            WITH agg AS (SELECT stack_id, sum(value) AS v FROM samples WHERE {w} GROUP BY stack_id),
            totals AS (
                SELECT node_id, sum(v) AS total
                FROM (SELECT unnest(path) AS node_id, v FROM agg JOIN stacks USING (stack_id))
                GROUP BY node_id)
            SELECT n.name, n.parent_id, t.total FROM totals t JOIN nodes n USING (node_id)
            """
        ).fetchall()

    out = {"load_s": load_s, "rows": rows, "bytes": size, "bytes_per_row": size / max(rows, 1)}
    for query in queries:
        key, w = query["key"], where(query)
        if query["kind"] == "flame":
            out[key], _ = timed(lambda: flame(w), runs)
            out[key + "_by_stack"], result = timed(
                lambda: con.execute(
                    f"SELECT stack_id, sum(value) FROM samples WHERE {w} GROUP BY stack_id"
                ).fetchall(),
                runs,
            )
            out[key + "_total"] = sum(v for _, v in result)
        elif query["kind"] == "series":
            sql = (
                f"SELECT pod, ts // {query['step_nanos']} AS m, sum(value) FROM samples "
                f"WHERE {w} GROUP BY pod, m"
            )
            out[key], _ = timed(lambda: con.execute(sql).fetchall(), runs)
        else:
            sql = f"SELECT DISTINCT pod FROM samples WHERE {w}"
            out[key], _ = timed(lambda: con.execute(sql).fetchall(), runs)
    con.close()
    return out


def chdb_peer(d, queries, runs):
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

    def flame(w):
        return q(
            f"""
            WITH agg AS (
                SELECT stack_id, sum(value) AS v FROM bench.samples WHERE {w} GROUP BY stack_id)
            SELECT n.name, n.parent_id, t.total FROM (
                SELECT node_id, sum(v) AS total FROM agg
                INNER JOIN bench.stacks AS s USING (stack_id)
                ARRAY JOIN s.path AS node_id GROUP BY node_id) AS t
            INNER JOIN bench.nodes AS n USING (node_id)
            """
        )

    out = {"load_s": load_s, "rows": rows, "bytes": size, "bytes_per_row": size / max(rows, 1)}
    for query in queries:
        key, w = query["key"], where(query)
        if query["kind"] == "flame":
            out[key], _ = timed(lambda: flame(w), runs)
            out[key + "_by_stack"], result = timed(
                lambda: q(f"SELECT stack_id, sum(value) FROM bench.samples WHERE {w} GROUP BY stack_id"),
                runs,
            )
            out[key + "_total"] = sum(int(line.split(",")[1]) for line in str(result).splitlines() if line)
        elif query["kind"] == "series":
            sql = (
                f"SELECT pod, intDiv(ts, {query['step_nanos']}) AS m, sum(value) FROM bench.samples "
                f"WHERE {w} GROUP BY pod, m"
            )
            out[key], _ = timed(lambda: q(sql), runs)
        else:
            out[key], _ = timed(lambda: q(f"SELECT DISTINCT pod FROM bench.samples WHERE {w}"), runs)
    s.close()
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--queries", required=True)
    p.add_argument("--runs", type=int, default=20)
    a = p.parse_args()
    d = os.path.abspath(a.dir)
    with open(a.queries) as f:
        queries = json.load(f)
    print("peers: DuckDB", file=sys.stderr)
    duck = duckdb_peer(d, queries, a.runs)
    print("peers: chDB", file=sys.stderr)
    ch = chdb_peer(d, queries, a.runs)
    json.dump({"duckdb": duck, "chdb": ch}, sys.stdout)


if __name__ == "__main__":
    main()
