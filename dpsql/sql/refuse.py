"""Refuse: an allowlist of SQL node types, and the statements and clauses that must never run (SELECT INTO,
locking, data-modifying CTEs, DISTINCT). Runs before the query is qualified, so nothing outside the
allowlist reaches the analysis or PostgreSQL. Window functions are allowed only where they run over the
released rows (the outer SELECT list and ORDER BY)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from dpsql.errors import InvalidConstant, PrivacyRefusal, UnsupportedQuery
from dpsql.sql.query import AGGREGATES, signed_literal, to_sql
from dpsql.sql.shape import is_percentile_array, is_windowed_source
from dpsql.sql.times import interval_step

# Node types a query may contain. Functions that can fail on some value are made total by the rewrite
# (division, modulo, sqrt, ln) or have their arguments checked by the analysis (casts, substring, ...).
ALLOWED_NODES: tuple[type[exp.Expression], ...] = (
    exp.Select, exp.From, exp.Join, exp.Where, exp.Group, exp.Having, exp.Order, exp.Ordered, exp.Limit, exp.Offset,
    exp.Table, exp.TableAlias, exp.Alias, exp.Column, exp.Identifier, exp.Star, exp.Literal, exp.Null, exp.Boolean,
    exp.Paren, exp.With, exp.CTE, exp.Subquery, exp.Distinct, exp.DataType, exp.Var, exp.DataTypeParam, exp.WindowSpec,
    exp.And, exp.Or, exp.Not, exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Is, exp.In, exp.Between,
    exp.NullSafeEQ, exp.NullSafeNEQ, exp.Like, exp.ILike, exp.RegexpLike, exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod,
    exp.Neg, exp.Abs, exp.Round, exp.Floor, exp.Ceil, exp.Greatest, exp.Least, exp.Coalesce, exp.Case, exp.If, exp.Cast,
    exp.WidthBucket, exp.Sqrt, exp.Ln, exp.Exp, exp.Pow, exp.Sign, exp.Cbrt, exp.Extract, exp.TimestampTrunc,
    exp.DateTrunc, exp.Lower, exp.Upper, exp.Length, exp.Substring, exp.DPipe, exp.Replace, exp.SplitPart,
    exp.StrPosition, exp.Pad, exp.Right, exp.Reverse, exp.Trim, exp.Tuple, exp.Nullif, exp.PercentileCont,
    exp.PercentileDisc, exp.Mode, exp.Exists, exp.TimeToStr, exp.UnixToTime, *AGGREGATES,
)


# what to write instead of functions BI tools send
LIST_VALUES = "list the values instead: SELECT DISTINCT c FROM t (its declared domain, or the values many units hold)"
UNIT_SETS = ("sets of people are answered where each SELECT picks the privacy unit's column of one table, "
             "counted: SELECT COUNT(*) FROM (SELECT <unit column> FROM t WHERE a INTERSECT SELECT <unit column> FROM t "
             "WHERE b) s, or WHERE <unit column> IN (... EXCEPT ...); UNION ALL of whole aggregate SELECTs is "
             "answered as one statement")
# a unit's first or last row (DISTINCT ON, ROW_NUMBER() per unit): what is answered instead
PER_UNIT = ("aggregate per unit instead: FROM (SELECT <unit column>, MIN(day) AS first_day, COUNT(*) AS n FROM t "
            "GROUP BY 1) s")
ARRAY_COLUMN = ("a locally randomized array column is counted per value of its domain: SELECT symptom, COUNT(*) "
                "FROM survey GROUP BY symptom, or for one value: SELECT COUNT(*) FROM survey WHERE 'fever' = "
                "ANY(symptom)")
INSTEAD = {
    exp.LogicalOr: "bool_or(x) is answered as an output column (SELECT k, bool_or(x) FROM t GROUP BY k); elsewhere "
                   "count the rows instead: HAVING COUNT(*) FILTER (WHERE x) > 0",
    exp.LogicalAnd: "bool_and(x) is answered as an output column (SELECT k, bool_and(x) FROM t GROUP BY k); "
                    "elsewhere count the rows that fail it: HAVING COUNT(*) FILTER (WHERE NOT x) = 0",
    exp.ApproxDistinct: "count distinct people with COUNT(DISTINCT <the privacy unit's column>)",
    exp.GroupConcat: LIST_VALUES,
    exp.ArrayAgg: LIST_VALUES,
    exp.Interval: "an interval of whole years, months, weeks, days, hours, minutes or seconds (under 100,000 of "
                  "each) is answered added to or subtracted from a time: constant date arithmetic (day >= DATE "
                  "'2024-07-01' - INTERVAL '30 days'), and a date or timestamp column with declared bounds "
                  "(date_trunc('week', day + INTERVAL '1 day'))",
    exp.Array: "list the values instead: x IN ('a', 'b'); several percentiles at once are answered as "
               "percentile_cont(ARRAY[0.25, 0.75]) WITHIN GROUP (ORDER BY x)",
    exp.Any: "list the values instead: x IN ('a', 'b')",
    exp.Bracket: "a person's first value of a column is answered in a subquery grouped by the person: SELECT "
                 "first_cat, COUNT(*) FROM (SELECT person_id, (array_agg(category ORDER BY day))[1] AS first_cat "
                 "FROM visits GROUP BY person_id) t GROUP BY 1; any other element of an array is one raw value",
    exp.Median: "PostgreSQL has no median(x): write percentile_cont(0.5) WITHIN GROUP (ORDER BY x)",
    exp.Fetch: "write FETCH FIRST n ROWS ONLY, or LIMIT n: WITH TIES is not answered (which noisy values tie is "
               "noise)",
    exp.Initcap: "capitalize the first letter yourself: upper(left(x, 1)) || lower(substring(x, 2)) (initcap's word "
                 "rules differ between backends)",
    exp.Format: "format() is answered with a constant format of %s only: format('%s visits', category), or "
                "concat(category, ' visits')",
    exp.Trunc: "trunc(x) and trunc(x, n) of a whole-number constant n are answered: trunc(AVG(age), 1), or "
               "trunc(x::numeric, -2) (toward zero, to hundreds)",
    exp.AtTimeZone: "name the zone as a constant: date_trunc('month', day AT TIME ZONE 'America/New_York')",
    exp.Lateral: "a LATERAL subquery is answered for each unit's first rows, of one table tied to the outer row by "
                 "its unit column and joined ON true: LEFT JOIN LATERAL (SELECT amount FROM visits v WHERE "
                 "v.person_id = p.person_id ORDER BY day DESC LIMIT 1) t ON true",
    exp.Intersect: UNIT_SETS,
    exp.Except: UNIT_SETS,
    exp.Union: UNIT_SETS,
}

# what to write instead of functions sqlglot does not know by name
INSTEAD_OF_NAMED = {
    "age": "count the days between dates: AVG(DATE '2025-01-01' - day), or the years of constants: "
           "EXTRACT(YEAR FROM age(DATE '2024-12-31', DATE '2000-01-01'))",
    "make_date": "the first day of a date's month or year is date_trunc('month', day)::date (or 'year'); a constant "
                 "date is DATE '2024-07-01'",
}

# functions a window may compute over the released rows
WINDOW_FUNCTIONS = (exp.RowNumber, exp.Rank, exp.DenseRank, exp.PercentRank, exp.CumeDist, exp.Ntile, exp.Lag, exp.Lead,
                    exp.FirstValue, exp.LastValue, exp.Sum, exp.Avg, exp.Min, exp.Max, exp.Count)


def _constant_function(node: exp.Expression) -> bool:
    """A function a statement that reads no table may call (PostgreSQL answers it, exactly and free): version()
    and current_database(), which clients ask on connecting, and the years, months or days of age() of constants
    (EXTRACT(YEAR FROM age(DATE '2024-12-31', DATE '2000-01-01'))); an interval itself has no type dpsql returns."""
    if isinstance(node, exp.CurrentVersion | exp.CurrentDatabase):
        return True
    return isinstance(node, exp.Anonymous) and node.name.lower() == "age" and isinstance(node.parent, exp.Extract) \
        and not node.find(exp.Column)


def refuse_unsafe(tree: exp.Select) -> None:
    """Raise for the first node of `tree` that dpsql does not answer."""
    reads_no_table = tree.find(exp.Table) is None
    for node in tree.walk():
        if reads_no_table and _constant_function(node):
            continue
        if isinstance(node, exp.Select):
            if node.args.get("into"):
                raise PrivacyRefusal("SELECT ... INTO is not allowed", "dpsql only returns noisy answers")
            if node.args.get("locks"):
                raise PrivacyRefusal("FOR UPDATE / FOR SHARE is not allowed", "remove the locking clause")
            distinct = node.args.get("distinct")
            if distinct is not None and distinct.args.get("on"):
                raise UnsupportedQuery("SELECT DISTINCT ON releases one raw row per key and is not supported",
                                       "keep each unit's first row in a subquery of one table, DISTINCT ON its unit "
                                       "column, and aggregate outside: SELECT c, COUNT(*) FROM (SELECT DISTINCT ON "
                                       "(<unit column>) <unit column>, category AS c FROM t ORDER BY <unit column>, "
                                       f"day) s GROUP BY 1; or {PER_UNIT}")
            if distinct is not None:
                raise UnsupportedQuery("SELECT DISTINCT releases raw values and is not supported",
                                       "use GROUP BY with an aggregate, e.g. SELECT c, COUNT(*) ... GROUP BY c")
        elif isinstance(node, exp.CTE) and not isinstance(node.this, exp.Select):
            raise PrivacyRefusal(f"a WITH clause may only hold SELECT, not {node.this.key.upper()}",
                                 "data-modifying CTEs are never run")
        elif isinstance(node, exp.Join) and node.args.get("kind", "").upper() == "CROSS":
            raise UnsupportedQuery("CROSS JOIN is not supported",
                                   "join on the declared key, e.g. JOIN people ON visits.person_id = people.person_id")
        if isinstance(node, exp.PercentileCont | exp.PercentileDisc | exp.Mode) \
                and not isinstance(node.parent, exp.WithinGroup):
            raise UnsupportedQuery(f"{_describe(node)} needs WITHIN GROUP (ORDER BY column)",
                                   "e.g. percentile_cont(0.5) WITHIN GROUP (ORDER BY x)")
        if isinstance(node, exp.Window):
            _check_window(node, tree)
            continue
        if isinstance(node, exp.TableSample):
            _check_sample(node)
            continue
        if isinstance(node.parent, exp.Window) and node is node.parent.this and isinstance(node, WINDOW_FUNCTIONS):
            continue
        if isinstance(node, exp.Interval) and (_in_constant_time(node) or _shifts_a_time(node)):
            continue
        if isinstance(node, exp.AtTimeZone) and _named_zone(node):
            continue
        if not isinstance(node, ALLOWED_NODES) and not is_percentile_array(node):
            raise UnsupportedQuery(f"{_describe(node)} is not supported by dpsql", _instead(node))


def _instead(node: exp.Expression) -> str:
    """What to write instead of a construct that is not allowed."""
    if isinstance(node, exp.Anonymous) and node.name.lower() in INSTEAD_OF_NAMED:
        return INSTEAD_OF_NAMED[node.name.lower()]
    if isinstance(node, exp.Any) and isinstance(node.this.unnest(), exp.Column):
        return ARRAY_COLUMN
    return INSTEAD.get(type(node), f"rewrite it without {_describe(node)}: dpsql answers aggregates of declared "
                                   "columns, e.g. SELECT k, COUNT(*), AVG(x) FROM t GROUP BY k")


def _check_window(window: exp.Window, tree: exp.Select) -> None:
    """A window runs over the released rows (post-processing): only in the outer SELECT list or ORDER BY, with a
    frame dpsql computes (`window_frame`), and as a ranking, another row's value (LAG, LEAD, FIRST_VALUE,
    LAST_VALUE, with constant offsets) or a SUM, AVG, MIN, MAX or COUNT. Or over each unit's rows in a windowed
    source (`unit_windows`), which PostgreSQL computes and the analysis judges (`analysis.windowed`)."""
    place = window.parent
    while isinstance(place, exp.Expression) and not isinstance(place, exp.Select | exp.Ordered | exp.Where
                                                                  | exp.Group | exp.Having | exp.Join):
        place = place.parent
    in_order = isinstance(place, exp.Ordered) and place.parent is not None and place.parent.parent is tree
    sourced = isinstance(place, exp.Select) and place is not tree and window.parent.parent is place \
        and bool(window.args.get("partition_by")) and is_windowed_source(place)
    if not (place is tree or in_order or sourced) or window.find_ancestor(exp.Window, *AGGREGATES):
        if window.args.get("partition_by"):  # a row of each unit's (its first by ROW_NUMBER(), a running total)
            raise UnsupportedQuery(f"{to_sql(window)} outside the outer SELECT list reads each partition's raw rows",
                                   "partition it by the unit, over declared columns of one table a subquery reads "
                                   "(joined, if at all, only to tables of one row per unit on the unit): FROM "
                                   "(SELECT t.*, ROW_NUMBER() OVER (PARTITION BY <unit column> ORDER BY day) AS rn "
                                   f"FROM t) s WHERE rn = 1; or {PER_UNIT}; a window over the answer's own rows runs "
                                   "in the outer SELECT (rank() OVER (ORDER BY COUNT(*) DESC))")
        raise UnsupportedQuery("a window function may appear only in the outer SELECT list or ORDER BY",
                               "dpsql computes windows over the released rows, after noise: write it in the outer "
                               "SELECT, e.g. SELECT k, COUNT(*), rank() OVER (ORDER BY COUNT(*) DESC) FROM t "
                               "GROUP BY k")
    window_frame(window)  # a frame dpsql computes, or refused
    if not isinstance(window.this, WINDOW_FUNCTIONS):
        raise UnsupportedQuery(f"{_describe(window.this)} is not supported as a window function",
                               "use ROW_NUMBER, RANK, DENSE_RANK, PERCENT_RANK, CUME_DIST, NTILE, LAG, LEAD, "
                               "FIRST_VALUE, LAST_VALUE, SUM, AVG, MIN, MAX or COUNT OVER (...)")
    function = window.this
    offset, default = function.args.get("offset"), function.args.get("default")
    buckets = function.this if isinstance(function, exp.Ntile) else None
    if not ((offset is None or _whole(offset)) and (buckets is None or _whole(buckets) and int(buckets.this) > 0)
            and (default is None or isinstance(default, exp.Literal | exp.Neg | exp.Null)
                 or sourced and isinstance(default, exp.Column))):  # over a unit's rows, the row's own value
        raise UnsupportedQuery(f"{_describe(function)} needs constants for its offset, default or buckets",
                               "e.g. LAG(n, 1, 0) OVER (ORDER BY month) or NTILE(4) OVER (ORDER BY n)")


def _check_sample(sample: exp.TableSample) -> None:
    """A table read as TABLESAMPLE BERNOULLI (percentage), a constant: each of its rows is read or not by a coin of
    its own, whatever the data, so every bound the answer relies on holds for the rows read as for the whole table
    (and one statement reads the same rows wherever it reads the table: the secret seed, `sql.with_sample_seeds`,
    which also refuses REPEATABLE). SYSTEM is refused: it reads whole pages, so which other rows it reads would
    depend on where one person's rows are stored. A percentage outside 0 to 100 fails in PostgreSQL whatever the
    data."""
    method, percent = sample.args.get("method"), sample.args.get("percent")
    # as the analyst wrote it, without a seed dpsql drew (`sql.with_sample_seeds`)
    written = f"TABLESAMPLE {method.name.upper() if method else ''} ({to_sql(percent) if percent else ''})"
    if method is None or method.name.upper() != "BERNOULLI" or not isinstance(sample.parent, exp.Table) \
            or any(sample.args.get(arg) is not None for arg in sample.args if arg not in ("method", "percent", "seed")):
        raise UnsupportedQuery(f"{written} is not supported by dpsql",
                               "sample rows, one coin each, with TABLESAMPLE BERNOULLI (percentage) on a table: "
                               "SELECT COUNT(*) FROM visits TABLESAMPLE BERNOULLI (10)")
    share = _constant_number(percent)
    if share is None:
        raise UnsupportedQuery(f"{written} needs a constant percentage",
                               "e.g. SELECT COUNT(*) FROM visits TABLESAMPLE BERNOULLI (10)")
    if not 0 <= share <= 100:
        raise InvalidConstant("sample percentage must be between 0 and 100",
                              f"write a percentage from 0 to 100: TABLESAMPLE BERNOULLI (10), not {written}",
                              sqlstate="2202H")


def refuse_failing_constants(tree: exp.Expression) -> None:
    """Raise PostgreSQL's error for a constant the analyst wrote that fails whatever the data, before anything is
    charged: a division by 0 (`1 / 0`, `SUM(x) / 0.0`, `age % 0`, 22012), where dpsql's rewrite (x / NULLIF(y, 0))
    and post-processing would answer NULL and charge; an interval PostgreSQL cannot read (`INTERVAL '1 fortnight'`,
    22007), which was refused as a construct dpsql does not support. Checked as written, before parameters are
    bound: a scalar subquery's noisy value that comes out 0 is post-processed as NULL, as before."""
    for node in tree.find_all(exp.Div, exp.IntDiv, exp.Mod):
        if _zero(node.expression):
            raise InvalidConstant(f"division by zero: {to_sql(node)} (SQLSTATE 22012); nothing was run or charged",
                                  "divide by a number other than 0; to leave a row's value out where its divisor is "
                                  "0, write x / NULLIF(y, 0)", sqlstate="22012")
    for text in _interval_texts(tree):
        words = {w.lower() for w in INTERVAL_WORD.findall(text)}
        if not ISO_INTERVAL.fullmatch(text.strip()) and not words <= INTERVAL_WORDS:
            raise InvalidConstant(f'invalid input syntax for type interval: "{text}" (SQLSTATE 22007); nothing was '
                                  "run or charged", "write an interval of numbers and units: INTERVAL '2 weeks', "
                                  "INTERVAL '1 day 12 hours'", sqlstate="22007")


def _interval_texts(tree: exp.Expression) -> Iterator[str]:
    """The text of each constant interval: `INTERVAL '1 day'` (which sqlglot reads as '1' and the unit DAY) and
    `'1 day'::interval`."""
    for node in tree.find_all(exp.Interval, exp.Cast):
        if isinstance(node, exp.Interval) and isinstance(node.this, exp.Literal):
            unit = node.args.get("unit")
            yield f"{node.this.this}{f' {unit.name}' if unit is not None else ''}"
        elif isinstance(node, exp.Cast) and node.to.is_type("interval") and isinstance(node.this, exp.Literal) \
                and node.this.is_string:
            yield node.this.this


# the words PostgreSQL reads in an interval's text (its units, their abbreviations and plurals, and `ago`)
INTERVAL_WORDS = {*(f"{u}{s}" for u in ("microsecond", "millisecond", "second", "minute", "hour", "day", "week",
                                          "month", "year", "decade", "mon", "min", "sec", "hr", "yr", "usec",
                                          "msec") for s in ("", "s")),
                  "century", "centuries", "millennium", "millennia", "mil", "mils", "us", "ms", "s", "m", "h", "d",
                  "w", "y", "ago", "c", "dec", "decs"}
INTERVAL_WORD = re.compile(r"[A-Za-z]+")
ISO_INTERVAL = re.compile(r"P(?=\d|T\d)[\dYMWD.]*(T[\dHMS.]+)?", re.IGNORECASE)  # P1Y2M3DT4H5M6S, P1W


def _zero(node: exp.Expression) -> bool:
    """Whether `node` is the number 0 written as a constant (0, 0.0, -0, (0))."""
    found = signed_literal(node)
    if found is None or found[0].is_string:
        return False
    try:
        return float(found[0].this) == 0
    except ValueError:
        return False


def _constant_number(node: exp.Expression | None) -> float | None:
    """The value of a number written as a constant (10, 2.5, -1, or '10', which PostgreSQL reads as a number
    here), else None; a text that is no number fails as PostgreSQL's does."""
    negative = isinstance(node, exp.Neg)
    literal = node.this if negative else node
    if not isinstance(literal, exp.Literal):
        return None
    try:
        value = float(literal.this)
    except ValueError:
        raise InvalidConstant(f'invalid input syntax for type real: "{literal.this}"',
                              "write the number without quotes: TABLESAMPLE BERNOULLI (10)",
                              sqlstate="22P02") from None
    return -value if negative else value


def _in_constant_time(interval: exp.Interval) -> bool:
    """Whether `interval` is added to or subtracted from a constant time that `sql.times` could not fold
    (`date_trunc('month', now()) - INTERVAL '1 day'`: the truncation is in the session's time zone): the whole
    expression reads no column. PostgreSQL computes it where a row reaches it (the arithmetic is STABLE, not
    folded when planned), so it must not fail on any: the interval is one `sql.times` reads, of less than MAX_STEP
    of each unit, which keeps any time dpsql accepts within PostgreSQL's range."""
    if interval_step(interval) is None:  # far steps could overflow the time, an error only rows would reach
        return False
    top: exp.Expression = interval
    while isinstance(top.parent, exp.Add | exp.Sub | exp.Paren | exp.Cast | exp.TimestampTrunc | exp.DateTrunc):
        top = top.parent
    return top is not interval and not any(isinstance(n, (exp.Column, exp.Select, *AGGREGATES)) for n in top.walk())


def _named_zone(node: exp.AtTimeZone) -> bool:
    """Whether `node` names its zone as a text constant, which the engine checks against the zones PostgreSQL
    lists (`times.check_time_zones`) before anything is charged."""
    zone = node.args.get("zone")
    return isinstance(zone, exp.Literal) and zone.is_string


def _shifts_a_time(interval: exp.Interval) -> bool:
    """Whether `interval` (one `sql.times` reads) is added to or subtracted from an expression that reads a
    column: the analysis answers it for a date or timestamp column with declared bounds, which the guard clamps
    so the shifted time cannot overflow (`Expressions.time_bounds`), and refuses it for anything else."""
    parent = interval.parent
    return (interval_step(interval) is not None and isinstance(parent, exp.Add | exp.Sub)
            and parent.expression is interval and parent.this.find(exp.Column) is not None)


@dataclass(frozen=True)
class Frame:
    """A window's frame around the current row: ROWS counts rows (start and end are offsets from the current row,
    negative before it), RANGE counts peers (0 is the current row's peers); None is the partition's end."""

    rows: bool
    start: int | None
    end: int | None


DEFAULT_FRAME = Frame(False, None, 0)  # RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW


def window_frame(window: exp.Window) -> Frame:
    """The frame a window's ROWS or RANGE clause gives (without one, PostgreSQL's default). ROWS takes whole-number
    offsets; RANGE only UNBOUNDED and CURRENT ROW (an offset in RANGE is a distance between released values);
    GROUPS and EXCLUDE are refused, and so is a frame PostgreSQL refuses (one ending before it starts)."""
    spec = window.args.get("spec")
    if spec is None:
        return DEFAULT_FRAME
    kind = (spec.args.get("kind") or "").upper()
    if kind not in ("ROWS", "RANGE") or spec.args.get("exclude"):
        what = "EXCLUDE in a window frame is" if spec.args.get("exclude") else f"window frames in {kind} mode are"
        raise UnsupportedQuery(f"{what} not supported",
                               "use ROWS BETWEEN n PRECEDING AND CURRENT ROW, or RANGE BETWEEN UNBOUNDED PRECEDING AND "
                               "CURRENT ROW")
    start = _frame_bound(kind, spec.args.get("start"), spec.args.get("start_side"))
    end = _frame_bound(kind, spec.args.get("end") or "CURRENT ROW", spec.args.get("end_side"))
    if start[0] > end[0] or start[0] == 4 or end[0] == 0:
        raise UnsupportedQuery("this window frame ends before it starts", "write the frame's start first: ROWS "
                               "BETWEEN 2 PRECEDING AND CURRENT ROW")
    return Frame(kind == "ROWS", start[1], end[1])


def _frame_bound(kind: str, value: Any, side: str | None) -> tuple[int, int | None]:
    """A frame bound as (its place in PostgreSQL's order: UNBOUNDED PRECEDING, n PRECEDING, CURRENT ROW,
    n FOLLOWING, UNBOUNDED FOLLOWING; its offset from the current row, None where unbounded)."""
    side = (side or "").upper()
    if isinstance(value, str) and value.upper() == "CURRENT ROW":
        return 2, 0
    if isinstance(value, str) and value.upper() == "UNBOUNDED":
        return (0 if side == "PRECEDING" else 4), None
    if kind == "ROWS" and isinstance(value, exp.Expression) and _whole(value):
        return (1, -int(value.this)) if side == "PRECEDING" else (3, int(value.this))
    shown = to_sql(value) if isinstance(value, exp.Expression) else str(value)
    raise UnsupportedQuery(f"the window frame bound {shown} {side} is not supported",
                           "use whole-number offsets in ROWS mode: ROWS BETWEEN 2 PRECEDING AND CURRENT ROW")


def _whole(node: exp.Expression) -> bool:
    return isinstance(node, exp.Literal) and not node.is_string and node.this.isdigit()


def _describe(node: exp.Expression) -> str:
    """What the user wrote, as PostgreSQL spells it (to_char, not sqlglot's TimeToStr)."""
    if isinstance(node, exp.Anonymous):
        return f"function {node.name}()"
    if isinstance(node, exp.ApproxDistinct):  # PostgreSQL has none; sqlglot names it approx_distinct
        return "function approx_count_distinct()"
    if isinstance(node, exp.Median):  # sqlglot writes it as PostgreSQL's percentile_cont
        return "function median()"
    if isinstance(node, exp.Fetch):  # the one kind left after `shape.fetch_as_limit`
        return "FETCH ... WITH TIES"
    if isinstance(node, exp.Interval | exp.Array | exp.AtTimeZone | exp.Bracket):  # as written: which one
        return to_sql(node)
    if isinstance(node, exp.Func):
        text = to_sql(node)  # an operator (x ~ 'a') or a keyword (CURRENT_TIMESTAMP) has no parenthesis
        return f"function {text.split('(')[0].strip().lower()}()" if "(" in text else text
    return node.key.upper().replace("_", " ")
