"""Pass: `GROUP BY keys ORDER BY <count> DESC LIMIT k` (no HAVING) selects the top-k keys rather than noising
every group.

Rule: the exponential mechanism picks the keys one at a time (peeling) on their exact counts, unless the
count selects its own groups (`noise._counts_select_themselves`): then the noisy counts are released with all
of ε and ordered and cut as post-processing. Each key's
count moves by at most one unit's per-group count (k rows, or 1 for distinct units; twice that under
"replace"), and under add-remove the counts only grow when a unit is added (monotone, which halves the
noise). Only the chosen groups' measures are noised afterwards.

A LIMIT that cannot cut (at least as many as the public keys) or that asks for more than MAX_TOP_K keys (each
round of peeling gets 1/k of the selection's ε) is a row limit on the noisy groups instead: free post-processing.
BI tools send such LIMITs with every chart (Superset: LIMIT 10000).
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.analysis.plan import COUNTS, TopK
from dpsql.analysis.scope import Scope

MAX_TOP_K = 20


def select(scope: Scope) -> None:
    """Set the scope's top-k selection when the query has that form."""
    keys, order, limit, offset = scope.group_keys, scope.order, scope.limit, scope.offset
    if not keys or limit is None or scope.having is not None or len(order) != 1 or scope.windows:
        return  # (a window reads every released group, so its rows are not cut to the top k first)
    expr, descending, _ = order[0]
    agg = {a.name: a for a in scope.aggregates}.get(expr.name) if isinstance(expr, exp.Column) else None
    if agg is None or agg.kind not in COUNTS or not descending or limit + offset < 1:
        return
    if limit + offset > MAX_TOP_K or (scope.domain is not None and limit + offset >= len(scope.domain)):
        scope.notes.append(f"LIMIT {limit} is a row limit on the noisy groups (no top-k selection: "
                           + ("it keeps every public key)" if scope.domain is not None
                              and limit + offset >= len(scope.domain) else f"more than {MAX_TOP_K} keys)"))
        return
    measure = next(m for m in scope.measures.values() if m.name == agg.measures[0])
    steps = scope.steps
    sensitivity = steps * max(abs(measure.unit_range[0]), abs(measure.unit_range[1]))
    scope.notes.append(f"top {limit + offset} keys by {agg.sql}: count sensitivity {sensitivity:g} per key")
    scope.top_k = TopK(measure.name, limit + offset, sensitivity, monotone=steps == 1)
