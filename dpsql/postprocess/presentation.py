"""Released values and what goes with them, in words for people: intervals, the bounds' effect, a chosen
bound's loss, why groups may be missing."""

from __future__ import annotations

from typing import Any

from dpsql.analysis import Plan
from dpsql.mechanisms.race import UnitsOver
from dpsql.noise import Calibration
from dpsql.postprocess.accuracy import Accuracy

INTERVALS_COVER = ("the intervals cover the noise only: values clamped to their declared bounds, and rows or groups "
                   "a unit has beyond them, move the answer outside")


def describe_bounds_effect(effect: dict) -> list[str]:
    """The bounds' effect (`Engine.bounds_effect`) in lines for people: a heading, then each noisy count of
    units with its 95% interval and its share of the units read."""
    spent = "no more budget spent (kept from before)" if effect.get("cached") else f"ε = {effect['epsilon']:.4g} spent"
    lines = [f"bounds' effect (noisy counts of units, {spent}):"]
    for entry in effect["counts"]:
        share = "" if entry.get("share") is None else f" ({100 * entry['share']:.2g}% of the units read)"
        lines.append(f"  {entry['label']}: {entry['units']:.0f} [{entry['low']:.0f}, {entry['high']:.0f}]{share}")
    return lines


UNITS_OVER_WARNING = 0.01  # the share of the units read above which a chosen bound's loss is called out


def describe_units_over(over: UnitsOver | None, totals: bool, chosen_only: bool = False,
                        raised: int | None = None) -> str | None:
    """What a bound chosen from the data leaves out (`RaceToTheTop.units_over`), for people: the released count of
    units holding more than it (their rows, or with `totals` their total), its 95% interval and share of the units
    read; a warning where even the interval's low end is over UNITS_OVER_WARNING of them. `chosen_only`: the
    answer is values chosen from histograms (percentiles, MIN, MAX, mode()), which the rows left out move only
    where they differ from the rows kept, rather than counts and sums, which they make low. `raised`: the bound
    the count sent higher (`RaceToTheTop.raised`), which the answer keeps instead."""
    if over is None:
        return None
    read = max(over.units_read, 1.0)

    def among_read(count: float) -> float:  # both counts are noisy: no more hold more than were read
        return min(max(0.0, count), read)
    low, high = among_read(over.units - over.halfwidth), among_read(over.units + over.halfwidth)
    counted = (f"about {among_read(over.units):,.0f} of the {read:,.0f} units read hold more (95%: {low:,.0f} to "
               f"{high:,.0f}, {_percent(low / read)}-{_percent(high / read)}%; counted at ε = {over.epsilon:.2g} of "
               "the query's)")
    if raised is not None:
        return (f"bounded at {_bound_text(raised, totals)}, chosen from the data: above the race's bound of "
                f"{_bound_text(over.bound, totals)} "
                f"{counted}, so a sparse vector raised it to the first bound that few units exceed")
    text = f"bounded at {_bound_text(over.bound, totals)}, chosen from the data; {counted}"
    if low / read > UNITS_OVER_WARNING and chosen_only:
        text += (f"; at least {100 * low / read:.2g}% of the units have rows beyond it left out, which moves the "
                 "values chosen only where those rows differ from the rows kept: a larger ε lets the race see them "
                 "and choose a larger bound")
    elif low / read > UNITS_OVER_WARNING:
        beyond = "totals beyond it" if totals else "rows beyond it"
        text += (f"; at least {100 * low / read:.2g}% of the units lose their {beyond}, so the answer is low by "
                 "what they hold there: a larger ε lets the race see them and choose a larger bound")
    return text


def describe_chosen(bound: int, totals: bool) -> str:
    """What an answer bounded below the race's cap says where nothing counted the units over its bound (a count of
    distinct values, `RaceToTheTop.counts_units`)."""
    return f"bounded at {_bound_text(bound, totals)}, chosen from the data"


def _bound_text(bound: int, totals: bool) -> str:
    """A bound as the notes say it: on each unit's total (`totals`) or on its rows."""
    return f"a total of {bound:,} per unit" if totals else f"{bound:,} rows per unit"


def describe_cap(cap: int, totals: bool, chosen: int | None) -> str:
    """What an answer bounded at the race's cap says: the margin kept above the bound `chosen` from the data
    reaches the cap; or, with none chosen, the data did not show a smaller bound at this ε (the fallback's
    search ran to the end), so its noise is the cap's, wide."""
    what = f"a total of {cap:,} per unit (its rows times the declared range)" if totals \
        else f"the declared {cap:,} rows per unit"
    if chosen is not None:
        return (f"bounded at the cap, {what}: the margin kept above the bound chosen from the data ({chosen:,}) "
                "reaches it")
    return (f"bounded at the cap, {what}: at this ε the data did not show a smaller bound, so the noise is "
            "that of the cap and the interval wide; a larger ε lets the race choose a smaller bound")


def _percent(share: float) -> str:
    """A share as a percentage to two figures (100, not 1e+02)."""
    return f"{100 * share:.3g}" if share >= 0.995 else f"{100 * share:.2g}"


def describe_selection(plan: Plan, calibration: Calibration | None) -> str | None:
    """Why groups may be missing from an answer whose keys are private, and how to ask for every group: the
    threshold is public (it follows from ε, δ and the bounds), how many groups fell below it is not said."""
    selection = calibration.selection if calibration is not None else None
    if selection is None:
        return None
    counted = "units" if calibration.selected_by else plan.selection_counts
    threshold = str(selection.threshold) if calibration.selected_by else plan.selection_threshold(selection.threshold)
    text = (f"groups are released only where a noisy count of their {counted} reaches {threshold} (DP "
            f"partition selection at ε = {calibration.selection_epsilon:.3g}), so groups with fewer may be missing")
    return f"{text}; to release every group, {plan.every_group}" if plan.every_group else text


def describe_accuracy(accuracy: Accuracy | None) -> str:
    """A value's accuracy for people: its 95% interval, rank error or count gap ("" for exact values)."""
    if accuracy is None:
        return ""
    if accuracy.rank_error is not None:
        return f"±{accuracy.rank_error:.3g} ranks"
    if accuracy.count_gap is not None:
        return f"count within {accuracy.count_gap:.3g} of the top"
    interval = f"[{format_value(accuracy.ci_low)}, {format_value(accuracy.ci_high)}]"
    ratio = accuracy.optimality_ratio
    if ratio is None:
        return interval
    return f"{interval} (≥ ±{accuracy.lower_bound:.3g} for any mechanism at this ε, δ: {ratio:.2g}×)"


def format_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):  # as psql shows an array
        return "{" + ",".join("NULL" if v is None else format_value(v) for v in value) + "}"
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e6 else f"{value:.0f}"
    return str(value)
