"""Rule: public tables multiply a unit's rows by their join keys' declared frequencies.

A public table joins on an equality with a table already reached: a private one, or a public one joined
before it (nation through supplier). Each joined row then meets at most the key's declared frequency of the
public table's rows (1 for a unique key), so one unit's k rows become at most k times the product of those
frequencies. A key of several columns that the catalog guarantees unique (TPC-H's partsupp on ps_partkey and
ps_suppkey) matches at most one row when the join equates all of them. A public table joined on a unique key to
a row that one unit determines is itself determined by that unit (a group key read from it puts each unit in one
group).
"""

from __future__ import annotations

from dpsql.analysis.scope import Equality, Scope
from dpsql.errors import UnsupportedQuery


def fanout(scope: Scope, equalities: list[Equality], private: list[str]) -> tuple[int, set[str], bool]:
    """How many public rows one private row can match (declared), which aliases one unit's row determines,
    and whether the catalog guarantees every public join matches at most one row."""
    determined = {a for a in private if scope.row_is_unit(a)}
    reached = set(private)
    waiting = [a for a in scope.outer if scope.aliases[a].public]
    product, verified = 1, True
    while waiting:
        progress = False
        for alias in list(waiting):
            table = scope.aliases[alias]
            keys = [(mine, other) for left, right in equalities
                    for mine, other in ((left, right), (right, left))
                    if mine.table == alias and other.table in reached]
            if not keys:
                continue
            names = {m.name for m, _ in keys}
            whole = scope.whole_keys(table.name, names)
            frequency = 1 if whole else min(scope.frequency(table, mine) for mine, _ in keys)
            product *= frequency
            scope.notes.append(f"relation {scope.relation_text(alias, table.name)}: public, at most {frequency} "
                               f"row(s) per joined row (key {', '.join(sorted(names))}"
                               + (", unique together)" if any(len(key) > 1 for key in whole) else ")"))
            verified = verified and bool(whole)
            # one public row per joined row, and the unit's row fixes the values it is matched on
            if any(all(o.table in determined for m, o in keys if m.name in key) for key in whole):
                determined.add(alias)
            reached.add(alias)
            waiting.remove(alias)
            progress = True
        if not progress:
            table = scope.aliases[waiting[0]]
            raise UnsupportedQuery(f"public table {table.name} must be joined on an equality with a private "
                                   "table's column (or with a public table joined to one)",
                                   f"e.g. JOIN {table.name} ON {table.name}.key = t.column")
    return product, determined, verified
