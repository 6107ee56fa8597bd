"""Load TPC-H into PostgreSQL, and time FLEX's queries exactly (the baseline for the join benchmark).

    python benchmarks/tpch_load.py --scale 1 --data-dir /tmp/dpsql-tpch      # embedded PostgreSQL, kept
    python benchmarks/tpch_load.py --scale 1 --database postgresql://...     # an existing database
    python benchmarks/tpch_load.py --data-dir /tmp/dpsql-tpch --time-only    # re-time the loaded data

The data comes from DuckDB's dbgen (`duckdb` plus `duckdb-extension-tpch`, whose wheel carries the
extension file; DuckDB installs it from that path, since its own download needs the internet). Each table is
written to CSV by DuckDB and streamed into PostgreSQL with COPY; primary keys, the foreign-key indexes the
queries join on, and ANALYZE follow. Then Q1, Q4, Q13, Q16 and Q21 (the queries FLEX evaluated, with the
specification's default substitution parameters) are timed exactly: the median of --runs runs each.
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from dpsql.demo import progress_bar
from dpsql.embedded import EmbeddedPostgres

TABLES = ["region", "nation", "part", "supplier", "partsupp", "customer", "orders", "lineitem"]
KEYS = {
    "region": "r_regionkey", "nation": "n_nationkey", "part": "p_partkey", "supplier": "s_suppkey",
    "partsupp": "ps_partkey, ps_suppkey", "customer": "c_custkey", "orders": "o_orderkey",
    "lineitem": "l_orderkey, l_linenumber",
}
FOREIGN_KEYS = [  # the specification's, so that dpsql's catalog check finds each unit column's link
    ("nation", "n_regionkey", "region (r_regionkey)"), ("supplier", "s_nationkey", "nation (n_nationkey)"),
    ("customer", "c_nationkey", "nation (n_nationkey)"), ("partsupp", "ps_partkey", "part (p_partkey)"),
    ("partsupp", "ps_suppkey", "supplier (s_suppkey)"), ("orders", "o_custkey", "customer (c_custkey)"),
    ("lineitem", "l_orderkey", "orders (o_orderkey)"), ("lineitem", "l_suppkey", "supplier (s_suppkey)"),
    ("lineitem", "l_partkey", "part (p_partkey)"),
]
INDEXES = ["orders (o_custkey)", "lineitem (l_suppkey)", "lineitem (l_partkey)", "partsupp (ps_suppkey)",
           "customer (c_nationkey)", "supplier (s_nationkey)"]
CHUNK = 1 << 20

QUERIES = {
    "Q1": """
        SELECT l_returnflag, l_linestatus, SUM(l_quantity) AS sum_qty, SUM(l_extendedprice) AS sum_base_price,
               SUM(l_extendedprice * (1 - l_discount)) AS sum_disc_price,
               SUM(l_extendedprice * (1 - l_discount) * (1 + l_tax)) AS sum_charge, AVG(l_quantity) AS avg_qty,
               AVG(l_extendedprice) AS avg_price, AVG(l_discount) AS avg_disc, COUNT(*) AS count_order
        FROM lineitem WHERE l_shipdate <= DATE '1998-12-01' - INTERVAL '90 days'
        GROUP BY l_returnflag, l_linestatus ORDER BY l_returnflag, l_linestatus""",
    "Q4": """
        SELECT o_orderpriority, COUNT(*) AS order_count FROM orders
        WHERE o_orderdate >= DATE '1993-07-01' AND o_orderdate < DATE '1993-10-01'
          AND EXISTS (SELECT * FROM lineitem WHERE l_orderkey = o_orderkey AND l_commitdate < l_receiptdate)
        GROUP BY o_orderpriority ORDER BY o_orderpriority""",
    "Q13": """
        SELECT c_count, COUNT(*) AS custdist FROM (
            SELECT c_custkey, COUNT(o_orderkey) AS c_count FROM customer LEFT OUTER JOIN orders
              ON c_custkey = o_custkey AND o_comment NOT LIKE '%special%requests%' GROUP BY c_custkey
        ) AS c_orders GROUP BY c_count ORDER BY custdist DESC, c_count DESC""",
    "Q16": """
        SELECT p_brand, p_type, p_size, COUNT(DISTINCT ps_suppkey) AS supplier_cnt
        FROM partsupp, part
        WHERE p_partkey = ps_partkey AND p_brand <> 'Brand#45' AND p_type NOT LIKE 'MEDIUM POLISHED%'
          AND p_size IN (49, 14, 23, 45, 19, 3, 36, 9)
          AND ps_suppkey NOT IN (SELECT s_suppkey FROM supplier WHERE s_comment LIKE '%Customer%Complaints%')
        GROUP BY p_brand, p_type, p_size ORDER BY supplier_cnt DESC, p_brand, p_type, p_size""",
    "Q21": """
        SELECT s_name, COUNT(*) AS numwait FROM supplier, lineitem l1, orders, nation
        WHERE s_suppkey = l1.l_suppkey AND o_orderkey = l1.l_orderkey AND o_orderstatus = 'F'
          AND l1.l_receiptdate > l1.l_commitdate
          AND EXISTS (SELECT * FROM lineitem l2 WHERE l2.l_orderkey = l1.l_orderkey
                      AND l2.l_suppkey <> l1.l_suppkey)
          AND NOT EXISTS (SELECT * FROM lineitem l3 WHERE l3.l_orderkey = l1.l_orderkey
                          AND l3.l_suppkey <> l1.l_suppkey AND l3.l_receiptdate > l3.l_commitdate)
          AND s_nationkey = n_nationkey AND n_name = 'SAUDI ARABIA'
        GROUP BY s_name ORDER BY numwait DESC, s_name LIMIT 100""",
}


def extension_path() -> str:
    """The TPC-H extension file that the duckdb-extension-tpch wheel carries."""
    import duckdb_extension_tpch
    found = glob.glob(os.path.join(os.path.dirname(duckdb_extension_tpch.__file__), "extensions", "*",
                                   "tpch.duckdb_extension"))
    if not found:
        raise SystemExit("duckdb-extension-tpch has no tpch.duckdb_extension file; pip install duckdb-extension-tpch")
    return found[0]


def _postgres_type(duckdb_type: str) -> str:
    text = duckdb_type.upper()
    if text.startswith("DECIMAL"):
        return text.replace("DECIMAL", "numeric")
    return {"BIGINT": "bigint", "INTEGER": "integer", "VARCHAR": "text", "DATE": "date",
            "DOUBLE": "double precision"}.get(text, "text")


def load(url: str, scale: float) -> None:
    import duckdb
    started = time.monotonic()
    duck = duckdb.connect()
    duck.execute(f"INSTALL '{extension_path()}'")
    duck.execute("LOAD tpch")
    duck.execute(f"CALL dbgen(sf={scale})")
    print(f"generated scale factor {scale:g} in {time.monotonic() - started:.1f} s", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="dpsql-tpch-") as folder, psycopg.connect(url, autocommit=True) as pg:
        for table in TABLES:
            columns = duck.execute(f"DESCRIBE {table}").fetchall()
            rows = duck.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            ddl = ", ".join(f"{name} {_postgres_type(kind)} NOT NULL" for name, kind, *_ in columns)
            pg.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
            pg.execute(f"CREATE TABLE {table} ({ddl})")
            path = Path(folder) / f"{table}.csv"
            duck.execute(f"COPY {table} TO '{path}' (FORMAT csv, HEADER false)")
            size, sent = path.stat().st_size, 0
            with pg.cursor().copy(f"COPY {table} FROM STDIN (FORMAT csv)") as copy, path.open("rb") as data:
                while chunk := data.read(CHUNK):
                    copy.write(chunk)
                    sent += len(chunk)
                    progress_bar(table, round(rows * sent / size), rows)
            path.unlink()
        for table, key in KEYS.items():
            pg.execute(f"ALTER TABLE {table} ADD PRIMARY KEY ({key})")
        add_foreign_keys(pg)
        for index in INDEXES:
            pg.execute(f"CREATE INDEX ON {index}")
        pg.execute("ANALYZE")
    print(f"loaded into PostgreSQL in {time.monotonic() - started:.1f} s", file=sys.stderr)


def add_foreign_keys(pg: psycopg.Connection) -> None:
    """The specification's foreign keys, each added once (a database loaded before they were gets them here)."""
    for table, column, target in FOREIGN_KEYS:
        name = f"{table}_{column}_fkey"
        if not pg.execute("SELECT 1 FROM pg_constraint WHERE conname = %s", (name,)).fetchone():
            pg.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} FOREIGN KEY ({column}) REFERENCES {target}")


def time_queries(url: str, runs: int) -> dict[str, tuple[float, int]]:
    """Median seconds and row count of each query, run exactly."""
    results = {}
    with psycopg.connect(url, autocommit=True) as pg:
        pg.execute("SET jit = off")  # as dpsql's own backend connections do
        for name, sql in QUERIES.items():
            times, rows = [], 0
            for _ in range(runs):
                started = time.perf_counter()
                rows = len(pg.execute(sql).fetchall())
                times.append(time.perf_counter() - started)
            results[name] = (statistics.median(times), rows)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="TPC-H scale factor (default 1)")
    parser.add_argument("--database", help="postgresql:// URL to load into (default: an embedded PostgreSQL)")
    parser.add_argument("--data-dir", help="the embedded PostgreSQL's directory; it is kept for later runs")
    parser.add_argument("--time-only", action="store_true", help="skip loading; time the queries")
    parser.add_argument("--runs", type=int, default=3, help="runs per query (median)")
    args = parser.parse_args()
    server = None
    url = args.database
    if url is None:
        server = EmbeddedPostgres(args.data_dir, keep=True)
        url = server.start()
        print(f"embedded PostgreSQL: {url} (data in {server.data_dir})", file=sys.stderr)
    if not args.time_only:
        load(url, args.scale)
    print(f"| query | exact time (ms, median of {args.runs}) | rows |\n|---|---:|---:|")
    for name, (seconds, rows) in time_queries(url, args.runs).items():
        print(f"| {name} | {seconds * 1000:.1f} | {rows} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
