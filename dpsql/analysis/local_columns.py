"""Pass: locally randomized columns in a query over private tables are only grouped on, and only counted.

A local column holds reports, each randomized on a person's device with a known mechanism. Counts of reports
per value can be de-biased after their central noise (`dpsql.local.estimates.debias`), as long as every value of the
column is released in every group: so the column must be a plain GROUP BY key with a public domain for the
keys beside it, and every aggregate COUNT(*). A filter on a report, or a sum, average or extreme of reports,
answers a question about reports rather than about people's values (a biased answer with a misleading
interval), so it is refused.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.analysis.scope import Scope
from dpsql.errors import UnsupportedQuery
from dpsql.schema import Column

HINT = "group by the locally randomized column and count: SELECT col, COUNT(*) FROM t GROUP BY col"


def only_counted(scope: Scope) -> None:
    """Set `scope.local_key` (the key's position and its randomizer) or refuse a use that would be biased."""
    local = [c for c in scope.tree.find_all(exp.Column) if _local(scope, c) is not None]
    if not local:
        return
    names = {(c.table, c.name) for c in local}
    if len(names) > 1:
        raise UnsupportedQuery("a query may read one locally randomized column (their joint distribution is not "
                               "estimated)", HINT)
    column = _local(scope, local[0])
    group = scope.tree.args.get("group")
    positions = [i for i, key in enumerate(group.expressions if group else [])
                 if isinstance(key, exp.Column) and (key.table, key.name) in names]
    if column.local.mechanism == "oue" or not positions:
        raise UnsupportedQuery(f"{column.name} holds locally randomized reports: a query over private tables may "
                               "only count them per value", HINT)
    selected = [e.this if isinstance(e, exp.Alias) else e for e in scope.tree.expressions]
    if scope.tree.args.get("order"):
        selected += [o.this for o in scope.tree.args["order"].expressions]
    allowed = len(positions) + sum(isinstance(e, exp.Column) and (e.table, e.name) in names for e in selected)
    if len(local) != allowed:
        raise UnsupportedQuery(f"{column.name} holds locally randomized reports: filtering, joining or computing "
                               "on them would describe reports, not people's values", HINT)
    measures = {m.name: m for m in scope.measures.values()}
    not_counts = [a.sql for a in scope.aggregates if a.kind != "count"
                  or any(measures[m].expr is not None for m in a.measures)]
    if not_counts:
        raise UnsupportedQuery(f"{', '.join(not_counts)} beside a locally randomized key cannot be de-biased",
                               "use COUNT(*) only")
    if scope.top_k is not None or scope.domain is None or scope.min_units > 1:
        raise UnsupportedQuery(f"grouping by {column.name} needs every value of it released in every group, to "
                               "undo the randomization", "declare a domain for the other group keys (and "
                               "leave min_frequency at 1, without ORDER BY count LIMIT)")
    scope.local_key = (positions[0], column.local)
    scope.notes.append(f"{column.name} holds reports randomized on each person's device (ε = "
                       f"{column.local.epsilon:g} per report): the noisy counts of reports are de-biased after "
                       "noise, and their intervals cover the randomization too")


def _local(scope: Scope, column: exp.Column) -> Column | None:
    declared = scope.declared_column(column) if column.table in scope.aliases else None
    return declared if declared is not None and declared.local is not None else None


__all__ = ["only_counted"]
