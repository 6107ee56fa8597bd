"""Pass: the group keys, whether their values are public, and G, the most groups one unit can touch.

Rules:
- a key's values are public when the schema declares them (a column's domain, a boolean, a CASE whose
  results are constants, a bounded integer expression with fewer than MAX_DOMAIN values, date_trunc of a
  bounded date or timestamp: the periods its bounds span, `calendar`, or to_char of such a time: the texts of
  those periods, `sql.to_char`), when the WHERE lists them, or when the
  key is a column of a public table: the values that table holds, which the engine read (`sql.public_keys`;
  public data, and no private row adds a value to them). A WHERE condition
  on the key itself (`k IN (...)`, `k = c`, `k <> c`, `k NOT IN (...)`, `k LIKE 'p'` or of lower(k) or upper(k),
  ANDed with the rest) narrows those
  values to the ones it admits: the others could only be released as empty groups (post-processing of the
  query and the schema, both public). When every key
  is public (and the product of their domains is at most MAX_DOMAIN), every key combination is released,
  empty ones too, so which groups exist reveals nothing; otherwise the keys are private and the groups are
  released by DP partition selection. Keys selected alone (no aggregate) under WHERE or a join are private
  even with a domain: which values are present then depends on the data;
- G = 1 when every key is a function of the unit's own row (its unit-determined tables, none of them NULL-extended
  by an outer join, `people p LEFT JOIN visits v … GROUP BY p.state`, or LEFT-joined on the unit alone, `visits v
  LEFT JOIN people p ON v.person_id = p.person_id`): each unit is in one group. Otherwise
  G = min(max_groups_per_unit, k), enforced by the rewrite unless each joined row is a whole unit (then k = 1
  and G = 1 hold without it);
- under row-level joins, the S changed joined rows may each fall in another group: G = S, and the stability
  already counts them over all groups (see `Scope.spread`);
- a released key is a function of its group only: text keys are grouped bytewise (`CAST(k AS text) COLLATE "C"`),
  since a column the schema calls text may be citext, char(n) or under a non-deterministic collation in the
  database, whose equality is coarser than its spelling (PostgreSQL would return the first row's spelling);
  numbers are read in one canonical form after the backend (`noise.released_key`).
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import operator
import re
from collections.abc import Callable, Iterator
from decimal import Decimal
from itertools import product

from sqlglot import exp

from dpsql.analysis.calendar import calendar_number, periods
from dpsql.analysis.expressions import WALKED_DAYS, Expressions, Range, declared_days
from dpsql.analysis.plan import GroupKey
from dpsql.analysis.scope import Scope
from dpsql.errors import InvalidQuery, UnsupportedQuery
from dpsql.schema.model import Column, temporal_number
from dpsql.sql import AGGREGATES, to_sql
from dpsql.sql.patterns import like_regex
from dpsql.sql.query import MAX_DOMAIN, branches_of, bytewise, operands
from dpsql.sql.times import interval_step
from dpsql.sql.to_char import finest_period, template_of, to_char

CONTINUOUS_TYPES = {"double precision", "real"}  # as the schema names them
INTEGER_CASTS = {exp.DataType.Type.BIGINT, exp.DataType.Type.INT, exp.DataType.Type.SMALLINT}


def bound_groups(scope: Scope) -> None:
    """Set the scope's group keys, G, whether the rewrite must cap the groups per unit, and the public domain
    of key combinations (None: partition selection)."""
    keys = _group_keys(scope)
    k = scope.rows_per_unit
    nodes = [node.unnest() for node in scope.tree.args["group"].expressions] if keys else []
    public = _dated_domain(scope, nodes, [k.domain for k in keys]) if len(keys) > 1 else None
    public = _domain(keys) if public is None else public
    if public is not None and _keys_alone(scope) and (scope.tree.args.get("where") or scope.joins):
        public = None  # the values present under WHERE or a join depend on the data: private keys
    if keys and scope.stability is not None:  # the changed joined rows may each fall in another group
        groups, cap = k, False
        scope.notes.append(f"the {k} changed joined row(s) may fall in as many groups")
    elif keys:
        kept = scope.determined - scope.nullable() | _matched_by_unit(scope)
        natural = all(all(c.table in kept for c in key.expr.find_all(exp.Column)) for key in keys)
        if natural:
            groups, cap = 1, False
            scope.notes.append("group keys depend only on the unit: each unit is in one group")
        elif scope.unit is not None:
            groups, cap = _bound_rows_over_groups(scope, k, public)
        else:
            groups, cap = max(1, min(scope.max_groups_setting, k)), not scope.direct
            scope.notes.append(f"each unit counts in at most {groups} group(s) (enforced by the rewrite)")
    else:
        groups, cap = 1, False
    domain = public
    if keys and domain is not None and scope.min_units > 1:
        scope.notes.append(f"group keys come from a public domain; with min_frequency = {scope.min_units} each "
                           "still goes through DP partition selection")
    elif keys:
        scope.notes.append("group keys come from a public domain: every key is released" if domain is not None
                           else "group keys are private: released by DP partition selection")
    if keys and domain is None:
        scope.every_group = _every_group(scope, keys)
    scope.group_keys, scope.max_groups, scope.cap_groups, scope.domain = keys, groups, cap, domain


def _matched_by_unit(scope: Scope) -> set[str]:
    """The tables of one row per unit that a LEFT JOIN matches on the unit alone (`visits v LEFT JOIN people p ON
    v.person_id = p.person_id`, Metabase's join to a foreign key's table): every equality of their ON reads a
    column of theirs and a unit column (or a column of a unit-determined table) that no outer join NULL-extends,
    so whether they match, and which row, is the same on all of a unit's rows. None under a RIGHT or FULL join."""
    if any((j.side or "").upper() in ("RIGHT", "FULL") for j in scope.joins):
        return set()
    nullable = scope.nullable()
    fixed = scope.determined - nullable
    found = set()
    for join in scope.joins:
        alias, on = join.this.alias_or_name, join.args.get("on")
        if (join.side or "").upper() != "LEFT" or alias not in scope.determined or on is None:
            continue
        conjuncts = operands(on)
        if all(isinstance(c, exp.EQ) and isinstance(c.this, exp.Column) and isinstance(c.expression, exp.Column)
               and any(mine.table == alias and other.table != alias and other.table not in nullable
                       and (scope.is_unit(other) or other.table in fixed)
                       for mine, other in ((c.this, c.expression), (c.expression, c.this))) for c in conjuncts):
            found.add(alias)
    return found


def _keys_alone(scope: Scope) -> bool:
    """Whether the query selects its keys without an aggregate (SELECT DISTINCT c, GROUP BY c alone)."""
    tree = scope.tree
    places = [*tree.expressions, tree.args.get("having"), tree.args.get("order")]
    return not any(node.find(*AGGREGATES) for node in places if node is not None)


def counts_distinct_values(scope: Scope) -> bool:
    """Whether the query counts distinct values of anything but the unit (`COUNT(DISTINCT day)`)."""
    return any(isinstance(node.this, exp.Distinct) and not (
        len(node.this.expressions) == 1 and isinstance(node.this.expressions[0], exp.Column)
        and scope.is_unit(node.this.expressions[0])) for node in scope.tree.find_all(exp.Count))


CAP_FACTOR = 4  # cap a unit's groups at max_groups_per_unit only when it could reach more than this many times as many


def _bound_rows_over_groups(scope: Scope, k: int, domain: list[tuple] | None) -> tuple[int, bool]:
    """The per-unit rewrite keeps at most k of a unit's rows over all groups together, so its values add up to
    k rows' worth across groups (sensitivity k·c, not G·k·c) and it reaches at most k groups, or as many as
    the public domain has. Private keys' partition selection pays for every group a unit may reach; capping
    the groups at max_groups_per_unit (G) makes it cheaper but drops the rows of a unit's other groups, a bias
    no interval shows. So the cap is kept only where the reach is far beyond G (more than CAP_FACTOR·G), where
    an uncapped threshold would release few groups."""
    scope.rows_total = True
    reach = k if domain is None else max(1, min(k, len(domain)))
    # the bounding not chosen, for explain: k rows in each of G groups moves a COUNT by G·k in all, not k
    other = (f"; a COUNT moves by at most {k} in all, against {scope.max_groups_setting * k} had each of "
             f"max_groups_per_unit = {scope.max_groups_setting} groups kept {k} rows")
    if domain is None and scope.max_groups_setting < reach and (reach <= CAP_FACTOR * scope.max_groups_setting
                                                                  or scope.rows_cap is not None
                                                                  or counts_distinct_values(scope)):
        # (a bound chosen from the data is where most units' rows end: capping the groups would drop them again;
        # a count of distinct values is taken over the kept rows themselves, which a cap per group would not keep)
        scope.notes.append(f"each unit keeps at most {k} row(s) over all groups (enforced by the rewrite), so it "
                           f"reaches at most {reach} group(s): partition selection pays for {reach} rather than "
                           f"capping at max_groups_per_unit = {scope.max_groups_setting}, which would drop the "
                           f"rows of a unit's other groups{other}")
        return reach, False
    if domain is None and scope.max_groups_setting < reach:
        scope.notes.append(f"each unit keeps at most {k} row(s) over all groups, in at most "
                           f"{scope.max_groups_setting} group(s) (enforced by the rewrite){other}")
        return scope.max_groups_setting, True
    scope.notes.append(f"each unit keeps at most {k} row(s) over all groups (enforced by the rewrite), so it "
                       f"reaches at most {reach} group(s){other}")
    return reach, False


def key_domain(scope: Scope, node: exp.Expression, value_range: Range | None) -> tuple | None:
    """The public values of a key expression, or None when they are not declared."""
    node = node.unnest()  # Looker parenthesizes its keys: (DATE(day AT TIME ZONE 'UTC'))
    if isinstance(node, exp.Cast) and node.to.is_type("date") and scope.exprs.time_type(node.this) == "date":
        return key_domain(scope, node.this, value_range)  # date(day): the date itself
    if isinstance(node, exp.Cast) and node.to.is_type("date") and _moved_time(scope, node.this.unnest()):
        # the day of a moved time (Looker's DATE(day AT TIME ZONE 'UTC')): date_trunc('day', …)::date's dates
        return _period_dates(scope, exp.Cast(this=exp.TimestampTrunc(this=node.this, unit=exp.var("day")),
                                             to=exp.DataType.build("date")))
    if isinstance(node, exp.Column):
        column = scope.declared_column(node)
        if column is not None and column.domain is not None:
            return column.domain
        if column is not None and column.type == "boolean":
            return (False, True)
        table = scope.aliases.get(node.table)
        held = scope.public_keys.get(to_sql(node)) if table is not None and table.public else None
        if held is not None and len(held) <= MAX_DOMAIN:
            return held  # every value the public table holds (under the WHERE's conditions on it alone)
        if column is not None and column.type == "date":  # its days, as date_trunc('day', day)::date releases
            return _period_dates(scope, exp.Cast(this=exp.TimestampTrunc(this=node, unit=exp.var("day")),
                                                 to=exp.DataType.build("date")))
    if not isinstance(node, exp.Column) and scope.exprs.is_boolean(node):
        return (False, True)  # a condition (amount > 100), as a boolean column's (its NULL group aside)
    if isinstance(node, exp.Case) and all(
            isinstance(b.args["true"], exp.Literal) for b in node.args.get("ifs", [])):
        default = node.args.get("default")
        if default is None or isinstance(default, exp.Literal):
            values = [b.args["true"].to_py() for b in node.args["ifs"]]
            values.append(default.to_py() if default is not None else None)
            return tuple(dict.fromkeys(values))
    if isinstance(node, exp.Case) and node.this is None and not all(
            isinstance(b, exp.Literal) for b in branches_of(node)):
        # each branch's values (trunc(age, -1): ceil's tens below 0, floor's above), NULL where no branch is taken
        parts = [key_domain(scope, b, None) for b in branches_of(node)]
        if all(p is not None for p in parts):
            values = [v for p in parts for v in p] + ([] if node.args.get("default") is not None else [None])
            if len(set(values)) <= MAX_DOMAIN:
                return tuple(dict.fromkeys(values))
    if isinstance(node, exp.Extract) and node.this.name.upper() == "EPOCH":
        return _epoch_domain(key_domain(scope, node.expression.unnest(), None))
    if isinstance(node, exp.Cast) and node.to.this in INTEGER_CASTS:  # (extract(epoch from …)::bigint)
        whole = _whole_numbers(key_domain(scope, node.this.unnest(), None))
        if whole is not None:
            return whole
    stepped = _integer_domain(scope, node)
    if stepped is not None:
        return stepped
    if isinstance(node.unnest(), exp.Add | exp.Sub) and isinstance(node.unnest().expression, exp.Interval):
        return _shifted_domain(scope, node.unnest())
    if isinstance(node, exp.TimeToStr) and scope.exprs.time_type(node.this) is not None:
        return _formatted_domain(scope, node)
    found = _period_domain(scope, node) if isinstance(node, exp.TimestampTrunc | exp.DateTrunc) \
        else _period_dates(scope, node) if _is_period_date(node) else _function_domain(scope, node)
    return found if found is not None else _listed_domain(scope, node)


def _whole_numbers(values: tuple | None) -> tuple | None:
    """The values as integers, where every one is a whole number (an epoch's seconds); else None."""
    if values is None or not all(isinstance(v, int | Decimal) and not isinstance(v, bool) and v == int(v)
                                 for v in values):
        return None
    return tuple(dict.fromkeys(int(v) for v in values))


def _epoch_domain(times: tuple | None) -> tuple | None:
    """EXTRACT(EPOCH FROM t) of each public time, as PostgreSQL computes it: a date's midnight and a timestamp's
    wall time read as UTC, a timestamptz's instant; a whole number of seconds as an integer."""
    if times is None or not all(isinstance(t, datetime.date) for t in times):
        return None
    seconds = []
    for t in times:
        if not isinstance(t, datetime.datetime):
            t = datetime.datetime.combine(t, datetime.time())
        elapsed = t - datetime.datetime(1970, 1, 1, tzinfo=None if t.tzinfo is None else datetime.UTC)
        whole, micro = divmod(elapsed // datetime.timedelta(microseconds=1), 1_000_000)
        seconds.append(whole if micro == 0 else Decimal(whole) + Decimal(micro) / 1_000_000)
    return tuple(dict.fromkeys(seconds))


def _is_period_date(node: exp.Expression) -> bool:
    return isinstance(node, exp.Cast) and node.to.is_type("date") and isinstance(node.this, exp.TimestampTrunc
                                                                                  | exp.DateTrunc)


def _period_dates(scope: Scope, node: exp.Cast) -> tuple | None:
    """`date_trunc('week', day)::date` (BI tools' week as a date): the dates of the periods' starts, each at
    midnight in the session's time zone, where the cast reads it."""
    found = _period_domain(scope, node.this)
    if found is None or any(p.time() != datetime.time() for p in found):
        return None
    return tuple(dict.fromkeys(p.date() for p in found))


def _formatted_domain(scope: Scope, node: exp.TimeToStr) -> tuple | None:
    """The texts of to_char(t, template) over a time with public values (Looker's months, to_char(date_trunc(
    'month', day), 'YYYY-MM')), or over the periods of the shortest unit the template reads (to_char(day,
    'YYYY-MM') prints each day as its month's start does), each as PostgreSQL prints it (`to_char`)."""
    template = template_of(node)
    unit = finest_period(template)
    if unit is None:
        return None
    if unit in ("hour", "minute") and scope.exprs.time_type(node.this) == "date":
        unit = "day"  # a date prints as its midnight
    times = key_domain(scope, node.this.unnest(), None) if not isinstance(node.this.unnest(), exp.Column) else None
    if times is None or len(times) > MAX_DOMAIN:
        times = key_domain(scope, exp.TimestampTrunc(this=node.this, unit=exp.var(unit)), None)
    if times is None or not all(isinstance(t, datetime.date) for t in times):
        return None
    return tuple(dict.fromkeys(to_char(t, template) for t in times))


def _listed_domain(scope: Scope, node: exp.Expression) -> tuple | None:
    """The constants a WHERE conjunct lists for the key itself (`state IN ('CA', 'NY')`, `age = 40`): no row
    outside them reaches a group, so they are released like a declared domain, every one, an empty group too
    (the query is public). Only text keys with text constants and integer keys with integer constants, whose
    values the backend returns as Python compares them, and date keys with dates written as ISO text (DATE
    '2024-01-31'); the other conditions on the key narrow it (`_admitted`)."""
    kind = "text" if text_key(scope.exprs, node) else "integer" if _integer_key(scope, node) else \
        "date" if scope.exprs.time_type(node) == "date" else None
    wanted = {"text": str, "integer": int, "date": datetime.date}.get(kind)
    for negated, values, _ in _key_conditions(scope, node) if kind is not None else []:
        if not negated and values and all(v is None or type(v) is wanted for v in values) \
                and len(values) <= MAX_DOMAIN:
            return tuple(dict.fromkeys(v for v in values if v is not None))
    return None


def _integer_key(scope: Scope, node: exp.Expression) -> bool:
    value_range = scope.exprs.value_range(node)
    return value_range is not None and value_range.integer


def _shifted_domain(scope: Scope, node: exp.Add | exp.Sub) -> tuple | None:
    """The values of `k ± INTERVAL '…'` where k is a key with public timestamp or date values (Metabase's weeks
    from Sunday, date_trunc('week', day + INTERVAL '1 day') - INTERVAL '1 day', or the same of the week cast to a
    date): each shifted, as PostgreSQL shifts a timestamp (`times.Step`), a date read as its midnight."""
    inner, step = key_domain(scope, node.this, None), interval_step(node.expression)
    if inner is not None and all(type(v) is datetime.date for v in inner):
        inner = tuple(datetime.datetime.combine(v, datetime.time()) for v in inner)  # date ± interval: a timestamp
    if inner is None or step is None or not all(type(v) is datetime.datetime and v.tzinfo is None for v in inner):
        return None
    step = step if isinstance(node, exp.Add) else step.negated()
    try:
        return tuple(dict.fromkeys(step.added_to(v) for v in inner))
    except (OverflowError, ValueError):
        return None


def _period_domain(scope: Scope, node: exp.Expression) -> tuple | None:
    """The periods of date_trunc(unit, column) over a column with declared bounds (`calendar.periods`); of a date
    or timestamp column shifted by an interval, the periods of the shifted bounds (a timestamp, truncated as it
    stands); of a date column plus a number of days, those of the shifted dates; of a date column cast to a
    timestamp, the periods of its midnights. A column's bounds are narrowed by the WHERE's comparisons of it
    with constants."""
    unit = node.args.get("unit")
    inner = node.this.unnest()
    if unit is None:
        return None
    while isinstance(inner, exp.Cast) and inner.to.is_type("date") and scope.exprs.time_type(inner.this) == "date":
        inner = inner.this.unnest()  # a date cast to a date (Tableau's DATE_TRUNC('MONTH', CAST(day AS DATE)))
    cast = isinstance(inner, exp.Cast) and inner.to.is_type("timestamp") and isinstance(inner.this.unnest(), exp.Column)
    moved = _moved_time(scope, inner) if not cast else None
    if moved is not None:
        moved_type, bounds = moved
        low, high = (temporal_number(moved_type, v) for v in bounds)
        return periods(moved_type, low, high, unit.name, scope.time_zone, MAX_DOMAIN)
    column_node = inner.this.unnest() if cast else inner
    column = scope.declared_column(column_node) if isinstance(column_node, exp.Column) else None
    if column is None or not column.is_temporal or column.lower is None or column.upper is None \
            or cast and column.type != "date":
        return None
    lower, upper = _narrowed_bounds(scope, column_node, column)
    if lower > upper:
        return ()
    # a date is at its midnight, which a period shorter than a day (an hour) leaves as it is: the days
    name = "day" if column.type == "date" and unit.name.lower() in SHORTER_THAN_A_DAY else unit.name
    if cast:  # the dates' midnights, truncated as timestamps (Metabase: date_trunc('week', CAST(day AS timestamp)))
        return periods("timestamp", lower * 86400, upper * 86400, name, scope.time_zone, MAX_DOMAIN)
    return periods(column.type, lower, upper, name, scope.time_zone, MAX_DOMAIN)


SHORTER_THAN_A_DAY = ("microseconds", "milliseconds", "second", "minute", "hour")


FLIPPED = {">": "<", ">=": "<=", "<": ">", "<=": ">=", "=": "="}
COMPARISONS = {exp.GT: ">", exp.GTE: ">=", exp.LT: "<", exp.LTE: "<=", exp.EQ: "="}


def _moved_time(scope: Scope, node: exp.Expression) -> tuple[str, tuple] | None:
    """The type and bounds of a time that is not a column itself but keeps a column's declared bounds, moved: a
    timestamp ± an interval, a date ± days, a time at a zone, or a date cast to a timestamp (its midnight, as
    Metabase truncates a date column: date_trunc('week', CAST(day AS timestamp))); None for anything else."""
    exprs = scope.exprs
    if isinstance(node, exp.Add | exp.Sub):
        moved_type = exprs.time_type(node)
        if (moved_type, isinstance(node.expression, exp.Interval)) not in (("timestamp", True), ("date", False)):
            return None
    elif isinstance(node, exp.AtTimeZone):  # a timestamp in the zone's wall time, or a timestamptz
        moved_type = exprs.time_type(node)
    elif isinstance(node, exp.Cast) and node.to.is_type("timestamp") and exprs.time_type(node.this) == "date":
        moved_type, node = "timestamp", node.this  # (a column's own: `_period_domain`, narrowed by the WHERE)
    elif isinstance(node, exp.Cast) and node.to.is_type("timestamp") and exprs.time_type(node.this) == "timestamp":
        return _moved_time(scope, node.this.unnest())  # a cast that changes nothing: CAST(day + INTERVAL … AS
        # timestamp), as Metabase writes its week from Sunday
    else:
        return None
    bounds = exprs.time_bounds(node) if moved_type is not None else None
    if bounds is None:
        return None
    if moved_type != "date":
        bounds = tuple(datetime.datetime.combine(v, datetime.time()) if type(v) is datetime.date else v
                       for v in bounds)
    return moved_type, bounds


def _comparisons(scope: Scope, column: exp.Column) -> list[tuple[str, exp.Expression]]:
    """(operator, constant) for each condition ANDed into the WHERE that compares `column` with a constant
    (`column op constant`, `constant op column`, `column BETWEEN a AND b`), the column on the left."""
    where = scope.tree.args.get("where")
    text, found = to_sql(column), []
    for condition in operands(where.this) if where is not None else []:
        if isinstance(condition, exp.Between) and to_sql(condition.this.unnest()) == text:
            found += [(">=", condition.args["low"]), ("<=", condition.args["high"])]
        op = COMPARISONS.get(type(condition))
        if op is None:
            continue
        left, right = condition.this.unnest(), condition.expression.unnest()
        if to_sql(left) == text:
            found.append((op, right))
        elif to_sql(right) == text:
            found.append((FLIPPED[op], left))
    return found


def _integer_domain(scope: Scope, node: exp.Expression) -> tuple | None:
    """The values of an integer key, keeping the step of a product or an integer quotient by a constant:
    floor(x / 10) * 10 takes every tenth value of its range, age / 10 eleven values, not the whole range."""
    node = node.unnest()
    constant = node.expression if isinstance(node, exp.Binary) else None
    if isinstance(constant, exp.Literal) and not constant.is_string and constant.this.isdigit():
        c = int(constant.this)
        inner = (_integer_domain(scope, node.this) or _whole_numbers(key_domain(scope, node.this.unnest(), None))) \
            if isinstance(node, exp.Mul | exp.Div | exp.Add | exp.Sub) else None
        if inner is not None and c != 0:
            if isinstance(node, exp.Mul):
                return tuple(v * c for v in inner)
            if isinstance(node, exp.Add | exp.Sub):
                return tuple(v + c if isinstance(node, exp.Add) else v - c for v in inner)
            if scope.exprs.kind(node) == "integer":  # PostgreSQL truncates toward zero
                return tuple(dict.fromkeys(int(v / c) if abs(v) < 2**52 else _refuse() for v in inner))
    value_range = scope.exprs.value_range(node)
    step = _rounded_to(node)
    if (value_range is not None and value_range.integer and value_range.bounded
            and (value_range.hi - value_range.lo) / step < MAX_DOMAIN):
        first = math.ceil(value_range.lo / step) * step
        values = tuple(range(int(first), int(value_range.hi) + 1, step))
        return _in_range(scope, node, values) if isinstance(node, exp.Column) else values  # (age / 10: age's)
    return None


def _rounded_to(node: exp.Expression) -> int:
    """The step between the values of `node`: 100 for round(x, -2), which takes only multiples of it; else 1."""
    digits = node.args.get("decimals") if isinstance(node, exp.Round) else None
    if isinstance(digits, exp.Neg) and isinstance(digits.this, exp.Literal) and digits.this.is_int:
        return 10 ** int(digits.this.this)
    return 1


def _function_domain(scope: Scope, node: exp.Expression) -> tuple | None:
    """The values of a text function of one column with a declared domain (upper(state), substring(code, 1, 2)):
    computed on the declared values, so they are as public as the domain. Only ASCII values are computed, where
    Python's string functions are PostgreSQL's. (A database whose locale upper-cases 'i' as 'İ' would put those
    rows outside the released keys: less accurate, never less private.)"""
    columns = list(node.find_all(exp.Column))
    if len(columns) != 1 or node is columns[0]:
        return None
    column = scope.declared_column(columns[0])
    if column is None or column.domain is None or not all(isinstance(v, str) and v.isascii() for v in column.domain):
        return None
    try:
        return tuple(dict.fromkeys(_text_value(node, value) for value in column.domain))
    except _NotComputed:
        return None


class _NotComputed(Exception):
    pass


def _text_value(node: exp.Expression, value: str) -> str | int:
    """`node` with its one column set to `value`, as PostgreSQL computes it."""
    def arg(name: str) -> str | int:
        return _text_value(node.args[name], value)

    if isinstance(node, exp.Column):
        return value
    if isinstance(node, exp.Paren):
        return _text_value(node.this, value)
    if isinstance(node, exp.Literal) and (not node.is_string or node.this.isascii()):
        return node.this if node.is_string else int(node.this) if node.this.lstrip("-").isdigit() else _refuse()
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal):
        return -_text_value(node.this, value)
    if isinstance(node, exp.Upper | exp.Lower | exp.Length):
        text = _string(arg("this"))
        return text.upper() if isinstance(node, exp.Upper) else text.lower() if isinstance(node, exp.Lower) \
            else len(text)
    if isinstance(node, exp.Trim) and set(node.args) <= {"this"}:
        return _string(arg("this")).strip(" ")
    if isinstance(node, exp.DPipe):
        return _string(arg("this")) + _string(arg("expression"))
    if isinstance(node, exp.Replace):  # (an empty search was refused: Python would insert between letters)
        return _string(arg("this")).replace(_string(arg("expression")), _string(arg("replacement")))
    if isinstance(node, exp.SplitPart):
        parts = _string(arg("this")).split(_string(arg("delimiter")))
        index = _integer(arg("part_index"))
        return parts[index - 1] if index <= len(parts) else ""
    if isinstance(node, exp.StrPosition):
        return _string(arg("this")).find(_string(arg("substr"))) + 1
    if isinstance(node, exp.Pad):
        text, width = _string(arg("this")), _integer(arg("expression"))
        fill = _string(arg("fill_pattern")) if node.args.get("fill_pattern") is not None else " "
        if len(text) >= width:
            return text[:width]  # PostgreSQL cuts a longer text to the width, from the left, either way
        padding = (fill * width)[:width - len(text)]
        return padding + text if node.args.get("is_left") else text + padding
    if isinstance(node, exp.Right):
        text, count = _string(arg("this")), _integer(arg("expression"))
        return text[len(text) - count:] if count else ""
    if isinstance(node, exp.Reverse):
        return _string(arg("this"))[::-1]
    if isinstance(node, exp.Substring) and set(node.args) <= {"this", "start", "length"}:
        text, start = _string(arg("this")), _integer(arg("start"))
        if node.args.get("length") is None:
            return text[max(start, 1) - 1:]
        end = start + _integer(arg("length"))  # a negative length was refused by the expression checks
        return text[max(start, 1) - 1:max(end - 1, 0)]
    return _refuse()


def _string(value: str | int) -> str:
    return value if isinstance(value, str) else _refuse()


def _integer(value: str | int) -> int:
    return value if isinstance(value, int) else _refuse()


def _refuse():
    raise _NotComputed


def key_type(node: exp.Expression, exprs: Expressions) -> str:
    """The PostgreSQL type a key expression's values are released as."""
    if exprs.value_range(node) is not None:  # PostgreSQL's type: EXTRACT is a numeric, floor(x) a double
        return {"integer": "int8", "numeric": "numeric"}.get(exprs.kind(node), "float8")
    time_type = exprs.time_type(node)
    if time_type is not None:
        return time_type
    if exprs.is_boolean(node):
        return "bool"
    if isinstance(node, exp.Column):
        column = exprs.column(node)
        if column is not None:
            return {"boolean": "bool"}.get(column.type, "text")
    return "text"


def _group_keys(scope: Scope) -> list[GroupKey]:
    group = scope.tree.args.get("group")
    if group is None:
        return []
    if group.args.get("rollup") or group.args.get("cube") or group.args.get("grouping_sets"):
        raise UnsupportedQuery("ROLLUP, CUBE and GROUPING SETS are not supported",
                               "write the grouping sets at the top of the statement: GROUP BY GROUPING SETS "
                               "((a), (a, b))")
    keys = []
    for i, node in enumerate(group.expressions):
        if node.find(exp.Window):  # PostgreSQL's own errors, whatever the data
            raise InvalidQuery("window functions are not allowed in GROUP BY",
                               "group by a column, and compute the window over the groups: SELECT k, COUNT(*), "
                               "ntile(4) OVER (ORDER BY COUNT(*)) FROM t GROUP BY k", sqlstate="42P20")
        if any(isinstance(n, tuple(AGGREGATES)) for n in node.walk()):
            raise InvalidQuery("aggregate functions are not allowed in GROUP BY",
                               "group by columns and put the aggregates in the SELECT list: SELECT k, COUNT(*) "
                               "FROM t GROUP BY k", sqlstate="42803")
        _refuse_hopeless_key(scope, node)
        value_range = scope.exprs.value_range(node)
        guarded = scope.exprs.guard(node)
        if text_key(scope.exprs, node):
            guarded = bytewise(guarded)
        domain = key_domain(scope, node, value_range)
        # spelled without its parentheses, as the SELECT list reads it (Looker groups by (date_trunc(...)))
        keys.append(GroupKey(f"g{i}", guarded, domain if domain is None else _admitted(scope, node, domain),
                             to_sql(node.unnest())))
    return keys


def _every_group(scope: Scope, keys: list[GroupKey]) -> str:
    """How to ask so that every group is released: each private key in a public form (a period of a date, a value
    of a declared domain), from the schema alone."""
    ways = []
    for key, node in zip(keys, scope.tree.args["group"].expressions, strict=True):
        if key.domain is not None:
            continue
        columns = list(node.find_all(exp.Column))
        column = scope.declared_column(columns[0]) if len(columns) == 1 else None
        name = to_sql(columns[0]) if columns else key.sql
        if column is not None and column.is_temporal:
            periods = f"date_trunc('month', {name}) or " if column.bounded else ""
            ways.append(f"{periods}EXTRACT(month FROM {name}) instead of {key.sql}")
        else:
            ways.append(f"a column with a declared domain instead of {key.sql} (the data owner may declare one "
                        "in the privacy schema)")
    if not ways:  # declared keys selected alone under WHERE or a join: counted, every declared value is released
        spelled = ", ".join(key.sql for key in keys)
        return f"count them: SELECT {spelled}, COUNT(*) ... GROUP BY {spelled} releases every declared value"
    return "group by " + "; ".join(ways)


def _admitted(scope: Scope, node: exp.Expression, domain: tuple) -> tuple:
    """The values of `domain` that the WHERE's conditions on the key itself admit (PostgreSQL's equality of the
    key's values with the constants: exact for text, by value for numbers and booleans)."""
    for negated, values, with_null in _key_conditions(scope, node):
        if any(v is _UNKNOWN or not _comparable(v, domain) for v in values):
            continue
        listed = [v for v in values if v is not None]
        if negated and len(listed) < len(values):  # NOT IN with a NULL, or <> NULL: no row passes but a NULL key's
            return tuple(v for v in domain if v is None and with_null)
        domain = tuple(v for v in domain if (v is None and with_null)
                       or (v is not None and (v in listed) != negated))
    if domain and all(isinstance(v, datetime.datetime) for v in domain if v is not None):
        # periods kept to a list of days (a calendar of month starts joined to date_trunc('month', day)): each
        # period's start as the date PostgreSQL casts it to, in the session's zone
        for negated, values, _ in _key_conditions(scope, exp.cast(node.unnest().copy(), exp.DataType.build("date"))):
            if values and all(type(v) is datetime.date for v in values):
                domain = tuple(v for v in domain if v is not None and (v.date() in values) != negated)
    for negated, matches in _key_patterns(scope, node):
        if all(isinstance(v, str) and v.isascii() for v in domain if v is not None):
            domain = tuple(v for v in domain if v is not None and matches(v) != negated)
    read = _dated_domain(scope, [node.unnest()], [domain])  # a key of a column the WHERE narrows: its values
    if read is not None:
        kept = set(read)
        domain = tuple(v for v in domain if (v,) in kept)
    reached = _range_under_where(scope, node)
    if reached is not None:  # a key of a number the WHERE narrows: the values its narrowed range reaches
        domain = tuple(v for v in domain if not isinstance(v, int | float) or isinstance(v, bool)
                       or reached.lo <= v <= reached.hi)
    return _in_range(scope, node, domain)


def _range_under_where(scope: Scope, node: exp.Expression) -> Range | None:
    """The range of a key computed from bounded number columns (`round(amount::numeric, -2)`, `ceil(amount / 100)
    * 100`) with each column's declared bounds narrowed by the WHERE's comparisons of it with numbers (`amount <
    300`: [0, 300]); None where the WHERE compares none of them. A key outside it is met by no row the WHERE
    keeps (those bins were released as noisy counts of nothing: 51 bins of 100 where PostgreSQL has 4)."""
    narrowed: dict[str, Column] = {}
    for column_node in node.find_all(exp.Column):
        column = scope.declared_column(column_node)
        if column is None or not column.is_numeric or not column.bounded:
            continue
        lower, upper = column.lower, column.upper
        for op, constant in _comparisons(scope, column_node):
            value = _constant_value(constant)
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            lower = max(lower, value) if op in (">", ">=", "=") else lower
            upper = min(upper, value) if op in ("<", "<=", "=") else upper
        if (lower, upper) != (column.lower, column.upper) and lower <= upper:
            narrowed[to_sql(column_node)] = dataclasses.replace(column, lower=lower, upper=upper)
    if not narrowed:
        return None

    def lookup(column_node: exp.Column) -> Column | None:
        return narrowed.get(to_sql(column_node)) or scope.exprs.column(column_node)
    try:
        reached = Expressions(lookup, scope.exprs.session_zone).value_range(node)
    except (UnsupportedQuery, InvalidQuery, ValueError, ZeroDivisionError, OverflowError):
        return None
    return reached if reached is not None and reached.bounded else None


def _in_range(scope: Scope, node: exp.Expression, domain: tuple) -> tuple:
    """The values of `domain` that the WHERE's comparisons of `node` with a number or a date admit (`age >= 90`: the
    ages 90 to 100, not 0 to 100, as PostgreSQL's rows would have it)."""
    for op, constant in _comparisons(scope, node):
        value = _constant_value(constant)
        if value is _UNKNOWN or isinstance(value, str | bool) or value is None or not _comparable(value, domain):
            continue  # (text orders by the database's collation, and a NULL compares to nothing: PostgreSQL's)
        domain = tuple(v for v in domain if v is not None and ORDERINGS[op](v, value))
    return domain


ORDERINGS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "=": operator.eq}


def _conjuncts(scope: Scope) -> Iterator[tuple[bool, exp.Expression]]:
    """Each conjunct of the WHERE without its NOT, and whether it had one."""
    where = scope.tree.args.get("where")
    for condition in operands(where.this) if where is not None else []:
        negated = isinstance(condition, exp.Not)
        yield negated, condition.this.unnest() if negated else condition


def _key_patterns(scope: Scope, node: exp.Expression) -> list[tuple[bool, Callable[[str], bool]]]:
    """(negated, a test of a value) of each WHERE conjunct that matches the key itself, or its lower() or
    upper(), with constant ASCII LIKE or ILIKE patterns (Metabase's "contains": `lower(k) LIKE '%lab%'`), or ORs
    of such matches (`k ILIKE ANY (ARRAY['%lab%', '%den%'])`)."""
    text = to_sql(node)
    found = []
    for negated, test in _conjuncts(scope):
        tests = [_pattern_test(text, d.unnest()) for d in _disjuncts(test)]
        if tests and all(t is not None for t in tests):
            found.append((negated, tests[0] if len(tests) == 1 else lambda v, tests=tests: any(t(v) for t in tests)))
    return found


def _disjuncts(node: exp.Expression) -> list[exp.Expression]:
    node = node.unnest()
    return [*_disjuncts(node.this), *_disjuncts(node.expression)] if isinstance(node, exp.Or) else [node]


def _pattern_test(text: str, test: exp.Expression) -> Callable[[str], bool] | None:
    """Whether a value passes `test` if it is the key (spelled `text`), or its lower() or upper(), LIKE or ILIKE
    (or NOT LIKE) a constant ASCII pattern; None for any other condition."""
    pattern = test.expression if isinstance(test, exp.Like | exp.ILike) else None
    if not (isinstance(pattern, exp.Literal) and pattern.is_string and pattern.this.isascii()) \
            or test.args.get("escape"):
        return None
    operand = test.this.unnest()
    if to_sql(operand) == text:
        shown = str
    elif isinstance(operand, exp.Lower | exp.Upper) and to_sql(operand.this) == text:
        shown = str.lower if isinstance(operand, exp.Lower) else str.upper
    else:
        return None
    regex, negated = like_regex(pattern.this, ignore_case=isinstance(test, exp.ILike)), bool(test.args.get("negate"))
    return lambda v: (regex.fullmatch(shown(v)) is not None) != negated


def _key_conditions(scope: Scope, node: exp.Expression,
                    read: Callable[[exp.Expression], object] | None = None) -> list[tuple[bool, list, bool]]:
    """(negated, the constants' values, whether NULL passes) of each WHERE conjunct that compares the key itself
    with constants: `k = c`, `k <> c`, `k IN (...)`, `NOT k IN (...)`, the key on either side of an equality; an
    OR of such matches (`NOT (k = 'a' OR k = 'b')`); and either with `OR k IS NULL` (Metabase's "is not":
    `k <> 'lab' OR k IS NULL`, which keeps the NULL key). Each constant's value is `read` from it (its literal
    value by default; _UNKNOWN where it has none)."""
    text = to_sql(node)
    found = []
    for negated, test in _conjuncts(scope):
        disjuncts = [d.unnest() for d in _disjuncts(test)]
        compared = [_compared(text, d, read or _constant_value) for d in disjuncts if not _is_null_test(text, d)]
        with_null = len(compared) < len(disjuncts) and not negated
        if not compared or any(c is None for c in compared):
            continue
        if len(compared) == 1:
            found.append((negated ^ compared[0][0], compared[0][1], with_null))
        elif not any(inverted for inverted, _ in compared):
            found.append((negated, [v for _, values in compared for v in values], with_null))
    return found


def _is_null_test(text: str, node: exp.Expression) -> bool:
    return isinstance(node, exp.Is) and isinstance(node.expression, exp.Null) and to_sql(node.this.unnest()) == text


def _compared(text: str, test: exp.Expression,
              read: Callable[[exp.Expression], object]) -> tuple[bool, list] | None:
    """(negated, the constants' values) where `test` compares the key (spelled `text`) with constants; else None."""
    negated = False
    if isinstance(test, exp.EQ | exp.NEQ):
        sides = [test.this.unnest(), test.expression.unnest()]
        key, constants = (sides[0], [sides[1]]) if to_sql(sides[0]) == text else (sides[1], [sides[0]])
        negated = isinstance(test, exp.NEQ)
    elif isinstance(test, exp.In) and not test.args.get("query"):
        key, constants = test.this.unnest(), test.expressions
    elif _in_is_true(test):  # (k IN (...)) IS TRUE: a NULL among the constants matches nothing
        listed = test.this.unnest()
        key, constants = listed.this.unnest(), [c for c in listed.expressions if not isinstance(c, exp.Null)]
    else:
        return None
    return (negated, [read(c) for c in constants]) if to_sql(key) == text else None


def _in_is_true(node: exp.Expression) -> bool:
    """`(k IN (constants)) IS TRUE`: NOT of it keeps the rows of other keys whatever NULL the list holds (the form
    `compose` gives `k NOT IN (SELECT …)` over a subquery's released keys)."""
    listed = node.this.unnest() if isinstance(node, exp.Is) else None
    return (isinstance(node.expression, exp.Boolean) and node.expression.this is True and isinstance(listed, exp.In)
            and not listed.args.get("query"))


_UNKNOWN = object()
_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")  # a date PostgreSQL and Python read alike


def _comparable(value: object, domain: tuple) -> bool:
    """Whether Python compares `value` with the domain's values as PostgreSQL would: text with text, numbers with
    numbers, booleans with booleans, dates with dates (a date written as text is left to PostgreSQL: the condition
    narrows nothing)."""
    if value is None:
        return True
    kinds = [str] if isinstance(value, str) else [bool] if isinstance(value, bool) else \
        [datetime.date] if type(value) is datetime.date else [int, float]
    return all(v is None or (type(v) in kinds) for v in domain)


def _constant_value(node: exp.Expression) -> object:
    """A literal's value (None for NULL), or _UNKNOWN for anything else."""
    node = node.unnest()
    if isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.Boolean):
        return node.this
    if isinstance(node, exp.Literal):
        return node.to_py()
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
        return -node.this.to_py()
    if isinstance(node, exp.Cast) and node.to.this == exp.DataType.Type.DATE and isinstance(node.this, exp.Literal) \
            and node.this.is_string and _ISO_DATE.fullmatch(node.this.this):
        try:
            return datetime.date.fromisoformat(node.this.this)
        except ValueError:
            return _UNKNOWN
    return _UNKNOWN


TEXT_FUNCTIONS = (exp.Upper, exp.Lower, exp.Substring, exp.Trim, exp.DPipe, exp.Replace, exp.SplitPart, exp.Pad,
                  exp.Right, exp.Reverse)
TEXT_CASTS = (exp.DataType.Type.TEXT, exp.DataType.Type.VARCHAR)


def text_key(exprs: Expressions, node: exp.Expression) -> bool:
    """Whether a key's values are text: a column declared text, a text function, a cast to text, or a CASE one of
    whose results is."""
    node = node.unnest()
    if isinstance(node, exp.Column):
        column = exprs.column(node)
        return column is not None and column.type == "text"
    if isinstance(node, exp.Cast):
        return node.to.this in TEXT_CASTS
    if isinstance(node, exp.Coalesce | exp.Nullif):
        return text_key(exprs, node.this)
    if isinstance(node, exp.Case):  # CASE … THEN 'young' …: text where any branch is
        return any(b.is_string if isinstance(b, exp.Literal) else text_key(exprs, b) for b in branches_of(node))
    return isinstance(node, TEXT_FUNCTIONS)


def _refuse_hopeless_key(scope: Scope, node: exp.Expression) -> None:
    """Refuse a private key that gives each unit a group of its own: partition selection keeps a group only
    when enough units share it, so the answer would be empty after spending the budget."""
    column = node.this if isinstance(node, exp.Cast) else node
    if not isinstance(column, exp.Column) or scope.schema.row_level:
        return
    if scope.is_unit(column):
        raise UnsupportedQuery(f"GROUP BY {to_sql(node)} groups by the privacy unit: every group would hold "
                               "one unit, and no such group is ever released",
                               "group by a property that units share, or count units with COUNT(DISTINCT "
                               f"{to_sql(column)})")
    declared = scope.declared_column(column)
    if declared is not None and declared.domain is None and declared.type in CONTINUOUS_TYPES:
        raise UnsupportedQuery(f"GROUP BY {to_sql(node)} groups by a continuous value: nearly every group would "
                               "hold one unit, and no such group is ever released",
                               f"group by bins, e.g. width_bucket({to_sql(column)}, lo, hi, 10) or "
                               f"floor({to_sql(column)} / 1000)")


def _narrowed_bounds(scope: Scope, node: exp.Column, column: Column) -> tuple[float, float]:
    """A temporal column's declared bounds narrowed by the WHERE's comparisons of it with constants."""
    lower, upper = column.lower, column.upper
    for op, constant in _comparisons(scope, node):
        value = calendar_number(column.type, constant, scope.time_zone)
        if value is None:
            continue
        if column.type == "date":  # days, a time between midnights a fraction (`calendar_number`)
            if op in (">", ">=", "="):
                lower = max(lower, math.floor(value) + 1 if op == ">" else math.ceil(value))
            if op in ("<", "<=", "="):
                upper = min(upper, math.ceil(value) - 1 if op == "<" else math.floor(value))
            continue
        if op in (">", ">=", "="):
            lower = max(lower, value)
        if op in ("<", "<=", "="):
            upper = min(upper, value)
    return lower, upper


def _dated_domain(scope: Scope, nodes: list[exp.Expression], domains: list[tuple | None]) -> list[tuple] | None:
    """Public keys that are all functions of one bounded date column (a month's name beside its number, to order
    by: `GROUP BY to_char(day, 'Mon'), EXTRACT(MONTH FROM day)`): the combinations its days give, not every
    combination of each key's values, which would release 'Feb' in month 1 as a noisy count of nothing; and one
    such key where the WHERE narrows the days (`EXTRACT(MONTH FROM day) … WHERE day < '2024-04-01'`: months 1 to
    3, not 12, 9 of them with no row). So too for a bounded integer column (`CASE WHEN age < 30 THEN 'young' …
    END … WHERE age >= 65`: 'old' alone). Each day
    of the column's declared range, narrowed by the WHERE, is read as PostgreSQL reads it (`postprocess.evaluate`),
    a combination kept where each value is among its key's public values; None, and every combination, where a
    key cannot be read so or a key's public value is met on no day of the declared range (the reading would not
    be PostgreSQL's)."""
    columns = {to_sql(c) for node in nodes for c in node.find_all(exp.Column)}
    if not nodes or len(columns) != 1 or any(d is None for d in domains) or not all(
            node.find(exp.Column) for node in nodes):
        return None
    column_node = next(nodes[0].find_all(exp.Column))
    column = scope.declared_column(column_node)
    if column is None or column.type != "date" and not column.is_integer or not column.bounded \
            or column.upper - column.lower > WALKED_DAYS \
            or len(nodes) == 1 and not _comparisons(scope, column_node) and not _key_conditions(scope, column_node):
        return None  # (one key of a column the WHERE does not compare: every key's own values, read for nothing)
    numbers = range(int(column.lower), int(column.upper) + 1)
    if column.type == "date":
        lower, upper = _narrowed_bounds(scope, column_node, column)
        listed = _listed_days(scope, column_node)
        declared = declared_days(column)
        admitted = {d for n, d in zip(numbers, declared, strict=True)
                    if lower <= n <= upper and all((n in days) != negated for negated, days in listed)}
    elif any(node.find(exp.Mod, exp.Pow, exp.Anonymous) for node in nodes):
        return None  # (read over noisy floats: a remainder or power of integers may differ from PostgreSQL's)
    else:
        declared = list(numbers)
        admitted = set(_in_range(scope, column_node, tuple(declared)))
    if len(nodes) == 1 and len(admitted) == len(declared):
        return None  # one key over every value: its own values
    from dpsql.postprocess.evaluate import evaluate  # (post-processing reads the plan this package makes)

    nodes = [_whole_quotients(_periods_as_days(node), scope.exprs) for node in nodes]
    # a period (date_trunc) is read as its first day, and released as its key's value of that day
    released = [{_day_of(v): v for v in d if _at_midnight(v)} for d in domains]
    allowed = [set(r) for r in released]
    found: dict[tuple, None] = {}
    met: list[set] = [set() for _ in nodes]
    for value_of_column in declared:
        try:
            values = tuple(evaluate(node, {column_node.name: value_of_column}) for node in nodes)
        except (UnsupportedQuery, TypeError, ValueError, KeyError):
            return None
        for seen, value in zip(met, values, strict=True):
            seen.add(value)
        if value_of_column in admitted and all(v in a for v, a in zip(values, allowed, strict=True)):
            found[values] = None
    if not all(a <= m for a, m in zip(allowed, met, strict=True)):
        return None
    return [tuple(r[v] for v, r in zip(values, released, strict=True)) for values in found]


def _periods_as_days(node: exp.Expression) -> exp.Expression:
    """`node` with each period of a date (`date_trunc('month', day)`, a time at the session's midnight) as its first
    day, which `postprocess.evaluate` computes (`to_char(date_trunc('month', day), 'Mon YYYY')` reads the same)."""
    def as_day(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.TimestampTrunc | exp.DateTrunc) and not (
                isinstance(n.parent, exp.Cast) and n.parent.to.is_type("date")):
            return exp.cast(n.copy(), exp.DataType.build("date"))
        return n
    return node.transform(as_day)


def _at_midnight(value: object) -> bool:
    """Whether `value` is no time, or a time at midnight (a date's, or a period's start of a day or more)."""
    return not isinstance(value, datetime.datetime) or value.time() == datetime.time()


def _day_of(value: object) -> object:
    """A period's start (a time at the session's midnight) as its day; any other value as it is."""
    return value.date() if isinstance(value, datetime.datetime) else value


def _listed_days(scope: Scope, node: exp.Column) -> list[tuple[bool, set[float]]]:
    """(negated, the days' numbers) of each WHERE conjunct that lists the days of a date column (`day IN
    ('2024-01-01', '2024-01-02')`, `day = DATE '2024-06-01'`, `day <> …`: PostgreSQL reads a quoted constant as a
    date there); a list with a constant that is no day (a time, an expression) narrows nothing."""
    def day_number(constant: exp.Expression) -> object:
        if isinstance(constant.unnest(), exp.Null):
            return None
        number = calendar_number("date", constant, scope.time_zone)
        return number if number is not None and float(number).is_integer() else _UNKNOWN

    found = []
    for negated, values, _ in _key_conditions(scope, node, day_number):
        if any(v is _UNKNOWN for v in values):
            continue
        if negated and None in values:  # NOT IN with a NULL: no row passes
            return [(False, set())]
        found.append((negated, {v for v in values if v is not None}))
    return found


def _whole_quotients(node: exp.Expression, exprs: Expressions) -> exp.Expression:
    """`node` with each quotient of two integers an integer division, as PostgreSQL divides them (`age / 10` is 1
    at 15, `(day - DATE '2024-01-01') / 7` a week's number), for `postprocess.evaluate`, which divides numbers."""
    def whole(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Div) and exprs.kind(n.this) == exprs.kind(n.expression) == "integer":
            return exp.IntDiv(this=n.this.copy(), expression=n.expression.copy())
        return n
    return node.transform(whole)


def _domain(keys: list[GroupKey]) -> list[tuple] | None:
    if not keys or any(k.domain is None for k in keys):
        return None
    if math.prod(len(k.domain) for k in keys) > MAX_DOMAIN:
        return None
    return list(product(*(k.domain for k in keys)))
