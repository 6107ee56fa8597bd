"""The neighbour fuzzer's long run: as many generated queries as asked, each compared on a base database and on
every extreme neighbour (see tests/fuzzing.py for the grammar, the worlds and what is checked).

    python benchmarks/fuzz_neighbours.py --queries 3000 --seed 1

Prints a table per world (queries, refused before execution, pairs compared, violations, time) and every
violation with the seed and query number that reproduce it; exits 1 if it found any. CI runs a few hundred
pairs of the same fuzzer (tests/test_fuzz.py); a violation found here becomes a regression test there.

`--backend spark` runs the worlds' rewritten queries on a local Spark session instead: each database is
exported as Parquet (values Spark cannot hold become NULL, so its neighbours are Spark's own), and every query
is compared between Spark's base and Spark's neighbours. `--backend duckdb` does the same on DuckDB (each copy
loaded from its Parquet files into its own in-memory database).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.fuzzing lives with the tests

from dpsql.embedded import EmbeddedPostgres  # noqa: E402
from tests import fuzzing  # noqa: E402

BATCH = 100  # queries between progress lines


def run_world(server: EmbeddedPostgres, name: str, queries: int, seed: int,
              backend: str = "postgresql") -> tuple[fuzzing.Report, float]:
    base, neighbours = fuzzing.build_world(server.url, lambda db: server.url.replace("/postgres?", f"/{db}?"), name)
    report, started = fuzzing.Report(), time.perf_counter()
    folder = Path(tempfile.mkdtemp(prefix=f"dpsql-fuzz-{backend}-"))
    opened = {"spark": fuzzing.spark_world, "duckdb": fuzzing.duckdb_world}.get(backend)
    world = opened(name, base, neighbours, folder) if opened else fuzzing.open_world(name, base, neighbours)
    with world as (engine, backends):
        others = {n: b for n, b in backends.items() if n != "base"}
        for batch, first in enumerate(range(0, queries, BATCH)):
            fuzzing.fuzz(engine, fuzzing.WORLDS[name].generate, backends["base"], others,
                         min(BATCH, queries - first), seed=seed * 1_000_003 + batch, report=report)
            print(f"  {name}: {report.summary()} ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    return report, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queries", type=int, default=2000, help="queries per world")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--world", choices=[*fuzzing.WORLDS, "all"], default="all")
    parser.add_argument("--backend", choices=["postgresql", "spark", "duckdb"], default="postgresql")
    args = parser.parse_args()
    server = EmbeddedPostgres()
    server.start()
    try:
        results = {name: run_world(server, name, args.queries, args.seed, args.backend)
                   for name in (fuzzing.WORLDS if args.world == "all" else [args.world])}
    finally:
        server.stop()
    print(f"\nneighbour fuzz on {args.backend}, seed {args.seed} (batch b of a world uses seed "
          f"{args.seed} * 1000003 + b)\n")
    print("| world | queries | refused before execution | neighbour pairs | respellings sharing a cache key | "
          "answers read from the race | bounded answers with weighted selection | violations | time (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, (report, seconds) in results.items():
        print(f"| {name} | {report.queries} | {report.refused} | {report.pairs} | {report.respelled} | "
              f"{report.race_reads} | {report.weighted} | {len(report.violations)} | {seconds:.0f} |")
    violations = [v for report, _ in results.values() for v in report.violations]
    for violation in violations:
        print(violation)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
