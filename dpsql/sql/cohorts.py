"""Cohorts written as correlated subqueries, spelled as the IN cohort the semijoin rule judges
(`x IN (SELECT c FROM … GROUP BY c HAVING …)`, see `shape._cohort`):

- `(SELECT COUNT(*) FROM visits v WHERE v.person_id = p.person_id) > 5` is
  `p.person_id IN (SELECT v.person_id FROM visits v GROUP BY v.person_id HAVING COUNT(*) > 5)`;
- `EXISTS (SELECT 1 FROM visits v WHERE v.person_id = p.person_id GROUP BY v.person_id HAVING …)` is the same IN.

A unit with no rows in the subquery is in no group: its COUNT is 0 and any other aggregate NULL. Where the
comparison holds for that empty set (`(SELECT COUNT(*) …) < 3`), the cohort is the complement,
`NOT IN (… HAVING NOT (COUNT(*) < 3))`, so that it keeps those units too (NOT IN then reads as for any other,
`shape.drop_nulls_under_not_in`: a NULL outer value is left out). Anything else is left as written.
"""

from __future__ import annotations

import operator

from sqlglot import exp

from dpsql.sql.query import AGGREGATES
from dpsql.sql.shape import tables_read

COMPARISONS = {exp.GT: operator.gt, exp.GTE: operator.ge, exp.LT: operator.lt, exp.LTE: operator.le,
               exp.EQ: operator.eq, exp.NEQ: operator.ne}
FLIPPED = {exp.GT: exp.LT, exp.GTE: exp.LTE, exp.LT: exp.GT, exp.LTE: exp.GTE, exp.EQ: exp.EQ, exp.NEQ: exp.NEQ}
NEGATED = {exp.GT: exp.LTE, exp.GTE: exp.LT, exp.LT: exp.GTE, exp.LTE: exp.GT, exp.EQ: exp.NEQ, exp.NEQ: exp.EQ}


def correlated_cohorts_as_in(tree: exp.Select) -> exp.Select:
    """Each correlated cohort condition in `tree`'s own WHERE, spelled as an IN cohort."""
    where = tree.args.get("where")
    if where is None or not where.find(exp.Subquery, exp.Exists):
        return tree
    for node in list(where.find_all(exp.Exists, *COMPARISONS)):
        if node.parent_select is not tree:
            continue
        spelled = _exists_cohort(node) if isinstance(node, exp.Exists) else _compared_cohort(node)
        if spelled is not None:
            node.replace(spelled)
    return tree


def _exists_cohort(node: exp.Exists) -> exp.Expression | None:
    select = node.this
    group = select.args.get("group") if isinstance(select, exp.Select) else None
    correlation = _correlation(select) if group is not None else None
    if correlation is None or len(group.expressions) != 1 or group.expressions[0] != correlation[0]:
        return None
    inner, outer, rest = correlation
    return _in(outer, _cohort(select, inner, rest, select.args.get("having")))


def _compared_cohort(node: exp.Expression) -> exp.Expression | None:
    """`(SELECT agg FROM … WHERE c = outer) op literal`, either way round."""
    if isinstance(node.this, exp.Subquery) and isinstance(node.expression, exp.Literal):
        subquery, value, op = node.this, node.expression, type(node)
    elif isinstance(node.expression, exp.Subquery) and isinstance(node.this, exp.Literal):
        subquery, value, op = node.expression, node.this, FLIPPED[type(node)]
    else:
        return None
    select = subquery.this
    if not isinstance(select, exp.Select) or value.is_string or len(select.expressions) != 1 or any(
            select.args.get(k) for k in ("group", "having", "order", "limit", "offset", "distinct", "with_")):
        return None
    aggregate = select.expressions[0].unalias()
    correlation = _correlation(select)
    if not isinstance(aggregate, tuple(AGGREGATES)) or select.find(exp.Window) or correlation is None:
        return None
    inner, outer, rest = correlation
    # over no rows COUNT is 0 and any other aggregate NULL, for which no comparison holds
    empty_holds = isinstance(aggregate, exp.Count) and COMPARISONS[op](0, float(value.name))
    kept = NEGATED[op] if empty_holds else op
    cohort = _cohort(select, inner, rest, exp.Having(this=kept(this=aggregate.copy(), expression=value.copy())))
    return exp.Not(this=_in(outer, cohort)) if empty_holds else _in(outer, cohort)


def _correlation(select: exp.Select) -> tuple[exp.Column, exp.Column, list[exp.Expression]] | None:
    """(the subquery's column, the outer query's, the other conditions) where the subquery's WHERE ties one of its
    columns to one outer column by equality, and reads the outer query nowhere else."""
    where = select.args.get("where")
    if where is None:
        return None
    own = {t.alias_or_name for t in tables_read(select)}
    if not own or select.find(exp.Subquery):
        return None
    conditions = list(where.this.flatten()) if isinstance(where.this, exp.And) else [where.this]
    if len(own) == 1:
        _qualify_inner_side(conditions, next(iter(own)))
    outside = [c for c in select.find_all(exp.Column) if c.table and c.table not in own]
    ties = [c for c in conditions if isinstance(c, exp.EQ) and all(isinstance(s, exp.Column) and s.table
                                                                   for s in (c.this, c.expression))
            and (c.this.table in own) != (c.expression.table in own)]
    if len(ties) != 1 or len(outside) != 1:
        return None
    tie = ties[0]
    inner, outer = (tie.this, tie.expression) if tie.this.table in own else (tie.expression, tie.this)
    return inner, outer, [c for c in conditions if c is not tie]


def _qualify_inner_side(conditions: list[exp.Expression], own: str) -> None:
    """`person_id = p.person_id` inside a subquery over one table: the bare column is the subquery's own (a name
    resolves in the nearest scope first), so it is qualified with that table's name."""
    for condition in conditions:
        if not isinstance(condition, exp.EQ):
            continue
        for bare, other in ((condition.this, condition.expression), (condition.expression, condition.this)):
            if isinstance(bare, exp.Column) and not bare.table and isinstance(other, exp.Column) and other.table \
                    and other.table != own:
                bare.set("table", exp.to_identifier(own))


def _cohort(select: exp.Select, inner: exp.Column, rest: list[exp.Expression],
            having: exp.Having | None) -> exp.Select:
    """SELECT inner FROM (the subquery's tables) WHERE rest GROUP BY inner HAVING …"""
    cohort = select.copy()
    cohort.set("expressions", [inner.copy()])
    cohort.set("where", exp.Where(this=exp.and_(*(c.copy() for c in rest))) if rest else None)
    cohort.set("group", exp.Group(expressions=[inner.copy()]))
    cohort.set("having", having.copy() if having is not None else None)
    return cohort


def _in(outer: exp.Column, cohort: exp.Select) -> exp.In:
    return exp.In(this=outer.copy(), query=exp.Subquery(this=cohort))


__all__ = ["correlated_cohorts_as_in"]
