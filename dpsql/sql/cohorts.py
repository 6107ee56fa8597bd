"""Cohorts written as correlated subqueries, spelled as the IN cohort the semijoin rule judges
(`x IN (SELECT c FROM … GROUP BY c HAVING …)`, see `shape._cohort`):

- `(SELECT COUNT(*) FROM visits v WHERE v.person_id = p.person_id) > 5` is
  `p.person_id IN (SELECT v.person_id FROM visits v GROUP BY v.person_id HAVING COUNT(*) > 5)`;
- `EXISTS (SELECT 1 FROM visits v WHERE v.person_id = p.person_id GROUP BY v.person_id HAVING …)` is the same IN;
- `x IN (SELECT t.person_id FROM (SELECT person_id, COUNT(*) AS n FROM visits GROUP BY person_id) t WHERE t.n > 5)`
  is `x IN (SELECT person_id FROM visits GROUP BY person_id HAVING COUNT(*) > 5)`: the WHERE over the grouped
  subquery's outputs keeps the groups its HAVING would.

A unit with no rows in the subquery is in no group: its COUNT is 0 and any other aggregate NULL. Where the
comparison holds for that empty set (`(SELECT COUNT(*) …) < 3`), the cohort is the complement,
`NOT IN (… HAVING NOT (COUNT(*) < 3))`, so that it keeps those units too (NOT IN then reads as for any other,
`shape.drop_nulls_under_not_in`: a NULL outer value is left out). Anything else is left as written.
"""

from __future__ import annotations

import operator

from sqlglot import exp

from dpsql.sql.query import AGGREGATES
from dpsql.sql.shape import READS, tables_read

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


def filtered_cohorts_as_having(tree: exp.Select) -> exp.Select:
    """Each IN subquery of `tree`'s own WHERE that selects the key of a grouped subquery, filtered by a WHERE on
    its outputs, spelled as that grouped subquery with the filter as its HAVING."""
    where = tree.args.get("where")
    for node in list(where.find_all(exp.In)) if where is not None else []:
        query = node.args.get("query")
        if node.parent_select is tree and isinstance(query, exp.Subquery) and isinstance(query.this, exp.Select):
            spelled = _having_cohort(query.this)
            if spelled is not None:
                query.set("this", spelled)
    return tree


def _having_cohort(select: exp.Select) -> exp.Select | None:
    """`SELECT t.c FROM (SELECT c, … FROM … GROUP BY c) t WHERE cond` as `SELECT c FROM … GROUP BY c HAVING cond`
    (cond over the inner outputs, spelled as their expressions); None for any other shape."""
    source = select.args["from_"].this if select.args.get("from_") else None
    if not isinstance(source, exp.Subquery) or not isinstance(source.this, exp.Select) or len(select.expressions) != 1 \
            or any(select.args.get(k) for k in ("joins", "group", "having", "order", "limit", "distinct", "with_")):
        return None
    inner, alias = source.this, source.alias_or_name
    group = inner.args.get("group")
    if group is None or len(group.expressions) != 1 or inner.find(exp.Window, exp.Subquery) or any(
            inner.args.get(k) for k in ("order", "limit", "offset", "distinct", "with_")):
        return None
    outputs = {item.alias_or_name: item.unalias() for item in inner.expressions}
    key = group.expressions[0]
    if isinstance(key, exp.Literal) and key.is_int and 1 <= int(key.this) <= len(inner.expressions):
        key = inner.expressions[int(key.this) - 1].unalias()  # GROUP BY 1
    returned = select.expressions[0].unalias()
    condition = select.args["where"].this if select.args.get("where") else None
    columns = [returned, *(condition.find_all(exp.Column) if condition is not None else [])]
    if not isinstance(returned, exp.Column) or any(c.table not in ("", alias) or c.name not in outputs
                                                   for c in columns) \
            or outputs[returned.name] != key:
        return None
    if condition is not None and condition.find(exp.Subquery, exp.Exists):
        return None
    spelled = inner.copy()
    spelled.set("expressions", [key.copy()])
    spelled.set("group", exp.Group(expressions=[key.copy()]))
    if condition is not None:
        filtered = condition.copy().transform(
            lambda n: outputs[n.name].copy() if isinstance(n, exp.Column) else n)
        having = spelled.args.get("having")
        spelled.set("having", exp.Having(this=filtered if having is None else exp.and_(having.this, filtered)))
    return spelled


def correlated_values_as_joins(tree: exp.Select) -> exp.Select:
    """Each correlated scalar subquery of one aggregate that `tree`'s SELECT list, GROUP BY, HAVING or ORDER BY reads
    (`AVG((SELECT COUNT(*) FROM visits v WHERE v.person_id = p.person_id))`, a person's visits), spelled as a LEFT
    JOIN to that subquery grouped by its tie: `LEFT JOIN (SELECT v.person_id AS dpsql_key, COUNT(*) AS dpsql_value
    FROM visits v GROUP BY v.person_id) dpsql_c1 ON dpsql_c1.dpsql_key = p.person_id`, read as
    `COALESCE(dpsql_c1.dpsql_value, 0)` (a COUNT over no rows is 0, any other aggregate NULL, as the join leaves
    it). The join keeps every outer row once (one group per key). The same subquery written twice is one join."""
    sources = [tree.args["from_"].this] if tree.args.get("from_") else []
    outer_aliases = {s.alias_or_name for s in sources + [j.this for j in tree.args.get("joins") or []]}
    joined: dict[str, str] = {}
    for subquery in list(tree.find_all(exp.Subquery)):
        if subquery.parent_select is not tree or isinstance(subquery.parent, READS) \
                or subquery.find_ancestor(exp.Where, exp.Join, exp.From) is not None:
            continue
        value = _correlated_value(subquery.this, outer_aliases)
        if value is None:
            continue
        grouped, counts, tie = value
        text = f"{grouped.sql()} ON {tie.sql()}"
        if text not in joined:
            alias = joined[text] = f"dpsql_c{len(joined) + 1}"
            tree.join(exp.Subquery(this=grouped, alias=exp.TableAlias(this=exp.to_identifier(alias))),
                      join_type="LEFT", on=exp.EQ(this=exp.column("dpsql_key", table=alias), expression=tie.copy()),
                      copy=False)
        read = exp.column("dpsql_value", table=joined[text])
        subquery.replace(exp.Coalesce(this=read, expressions=[exp.Literal.number(0)]) if counts else read)
    return tree


def _correlated_value(select: exp.Expression,
                      outer_aliases: set[str]) -> tuple[exp.Select, bool, exp.Column] | None:
    """The subquery grouped by its tie to the outer query (its key as dpsql_key, its one aggregate as dpsql_value),
    whether that aggregate is a COUNT, and the outer column it is tied to; None where it is no correlated subquery
    of one aggregate tied to a table of the outer query by one equality."""
    if not isinstance(select, exp.Select) or len(select.expressions) != 1 or select.find(exp.Window) or any(
            select.args.get(k) for k in ("group", "having", "order", "limit", "offset", "distinct", "with_")):
        return None
    aggregate = select.expressions[0].unalias()
    correlation = _correlation(select)
    if not isinstance(aggregate, tuple(AGGREGATES)) or correlation is None or correlation[1].table not in outer_aliases:
        return None
    inner, outer, rest = correlation
    grouped = _cohort(select, inner, rest, None)
    grouped.set("expressions", [exp.alias_(inner.copy(), "dpsql_key"), exp.alias_(aggregate.copy(), "dpsql_value")])
    return grouped, isinstance(aggregate, exp.Count), outer


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


__all__ = ["correlated_cohorts_as_in", "correlated_values_as_joins"]
