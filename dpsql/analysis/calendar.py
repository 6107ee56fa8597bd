"""The public values of `date_trunc(unit, column)` over a column with declared bounds: the periods the bounds
span, computed as PostgreSQL computes them, so a quarterly or monthly GROUP BY releases every period like a
declared domain instead of paying for partition selection.

PostgreSQL truncates a date or a timestamptz in the session's time zone and returns a timestamptz (a date is
read as its midnight there); a timestamp is truncated as it stands and stays a timestamp. Weeks start on Monday
(ISO). The periods are computed in the backend session's zone (`time_zone`), the one that runs the query; a
value the data holds outside the declared bounds falls in no period and is not released, as a value outside a
declared domain. Units finer than a day apply to timestamps only (a date has no time; for a timestamptz they
would meet daylight-saving gaps), and the coarser than a decade are left to partition selection.
"""

from __future__ import annotations

import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlglot import exp

from dpsql.schema.model import temporal_number, temporal_value

DAY_UNITS = ("day", "week", "month", "quarter", "year", "decade")
CLOCK_UNITS = {"minute": datetime.timedelta(minutes=1), "hour": datetime.timedelta(hours=1)}


def periods(type_name: str, lower: float, upper: float, unit: str, time_zone: str | None,
            limit: int) -> tuple | None:
    """The values of date_trunc(unit, c) for c in [lower, upper] (as `temporal_number` keeps bounds), in the
    Python types the backend returns them as; None when they are not computed here or number more than
    `limit`."""
    unit = unit.lower()
    zone = _zone(time_zone) if type_name in ("date", "timestamptz") else None
    if type_name != "timestamp" and zone is None:
        return None
    low, high = _local(type_name, lower, zone), _local(type_name, upper, zone)
    found = []
    if unit in DAY_UNITS:
        day = _start(low.date(), unit)
        while day <= high.date():
            found.append(datetime.datetime.combine(day, datetime.time(), zone))
            if len(found) > limit:
                return None
            try:
                day = _next(day, unit)
            except ValueError:  # past year 9999
                break
    elif unit in CLOCK_UNITS and type_name == "timestamp":
        step = CLOCK_UNITS[unit]
        moment = low.replace(second=0, microsecond=0, **({"minute": 0} if unit == "hour" else {}))
        if (high - moment) / step >= limit:
            return None
        while moment <= high:
            found.append(moment)
            moment += step
    else:
        return None
    return tuple(found)


def calendar_number(type_name: str, node: exp.Expression, time_zone: str | None) -> float | None:
    """A date or timestamp constant ('2024-06-01', DATE '2024-06-01', TIMESTAMP '…') compared with a column of
    `type_name`, as `temporal_number` keeps that column's bounds; None when it is not one (then the condition
    narrows nothing). A date compared with a timestamp column is its midnight, in the session's zone for a
    timestamptz, as PostgreSQL casts it; a time compared with a date column is days and their fraction."""
    if isinstance(node, exp.Cast) and node.to.this in (exp.DataType.Type.DATE, exp.DataType.Type.TIMESTAMP,
                                                       exp.DataType.Type.TIMESTAMPTZ):
        node = node.this
    if not (isinstance(node, exp.Literal) and node.is_string):
        return None
    try:
        value = datetime.datetime.fromisoformat(node.this.strip())
    except ValueError:
        return None
    if type_name == "date":  # a date compares with a time as its midnight (in the session's zone for a
        if value.tzinfo is not None:  # timestamptz): between two midnights, a fraction of a day, which the caller
            zone = _zone(time_zone)  # rounds by the operator (day >= '2024-06-15 12:00' is day >= 2024-06-16)
            if zone is None:
                return None
            value = value.astimezone(zone).replace(tzinfo=None)
        return (value - datetime.datetime(1970, 1, 1)).total_seconds() / 86400
    if type_name == "timestamptz" and value.tzinfo is None:
        zone = _zone(time_zone)
        if zone is None:
            return None
        value = value.replace(tzinfo=zone)
    elif type_name == "timestamp" and value.tzinfo is not None:
        return None
    return temporal_number(type_name, value)


def _zone(name: str | None) -> ZoneInfo | None:
    try:
        return ZoneInfo(name) if name else None
    except (ZoneInfoNotFoundError, ValueError):
        return None


def _local(type_name: str, number: float, zone: ZoneInfo | None) -> datetime.datetime:
    """A bound as the wall-clock time the backend truncates."""
    value = temporal_value(type_name, number)
    if type_name == "date":
        return datetime.datetime.combine(value, datetime.time())
    if type_name == "timestamptz":
        return value.astimezone(zone).replace(tzinfo=None)
    return value


def _start(day: datetime.date, unit: str) -> datetime.date:
    if unit == "week":
        return day - datetime.timedelta(days=day.weekday())
    if unit == "month":
        return day.replace(day=1)
    if unit == "quarter":
        return datetime.date(day.year, 3 * ((day.month - 1) // 3) + 1, 1)
    if unit == "year":
        return datetime.date(day.year, 1, 1)
    if unit == "decade":
        return datetime.date(day.year - day.year % 10, 1, 1)
    return day


def _next(day: datetime.date, unit: str) -> datetime.date:
    if unit in ("day", "week"):
        return day + datetime.timedelta(days=1 if unit == "day" else 7)
    months = {"month": 1, "quarter": 3, "year": 12, "decade": 120}[unit]
    index = day.year * 12 + day.month - 1 + months
    return datetime.date(index // 12, index % 12 + 1, 1)
