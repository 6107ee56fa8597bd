"""Accuracy on the questions a new user asks first (issue 36): the demo data, ε = 1 per query, many fresh answers
(each from a new analyst), their median relative error, worst cell, bias and how often the 95% interval covers
the exact answer, in two settings measured in the same run:

- declared: the shipped schema (visits bounded to 10 a person, prescriptions to 20);
- auto: the same schema with loose caps (1,000 a person) and `dpsql.rows_per_unit = auto`, so each query's
  rows per unit are chosen from the data by R2T's race (20% of its ε), below the cap.

    python benchmarks/bench_accuracy.py --people 20000 --runs 20

Cells of fewer than 500 exact rows are left out of the worst-cell column (their noise dominates). Writes the
table to benchmarks/results/accuracy.md.
"""

from __future__ import annotations

import argparse
import itertools
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dpsql.config import Settings  # noqa: E402
from dpsql.demo import load_demo_data  # noqa: E402
from dpsql.embedded import EmbeddedPostgres  # noqa: E402
from dpsql.engine import Engine  # noqa: E402
from dpsql.schema import load_schema  # noqa: E402
from dpsql.session import Options  # noqa: E402

SCHEMA = ROOT / "schemas" / "demo.toml"
RESULTS = ROOT / "benchmarks" / "results" / "accuracy.md"
QUESTIONS = [
    ("visits by quarter", "SELECT date_trunc('quarter', day), COUNT(*) FROM visits GROUP BY 1"),
    ("visits by month", "SELECT date_trunc('month', day), COUNT(*) FROM visits GROUP BY 1"),
    ("visits by category", "SELECT category, COUNT(*) FROM visits GROUP BY category"),
    ("SUM(amount) by quarter", "SELECT date_trunc('quarter', day), SUM(amount) FROM visits GROUP BY 1"),
    ("AVG(amount)", "SELECT AVG(amount) FROM visits"),
    ("SUM(amount)", "SELECT SUM(amount) FROM visits"),
    ("lab and dental", "SELECT category, COUNT(*) FROM visits WHERE category IN ('lab', 'dental') "
                       "GROUP BY category"),
    ("people by state", "SELECT state, COUNT(*) FROM people GROUP BY state"),
]
SMALL = 500
_analysts = itertools.count()


def loose_schema(folder: Path) -> Path:
    """The shipped schema with every multi-row table capped at 1,000 rows a person instead of its guess."""
    text = re.sub(r"max_rows_per_unit = (10|20)\b", "max_rows_per_unit = 1000", SCHEMA.read_text())
    path = folder / "demo_loose.toml"
    path.write_text(text)
    return path


def measure(engine: Engine, sql: str, truth: dict, runs: int, options: Options) -> dict:
    errors, biases, covered, worst, keys_released = [], [], [], 0.0, set()
    for _ in range(runs):
        analyst = f"accuracy_{next(_analysts)}"
        engine.ledger.add_analyst(analyst, 100.0, 1e-3)
        answer = engine.query(sql, analyst=analyst, epsilon=1.0, options=options)
        for row, accuracy in zip(answer.rows, answer.accuracy, strict=True):
            key, value, acc = row[:-1], row[-1], accuracy[-1]
            keys_released.add(key)
            exact = truth.get(key)
            if exact is None or not exact:
                continue
            error = (float(value) - exact) / abs(exact)
            errors.append(abs(error))
            biases.append(error)
            if acc is not None and acc.ci_low is not None:
                covered.append(acc.ci_low <= exact <= acc.ci_high)
            if abs(exact) >= SMALL or len(truth) == 1:
                worst = max(worst, abs(error))
    return {"median": statistics.median(errors), "worst": worst, "bias": statistics.median(biases),
            "coverage": sum(covered) / len(covered) if covered else None, "keys": len(keys_released)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--people", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    server = EmbeddedPostgres()
    server.start()
    started = time.perf_counter()
    try:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("DROP DATABASE IF EXISTS dpsql_accuracy")
            conn.execute("CREATE DATABASE dpsql_accuracy")
        url = server.url.replace("/postgres?", "/dpsql_accuracy?")
        load_demo_data(url, people=args.people, seed=3)
        settings = {"declared": (load_schema(SCHEMA), Options()),
                    "auto": (load_schema(loose_schema(Path(tempfile.mkdtemp()))), Options(rows_per_unit="auto"))}
        rows = []
        for label, sql in QUESTIONS:
            with psycopg.connect(url) as conn:
                truth = {tuple(r[:-1]): float(r[-1]) for r in conn.execute(sql).fetchall()}
            cells = [label]
            for name, (schema, options) in settings.items():
                engine = Engine(Settings(database=url), schema)
                try:
                    found = measure(engine, sql, truth, args.runs, options)
                finally:
                    engine.close()
                coverage = "–" if found["coverage"] is None else f"{100 * found['coverage']:.0f}%"
                cells += [f"{100 * found['median']:.2f}%", f"{100 * found['worst']:.1f}%",
                          f"{100 * found['bias']:+.2f}%", coverage, str(found["keys"])]
                print(f"{label} [{name}]: {found}", file=sys.stderr)
            rows.append("| " + " | ".join(cells) + " |")
    finally:
        server.stop()
    header = ("| question | declared: median error | worst cell | median bias | 95% coverage | keys | "
              "auto: median error | worst cell | median bias | 95% coverage | keys |\n" + "|---" * 11 + "|")
    text = (f"# Accuracy on a new user's first questions\n\n`python benchmarks/bench_accuracy.py --people "
            f"{args.people} --runs {args.runs}`: the demo data, ε = 1 per query, {args.runs} fresh answers per "
            f"question and setting, in {time.perf_counter() - started:.0f} s. *Declared*: the shipped schema "
            "(visits bounded to 10 a person). *Auto*: caps of 1,000 a person and `dpsql.rows_per_unit = auto` "
            "(R2T's race chooses each query's rows per unit with 20% of its ε). Errors are relative to the exact "
            f"answer; the worst cell is over cells of {SMALL} or more; coverage is how often the 95% interval "
            "held the exact answer; keys counts the distinct keys released.\n\n" + header + "\n"
            + "\n".join(rows) + "\n")
    print(text)
    RESULTS.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
