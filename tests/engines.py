"""What the tests of the engines that are not PostgreSQL (Spark, DuckDB) share: the demo's tables as Parquet, a
schema that reads them, and rows compared as the engines' numbers allow (the data they read: conftest's
`within_bounds`)."""

from __future__ import annotations

import math
import tomllib
from decimal import Decimal
from pathlib import Path

import psycopg

from dpsql.demo import export_parquet
from dpsql.schema import parse_schema
from tests.conftest import DEMO_SCHEMA

TABLES = ("people", "visits", "prescriptions", "states")  # the demo tables the Spark tests read
ALL_TABLES = (*TABLES, "screenings", "survey", "checkins")  # and the DuckDB tests
QUERIES = [
    "SELECT COUNT(*) FROM people",
    "SELECT sex, COUNT(*), AVG(income), SUM(age) FROM people GROUP BY sex",
    "SELECT category, COUNT(*), SUM(amount) FROM visits GROUP BY category",
    "SELECT COUNT(DISTINCT person_id) FROM visits",
    "SELECT age / 10 AS decade, COUNT(*) FROM people WHERE age BETWEEN 20 AND 69 GROUP BY decade",
    "SELECT s.region, COUNT(*) FROM visits v JOIN people p ON v.person_id = p.person_id JOIN states s "
    "ON s.code = p.state GROUP BY s.region",
    "SELECT date_trunc('month', day) AS month, COUNT(*) FROM visits GROUP BY month",
    "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY income) AS median, MIN(age), MAX(age) FROM people",
    "SELECT state, COUNT(*) FROM people GROUP BY state",
    "SELECT COUNT(*) FROM visits WHERE person_id IN (SELECT person_id FROM people WHERE age > 60)",
]


def schema_reading(paths: dict[str, Path | None], schema_file: Path = DEMO_SCHEMA):
    """The demo's schema (the tests' declared one, or `schema_file`) over the tables of `paths`, each read from its
    file (or, for None, from the engine's own catalog)."""
    raw = tomllib.loads(schema_file.read_text(encoding="utf-8"))
    raw["tables"] = {name: {**raw["tables"][name], **({"path": str(path)} if path else {})}
                     for name, path in paths.items()}
    return parse_schema(raw)


def export(url: str, directory: Path, tables: tuple[str, ...] = TABLES) -> dict[str, Path]:
    return export_parquet(url, directory, tables)



def rows_in_order(rows: list[tuple]) -> list[tuple]:
    """Rows in one order, numbers as floats (sums on other engines are decimals or doubles, on PostgreSQL numerics),
    -0 as 0 (PostgreSQL's ceil of a double is -0 where Spark's is the integer 0; released keys read both as 0)."""
    def norm(v):
        return float(v) + 0.0 if isinstance(v, int | float | Decimal) and not isinstance(v, bool) else v
    return sorted((tuple(norm(v) for v in row) for row in rows), key=repr)


def equal_rows(a: list[tuple], b: list[tuple]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(rows_in_order(a), rows_in_order(b), strict=True):
        for u, v in zip(x, y, strict=True):
            if isinstance(u, float) and isinstance(v, float):
                if not (u == v or (math.isnan(u) and math.isnan(v)) or math.isclose(u, v, rel_tol=1e-9, abs_tol=1e-6)):
                    return False
            elif u != v:
                return False
    return True


def assert_same_rows(engine, prepared, url: str, sql: str) -> None:
    """The prepared query's statements give the same rows on PostgreSQL (at `url`) and on the engine's backend."""
    statements = [prepared.rewritten.statement, *prepared.rewritten.histogram_statements.values()]
    with psycopg.connect(url) as conn:
        expected = [conn.execute(s.sql).fetchall() for s in statements]
    with engine.backend.session() as session:
        got = [session.run(s) for s in statements]
    for statement, want, have in zip(statements, expected, got, strict=True):
        assert equal_rows(want, have), (sql, engine.backend.render(statement), want[:5], have[:5])


def assert_bounds_chosen_alike(engine, url: str, sql: str) -> None:
    """With rows per unit (or each unit's total) chosen from the data, what the race reads and the answer at a
    chosen bound give the same rows on the engine's backend as on PostgreSQL (at `url`)."""
    from dpsql.session import Options

    prepared = engine.prepare(sql, options=Options(rows_per_unit="auto"))
    assert prepared.race is not None
    with psycopg.connect(url) as conn:
        expected = conn.execute(prepared.race_sql).fetchall()
    with engine.backend.session() as session:
        got = session.run(prepared.race_statement)
    tau = prepared.race.taus[len(prepared.race.taus) // 2]
    if not prepared.race.counts_units:
        # which distinct values a unit's first τ rows find depends on each backend's keyed hash: alike at the cap,
        # where every row is kept (and each backend's answer at τ keeps the rows its own race ranked first)
        expected, got, tau = [row[-1:] for row in expected], [row[-1:] for row in got], prepared.race.taus[-1]
    assert equal_rows(expected, got), sql
    assert_same_rows(engine, engine._bounded_at(prepared, tau, margin_reached_cap=True), url, sql)


# --- a standalone Spark cluster on this machine (the tests' sc:// door, benchmarks/bench_tpch_spark.py --cluster) ---


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(port: int, folder: Path, what: str, seconds: float = 120) -> None:
    import socket
    import time

    deadline = time.monotonic() + seconds
    while True:
        with socket.socket() as client:
            if client.connect_ex(("127.0.0.1", port)) == 0:
                return
        if time.monotonic() > deadline:
            logs = "".join(p.read_text(errors="replace")[-2000:] for p in folder.glob("*.out"))
            raise RuntimeError(f"{what} did not start in {seconds:.0f} s:\n{logs}")
        time.sleep(0.5)


def standalone_cluster(home: Path, folder: Path, env: dict, worker_memory: str = "1g") -> tuple[str, list]:
    """A standalone Spark cluster from pyspark's own launcher: a master and two workers (one core each), each its
    own JVM, whose executors are JVMs of their own, so a query's shuffles cross processes. Returns the master's
    URL and the daemons' processes (terminate them when done)."""
    import subprocess

    port = free_port()
    launcher = str(home / "bin" / "spark-class")
    log = (folder / "cluster.out").open("ab")
    master = subprocess.Popen([launcher, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                               str(port), "--webui-port", str(free_port())], env=env, stdout=log, stderr=log)
    wait_for(port, folder, "the standalone master")
    workers = [subprocess.Popen([launcher, "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}",
                                 "--cores", "1", "--memory", worker_memory, "--webui-port", str(free_port()),
                                 "--work-dir", str(folder / f"worker{n}")], env=env, stdout=log, stderr=log)
               for n in range(2)]
    return f"spark://127.0.0.1:{port}", [master, *workers]
