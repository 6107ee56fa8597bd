"""TPC-H on the Spark backend: FLEX's queries, bounded by dpsql's rewrite, against the exact queries on Spark.

    python benchmarks/bench_tpch_spark.py --scale 1 --data-dir /tmp/dpsql-tpch-parquet --runs 3

The data comes from DuckDB's dbgen (the `bench` extra) as Parquet, read by a local Spark session (local[2]).
Settings, as in bench_tpch.py:
- (a) every table private at row level (benchmarks/schemas/tpch_rows.toml): join-key frequencies enforced by
  truncation. On Spark no primary key is trusted, so the keys PostgreSQL's primary keys guarantee are declared
  (max_frequency = 1) and truncated like the others.
- (b) the customer as the unit (tpch_customer.toml). Spark verifies no keys, so a line item cannot reach its
  customer through orders.o_orderkey (a parent link needs a unique key): the Parquet line items carry l_custkey,
  their order's customer, declared as their unit column, and Q4's and Q21's line-item joins and subqueries also
  equate l_custkey with their order's customer (the same rows), which is how they reach the unit.
For each query the exact query (transpiled to Spark) and the rewritten one run interleaved, --runs times each;
the table gives medians, their ratio, and the shuffles (Exchange operators) in each physical plan.
`--cluster` runs on a standalone cluster instead of local[2]: a master and two one-core workers started from
pyspark's own launcher, each its own JVM, their executors JVMs of their own (dpsql's URL is the master's,
spark://HOST:PORT), so every shuffle crosses processes; shuffles are counted in the same physical plans.
`--bucketed N` also runs (b) on tables laid out by the unit: customer, orders and lineitem saved as tables of N
buckets by their customer column (the rest as plain tables), read from the session's catalog; a grouping by the
customer then needs no shuffle, which is what partitioning by the unit does on a cluster.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import time
import tomllib
from pathlib import Path

from bench_tpch import QUERIES  # benchmarks/ is on sys.path when run as a script
from tpch_load import extension_path

from dpsql.config import Settings
from dpsql.embedded import EmbeddedPostgres
from dpsql.engine import Engine
from dpsql.schema import parse_schema
from dpsql.sql.dialect import Statement

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = {"a": ROOT / "benchmarks" / "schemas" / "tpch_rows.toml",
           "b": ROOT / "benchmarks" / "schemas" / "tpch_customer.toml"}
TABLES = ["region", "nation", "part", "supplier", "partsupp", "customer", "orders", "lineitem"]
PRIMARY_KEYS = [("region", "r_regionkey"), ("nation", "n_nationkey"), ("part", "p_partkey"),
                ("supplier", "s_suppkey"), ("customer", "c_custkey"), ("orders", "o_orderkey")]


def start_cluster(data_dir: Path) -> tuple[str, list]:
    """A standalone cluster of two one-core workers (3g each) from pyspark's own launcher: its master's URL and
    its daemons."""
    import os

    import pyspark

    sys.path.insert(0, str(ROOT))  # tests.engines starts the tests' clusters too
    from tests.engines import standalone_cluster

    home = Path(pyspark.__file__).parent
    folder = data_dir / "cluster"
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_DAEMON_MEMORY": "256m"}
    return standalone_cluster(home, folder, env, worker_memory="3g")


def generate(scale: float, directory: Path) -> None:
    """TPC-H at `scale` as one Parquet file per table (line items with their order's customer as l_custkey)."""
    import duckdb

    directory.mkdir(parents=True, exist_ok=True)
    if all((directory / f"{t}.parquet").exists() for t in TABLES):
        return
    duck = duckdb.connect()
    duck.execute(f"INSTALL '{extension_path()}'")
    duck.execute("LOAD tpch")
    duck.execute(f"CALL dbgen(sf={scale})")
    for table in TABLES:
        select = ("SELECT lineitem.*, o_custkey AS l_custkey FROM lineitem JOIN orders ON o_orderkey = l_orderkey"
                  if table == "lineitem" else f"SELECT * FROM {table}")
        duck.execute(f"COPY ({select}) TO '{directory / table}.parquet' (FORMAT PARQUET)")
        print(f"  wrote {table}", file=sys.stderr)


UNIT_COLUMNS = {"customer": "c_custkey", "orders": "o_custkey", "lineitem": "l_custkey"}


def spark_schema(setting: str, directory: Path | None):
    """The setting's privacy schema for Spark, its tables read from Parquet in `directory` (None: from the
    session's catalog)."""
    raw = tomllib.loads(SCHEMAS[setting].read_text(encoding="utf-8"))
    for name, table in raw["tables"].items():
        if directory is not None:
            table["path"] = str(directory / f"{name}.parquet")
    lineitem = raw["tables"]["lineitem"]
    lineitem["columns"]["l_custkey"] = {"type": "bigint"}
    if setting == "a":  # keys PostgreSQL's primary keys guarantee are declared instead (and truncated on Spark)
        for table, column in PRIMARY_KEYS:
            if table in raw["tables"]:
                columns = raw["tables"][table]["columns"]
                columns[column] = {**columns[column], "max_frequency": 1}
    if setting == "b":  # the unit column itself, as Spark cannot verify orders' key
        del lineitem["parent"]
        lineitem["unit_column"] = "l_custkey"
    return parse_schema(raw)


def spark_queries(setting: str) -> dict[str, str]:
    """The join benchmark's queries; in (b) a line item's subqueries and joins also tie its customer to the
    order's (the same rows: l_custkey is its order's customer), which is how a query reaches the unit here."""
    queries = dict(QUERIES[setting])
    if setting == "b":
        queries["Q4"] = queries["Q4"].replace("WHERE l_orderkey = o_orderkey",
                                              "WHERE l_orderkey = o_orderkey AND l_custkey = o_custkey")
        queries["Q21"] = (queries["Q21"].replace("o_orderkey = l1.l_orderkey",
                                                 "o_orderkey = l1.l_orderkey AND o_custkey = l1.l_custkey")
                          .replace("WHERE l2.l_orderkey = l1.l_orderkey",
                                   "WHERE l2.l_orderkey = l1.l_orderkey AND l2.l_custkey = l1.l_custkey")
                          .replace("WHERE l3.l_orderkey = l1.l_orderkey",
                                   "WHERE l3.l_orderkey = l1.l_orderkey AND l3.l_custkey = l1.l_custkey"))
    return queries


def save_bucketed(spark, directory: Path, buckets: int) -> None:
    """Every table in the session's catalog; those with a customer column in `buckets` buckets by it."""
    for table in TABLES:
        frame = spark.read.parquet(str(directory / f"{table}.parquet"))
        writer = frame.write.mode("overwrite").format("parquet")
        if table in UNIT_COLUMNS:
            writer = writer.bucketBy(buckets, UNIT_COLUMNS[table])
        writer.saveAsTable(table)
        print(f"  saved {table}" + (f" in {buckets} buckets" if table in UNIT_COLUMNS else ""), file=sys.stderr)


def shuffles(spark, sql: str) -> int:
    plan = spark.sql(sql)._jdf.queryExecution().executedPlan().toString()
    return len(re.findall(r"Exchange", plan))


def timed(session, statement: Statement) -> float:
    started = time.perf_counter()
    session.run(statement)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--data-dir", type=Path, default=Path("/tmp/dpsql-tpch-parquet"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--memory", default="8g", help="Spark's driver memory (local mode: all of Spark's)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "tpch_spark.md")
    parser.add_argument("--settings", default="ab", help="which settings to run: a, b or ab")
    parser.add_argument("--bucketed", type=int, metavar="N", help="also run (b) on tables in N buckets by the unit")
    parser.add_argument("--cluster", action="store_true", help="run on a standalone cluster of two workers")
    args = parser.parse_args()
    directory = args.data_dir / f"sf{args.scale:g}"
    generate(args.scale, directory)
    master, daemons = start_cluster(args.data_dir) if args.cluster else ("spark://local[2]", [])
    where = "a standalone cluster (two one-core workers)" if args.cluster else "Spark local[2]"
    lines = [f"# TPC-H on {where} ({args.memory} of memory), SF{args.scale:g}", "",
             f"`python benchmarks/bench_tpch_spark.py --scale {args.scale:g} --runs {args.runs}"
             f"{' --cluster' if args.cluster else ''}` (medians of {args.runs} interleaved runs)", "",
             "| setting | query | exact (s) | rewritten (s) | ratio | shuffles exact | shuffles rewritten |",
             "|---|---|---|---|---|---|---|"]
    ledger = EmbeddedPostgres()
    ledger.start()
    try:
        engine = None
        layouts = [(setting, f"({setting})", directory) for setting in args.settings]
        if args.bucketed and "b" in args.settings:
            layouts.append(("b", f"(b), {args.bucketed} buckets by the unit", None))
        warehouse = args.data_dir / f"warehouse-sf{args.scale:g}"
        for setting, label, source in layouts:
            schema = spark_schema(setting, source)
            if engine is not None:
                engine.close()
            executors = "&spark.executor.memory=2500m&spark.cores.max=2" if args.cluster else ""
            engine = Engine(Settings(database=f"{master}?spark.driver.memory={args.memory}"
                                              f"&spark.sql.warehouse.dir={warehouse}{executors}", ledger=ledger.url,
                                     statement_timeout_ms=3_600_000), schema)
            spark = engine.backend.spark
            if source is None:  # the warehouse a run before left holds tables this session's catalog lacks
                shutil.rmtree(warehouse, ignore_errors=True)
                save_bucketed(spark, directory, args.bucketed)
            for name, sql in spark_queries(setting).items():
                try:
                    prepared = engine.prepare(sql)
                except Exception as exc:  # noqa: BLE001 - a refusal is a result too
                    lines.append(f"| {label} | {name} | | refused: {exc} | | | |")
                    continue
                if prepared.plan is None or not prepared.plan.aggregates:
                    continue
                exact = Statement.parse(sql)  # rendered for Spark as the rewrite is
                bounded = prepared.rewritten.statement
                exact_times, bounded_times = [], []
                with engine.backend.session() as session:
                    for _ in range(args.runs):
                        exact_times.append(timed(session, exact))
                        bounded_times.append(timed(session, bounded))
                e, b = statistics.median(exact_times), statistics.median(bounded_times)
                lines.append(f"| {label} | {name} | {e:.2f} | {b:.2f} | {b / e:.1f}× | "
                             f"{shuffles(spark, engine.backend.render(exact))} | "
                             f"{shuffles(spark, engine.backend.render(bounded))} |")
                print(lines[-1], file=sys.stderr)
        engine.close()
    finally:
        ledger.stop()
        for daemon in daemons:
            daemon.terminate()
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
