"""Rule: the EXISTS / IN (SELECT ...) conditions of WHERE add no sensitivity beyond the unit's own bounds.

A subquery over public tables depends on no unit. Under unit-level privacy, a subquery over private tables
may only read the outer row's own unit: each of its private tables is joined to the outer query along unit
columns or parent keys, so adding or removing a unit flips the condition only for that unit's rows, which
its own bounds already cover. Under row-level privacy, subqueries over private tables are bounded by the
join stability (`joins`), except next to a grouped subquery in FROM: the table of groups has a stability of
its own that no rule here extends, and an uncorrelated NOT EXISTS over a table that one row can make
non-empty would flip every row at once, so such a subquery is refused.
"""

from __future__ import annotations

from dpsql.analysis.scope import Scope
from dpsql.errors import UnsupportedQuery


def check(scope: Scope) -> None:
    """Refuse the scope's WHERE subqueries that one unit could use to change other units' rows."""
    if scope.stability is not None:  # row-level privacy, reading a grouped subquery
        for semijoin in scope.semijoins:
            private = [a for a in semijoin.aliases if not scope.aliases[a].public]
            if private:
                raise UnsupportedQuery(f"a subquery in WHERE over {scope.aliases[private[0]].name} cannot be "
                                       "bounded next to a grouped subquery in FROM under row-level privacy",
                                       "filter inside the grouped subquery, or use a subquery over public tables")
        return
    for semijoin in scope.semijoins:
        sub_private = [a for a in semijoin.aliases if not scope.aliases[a].public]
        if not sub_private:
            scope.notes.append("a subquery in WHERE reads only public tables: no extra sensitivity")
            continue
        _, root = scope.unit_components([*scope.private, *semijoin.aliases],
                                        scope.equalities + semijoin.equalities)
        outer_roots = {root(a) for a in scope.private}
        stray = [a for a in sub_private if root(a) not in outer_roots]
        if stray:
            table = scope.aliases[stray[0]]
            raise UnsupportedQuery(
                f"the subquery reads {table.name} ({stray[0]}) without tying it to the outer row's unit, so one "
                "person's rows could change the condition for everyone",
                f"join it on {scope.link_text(stray[0])} to a table of the outer query inside the subquery's WHERE")
        scope.notes.append("a subquery in WHERE reads only the outer row's own unit: no extra sensitivity")
