"""One home per aggregate kind finished from sums: what the kind asks the analysis for (its measures: a count and
sums, each clamped to its own range) and how its value is computed from their noisy values after noise (its
finish, post-processing). The SQL allowlist names each kind's sqlglot node (`dpsql.sql.query.AGGREGATES`); COUNT
lives in `aggregates` and the kinds chosen from histograms (MIN, MAX, percentiles, mode) in `quantiles`, their
own homes. Adding a kind is its node in the allowlist and its entry here (or in `quantiles`).

Rules the entries rest on:
- an average, variance or standard deviation is a count and sums centred on the midpoint of the argument's range,
  so each sum moves by at most the half-range per row; the finish clamps the result to where it can lie;
- where each unit's total of a sum is bounded (`Scope.total_cap`, chosen by R2T's race), AVG is that plain sum
  over its count: centred on the midpoint, a sum of small values would move by the half-range at every row;
  a variance or standard deviation is a count and the plain sums of X and X², the race bounding each unit's
  total of X² and the sum of X bounded through it (`aggregates._measure`): centred on the midpoint of a skewed
  range (amounts up to 5,000, most near 100), its mean square and squared mean would be two numbers near
  half-range² whose small difference the noise of either swamps;
- covariances, correlations and regression slopes and intercepts of (Y, X) are finished from a count and the
  centred sums of X, Y, X·Y, X² and Y² over the rows where both are not NULL, each kept where it can lie
  (|cov| within the half-ranges' product, variances ≥ 0, |corr| ≤ 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlglot import exp

from dpsql.analysis.clamps import number
from dpsql.analysis.expressions import Range
from dpsql.analysis.plan import Aggregate

MeasureOf = Callable[..., str]  # (label, kind, expr, row range[, centre, squares_of]) -> the measure's name


@dataclass(frozen=True)
class Bounded:
    """An argument as the analysis hands it to a kind: its label, its declared range and its clamped value."""

    label: str
    range: Range
    value: exp.Expression

    @property
    def mid(self) -> float:
        return (self.range.lo + self.range.hi) / 2

    @property
    def half(self) -> float:
        return (self.range.hi - self.range.lo) / 2

    def centred(self) -> exp.Expression:
        return exp.Paren(this=exp.Sub(this=self.value.copy(), expression=number(self.mid)))

    @property
    def whole(self) -> bool:
        """Whether its centred values are integers."""
        return self.range.integer and float(self.mid).is_integer()


@dataclass(frozen=True)
class Kind:
    name: str
    arguments: int  # 1: agg(x); 2: agg(y, x)
    # (measure_of, arguments..., context) -> the measures' names in the finish's order, and whether the sums are
    # centred on the argument's midpoint
    measures: Callable[..., tuple[tuple[str, ...], bool]]
    finish: Callable[[Aggregate, list[Any]], Any]  # the value from the measures' noisy values (scalars or arrays)


@dataclass(frozen=True)
class Context:
    """What the analysis knows of the query around the aggregate that its measures depend on."""

    count: Callable[[], str]  # the count of the argument's rows (its measure's name, made when first asked for)
    exact: bool  # the argument is an integer or numeric (a float sum is summed centred)
    total_cap: float | None  # each unit's total of a sum is bounded over all groups


# --- one argument ------------------------------------------------------------------------------------------------


def _sum_measures(measure_of: MeasureOf, x: Bounded, context: Context) -> tuple[tuple[str, ...], bool]:
    return (measure_of(f"SUM({x.label})", "sum", x.value, x.range),), True


def _moment_measures(squares: bool) -> Callable[..., tuple[tuple[str, ...], bool]]:
    def measures(measure_of: MeasureOf, x: Bounded, context: Context) -> tuple[tuple[str, ...], bool]:
        if context.total_cap is not None:  # plain sums whose units' totals are bounded
            plain = measure_of(f"SUM({x.label})", "sum", x.value, x.range)
            if not squares:
                return (context.count(), plain), False
            # (of non-negative values: a unit's total is bounded only for those, so lo² <= x² <= hi²)
            square = exp.Mul(this=exp.Paren(this=x.value.copy()), expression=exp.Paren(this=x.value.copy()))
            return (context.count(), plain, measure_of(f"SUM({x.label}^2)", "sum", square,
                                                       Range(x.range.lo ** 2, x.range.hi ** 2, x.range.integer),
                                                       squares_of=plain)), False
        # in exact arithmetic the centred sum is SUM(value) - mid·COUNT(value), which shares PostgreSQL's
        # aggregate states with the other measures; a float sum would round differently, so it is summed centred
        centred = exp.Sub(this=x.value.copy(), expression=number(x.mid))
        parts = [context.count(),
                 measure_of(f"SUM({x.label} - {x.mid:g})", "sum", x.value if context.exact else centred,
                            Range(-x.half, x.half, x.whole), x.mid if context.exact else 0.0)]
        if squares:
            square = exp.Mul(this=exp.Paren(this=centred.copy()), expression=exp.Paren(this=centred.copy()))
            parts.append(measure_of(f"SUM(({x.label} - {x.mid:g})^2)", "sum", square,
                                    Range(0, x.half * x.half, x.whole)))
        return tuple(parts), True
    return measures


def _finish_sum(agg: Aggregate, values: list[Any]) -> Any:
    return values[0]


def _finish_moments(agg: Aggregate, values: list[Any]) -> Any:
    lo, hi = agg.arg_range.lo, agg.arg_range.hi
    mid, half = ((lo + hi) / 2 if agg.centred else 0.0), (hi - lo) / 2
    n = np.maximum(values[0], 1)
    mean_offset = values[1] / n
    if agg.kind == "avg":
        return np.clip(mid + mean_offset, lo, hi)
    var_pop = np.clip(values[2] / n - mean_offset**2, 0, half * half)  # at most (range/2)², centred or not
    if agg.kind in ("var_samp", "stddev_samp"):
        var = np.clip(var_pop * n / np.maximum(n - 1, 1), 0, 2 * half * half)
    else:
        var = var_pop
    return np.sqrt(var) if agg.kind.startswith("stddev") else var


# --- two arguments (Y, X) ----------------------------------------------------------------------------------------


def _pair_measures(squares: str) -> Callable[..., tuple[tuple[str, ...], bool]]:
    """A count and the centred sums of X, Y and X·Y over the rows where both are not NULL, then the centred sums of
    squares `squares` names ("", "x" or "xy")."""
    def measures(measure_of: MeasureOf, y: Bounded, x: Bounded, context: Context) -> tuple[tuple[str, ...], bool]:
        y_c, x_c = y.centred(), x.centred()

        def when_both(value: exp.Expression) -> exp.Expression:  # NULL unless X and Y both are not NULL
            return exp.case().when(exp.and_(exp.Not(this=exp.Is(this=y.value.copy(), expression=exp.Null())),
                                            exp.Not(this=exp.Is(this=x.value.copy(), expression=exp.Null()))),
                                   value)

        pair = f"({y.label}, {x.label})"
        parts = [measure_of(f"COUNT{pair}", "count", when_both(number(1)), Range(0, 1, True)),
                 measure_of(f"SUM({x.label} - {x.mid:g}) over {pair}", "sum", when_both(x_c),
                            Range(-x.half, x.half, x.whole)),
                 measure_of(f"SUM({y.label} - {y.mid:g}) over {pair}", "sum", when_both(y_c),
                            Range(-y.half, y.half, y.whole)),
                 measure_of(f"SUM(({y.label} - {y.mid:g})·({x.label} - {x.mid:g}))", "sum",
                            exp.Mul(this=y_c.copy(), expression=x_c.copy()),
                            Range(-y.half * x.half, y.half * x.half, y.whole and x.whole))]
        for axis in squares:
            a = x if axis == "x" else y
            a_c = a.centred()
            parts.append(measure_of(f"SUM(({a.label} - {a.mid:g})^2) over {pair}", "sum",
                                    when_both(exp.Mul(this=a_c.copy(), expression=a_c.copy())),
                                    Range(0, a.half * a.half, a.whole)))
        return tuple(parts), True
    return measures


def _pair_moments(agg: Aggregate, values: list[Any]) -> tuple[Any, Any, Any, Any, float, float]:
    """n, the centred means of X and Y and their covariance, each kept where it can lie, and the half-ranges."""
    y_half, x_half = (agg.arg_range.hi - agg.arg_range.lo) / 2, (agg.x_range.hi - agg.x_range.lo) / 2
    n = np.maximum(values[0], 1)
    x_mean, y_mean = np.clip(values[1] / n, -x_half, x_half), np.clip(values[2] / n, -y_half, y_half)
    covariance = np.clip(values[3] / n - x_mean * y_mean, -y_half * x_half, y_half * x_half)
    return n, x_mean, y_mean, covariance, x_half, y_half


def _finish_covariance(agg: Aggregate, values: list[Any]) -> Any:
    n, _, _, covariance, _, _ = _pair_moments(agg, values)
    return covariance * n / np.maximum(n - 1, 1) if agg.kind == "covar_samp" else covariance


def _finish_corr(agg: Aggregate, values: list[Any]) -> Any:
    n, x_mean, y_mean, covariance, x_half, y_half = _pair_moments(agg, values)
    with np.errstate(divide="ignore", invalid="ignore"):  # a noisy variance of 0 gives ±inf, as a ratio would
        x_variance = np.clip(values[4] / n - x_mean**2, 0, x_half * x_half)
        y_variance = np.clip(values[5] / n - y_mean**2, 0, y_half * y_half)
        return np.clip(covariance / np.sqrt(x_variance * y_variance), -1, 1)


def _finish_regression(agg: Aggregate, values: list[Any]) -> Any:
    n, x_mean, y_mean, covariance, x_half, _ = _pair_moments(agg, values)
    with np.errstate(divide="ignore", invalid="ignore"):  # a noisy variance of 0 gives ±inf, as a ratio would
        slope = covariance / np.clip(values[4] / n - x_mean**2, 0, x_half * x_half)
    if agg.kind == "regr_slope":
        return slope
    (y_lo, y_hi), (x_lo, x_hi) = (agg.arg_range.lo, agg.arg_range.hi), (agg.x_range.lo, agg.x_range.hi)
    return (y_mean + (y_lo + y_hi) / 2) - slope * (x_mean + (x_lo + x_hi) / 2)


SQUARED = ("var_pop", "var_samp", "stddev_pop", "stddev_samp")  # the kinds of one argument that sum its squares
KINDS: dict[str, Kind] = {kind.name: kind for kind in (
    Kind("sum", 1, _sum_measures, _finish_sum),
    Kind("avg", 1, _moment_measures(squares=False), _finish_moments),
    *(Kind(name, 1, _moment_measures(squares=True), _finish_moments) for name in SQUARED),
    Kind("covar_pop", 2, _pair_measures(""), _finish_covariance),
    Kind("covar_samp", 2, _pair_measures(""), _finish_covariance),
    Kind("corr", 2, _pair_measures("xy"), _finish_corr),
    Kind("regr_slope", 2, _pair_measures("x"), _finish_regression),
    Kind("regr_intercept", 2, _pair_measures("x"), _finish_regression),
)}
