"""Releases on the demo data: synthetic tables, decision trees and densities against their baselines.

    python benchmarks/bench_releases.py --people 100000 --runs 5 --out benchmarks/results

1. Synthetic tables. people over (sex, age in 10 bins, income in 8 bins). At total ε, each method's 1-, 2- and
   3-way marginals against the exact ones (mean L1 error over the marginals of each way, as a share of the
   rows): MWEM (1- and 2-way workload, so 3-way marginals are held out), the noisy full contingency table
   projected onto counts (Laplace on each cell at ε: "database perturbation"; what `dpsql synth` chooses for
   tables this small), and the direct answers of the whole 1-, 2- and 3-way workload (Laplace on each marginal at
   ε / 7: one person is in every marginal). One release also runs
   end to end through `dpsql.connect(...).synthesize`.
2. Decision trees. A task table of --tree-rows rows with a known rule (sick = smoker and age > 50, or exercise
   low; 10% of labels flipped), features smoker, region, exercise and age in 4 bins; accuracy on 20,000
   held-out rows of the DP tree (through `decision_tree`, charged), the non-private tree (same algorithm,
   argmax and exact counts) and the naive DP tree (noisy counts of every candidate split, ε split over the
   candidates), by depth and ε.
3. Densities. income over the first n people: the L2 distance between the released density and the same KDE
   without noise, by n and ε (δ = 1e-6), and the released band against the least any (ε, δ) mechanism could
   promise.

Writes releases.md and releases.png to --out.
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import psycopg

import dpsql
from dpsql.accounting import Ledger, zcdp
from dpsql.demo import load_demo_data, progress_bar
from dpsql.embedded import EmbeddedPostgres
from dpsql.mechanisms.laplace import LaplaceMechanism
from dpsql.releases.density import CELLS, release_density
from dpsql.releases.synth import marginal, marginals, mwem, perturb
from dpsql.releases.tree import _grow, gini_score, predict

DEMO = Path(__file__).resolve().parent.parent / "schemas" / "demo.toml"
EPSILONS = [0.1, 0.5, 1.0, 2.0]
TASK_SCHEMA = """
[privacy]
unit = "task.id"
[tables.task.columns]
id = "bigint"
smoker = "boolean"
region = { type = "text", domain = ["n", "s", "e", "w"] }
exercise = { type = "text", domain = ["high", "low", "mid"] }
age = { type = "integer", lower = 0, upper = 100 }
sick = "boolean"
"""


# --- synthetic tables -------------------------------------------------------------------------------------------


def synth_errors(exact: np.ndarray, epsilon: float, runs: int) -> dict[str, dict[int, float]]:
    n = exact.sum()
    workload = marginals(exact.ndim, (1, 2, 3))
    errors: dict[str, dict[int, list[float]]] = {m: {w: [] for w in (1, 2, 3)} for m in ("mwem", "direct", "full")}
    rng = np.random.default_rng(0)
    for run in range(runs):
        synthetic, _, _ = mwem(exact, 1.0, epsilon, 2 * exact.ndim, marginals(exact.ndim), rng=random.Random(run))
        full, _ = perturb(exact, 1.0, epsilon, rng=random.Random(run))
        for axes in workload:
            truth = marginal(exact, axes)
            direct = truth + rng.laplace(0, len(workload) / epsilon, truth.shape)
            for name, answer in (("mwem", marginal(synthetic, axes)), ("direct", direct),
                                 ("full", marginal(full, axes))):
                errors[name][len(axes)].append(float(np.abs(answer - truth).sum() / n))
    return {m: {w: statistics.fmean(v) for w, v in by_way.items()} for m, by_way in errors.items()}


def people_table(url: str) -> np.ndarray:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT sex, width_bucket(age, 0, 100, 10), width_bucket(income, 0, 250000, 8), COUNT(*) "
                            "FROM people GROUP BY 1, 2, 3").fetchall()
    exact = np.zeros((2, 12, 10))
    for sex, age, income, count in rows:
        exact[0 if sex == "F" else 1, age, income] = count
    return exact


# --- trees ------------------------------------------------------------------------------------------------------


def task_rows(n: int, rng: random.Random) -> list[tuple]:
    rows = []
    for i in range(n):
        smoker, region = rng.random() < 0.3, rng.choice("nsew")
        exercise, age = rng.choice(["high", "low", "mid"]), rng.randrange(0, 100)
        sick = (smoker and age > 50) or exercise == "low"
        rows.append((i, smoker, region, exercise, age, sick != (rng.random() < 0.1)))
    return rows


def _cell(row: tuple) -> dict:
    return {"smoker": row[1], "region": row[2], "exercise": row[3], "age": min(int(row[4] // 25) + 1, 5)}


def accuracy(tree: dict, test: list[tuple]) -> float:
    return statistics.fmean(str(row[5]) == str(predict(tree, _cell(row))) for row in test)


class _Best:
    """The non-private tree's 'mechanisms': argmax splits, exact counts."""

    def select(self, scores: list[float]) -> int:
        return max(range(len(scores)), key=scores.__getitem__)

    def release(self, value: float) -> float:
        return value


def exact_table(url: str) -> dict[tuple, float]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT smoker, region, exercise, width_bucket(age, 0, 100, 4), sick, COUNT(*) "
                            "FROM task GROUP BY 1, 2, 3, 4, 5").fetchall()
    return {tuple(r[:5]): float(r[5]) for r in rows}


def tree_of(table: dict, depth: int, chooser, leaves) -> dict:
    domains = [[False, True], list("ensw"), ["high", "low", "mid"], [1, 2, 3, 4, 5], [False, True]]
    rows = {key: table.get(key, 0.0) for key in itertools.product(*domains)}
    return {"features": ["smoker", "region", "exercise", "age"], "tree": _grow(rows, [0, 1, 2, 3], depth, domains,
                                                                                chooser, leaves)}


def naive_tree(table: dict, depth: int, epsilon: float) -> dict:
    """Noisy counts of (value, label) for every candidate attribute at every node, at ε_level / candidates each;
    the split with the best Gini score on the noisy counts; leaves as the DP tree's."""
    domains = [[False, True], list("ensw"), ["high", "low", "mid"], [1, 2, 3, 4, 5], [False, True]]
    rows = {key: table.get(key, 0.0) for key in itertools.product(*domains)}
    level_epsilon = epsilon * 0.5 / depth
    leaves = LaplaceMechanism.calibrate(1, epsilon * 0.5, integer_valued=True)

    def grow(rows: dict, attributes: list[int], left: int) -> dict:
        if left == 0 or not attributes:
            labels = {v: sum(c for k, c in rows.items() if k[-1] == v) for v in domains[-1]}
            noisy = {str(v): max(0.0, leaves.release(c)) for v, c in labels.items()}
            return {"leaf": noisy, "predict": max(noisy, key=noisy.get)}
        per_count = LaplaceMechanism.calibrate(1, level_epsilon / len(attributes), integer_valued=True)
        scores = []
        for a in attributes:
            split: dict = {}
            for key, count in rows.items():
                split.setdefault(key[a], {}).setdefault(key[-1], 0.0)
                split[key[a]][key[-1]] += count
            noisy = {v: {c: max(0.0, per_count.release(n)) for c, n in by.items()} for v, by in split.items()}
            scores.append(gini_score(noisy))
        a = attributes[max(range(len(scores)), key=scores.__getitem__)]
        rest = [x for x in attributes if x != a]
        import json
        return {"split": a, "children": {json.dumps(v): grow({k: c for k, c in rows.items() if k[a] == v}, rest,
                                                             left - 1) for v in domains[a]}}

    return {"features": ["smoker", "region", "exercise", "age"], "tree": grow(rows, [0, 1, 2, 3], depth)}


# --- the run ----------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--people", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tree-rows", type=int, default=2000, help="training rows of the tree task (small enough "
                                                                    "that ε matters)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    lines = ["# Releases: synthetic tables, decision trees, densities", "",
             f"`python benchmarks/bench_releases.py --people {args.people} --runs {args.runs} "
             f"--tree-rows {args.tree_rows}`", ""]
    pg = EmbeddedPostgres()
    pg.start()
    try:
        load_demo_data(pg.url, people=args.people, progress=progress_bar)
        ledger = Ledger(pg.url)
        synth = _synthetic_tables(pg.url, ledger, args, lines)
        trees = _trees(pg.url, ledger, args, lines)
        densities = _densities(pg.url, ledger, args, lines)
        ledger.close()
    finally:
        pg.stop()
    _plot(args.out / "releases.png", synth, trees, densities)
    lines += ["", "![releases](releases.png)", ""]
    (args.out / "releases.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


def _analyst(ledger: Ledger, prefix: str) -> str:
    name = f"{prefix}_{time.monotonic_ns()}"
    ledger.add_analyst(name, 100.0, 1e-3)
    return name


def _synthetic_tables(url: str, ledger: Ledger, args, lines: list[str]) -> dict:
    exact = people_table(url)
    results = {eps: synth_errors(exact, eps, args.runs) for eps in EPSILONS}
    lines += ["## Synthetic people (sex × age in 10 bins × income in 8 bins): mean L1 error of the marginals, "
              f"share of rows (mean of {args.runs} runs)", "",
              "| ε | way | MWEM | noisy full table (dpsql synth's choice here) | direct workload answers |",
              "|---|---|---|---|---|"]
    for eps, by_method in results.items():
        for way in (1, 2, 3):
            lines.append(f"| {eps:g} | {way}{' (held out)' if way == 3 else ''} | {by_method['mwem'][way]:.4f} | "
                         f"{by_method['full'][way]:.4f} | {by_method['direct'][way]:.4f} |")
    started = time.perf_counter()
    with dpsql.connect(database=url, schema=str(DEMO), analyst=_analyst(ledger, "synth")) as conn:
        release = conn.synthesize("people", ["sex", "age", "income"], epsilon=1.0, bins=8)
        forced = conn.synthesize("people", ["sex", "age", "income"], epsilon=1.0, bins=8, method="mwem")
    lines += ["", f"End to end (`synthesize`, ε = 1, 3 columns in 8 bins, both methods): "
              f"{time.perf_counter() - started:.2f} s; auto chose {release['method']} (predicted 2-way L1: "
              + ", ".join(f"{k} {v:.0f}" for k, v in release["predicted_2way_l1"].items())
              + f"); MWEM measured {'; '.join(' × '.join(m) for m in forced['measured'])}.", ""]
    return results


def _trees(url: str, ledger: Ledger, args, lines: list[str]) -> dict:
    import tomllib

    from dpsql.config import Settings
    from dpsql.engine import Engine
    from dpsql.releases import decision_tree
    from dpsql.schema import parse_schema

    rng = random.Random(3)
    train, test = task_rows(args.tree_rows, rng), task_rows(20_000, rng)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS task; CREATE TABLE task (id bigint PRIMARY KEY, smoker boolean, "
                     "region text, exercise text, age integer, sick boolean)")
        with conn.cursor().copy("COPY task FROM STDIN") as copy:
            for row in train:
                copy.write_row(row)
    table = exact_table(url)
    engine = Engine(Settings(database=url), parse_schema(tomllib.loads(TASK_SCHEMA)))
    results: dict = {}
    try:
        for depth in (1, 2, 3, 4):
            best = accuracy(tree_of(table, depth, _Best(), _Best()), test)
            for eps in EPSILONS:
                dp, naive = [], []
                for _ in range(args.runs):
                    tree = decision_tree(engine, _analyst(engine.ledger, "tree"), "task", "sick",
                                         ["smoker", "region", "exercise", "age"], eps, depth)
                    dp.append(accuracy(tree, test))
                    naive.append(accuracy(naive_tree(table, depth, eps), test))
                results[(depth, eps)] = (best, statistics.fmean(dp), statistics.fmean(naive))
    finally:
        engine.close()
    lines += [f"## Decision trees on a task with a known rule ({args.tree_rows:,} training rows, 20,000 held out; "
              f"accuracy, mean of {args.runs} runs; the rule with its 10% flipped labels allows 0.90)", "",
              "| depth | ε | non-private | DP tree (exponential mechanism) | naive DP tree (noisy counts) |",
              "|---|---|---|---|---|"]
    lines += [f"| {d} | {e:g} | {b:.3f} | {p:.3f} | {n:.3f} |" for (d, e), (b, p, n) in results.items()]
    lines.append("")
    return results


def _densities(url: str, ledger: Ledger, args, lines: list[str]) -> dict:
    sizes = [n for n in (1_000, 10_000, 100_000, 1_000_000) if n <= args.people]
    results: dict = {}
    lines += ["## Density of income (bandwidth 12,500, 64 points, δ = 1e-6): L2 distance to the noiseless KDE of "
              f"the same data (mean of {args.runs} runs), and the band against the least any mechanism could "
              "promise", "", "| n | ε | L2 error | band ± | least ± | ratio |", "|---|---|---|---|---|---|"]
    width = 250_000 / CELLS
    centres = np.array([(c - 0.5) * width for c in range(1, CELLS + 1)] + [250_000.0])
    from dpsql.mechanisms.lower_bounds import halfwidth_lower_bound
    for n in sizes:
        with psycopg.connect(url) as conn:
            rows = conn.execute("SELECT width_bucket(LEAST(income, 250000), 0, 250000, %s), COUNT(*) FROM people "
                                "WHERE person_id <= %s GROUP BY 1", (CELLS, n)).fetchall()
        weights = np.zeros(CELLS + 1)
        for cell, count in rows:
            weights[min(max(cell, 1), CELLS + 1) - 1] += count
        exact = release_density(centres, weights, 0, 250_000, 12_500, 1.0, 1e12)
        for eps in EPSILONS:
            rho = zcdp.rho_for(eps, 1e-6)
            trials = [release_density(centres, weights, 0, 250_000, 12_500, 1.0, rho) for _ in range(args.runs)]
            error = statistics.fmean(float(np.sqrt(np.trapezoid((np.array(t["density"]) - exact["density"]) ** 2,
                                                                 exact["points"]))) for t in trials)
            band = statistics.fmean(t["halfwidth"] for t in trials)
            least = statistics.fmean(halfwidth_lower_bound(t["point_sensitivity"], eps, 1e-6) / t["area"]
                                     for t in trials)
            results[(n, eps)] = error
            lines.append(f"| {n:,} | {eps:g} | {error:.3g} | {band:.3g} | {least:.3g} | {band / least:.1f}× |")
    return results


def _plot(path: Path, synth: dict, trees: dict, densities: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4.2))
    for method, style in (("mwem", "o-"), ("direct", "s--"), ("full", "^:")):
        for way in (2, 3):
            a.loglog(EPSILONS, [synth[e][method][way] for e in EPSILONS], style,
                     label=f"{method}, {way}-way", alpha=1.0 if way == 2 else 0.6)
    a.set_xlabel("total ε")
    a.set_ylabel("mean L1 error / rows")
    a.set_title("Synthetic people: marginal error")
    a.legend(fontsize=7)
    depths = sorted({d for d, _ in trees})
    b.plot(depths, [trees[(d, 1.0)][0] for d in depths], "k-", label="non-private")
    for eps, style in ((0.1, ":"), (1.0, "-")):
        b.plot(depths, [trees[(d, eps)][1] for d in depths], "o" + style, label=f"DP tree, ε = {eps:g}")
        b.plot(depths, [trees[(d, eps)][2] for d in depths], "s" + style, label=f"naive, ε = {eps:g}")
    b.set_xlabel("depth")
    b.set_ylabel("held-out accuracy")
    b.set_title("Decision trees")
    b.legend(fontsize=7)
    sizes = sorted({n for n, _ in densities})
    for eps in EPSILONS:
        c.loglog(sizes, [densities[(n, eps)] for n in sizes], "o-", label=f"ε = {eps:g}")
    c.set_xlabel("people (n)")
    c.set_ylabel("L2 error of the density")
    c.set_title("Density of income (GP mechanism)")
    c.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
