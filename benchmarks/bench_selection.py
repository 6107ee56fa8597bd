"""Selection mechanisms on the demo dataset: the DP median's rank error, and NoiseFirst against plain
Laplace bins.

    python benchmarks/bench_selection.py --people 100000 --runs 25

Median: each run asks `percentile_cont(0.5)` through dpsql.connect with a fresh ε (no cache), and measures
|rank(answer) - n/2| / n, where rank counts the stored values below the answer (the population's rank range
is n). NoiseFirst: the exact per-bin counts of age (101 bins) and of income in 1000-wide bins are read once;
each run adds Laplace noise at ε and compares the mean squared error of the raw noisy bins with NoiseFirst's
smoothed bins (pure post-processing, no extra budget).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np
import psycopg

import dpsql
from dpsql.accounting import Ledger
from dpsql.demo import load_demo_data, progress_bar
from dpsql.embedded import EmbeddedPostgres
from dpsql.mechanisms import noise_first

SCHEMA = Path(__file__).resolve().parent.parent / "schemas" / "demo.toml"


def median_rank_errors(conn, direct, column: str, runs: int, epsilon: float) -> list[float]:
    n = direct.execute(f"SELECT COUNT({column}) FROM people").fetchone()[0]
    errors = []
    for i in range(runs):
        cur = conn.cursor()
        cur.execute(f"SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY {column}) FROM people",
                    epsilon=epsilon + (i + 1) * 1e-9)
        answer = cur.fetchone()[0]
        below, at = direct.execute(f"SELECT COUNT(*) FILTER (WHERE {column} < %s), "
                                   f"COUNT(*) FILTER (WHERE {column} = %s) FROM people", (answer, answer)).fetchone()
        rank = min(max(n / 2, below), below + at)  # ties: the rank range the answer covers
        errors.append(abs(rank - n / 2) / n)
    return errors


def noise_first_mse(counts: np.ndarray, epsilon: float, runs: int, rng: np.random.Generator) -> tuple[float, float]:
    scale = 1 / epsilon  # one person is in one bin: L1 sensitivity 1
    plain, smoothed = [], []
    for _ in range(runs):
        noisy = counts + rng.laplace(0, scale, len(counts))
        merged, _ = noise_first(list(noisy), 2 * scale**2)
        plain.append(float(np.mean((noisy - counts) ** 2)))
        smoothed.append(float(np.mean((np.array(merged) - counts) ** 2)))
    return statistics.mean(plain), statistics.mean(smoothed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--people", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=25)
    args = parser.parse_args()
    server = EmbeddedPostgres()
    url = server.start()
    try:
        load_demo_data(url, people=args.people, progress=progress_bar)
        ledger = Ledger(url)
        ledger.add_analyst("bench", 1e6, 0.5)
        ledger.close()
        conn = dpsql.connect(database=url, schema=str(SCHEMA), analyst="bench")
        direct = psycopg.connect(url)
        print(f"\nDP median at ε = 1, {args.people:,} people, {args.runs} runs (target: within 1% of n)\n")
        print("| column | median rank error / n | 95th percentile | max |")
        print("|---|---:|---:|---:|")
        for column in ("age", "income"):
            errors = median_rank_errors(conn, direct, column, args.runs, 1.0)
            print(f"| {column} | {statistics.median(errors):.2e} | {np.percentile(errors, 95):.2e} | "
                  f"{max(errors):.2e} |")
        rng = np.random.default_rng(1)
        histograms = {
            "age (101 bins)": direct.execute(
                "SELECT COUNT(*) FROM generate_series(0, 100) a LEFT JOIN people p ON p.age = a "
                "GROUP BY a ORDER BY a").fetchall(),
            "income (250 bins of 1000)": direct.execute(
                "SELECT COUNT(p.income) FROM generate_series(0, 249) b LEFT JOIN people p "
                "ON floor(LEAST(p.income, 249999) / 1000) = b GROUP BY b ORDER BY b").fetchall(),
        }
        print("\nNoiseFirst against plain Laplace bins (mean squared error per bin, mean of runs)\n")
        print("| histogram | ε | plain MSE | NoiseFirst MSE | ratio |")
        print("|---|---:|---:|---:|---:|")
        for label, rows in histograms.items():
            counts = np.array([r[0] for r in rows], dtype=float)
            for epsilon in (0.01, 0.1, 1.0):
                plain, smoothed = noise_first_mse(counts, epsilon, args.runs, rng)
                print(f"| {label} | {epsilon} | {plain:.4g} | {smoothed:.4g} | {plain / smoothed:.2f} |")
        conn.close()
        direct.close()
    finally:
        server.stop()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
