"""A DP synthetic table: the noisy full contingency table ("database perturbation"), or MWEM (Hardt, Ligett and
McSherry, "A simple and practical algorithm for differentially private data release", NeurIPS 2012) over whole
marginals, whichever is expected to answer 2-way marginals better from the declared sizes alone (`auto`).
Perturbation puts Laplace noise (L1 sensitivity k, at all of ε) on every cell and projects the table onto counts;
it wins while the table has fewer than about 4T²·m cells (m a 2-way marginal's cells, T MWEM's rounds), which
is every table dpsql releases in full today (at most 10,000 combinations); MWEM is for wider ones.

The engine counts the rows of every combination of the chosen columns (each a declared domain, a boolean, or a
bounded number cut into equal bins), with each unit's rows bounded as in any query: one unit moves these counts
by at most k in all, so it moves every marginal of them by at most k (L1). The workload is every 1- and 2-way
marginal. MWEM keeps a distribution A over the full domain (uniform at first, scaled to a noisy total) and, for
T rounds, (1) picks the marginal A answers worst, by the exponential mechanism on its L1 error (sensitivity k),
(2) measures it with Laplace noise (L1 sensitivity k), (3) corrects A towards every measurement so far. The
correction is multiplicative as MWEM's, but with the step that fits each measured marginal exactly (iterative
proportional fitting, repeated over the measurements): MWEM's own step, exp(gap / 2n), moves a table of many
rows too little per pass to fit its measurements. It reads only noisy measurements: post-processing.
ε: 5% for the total, the rest split evenly over the rounds, half for picking and half for
measuring. The synthetic rows are the final A rounded to whole rows (largest remainders); once published, any
query of them is post-processing.
"""

from __future__ import annotations

import itertools
import math
import statistics
from typing import Any

import numpy as np

from dpsql.accounting import Cost, validate_query_privacy
from dpsql.errors import InvalidParameter, UnknownColumn
from dpsql.mechanisms.exponential import ExponentialMechanism
from dpsql.mechanisms.histograms import onto_simplex
from dpsql.mechanisms.laplace import LaplaceMechanism
from dpsql.releases.tree import _column, _key

TOTAL_SHARE = 0.05  # of ε, for the noisy number of rows
UPDATE_PASSES = 10  # multiplicative-weights passes over the measurements after each round
MAX_CELLS = 10_000  # the analysis releases at most this many key combinations in full


def marginals(columns: int, ways: tuple[int, ...] = (1, 2)) -> list[tuple[int, ...]]:
    """The workload: every set of `ways` columns."""
    return [m for w in ways for m in itertools.combinations(range(columns), w)]


def marginal(table: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """The counts of `table` (one axis per column) over the columns `axes`."""
    return table.sum(axis=tuple(i for i in range(table.ndim) if i not in axes))


def mwem(exact: np.ndarray, sensitivity: float, epsilon: float, rounds: int,
         workload: list[tuple[int, ...]], rng: Any = None) -> tuple[np.ndarray, dict[tuple[int, ...], np.ndarray],
                                                                      list[tuple[int, ...]]]:
    """MWEM's synthetic counts for the exact contingency table `exact`, its noisy measurements (the mean of each
    marginal's) and the marginals it chose, in order."""
    extra = {} if rng is None else {"rng": rng}
    total_mech = LaplaceMechanism.calibrate(sensitivity, epsilon * TOTAL_SHARE, integer_valued=True)
    total = max(1.0, total_mech.release(float(exact.sum()), **extra))
    per_round = epsilon * (1 - TOTAL_SHARE) / rounds
    chooser = ExponentialMechanism(sensitivity, per_round / 2)
    measure = LaplaceMechanism.calibrate(sensitivity, per_round / 2, integer_valued=True)
    synthetic = np.full(exact.shape, total / exact.size)
    measured: dict[tuple[int, ...], list[np.ndarray]] = {}  # a marginal measured twice: fitted to the mean
    chosen = []
    truth = {axes: marginal(exact, axes) for axes in workload}
    for _ in range(rounds):
        errors = [float(np.abs(marginal(synthetic, axes) - truth[axes]).sum()) for axes in workload]
        axes = workload[chooser.select(errors, **extra)]
        chosen.append(axes)
        measured.setdefault(axes, []).append(
            np.vectorize(lambda v: measure.release(float(v), **extra))(truth[axes]).astype(float))
        for _ in range(UPDATE_PASSES):
            for seen, measurements in measured.items():
                values = np.mean(measurements, axis=0)
                current = marginal(synthetic, seen)
                factor = np.clip(values, 0.0, None) / np.maximum(current, 1e-12)
                shape = [exact.shape[i] if i in seen else 1 for i in range(exact.ndim)]
                synthetic = synthetic * factor.reshape(shape)
                synthetic *= total / max(synthetic.sum(), 1e-12)
    return synthetic, {axes: np.mean(values, axis=0) for axes, values in measured.items()}, chosen


def perturb(exact: np.ndarray, sensitivity: float, epsilon: float, rng: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """The whole contingency table with Laplace noise on every cell (one unit moves the cells by at most
    `sensitivity` in all), projected onto counts: ≥ 0, summing to the noisy total ("database perturbation");
    and the noisy table itself."""
    extra = {} if rng is None else {"rng": rng}
    noise = LaplaceMechanism.calibrate(sensitivity, epsilon, integer_valued=float(sensitivity).is_integer(),
                                       coordinates=max(1, int(math.ceil(sensitivity))))
    noisy = np.array([noise.release(float(v), **extra) for v in exact.ravel()])
    noisy = noisy.reshape(exact.shape)
    return onto_simplex(noisy.ravel(), max(float(noisy.sum()), 0.0)).reshape(exact.shape), noisy


def predicted_errors(shape: tuple[int, ...], sensitivity: float, epsilon: float, rounds: int) -> dict[str, float]:
    """The mean L1 error each method is expected to leave on a 2-way marginal, from declared sizes only:
    perturbation sums the noise of the D / m cells behind each of a marginal's m cells, √(2/π)·√(2Dm)·b in all
    (b = Δ/ε); MWEM measures a marginal at ε / 2T at best, √(2/π)·m·√2·b·2T/(1 - 5%), and leaves more on the
    marginals it does not measure."""
    cells = math.prod(shape)
    pairs = [shape[i] * shape[j] for i, j in itertools.combinations(range(len(shape)), 2)] or [cells]
    b = sensitivity / epsilon
    factor = math.sqrt(2 / math.pi)
    return {"perturb": statistics.fmean(factor * math.sqrt(2 * cells * m) * b for m in pairs),
            "mwem": statistics.fmean(factor * m * math.sqrt(2) * b * 2 * rounds / (1 - TOTAL_SHARE) for m in pairs)}


def whole_rows(counts: np.ndarray) -> np.ndarray:
    """Counts rounded to whole rows that keep the (rounded) total: largest remainders."""
    flat = np.clip(counts.ravel(), 0.0, None)
    target = int(round(flat.sum()))
    floors = np.floor(flat)
    short = target - int(floors.sum())
    if short > 0:
        floors[np.argsort(floors - flat)[:short]] += 1  # the largest remainders first
    return floors.reshape(counts.shape).astype(int)


METHODS = ("auto", "mwem", "perturb")


def synthesize(engine: Any, analyst: str, table: str, columns: list[str], epsilon: float, rounds: int | None = None,
               bins: int = 4, method: str = "auto") -> dict:
    """Release a synthetic version of `table` over `columns` (JSON: the columns' values and the synthetic counts
    per combination), charged to `analyst` once. `method`: mwem, perturb (the noisy full table), or auto: the
    one `predicted_errors` expects to be more accurate on 2-way marginals."""
    if method not in METHODS:
        raise InvalidParameter(f"method must be one of {', '.join(METHODS)}")
    validate_query_privacy(epsilon)
    declared = engine.schema.tables.get(table.lower())
    if declared is None:
        raise UnknownColumn(f'table "{table}" is not declared in the privacy schema',
                            "name a table the privacy schema declares (`dpsql schema check FILE` lists them)")
    names = [c.strip().lower() for c in columns if c.strip()]
    if not names or len(set(names)) != len(names):
        raise InvalidParameter("give one or more distinct columns")
    if not 2 <= bins <= 32:
        raise InvalidParameter("bins must be from 2 to 32")
    cols = [_column(declared.columns, name, table) for name in names]
    workload = marginals(len(cols))
    rounds = rounds or min(len(workload), max(3, 2 * len(cols)))
    if not 1 <= rounds <= 100:
        raise InvalidParameter("rounds must be from 1 to 100")
    keys = [_key(c, bins) for c in cols]
    sql = (f"SELECT {', '.join(f'{k} AS c{i}' for i, k in enumerate(keys))}, COUNT(*) FROM {declared.name} "
           f"GROUP BY {', '.join(f'c{i}' for i in range(len(keys)))}")

    plan = engine.prepare(sql).plan  # the declared combinations: the method is chosen before anything is read
    domains = [sorted({key[i] for key in plan.domain or [] if None not in key}, key=repr) for i in range(len(cols))]
    shape = tuple(len(d) for d in domains)
    if not plan.domain or math.prod(shape) > MAX_CELLS:
        raise InvalidParameter(f"the columns need declared values, at most {MAX_CELLS} combinations in all")
    predicted = predicted_errors(shape, plan.measures[0].sensitivity, epsilon, rounds)
    chosen = min(predicted, key=predicted.get) if method == "auto" else method

    def mechanism(statistics: list) -> dict:
        (counts,) = statistics
        totals = {k: v for k, v in counts.totals().items() if None not in k}
        exact = np.zeros(shape)
        index = [{v: i for i, v in enumerate(d)} for d in domains]
        for key, count in totals.items():
            exact[tuple(index[i][v] for i, v in enumerate(key))] = count
        if chosen == "mwem":
            synthetic, measurements, measured = mwem(exact, counts.sensitivity, epsilon, rounds, workload)
        else:
            synthetic, noisy = perturb(exact, counts.sensitivity, epsilon)
            measurements, measured = {tuple(range(len(cols))): noisy}, []
        noisy_marginals = {}  # each column's noisy counts, from a measurement that holds it (post-processing)
        for i, name in enumerate(names):
            seen = next((axes for axes in measurements if i in axes), None)
            if seen is not None:
                values = measurements[seen]
                noisy_marginals[name] = values.sum(axis=tuple(j for j, a in enumerate(seen) if a != i)).tolist()
        rows = whole_rows(synthetic)
        values = [[_value(c, v, bins) for v in d] for c, d in zip(cols, domains, strict=True)]
        cells = [[list(i), int(n)] for i, n in np.ndenumerate(rows) if n]
        return {"table": declared.name, "columns": names, "types": [c.type for c in cols], "values": values,
                "cells": cells, "rows": int(rows.sum()), "method": chosen, "rounds": rounds if chosen == "mwem" else 0,
                "epsilon": epsilon, "measured": [[names[i] for i in axes] for axes in measured],
                "predicted_2way_l1": predicted, "noisy_marginals": noisy_marginals}

    released = engine.release(analyst, f"synth {chosen}", [sql], Cost.pure(epsilon), mechanism,
                              {"rounds": rounds, "bins": bins})
    return {**released.output, "cached": released.cached, "epsilon_spent": 0.0 if released.cached else epsilon}


def _value(column: Any, cell: Any, bins: int) -> Any:
    """A synthetic row's value for a cell: the domain value, or a numeric cell's midpoint."""
    if column.domain or column.type == "boolean":
        return cell
    width = (column.upper - column.lower) / bins
    middle = column.lower if cell <= 0 else column.upper if cell > bins else column.lower + (cell - 0.5) * width
    return round(middle) if column.is_integer else middle


def synthetic_rows(release: dict) -> list[tuple]:
    """The synthetic table's rows."""
    rows = []
    for index, count in release["cells"]:
        row = tuple(release["values"][i][j] for i, j in enumerate(index))
        rows += [row] * count
    return rows


def plot_marginals(release: dict, path: str) -> None:
    """Each column's synthetic counts per value beside the noisy measured ones (released values only)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = release["columns"]
    fig, axes = plt.subplots(1, len(columns), figsize=(3.2 * len(columns), 3.2), squeeze=False)
    for i, (name, ax) in enumerate(zip(columns, axes[0], strict=True)):
        counts = [0] * len(release["values"][i])
        for index, n in release["cells"]:
            counts[index[i]] += n
        labels = [str(v) for v in release["values"][i]]
        positions = np.arange(len(labels))
        ax.bar(positions - 0.2, counts, width=0.4, label="synthetic")
        if name in release.get("noisy_marginals", {}):
            ax.bar(positions + 0.2, release["noisy_marginals"][name], width=0.4, label="noisy measured")
        ax.set_xticks(positions, labels)
        ax.set_title(name)
        ax.legend(fontsize=7)
        ax.tick_params(axis="x", labelrotation=45)
    fig.suptitle(f"synthetic {release['table']} ({release['method']}, ε = {release['epsilon']:g}): 1-way marginals")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def publish(release: dict, database: str, out: str, replace: bool = False) -> str:
    """Write the synthetic rows to table `out` (or a .csv file); return the privacy schema lines that declare
    it released data, which dpsql then answers exactly and at no cost."""
    import csv

    import psycopg
    from psycopg import sql

    rows = synthetic_rows(release)
    if out.lower().endswith(".csv"):
        with open(out, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(release["columns"])
            writer.writerows(rows)
        return ""
    with psycopg.connect(database) as conn:
        if replace:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(out)))
        conn.execute(sql.SQL("CREATE TABLE {} ({})").format(sql.Identifier(out), sql.SQL(", ").join(
            sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t))
            for n, t in zip(release["columns"], release["types"], strict=True))))
        with conn.cursor().copy(sql.SQL("COPY {} FROM STDIN").format(sql.Identifier(out))) as copy:
            for row in rows:
                copy.write_row(row)
    lines = [f"[tables.{out}]", "public = true",
             f'released = "{release["method"]}, ε = {release["epsilon"]:g}, from {release["table"]}"',
             f"[tables.{out}.columns]"]
    lines += [f'{n} = {{ type = "{t}" }}' for n, t in zip(release["columns"], release["types"], strict=True)]
    return "\n".join(lines)


__all__ = ["marginal", "marginals", "mwem", "perturb", "plot_marginals", "predicted_errors", "publish", "synthesize",
           "synthetic_rows", "whole_rows"]
