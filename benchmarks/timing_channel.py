"""The timing channel and what the latency floor costs: how long a fresh answer takes on a database and on its
neighbour (one person with `--extra` more visits, beyond the 10 the rewrite keeps), without and with
`latency_floor_ms`, and whether a two-sample Kolmogorov-Smirnov test tells the two apart.

    python benchmarks/timing_channel.py --people 20000 --extra 5000 --runs 200 --floor 50

Runs alternate between the two databases so that machine noise hits both alike; each uses a slightly different
ε so that no answer comes from the cache.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import psycopg
from scipy.stats import ks_2samp

from dpsql.config import Settings
from dpsql.demo import load_demo_data
from dpsql.embedded import EmbeddedPostgres
from dpsql.engine import Engine

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "schemas" / "demo.toml"
QUERY = "SELECT COUNT(*), SUM(amount) FROM visits"


def databases(postgres: EmbeddedPostgres, people: int, extra: int) -> tuple[str, str]:
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        for name in ("timing_base", "timing_neighbour"):
            conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute("CREATE DATABASE timing_base")
    base = postgres.url.replace("/postgres?", "/timing_base?")
    load_demo_data(base, people=people, seed=3)
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE timing_neighbour TEMPLATE timing_base")
    neighbour = postgres.url.replace("/postgres?", "/timing_neighbour?")
    with psycopg.connect(neighbour, autocommit=True) as conn:
        conn.execute("INSERT INTO people VALUES (999999999, 40, 'F', 'CA', 50000)")
        conn.execute("INSERT INTO visits SELECT 999999999000 + i, 999999999, DATE '2024-01-01', 'lab', 10 "
                     "FROM generate_series(1, %s) AS i", (extra,))
        conn.execute("ANALYZE")
    return base, neighbour


def timings(engines: dict[str, Engine], runs: int, start: int) -> dict[str, list[float]]:
    """Milliseconds per fresh answer on each database, interleaved."""
    out: dict[str, list[float]] = {name: [] for name in engines}
    for i in range(runs):
        for name, engine in engines.items():
            began = time.perf_counter()
            engine.query(QUERY, analyst="timing", epsilon=0.1 + (start + i) * 1e-7)
            out[name].append((time.perf_counter() - began) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--people", type=int, default=20_000)
    parser.add_argument("--extra", type=int, default=5_000)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--floor", type=int, default=50, help="latency_floor_ms to compare with no floor")
    args = parser.parse_args()
    postgres = EmbeddedPostgres()
    postgres.start()
    base, neighbour = databases(postgres, args.people, args.extra)
    print(f"## timing: `{QUERY}`, {args.people:,} people; the neighbour adds one person with {args.extra:,} "
          f"visits; {args.runs} fresh answers a side\n")
    print("| latency_floor_ms | median base (ms) | median neighbour (ms) | p95 base | p95 neighbour | KS D | KS p |")
    print("|---|---|---|---|---|---|---|")
    for number, floor in enumerate((0, args.floor)):
        engines = {}
        for name, url in (("base", base), ("neighbour", neighbour)):
            engine = Engine(Settings(database=url, schema=str(SCHEMA), latency_floor_ms=floor))
            if number == 0:
                engine.ledger.add_analyst("timing", 1e9, 0.5)
            engines[name] = engine
        timings(engines, 10, start=number * 10**6)  # warm the pools and caches
        measured = timings(engines, args.runs, start=number * 10**6 + 100)
        for engine in engines.values():
            engine.close()
        a, b = measured["base"], measured["neighbour"]
        test = ks_2samp(a, b)
        p95 = [statistics.quantiles(x, n=20)[-1] for x in (a, b)]
        print(f"| {floor} | {statistics.median(a):.2f} | {statistics.median(b):.2f} | {p95[0]:.2f} | {p95[1]:.2f} "
              f"| {test.statistic:.3f} | {test.pvalue:.3g} |")
    postgres.stop()


if __name__ == "__main__":
    main()
