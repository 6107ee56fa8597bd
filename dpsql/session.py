"""Per-session and per-query options, and the `SET / SHOW / RESET dpsql.<option>` statements that change them.

    SET dpsql.epsilon = 0.5;            -- ε of each following query
    SET dpsql.mechanism = 'gaussian';   -- noise for counts and sums: laplace | gaussian
    SET dpsql.histogram = 'noisefirst'; -- histograms over ordered buckets: plain | noisefirst | structurefirst
    SET dpsql.intervals = on;           -- add each noisy column's 95% interval bounds as two more columns
    SET dpsql.min_frequency = 10;       -- release only groups of at least 10 units (never below the schema's)
    SET dpsql.local_estimate = 'simplex'; -- locally randomized columns: unbiased (default) | simplex
    SET dpsql.bounds_epsilon = 0.05;    -- also estimate, at this extra ε, how many units the bounds cut or clamp
    SET dpsql.rows_per_unit = 'auto';   -- a unit's rows bounded where the data says (R2T), below the declared bound
    SHOW dpsql.budget;                  -- spent and left (answered by whoever holds the budget)

A query's own options override the session's, which override the configuration, which overrides the privacy
schema. Every door (DB-API, command line, server) parses these statements here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from typing import Any

from dpsql.accounting import validate_query_privacy
from dpsql.errors import InvalidParameter
from dpsql.schema import MECHANISMS, ROWS_PER_UNIT

HISTOGRAMS = ("plain", "noisefirst", "structurefirst")
LOCAL_ESTIMATES = ("unbiased", "simplex")
SHOW_ONLY = ("budget",)

_COMMAND = re.compile(
    r"^\s*(?:(?P<set>SET)\s+(?:SESSION\s+|LOCAL\s+)?dpsql\.(?P<set_name>\w+)\s*(?:=|\bTO\b)\s*(?P<value>.*?)"
    r"|(?P<reset>RESET)\s+dpsql\.(?P<reset_name>\w+)|(?P<show>SHOW)\s+dpsql\.(?P<show_name>\w+))\s*;?\s*$",
    re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True)
class Options:
    """Options of a query; None means "as the next level down says"."""

    epsilon: float | None = None
    mechanism: str | None = None
    histogram: str | None = None
    intervals: bool | None = None
    min_frequency: int | None = None
    local_estimate: str | None = None  # locally randomized columns: unbiased | simplex
    bounds_epsilon: float | None = None  # > 0: each answer also estimates the bounds' effect, at this extra ε
    rows_per_unit: str | None = None  # declared: the schema's bound | auto: chosen per query by R2T below it

    def over(self, other: Options) -> Options:
        """These options, with `other` filling in what these leave unset."""
        return replace(other, **{f.name: getattr(self, f.name) for f in fields(self)
                                 if getattr(self, f.name) is not None})

    def with_option(self, name: str, value: Any) -> Options:
        return replace(self, **{name: None if value is None else validate_option(name, value)})


OPTION_NAMES = tuple(f.name for f in fields(Options))


def validate_option(name: str, value: Any) -> Any:
    """The option's value in its type, or InvalidParameter saying what it may be."""
    if name in ("epsilon", "bounds_epsilon"):
        return validate_query_privacy(value)
    if name == "intervals":
        return _boolean(name, value)
    if name == "min_frequency":
        return _whole_number(name, value)
    allowed = {"mechanism": MECHANISMS, "histogram": HISTOGRAMS, "local_estimate": LOCAL_ESTIMATES,
               "rows_per_unit": ROWS_PER_UNIT}.get(name)
    if allowed is None:
        raise _unknown(name)
    text = str(value).strip().lower()
    if text not in allowed:
        raise InvalidParameter(f'dpsql.{name} must be one of {", ".join(allowed)}, got "{value}"')
    return text


def _whole_number(name: str, value: Any) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        number = 0
    if not 1 <= number <= 1_000_000:
        raise InvalidParameter(f'dpsql.{name} must be a whole number from 1 to 1000000, got "{value}"')
    return number


def _boolean(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("on", "true", "yes", "1", "t"):
        return True
    if text in ("off", "false", "no", "0", "f"):
        return False
    raise InvalidParameter(f'dpsql.{name} must be on or off, got "{value}"')


def show_value(value: Any) -> str:
    """An option's value as SHOW prints it (booleans as on/off, as PostgreSQL does)."""
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class SessionCommand:
    action: str  # set | reset | show
    name: str
    value: str | None = None


def parse_session_command(sql: str) -> SessionCommand | None:
    """The SET/RESET/SHOW dpsql.<option> statement `sql` is, or None if it is none of them."""
    match = _COMMAND.match(sql)
    if match is None:
        return None
    action = "set" if match["set"] else "reset" if match["reset"] else "show"
    name = match[f"{action}_name"].lower()
    if name not in OPTION_NAMES and not (action == "show" and name in SHOW_ONLY):
        raise _unknown(name)
    value = None
    if action == "set":
        value = match["value"].strip()
        if len(value) >= 2 and value[0] == value[-1] == "'":
            value = value[1:-1].replace("''", "'")
        if value.upper() == "DEFAULT":
            return SessionCommand("reset", name)
    return SessionCommand(action, name, value)


def _unknown(name: str) -> InvalidParameter:
    return InvalidParameter(f'unrecognized dpsql option "dpsql.{name}"',
                            "options: " + ", ".join(f"dpsql.{n}" for n in (*OPTION_NAMES, *SHOW_ONLY)))
