"""A windowed source (`sql.shape.is_windowed_source`, written by `sql.unit_windows`): a table's rows with windows
over each unit's rows (each person's first visit by ROW_NUMBER(), the days since their last visit by LAG, a running
total), read as that table with a column for each window.

Rule, under unit-level privacy: every window's PARTITION BY holds the table's unit column (or a child table's parent
key: the prescriptions of one visit are one person's), so it reads the rows of one unit alone. Each row of the
source is then a row of the table (its WHERE only drops rows), with the table's unit, and its window values are a
function of that unit's rows: one unit added or removed adds or removes its own rows, the other units' rows and
values unchanged, as for the table itself. The rewrite bounds the rows per unit
outside, as for the table. Each window column is declared by the values it can take, and clamped to them wherever
it is read as a value, like a declared column:
- ROW_NUMBER, RANK, DENSE_RANK: 1 to the table's declared rows per unit (k); NTILE(n): 1 to n; PERCENT_RANK and
  CUME_DIST: 0 to 1; COUNT: 0 to k;
- LAG, LEAD, FIRST_VALUE, LAST_VALUE of a column: that column's declaration (its bounds or its domain);
- SUM of a column: k times its range; AVG, MIN, MAX: its range. A SUM or AVG adds the column's values clamped to
  its bounds, as the rewrite reads them everywhere: an extreme value stored cannot make the sum overflow, an error
  that one person's rows would otherwise cause.

Ties: PostgreSQL orders rows that tie on a window's ORDER BY as it happens to read them, and where other units'
rows are stored can change that order. A window whose value depends on it (ROW_NUMBER, NTILE, LAG, LEAD,
FIRST_VALUE, LAST_VALUE, a ROWS frame) is computed with the row's declared columns as its last ORDER BY keys, so
tied rows are ordered by what they hold (in every engine's SQL); rows that tie on all of them are the same row to
every reader.
"""

from __future__ import annotations

import dataclasses

from sqlglot import exp

from dpsql.analysis.scope import Scope
from dpsql.errors import UnsupportedQuery
from dpsql.schema import Column, Table
from dpsql.sql import operands, to_sql
from dpsql.sql.unit_windows import unit_partition_keys

TIE_SENSITIVE = (exp.RowNumber, exp.Ntile, exp.Lag, exp.Lead, exp.FirstValue, exp.LastValue)
RANKS = (exp.RowNumber, exp.Rank, exp.DenseRank)
VALUES = (exp.Lag, exp.Lead, exp.FirstValue, exp.LastValue)
SUM_TYPES = {"smallint": "bigint", "integer": "bigint", "bigint": "numeric"}  # PostgreSQL's SUM and AVG types
AVG_TYPES = {"smallint": "numeric", "integer": "numeric", "bigint": "numeric", "real": "double precision"}


def read(scope: Scope, alias: str, select: exp.Select) -> tuple[Table, exp.Subquery]:
    """The windowed source `select`, read as `alias`: the table it stands for (the declared table and a column per
    window), and the SQL to read in its place (ties broken, its WHERE guarded)."""
    source = select.args["from_"].this
    declared = scope.schema.tables.get(source.name)
    if scope.schema.row_level or declared is None or declared.public or not unit_partition_keys(declared):
        raise UnsupportedQuery(f"a window over the rows of {source.name} reads other rows than one unit's",
                               "under row-level privacy, or over a table without the unit's column, aggregate "
                               "over all rows instead")
    sql = select.copy()
    inner = sql.args["from_"].this.alias_or_name
    if inner != alias:  # the merge renamed the source outside: its reader names it by the outer alias
        for column in sql.find_all(exp.Column):
            if column.table == inner:
                column.set("table", exp.to_identifier(alias))
        sql.args["from_"].this.set("alias", exp.TableAlias(this=exp.to_identifier(alias)))
    columns = dict(declared.columns)
    windows = [item for item in sql.expressions if isinstance(item.this, exp.Window)]
    for item in windows:
        if item.alias in columns:
            raise UnsupportedQuery(f"the window {_written(item.this)} is named {item.alias}, as a column of "
                                   f"{source.name} is", f"name it otherwise: … AS {item.alias}_w")
        columns[item.alias] = _window_column(item.alias, item.this, declared, alias)
        _break_ties(item.this, alias, list(declared.columns))
    # every row of the table, whichever of its columns the subquery named: its unit's column for the rewrite too
    sql.set("expressions", [*(exp.alias_(exp.column(c, table=alias), c) for c in declared.columns), *windows])
    numbered = [(kept, _partitions(item.this, declared, alias)) for item in windows
                if (kept := _numbered_rows(scope, alias, item.alias)) is not None]
    rows = max(1, min([declared.max_rows_per_unit, *(kept * parts for kept, parts in numbered if parts)]))
    table = dataclasses.replace(declared, columns=columns, max_rows_per_unit=rows)
    scope.aliases[alias] = table  # the WHERE's and the windows' columns are the table's, read as the guard reads them
    for window in sql.find_all(exp.Window):
        if isinstance(window.this, exp.Sum | exp.Avg):  # summed within its bounds: a stored value cannot overflow
            window.this.set("this", scope.exprs.guard(window.this.this))
    if sql.args.get("where"):
        scope.exprs.check(sql.args["where"].this)
        sql.set("where", exp.Where(this=scope.exprs.guard(sql.args["where"].this)))
    return table, exp.Subquery(this=sql, alias=exp.TableAlias(this=exp.to_identifier(alias)))


def _partitions(window: exp.Window, table: Table, alias: str) -> int | None:
    """How many partitions of one unit's rows a ROW_NUMBER() numbers 1, 2, 3, … (whatever they tie on): one where it
    is partitioned by the unit column alone, one per value of each other key with a declared domain (and NULL) or a
    boolean (`PARTITION BY person_id, category`: 8 categories, 9 partitions); None for any other window. A value a
    row holds beyond the domain is a partition more, whose rows the per-unit stage cuts: only accuracy rests on it."""
    partition = window.args.get("partition_by") or []
    if not isinstance(window.this, exp.RowNumber) or not all(isinstance(c, exp.Column) and c.table == alias
                                                              for c in partition) \
            or table.unit_column not in {c.name for c in partition}:
        return None
    parts = 1
    for column in {c.name for c in partition} - {table.unit_column}:
        declared = table.columns.get(column)
        values = None if declared is None else declared.declared_values
        if values is None:
            return None
        parts *= values + 1
    return parts


def _numbered_rows(scope: Scope, alias: str, name: str) -> int | None:
    """The most rows of a unit that the query's conditions keep by their row number `alias.name` (`rn = 1`, `rn <=
    3`, `rn IN (1, 2)`), from the WHERE and the ON of inner joins; None where none does. The per-unit stage enforces
    the bound whatever the conditions, so a wrong reading could only cut rows, never leak."""
    where = scope.tree.args.get("where")
    conditions = [where.this] if where is not None else []
    conditions += [j.args["on"] for j in scope.tree.args.get("joins") or [] if j.args.get("on") and (
        not j.side or j.side.upper() == "LEFT" and j.this.alias_or_name == alias)]  # (its own ON: its rows kept)
    kept = [_kept(test, alias, name) for condition in conditions for test in operands(condition)]
    return min((k for k in kept if k is not None), default=None)


def _kept(test: exp.Expression, alias: str, name: str) -> int | None:
    """How many row numbers 1, 2, 3, … the condition `test` admits, if it compares the column `alias.name` with
    whole-number constants."""
    def numbered(node: exp.Expression) -> bool:
        return isinstance(node, exp.Column) and node.table == alias and node.name == name

    def whole(node: exp.Expression) -> int | None:
        return int(node.this) if isinstance(node, exp.Literal) and node.is_int else None

    test = test.unnest()
    if isinstance(test, exp.In) and numbered(test.this) and not test.args.get("query"):
        values = [whole(v) for v in test.expressions]
        return None if None in values else len({v for v in values if v >= 1})
    if isinstance(test, exp.Between) and numbered(test.this):
        low, high = whole(test.args["low"]), whole(test.args["high"])
        return None if low is None or high is None else max(0, high - max(low, 1) + 1)
    flipped = {exp.GT: exp.LT, exp.GTE: exp.LTE, exp.LT: exp.GT, exp.LTE: exp.GTE, exp.EQ: exp.EQ}
    if type(test) not in flipped:
        return None
    kind, column, value = type(test), test.this, test.expression
    if numbered(value):
        kind, column, value = flipped[kind], value, column
    bound = whole(value)
    if not numbered(column) or bound is None:
        return None
    return 1 if kind is exp.EQ else max(0, bound) if kind is exp.LTE else max(0, bound - 1) if kind is exp.LT \
        else None


def _window_column(name: str, window: exp.Window, table: Table, alias: str) -> Column:
    """How the outer query sees one window's values."""
    partition = window.args.get("partition_by") or []
    keys = unit_partition_keys(table)
    if not any(isinstance(c, exp.Column) and c.name in keys and c.table == alias for c in partition):
        by_unit = window.copy()
        by_unit.set("partition_by", [exp.column(min(keys))])
        raise UnsupportedQuery(f"{_written(window)} reads other units' rows",
                               f"partition it by the unit: {_written(by_unit)}")
    function, k = window.this, float(table.max_rows_per_unit)
    if isinstance(function, RANKS):
        return Column(name, "bigint", 1.0, k)
    if isinstance(function, exp.Ntile):
        return Column(name, "integer", 1.0, float(function.this.this))
    if isinstance(function, exp.PercentRank | exp.CumeDist):
        return Column(name, "double precision", 0.0, 1.0)
    if isinstance(function, exp.Count):
        return Column(name, "bigint", 0.0, k)
    argument = function.this
    column = table.columns.get(argument.name) if isinstance(argument, exp.Column) else None
    if column is None or column.local is not None:
        raise UnsupportedQuery(f"{_written(window)} reads {_written(argument)}, not a declared column",
                               "compute windows over the table's declared columns")
    if isinstance(function, VALUES) or isinstance(function, exp.Min | exp.Max) and column.is_temporal:
        values = dataclasses.replace(column, name=name, unique=False, max_frequency=None)
        return _with_default(values, function.args.get("default"), table, window)
    if not (column.is_numeric and column.bounded):
        raise UnsupportedQuery(f"{_written(window)} sums or averages {_written(argument)}, which has no declared "
                               "numeric bounds", "declare its lower and upper bounds in the privacy schema")
    if isinstance(function, exp.Sum):
        return Column(name, SUM_TYPES.get(column.type, column.type), min(0.0, k * column.lower),
                      max(0.0, k * column.upper))
    kind = AVG_TYPES.get(column.type, column.type) if isinstance(function, exp.Avg) else column.type
    return Column(name, kind, column.lower, column.upper)


def _with_default(values: Column, default: exp.Expression | None, table: Table, window: exp.Window) -> Column:
    """A LAG's or LEAD's column `values` declared to hold its default too (a unit's first row has no row before):
    the hull of the bounds, or the union of the domains, of the column read and a number or the row's own column
    (`LAG(day, 1, day)`)."""
    if default is None or isinstance(default, exp.Null):
        return values
    other = table.columns.get(default.name) if isinstance(default, exp.Column) else None
    if other is not None and other.local is None and other.type == values.type:
        if values.domain is not None and other.domain is not None:
            return dataclasses.replace(values, domain=tuple(dict.fromkeys((*values.domain, *other.domain))))
        if values.bounded and other.bounded:
            return dataclasses.replace(values, lower=min(values.lower, other.lower),
                                       upper=max(values.upper, other.upper))
    elif (constant := _constant(default, values)) is not None:
        if values.domain is not None:
            return dataclasses.replace(values, domain=tuple(dict.fromkeys((*values.domain, constant))))
        if values.bounded and values.is_numeric:
            return dataclasses.replace(values, lower=min(values.lower, constant), upper=max(values.upper, constant))
    read = _written(window.this.this)
    raise UnsupportedQuery(f"{_written(window)} may return its default {_written(default)}, which is not declared "
                           f"with bounds or values of {read}'s type", f"default to NULL and replace it outside: "
                           f"COALESCE({values.name}, …), or default to a column of {read}'s type")


def _constant(default: exp.Expression, values: Column) -> float | str | None:
    """A default written as a constant of `values`' kind: a number for a number, a string for a text; None else."""
    number = default.this if isinstance(default, exp.Neg) else default
    if isinstance(number, exp.Literal) and number.is_number and values.is_numeric:
        return -float(number.this) if number is not default else float(number.this)
    if isinstance(default, exp.Literal) and default.is_string and values.domain is not None \
            and not values.is_numeric and not values.is_temporal:
        return default.this
    return None


def _break_ties(window: exp.Window, alias: str, columns: list[str]) -> None:
    """`window` (a copy) ordered by the row's declared columns last, where its value depends on the order of ties."""
    spec = window.args.get("spec")
    if not (isinstance(window.this, TIE_SENSITIVE) or spec is not None and (spec.args.get("kind") or "").upper()
            == "ROWS"):
        return
    keys = list(window.args["order"].expressions) if window.args.get("order") else []
    window.set("order", exp.Order(expressions=[*keys, *(exp.Ordered(this=exp.column(c, table=alias))
                                                         for c in columns)]))


def _written(node: exp.Expression) -> str:
    """`node` as the analyst wrote it: its columns unqualified (a windowed source reads one table)."""
    copy = node.copy()
    for column in copy.find_all(exp.Column):
        column.set("table", None)
    return to_sql(copy)
