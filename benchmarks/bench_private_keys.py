"""Private group keys: how many groups partition selection releases, and how accurate the released ones are.

    python benchmarks/bench_private_keys.py --runs 20

The demo data with the shipped schema less the category's declared domain, so `category` is a private key and
each answer's groups pass DP partition selection (weighted: each person's kept visits weigh one person in all,
`Plan.selects_on_weights`). For each size and ε, `runs` fresh answers per question; *released* counts the
(answer, category) cells released out of runs × 8, *median error* and *coverage* (of the 95% intervals) are
over the released cells. A category missing from an answer is invisible to the analyst, so recall is accuracy
too: a group dropped in some answers and not others makes a false trend.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.accuracy lives with the tests

from dpsql.config import Settings  # noqa: E402
from dpsql.demo import load_demo_data  # noqa: E402
from dpsql.embedded import EmbeddedPostgres  # noqa: E402
from dpsql.engine import Engine  # noqa: E402
from dpsql.schema import load_schema  # noqa: E402
from tests.accuracy import exact, measure  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "private_keys.md"
QUESTIONS = {
    "visits by category": "SELECT category, COUNT(*) FROM visits GROUP BY 1",
    "SUM(amount) by category": "SELECT category, SUM(amount) FROM visits GROUP BY 1",
    "AVG(amount) by category": "SELECT category, AVG(amount) FROM visits GROUP BY 1",
}


def private_category_schema():
    """The shipped schema with no declared domain for visits.category."""
    schema = load_schema(ROOT / "schemas" / "demo.toml")
    visits = schema.tables["visits"]
    category = dataclasses.replace(visits.columns["category"], domain=None)
    tables = {**schema.tables, "visits": dataclasses.replace(visits, columns={**visits.columns, "category": category})}
    return dataclasses.replace(schema, tables=tables)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--people", type=int, nargs="+", default=[3000, 20000])
    parser.add_argument("--epsilon", type=float, nargs="+", default=[1.0, 0.1])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    server = EmbeddedPostgres()
    server.start()
    started, rows = time.perf_counter(), []
    try:
        for people in args.people:
            with psycopg.connect(server.url, autocommit=True) as conn:
                conn.execute("DROP DATABASE IF EXISTS dpsql_private_keys")
                conn.execute("CREATE DATABASE dpsql_private_keys")
            url = server.url.replace("/postgres?", "/dpsql_private_keys?")
            load_demo_data(url, people=people, seed=3)
            engine = Engine(Settings(database=url), private_category_schema())
            try:
                for label, sql in QUESTIONS.items():
                    truth = exact(url, sql)
                    for epsilon in args.epsilon:
                        found = measure(engine, sql, truth, args.runs, epsilon)
                        cells = args.runs * len(truth)
                        error = f"{100 * statistics.median(abs(e) for e in found.errors):.1f}%" if found.errors \
                            else "–"
                        coverage = f"{100 * found.coverage:.0f}%" if found.coverage is not None else "–"
                        rows.append(f"| {label} | {people:,} | {epsilon:g} | {len(found.errors)} of {cells} | "
                                    f"{error} | {coverage} |")
                        print(rows[-1], file=sys.stderr)
            finally:
                engine.close()
    finally:
        server.stop()
    text = (f"# Private group keys: groups released and their accuracy\n\n`python benchmarks/bench_private_keys.py "
            f"--runs {args.runs}` ({time.perf_counter() - started:.0f} s): the demo data (seed 3) with "
            "`visits.category` undeclared, so its 8 values pass DP partition selection in every answer.\n\n"
            "| question | people | ε | released (answer, category) cells | median error | 95% coverage |\n"
            "|---|---:|---:|---:|---:|---:|\n" + "\n".join(rows) + "\n")
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
