"""Sets of units combined with INTERSECT, EXCEPT or UNION, spelled as the queries the analysis already bounds.

The people who visited in January and in December, a retention question, is often written as a set operation:

    SELECT COUNT(*) FROM (SELECT person_id FROM visits WHERE EXTRACT(month FROM day) = 1
                          INTERSECT SELECT person_id FROM visits WHERE EXTRACT(month FROM day) = 12) t

Each branch is a set of units: the unit column of one table, filtered. Where every branch reads the same table, the
whole is one subquery grouped by the unit, each branch a condition on the unit's rows (INTERSECT is AND, EXCEPT is
AND NOT, UNION is OR):

    SELECT person_id FROM visits GROUP BY person_id
    HAVING COUNT(CASE WHEN EXTRACT(month FROM day) = 1 THEN 1 END) > 0
       AND COUNT(CASE WHEN EXTRACT(month FROM day) = 12 THEN 1 END) > 0

Both are the distinct units that pass (a set operation without ALL returns distinct rows). Under `x IN (...)`,
INTERSECT and EXCEPT become `x IN (a) AND x IN (b)` and `x IN (a) AND x NOT IN (b)`, which may read different
tables, and a UNION of branches of one table is one branch whose conditions are OR-ed; in FROM, branches of
different tables are the units of the unit table that pass those semijoins. The per-unit subquery and
the semijoins are forms the analysis judges as written, so this is a spelling: nothing about the guarantee
changes. Anything else (ALL, a branch that selects more than the unit, joins or groups, or reads another
query's columns) is left as written and refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from sqlglot import exp

from dpsql.schema import PrivacySchema
from dpsql.sql.qualify import check_tables


@dataclass(frozen=True)
class _Branch:
    """`SELECT unit FROM table [WHERE condition]`: the units with a row that meets the condition."""

    table: exp.Table
    unit: str  # the table's unit column
    name: str  # the branch's output column name
    condition: exp.Expression | None

    def unit_column(self) -> exp.Column:
        return exp.column(self.unit, table=self.table.alias_or_name)


def unit_sets_as_groups(tree: exp.Select, schema: PrivacySchema) -> exp.Select:
    """`tree` with each set operation of sets of units (in FROM or WITH, or under IN) spelled as a per-unit
    subquery or as semijoins."""
    operations = list(tree.find_all(exp.Intersect, exp.Except, exp.Union))
    if schema.row_level or not operations:
        return tree
    check_tables(tree, schema)  # a branch of an undeclared table: PostgreSQL's error, not a refusal of the operation
    for operation in operations:
        holder = operation.parent
        if operation.root() is not tree or not _distinct(operation):
            continue  # inside an operation replaced already, or a multiset
        if isinstance(holder, exp.Subquery) and isinstance(holder.parent, exp.In) \
                and holder.parent.args.get("query") is holder:
            conjuncts = _semijoins(holder.parent.this, operation, schema)
            if conjuncts is not None:
                holder.parent.replace(exp.Paren(this=exp.and_(*conjuncts)))
        elif isinstance(holder, exp.CTE) or isinstance(holder, exp.Subquery) and isinstance(
                holder.parent, exp.From | exp.Join):
            grouped = _per_unit(operation, schema) or _units_of_unit_table(operation, schema)
            if grouped is not None:
                operation.replace(grouped)
    return tree


def _distinct(operation: exp.Expression) -> bool:
    return bool(operation.args.get("distinct", True))


def _per_unit(operation: exp.Expression, schema: PrivacySchema) -> exp.Select | None:
    """One subquery grouped by the unit, whose HAVING is `operation` over the unit's rows; None unless every
    branch reads the same table."""
    branches = _one_table(operation, schema)
    if branches is None:
        return None
    first = branches[0]
    unit = first.unit_column()
    having = _condition(operation, iter(branches))
    return (exp.select(exp.alias_(unit.copy(), first.name)).from_(first.table.copy())
            .group_by(unit.copy()).having(having))


def _units_of_unit_table(operation: exp.Expression, schema: PrivacySchema) -> exp.Select | None:
    """Branches of different tables: the units of the unit table that are in each set (`_semijoins`), as
    `SELECT person_id FROM people WHERE person_id IN (...) AND person_id NOT IN (...)`."""
    branches = _branches(operation, schema)
    if branches is None or schema.unit_table is None:
        return None
    unit = exp.column(schema.unit_column, table=schema.unit_table)
    conjuncts = _semijoins(unit, operation, schema)
    if conjuncts is None:
        return None
    return exp.select(exp.alias_(unit.copy(), branches[0].name)).from_(schema.unit_table).where(
        exp.and_(*conjuncts))


def _condition(node: exp.Expression, branches: Iterator[_Branch]) -> exp.Expression:
    """`node` as a condition on one unit's rows, its branches taken in order from `branches`."""
    if isinstance(node, exp.Subquery | exp.Paren):
        return _condition(node.this, branches)
    if isinstance(node, exp.Select):
        branch = next(branches)
        counted = exp.Count(this=exp.Star()) if branch.condition is None else exp.Count(
            this=exp.Case(ifs=[exp.If(this=branch.condition, true=exp.Literal.number(1))]))
        return exp.GT(this=counted, expression=exp.Literal.number(0))
    left, right = _condition(node.this, branches), _condition(node.expression, branches)
    if isinstance(node, exp.Union):
        return exp.Paren(this=exp.or_(left, right))
    if isinstance(node, exp.Except):
        return exp.and_(left, exp.Not(this=exp.Paren(this=right)))
    return exp.and_(left, right)


def _semijoins(value: exp.Expression, operation: exp.Expression,
               schema: PrivacySchema) -> list[exp.Expression] | None:
    """`value IN (operation)` as conjuncts `value IN (branch)` and `NOT value IN (branch)`: INTERSECT keeps both
    sides, EXCEPT negates its right side, which must be one branch (or a UNION of branches of one table)."""
    node = operation.this if isinstance(operation, exp.Subquery | exp.Paren) else operation
    if isinstance(node, exp.Intersect) and _distinct(node):
        left, right = _semijoins(value, node.this, schema), _semijoins(value, node.expression, schema)
        return None if left is None or right is None else left + right
    if isinstance(node, exp.Except) and _distinct(node):
        left, right = _semijoins(value, node.this, schema), _one_branch(node.expression, schema)
        return None if left is None or right is None else left + [
            exp.Not(this=exp.In(this=value.copy(), query=exp.Subquery(this=right)))]
    branch = _one_branch(node, schema)
    return None if branch is None else [exp.In(this=value.copy(), query=exp.Subquery(this=branch))]


def _one_branch(node: exp.Expression, schema: PrivacySchema) -> exp.Select | None:
    """`SELECT unit FROM table WHERE ...` for a branch, or for a UNION of branches of one table (their conditions
    OR-ed); None for anything else."""
    node = node.this if isinstance(node, exp.Subquery | exp.Paren) else node
    branches = _one_table(node, schema)
    if branches is None or not all(isinstance(n, exp.Union) for n in _operations(node)):
        return None
    first = branches[0]
    select = exp.select(first.unit_column()).from_(first.table.copy())
    if all(b.condition is not None for b in branches):  # a branch without WHERE holds every unit of the table
        select = select.where(exp.or_(*[exp.Paren(this=b.condition) for b in branches]))
    return select


def _operations(node: exp.Expression) -> list[exp.Expression]:
    """The set operations of a tree of them (its branches' SELECTs left out)."""
    node = node.this if isinstance(node, exp.Subquery | exp.Paren) else node
    if isinstance(node, exp.Select):
        return []
    return [node, *_operations(node.this), *_operations(node.expression)]


def _one_table(node: exp.Expression, schema: PrivacySchema) -> list[_Branch] | None:
    """The branches of `node` where all read the same table, their columns renamed to the first one's name for
    it; else None."""
    branches = _branches(node, schema)
    if branches is None or len({(b.table.name, b.unit) for b in branches}) != 1:
        return None
    alias = branches[0].table.alias_or_name
    for branch in branches[1:]:
        for column in branch.condition.find_all(exp.Column) if branch.condition is not None else ():
            if column.table:
                column.set("table", exp.to_identifier(alias))
    return branches


def _branches(node: exp.Expression, schema: PrivacySchema) -> list[_Branch] | None:
    """The branches of a tree of set operations without ALL, in order; None where one is not a set of units."""
    if isinstance(node, exp.Subquery | exp.Paren):
        return _branches(node.this, schema)
    if isinstance(node, exp.Select):
        branch = _branch(node, schema)
        return None if branch is None else [branch]
    if not isinstance(node, exp.Intersect | exp.Except | exp.Union) or not _distinct(node):
        return None
    left, right = _branches(node.this, schema), _branches(node.expression, schema)
    return None if left is None or right is None else left + right


def _branch(select: exp.Select, schema: PrivacySchema) -> _Branch | None:
    """`select` as a set of units: the unit column of one declared table, filtered by conditions on that table's
    own columns only (no subquery, aggregate or window)."""
    source = select.args.get("from_")
    if source is None or not isinstance(source.this, exp.Table) or len(select.expressions) != 1 or any(
            select.args.get(k) for k in ("joins", "group", "having", "order", "limit", "offset", "with_", "laterals")):
        return None
    table = source.this
    declared = schema.tables.get(table.name)
    item = select.expressions[0]
    column = item.unalias()
    if declared is None or declared.unit_column is None or not isinstance(column, exp.Column) \
            or column.name != declared.unit_column or column.table not in ("", table.alias_or_name):
        return None
    where = select.args.get("where")
    condition = where.this.copy() if where is not None else None
    if condition is not None and (condition.find(exp.Select, exp.AggFunc, exp.Window) is not None or any(
            c.table not in ("", table.alias_or_name) for c in condition.find_all(exp.Column))):
        return None
    return _Branch(table, declared.unit_column, item.alias_or_name, condition)
