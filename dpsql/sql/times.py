"""Times: constant date and time arithmetic folded to literals before anything else reads the query.

- The clock (now(), current_timestamp, current_date, localtimestamp) is fixed when the query arrives: the time is
  not data, it is part of the query and of its cache key.
- A constant date or timestamp ± an interval or a number of days (`DATE '2024-07-01' - INTERVAL '3 months'`,
  `current_date - 7`) becomes one literal, computed as PostgreSQL computes it: a date ± days is a date, a date ±
  an interval a timestamp, months added first with the day clamped to the month's end, then days, then seconds.
- `make_date(y, m, d)` and `make_timestamp(y, m, d, h, min, s)` of constants become the date or timestamp they
  make; `to_timestamp(text, format)` and `to_date(text, format)` of constants (how Superset writes its time
  range) become the literal they read, `to_timestamp(seconds)` the UTC instant: `to_timestamp` is a timestamptz, read as
  PostgreSQL reads one without an offset, in the session's TimeZone.
- A comparison of a column ± a fixed-length step with a constant time (`day + 7 > DATE '2024-12-01'`,
  `day + INTERVAL '12 hours' >= ...`) is solved for the column (`day > DATE '2024-11-24'`), which holds exactly for
  steps of whole days, hours, minutes and seconds on dates and timestamps. Months (not invertible: 31 March minus a
  month is 29 February, and so is 29 March minus one) and day steps on a timestamptz column (a day is not 24 hours
  across a change of daylight saving time) are left as written, and refused later as any interval is.
"""

from __future__ import annotations

import calendar
import datetime
import re
from collections.abc import Callable
from dataclasses import dataclass

from sqlglot import exp

from dpsql.errors import InvalidConstant, UnsupportedQuery
from dpsql.schema import PrivacySchema

CLOCKS = (exp.CurrentTimestamp, exp.CurrentDate, exp.Localtimestamp)
READERS = (exp.StrToTime, exp.StrToDate, exp.UnixToTime)  # to_timestamp(text, format), to_date, to_timestamp(n)
MAX_STEP = 100_000  # of any unit: further is no date anyone means, and would overflow Python's dates
COMPARISONS = (exp.GT, exp.GTE, exp.LT, exp.LTE, exp.EQ, exp.NEQ)
UNITS = {"year": ("months", 12), "month": ("months", 1), "mon": ("months", 1), "week": ("days", 7),
         "day": ("days", 1), "hour": ("seconds", 3600), "minute": ("seconds", 60), "min": ("seconds", 60),
         "second": ("seconds", 1), "sec": ("seconds", 1)}
INTERVAL_PART = re.compile(r"\s*([+-]?\d+)\s*([a-z]+)\s*", re.IGNORECASE)

Time = datetime.date | datetime.datetime


@dataclass(frozen=True)
class Step:
    """An interval as PostgreSQL keeps one: months, days and seconds, each added in that order."""

    months: int = 0
    days: int = 0
    seconds: int = 0

    def negated(self) -> Step:
        return Step(-self.months, -self.days, -self.seconds)

    def added_to(self, value: Time) -> Time:
        if type(value) is datetime.date:
            value = datetime.datetime.combine(value, datetime.time())  # date + interval is a timestamp
        if self.months:
            month = value.month - 1 + self.months
            year, month = value.year + month // 12, month % 12 + 1
            value = value.replace(year=year, month=month, day=min(value.day, calendar.monthrange(year, month)[1]))
        return value + datetime.timedelta(days=self.days, seconds=self.seconds)


def fold_times(tree: exp.Select, now: datetime.datetime | None, schema: PrivacySchema) -> exp.Select:
    """`tree` with its constant times folded to literals (the clock read as `now`, UTC) and comparisons of a
    column ± a step solved for the column."""
    if tree.find(exp.Add, exp.Sub, exp.TimestampFromParts, *CLOCKS, *READERS) is None and not any(
            node.name.lower() == "make_date" for node in tree.find_all(exp.Anonymous)):
        return tree  # most queries: nothing to fold
    timestamptz = _timestamptz_names(tree, schema)

    def fold(node: exp.Expression) -> exp.Expression:
        if isinstance(node, READERS):
            return _read(node) or node
        if isinstance(node, exp.Anonymous | exp.TimestampFromParts):
            return _made(node) or node
        if isinstance(node, COMPARISONS):
            node = _solved(node, now, timestamptz)
        if not isinstance(node, (exp.Add, exp.Sub, exp.Cast, exp.Paren, *CLOCKS)) or not _worth_folding(node):
            return node
        value = time_value(node, now)
        return node if value is None else literal(value)
    return tree.transform(fold, copy=False)


def _worth_folding(node: exp.Expression) -> bool:
    """Only what reads the clock or does arithmetic: a plain date literal is left as the analyst wrote it."""
    return node.find(*CLOCKS) is not None or node.find(exp.Add, exp.Sub) is not None


def time_value(node: exp.Expression, now: datetime.datetime | None) -> Time | None:
    """The value of a constant time expression, as PostgreSQL computes it, or None."""
    if isinstance(node, exp.Paren):
        return time_value(node.this, now)
    if isinstance(node, CLOCKS) and not node.args and now is not None:
        return now.date() if isinstance(node, exp.CurrentDate) else \
            now.replace(tzinfo=None) if isinstance(node, exp.Localtimestamp) else now
    if isinstance(node, exp.Cast):
        return _cast_value(node, now)
    if isinstance(node, exp.Add | exp.Sub):
        value, step = time_value(node.this, now), interval_step(node.expression)
        if value is None or step is None:
            return None
        step = step if isinstance(node, exp.Add) else step.negated()
        if isinstance(node.expression, exp.Literal):  # date ± integer is a date
            return value + datetime.timedelta(days=step.days) if type(value) is datetime.date else None
        if isinstance(value, datetime.datetime) and value.tzinfo is not None and (step.months or step.days):
            return None if now is None or not isinstance(node.this, CLOCKS) else step.added_to(value)
        return step.added_to(value)
    return None


def _cast_value(node: exp.Cast, now: datetime.datetime | None) -> Time | None:
    """A date or timestamp literal (ISO 8601, as PostgreSQL reads it in any DateStyle), or a cast of a constant
    time to a date."""
    inner = node.this
    if node.to.is_type("date"):
        if isinstance(inner, exp.Literal) and inner.is_string:
            return _iso(datetime.date.fromisoformat, inner.this)
        value = time_value(inner, now)
        return value.date() if isinstance(value, datetime.datetime) else value
    if node.to.is_type("timestamp", "timestamptz") and isinstance(inner, exp.Literal) and inner.is_string:
        value = _iso(datetime.datetime.fromisoformat, inner.this)
        if value is None or (value.tzinfo is not None) != node.to.is_type("timestamptz"):
            return None  # a timestamptz without an offset is read in the session's TimeZone: not folded here
        return value
    return None


def _read(node: exp.Expression) -> exp.Expression | None:
    """The literal that to_timestamp / to_date of constants reads, or None (then PostgreSQL reads it, or says
    why before anything is charged). sqlglot has turned PostgreSQL's format into strptime's."""
    text, form = node.this, node.args.get("format")
    if isinstance(node, exp.UnixToTime):
        if not (isinstance(text, exp.Literal) and not text.is_string) or node.args.get("scale") is not None:
            return None
        try:
            return literal(datetime.datetime.fromtimestamp(float(text.this), datetime.UTC))
        except (ValueError, OverflowError, OSError):
            return None
    if not (isinstance(text, exp.Literal) and text.is_string and isinstance(form, exp.Literal) and form.is_string):
        return None
    try:
        value = datetime.datetime.strptime(text.this, form.this)
    except ValueError:
        return None
    if isinstance(node, exp.StrToDate):
        return literal(value.date())
    return exp.cast(exp.Literal.string(value.isoformat(sep=" ")), "timestamptz")  # in the session's TimeZone


def _made(node: exp.Expression) -> exp.Expression | None:
    """The literal that make_date(y, m, d) or make_timestamp(y, m, d, h, min, s) of whole-number constants makes
    (of years after 1 BC), or None (PostgreSQL then computes it when it plans the query, both are immutable);
    one no calendar has (30 February) fails as PostgreSQL's does, SQLSTATE 22008, before anything is charged."""
    if isinstance(node, exp.Anonymous):
        if node.name.lower() != "make_date" or len(node.expressions) != 3:
            return None
        parts = node.expressions
    else:
        parts = [node.args.get(k) for k in ("year", "month", "day", "hour", "min", "sec")]
        if any(node.args.get(k) is not None for k in ("zone", "milli", "nano")):
            return None
    if not all(isinstance(p, exp.Literal) and not p.is_string and p.this.isdigit() for p in parts):
        return None
    try:
        value = datetime.datetime(*(int(p.this) for p in parts)) if len(parts) == 6 else \
            datetime.date(*(int(p.this) for p in parts))
    except ValueError:
        shown = "-".join(p.this for p in parts[:3]) + (" " + ":".join(p.this for p in parts[3:]) if parts[3:] else "")
        raise InvalidConstant(f"{'date' if len(parts) == 3 else 'timestamp'} field value out of range: {shown}; "
                              "nothing was run or charged", "correct the constant, e.g. make_date(2024, 2, 29)",
                              sqlstate="22008") from None
    return literal(value)


def _iso(parse, text: str) -> Time | None:
    try:
        return parse(text.strip())
    except ValueError:
        return None  # PostgreSQL reads it, or says why (22007, 22008) before anything is charged


def interval_step(node: exp.Expression) -> Step | None:
    """`INTERVAL 'n unit ...'`, or an integer (days, added to a date); None for anything else, or a step of
    MAX_STEP or more of any unit."""
    if isinstance(node, exp.Literal) and not node.is_string and node.this.isdigit() and int(node.this) < MAX_STEP:
        return Step(days=int(node.this))
    if not isinstance(node, exp.Interval) or not isinstance(node.this, exp.Literal):
        return None
    text = node.this.this + (f" {node.args['unit'].name}" if node.args.get("unit") is not None else "")
    parts = Step()
    position = 0
    for found in INTERVAL_PART.finditer(text):
        if found.start() != position:
            return None
        position = found.end()
        amount, unit = int(found.group(1)), found.group(2).lower().removesuffix("s")
        if unit not in UNITS or abs(amount) >= MAX_STEP:
            return None
        field, factor = UNITS[unit]
        parts = Step(**{**parts.__dict__, field: getattr(parts, field) + amount * factor})
    return parts if position == len(text) and position else None


def _solved(node: exp.Expression, now: datetime.datetime | None, timestamptz: set[str]) -> exp.Expression:
    """`column ± step op constant` as `column op constant ∓ step` (or mirrored), where that holds exactly."""
    for side, other in (("this", "expression"), ("expression", "this")):
        moving, constant = node.args[side], node.args[other]
        if not (isinstance(moving, exp.Add | exp.Sub) and isinstance(moving.this, exp.Column)):
            continue
        step, value = interval_step(moving.expression), time_value(constant, now)
        if step is None or value is None or step.months or (step.days and moving.this.name in timestamptz):
            continue
        if isinstance(moving.expression, exp.Literal) and type(value) is not datetime.date:
            continue  # column + integer is date arithmetic only
        step = step.negated() if isinstance(moving, exp.Add) else step
        moved = value + datetime.timedelta(days=step.days) if isinstance(moving.expression, exp.Literal) \
            else step.added_to(value)
        return node.__class__(**{side: moving.this, other: literal(moved)})
    return node


def _timestamptz_names(tree: exp.Select, schema: PrivacySchema) -> set[str]:
    """Names of timestamptz columns of the tables the query reads (a column is matched by name alone: any table
    holding one of that name keeps day steps off it)."""
    names = {t.name for t in tree.find_all(exp.Table)}
    return {c.name for t in schema.tables.values() if t.name in names for c in t.columns.values()
            if c.type == "timestamptz"}


def literal(value: Time) -> exp.Expression:
    if isinstance(value, datetime.datetime):
        return exp.cast(exp.Literal.string(value.isoformat(sep=" ")), "timestamptz" if value.tzinfo else "timestamp")
    return exp.cast(exp.Literal.string(value.isoformat()), "date")


__all__ = ["CLOCKS", "fold_times", "literal", "time_value"]


def check_time_zones(tree: exp.Select, listed: Callable[[], frozenset[str] | None]) -> None:
    """Refuse, before anything is charged, AT TIME ZONE with a zone that PostgreSQL does not list (`listed()`, lower
    case, as `Backend.time_zone_names` reads them, asked for only where a zone is named; None where the backend
    lists none). PostgreSQL would fail on it only where a row reaches it, after the charge. A listed name or
    abbreviation is within a day of UTC, which `Expressions.time_bounds` allows for; a POSIX zone ('UTC+100') may
    be days off and is refused with the rest."""
    zones = [node.args["zone"].name for node in tree.find_all(exp.AtTimeZone)]
    names = listed() if zones else None
    for zone in zones:
        if names is None:
            raise UnsupportedQuery(f"AT TIME ZONE '{zone}' is answered on PostgreSQL only",
                                   "group by the time as stored: date_trunc('month', day)")
        if zone.lower() not in names:
            raise InvalidConstant(f'time zone "{zone}" is not one PostgreSQL lists in pg_timezone_names or '
                                  "pg_timezone_abbrevs; nothing was run or charged",
                                  "name a listed zone, e.g. AT TIME ZONE 'America/New_York' or 'UTC'",
                                  sqlstate="22023")
