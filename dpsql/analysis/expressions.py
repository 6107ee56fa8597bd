"""Value ranges of expressions, and the guarded form of each expression that the backend runs.

Two promises keep errors and unbounded values from depending on the data:
- `guard` rewrites an expression so that it cannot fail on any value: bounded numeric columns used in a
  computation are clamped to their declared range (NaN becomes NULL first), divisors go through
  NULLIF(y, 0), sqrt and ln get only valid arguments, width_bucket never sees NaN, and dates and timestamps
  reach date_trunc, EXTRACT and casts to timestamp only inside the range where those cannot overflow; a date
  or timestamp column shifted by an interval (`day + INTERVAL '1 day'`) or read as seconds since 1970 is clamped
  to its declared bounds, even in a comparison, so the result lies within every backend's range.
- `value_range` computes, for the guarded expression, an interval that holds on every database. It refuses
  (UnsupportedQuery) arithmetic on numeric columns without declared bounds, intervals beyond ±1e15 (where
  float or integer overflow could raise an error), casts that could overflow, and partial functions whose
  arguments it cannot make total. Constant arguments are validated here, in Python, not just required to be
  constant: a negative substring length, a LIKE pattern ending in its escape character or an unknown
  date_trunc unit fails only on the rows that reach it, so PostgreSQL's error would tell whether such a row
  exists (one person's data could decide it).
Comparisons read stored values as they are: they cannot fail, and clamping them would change which rows match.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import product

from sqlglot import exp

from dpsql.analysis.clamps import clamp, constant, number, temporal_guard
from dpsql.errors import InvalidQuery, UnsupportedQuery
from dpsql.schema import INTEGER_TYPES, NUMERIC_TYPES, Column
from dpsql.schema.model import temporal_value
from dpsql.sql.patterns import check_regex
from dpsql.sql.query import to_sql
from dpsql.sql.times import Time, interval_step

LIMIT = 1e15
PREDICATES = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.In, exp.Between, exp.Is, exp.NullSafeEQ,
              exp.NullSafeNEQ)
EXTRACT_RANGES = {
    "YEAR": (-4713, 5874897), "MONTH": (1, 12), "DAY": (1, 31), "DOW": (0, 6), "ISODOW": (1, 7),
    "DOY": (1, 366), "WEEK": (1, 53), "QUARTER": (1, 4), "HOUR": (0, 23), "MINUTE": (0, 59),
    # seconds since 1970 of the guarded value (inside dialect.earliest() and latest(), a day of time zones to spare)
    "EPOCH": (-188_500_000_000.0, 9_225_000_000_000.0),
}
CALENDAR_FIELDS = ("MONTH", "DAY", "DOW", "ISODOW", "DOY", "WEEK", "QUARTER")  # of a date, read over its days
WALKED_DAYS = 4000  # the most days of a date column (or values of an integer one) read one by one
INT_CAST_LIMITS = {exp.DataType.Type.SMALLINT: 2**15 - 1, exp.DataType.Type.INT: 2**31 - 1,
                   exp.DataType.Type.BIGINT: 2**63 - 1}
FLOAT_CASTS = {exp.DataType.Type.DOUBLE, exp.DataType.Type.DECIMAL, exp.DataType.Type.FLOAT}
TIMESTAMP_CASTS = {exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPTZ}
UTC_ZONES = {"utc", "etc/utc", "gmt", "etc/gmt", "z", "zulu", "uct", "universal", "etc/universal", "etc/uct",
             "etc/zulu", "gmt0", "etc/gmt0", "gmt+0", "gmt-0", "etc/gmt+0", "etc/gmt-0", "greenwich", "etc/greenwich"}
TIME_CASTS = {exp.DataType.Type.DATE: "date", exp.DataType.Type.TIMESTAMP: "timestamp",
              exp.DataType.Type.TIMESTAMPTZ: "timestamptz"}
EPOCH_TIMESTAMPS = (-210_866_803_200, 9_224_318_015_999)  # the seconds to_timestamp accepts (4714 BC to 294276 AD)
TRUNC_UNITS = ("microseconds", "milliseconds", "second", "minute", "hour", "day", "week", "month", "quarter",
               "year", "decade", "century", "millennium")
# the longest period of each date_trunc unit, in days: a period's start lies at most that far before a time in it
PERIOD_DAYS = {"microseconds": 1, "milliseconds": 1, "second": 1, "minute": 1, "hour": 1, "day": 1, "week": 7,
               "month": 31, "quarter": 92, "year": 366, "decade": 3_653, "century": 36_525, "millennium": 365_250}
WHOLE_SECONDS = set(PERIOD_DAYS) - {"microseconds", "milliseconds"}  # periods that start on a whole second
TIME_FIELDS = ("HOUR", "MINUTE")  # EXTRACT of these fails on a date (PostgreSQL 14+)
MAX_BUCKETS = 100_000
MAX_TEXT_POSITION = 2**30  # substring positions and lengths, like the longest text PostgreSQL stores
MAX_ROUND_DIGITS = 30


@dataclass(frozen=True)
class Range:
    """A closed interval that every value of an expression lies in (NULL aside)."""

    lo: float
    hi: float
    integer: bool = False

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.lo) and math.isfinite(self.hi)

    @property
    def magnitude(self) -> float:
        return max(abs(self.lo), abs(self.hi))

    def hull(self, other: Range) -> Range:
        return Range(min(self.lo, other.lo), max(self.hi, other.hi), self.integer and other.integer)


def _width_bucket(value: float, low: float, high: float, count: int) -> tuple[int, int]:
    """The bucket PostgreSQL's width_bucket(value, low, high, count) gives, as (lowest, highest): one wider where
    floating point could round the position either way."""
    if low < high:
        if value < low or value >= high:
            return (0, 0) if value < low else (count + 1, count + 1)
        position = (value - low) / (high - low) * count
    else:
        if value > low or value <= high:
            return (0, 0) if value > low else (count + 1, count + 1)
        position = (low - value) / (low - high) * count
    bucket = math.floor(position) + 1
    near = int(abs(position - round(position)) <= 1e-9 * max(1.0, abs(position)))
    return max(bucket - near, 1), min(bucket + near, count)


class Expressions:
    """Ranges and guards for the expressions of one query, given how to find each column's declaration."""

    def __init__(self, lookup, session_zone: Callable[[], str | None] = lambda: None) -> None:
        self.column = lookup  # exp.Column -> its declared schema Column, or None
        self.session_zone = session_zone  # the backend session's TimeZone, once the analysis knows it

    # --- guard ------------------------------------------------------------------------------------------

    def guard(self, node: exp.Expression) -> exp.Expression:
        """A copy of `node` that cannot raise on any stored value (see module docstring)."""
        return node.copy().transform(self._guard_node, copy=False)

    def _guard_node(self, node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column):
            column = self.column(node)
            if column is not None and column.bounded and column.is_numeric and not isinstance(node.parent, PREDICATES):
                return clamp(node, column)
            return node
        if isinstance(node, exp.Add | exp.Sub) and (isinstance(node.expression, exp.Interval)
                                                    or self._date_arithmetic(node)):
            # the time shifted (a column, or date_trunc of one) read within its declared bounds, which
            # `time_bounds` reads: no stored value can make the shift overflow; both dates of a difference too
            # (±infinity has none), so that it lies within the range `_range_sub` gives
            node.set("this", self._clamped_times(node.this))
            if not isinstance(node.expression, exp.Interval):
                node.set("expression", self._clamped_times(node.expression))
        if isinstance(node, exp.AtTimeZone):  # the time read within its declared bounds: the shift cannot overflow
            node.set("this", self._clamped_times(node.this))
        if isinstance(node, exp.Extract):
            declared, truncated = self._declared_epoch(node), self._truncated_epoch(node)
            if truncated is not None:  # the truncation of the column clamped to its bounds
                truncation = node.expression.unnest()
                truncation.set("this", clamp(truncation.this, truncated[0]))
            else:
                node.set("expression", clamp(node.expression, declared) if declared is not None
                         else temporal_guard(node.expression, keep_infinite=False))
        elif isinstance(node, exp.TimestampTrunc | exp.DateTrunc | exp.TimeToStr):
            node.set("this", temporal_guard(node.this, keep_infinite=False))
        elif isinstance(node, exp.Cast) and node.to.this in TIMESTAMP_CASTS:
            node.set("this", temporal_guard(node.this, keep_infinite=True))
        elif isinstance(node, exp.UnixToTime):  # to_timestamp fails on NaN and past the timestamps' range
            low, high = (number(v) for v in EPOCH_TIMESTAMPS)
            inside = exp.Between(this=node.this.copy(), low=low, high=high)
            node.set("this", exp.Case(ifs=[exp.If(this=inside, true=node.this)]))
        elif isinstance(node, exp.WidthBucket) and self.kind(node.this) != "integer":
            nan = exp.Literal.string("NaN")  # width_bucket raises on a NaN operand
            node.set("this", exp.Nullif(this=node.this, expression=nan))
        if isinstance(node, exp.Div | exp.Mod):
            node.set("expression", exp.func("NULLIF", node.expression, exp.Literal.number(0)))
        elif isinstance(node, exp.Sqrt):  # not GREATEST(x, 0): it skips NULL, so NULL would become sqrt(0)
            negative = exp.LT(this=node.this.copy(), expression=exp.Literal.number(0))
            node.set("this", exp.Case(ifs=[exp.If(this=negative, true=exp.Literal.number(0))], default=node.this))
        elif isinstance(node, exp.Ln):
            positive = exp.GT(this=node.this.copy(), expression=exp.Literal.number(0))
            node.set("this", exp.Case(ifs=[exp.If(this=positive, true=node.this)]))
        return node

    # --- SQL types --------------------------------------------------------------------------------------

    def kind(self, node: exp.Expression) -> str:
        """The family of PostgreSQL's type for numeric `node`: "integer", "numeric" (exact) or "float", following
        PostgreSQL's resolution (integers widen to numeric, anything with a float is a float; floor, round, sqrt
        and ln of an integer resolve to their double precision versions). When unsure it says "float", which
        every number converts to implicitly."""
        if isinstance(node, exp.Paren | exp.Neg | exp.Abs | exp.Nullif | exp.Mod):
            return self._widest([node.this, node.expression] if isinstance(node, exp.Mod) else [node.this])
        if isinstance(node, exp.Literal) and not node.is_string:
            return "numeric" if any(c in node.this.lower() for c in ".e") else "integer"
        if isinstance(node, exp.Column):
            column = self.column(node)
            return _type_kind(column.type) if column is not None else "float"
        if isinstance(node, exp.Sub) and self._date_arithmetic(node) == "days":
            return "integer"
        if isinstance(node, exp.Add | exp.Sub | exp.Mul | exp.Div):
            return self._widest([node.this, node.expression])
        if isinstance(node, exp.Greatest | exp.Least | exp.Coalesce):
            return self._widest([node.this, *node.expressions])
        if isinstance(node, exp.Case | exp.If):
            branches = [b.args["true"] for b in node.args.get("ifs", [])] if isinstance(node, exp.Case) else \
                [node.args["true"]]
            default = node.args.get("default") or node.args.get("false")
            return self._widest([b for b in [*branches, default] if b is not None and not isinstance(b, exp.Null)])
        if isinstance(node, exp.Cast):
            return _type_kind(to_sql(node.to).lower())
        if isinstance(node, exp.Extract):  # date_part is EXTRACT's double precision twin (`name_written_outputs`)
            return "float" if node.meta.get("written") == "date_part" else "numeric"
        if isinstance(node, exp.Round) and node.args.get("decimals") is not None:
            return "numeric"
        if isinstance(node, exp.Floor | exp.Ceil | exp.Round | exp.Sqrt | exp.Ln | exp.Exp | exp.Sign | exp.Pow):
            inner = self._widest([node.this, node.expression]) if isinstance(node, exp.Pow) else self.kind(node.this)
            return "float" if inner == "integer" else inner
        if isinstance(node, exp.WidthBucket | exp.Length | exp.StrPosition):
            return "integer"
        return "float"

    def _widest(self, nodes: list[exp.Expression]) -> str:
        kinds = {self.kind(n) for n in nodes}
        return next((k for k in ("float", "numeric", "integer") if k in kinds), "float")

    # --- ranges -----------------------------------------------------------------------------------------

    def check(self, node: exp.Expression) -> None:
        """Refuse `node` if some stored value could make its guarded form fail or overflow."""
        self.value_range(node)

    def value_range(self, node: exp.Expression) -> Range | None:
        """Interval of the guarded `node`'s values, or None if it is not numeric (text, date, boolean)."""
        if constant(node):
            _check_constant(node)
            return _constant_range(node)
        handler = getattr(self, f"_range_{type(node).__name__.lower()}", None)
        if handler is not None:
            result = handler(node)
            if result is not None and result.bounded and result.magnitude > LIMIT:
                raise UnsupportedQuery(f"{to_sql(node)} may reach {result.magnitude:.3g}, "
                                       f"beyond the ±{LIMIT:.0e} dpsql computes with",
                                       "scale the expression down or narrow the declared bounds")
            return result
        if isinstance(node, exp.Substring):
            _check_substring(node)
        elif isinstance(node, TEXT_CONSTANTS):
            _check_text_constants(node)
        elif isinstance(node, exp.Like | exp.ILike):
            _check_like_pattern(node)
        elif isinstance(node, exp.RegexpLike):
            self._check_regex(node)
        elif isinstance(node, exp.TimestampTrunc | exp.DateTrunc):
            _check_trunc(node)
        elif isinstance(node, exp.TimeToStr):
            self._check_to_char(node)
        elif isinstance(node, exp.UnixToTime) and (node.args.get("scale") is not None
                                                   or self.value_range(node.this) is None):
            raise UnsupportedQuery("to_timestamp takes one number (seconds since 1970) here",
                                   "e.g. to_timestamp(floor(extract(epoch from day) / 86400) * 86400)")
        for child in node.iter_expressions():
            if not isinstance(child, exp.DataType | exp.Var | exp.Identifier):
                self.value_range(child)
        return None

    def numeric(self, node: exp.Expression, what: str) -> Range:
        """The range of `node`, which must be a bounded number."""
        result = self.value_range(node)
        if result is None:
            truncated = node.this if isinstance(node, exp.Cast) else node
            if isinstance(truncated, exp.TimestampTrunc | exp.DateTrunc) and what.split()[0] in ("MIN", "MAX"):
                time = to_sql(truncated.this)  # the first month is the first day's
                raise UnsupportedQuery(f"{what} {to_sql(node)} is not numeric",
                                       f"ask for the time itself, {what.split()[0]}({time}), whose month (or week) "
                                       f"is the one asked; in a per-unit subquery this form is answered as written")
            raise UnsupportedQuery(f"{what} {to_sql(node)} is not numeric",
                                   "use a numeric column, or count a condition: "
                                   "SUM(CASE WHEN x = 'a' THEN 1 ELSE 0 END)")
        if not result.bounded:
            raise UnsupportedQuery(
                f"{to_sql(node)} has no declared bounds, so its {what} has unbounded sensitivity",
                "declare lower and upper for the column in the privacy schema")
        return result

    def _require_constant(self, node: exp.Expression, args: tuple[str, ...], what: str) -> None:
        for arg in args:
            value = node.args.get(arg)
            if value is not None and not constant(value):
                raise UnsupportedQuery(f"{what} must be constants, not {to_sql(value)}",
                                       "write the values as constants, e.g. x IN ('a', 'b')")

    def _range_column(self, node: exp.Column) -> Range | None:
        column = self.column(node)
        if column is None or column.type not in NUMERIC_TYPES:
            return None
        if not column.bounded or isinstance(node.parent, PREDICATES):
            return Range(-math.inf, math.inf, column.type in INTEGER_TYPES)
        if column.type in INTEGER_TYPES:  # the clamp keeps the integers inside the bounds (the schema has some)
            return Range(math.ceil(column.lower), math.floor(column.upper), True)
        return Range(column.lower, column.upper)

    def _operands(self, node: exp.Expression, *args: str) -> list[Range]:
        ranges = []
        for arg in args:
            child = node.args[arg]
            ranges.append(self.numeric(child, "arithmetic operand"))
        return ranges

    def _range_paren(self, node: exp.Paren) -> Range | None:
        return self.value_range(node.this)

    def _range_neg(self, node: exp.Neg) -> Range:
        (a,) = self._operands(node, "this")
        return Range(-a.hi, -a.lo, a.integer)

    def _range_abs(self, node: exp.Abs) -> Range:
        (a,) = self._operands(node, "this")
        lo = 0.0 if a.lo <= 0 <= a.hi else min(abs(a.lo), abs(a.hi))
        return Range(lo, a.magnitude, a.integer)

    def _range_add(self, node: exp.Add) -> Range | None:
        if isinstance(node.expression, exp.Interval) or self._date_arithmetic(node) == "date":
            return self._check_time_shift(node)
        a, b = self._operands(node, "this", "expression")
        return Range(a.lo + b.lo, a.hi + b.hi, a.integer and b.integer)

    def _range_sub(self, node: exp.Sub) -> Range | None:
        arithmetic = self._date_arithmetic(node)
        if isinstance(node.expression, exp.Interval) or arithmetic == "date":
            return self._check_time_shift(node)
        if arithmetic == "days":
            first, second = self._date_bounds(node.this), self._date_bounds(node.expression)
            if first is None or second is None:
                raise UnsupportedQuery(f"{to_sql(node)}: the days between two dates are computed here only for "
                                       "date columns with declared bounds (and date constants)",
                                       "declare lower and upper for the date column in the privacy schema")
            return Range((first[0] - second[1]).days, (first[1] - second[0]).days, True)
        a, b = self._operands(node, "this", "expression")
        return Range(a.lo - b.hi, a.hi - b.lo, a.integer and b.integer)

    # --- dates: whole days added, and the days between two ------------------------------------------------

    def _date_arithmetic(self, node: exp.Add | exp.Sub) -> str | None:
        """What PostgreSQL makes of `node`: "date" for a date plus or minus a whole number of days (`day + 7`),
        "days" for a date minus a date (an integer: `DATE '2025-01-01' - day`, `last_visit - first_visit`);
        None for anything else (numbers, intervals). The dates are date columns with declared bounds (clamped to
        them by the guard) or constants; dates without known bounds are refused where their range is needed."""
        if self.time_type(node.this) != "date" and not _date_constant(node.this):
            return None
        if isinstance(node, exp.Sub) and (self.time_type(node.expression) == "date"
                                          or _date_constant(node.expression)):
            return "days"
        return "date" if _whole_days(node.expression) is not None else None

    def _date_bounds(self, node: exp.Expression) -> tuple[datetime.date, datetime.date] | None:
        """The earliest and latest value of a date expression: a constant's own, or `time_bounds`."""
        day = _date_constant(node)
        if day is not None:
            return day, day
        return self.time_bounds(node) if self.time_type(node) == "date" else None

    # --- times shifted by an interval -------------------------------------------------------------------

    def _check_time_shift(self, node: exp.Add | exp.Sub) -> None:
        """`t ± INTERVAL '…'` (Metabase's weeks from Sunday: date_trunc('week', day + INTERVAL '1 day') -
        INTERVAL '1 day'), or a date ± a number of days (`day + 7`): t must be a date or timestamp column with
        declared bounds, which the guard clamps it to, or date_trunc of such a time, and the shifted bounds must
        stay within years 1 to 9999, every backend's range, so that no stored value can make the arithmetic
        overflow. Not a number: None."""
        if self.time_bounds(node) is None:
            raise UnsupportedQuery(f"{to_sql(node)}: an interval or a number of days is added here only to a date "
                                   "or timestamp column with declared bounds (or date_trunc of one), by a step of "
                                   "whole units, staying within years 1 to 9999",
                                   "declare lower and upper for the column in the privacy schema, or compare the "
                                   "column with a constant moved by the interval: day >= DATE '2024-07-01' - "
                                   "INTERVAL '30 days'")
        return None

    def _clamped_times(self, node: exp.Expression) -> exp.Expression:
        """`node` with each date or timestamp column with declared bounds clamped to them, once (a shift inside
        a shift finds its column clamped already)."""
        for column in list(node.find_all(exp.Column)):
            declared = self.column(column)
            if declared is None or not declared.is_temporal or not declared.bounded or any(
                    parent.meta.get(TIME_CLAMP) for parent in _ancestors(column)):
                continue
            clamped = clamp(column, declared)
            clamped.meta[TIME_CLAMP] = True
            if column is node:
                return clamped
            column.replace(clamped)
        return node

    def time_type(self, node: exp.Expression) -> str | None:
        """PostgreSQL's type of a time expression (date, timestamp or timestamptz), or None if it is not one."""
        node = node.unnest()
        if isinstance(node, exp.Column):
            column = self.column(node)
            return column.type if column is not None and column.is_temporal else None
        if isinstance(node, exp.TimestampTrunc | exp.DateTrunc):
            return "timestamp" if self.time_type(node.this) == "timestamp" else "timestamptz"
        if isinstance(node, exp.UnixToTime):
            return "timestamptz"
        if isinstance(node, exp.Cast) and node.to.this in TIME_CASTS and self.time_type(node.this) is not None:
            return TIME_CASTS[node.to.this]  # a time cast to another kind of time (Metabase's CAST(… AS date))
        if isinstance(node, exp.AtTimeZone):  # a date is read as a timestamptz first; the zone turns the one into
            inner = self._zoned_type(node.this)  # the other
            return None if inner is None else "timestamptz" if inner == "timestamp" else "timestamp"
        if isinstance(node, exp.Add | exp.Sub) and isinstance(node.expression, exp.Interval):
            inner = self.time_type(node.this)
            return "timestamp" if inner == "date" else inner  # a date plus an interval is a timestamp
        if isinstance(node, exp.Add | exp.Sub) and _whole_days(node.expression) is not None \
                and self.time_type(node.this) == "date":
            return "date"  # a date plus a number of days
        return None

    def time_bounds(self, node: exp.Expression) -> tuple[Time, Time] | None:
        """The earliest and latest values of a time expression built from a date or timestamp column with
        declared bounds (clamped to them by the guard), intervals added to it and date_trunc, as Python
        dates and naive datetimes (UTC for a timestamptz); None where not known or out of years 1 to 9999."""
        node = node.unnest()
        if isinstance(node, exp.Column):
            column = self.column(node)
            if column is None or not column.is_temporal or not column.bounded:
                return None
            low, high = (temporal_value(column.type, v) for v in (column.lower, column.upper))
            return tuple(v.replace(tzinfo=None) if isinstance(v, datetime.datetime) else v for v in (low, high))
        if isinstance(node, exp.TimestampTrunc | exp.DateTrunc):
            inner = self.time_bounds(node.this)
            unit = node.args.get("unit")
            span = TRUNC_SPANS.get(unit.name.lower()) if unit is not None else None
            if inner is None or span is None:
                return None
            low, high = (datetime.datetime.combine(v, datetime.time()) if type(v) is datetime.date else v
                         for v in inner)
            return _within_years(low - span, high + datetime.timedelta(days=1))  # a day of time zones to spare
        if isinstance(node, exp.AtTimeZone):
            return self._zoned_bounds(node)
        if isinstance(node, exp.Cast) and node.to.this in TIME_CASTS:
            return self._cast_bounds(node)
        if isinstance(node, exp.Add | exp.Sub) and isinstance(node.expression, exp.Interval):
            inner, step = self.time_bounds(node.this), interval_step(node.expression)
            if inner is None or step is None:
                return None
            step = step if isinstance(node, exp.Add) else step.negated()
            try:
                return _within_years(*(step.added_to(v) for v in inner))
            except (OverflowError, ValueError):
                return None
        days = _whole_days(node.expression) if isinstance(node, exp.Add | exp.Sub) else None
        if days is not None and self.time_type(node.this) == "date":
            inner = self.time_bounds(node.this)
            shift = datetime.timedelta(days=days if isinstance(node, exp.Add) else -days)
            try:
                return None if inner is None else _within_years(inner[0] + shift, inner[1] + shift)
            except OverflowError:
                return None
        return None

    def _cast_bounds(self, node: exp.Cast) -> tuple[Time, Time] | None:
        """The bounds of a time cast to a date or a timestamp: the inner time's, as dates or midnights; a day wider
        on each side where the cast moves between a zoned and an unzoned time (the session's zone is at most a day
        off UTC), as PostgreSQL reads the one in the session's zone."""
        inner, kind = self.time_bounds(node.this), self.time_type(node.this)
        if inner is None or kind is None:
            return None
        target = TIME_CASTS[node.to.this]
        low, high = inner
        if (kind == "timestamptz") != (target == "timestamptz"):
            day = datetime.timedelta(days=1)
            low, high = low - day, high + day
        if target == "date":
            return _within_years(*(v.date() if isinstance(v, datetime.datetime) else v for v in (low, high)))
        return _within_years(*(datetime.datetime.combine(v, datetime.time()) if type(v) is datetime.date else v
                               for v in (low, high)))

    def _range_mul(self, node: exp.Mul) -> Range:
        a, b = self._operands(node, "this", "expression")
        corners = [x * y for x, y in product((a.lo, a.hi), (b.lo, b.hi))]
        return Range(min(corners), max(corners), a.integer and b.integer)

    def _range_div(self, node: exp.Div) -> Range:
        a, b = self._operands(node, "this", "expression")
        if b.integer and b.lo == 0 < b.hi or b.integer and b.lo < 0 == b.hi:  # NULLIF(b, 0) leaves 1 to b.hi
            b = Range(1, b.hi, True) if b.lo == 0 else Range(b.lo, -1, True)  # (or b.lo to -1): a COUNT divides
        # PostgreSQL truncates only when both operands have integer *types* (|a / b| <= |a|); integer-valued
        # floats and numerics (floor(x), round(x), casts) divide exactly, so their quotient is fractional
        if self.kind(node.this) == "integer" and self.kind(node.expression) == "integer":
            if b.lo <= 0 <= b.hi or not (a.bounded and b.bounded):  # a nonzero integer divisor may be ±1
                return Range(-a.magnitude, a.magnitude, True)
            # truncation is monotone, and a quotient is extreme at the corners when the divisor keeps its sign
            corners = [_truncated_quotient(x, y) for x, y in product((a.lo, a.hi), (b.lo, b.hi))]
            return Range(min(corners), max(corners), True)
        if b.lo <= 0 <= b.hi:
            if b.integer:  # a nonzero integer divisor has |b| >= 1
                return Range(-a.magnitude, a.magnitude, False)
            raise UnsupportedQuery(
                f"the divisor {to_sql(node.expression)} can be arbitrarily close to 0, "
                "so the quotient has no bound", _divisor_hint(node, b))
        corners = [x / y for x, y in product((a.lo, a.hi), (b.lo, b.hi))]
        return Range(min(corners), max(corners), False)

    def _range_mod(self, node: exp.Mod) -> Range:
        a, b = self._operands(node, "this", "expression")
        m = min(a.magnitude, b.magnitude)
        return Range(0.0 if a.lo >= 0 else -m, 0.0 if a.hi <= 0 else m, a.integer and b.integer)

    def _range_floor(self, node: exp.Floor) -> Range:
        (a,) = self._operands(node, "this")
        return Range(math.floor(a.lo), math.floor(a.hi), True)

    def _range_ceil(self, node: exp.Ceil) -> Range:
        (a,) = self._operands(node, "this")
        return Range(math.ceil(a.lo), math.ceil(a.hi), True)

    def _range_round(self, node: exp.Round) -> Range:
        (a,) = self._operands(node, "this")
        digits = node.args.get("decimals")
        number = digits.this if isinstance(digits, exp.Neg) else digits  # round(x, -2): to hundreds
        if digits is not None and not (isinstance(number, exp.Literal) and number.is_int):
            raise UnsupportedQuery("round()'s number of digits must be a whole-number constant",
                                   "write the digits as a constant: round(x, 2), or round(x, -2) for hundreds")
        column = self.column(node.this.unnest()) if isinstance(node.this.unnest(), exp.Column) else None
        if digits is not None and column is not None and _type_kind(column.type) == "float":
            raise InvalidQuery("function round(double precision, integer) does not exist",
                               f"round a numeric: round({to_sql(node.this)}::numeric, {to_sql(digits)})",
                               sqlstate="42883")  # as PostgreSQL, which rounds a double only to a whole number
        places = 0 if digits is None else -int(number.this) if isinstance(digits, exp.Neg) else int(number.this)
        if abs(places) > MAX_ROUND_DIGITS:  # a huge scale fails only on non-NULL values
            raise UnsupportedQuery(f"round()'s number of digits must be between -{MAX_ROUND_DIGITS} and "
                                   f"{MAX_ROUND_DIGITS}", "round to fewer digits, e.g. round(x, 2)")
        slack = 0.5 * 10 ** max(0, -places)
        return Range(a.lo - slack, a.hi + slack, a.integer or places <= 0)

    def _range_greatest(self, node: exp.Greatest) -> Range:
        parts = [self.numeric(e, "argument") for e in [node.this, *node.expressions]]
        return Range(max(p.lo for p in parts), max(p.hi for p in parts), all(p.integer for p in parts))

    def _range_least(self, node: exp.Least) -> Range:
        parts = [self.numeric(e, "argument") for e in [node.this, *node.expressions]]
        return Range(min(p.lo for p in parts), min(p.hi for p in parts), all(p.integer for p in parts))

    def _range_nullif(self, node: exp.Nullif) -> Range | None:
        self.value_range(node.expression)
        return self.value_range(node.this)

    def _range_coalesce(self, node: exp.Coalesce) -> Range | None:
        return self._hull([node.this, *node.expressions])

    def _range_case(self, node: exp.Case) -> Range | None:
        for branch in node.args.get("ifs", []):
            self.value_range(branch.this)  # the conditions
        if node.this is not None:
            self.value_range(node.this)
        results = [b.args["true"] for b in node.args.get("ifs", [])]
        if node.args.get("default") is not None:
            results.append(node.args["default"])
        return self._hull(results)

    def _range_if(self, node: exp.If) -> Range | None:
        self.value_range(node.this)
        return self._hull([node.args["true"], *([node.args["false"]] if node.args.get("false") else [])])

    def _hull(self, nodes: list[exp.Expression]) -> Range | None:
        ranges = [self.value_range(n) for n in nodes if not isinstance(n, exp.Null)]
        numeric = [r for r in ranges if r is not None]
        if not numeric:
            return None
        if len(numeric) != len(ranges):
            raise UnsupportedQuery("branches of CASE / COALESCE mix numbers with other types",
                                   "make every branch a number (CASE WHEN c THEN 1 ELSE 0 END) or every branch text")
        result = numeric[0]
        for r in numeric[1:]:
            result = result.hull(r)
        return result

    def _range_cast(self, node: exp.Cast) -> Range | None:
        target = node.to.this
        inner = self.value_range(node.this)
        if self.is_boolean(node.this) and target in (*INT_CAST_LIMITS, *FLOAT_CASTS):
            if target != exp.DataType.Type.INT:
                raise UnsupportedQuery(f"cannot cast type boolean to {to_sql(node.to).lower()}",
                                       f"cast it to integer: {to_sql(node.this)}::int")
            return Range(0, 1, True)  # true is 1, false 0
        if target in INT_CAST_LIMITS:
            if inner is None:
                raise UnsupportedQuery(f"cast of non-numeric {to_sql(node.this)} to an integer "
                                       "could fail on some values",
                                       "cast a numeric column, or compare the text as text: WHERE x = '42'")
            if not inner.bounded or inner.magnitude + 1 > INT_CAST_LIMITS[target]:
                raise UnsupportedQuery(f"{to_sql(node)} could overflow",
                                       "cast to bigint or double precision, or declare tighter bounds")
            # the nearest integers (PostgreSQL rounds, a half either way): an integer range keeps its bounds
            return Range(math.ceil(inner.lo - 0.5), math.floor(inner.hi + 0.5), True)
        if target in FLOAT_CASTS:
            if inner is None and not constant(node.this):
                raise UnsupportedQuery(f"cast of non-numeric {to_sql(node.this)} to a number "
                                       "could fail on some values",
                                       "cast a numeric column, or compare the text as text: WHERE x = '42'")
            if node.to.expressions:  # numeric(p, s) overflows on values with more digits than p - s
                return _within_precision(node, inner)
            source = self.kind(node.this)
            if inner is not None and source != "integer" and inner.magnitude > _cast_limit(node.to, source):
                raise UnsupportedQuery(f"{to_sql(node)} could overflow on some stored values",
                                       "declare bounds for the column")
            return inner if inner is not None else Range(-math.inf, math.inf)
        if target in (exp.DataType.Type.TEXT, exp.DataType.Type.VARCHAR):
            return None  # every value has a text form
        if target in (exp.DataType.Type.DATE, exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPTZ):
            if not (constant(node.this) or self._is_temporal(node.this)):
                raise UnsupportedQuery(f"{to_sql(node)} could fail on some stored values",
                                       "cast only dates and timestamps (or constants) to date/timestamp")
            return None
        raise UnsupportedQuery(f"cast to {to_sql(node.to)} is not supported",
                               "casts to integer, bigint, double precision, numeric, text and date are")

    def _is_timestamp(self, node: exp.Expression) -> bool:
        """Whether `node` is certainly a timestamp (with or without time zone), not a date."""
        if isinstance(node, exp.TimestampTrunc | exp.DateTrunc | exp.UnixToTime | exp.AtTimeZone):
            return True
        if isinstance(node, exp.Cast):
            return node.to.this in TIMESTAMP_CASTS
        column = self.column(node) if isinstance(node, exp.Column) else None
        return column is not None and column.type in ("timestamp", "timestamptz")

    def is_boolean(self, node: exp.Expression) -> bool:
        """Whether `node` is a boolean: a boolean column, a comparison, a pattern match, AND, OR, NOT, TRUE."""
        while isinstance(node, exp.Paren):
            node = node.this
        if isinstance(node, exp.Column):
            column = self.column(node)
            return column is not None and column.type == "boolean"
        return isinstance(node, (*PREDICATES, exp.Like, exp.ILike, exp.RegexpLike, exp.And, exp.Or, exp.Not,
                                 exp.Boolean))

    def _check_regex(self, node: exp.RegexpLike) -> None:
        """`x ~ 'pattern'`: a constant pattern every backend compiles alike (`patterns.check_regex`: PostgreSQL
        compiles it only when a row reaches it), matched against text."""
        pattern = node.expression
        if not isinstance(pattern, exp.Null):
            if not (isinstance(pattern, exp.Literal) and pattern.is_string):
                raise UnsupportedQuery(f"patterns must be string constants, not {to_sql(pattern)}",
                                       "write the pattern as a string constant: x ~ '^ab'")
            check_regex(pattern.this)
        operand = node.this
        if self.value_range(operand) is not None or self._is_temporal(operand) or self.is_boolean(operand):
            raise UnsupportedQuery(f"{to_sql(operand)} ~ … matches text, and {to_sql(operand)} is not text",
                                   f"cast it: CAST({to_sql(operand)} AS text) ~ '…'")

    def _is_temporal(self, node: exp.Expression) -> bool:
        return self.time_type(node) is not None

    def _zoned_type(self, node: exp.Expression) -> str | None:
        """The type of a time that AT TIME ZONE reads: `time_type`, or the type it is cast to (day::timestamp)."""
        inner = _uncast_time(node)
        if inner is node.unnest():
            return self.time_type(inner)
        return TIME_CASTS[node.unnest().to.this] if self.time_type(inner) is not None else None

    def _zoned_bounds(self, node: exp.AtTimeZone) -> tuple[Time, Time] | None:
        """`time_bounds` of a time at a zone PostgreSQL lists (`times.check_time_zones`): within a day of the time
        read, as every listed zone is within a day of UTC; the time itself where no offset applies (UTC, and a
        date or timestamptz read in a session at UTC), so that no empty period is released at either end."""
        inner = self.time_bounds(_uncast_time(node.this)) if self.time_type(node) is not None else None
        if inner is None:
            return None
        low, high = (datetime.datetime.combine(v, datetime.time()) if type(v) is datetime.date else v for v in inner)
        utc = node.args["zone"].name.lower() in UTC_ZONES and (
            self._zoned_type(node.this) == "timestamp" or (self.session_zone() or "").lower() in UTC_ZONES)
        slack = datetime.timedelta(days=0 if utc else 1)
        return _within_years(low - slack, high + slack)

    def _range_attimezone(self, node: exp.AtTimeZone) -> None:
        """Not a number: refused where the time it reads has no declared bounds (its shift could overflow)."""
        if self.time_type(node) is None:  # PostgreSQL's own error, whatever the data
            raise InvalidQuery(f"{to_sql(node)}: AT TIME ZONE reads a date or a time, and {to_sql(node.this)} is "
                               "neither", "convert a date or a timestamp: day AT TIME ZONE 'UTC'", sqlstate="42883")
        if self.time_bounds(node) is None:
            raise UnsupportedQuery(f"{to_sql(node)}: AT TIME ZONE is answered for a date or timestamp column with "
                                   "declared bounds (or a cast of one)",
                                   "declare lower and upper for the column in the privacy schema")
        return None

    def _range_widthbucket(self, node: exp.WidthBucket) -> Range:
        self._require_constant(node, ("min_value", "max_value", "num_buckets"), "width_bucket's bounds and count")
        operand = self.numeric_or_unbounded(node.this)
        bounds = [_constant_range(node.args[arg]) for arg in ("min_value", "max_value")]
        buckets = _integer_constant(node.args["num_buckets"])
        if None in bounds or any(b.magnitude > LIMIT for b in bounds) or buckets is None \
                or not 1 <= buckets <= MAX_BUCKETS or bounds[0].lo == bounds[1].lo:
            # an infinite operand lands in bucket count + 1, which must not overflow an integer
            raise UnsupportedQuery(f"width_bucket needs distinct numeric bounds within ±{LIMIT:.0e} and a "
                                   f"whole-number bucket count from 1 to {MAX_BUCKETS}",
                                   "e.g. width_bucket(x, 0, 100, 10)")
        if not operand.bounded:
            return Range(0, buckets + 1, True)
        # width_bucket is monotone in its operand: the buckets between those of the operand's ends, so that a
        # column declared in [0, 100] has no bucket 0 in width_bucket(x, 0, 100, 5)
        ends = [_width_bucket(v, bounds[0].lo, bounds[1].lo, buckets) for v in (operand.lo, operand.hi)]
        return Range(min(e[0] for e in ends), max(e[1] for e in ends), True)

    def numeric_or_unbounded(self, node: exp.Expression) -> Range:
        result = self.value_range(node)
        if result is None:
            raise UnsupportedQuery(f"{to_sql(node)} is not numeric",
                                   "use a numeric column, or count a condition: "
                                   "SUM(CASE WHEN x = 'a' THEN 1 ELSE 0 END)")
        return result

    def _range_sqrt(self, node: exp.Sqrt) -> Range:
        (a,) = self._operands(node, "this")
        return Range(math.sqrt(max(a.lo, 0)), math.sqrt(max(a.hi, 0)))

    def _range_ln(self, node: exp.Ln) -> Range:
        (a,) = self._operands(node, "this")
        if a.hi <= 0:
            raise UnsupportedQuery(f"ln({to_sql(node.this)}) is never defined",
                                   "take the logarithm of a positive expression, e.g. ln(x + 1) for x >= 0")
        low = math.log(a.lo) if a.lo > 0 else (0.0 if a.integer else math.log(5e-324))
        return Range(low, math.log(a.hi))

    def _range_exp(self, node: exp.Exp) -> Range:
        (a,) = self._operands(node, "this")
        if a.lo < -MAX_EXPONENT or a.hi > MAX_EXPONENT:  # PostgreSQL fails past a double's range (and below it)
            raise UnsupportedQuery(f"exp({to_sql(node.this)}) could overflow: its argument may reach "
                                   f"{a.lo if a.lo < -MAX_EXPONENT else a.hi:.3g}",
                                   f"take exp of an expression within ±{MAX_EXPONENT}, e.g. exp(AVG(ln(x + 1)))")
        return Range(math.exp(a.lo), math.exp(a.hi))

    def _range_sign(self, node: exp.Sign) -> Range:
        (a,) = self._operands(node, "this")
        return Range(math.copysign(a.lo != 0, a.lo), math.copysign(a.hi != 0, a.hi), True)

    def _range_cbrt(self, node: exp.Cbrt) -> Range:
        (a,) = self._operands(node, "this")
        return Range(math.copysign(abs(a.lo) ** (1 / 3), a.lo), math.copysign(abs(a.hi) ** (1 / 3), a.hi))

    def _range_pow(self, node: exp.Pow) -> Range:
        """power(x, c) of a constant exponent: PostgreSQL fails for a negative x and a fractional c, and for 0 and
        a negative c, so the declared range must exclude them; then the corners and 0 bound it."""
        (a,) = self._operands(node, "this")
        exponent = _constant_range(node.expression) if constant(node.expression) else None
        if exponent is None or exponent.lo != exponent.hi:
            raise UnsupportedQuery(f"power's exponent must be a constant, not {to_sql(node.expression)}",
                                   "e.g. power(x, 2)")
        c = exponent.lo
        if a.lo < 0 and not c.is_integer() or a.lo <= 0 and c < 0:
            raise UnsupportedQuery(f"power({to_sql(node.this)}, {c:g}) fails for some values of "
                                   f"{to_sql(node.this)} (from {a.lo:g})", "raise a positive expression, e.g. "
                                   "power(x + 1, 0.5) for x >= 0")
        points = [a.lo, a.hi] + ([0.0] if a.lo < 0 < a.hi else [])
        try:
            values = [math.pow(p, c) for p in points]
        except (OverflowError, ValueError):
            raise UnsupportedQuery(f"{to_sql(node)} could overflow", "narrow the declared bounds, or raise a "
                                   "smaller expression") from None
        return Range(min(values), max(values), a.integer and c.is_integer() and c >= 0)

    def _check_to_char(self, node: exp.TimeToStr) -> None:
        """to_char(date or timestamp, 'constant format'): text, NULL outside the engine's safe dates (a date past
        294276 AD would fail its cast to timestamp) as for ±infinity."""
        if not isinstance(node.args.get("format"), exp.Literal) or not node.args["format"].is_string:
            raise UnsupportedQuery("to_char needs a constant format", "e.g. to_char(day, 'YYYY-MM')")
        if not self._is_temporal(node.this):
            raise UnsupportedQuery(f"to_char of {to_sql(node.this)} is answered for dates and timestamps only",
                                   "group numbers by width_bucket or floor(x / w) instead")

    def _date_at_midnight(self, node: exp.Expression) -> Column | None:
        """The declared date column that `node` is, itself or cast to a timestamp (`day::timestamp`, at its
        midnight), else None."""
        node = node.unnest()
        if isinstance(node, exp.Cast) and node.to.this in (exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPTZ):
            node = node.this.unnest()
        column = self.column(node) if isinstance(node, exp.Column) else None
        return column if column is not None and column.type == "date" else None

    def _range_extract(self, node: exp.Extract) -> Range:
        field = node.this.name.upper()
        if field not in EXTRACT_RANGES:
            raise UnsupportedQuery(f"EXTRACT({field} ...) is not supported",
                                   "supported fields: " + ", ".join(EXTRACT_RANGES))
        if field in TIME_FIELDS and not self._is_timestamp(node.expression):
            column = self.column(node.expression) if isinstance(node.expression, exp.Column) else None
            if column is not None and column.type == "date":  # PostgreSQL: unit "hour" not supported for type date
                raise UnsupportedQuery(f"EXTRACT({field} ...) of {to_sql(node.expression)}, a date, which has no "
                                       f"{field.lower()}", f"group a date by a field it has: EXTRACT(DOW FROM "
                                       f"{to_sql(node.expression)}) or date_trunc('week', {to_sql(node.expression)})")
            raise UnsupportedQuery(f"EXTRACT({field} ...) needs a timestamp, and "
                                   f"{to_sql(node.expression)} may be a date",
                                   f"cast it: EXTRACT({field} FROM CAST(x AS timestamp))")
        self.value_range(node.expression)
        declared = self._declared_epoch(node)
        if declared is not None and field == "YEAR":  # the years of the clamped column's bounds; a timestamptz's
            # year is its session zone's, which may be a year before or after UTC's at the ends
            spare = 1 if declared.type == "timestamptz" else 0
            years = [temporal_value(declared.type, v).year for v in (declared.lower, declared.upper)]
            return Range(years[0] - spare, years[1] + spare, True)
        if declared is not None:  # the guard clamps the column to its declared bounds
            per_unit = 86_400 if declared.type == "date" else 1  # the bounds of a date are kept in days
            return Range(declared.lower * per_unit, declared.upper * per_unit, declared.type == "date")
        truncated = self._truncated_epoch(node)
        if truncated is not None:  # a period's start: at most one period before the clamped column, a day of time
            # zones either side (a date truncates at its midnight in the session's zone)
            column, unit = truncated
            per_unit = 86_400 if column.type == "date" else 1
            before = PERIOD_DAYS[unit] * 86_400 + 86_400
            return Range(column.lower * per_unit - before, column.upper * per_unit + 86_400, unit in WHOLE_SECONDS)
        column = self._date_at_midnight(node.expression)
        if column is not None and field in TIME_FIELDS:  # a date as a time is at midnight: hour and minute 0
            return Range(0, 0, True)
        days = declared_days(column) if column is not None else None
        if days is not None and field in CALENDAR_FIELDS:  # the fields its days give: 52 weeks in 2024, not 53
            from dpsql.postprocess.evaluate import DATE_FIELDS  # (post-processing reads the plan analysis makes)

            values = {DATE_FIELDS[field](day) for day in days}
            return Range(min(values), max(values), True)
        lo, hi = EXTRACT_RANGES[field]
        return Range(lo, hi, field != "EPOCH")  # seconds since 1970 have fractions

    def _declared_epoch(self, node: exp.Extract) -> Column | None:
        """For EXTRACT(EPOCH FROM c) of a date or timestamp column with declared bounds (Grafana's time axis,
        `extract(epoch from day) * 1000`), or its YEAR (Tableau's YEAR(day) key), the column: its seconds since
        1970 and its years lie within its bounds', which the guard enforces by clamping it. (A date's epoch is its
        midnight, a timestamp's its nominal or absolute seconds, as the bounds are kept: `temporal_number`.) None
        for other fields and operands."""
        operand = node.expression
        # a date or timestamp cast to a timestamp keeps its seconds: `now() - CAST(day AS timestamp)` spelled apart
        nominal = isinstance(operand, exp.Cast) and operand.to.this == exp.DataType.Type.TIMESTAMP
        if node.this.name.upper() not in ("EPOCH", "YEAR") or not isinstance(operand.this if nominal else operand,
                                                                           exp.Column):
            return None
        column = self.column(operand.this if nominal else operand)
        if nominal and column is not None and column.type not in ("date", "timestamp"):
            return None
        return column if column is not None and column.is_temporal and column.bounded else None

    def _truncated_epoch(self, node: exp.Extract) -> tuple[Column, str] | None:
        """For EXTRACT(EPOCH FROM date_trunc(unit, c)) of a date or timestamp column with declared bounds (Grafana's
        and analysts' time axis of weeks, months), the column and the unit: the guard clamps the column inside
        the truncation, so the period's start lies within a period of its bounds. None for anything else."""
        operand = node.expression.unnest()
        if node.this.name.upper() != "EPOCH" or not isinstance(operand, exp.TimestampTrunc | exp.DateTrunc):
            return None
        unit, inner = operand.args.get("unit"), operand.this
        unit_name = unit.name.lower() if unit is not None else ""
        column = self.column(inner) if isinstance(inner, exp.Column) else None
        if unit_name not in PERIOD_DAYS or column is None or not column.is_temporal or not column.bounded:
            return None
        return column, unit_name

    def _range_length(self, node: exp.Length) -> Range:
        self.value_range(node.this)
        return Range(0, 2**30, True)

    def _range_strposition(self, node: exp.StrPosition) -> Range:
        _check_text_constants(node)
        self.value_range(node.this)
        return Range(0, 2**30, True)


def _within_precision(node: exp.Cast, inner: Range | None) -> Range:
    """x::numeric(p, s) of a bounded x: PostgreSQL rounds it to s digits and fails where it then reaches
    10^(p - s), so the range, clamped by the guard, must stay below that (Tableau and analysts write
    amount::numeric(10, 2)); the range rounded to s digits."""
    digits = [_integer_constant(p.this if isinstance(p, exp.DataTypeParam) else p) for p in node.to.expressions]
    precision, scale = (digits + [0])[:2]
    if precision is None or scale is None or not 0 <= scale <= precision or inner is None or not inner.bounded \
            or inner.magnitude + 0.5 * 10.0 ** -scale >= 10.0 ** (precision - scale):
        raise UnsupportedQuery(f"cast to {to_sql(node.to)} could overflow on some values",
                               "cast to numeric without precision, round() the value, or declare bounds that fit")
    return Range(round(inner.lo, scale), round(inner.hi, scale), inner.integer or scale == 0)


def _cast_limit(to: exp.DataType, source: str) -> float:
    """Largest magnitude a cast from a value of kind `source` accepts without an overflow error (numeric(p, s) is
    refused outright): real holds 3.4e38, double precision 1.7e308 (only a numeric can be larger), numeric any
    float including ±Infinity and NaN."""
    if to.this == exp.DataType.Type.FLOAT:  # FLOAT is PostgreSQL's real
        return 3.4e38
    if to.this == exp.DataType.Type.DOUBLE and source == "numeric":
        return 1.7e308
    return math.inf


def _integer_constant(node: exp.Expression | None) -> int | None:
    """The value of an integer literal (or its negation), else None."""
    value = _constant_range(node) if node is not None else None
    return int(value.lo) if value is not None and value.integer else None


def _check_substring(node: exp.Substring) -> None:
    start, length = node.args.get("start"), node.args.get("length")
    if isinstance(start, exp.Literal) and start.is_string:
        raise UnsupportedQuery("substring with a regular expression is not supported",
                               "use substring(text, start, length) or LIKE")
    for name, value, low in (("start", start, -MAX_TEXT_POSITION), ("length", length, 0)):
        if value is None:
            continue
        number = _integer_constant(value)
        if number is None or not low <= number <= MAX_TEXT_POSITION:
            raise UnsupportedQuery(f"substring's {name} must be a whole-number constant between {low} and "
                                   f"{MAX_TEXT_POSITION}, not {to_sql(value)}", "e.g. substring(x, 1, 3)")


# text functions whose other arguments must be constants PostgreSQL and the other backends read alike: (argument,
# what it must be): a non-empty text, any text, or a whole number from the low end to MAX_TEXT_POSITION
TEXT_CONSTANTS = (exp.Replace, exp.SplitPart, exp.StrPosition, exp.Pad, exp.Right)
_TEXT_ARGUMENTS: dict[type[exp.Expression], tuple[str, tuple[tuple[str, str, str | int], ...]]] = {
    exp.Replace: ("replace", (("expression", "search", "non-empty"), ("replacement", "replacement", "text"))),
    exp.SplitPart: ("split_part", (("delimiter", "delimiter", "non-empty"), ("part_index", "field number", 1))),
    exp.StrPosition: ("strpos", (("substr", "substring", "text"),)),
    exp.Pad: ("lpad and rpad", (("expression", "length", 0), ("fill_pattern", "fill", "non-empty"))),
    exp.Right: ("right", (("expression", "length", 0),)),
}
MAX_PAD = 10_000  # a padded text longer than this would only fill memory


def _check_text_constants(node: exp.Expression) -> None:
    """replace(x, 'a', 'b'), split_part(x, '-', 2), strpos(x, 'a'), lpad/rpad(x, 3, '0') and right(x, 2): the other
    arguments constants (an empty search, delimiter or fill is read differently by the backends; a part index of 0
    fails in PostgreSQL), so that only x depends on the data."""
    name, arguments = _TEXT_ARGUMENTS[type(node)]
    for argument, what, rule in arguments:
        value = node.args.get(argument)
        if value is None and argument == "fill_pattern":
            continue  # a space
        shown = to_sql(value) if value is not None else "none"
        if isinstance(rule, int):
            number = _integer_constant(value) if value is not None else None
            top = MAX_PAD if isinstance(node, exp.Pad) else MAX_TEXT_POSITION
            if number is None or not rule <= number <= top:
                raise UnsupportedQuery(f"{name}'s {what} must be a whole-number constant from {rule} to {top:,}, "
                                       f"not {shown}", "e.g. split_part(x, '-', 1), lpad(x, 3, '0'), right(x, 2)")
        elif not (isinstance(value, exp.Literal) and value.is_string and (rule == "text" or value.this)):
            raise UnsupportedQuery(f"{name}'s {what} must be a {'non-empty ' * (rule != 'text')}text constant, not "
                                   f"{shown}", "e.g. replace(x, '-', ' '), split_part(x, '-', 1), strpos(x, 'a')")


def _check_like_pattern(node: exp.Like | exp.ILike) -> None:
    pattern = node.expression
    if isinstance(pattern, exp.Null):
        return
    if not (isinstance(pattern, exp.Literal) and pattern.is_string):
        raise UnsupportedQuery(f"LIKE patterns must be string constants, not {to_sql(pattern)}",
                               "write the pattern as a string constant: x LIKE 'A%'")
    trailing = len(pattern.this) - len(pattern.this.rstrip("\\"))
    if trailing % 2:
        raise UnsupportedQuery(f"the LIKE pattern {to_sql(pattern)} ends with its escape "
                               "character \\", "escape it (\\\\) or remove it")


TRUNC_SPANS = {unit: datetime.timedelta(days=days) for unit, days in (
    ("microseconds", 1), ("milliseconds", 1), ("second", 1), ("minute", 1), ("hour", 1), ("day", 1), ("week", 7),
    ("month", 31), ("quarter", 92), ("year", 366), ("decade", 3653), ("century", 36525),
    ("millennium", 365250))}  # the most date_trunc moves a time back, with a day to spare


TIME_CLAMP = "dpsql_time_clamp"  # meta flag of a time clamped to its declared bounds (`_clamped_times`)


def _ancestors(node: exp.Expression):
    while node.parent is not None:
        node = node.parent
        yield node


def _uncast_time(node: exp.Expression) -> exp.Expression:
    """The time under a cast to date, timestamp or timestamptz (`day::timestamp AT TIME ZONE 'UTC'`): its bounds are
    the cast's, read as dates or naive datetimes; anything else as it is."""
    node = node.unnest()
    if isinstance(node, exp.Cast) and node.to.this in TIME_CASTS:
        return node.this.unnest()
    return node


def declared_days(column: Column) -> list[datetime.date] | None:
    """The days of a date column with declared bounds (the guard clamps it to them), where they are few enough to
    walk (`WALKED_DAYS`); None for any other column."""
    if column.type != "date" or not column.bounded or column.upper - column.lower > WALKED_DAYS:
        return None
    first = datetime.date(1970, 1, 1) + datetime.timedelta(days=int(column.lower))
    return [first + datetime.timedelta(days=n) for n in range(int(column.upper - column.lower) + 1)]


def _within_years(low: Time, high: Time) -> tuple[Time, Time] | None:
    """(low, high) where both lie within years 1 to 9999 (every backend's range, and Python's), else None."""
    return (low, high) if low.year > datetime.MINYEAR and high.year < datetime.MAXYEAR else None


def _check_trunc(node: exp.Expression) -> None:
    unit = node.args.get("unit")
    if node.args.get("zone") is not None:
        raise UnsupportedQuery("date_trunc with a time zone is not supported",
                               "truncate in the session's time zone: SET TimeZone = 'Europe/Paris', then "
                               "date_trunc('day', x)")
    if not isinstance(unit, exp.Var | exp.Literal) or unit.name.lower() not in TRUNC_UNITS:
        # as the analyst wrote it: sqlglot reads the unit's string as an upper-cased keyword
        shown = f"'{unit.name.lower()}'" if isinstance(unit, exp.Var | exp.Literal) else to_sql(unit) \
            if unit is not None else "none"
        raise UnsupportedQuery(f"date_trunc unit {shown} is not one PostgreSQL knows",
                               "use one of " + ", ".join(TRUNC_UNITS))


def _check_constant(node: exp.Expression) -> None:
    """The partial functions of a constant expression, checked as those of a column's are: PostgreSQL folds an
    immutable constant when it plans the query (a failure then is refused unpaid, whatever the data), but computes
    a stable one (date_trunc of now(), a timestamptz) only where a row reaches it, so its failure would tell
    whether any row does."""
    for inner in node.walk():
        if isinstance(inner, exp.TimestampTrunc | exp.DateTrunc):
            _check_trunc(inner)
        elif isinstance(inner, exp.Substring):
            _check_substring(inner)
        elif isinstance(inner, exp.Like | exp.ILike):
            _check_like_pattern(inner)
        elif isinstance(inner, exp.RegexpLike) and isinstance(inner.expression, exp.Literal):
            check_regex(inner.expression.this)


def _constant_range(node: exp.Expression) -> Range | None:
    if isinstance(node, exp.Paren):
        return _constant_range(node.this)
    if isinstance(node, exp.Cast) and (node.to.this in INT_CAST_LIMITS or node.to.this in FLOAT_CASTS
                                       and not node.to.expressions):
        inner = _constant_range(node.this)  # a number cast to a number (Tableau counts rows as SUM(CAST(1 AS
        if inner is None or inner.lo != inner.hi:  # BIGINT))); to an integer it rounds, as PostgreSQL does
            return None
        if node.to.this in INT_CAST_LIMITS:  # a fraction rounds up or down (a half: numeric away from zero,
            low, high = math.floor(inner.lo), math.ceil(inner.lo)  # a float to even)
            return Range(low, high, True) if max(abs(low), abs(high)) <= INT_CAST_LIMITS[node.to.this] else None
        return Range(inner.lo, inner.hi, False)
    if isinstance(node, exp.Literal) and not node.is_string:
        value = float(node.to_py())
        return Range(value, value, float(value).is_integer() and "." not in node.this)
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
        value = -float(node.this.to_py())
        return Range(value, value, value.is_integer() and "." not in node.this.this)
    if isinstance(node, exp.Extract) and node.this.name.upper() == "EPOCH":
        seconds = _epoch_constant(node.expression)
        return None if seconds is None else Range(seconds - 1e-6, seconds + 1e-6, False)
    return None


def _epoch_constant(node: exp.Expression) -> float | None:
    """EXTRACT(EPOCH FROM …) of a constant time, as PostgreSQL computes it (a date at its midnight, a timestamp
    nominally, a timestamptz written with its offset absolutely: `now()` as the clock read it), within the float's
    microsecond; None for a timestamptz without an offset (read in the session's zone) or anything else."""
    node = node.unnest()
    if not (isinstance(node, exp.Cast) and isinstance(node.this, exp.Literal) and node.this.is_string):
        return None
    kind = node.to.this
    try:
        if kind == exp.DataType.Type.DATE:
            moment = datetime.datetime.combine(datetime.date.fromisoformat(node.this.this.strip()), datetime.time())
        elif kind in (exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPTZ):
            moment = datetime.datetime.fromisoformat(node.this.this.strip())
        else:
            return None
    except ValueError:
        return None
    if moment.tzinfo is None and kind == exp.DataType.Type.TIMESTAMPTZ:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)).timestamp()


def _date_constant(node: exp.Expression) -> datetime.date | None:
    """The date a constant `DATE '2024-01-31'` (or '2024-01-31'::date, CURRENT_DATE as the clock read it) is."""
    node = node.unnest()
    if not (isinstance(node, exp.Cast) and node.to.this == exp.DataType.Type.DATE
            and isinstance(node.this, exp.Literal) and node.this.is_string):
        return None
    try:
        return datetime.date.fromisoformat(node.this.this.strip())
    except ValueError:
        return None


MAX_EXPONENT = 700  # exp() of more overflows a double (of less, it underflows, which PostgreSQL also refuses)
MAX_DAYS = 3_000_000  # a shift of more days would leave every date dpsql reads (years 1 to 9999)


def _whole_days(node: exp.Expression) -> int | None:
    """The whole number a constant `node` is, as days added to a date (`day + 7`); None for anything else."""
    value = _constant_range(node) if constant(node) else None
    if value is None or not value.integer or value.lo != value.hi or abs(value.lo) > MAX_DAYS:
        return None
    return int(value.lo)


def _truncated_quotient(x: float, y: float) -> int:
    """x / y for integers as PostgreSQL computes it: truncated toward zero, in exact integer arithmetic."""
    quotient = abs(int(x)) // abs(int(y))
    return quotient if (x >= 0) == (y > 0) else -quotient


def _type_kind(sql_type: str) -> str:
    """The kind (see `Expressions.kind`) of a declared or cast-to PostgreSQL type."""
    if sql_type in INTEGER_TYPES or sql_type in ("int", "int2", "int4", "int8"):
        return "integer"
    if sql_type.startswith(("numeric", "decimal")):
        return "numeric"
    return "float"


def _divisor_hint(quotient: exp.Div, divisor: Range) -> str:
    """How to divide by a non-negative value that may be 0 or near it: by GREATEST(it, 1), the analyst's own
    quotient written so (the operand of a NULLIF(x, 0) divisor, which then need not exclude 0 itself)."""
    if divisor.lo < 0:
        return "divide by an expression whose declared range excludes 0, e.g. GREATEST(x, 1)"
    below = quotient.expression.unnest()
    if isinstance(below, exp.Nullif) and isinstance(below.expression, exp.Literal) and below.expression.name == "0":
        below = below.this
    return (f"divide by a value whose range excludes 0: {to_sql(quotient.this)} / GREATEST({to_sql(below)}, 1) "
            "(1, or the smallest divisor that means something for your data)")
