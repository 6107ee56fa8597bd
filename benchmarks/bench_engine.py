"""Engine benchmark: end-to-end latency through dpsql.connect against the exact query run with psycopg,
and the relative error at ε = 1, on the demo dataset.

    python benchmarks/bench_engine.py --people 100000 1000000 --runs 7

Each dpsql run uses a slightly different ε so that no answer comes from the cache. Latencies are medians
of the runs; the exact query is timed in the same loop, interleaved, so machine noise hits both alike.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import psycopg

import dpsql
from dpsql.demo import load_demo_data, progress_bar
from dpsql.embedded import EmbeddedPostgres

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "schemas" / "demo.toml"

QUERIES = [
    # (label, sql, ungrouped, bounds a multi-row table per unit)
    ("COUNT(*) people", "SELECT COUNT(*) FROM people", True, False),
    ("SUM(income)", "SELECT SUM(income) FROM people", True, False),
    ("AVG(income)", "SELECT AVG(income) FROM people", True, False),
    ("AVG(age) WHERE", "SELECT AVG(age) FROM people WHERE income > 40000", True, False),
    ("COUNT(*) visits", "SELECT COUNT(*) FROM visits", True, True),
    ("SUM(amount) visits", "SELECT SUM(amount) FROM visits", True, True),
    ("AVG by sex", "SELECT sex, AVG(income) FROM people GROUP BY sex", False, False),
    ("COUNT by category", "SELECT category, COUNT(*) FROM visits GROUP BY category", False, True),
    ("COUNT by state (PS)", "SELECT state, COUNT(*) FROM people GROUP BY state", False, False),
]


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _fetch_all(conn: psycopg.Connection, sql: str) -> list[tuple]:
    return conn.execute(sql).fetchall()


def _relative_error(noisy: list[tuple], exact: list[tuple]) -> float:
    truth = {tuple(r[:-1]): float(r[-1]) for r in exact}
    errors = []
    for row in noisy:
        key, value = tuple(row[:-1]), row[-1]
        if key in truth and truth[key] != 0:
            errors.append(abs(float(value) - truth[key]) / abs(truth[key]))
    return statistics.median(errors) if errors else float("nan")


def run(people: int, runs: int) -> list[dict]:
    server = EmbeddedPostgres()
    url = server.start()
    try:
        print(f"\n== {people:,} people ==", file=sys.stderr)
        load_demo_data(url, people=people, progress=progress_bar)
        conn = dpsql.connect(database=url, schema=str(SCHEMA), analyst=_analyst(url))
        direct = psycopg.connect(url)
        results = []
        for label, sql, ungrouped, per_unit in QUERIES:
            cur = conn.cursor()
            exact_rows = direct.execute(sql).fetchall()  # warm caches for both
            cur.execute(sql, epsilon=1.0)
            dp_times, exact_times, errors = [], [], []
            for i in range(runs):
                exact_times.append(_time(partial(_fetch_all, direct, sql)))
                dp_times.append(_time(partial(cur.execute, sql, epsilon=1.0 + (i + 1) * 1e-9)))
                errors.append(_relative_error(cur.fetchall(), exact_rows))
            cur.execute(sql, epsilon=1.0)
            dp = statistics.median(dp_times) * 1000
            ex = statistics.median(exact_times) * 1000
            results.append({"people": people, "query": label, "exact_ms": ex, "dpsql_ms": dp,
                            "ratio": dp / ex, "target_ms": 1.3 * ex + 2 if ungrouped and not per_unit else
                            (2 * ex if per_unit else None), "rel_error": statistics.median(errors),
                            "per_unit": per_unit})
            print(f"  {label:<22} exact {ex:8.2f} ms  dpsql {dp:8.2f} ms", file=sys.stderr)
        count = conn.cursor()
        count.execute("SELECT COUNT(*) FROM people", epsilon=0.5)
        results.append({"people": people, "query": "charge check", "epsilon_charged": count.epsilon_spent,
                        "noise_scale": count.accuracy[0][0].scale})
        conn.close()
        direct.close()
        return results
    finally:
        server.stop()


def _analyst(url: str) -> str:
    from dpsql.accounting import Ledger
    ledger = Ledger(url)
    try:
        ledger.add_analyst("bench", 1e6, 0.5)
    finally:
        ledger.close()
    return "bench"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--people", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    rows = [r for n in args.people for r in run(n, args.runs)]
    print("\n| people | query | exact ms | dpsql ms | ratio | target ms | met | median rel. error (ε=1) |")
    print("|---:|---|---:|---:|---:|---:|:-:|---:|")
    for r in rows:
        if r["query"] == "charge check":
            continue
        target = r["target_ms"]
        met = "" if target is None else ("yes" if r["dpsql_ms"] <= target else "NO")
        print(f"| {r['people']:,} | {r['query']} | {r['exact_ms']:.2f} | {r['dpsql_ms']:.2f} | {r['ratio']:.2f} | "
              f"{'' if target is None else f'{target:.2f}'} | {met} | {r['rel_error']:.2e} |")
    for r in rows:
        if r["query"] == "charge check":
            print(f"\n{r['people']:,} people: COUNT(*) at ε=0.5 charged ε={r['epsilon_charged']:.12g}, "
                  f"noise scale {r['noise_scale']:.12g} (1/ε = 2)")


if __name__ == "__main__":
    main()
