"""The vocabulary of the checked query: the dialect, the aggregates dpsql knows, and `CheckedQuery`."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import TypeVar

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.helper import name_sequence

from dpsql.errors import Error, UnsupportedQuery

DIALECT = "postgres"
MAX_DOMAIN = 10_000  # largest public key set released in full (every key, empty ones too)

_generators = threading.local()


POSITIONS = ("line", "col", "start", "end")  # where the parser found a token: kept in each node's meta


def forget_positions(tree: exp.Expression) -> exp.Expression:
    """`tree` without the parser's token positions, which nothing reads: every copy of a node deep-copies its
    meta, and a tree without them copies 2.5 times faster (a plan copies and renders its trees dozens of times)."""
    for node in tree.walk():
        meta = node._meta
        if meta:
            for key in POSITIONS:
                meta.pop(key, None)
            if not meta:
                node._meta = None
    return tree


def name_written_outputs(tree: exp.Expression, sql: str) -> exp.Expression:
    """`tree` with each output that is a function sqlglot reads under another name (var_samp as variance, ceiling
    as ceil, substr as substring, date_part as EXTRACT) aliased with the name `sql` writes, in every SELECT:
    PostgreSQL names the column after the function written, and an alias holds that name through every rewrite."""
    for extract in tree.find_all(exp.Extract):
        if _date_part(extract, sql):
            extract.meta["written"] = "date_part"  # a double precision, where EXTRACT is a numeric
    for select in list(tree.find_all(exp.Select)):
        select.set("expressions", [_as_written(item, sql) for item in select.expressions])
    return tree


def _date_part(node: exp.Extract, sql: str) -> bool:
    """Whether `sql` writes `node` as date_part('field', x), which sqlglot reads as EXTRACT(field FROM x): the text
    before its argument ends in a comma, not in FROM."""
    starts = [n.meta["start"] for n in node.expression.walk() if n.meta.get("start") is not None]
    return bool(starts) and sql[:min(starts)].rstrip().endswith(",")


def _as_written(item: exp.Expression, sql: str) -> exp.Expression:
    function = item
    while isinstance(function, exp.Cast | exp.Paren | exp.WithinGroup | exp.Window | exp.Filter):
        function = function.this
    if not isinstance(function, exp.Func | exp.Mod) or isinstance(function, exp.Anonymous):
        return item
    written = _written_name(function, sql)
    return item if written is None or written == _function_name(function) else exp.alias_(item, written)


def _written_name(node: exp.Expression, sql: str) -> str | None:
    """The name `sql` calls `node` by, where the parser kept its position (date_part, which has none, is marked)."""
    if isinstance(node, exp.Extract):
        return node.meta.get("written")
    start, end = node.meta.get("start"), node.meta.get("end")
    if start is None or end is None:
        return None
    written = sql[start:end + 1].lower()
    return written if written.isidentifier() and sql[end + 1:].lstrip().startswith("(") else None


def to_sql(node: exp.Expression, normalize: bool = False, disposable: bool = False) -> str:
    """PostgreSQL text of a tree (identifiers and keywords lower-cased and comments dropped with `normalize`).
    sqlglot's generator may change the tree it renders, so it renders a copy unless the tree is `disposable` (a
    copy the caller made for this rendering alone).

    Each thread reuses one generator per option set: sqlglot's compiled Generator (sqlglotc 30) leaks about 56
    bytes per instance, and a query makes dozens, which grew a serving process by megabytes a minute."""
    generator = getattr(_generators, "normalize" if normalize else "plain", None)
    if generator is None:
        options = {"normalize": True, "comments": False} if normalize else {}
        generator = Dialect.get_or_raise(DIALECT).generator(**options)
        setattr(_generators, "normalize" if normalize else "plain", generator)
    generator._next_name = name_sequence("_t")  # as a fresh generator would name anonymous aliases
    return generator.generate(node, copy=not disposable)


Named = TypeVar("Named", exp.Column, exp.Subquery)
WRITTEN = "dpsql_written"  # meta key of a column or subquery a spelling put in place of the analyst's constructs


def written_as(node: Named, *constructs: exp.Expression) -> Named:
    """`node`, a column or a subquery that a spelling puts in place of `constructs` (windows it computes apart),
    marked so that a refusal or a note that names it names them as the analyst wrote them (`in_analyst_words`)."""
    node.meta[WRITTEN] = ", ".join(to_sql(c) for c in constructs)
    return node


def in_analyst_terms(error: Error, tree: exp.Expression) -> Error:
    """`error` (changed in place) with its message and hint `in_analyst_words`."""
    error.message = in_analyst_words(error.message, tree)
    error.hint = error.hint and in_analyst_words(error.hint, tree)
    error.args = (error.message, *error.args[1:])
    return error


def in_analyst_words(text: str, tree: exp.Expression) -> str:
    """`text` with each dpsql name of a construct in `tree` marked by `written_as` spelled as the analyst wrote it,
    with or without a qualifier: "the divisor NULLIF(dpsql_w.dpsql_w0, 0)" reads "the divisor NULLIF(SUM(amount)
    OVER (PARTITION BY person_id), 0)". A name two constructs share is left as it is."""
    texts: dict[str, set[str]] = {}
    for node in tree.find_all(exp.Column, exp.Subquery):
        if WRITTEN in node.meta and node.alias_or_name.startswith("dpsql_"):
            texts.setdefault(node.alias_or_name, set()).add(node.meta[WRITTEN])
    for name, written in texts.items():
        if len(written) == 1:
            pattern = re.compile(rf'(?:"?\w+"?\.)?"?\b{re.escape(name)}\b(?!"?\.)"?')  # (not a qualifier)
            text = pattern.sub(written.pop().replace("\\", "\\\\"), text)  # a template: backslashes escape
    return text


AGGREGATES: dict[type[exp.Expression], str] = {
    exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg", exp.Variance: "var_samp", exp.VariancePop: "var_pop",
    exp.Stddev: "stddev_samp", exp.StddevSamp: "stddev_samp", exp.StddevPop: "stddev_pop",  # stddev is _samp
    exp.Min: "min", exp.Max: "max", exp.WithinGroup: "percentile",
    exp.CovarPop: "covar_pop", exp.CovarSamp: "covar_samp", exp.Corr: "corr", exp.RegrSlope: "regr_slope",
    exp.RegrIntercept: "regr_intercept",
}


@dataclass(frozen=True)
class CheckedQuery:
    """A single plain SELECT, parameters bound, columns qualified, simple subqueries merged."""

    tree: exp.Select
    output_names: tuple[str, ...]  # the column names PostgreSQL would give the result
    canonical: str  # one text for every spelling of the query: with ε and the analyst, the answer cache's key
    fresh: bool = False  # it read the clock (now(), current_date) or drew a sample's seed when it was checked: the
    # same text is another query a moment later


def operands(node: exp.Expression, connector: type[exp.Expression] = exp.And) -> list[exp.Expression]:
    """The operands of a chain of ANDs (or ORs), through parentheses: (a AND b) AND c has three."""
    node = node.unnest()
    if isinstance(node, connector):
        return operands(node.this, connector) + operands(node.expression, connector)
    return [node]


def replace_keeping_precedence(node: exp.Expression, value: exp.Expression) -> None:
    """Put `value` where `node` stands, in parentheses where `node` is an operator's operand (a + b replacing c
    in c * 2 keeps its own precedence there)."""
    operand = isinstance(node.parent, exp.Binary | exp.Unary) and not isinstance(value, exp.Alias)
    node.replace(exp.Paren(this=value) if operand else value)


def value_asked(condition: exp.Expression, local: set[str]) -> tuple[str, exp.Expression] | None:
    """(column, value) where `condition` asks a local column for one value: `c`, `NOT c`, `c IS TRUE`,
    `c = v` or `v = c` with v a literal, or `v = ANY(c)` of an array column (its reports of v)."""
    if isinstance(condition, exp.Paren):
        return value_asked(condition.this, local)
    if isinstance(condition, exp.Column) and condition.name in local:
        return condition.name, exp.true()
    if isinstance(condition, exp.Not) and isinstance(condition.this, exp.Column) and condition.this.name in local:
        return condition.this.name, exp.false()
    if isinstance(condition, exp.Is) and isinstance(condition.this, exp.Column) and isinstance(
            condition.expression, exp.Boolean) and condition.this.name in local:
        return condition.this.name, condition.expression.copy()
    if isinstance(condition, exp.EQ) and isinstance(condition.expression, exp.Any):
        column, value = condition.expression.this.unnest(), condition.this
        if isinstance(column, exp.Column) and column.name in local and isinstance(value, exp.Literal):
            return column.name, value.copy()
        return None
    if isinstance(condition, exp.EQ):
        for column, value in ((condition.this, condition.expression), (condition.expression, condition.this)):
            if isinstance(column, exp.Column) and column.name in local and isinstance(value, exp.Literal | exp.Boolean):
                return column.name, value.copy()
    return None


def indicator_of(argument: exp.Expression, column: str, aggregate: exp.Expression) -> tuple[bool, bool] | None:
    """(the value v counted, whether a NULL report adds 0 to an average) where `aggregate` of `argument` counts
    or averages the reports of v of a randomized-response boolean `column`: SUM or AVG of `col::int` (v true;
    NULL stays NULL) or of `CASE WHEN col [= v | IS v] THEN 1 ELSE 0 END` (0 for NULL too), SUM of `CASE WHEN col
    THEN 1 END`, COUNT of `CASE WHEN col THEN <not NULL> END` (COUNT(*) FILTER (WHERE col), as the shape spells
    it)."""
    if isinstance(argument, exp.Cast) and argument.to.is_type(*exp.DataType.INTEGER_TYPES):
        named = isinstance(argument.this, exp.Column) and argument.this.name == column
        return (True, False) if named and not isinstance(aggregate, exp.Count) else None
    if not isinstance(argument, exp.Case) or argument.this is not None or len(argument.args.get("ifs") or []) != 1:
        return None
    branch, default = argument.args["ifs"][0], argument.args.get("default")
    asked, then = value_asked(branch.this, {column}), branch.args.get("true")
    value = bool(asked[1].this) if asked is not None and isinstance(asked[1], exp.Boolean) else None
    if value is None or not isinstance(then, exp.Literal):
        return None
    if isinstance(aggregate, exp.Count):
        return (value, True) if default is None else None
    zero = isinstance(default, exp.Literal) and not default.is_string and float(default.this) == 0
    if then.is_string or float(then.this) != 1 or not (zero or default is None and isinstance(aggregate, exp.Sum)):
        return None
    return value, True


def signed_literal(node: exp.Expression) -> tuple[exp.Literal, int] | None:
    """(the literal, its sign) of a constant written as a literal, negated or bracketed or not (`-3`, `(0)`);
    None for anything else."""
    node = node.unnest()
    sign = -1 if isinstance(node, exp.Neg) else 1
    literal = node.this.unnest() if sign < 0 else node
    return (literal, sign) if isinstance(literal, exp.Literal) else None


def branches_of(node: exp.Expression) -> list[exp.Expression] | None:
    """The expressions whose values a COALESCE, CASE, GREATEST or LEAST returns; None for any other node."""
    if isinstance(node, exp.Coalesce | exp.Greatest | exp.Least):
        return [node.this, *node.expressions]
    if isinstance(node, exp.Case):
        default = node.args.get("default")
        return [branch.args["true"] for branch in node.args.get("ifs") or []] + ([default] if default else [])
    return None


def output_name(node: exp.Expression) -> str:
    """The column name PostgreSQL gives a select item."""
    if isinstance(node, exp.Alias):
        return node.alias
    if isinstance(node, exp.Column):
        return node.name
    if isinstance(node, exp.Cast):
        return output_name(node.this)
    if isinstance(node, exp.Paren):
        return output_name(node.this)
    if isinstance(node, exp.WithinGroup | exp.Window | exp.Filter):
        return output_name(node.this)
    if isinstance(node, exp.Func | exp.Mod):
        return _function_name(node)
    return "?column?"


def _function_name(node: exp.Func) -> str:
    """PostgreSQL's name of a function sqlglot read from a special form: trim(x) is btrim, date_part(...) and
    EXTRACT are apart, position(a IN b) is position."""
    if isinstance(node, exp.Trim):
        return {"LEADING": "ltrim", "TRAILING": "rtrim"}.get(str(node.args.get("position") or "").upper(), "btrim")
    if isinstance(node, exp.Mod):  # a % b (mod(a, b) is named as written: `name_written_outputs`)
        return "?column?"
    if isinstance(node, exp.StrPosition):
        return "position"
    return node.sql_name().lower()


def limit_clause(tree: exp.Expression, clause: str) -> int | None:
    """The whole-number constant of `tree`'s LIMIT or OFFSET (`clause`), None when it has none; anything else is
    refused, since rows are cut after noise."""
    node = tree.args.get(clause)
    if node is None:
        return None
    value = node.expression if isinstance(node, exp.Limit | exp.Offset) else node
    if isinstance(value, exp.Literal) and value.is_int and int(value.this) >= 0:
        return int(value.this)
    raise UnsupportedQuery(f"{clause.upper()} must be a whole-number constant", "e.g. LIMIT 10 OFFSET 20")


def bytewise(node: exp.Expression) -> exp.Expression:
    """`node` as text compared byte by byte: equal keys are then spelled alike."""
    return exp.Collate(this=exp.Cast(this=node, to=exp.DataType.build("text")),
                       expression=exp.Identifier(this="C", quoted=True))


def inside(node: exp.Expression, ancestor: exp.Expression) -> bool:
    """Whether `ancestor` is one of `node`'s parents (by identity, not by equal text)."""
    parent = node.parent
    while parent is not None and parent is not ancestor:
        parent = parent.parent
    return parent is ancestor
