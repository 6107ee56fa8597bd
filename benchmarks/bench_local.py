"""Local against central DP, and the geo mechanisms against the LP-optimal obfuscation.

    python benchmarks/bench_local.py --runs 5 --out benchmarks/results

1. Histograms. n people each hold one of 4 diets (shares 0.72, 0.08, 0.14, 0.06). For n from 10^3 to 10^6, every
   run loads into the embedded PostgreSQL a private table of the true values and a public table of k-ary RR
   reports (each randomized with `dpsql.local`'s exact sampler at ε), then asks through dpsql.connect
   `SELECT diet, COUNT(*) ... GROUP BY diet` of both: the reports answer with unbiased estimates (free), the
   true values with central Laplace noise at the same ε (charged). Error is the RMSE over the 4 counts and the runs,
   against the true counts; the table also gives the RMSE the estimator's own variance predicts. Local error grows like
   √n, central error stays constant, so their ratio grows like √n.
2. Locations. On 4×4 and 5×5 grids of unit cells, the expected distance between a person's cell and the reported
   one (uniform prior over cells) for planar Laplace remapped to the grid and for the optimal obfuscation
   matrix (the LP), at ε from 0.25 to 2 per unit of distance.

Writes local.md and local.png (matplotlib) to --out.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import psycopg

import dpsql
from dpsql.accounting import Ledger
from dpsql.embedded import EmbeddedPostgres
from dpsql.local import randomizer
from dpsql.mechanisms.local import Grid, OptimalObfuscation, PlanarLaplace
from dpsql.schema import load_schema

DIETS = ["omnivore", "pescatarian", "vegetarian", "vegan"]
SHARES = [0.72, 0.08, 0.14, 0.06]
SCHEMA = """
[privacy]
unit = "truth.person_id"
[tables.truth]
[tables.truth.columns]
person_id = "bigint"
diet = {{ type = "text", domain = {diets} }}
[tables.reports]
public = true
[tables.reports.columns]
id = "bigint"
diet = {{ type = "text", domain = {diets}, local = {{ mechanism = "krr", epsilon = {epsilon} }} }}
"""


def histogram_errors(url: str, schema_path: Path, n: int, epsilon: float, runs: int, seed: int) -> dict[str, float]:
    schema = load_schema(schema_path)
    krr = randomizer(schema.tables["reports"].columns["diet"].local)
    rng = np.random.default_rng(seed)
    device = random.Random(seed)
    local_err, central_err, predicted = [], [], []
    ledger = Ledger(url)
    for run in range(runs):
        values = rng.choice(DIETS, n, p=SHARES)
        true = np.array([(values == d).sum() for d in DIETS], dtype=float)
        reports = [krr.randomize(v, device) for v in values]
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS truth, reports; CREATE TABLE truth (person_id bigint PRIMARY KEY, "
                         "diet text); CREATE TABLE reports (id bigint PRIMARY KEY, diet text)")
            with conn.cursor().copy("COPY truth FROM STDIN") as copy:
                for i, v in enumerate(values):
                    copy.write_row((i, v))
            with conn.cursor().copy("COPY reports FROM STDIN") as copy:
                for i, v in enumerate(reports):
                    copy.write_row((i, v))
        analyst = f"bench_{n}_{run}_{time.monotonic_ns()}"
        ledger.add_analyst(analyst, 10.0, 0.0)
        with dpsql.connect(database=url, schema=str(schema_path), analyst=analyst) as conn:
            cur = conn.cursor()
            cur.execute("SELECT diet, COUNT(*) FROM reports GROUP BY diet")
            local = dict(cur.fetchall())
            variances = krr.estimate([sum(r == d for r in reports) for d in DIETS]).variances
            cur.execute("SELECT diet, COUNT(*) FROM truth GROUP BY diet", epsilon=epsilon)
            central = dict(cur.fetchall())
        local_err.append(_rmse([local[d] for d in DIETS], true))
        central_err.append(_rmse([central[d] for d in DIETS], true))
        predicted.append(float(np.mean(variances)))
    ledger.close()
    return {"local": _root_mean_square(local_err), "central": _root_mean_square(central_err),
            "predicted": math.sqrt(statistics.fmean(predicted))}


def _root_mean_square(errors: list[float]) -> float:
    return math.sqrt(statistics.fmean(e * e for e in errors))


def _rmse(values: list[float], true: np.ndarray) -> float:
    return float(np.sqrt(np.mean((np.asarray(values, dtype=float) - true) ** 2)))


def geo_errors(epsilons: list[float]) -> list[tuple[int, float, float, float, float]]:
    rows = []
    for side in (4, 5):
        grid = Grid(0, side, 0, side, 1.0)
        for epsilon in epsilons:
            started = time.perf_counter()
            lp = OptimalObfuscation(epsilon, grid)
            solve = time.perf_counter() - started
            rows.append((side * side, epsilon, PlanarLaplace(epsilon, grid).expected_distance_error(),
                         lp.expected_distance_error(), solve))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--sizes", default="1000,10000,100000,1000000")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    lines = ["# Local DP against central DP, and geo-indistinguishable locations", "",
             f"`python benchmarks/bench_local.py --runs {args.runs} --epsilon {args.epsilon:g} --sizes {args.sizes}`",
             "", f"## Counts of 4 diets at ε = {args.epsilon:g}: RMSE per count "
             f"(over {args.runs} runs; half as many at 10^6)", "",
             "| n | local k-RR estimate | predicted (estimator's variance) | central Laplace | local / central |",
             "|---|---|---|---|---|"]
    results = {}
    pg = EmbeddedPostgres()
    pg.start()
    try:
        schema_path = args.out / "bench_local_schema.toml"
        args.out.mkdir(parents=True, exist_ok=True)
        diets = "[" + ", ".join(f'"{d}"' for d in DIETS) + "]"
        schema_path.write_text(SCHEMA.format(diets=diets, epsilon=args.epsilon))
        for n in sizes:
            runs = args.runs if n < 1_000_000 else max(1, args.runs // 2)
            print(f"n = {n}: {runs} runs", file=sys.stderr)
            errors = histogram_errors(pg.url, schema_path, n, args.epsilon, runs, seed=n)
            results[n] = errors
            lines.append(f"| {n:,} | {errors['local']:.1f} | {errors['predicted']:.1f} | {errors['central']:.2f} "
                         f"| {errors['local'] / errors['central']:.0f}× |")
        schema_path.unlink()
    finally:
        pg.stop()
    epsilons = [0.25, 0.5, 1.0, 2.0]
    geo = geo_errors(epsilons)
    lines += ["", "## Expected distance error of location reports (uniform prior; unit cells)", "",
              "| cells | ε per unit | planar Laplace on the grid | optimal obfuscation (LP) | LP / planar | "
              "LP solve (s) |", "|---|---|---|---|---|---|"]
    lines += [f"| {cells} | {eps:g} | {pl:.3f} | {lp:.3f} | {lp / pl:.2f} | {solve:.2f} |"
              for cells, eps, pl, lp, solve in geo]
    _plot(args.out / "local.png", results, geo)
    lines += ["", "![local against central, and geo mechanisms](local.png)", ""]
    (args.out / "local.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


def _plot(path: Path, results: dict[int, dict[str, float]], geo: list) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    sizes = sorted(results)
    left.loglog(sizes, [results[n]["local"] for n in sizes], "o-", label="local (k-RR estimate)")
    left.loglog(sizes, [results[n]["predicted"] for n in sizes], ":", label="local, predicted by its variance")
    left.loglog(sizes, [results[n]["central"] for n in sizes], "s-", label="central (Laplace)")
    left.set_xlabel("people (n)")
    left.set_ylabel("RMSE per count")
    left.set_title("4 diets at the same ε: local error grows like √n")
    left.legend()
    for cells, marker in ((16, "o"), (25, "s")):
        rows = [r for r in geo if r[0] == cells]
        right.plot([r[1] for r in rows], [r[2] for r in rows], marker + "-", label=f"planar Laplace, {cells} cells")
        right.plot([r[1] for r in rows], [r[3] for r in rows], marker + "--", label=f"optimal (LP), {cells} cells")
    right.set_xlabel("ε per unit of distance")
    right.set_ylabel("expected distance error (cells)")
    right.set_title("Location reports on a grid")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
