"""TPC-H SF1 with R2T's query set and no declared per-unit bound (issue 36): dpsql's rows per unit chosen from
the data by R2T's race (`rows_per_unit = "auto"`) below a loose cap of 10⁶, as R2T's global sensitivity, beside
R2T's published errors (Dong et al., SIGMOD 2022, ε = 0.8).

    python benchmarks/tpch_load.py --scale 1 --data-dir /tmp/dpsql-tpch          # once
    python benchmarks/bench_tpch_r2t.py --data-dir /tmp/dpsql-tpch --runs 25

The queries are R2T's own simplified forms (hkustDB/Race-to-the-Top, `Query/`), each with its privacy unit:
the customer (Q3, Q10, Q18), the order (Q12), the supplier (Q11, Q20). Q5, Q7, Q8 and Q21 protect customers and
suppliers together in R2T (its `ids` table); dpsql has one unit per schema, so they run with the customer as
the unit and suppliers public (a weaker guarantee than R2T's: listed apart). The schemas are
benchmarks/schemas/tpch_customer.toml's tables with every per-unit bound replaced by the cap, and the unit
moved where the query needs it; value ranges stay declared from the specification.

At each ε, a query runs the race's statement once (its exact truncated counts) and, for each bound the race's
draws choose, the bounded statement once; each of --runs answers then draws the race and the answer's noise
offline, through the engine's own `bounded_by_race` and mechanisms, so the distribution is the released one.
The error of a run is |noisy − exact| / exact; the table gives the median over runs. Times: the exact query
against the statements the engine runs at the bound chosen most at ε = 0.8 (the race's, and the answer's
unless the answer is the race's own value there), medians of --timing-runs interleaved runs.
"""

from __future__ import annotations

import argparse
import collections
import copy
import re
import statistics
import sys
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

import psycopg
from bench_tpch import _timed, relative_error  # benchmarks/ is on sys.path when run as a script
from tpch_load import add_foreign_keys

from dpsql.config import Settings
from dpsql.embedded import EmbeddedPostgres
from dpsql.engine import Engine
from dpsql.noise import add_noise
from dpsql.postprocess import finish
from dpsql.schema import parse_schema
from dpsql.session import Options
from dpsql.sql.dialect import Statement

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "benchmarks" / "schemas" / "tpch_customer.toml"
RESULTS = ROOT / "benchmarks" / "results" / "tpch_r2t.md"
SPARK_RESULTS = ROOT / "benchmarks" / "results" / "tpch_r2t_spark.md"
CAP = 10**6  # R2T's global sensitivity bound: the most rows one unit may have
EPSILONS = (0.8, 0.1)
R2T = {"Q3": 0.25, "Q5": 1.63, "Q7": 0.61, "Q8": 1.92, "Q10": 0.17, "Q11": 1.82, "Q12": 0.023, "Q18": 0.13,
       "Q20": 0.58, "Q21": 0.65}  # R2T's relative errors in %, ε = 0.8
QUERIES = {  # name: (privacy unit, SQL), R2T's forms (the `ids` joins dropped where the customer alone is the unit)
    "Q3": ("customer", "SELECT COUNT(*) FROM customer, orders, lineitem WHERE o_custkey = c_custkey AND "
                       "l_orderkey = o_orderkey AND o_orderdate < DATE '1997-01-01' AND "
                       "l_shipdate > DATE '1994-01-01'"),
    "Q10": ("customer", "SELECT COUNT(*) FROM orders, customer, nation WHERE c_custkey = o_custkey AND "
                        "c_nationkey = n_nationkey"),
    "Q18": ("customer", "SELECT SUM(l_quantity) FROM customer, orders, lineitem WHERE c_custkey = o_custkey AND "
                        "o_orderkey = l_orderkey"),
    "Q12": ("order", "SELECT COUNT(*) FROM orders, lineitem WHERE o_orderkey = l_orderkey"),
    "Q11": ("supplier", "SELECT SUM(ps_supplycost * ps_availqty / 1000000) FROM nation, supplier, partsupp "
                        "WHERE ps_suppkey = s_suppkey AND s_nationkey = n_nationkey"),
    "Q20": ("supplier", "SELECT COUNT(*) FROM supplier, nation, partsupp, lineitem WHERE l_partkey = ps_partkey "
                        "AND l_suppkey = ps_suppkey AND s_nationkey = n_nationkey AND s_suppkey = ps_suppkey"),
    "Q5": ("customer", "SELECT COUNT(*) FROM supplier, lineitem, orders, customer, nation, region WHERE "
                       "s_suppkey = l_suppkey AND l_orderkey = o_orderkey AND o_custkey = c_custkey AND "
                       "c_nationkey = n_nationkey AND n_nationkey = s_nationkey AND r_regionkey = n_regionkey"),
    "Q7": ("customer", "SELECT SUM(l_extendedprice * (1 - l_discount) / 1000) FROM nation AS n1, nation AS n2, "
                       "customer, orders, lineitem, supplier WHERE n1.n_nationkey = c_nationkey AND "
                       "n2.n_nationkey = s_nationkey AND c_custkey = o_custkey AND o_orderkey = l_orderkey AND "
                       "l_suppkey = s_suppkey"),
    "Q8": ("customer", "SELECT COUNT(*) FROM nation AS n1, nation AS n2, customer, orders, lineitem, supplier, "
                       "region WHERE n1.n_nationkey = c_nationkey AND n2.n_nationkey = s_nationkey AND "
                       "c_custkey = o_custkey AND o_orderkey = l_orderkey AND l_suppkey = s_suppkey AND "
                       "n1.n_regionkey = r_regionkey AND o_orderdate >= DATE '1995-01-01' AND "
                       "o_orderdate <= DATE '1996-12-31'"),
    "Q21": ("customer", "SELECT COUNT(*) FROM nation, supplier, lineitem, orders WHERE s_suppkey = l_suppkey AND "
                        "o_orderkey = l_orderkey AND s_nationkey = n_nationkey"),
}
Run = Callable[[Statement], tuple[float, list[tuple]]]  # a statement's seconds and rows
JOINT = ("Q5", "Q7", "Q8", "Q21")  # R2T protects customers and suppliers together here


def schemas() -> dict[str, object]:
    """The privacy schemas of the three units, from the customer schema's tables, every bound the cap."""
    return {unit: parse_schema(raw, f"tpch_r2t_{unit}") for unit, raw in raw_schemas().items()}


def raw_schemas() -> dict[str, dict]:
    """`schemas` as TOML tables."""
    base = tomllib.loads(BASE.read_text(encoding="utf-8"))
    base["privacy"]["rows_per_unit"] = "auto"
    base["tables"]["region"] = {"public": True, "columns": {"r_regionkey": {"type": "integer", "unique": True},
                                                            "r_name": {"type": "text"}}}
    partsupp = base["tables"]["partsupp"]["columns"]
    partsupp["ps_availqty"] = {"type": "integer", "lower": 1, "upper": 9999}
    partsupp["ps_supplycost"] = {"type": "numeric", "lower": 1, "upper": 1000}
    customer = copy.deepcopy(base)
    for name in ("orders", "lineitem"):
        customer["tables"][name]["max_rows_per_unit"] = CAP

    order = copy.deepcopy(base)
    order["privacy"]["unit"] = "orders.o_orderkey"
    order["tables"]["customer"] = {"public": True, "columns": {**base["tables"]["customer"]["columns"],
                                                               "c_custkey": {"type": "bigint", "unique": True}}}
    for key in ("unit_column", "max_rows_per_unit"):
        order["tables"]["orders"].pop(key)
    order["tables"]["lineitem"] = {**{k: v for k, v in base["tables"]["lineitem"].items() if k != "parent"},
                                   "unit_column": "l_orderkey", "max_rows_per_unit": CAP}

    supplier = copy.deepcopy(order)
    supplier["privacy"]["unit"] = "supplier.s_suppkey"
    supplier["tables"]["orders"] = {"public": True, "columns": {**base["tables"]["orders"]["columns"],
                                                                "o_orderkey": {"type": "bigint", "unique": True}}}
    supplier["tables"]["supplier"] = {"columns": {k: v for k, v in base["tables"]["supplier"]["columns"].items()}}
    supplier["tables"]["supplier"]["columns"]["s_suppkey"] = {"type": "bigint"}
    supplier["tables"]["lineitem"]["unit_column"] = "l_suppkey"
    supplier["tables"]["partsupp"] = {"unit_column": "ps_suppkey", "max_rows_per_unit": CAP,
                                      "columns": {**partsupp, "ps_suppkey": {"type": "bigint"}}}
    return {"customer": customer, "order": order, "supplier": supplier}


def measure(engine: Engine, run: Run, sql: str, runs: int, epsilon: float, statements: dict) -> dict:
    """The median relative error of `runs` answers at `epsilon`, and the bounds the race chose. `run` gives a
    statement's time and rows; `statements` keeps them (the same bounded statement serves every ε that chooses its
    bound)."""
    def rows_of(statement: Statement) -> list[tuple]:
        if statement.sql not in statements:
            statements[statement.sql] = run(statement)
        return statements[statement.sql][1]

    prepared = engine.prepare(sql, epsilon=epsilon, options=Options(rows_per_unit="auto"))
    if prepared.race is None:
        raise SystemExit(f"no race for {sql}: {prepared.plan.notes}")
    exact_statement = Statement.parse(sql)
    exact = {((), "a"): float(rows_of(exact_statement)[0][0])}
    truncated = [float(v) for v in rows_of(prepared.race_statement)[0]]
    errors, bounds, runs_at = [], [], {}
    for _ in range(runs):
        bounded, rows = engine.bounded_by_race(prepared, truncated)  # as the engine answers it
        bound = bounded.plan.unit_total if prepared.race_totals and bounded.plan.unit_total is not None \
            else bounded.plan.rows_per_unit
        bounds.append(bound)
        runs_at[bound] = ((bounded.rewritten.statement, bounded.rewritten.work_mem), rows is not None)
        rows = rows if rows is not None else rows_of(bounded.rewritten.statement)
        result = finish(bounded.plan, bounded.calibration, add_noise(bounded.plan, bounded.calibration, rows, {}))
        errors.append(relative_error({((), "a"): float(result.rows[0][0] or 0)}, exact))
    common, read_from_race = runs_at[collections.Counter(bounds).most_common(1)[0][0]]
    lost = 1 - float(rows_of(common[0])[0][0] or 0) / exact[((), "a")] if exact[((), "a")] else 0.0
    # what the engine runs at that bound: the race's statement, and the answer's unless read from the race's pass
    return {"error": statistics.median(errors), "bounds": collections.Counter(bounds), "cap": prepared.race.taus[-1],
            "lost": lost, "statements": (exact_statement, (prepared.race_statement, prepared.rewritten.work_mem),
                                         *([] if read_from_race else [common]))}


def timed(run: Run, engine: Engine, statements: tuple, runs: int) -> tuple[float, float]:
    """Milliseconds of the exact query (`run`: at the server's settings, as an analyst would run it) and of the
    statements dpsql runs (through the engine's own backend session: its settings and each statement's work_mem),
    medians of `runs` interleaved runs."""
    exact, dpsql = [], []
    for _ in range(runs):
        exact.append(run(statements[0])[0])
        with engine.backend.session() as session:
            started = time.perf_counter()
            for statement, work_mem in statements[1:]:
                session.run(statement, work_mem)
            dpsql.append(time.perf_counter() - started)
    return 1000 * statistics.median(exact), 1000 * statistics.median(dpsql)


def table_row(name: str, setting: str, found: dict, times: tuple[float, float], digits: int, lost: bool) -> str:
    """One query's line of the results table: at each ε its error, the bounds chosen (and what the most chosen
    loses), R2T's error, then the exact query's and dpsql's times and their ratio."""
    cells = [name, setting]
    for epsilon in EPSILONS:
        chosen = ", ".join(f"{b:,} ({n})" for b, n in sorted(found[epsilon]["bounds"].items()))
        cells += [f"{100 * found[epsilon]['error']:.3g}%", chosen,
                  *([f"{100 * found[epsilon]['lost']:.2g}%"] if lost else [])]
    exact, dpsql = times
    cells += [f"{R2T[name]}%", f"{exact:.{digits}f}", f"{dpsql:.{digits}f}", f"{dpsql / exact:.2f}"]
    return "| " + " | ".join(cells) + " |"


def spark_schema(unit: str, directory: Path):
    """The unit's schema on Spark, its tables read from Parquet in `directory`. Spark verifies no key, so with the
    customer as the unit a line item reaches it through its own l_custkey (its order's customer, written by
    bench_tpch_spark's generator), not through orders' key."""
    raw = raw_schemas()[unit]
    for name, table in raw["tables"].items():
        table["path"] = str(directory / f"{name}.parquet")
    lineitem = raw["tables"]["lineitem"]
    lineitem["columns"]["l_custkey"] = {"type": "bigint"}
    if unit == "customer":
        del lineitem["parent"]
        lineitem["unit_column"] = "l_custkey"
    return parse_schema(raw, f"tpch_r2t_{unit}_spark")


def spark_sql(unit: str, sql: str) -> str:
    """R2T's query; with the customer as the unit, each line item also tied to its order's customer (the same
    rows), how it reaches the unit on Spark."""
    if unit != "customer":
        return sql
    return re.sub(r"(l_orderkey = o_orderkey|o_orderkey = l_orderkey)", r"\1 AND l_custkey = o_custkey", sql)


def on_spark(args: argparse.Namespace) -> int:
    """R2T's queries on Spark local[2], from Parquet (generated as bench_tpch_spark.py does), one engine per unit."""
    from bench_tpch_spark import generate

    directory = Path(args.spark) / "sf1"
    generate(1.0, directory)
    ledger = EmbeddedPostgres()
    ledger.start()
    started, rows = time.perf_counter(), []
    engines = {}
    try:
        for name in args.queries.split(","):
            unit, sql = QUERIES[name]
            if unit not in engines:
                engines[unit] = Engine(Settings(database=f"spark://local[2]?spark.driver.memory={args.spark_memory}",
                                                ledger=ledger.url, statement_timeout_ms=3_600_000),
                                       spark_schema(unit, directory))
            engine = engines[unit]
            with engine.backend.session() as session:
                def run(statement: Statement, session=session) -> tuple[float, list[tuple]]:
                    began = time.perf_counter()
                    found = session.run(statement)
                    return time.perf_counter() - began, found

                statements = {}
                found = {epsilon: measure(engine, run, spark_sql(unit, sql), args.runs, epsilon, statements)
                         for epsilon in EPSILONS}
                exact_s, dpsql_s = (t / 1000 for t in timed(run, engine, found[EPSILONS[0]]["statements"],
                                                             args.timing_runs))
                rows.append(table_row(name, unit, found, (exact_s, dpsql_s), 2, lost=False))
                print(rows[-1], file=sys.stderr)
    finally:
        for engine in engines.values():
            engine.close()
        ledger.stop()
    text = "\n".join([
        "# TPC-H SF1 on Spark local[2], R2T's queries, no declared per-unit bound", "",
        f"`python benchmarks/bench_tpch_r2t.py --spark {args.spark} --runs {args.runs}` "
        f"({time.perf_counter() - started:.0f} s, driver memory {args.spark_memory}): as on PostgreSQL "
        "(benchmarks/results/tpch_r2t.md), with the data as Parquet; Spark verifies no key, so with the customer as "
        "the unit each line item is tied to its customer by its own l_custkey, and with the supplier as the unit a "
        "line item's partsupp row is not known to be unique (the race's cap is the product of the two tables' "
        "caps); times are medians of "
        f"{args.timing_runs} interleaved runs at ε = 0.8 of the exact query and of the engine's statements on Spark.",
        "", "| query | unit | error ε = 0.8 | bounds | error ε = 0.1 | bounds | R2T ε = 0.8 | exact (s) | dpsql (s) | "
        "ratio |", "|---|---|---:|---|---:|---|---:|---:|---:|---:|", *rows, ""])
    print(text)
    SPARK_RESULTS.write_text(text, encoding="utf-8")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database", help="postgresql:// URL of the loaded TPC-H database")
    parser.add_argument("--data-dir", help="the embedded PostgreSQL that benchmarks/tpch_load.py kept")
    parser.add_argument("--runs", type=int, default=25)
    parser.add_argument("--timing-runs", type=int, default=3)
    parser.add_argument("--queries", default=",".join(QUERIES))
    parser.add_argument("--spark", metavar="DIR", help="run the customer queries on Spark, Parquet data in DIR")
    parser.add_argument("--spark-memory", default="6g")
    args = parser.parse_args()
    if args.spark:
        return on_spark(args)
    url = args.database or EmbeddedPostgres(args.data_dir, keep=True).start()
    with psycopg.connect(url, autocommit=True) as pg:  # data loaded before tpch_load added them
        add_foreign_keys(pg)
    started = time.perf_counter()
    engines = {unit: Engine(Settings(database=url), schema) for unit, schema in schemas().items()}
    rows = []
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SET jit = off")  # as the engine's own connections; work_mem the server's
            for name in args.queries.split(","):
                unit, sql = QUERIES[name]
                statements = {}
                def run(statement: Statement, conn=conn) -> tuple[float, list[tuple]]:
                    return _timed(conn, statement.sql)

                found = {epsilon: measure(engines[unit], run, sql, args.runs, epsilon, statements)
                         for epsilon in EPSILONS}
                exact_ms, dpsql_ms = timed(run, engines[unit], found[EPSILONS[0]]["statements"], args.timing_runs)
                setting = f"{unit}" + (" (R2T: customers and suppliers)" if name in JOINT else "")
                rows.append(table_row(name, setting, found, (exact_ms, dpsql_ms), 0, lost=True))
                print(rows[-1], file=sys.stderr)
    finally:
        for engine in engines.values():
            engine.close()
    text = "\n".join([
        "# TPC-H SF1, R2T's queries, no declared per-unit bound", "",
        f"`python benchmarks/bench_tpch_r2t.py --runs {args.runs}` ({time.perf_counter() - started:.0f} s): ε = "
        "0.8 and 0.1 per query (20% to the race, 80% to the answer), the rows per unit chosen by R2T's race below "
        f"a cap of {CAP:,} (the race's last τ), or where the race cannot resolve the data by the sparse vector "
        f"technique with a quarter of the answer's share; median relative error over {args.runs} answers; "
        "*bounds* are the bounds the race's draws chose (with how many runs chose each); *lost* is the share of the "
        "exact answer the most chosen bound truncates away (before noise); R2T's error is its published one at "
        "ε = 0.8; "
        f"times are medians of {args.timing_runs} interleaved runs at ε = 0.8, dpsql's being the statements the "
        "engine runs at the bound chosen most: the race's, then the answer's, except where the answer is the race's "
        "own value at that bound (an ungrouped COUNT(*) or sum of totals: one statement), run through the engine's "
        "backend (the server's work_mem, raised only where the rewrite asks); the exact query at the server's "
        "settings.", "",
        "| query | unit | error ε = 0.8 | bounds | lost | error ε = 0.1 | bounds | lost | R2T ε = 0.8 | exact (ms) "
        "| dpsql (ms) | ratio |", "|---|---|---:|---|---:|---:|---|---:|---:|---:|---:|---:|", *rows, ""])
    print(text)
    RESULTS.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
