"""Parse one query, bind its parameters, refuse what dpsql does not answer, and qualify it against the schema.

`check_query` is the stage's one public entry. What it returns is a single plain SELECT whose every column
is qualified with its table and whose simple subqueries and CTEs are merged into it (sqlglot's optimizer
does both), so the analysis sees one flat query. Anything not on the allowlist is refused here, before
anything runs on PostgreSQL.
"""

from __future__ import annotations

import datetime
import decimal
import functools
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import OptimizeError, ParseError, TokenError
from sqlglot.optimizer.merge_subqueries import merge_subqueries
from sqlglot.optimizer.qualify import qualify

from dpsql.errors import (
    InvalidParameter,
    PrivacyRefusal,
    QuerySyntaxError,
    UnknownObject,
    UnsupportedQuery,
)
from dpsql.schema import PrivacySchema

DIALECT = "postgres"
logging.getLogger("sqlglot").setLevel(logging.ERROR)  # its parser warnings would echo the analyst's text

AGGREGATES: dict[type[exp.Expression], str] = {
    exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg", exp.Variance: "var_samp", exp.VariancePop: "var_pop",
    exp.Stddev: "stddev", exp.StddevSamp: "stddev_samp", exp.StddevPop: "stddev_pop",
    exp.Min: "min", exp.Max: "max", exp.WithinGroup: "percentile",
}

# Node types a query may contain. Functions that can fail on some value are made total by the rewrite
# (division, modulo, sqrt, ln) or have their arguments checked by the analysis (casts, substring, ...).
ALLOWED_NODES: tuple[type[exp.Expression], ...] = (
    exp.Select, exp.From, exp.Join, exp.Where, exp.Group, exp.Having, exp.Order, exp.Ordered, exp.Limit,
    exp.Offset, exp.Table, exp.TableAlias, exp.Alias, exp.Column, exp.Identifier, exp.Star, exp.Literal,
    exp.Null, exp.Boolean, exp.Paren, exp.With, exp.CTE, exp.Subquery, exp.Distinct, exp.DataType, exp.Var,
    exp.And, exp.Or, exp.Not, exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Is, exp.In, exp.Between,
    exp.Like, exp.ILike, exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.Neg, exp.Abs, exp.Round, exp.Floor,
    exp.Ceil, exp.Greatest, exp.Least, exp.Coalesce, exp.Case, exp.If, exp.Cast, exp.WidthBucket, exp.Sqrt,
    exp.Ln, exp.Extract, exp.TimestampTrunc, exp.DateTrunc, exp.Lower, exp.Upper, exp.Length, exp.Substring,
    exp.DPipe, exp.Trim, exp.Tuple, exp.Nullif, exp.PercentileCont, exp.PercentileDisc, exp.Mode, exp.Exists,
    *AGGREGATES,
)


@dataclass(frozen=True)
class CheckedQuery:
    """A single plain SELECT, parameters bound, columns qualified, simple subqueries merged."""

    tree: exp.Select
    output_names: tuple[str, ...]  # the column names PostgreSQL would give the result

    @functools.cached_property
    def canonical(self) -> str:
        """Normalised SQL of the checked tree: the answer cache's key (with ε and the analyst). Computed once:
        the engine keeps checked queries in its plan cache and asks again for every answer."""
        return self.tree.sql(dialect=DIALECT, normalize=True, comments=False)


def check_query(sql: str, schema: PrivacySchema,
                params: Sequence[Any] | Mapping[str, Any] | None = None) -> CheckedQuery:
    """Parse `sql`, bind `params`, refuse unsupported or unsafe constructs, and qualify against `schema`."""
    tree = _parse_single_select(sql)
    tree = _bind_parameters(tree, params)
    _refuse_unsafe(tree)
    names = tuple(_output_name(e) for e in tree.expressions)
    _check_tables(tree, schema)
    try:
        tree = qualify(tree, schema=schema.sqlglot_schema(), dialect=DIALECT, validate_qualify_columns=True,
                       quote_identifiers=False)
    except OptimizeError as exc:
        raise UnknownObject(str(exc).split(". Line:")[0],
                            "every column must be declared in the privacy schema; `dpsql schema check` lists them"
                            ) from None
    tree = merge_subqueries(tree)
    _require_flat(tree)
    _drop_nulls_under_not_in(tree)
    return CheckedQuery(tree, names)


def _parse_single_select(sql: str) -> exp.Select:
    if not sql or not sql.strip():
        raise QuerySyntaxError("empty query", "send one SELECT statement")
    try:
        statements = [s for s in sqlglot.parse(sql, read=DIALECT) if s is not None]
    except (ParseError, TokenError) as exc:
        raise QuerySyntaxError(f"syntax error: {_first_line(exc)}") from None
    if len(statements) != 1:
        raise PrivacyRefusal(f"expected exactly one statement, got {len(statements)}",
                             "send one SELECT per query")
    tree = statements[0]
    if isinstance(tree, exp.SetOperation):
        raise UnsupportedQuery(f"{type(tree).__name__.upper()} is not supported",
                               "run each SELECT separately; each answer is noised and charged on its own")
    if not isinstance(tree, exp.Select):
        kind = tree.name.upper() if isinstance(tree, exp.Command) else tree.key.upper()
        raise PrivacyRefusal(f"only SELECT queries are answered, not {kind}",
                             "dpsql answers aggregate SELECT queries with noisy results; it never changes data")
    return tree


def _refuse_unsafe(tree: exp.Select) -> None:
    for node in tree.walk():
        if isinstance(node, exp.Select):
            if node.args.get("into"):
                raise PrivacyRefusal("SELECT ... INTO is not allowed", "dpsql only returns noisy answers")
            if node.args.get("locks"):
                raise PrivacyRefusal("FOR UPDATE / FOR SHARE is not allowed", "remove the locking clause")
            if node.args.get("distinct"):
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
            raise UnsupportedQuery(f"{_describe(node)} needs WITHIN GROUP (ORDER BY column)")
        if not isinstance(node, ALLOWED_NODES):
            raise UnsupportedQuery(f"{_describe(node)} is not supported by dpsql",
                                   "see the README for the SQL dpsql answers")
        if isinstance(node, exp.Window):
            raise UnsupportedQuery("window functions are not supported")


def _check_tables(tree: exp.Select, schema: PrivacySchema) -> None:
    cte_names = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    for table in tree.find_all(exp.Table):
        name = table.name.lower()
        if table.args.get("catalog") or (table.db and table.db.lower() != "public"):
            raise PrivacyRefusal(f"table {table.sql(dialect=DIALECT)} is outside the declared schema",
                                 "only tables declared in the privacy schema may be read")
        if name in cte_names and not table.db:
            continue
        if name not in schema.tables:
            raise UnknownObject(f'table "{name}" is not declared in the privacy schema',
                                "declared tables: " + ", ".join(sorted(schema.tables)))


def _require_flat(tree: exp.Select) -> None:
    """After merging, the only subqueries left may be semijoins in WHERE: EXISTS (SELECT ...) and
    x IN (SELECT ...), possibly under NOT, over plain SELECTs without nesting, grouping or aggregates."""
    semijoins = semijoin_selects(tree)
    allowed = {id(s) for s in semijoins} | {id(s.parent) for s in semijoins if isinstance(s.parent, exp.Subquery)}
    derived = derived_select(tree)
    if derived is not None:
        allowed |= {id(derived), id(derived.parent), id(tree.args.get("with_"))}
        if any(isinstance(n, exp.Select | exp.Subquery | exp.CTE) for n in derived.walk() if n is not derived):
            raise UnsupportedQuery("a per-unit subquery may not hold subqueries of its own")
    for node in tree.walk():
        if node is tree or id(node) in allowed:
            continue
        if isinstance(node, exp.Select | exp.Subquery | exp.CTE):
            raise UnsupportedQuery("this subquery cannot be merged into the outer query "
                                   "(aggregating, grouped or nested subqueries are not supported yet)",
                                   "write the query as one SELECT over joined tables, or as EXISTS / IN "
                                   "(SELECT ...) in WHERE")
    for select in semijoins:
        if any(select.args.get(k) for k in ("group", "having", "order", "limit", "offset", "with_")) \
                or select.find(*AGGREGATES):
            raise UnsupportedQuery("an EXISTS or IN subquery may not aggregate, group, order or limit",
                                   "filter its rows with WHERE only")


def _drop_nulls_under_not_in(tree: exp.Select) -> None:
    """`x NOT IN (SELECT c ...)` depends on the subquery as a whole wherever NULLs meet it, so one unit could flip
    every row: it is NULL for every x once one c is NULL, and for a NULL x it is TRUE when the subquery is empty
    and NULL otherwise. dpsql reads it as `x IS NOT NULL AND x NOT IN (the subquery's non-NULL values)`, which
    differs from PostgreSQL only when the subquery yields a NULL or nothing at all."""
    for select in semijoin_selects(tree):
        in_node = select.parent.parent if isinstance(select.parent, exp.Subquery) else None
        if not isinstance(in_node, exp.In) or not isinstance(_unparenthesised_parent(in_node), exp.Not):
            continue
        value = select.expressions[0].unalias() if len(select.expressions) == 1 else None
        if value is None:
            raise UnsupportedQuery("an IN subquery must select exactly one value")
        select.where(exp.Not(this=exp.Is(this=value.copy(), expression=exp.Null())), copy=False)
        # a separate conjunct of the outer WHERE (a NOT IN not joined by AND is refused by the analysis)
        tree.where(exp.Not(this=exp.Is(this=in_node.this.copy(), expression=exp.Null())), copy=False)


def _unparenthesised_parent(node: exp.Expression) -> exp.Expression | None:
    parent = node.parent
    while isinstance(parent, exp.Paren):
        parent = parent.parent
    return parent


def derived_select(tree: exp.Select) -> exp.Select | None:
    """The grouped SELECT that `tree` reads FROM, as a subquery or a WITH query (None if it reads tables)."""
    source = tree.args["from_"].this if tree.args.get("from_") else None
    if isinstance(source, exp.Subquery) and isinstance(source.this, exp.Select) and source.this.args.get("group"):
        return source.this
    if isinstance(source, exp.Table) and not source.db and tree.args.get("with_"):
        ctes = tree.args["with_"].expressions
        if len(ctes) == 1 and ctes[0].alias_or_name == source.name and isinstance(ctes[0].this, exp.Select) \
                and ctes[0].this.args.get("group"):
            return ctes[0].this
    return None


def semijoin_selects(tree: exp.Select) -> list[exp.Select]:
    """The SELECTs of the EXISTS / IN (SELECT ...) conditions in `tree`'s WHERE clause."""
    where = tree.args.get("where")
    if where is None:
        return []
    found = []
    for node in where.walk():
        if node.find_ancestor(exp.Select) is not tree:  # one level only: not a subquery's own subqueries
            continue
        if isinstance(node, exp.Exists) and isinstance(node.this, exp.Select):
            found.append(node.this)
        elif isinstance(node, exp.In) and isinstance(node.args.get("query"), exp.Subquery) \
                and isinstance(node.args["query"].this, exp.Select):
            found.append(node.args["query"].this)
    return found


def _bind_parameters(tree: exp.Select, params: Sequence[Any] | Mapping[str, Any] | None) -> exp.Select:
    slots = [n for n in tree.walk() if isinstance(n, exp.Placeholder | exp.Parameter)]
    if not slots:
        if params:
            raise InvalidParameter(f"{len(params)} parameters given but the query has no placeholders")
        return tree
    if params is None:
        raise InvalidParameter("the query has placeholders but no parameters were given")
    positional = 0
    for slot in slots:
        if isinstance(slot, exp.Parameter):  # $1, $2, ...
            index = int(slot.name) - 1
            value = _lookup(params, index)
        elif slot.name and slot.name != "?":  # %(name)s
            if not isinstance(params, Mapping):
                raise InvalidParameter(f"named placeholder %({slot.name})s needs a mapping of parameters")
            if slot.name not in params:
                raise InvalidParameter(f"no value for parameter %({slot.name})s")
            value = params[slot.name]
        else:  # %s
            value = _lookup(params, positional)
            positional += 1
        slot.replace(literal(value))
    if isinstance(params, Sequence) and positional and positional != len(params):
        raise InvalidParameter(f"the query has {positional} placeholders but {len(params)} parameters were given")
    return tree


def _lookup(params: Sequence[Any] | Mapping[str, Any], index: int) -> Any:
    if isinstance(params, Mapping) or not 0 <= index < len(params):
        raise InvalidParameter(f"no value for parameter {index + 1}")
    return params[index]


def literal(value: Any) -> exp.Expression:
    """A SQL literal for a Python value (parameters are bound into the tree, never into text)."""
    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int | decimal.Decimal):
        return exp.Literal.number(str(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidParameter(f"parameter {value} is not a finite number")
        return exp.Literal.number(repr(value))
    if isinstance(value, datetime.datetime | datetime.date):
        kind = "TIMESTAMP" if isinstance(value, datetime.datetime) else "DATE"
        return exp.Cast(this=exp.Literal.string(value.isoformat()), to=exp.DataType.build(kind))
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidParameter("string parameters may not contain NUL characters")
        return exp.Literal.string(value)
    if isinstance(value, list | tuple):
        return exp.Tuple(expressions=[literal(v) for v in value])
    raise InvalidParameter(f"unsupported parameter type {type(value).__name__}")


def _output_name(node: exp.Expression) -> str:
    """The column name PostgreSQL gives a select item."""
    if isinstance(node, exp.Alias):
        return node.alias
    if isinstance(node, exp.Column):
        return node.name
    if isinstance(node, exp.Cast):
        return _output_name(node.this)
    if isinstance(node, exp.Paren):
        return _output_name(node.this)
    if isinstance(node, exp.WithinGroup):
        return _output_name(node.this)
    if isinstance(node, exp.Func):
        return node.sql_name().lower()
    return "?column?"


def _describe(node: exp.Expression) -> str:
    if isinstance(node, exp.Anonymous):
        return f"function {node.name}()"
    if isinstance(node, exp.Func):
        return f"function {node.sql_name()}()"
    return node.key.upper().replace("_", " ")


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
