"""A grouped subquery's outputs computed from its aggregates, computed by the query that reads it instead:

    SELECT bucket, COUNT(*) FROM (SELECT p.person_id, CASE WHEN COUNT(v.visit_id) = 0 THEN 'none' ELSE 'some' END
        AS bucket FROM people p LEFT JOIN visits v ON … GROUP BY p.person_id) t GROUP BY bucket

is

    SELECT CASE WHEN t.dpsql_a0 = 0 THEN 'none' ELSE 'some' END AS bucket, COUNT(*) FROM (SELECT p.person_id,
        COUNT(v.visit_id) AS dpsql_a0 FROM … GROUP BY p.person_id) t GROUP BY CASE WHEN t.dpsql_a0 = 0 …

The expression is a function of the subquery's row alone, so computing it on either side of the subquery gives the
same rows. The subquery then holds bare aggregates, which the analysis bounds (a per-unit subquery: each clamped to
what one unit can give), and the expression is judged where the query reads it (a CASE of constants is a key of
public values). The same for each grouped subquery the query joins (`FROM visits v JOIN (SELECT person_id, CASE WHEN
SUM(amount) > 500 … END AS band …) t`). Only where the expression reads columns only inside its aggregates; anything
else is left as written.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.sql.query import AGGREGATES, inside, replace_keeping_precedence
from dpsql.sql.shape import derived_sources

HIDDEN = "dpsql_a"  # the names of the aggregates moved out of an expression


def aggregate_expressions_outside(tree: exp.Select) -> exp.Select:
    """`tree` with each output of its grouped subqueries (read alone in FROM, or JOINed) that computes over
    aggregates (not an aggregate itself) computed by `tree` from those aggregates instead."""
    if any(c.name.startswith(HIDDEN) for c in tree.find_all(exp.Column)):
        return tree
    for alias, select in derived_sources(tree).items():
        _moved_outside(tree, alias, select)
    return tree


def _moved_outside(tree: exp.Select, alias: str, inner: exp.Select) -> None:
    """The outputs of `inner`, read by `tree` as `alias`, that compute over aggregates, computed by `tree`."""
    moved = {item.alias: item.this for item in inner.expressions
             if isinstance(item, exp.Alias) and _computed_from_aggregates(item.this)}
    named_inside = {c.name for k in ("having", "order", "qualify") if inner.args.get(k)
                    for c in inner.args[k].find_all(exp.Column)}  # (HAVING n > 2 would lose its n)
    if not moved or moved.keys() & named_inside:
        return
    # unqualified, the name is the subquery's where PostgreSQL reads the query at all (else it is ambiguous)
    outer = [c for c in tree.find_all(exp.Column) if not inside(c, inner) and c.name in moved
             and c.table in ("", alias)]
    hidden: dict[str, str] = {}  # an aggregate's SQL -> its hidden output's name
    outside: dict[str, exp.Expression] = {}
    for name, expression in moved.items():
        outside[name] = expression.copy().transform(lambda node: _hidden_column(node, alias, hidden, inner))
    inner.set("expressions", [item for item in inner.expressions
                              if not (isinstance(item, exp.Alias) and item.alias in moved)])
    for column in outer:
        value = outside[column.name].copy()
        if isinstance(column.parent, exp.Select) and column.parent is tree:
            value = exp.alias_(value, column.name)  # a bare output keeps the name PostgreSQL gives it
        replace_keeping_precedence(column, value)


def _computed_from_aggregates(node: exp.Expression) -> bool:
    """An expression over aggregates, not an aggregate itself, with no column outside them and no window."""
    if isinstance(node, tuple(AGGREGATES)) or node.find(exp.Window) or not node.find(*AGGREGATES):
        return False
    return all(column.find_ancestor(*AGGREGATES) for column in node.find_all(exp.Column))


def _hidden_column(node: exp.Expression, alias: str, hidden: dict[str, str], inner: exp.Select) -> exp.Expression:
    """An aggregate of the expression as the subquery's hidden output holding it (added the first time)."""
    if not isinstance(node, tuple(AGGREGATES)):
        return node
    text = node.sql()
    if text not in hidden:
        hidden[text] = f"{HIDDEN}{len(hidden)}"
        inner.select(exp.alias_(node.copy(), hidden[text]), copy=False)
    return exp.column(hidden[text], alias)
