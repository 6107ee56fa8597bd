"""Beyond noisy sums on the demo dataset: the DP median's rank error, top-3 precision, NoiseFirst and
StructureFirst against plain Laplace bins, and Gaussian against Laplace noise.

    python benchmarks/bench_selection.py --people 100000 --runs 25

Median: each run asks `percentile_cont(0.5)` through dpsql.connect with a fresh ε (no cache), and measures
|rank(answer) - n/2| / n, where rank counts the stored values below the answer (the population's rank range
is n). Top-3: `ORDER BY COUNT(*) DESC LIMIT 3` over states (private keys) through dpsql; precision is the
share of the true top 3 among the answer's keys. Histograms: the exact per-bin counts of age (101 bins) and
of income in 1000- and 250-wide bins are read once; each run adds Laplace noise at ε (sensitivity 1: one
person is in one bin) and compares mean squared errors of the plain noisy bins, NoiseFirst (free
post-processing of those same bins), StructureFirst (the engine's split: 10% for the count clamp, 40% for
boundaries, 50% for bucket totals) and the best partition knowable only from the true counts ("oracle":
least SSE + k·σ² over all partitions; no method can beat it). Gaussian: visits per month with each person
counted in up to 10 months (max_groups_per_unit = 10, 10 visits each), answered through dpsql with each
mechanism at (ε, δ) = (1, 1e-6); errors are against the exact pre-noise answers of the same rewritten SQL,
so they are the noise alone. The second table shows the noise when N such queries share ε = 5, δ = 1e-6
(Laplace under basic composition, Gaussian under zCDP), from the engine's own calibration.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import numpy as np
import psycopg

import dpsql
from dpsql.accounting import Ledger, zcdp
from dpsql.demo import load_demo_data, progress_bar
from dpsql.embedded import EmbeddedPostgres
from dpsql.mechanisms import (
    GaussianMechanism,
    LaplaceMechanism,
    StructureFirstPlan,
    noise_first,
    structure_first,
    structure_first_or_noise_first,
)
from dpsql.mechanisms.histograms import optimal_tables
from dpsql.session import Options

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


def top3_precision(conn, direct, runs: int, epsilon: float) -> list[float]:
    truth = {r[0] for r in direct.execute("SELECT state FROM people GROUP BY state ORDER BY COUNT(*) DESC "
                                          "LIMIT 3").fetchall()}
    out = []
    for i in range(runs):
        cur = conn.cursor()
        cur.execute("SELECT state, COUNT(*) FROM people GROUP BY state ORDER BY COUNT(*) DESC LIMIT 3",
                    epsilon=epsilon + (i + 1) * 1e-9)
        out.append(len({row[0] for row in cur.fetchall()} & truth) / 3)
    return out


def histogram_mse(counts: np.ndarray, epsilon: float, runs: int, rng: np.random.Generator) -> dict[str, float]:
    """Mean squared error per bin of plain bins, NoiseFirst, StructureFirst alone (as its paper has it, with
    dpsql's bucket count and F) and StructureFirst as dpsql ships it (where it pays; NoiseFirst elsewhere),
    with how often the latter ran StructureFirst. One person is in one bin."""
    variance = 2 / epsilon**2  # Laplace of scale 1/ε
    plain, merged, structured, shipped, ran = [], [], [], [], 0
    release = StructureFirstPlan.calibrate(len(counts), 1, 1, epsilon)
    for _ in range(runs):
        noisy = counts + rng.laplace(0, 1 / epsilon, len(counts))
        smoothed, _ = noise_first(list(noisy), variance)
        clamp = max(1.0, float(np.ceil(release.max_count.release(float(counts.max()))
                                       + release.max_count.ci_halfwidth())))
        bucketed, _ = structure_first(list(counts), release.buckets, clamp, release.structure_epsilon,
                                      release.totals, score_sensitivity=2 * clamp)
        chosen, _, structure_ran = structure_first_or_noise_first(list(counts), release)
        ran += structure_ran
        plain.append(float(np.mean((noisy - counts) ** 2)))
        merged.append(float(np.mean((np.array(smoothed) - counts) ** 2)))
        structured.append(float(np.mean((np.array(bucketed) - counts) ** 2)))
        shipped.append(float(np.mean((np.array(chosen) - counts) ** 2)))
    n = len(counts)
    best, _, _ = optimal_tables(counts, n)
    oracle = float(np.min(best[1:, n] + np.arange(1, n + 1) * variance) / n)
    return {"plain": statistics.mean(plain), "noisefirst": statistics.mean(merged),
            "structurefirst": statistics.mean(structured), "shipped": statistics.mean(shipped),
            "ran": ran / runs, "oracle": oracle}


def gaussian_against_laplace(url: str, direct, runs: int) -> dict[str, float]:
    sql = "SELECT EXTRACT(month FROM day) AS m, COUNT(*) FROM visits GROUP BY m"
    conn = dpsql.connect(database=url, schema=str(SCHEMA), analyst="bench", max_groups_per_unit=10)
    try:
        rewritten = conn.engine.prepare(sql).rewritten.sql
        exact = {row[0]: float(row[1]) for row in direct.execute(rewritten).fetchall()}
        out = {}
        for mechanism in ("laplace", "gaussian"):
            errors = []
            for i in range(runs):
                cur = conn.cursor()
                cur.execute(sql, epsilon=1.0 + (i + 1) * 1e-9, mechanism=mechanism)
                errors.append(math.sqrt(statistics.mean((row[1] - exact[row[0]]) ** 2 for row in cur.fetchall())))
            out[mechanism] = statistics.median(errors)
        plan = conn.engine.prepare(sql, options=Options(mechanism="gaussian")).plan
        out["l1"], out["l2"] = plan.measures[0].sensitivity, plan.measures[0].l2_sensitivity
        return out
    finally:
        conn.close()


def composed_noise(l1: float, l2: float, queries: int, epsilon: float, delta: float) -> tuple[float, float]:
    """Per-query noise standard deviation when `queries` queries share (ε, δ)."""
    laplace = LaplaceMechanism.calibrate(l1, epsilon / queries, True, coordinates=10)
    gaussian = GaussianMechanism.calibrate(l2, zcdp.rho_for(epsilon, delta) / queries, True, coordinates=10)
    return math.sqrt(laplace.variance), math.sqrt(gaussian.variance)


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
        precision = top3_precision(conn, direct, args.runs, 1.0)
        print(f"\nTop-3 states at ε = 1 ({args.runs} runs, target ≥ 0.95): mean precision "
              f"{statistics.mean(precision):.3f}, worst run {min(precision):.3f}")
        rng = np.random.default_rng(1)
        histograms = {}
        for population, people in ((f"{args.people:,}", "people"),
                                   ("2,000", "(SELECT * FROM people ORDER BY person_id LIMIT 2000)")):
            histograms.update({
                f"age (101 bins), {population} people": direct.execute(
                    f"SELECT COUNT(p.age) FROM generate_series(0, 100) a LEFT JOIN {people} p ON p.age = a "
                    "GROUP BY a ORDER BY a").fetchall(),
                f"income (250 bins of 1000), {population} people": direct.execute(
                    f"SELECT COUNT(p.income) FROM generate_series(0, 249) b LEFT JOIN {people} p "
                    "ON floor(LEAST(p.income, 249999) / 1000) = b GROUP BY b ORDER BY b").fetchall(),
                f"income (1000 bins of 250), {population} people": direct.execute(
                    f"SELECT COUNT(p.income) FROM generate_series(0, 999) b LEFT JOIN {people} p "
                    "ON floor(LEAST(p.income, 249999) / 250) = b GROUP BY b ORDER BY b").fetchall(),
            })
        print("\nHistograms: mean squared error per bin (mean of runs); ratio = plain / method; the oracle ratio "
              "is the most any partition could give\n")
        print("| histogram | ε | plain MSE | NoiseFirst MSE | ratio | StructureFirst alone MSE | ratio | "
              "structurefirst as shipped MSE | ratio | ran StructureFirst | oracle ratio |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for label, rows in histograms.items():
            counts = np.array([r[0] for r in rows], dtype=float)
            for epsilon in (0.01, 0.1, 1.0):
                mse = histogram_mse(counts, epsilon, args.runs, rng)
                print(f"| {label} | {epsilon} | {mse['plain']:.4g} | {mse['noisefirst']:.4g} | "
                      f"{mse['plain'] / mse['noisefirst']:.2f} | {mse['structurefirst']:.4g} | "
                      f"{mse['plain'] / mse['structurefirst']:.2f} | {mse['shipped']:.4g} | "
                      f"{mse['plain'] / mse['shipped']:.2f} | {mse['ran']:.0%} | {mse['plain'] / mse['oracle']:.2f} |")
        noise = gaussian_against_laplace(url, direct, args.runs)
        print(f"\nGaussian against Laplace: visits per month, each person in up to 10 months (L1 sensitivity "
              f"{noise['l1']:g}, L2 {noise['l2']:.4g}), one query at ε = 1, δ = 1e-6; median over runs of the "
              "RMSE over months\n")
        print("| mechanism | RMSE (noise only) |")
        print("|---|---:|")
        print(f"| Laplace | {noise['laplace']:.1f} |")
        print(f"| Gaussian | {noise['gaussian']:.1f} |")
        print("\nPer-query noise standard deviation when N such queries share ε = 5, δ = 1e-6\n")
        print("| queries | Laplace (basic composition) | Gaussian (zCDP) | ratio |")
        print("|---:|---:|---:|---:|")
        for queries in (1, 10, 50, 200):
            laplace_sd, gaussian_sd = composed_noise(noise["l1"], noise["l2"], queries, 5.0, 1e-6)
            print(f"| {queries} | {laplace_sd:.1f} | {gaussian_sd:.1f} | {laplace_sd / gaussian_sd:.2f} |")
        conn.close()
        direct.close()
    finally:
        server.stop()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
