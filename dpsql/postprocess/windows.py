"""Window functions over released rows, as PostgreSQL computes them over a query's rows (post-processing)."""

from __future__ import annotations

from typing import Any

import numpy as np
from sqlglot import exp

from dpsql.postprocess.evaluate import evaluate, sort_key
from dpsql.sql.refuse import DEFAULT_FRAME, Frame, window_frame


def compute_windows(windows: list[tuple[str, exp.Window]], envs: list[dict[str, Any]],
                    simulations: list[dict[str, Any]], unclamped: list[dict[str, Any]] | None = None,
                    simulations_unclamped: list[dict[str, Any]] | None = None) -> None:
    """Each window's value for every released row, as PostgreSQL computes it over a query's rows: partitions and
    order from the released values; the frame is the window's own (`refuse.window_frame`), by default from the
    partition's start to the current row's last peer. Where intervals are simulated, aggregate windows combine the
    simulated draws over the same frames. SUM and AVG read each row's `unclamped` values where given (its counts
    as drawn, not clamped at 0: a moving average of small daily counts would run high); the rest read the values
    shown."""
    for name, window in windows:
        sums = isinstance(window.this, exp.Sum | exp.Avg)
        reads = unclamped if sums and unclamped else envs
        reads_simulated = simulations_unclamped if sums and simulations_unclamped else simulations
        frame = window_frame(window)
        partition_by = window.args.get("partition_by") or []
        order = window.args["order"].expressions if window.args.get("order") else []
        partitions: dict[tuple, list[int]] = {}
        for index, env in enumerate(envs):
            key = tuple(_hashable(evaluate(e, env)) for e in partition_by)
            partitions.setdefault(key, []).append(index)
        for members in partitions.values():
            peers = _peer_groups(members, order, envs)
            _window_values(name, window.this, peers, envs, frame, reads)
            if simulations and not isinstance(window.this, RANKINGS):
                _window_values(name, window.this, peers, simulations, frame, reads_simulated)
            elif simulations:
                for index in members:
                    simulations[index][name] = envs[index][name]


PLACES = (exp.PercentRank, exp.CumeDist, exp.Ntile)  # a row's place, read from ranks and row numbers
RANKINGS = (exp.RowNumber, exp.Rank, exp.DenseRank, *PLACES)  # positions, which noise does not widen
NAVIGATION = (exp.Lag, exp.Lead, exp.FirstValue, exp.LastValue)  # another row's value


def window_inputs(window: exp.Window) -> list[exp.Expression]:
    """What a window evaluates on each row: its function's argument, its PARTITION BY and ORDER BY values."""
    function = window.this
    argument = function.this if isinstance(function.this, exp.Expression) and not isinstance(function, exp.Ntile) \
        else None
    order = window.args["order"].expressions if window.args.get("order") else []
    return [*([argument] if argument is not None and not isinstance(argument, exp.Star) else []),
            *(window.args.get("partition_by") or []), *(o.this for o in order)]


def _hashable(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _peer_groups(members: list[int], order: list[exp.Ordered], envs: list[dict[str, Any]]) -> list[list[int]]:
    """`members` in the window's order, in runs of peers (rows equal in every ORDER BY value)."""
    if not order:
        return [members]
    keyed = [(index, [evaluate(o.this, envs[index]) for o in order]) for index in members]
    for position in reversed(range(len(order))):
        descending = bool(order[position].args.get("desc"))
        nulls_first = order[position].args.get("nulls_first")
        nulls_first = descending if nulls_first is None else bool(nulls_first)
        keyed.sort(key=lambda r, p=position, d=descending, n=nulls_first: sort_key(r[1][p], d, n), reverse=descending)
    runs: list[list[int]] = []
    for position, (index, values) in enumerate(keyed):
        if position and values == keyed[position - 1][1]:
            runs[-1].append(index)
        else:
            runs.append([index])
    return runs


def _window_values(name: str, function: exp.Expression, peers: list[list[int]], envs: list[dict[str, Any]],
                   frame: Frame, reads: list[dict[str, Any]]) -> None:
    """Set envs[i][name] for the rows of one partition, given in runs of peers, an aggregate's argument read from
    `reads`. Without ORDER BY there is one run, so the default frame is the whole partition."""
    if isinstance(function, PLACES + NAVIGATION):
        _position_values(name, function, peers, envs, frame)
        return
    if frame != DEFAULT_FRAME and not isinstance(function, RANKINGS):  # rankings ignore the frame, as in SQL
        _framed_values(name, function, peers, envs, frame, reads)
        return
    seen = 0
    so_far: list[Any] = []  # the default frame: the partition up to the current row's last peer
    for rank, run in enumerate(peers, start=1):
        if isinstance(function, exp.RowNumber):
            for offset, index in enumerate(run):
                envs[index][name] = seen + offset + 1
        elif isinstance(function, exp.Rank | exp.DenseRank):
            for index in run:
                envs[index][name] = seen + 1 if isinstance(function, exp.Rank) else rank
        else:
            argument = function.this
            so_far.extend(None if isinstance(argument, exp.Star) else evaluate(argument, reads[index]) for index in run)
            value = _aggregate_frame(function, so_far, star=isinstance(argument, exp.Star))
            for index in run:
                envs[index][name] = value
        seen += len(run)


def _framed_values(name: str, function: exp.Expression, peers: list[list[int]], envs: list[dict[str, Any]],
                   frame: Frame, reads: list[dict[str, Any]]) -> None:
    """An aggregate window over each row's own frame (a moving average: ROWS BETWEEN 2 PRECEDING AND CURRENT
    ROW), its argument read from `reads`."""
    rows = [index for run in peers for index in run]
    argument = function.this
    star = isinstance(argument, exp.Star)
    for position, (index, first, last) in enumerate(_with_peers(peers)):
        low, high = _frame_span(frame, position, first, last, len(rows))
        values = [None if star else evaluate(argument, reads[rows[p]]) for p in range(low, high + 1)]
        envs[index][name] = _aggregate_frame(function, values, star)


def _with_peers(peers: list[list[int]]) -> list[tuple[int, int, int]]:
    """Each row of a partition in order, with the positions of its first and last peer."""
    found, seen = [], 0
    for run in peers:
        found += [(index, seen, seen + len(run) - 1) for index in run]
        seen += len(run)
    return found


def _frame_span(frame: Frame, position: int, first_peer: int, last_peer: int, count: int) -> tuple[int, int]:
    """The first and last positions of a row's frame (empty when the first is after the last)."""
    if frame.rows:
        low = 0 if frame.start is None else max(0, position + frame.start)
        high = count - 1 if frame.end is None else min(count - 1, position + frame.end)
    else:
        low = 0 if frame.start is None else first_peer
        high = count - 1 if frame.end is None else last_peer
    return low, high


def _position_values(name: str, function: exp.Expression, peers: list[list[int]], envs: list[dict[str, Any]],
                     frame: Frame) -> None:
    """The windows that read a row's place in its partition, as PostgreSQL defines them: PERCENT_RANK,
    CUME_DIST and NTILE from ranks and row numbers; LAG and LEAD from the row so many places before or after
    (else the default), FIRST_VALUE and LAST_VALUE from the first and last row of the row's frame (by default the
    partition's first row and the current row's last peer)."""
    rows = [index for run in peers for index in run]
    count = len(rows)
    if isinstance(function, exp.Ntile):
        buckets = int(evaluate(function.this, envs[rows[0]]))
        size, larger = divmod(count, buckets)
        edges = [(b + 1) * size + min(b + 1, larger) for b in range(buckets)]  # the first `larger` get one more
        for position, index in enumerate(rows):
            envs[index][name] = next(b for b, edge in enumerate(edges, start=1) if position < edge)
        return
    place = {index: position for position, index in enumerate(rows)}
    seen = 0
    for run in peers:
        for index in run:
            if isinstance(function, exp.PercentRank):
                value: Any = seen / (count - 1) if count > 1 else 0.0
            elif isinstance(function, exp.CumeDist):
                value = (seen + len(run)) / count
            elif isinstance(function, exp.FirstValue | exp.LastValue):
                low, high = _frame_span(frame, place[index], seen, seen + len(run) - 1, count)
                at = low if isinstance(function, exp.FirstValue) else high
                value = evaluate(function.this, envs[rows[at]]) if low <= high else None
            else:
                step = int(evaluate(function.args["offset"], envs[index])) if function.args.get("offset") else 1
                other = place[index] + (step if isinstance(function, exp.Lead) else -step)
                default = function.args.get("default")
                value = evaluate(function.this, envs[rows[other]]) if 0 <= other < count else \
                    evaluate(default, envs[index]) if default is not None else None
            envs[index][name] = value
        seen += len(run)


def _aggregate_frame(function: exp.Expression, frame: list[Any], star: bool) -> Any:
    """SUM, AVG, MIN, MAX or COUNT of a frame's values, skipping NULLs as SQL does."""
    values = [v for v in frame if v is not None]
    if isinstance(function, exp.Count):
        return len(frame) if star else len(values)
    if not values:
        return None
    if isinstance(function, exp.Min | exp.Max):
        combine = np.minimum if isinstance(function, exp.Min) else np.maximum
        result = values[0]
        for v in values[1:]:
            result = combine(result, v)
        return result
    total = values[0]
    for v in values[1:]:
        total = total + v
    return total / len(values) if isinstance(function, exp.Avg) else total
