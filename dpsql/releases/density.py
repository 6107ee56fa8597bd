"""A DP kernel density estimate of one bounded numeric column, released as a function on a grid.

The engine counts the column's values in 256 equal cells of its declared range (`width_bucket`, with the
column clamped and each unit's rows bounded as in any query); the estimate is F(x) = c·Σ count_b·K(x, centre_b)
with the Gaussian kernel K of bandwidth h and c = 1/(√(2π)·h). One unit moves the counts by at most Δ in all
(the analysis's sensitivity, k rows for a table of k rows per unit), and each kernel section c·K(·, x) has RKHS
norm c, so F moves by at most c·Δ in the RKHS norm: the Gaussian-process mechanism releases F on the grid with
that sensitivity at the release's (ε, δ). The density is F divided by its integral (post-processing), and the
pointwise band is the process's 95% interval at each point, scaled the same way. Binning moves each value by at
most half a cell (h/12.8 at the default bandwidth of 1/20 of the range).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dpsql.accounting import Cost, validate_query_privacy, zcdp
from dpsql.errors import InvalidParameter, UnknownColumn
from dpsql.mechanisms.gaussian_process import GaussianProcessMechanism, gaussian_kernel
from dpsql.mechanisms.lower_bounds import halfwidth_lower_bound

CELLS = 256
POINTS = 64
Z95 = 1.959963984540054


def density(engine: Any, analyst: str, table: str, column: str, epsilon: float, delta: float,
            bandwidth: float | None = None, points: int = POINTS) -> dict:
    """The released density of `table.column` (declared numeric with bounds), charged to `analyst` once."""
    validate_query_privacy(epsilon, delta)
    if not delta > 0:
        raise InvalidParameter("the Gaussian-process mechanism needs δ > 0", "pass --delta, e.g. 1e-6")
    declared = engine.schema.tables.get(table.lower())
    col = declared.columns.get(column.lower()) if declared is not None else None
    if col is None or not col.is_numeric or not col.bounded:
        raise UnknownColumn(f"{table}.{column} is not a declared numeric column with bounds",
                            "a density needs lower and upper in the privacy schema")
    lower, upper = col.lower, col.upper
    if not upper > lower:
        raise InvalidParameter(f"{table}.{column} has an empty range [{lower:g}, {upper:g}]")
    h = bandwidth or (upper - lower) / 20
    if not (math.isfinite(h) and h > 0):
        raise InvalidParameter("the bandwidth must be a number > 0")
    if not 2 <= points <= 1000:
        raise InvalidParameter("points must be from 2 to 1000")
    rho = zcdp.rho_for(epsilon, delta)
    sql = (f"SELECT width_bucket({col.name}, {lower!r}, {upper!r}, {CELLS}) AS cell, COUNT(*) "
           f"FROM {declared.name} GROUP BY cell")

    def mechanism(statistics: list) -> dict:
        (counts,) = statistics
        centres, weights = _cells(counts.totals(), lower, upper)
        released = release_density(centres, weights, lower, upper, h, counts.sensitivity, rho, points)
        least = halfwidth_lower_bound(released.pop("point_sensitivity"), epsilon, delta) / released.pop("area")
        return {"table": declared.name, "column": col.name, "bandwidth": h, "epsilon": epsilon, "delta": delta,
                **released, "lower_bound": least}

    released = engine.release(analyst, "density", [sql], Cost(epsilon, delta, rho, 0.0), mechanism,
                              {"bandwidth": h, "points": points})
    return {**released.output, "cached": released.cached, "epsilon_spent": 0.0 if released.cached else epsilon,
            "delta_spent": 0.0 if released.cached else delta}


def release_density(centres: np.ndarray, weights: np.ndarray, lower: float, upper: float, bandwidth: float,
                    sensitivity: float, rho: float, points: int = POINTS,
                    rng: np.random.Generator | None = None) -> dict:
    """The Gaussian-process release of the KDE of `weights` at `centres` (one unit moves the weights by at
    most `sensitivity` in all), normalised by its integral, on `points` points of [lower, upper]."""
    grid = np.linspace(lower, upper, points)
    c = 1 / (math.sqrt(2 * math.pi) * bandwidth)
    exact = c * gaussian_kernel(grid, centres, bandwidth) @ weights
    gp = GaussianProcessMechanism.calibrate(c * sensitivity, bandwidth, rho)
    released = gp.release(exact, grid, rng)
    area = float(np.trapezoid(np.clip(released, 0.0, None), grid))
    area = area if area > 0 else 1.0
    spread = Z95 * gp.scale / area
    values = released / area
    return {"rho": gp.rho, "points": grid.tolist(), "density": values.tolist(), "low": (values - spread).tolist(),
            "high": (values + spread).tolist(), "halfwidth": spread, "area": area, "point_sensitivity": c * sensitivity}


def _cells(totals: dict[tuple, float], lower: float, upper: float) -> tuple[np.ndarray, np.ndarray]:
    """Each width_bucket cell's centre and count (cell 0 and CELLS + 1 hold the bounds themselves)."""
    width = (upper - lower) / CELLS
    centres, weights = [], []
    for (cell,), count in totals.items():
        if cell is None or not count:
            continue
        cell = int(cell)
        centres.append(lower if cell <= 0 else upper if cell > CELLS else lower + (cell - 0.5) * width)
        weights.append(count)
    return np.asarray(centres, dtype=float), np.asarray(weights, dtype=float)


def plot_density(output: dict, path: str) -> None:
    """The released density with its pointwise 95% band (drawn from released values only)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.fill_between(output["points"], output["low"], output["high"], alpha=0.25, label="95% pointwise band")
    ax.plot(output["points"], output["density"], label="DP density")
    ax.set_xlabel(f"{output['table']}.{output['column']}")
    ax.set_ylabel("density")
    ax.set_title(f"Gaussian-process mechanism, ε = {output['epsilon']:g}, δ = {output['delta']:g}, "
                 f"h = {output['bandwidth']:.3g}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = ["density", "plot_density", "release_density"]
