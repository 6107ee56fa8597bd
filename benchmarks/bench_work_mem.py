"""work_mem and the per-unit rewrites: each rewritten query run by PostgreSQL under several work_mem settings,
against the exact query, on the demo dataset (issue 16, item 2).

    python benchmarks/bench_work_mem.py --people 100000 1000000 --runs 5

A larger work_mem lets PostgreSQL pick a hash aggregate over one group per unit, which can beat or lose to
reading the unit's index in order; this measures which. Runs are interleaved (exact, then each setting) and
medians reported, with ratios to the exact query measured in the same loop.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import psycopg

from dpsql.config import Settings
from dpsql.demo import load_demo_data
from dpsql.embedded import EmbeddedPostgres
from dpsql.engine import Engine

SCHEMA = Path(__file__).resolve().parent.parent / "schemas" / "demo.toml"
QUERIES = [
    "SELECT category, COUNT(*) FROM visits GROUP BY category",
    "SELECT category, AVG(amount) FROM visits GROUP BY category",
    "SELECT date_trunc('month', day) AS m, COUNT(*) FROM visits GROUP BY 1",
    "SELECT COUNT(*), SUM(amount) FROM visits",
    "SELECT category, COUNT(DISTINCT person_id) FROM visits GROUP BY category",
    "SELECT sex, AVG(income) FROM people GROUP BY sex",
]


def database(admin: str, people: int) -> str:
    name = f"bench_work_mem_{people}"
    with psycopg.connect(admin, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(f"CREATE DATABASE {name}")
    url = psycopg.conninfo.make_conninfo(admin, dbname=name)
    if not exists:
        load_demo_data(url, people=people, seed=7)
    return url


def timed(conn: psycopg.Connection, sql: str, work_mem: str) -> float:
    conn.execute(f"SET work_mem = '{work_mem}'")
    start = time.perf_counter()
    conn.execute(sql).fetchall()
    return (time.perf_counter() - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--people", type=int, nargs="+", default=[100_000])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--settings", nargs="+", default=["4MB", "16MB", "128MB"])
    parser.add_argument("--data-dir", help="keep the generated databases here and reuse them in later runs")
    args = parser.parse_args()
    with EmbeddedPostgres(args.data_dir, keep=args.data_dir is not None) as admin:
        for people in args.people:
            url = database(admin, people)
            engine = Engine(Settings(database=url, schema=str(SCHEMA)))
            print(f"\n{people:,} people: median ms of {args.runs} runs (× exact)\n")
            print("| query | exact | " + " | ".join(args.settings) + " |")
            print("|---|---:|" + "---:|" * len(args.settings))
            with psycopg.connect(url) as conn:
                conn.execute("SET jit = off")
                for sql in QUERIES:
                    rewritten = engine.prepare(sql).rewritten.sql
                    times: dict[str, list[float]] = {"exact": [], **{s: [] for s in args.settings}}
                    for _ in range(args.runs):
                        times["exact"].append(timed(conn, sql, "4MB"))
                        for setting in args.settings:
                            times[setting].append(timed(conn, rewritten, setting))
                    exact = statistics.median(times["exact"])
                    cells = [f"{statistics.median(times[s]):.0f} ({statistics.median(times[s]) / exact:.1f}×)"
                             for s in args.settings]
                    print(f"| `{sql}` | {exact:.0f} | " + " | ".join(cells) + " |", flush=True)
            engine.close()


if __name__ == "__main__":
    main()
