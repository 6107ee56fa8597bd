"""The canonical text of a checked query: two spellings of one question get one text, so they share one answer.

An analyst who could ask the same question in many spellings (another alias, quotes, `public.`, a comment, an
output name, `030` for `30`, `b AND a` for `a AND b`) would get fresh noise for each and could average it away;
with one canonical text they get the stored answer again, free. Only rewrites that keep PostgreSQL's meaning are
made, because two queries with one text must have one answer.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from sqlglot import exp

from dpsql.sql.query import operands, to_sql

_RENAMED = "dpsql_t"  # canonical table aliases are dpsql_t0, dpsql_t1, ... in order of appearance
_NUMBER = re.compile(r"[0-9]{1,30}(\.[0-9]{0,30})?([eE][+-]?[0-9]{1,3})?")
_FLIPPED: dict[type[exp.Expression], type[exp.Expression]] = {exp.LT: exp.GT, exp.LTE: exp.GTE}
_SYMMETRIC = (exp.EQ, exp.NEQ, exp.NullSafeEQ, exp.NullSafeNEQ)


def canonical_sql(tree: exp.Select) -> str:
    """One text for every spelling of the checked query `tree` (which is left untouched)."""
    tree = tree.copy()
    _number_outputs(tree)
    _rename_table_aliases(tree)
    for table in tree.find_all(exp.Table):
        if table.db.lower() == "public":  # qualification let only public, or no schema, through
            table.set("db", None)
    for identifier in tree.find_all(exp.Identifier):  # PostgreSQL folds unquoted names to lower case
        identifier.set("this", identifier.name if identifier.quoted else identifier.name.lower())
        identifier.set("quoted", True)
    _normalise_below(tree)
    return to_sql(tree, normalize=True)


def _number_outputs(tree: exp.Select) -> None:
    """Output names become positions (the caller re-applies its own names), and ORDER BY follows them."""
    positions = {}
    for i, item in enumerate(tree.expressions):
        if isinstance(item, exp.Alias):
            positions.setdefault(item.alias, f"_col_{i}")
            item.set("alias", exp.to_identifier(f"_col_{i}"))
    order = tree.args.get("order")
    for column in order.find_all(exp.Column) if order else ():
        if not column.table and column.name in positions:
            column.set("this", exp.to_identifier(positions[column.name]))


def _rename_table_aliases(tree: exp.Select) -> None:
    """Aliases of tables and subqueries become dpsql_t0, dpsql_t1, ... (a one-to-one renaming keeps the meaning)."""
    if any(i.name.lower().startswith(_RENAMED) for i in tree.find_all(exp.Identifier)):
        return  # a name like ours is already taken; leave the spelling as it is rather than risk a clash
    renamed: dict[str, str] = {}
    for alias in tree.find_all(exp.TableAlias):
        if isinstance(alias.parent, (exp.Table, exp.Subquery)) and alias.name:
            renamed.setdefault(alias.name, f"{_RENAMED}{len(renamed)}")
            alias.set("this", exp.to_identifier(renamed[alias.name]))
    for column in tree.find_all(exp.Column):
        if column.table in renamed:
            column.set("table", exp.to_identifier(renamed[column.table]))


def _normalise_below(node: exp.Expression) -> None:
    """Normalises the tree under `node` bottom up, so that operands are sorted by their final text."""
    for child in list(node.iter_expressions()):
        _normalise_below(child)
        replacement = _normalise(child)
        if replacement is not child:
            child.replace(replacement)


def _normalise(node: exp.Expression) -> exp.Expression:
    if isinstance(node, exp.Paren) and isinstance(node.parent, (exp.Where, exp.Having, exp.Paren)):
        return node.this  # WHERE (p) is WHERE p
    if isinstance(node, exp.Literal) and not node.is_string:
        return _number(node)
    if isinstance(node, exp.Count) and isinstance(node.this, exp.Literal) and not node.args.get("distinct"):
        return exp.Count(this=exp.Star())  # COUNT(1) counts rows, as COUNT(*) does
    if type(node) in _FLIPPED:
        return _FLIPPED[type(node)](this=node.expression, expression=node.this)
    if isinstance(node, _SYMMETRIC):
        left, right = sorted([node.this, node.expression], key=to_sql)
        return type(node)(this=left, expression=right)
    if isinstance(node, (exp.And, exp.Or)):
        ordered = sorted(operands(node, type(node)), key=to_sql)
        return exp.and_(*ordered, copy=False) if isinstance(node, exp.And) else exp.or_(*ordered, copy=False)
    return node


def _number(literal: exp.Literal) -> exp.Literal:
    """`030` is `30` and `01.50` is `1.50`: leading zeros go, nothing else. A decimal literal's scale is part of its
    value in PostgreSQL (`CAST(1.50 AS text)` is '1.50', and 1/3.0 divides at another precision than 1/3.000), so
    `1.5` and `1.50` stay apart, `15e-1` is `1.5` (the same value and scale); an integer
    literal stays an integer and a decimal one a decimal (1/2 is 0, 1.0/2 is 0.5)."""
    text = literal.this
    if not _NUMBER.fullmatch(text):
        return literal
    if text.isdigit():
        return exp.Literal.number(str(int(text)))
    try:
        value = Decimal(text)
    except InvalidOperation:
        return literal
    if value.as_tuple().exponent > 0:  # 1e3 is numeric 1000 with scale 0: no plain spelling keeps both
        return literal
    plain = format(value, "f")  # Decimal keeps the scale PostgreSQL gives the literal: max(0, -exponent)
    return exp.Literal.number(plain if "." in plain else f"{plain}.")
