"""Rule: under row-level privacy, one added or removed row changes at most S joined rows (FLEX's stability),
on join-key frequencies that hold in every database.

Every join key whose frequency a bound relies on is enforced: its table is read truncated to max_frequency
rows per value of the key (a keyed hash picks them), unless a unique constraint guarantees the key. One
added row can then push out one kept row per truncated key, so a table's own stability is 1 + its truncated
keys. The join tree is left-deep in FROM order, each step on the equality giving the smallest bound
(`stability` holds the rules). A subquery in WHERE reads its table whole and, correlated on an equality,
flips the condition for at most the outer key's frequency of joined rows per changed row.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from sqlglot import exp

from dpsql.analysis import stability
from dpsql.analysis.scope import Equality, Scope, Semijoin
from dpsql.errors import UnsupportedQuery
from dpsql.sql import to_sql


def join_stability(scope: Scope, joins: list[exp.Join], equalities: list[Equality], semijoins: list[Semijoin],
                   group_key: exp.Column | None = None) -> stability.Relation:
    """The joined relation's stability and column frequencies; sets the scope's truncation and stability.
    `group_key` is a grouped subquery's key, whose frequency is bounded like a join key's."""
    correlations = [(outer, inner) for s in semijoins for left, right in s.equalities
                    for outer, inner in ((left, right), (right, left))
                    if outer.table in scope.outer and inner.table in s.aliases]
    keys: dict[str, set[str]] = {}
    if group_key is not None:
        keys[group_key.table] = {group_key.name}
    for left, right in [*equalities, *correlations]:
        for column in (left, right):
            if column.table in scope.outer:
                keys.setdefault(column.table, set()).add(column.name)
    plan = _join_plan(scope, joins, equalities, semijoins, keys, group_key)
    if plan.used != keys:  # an equality no bound relies on still filters rows, it needs no truncation
        plan = _join_plan(scope, joins, equalities, semijoins, plan.used, group_key)
    beside_public = {alias: names - plan.beside_public.get(alias, set()) for alias, names in plan.used.items()}
    if beside_public != plan.used:  # a key joined only to a public table bounds nothing a change reaches
        with contextlib.suppress(UnsupportedQuery):  # ... unless a later join keys on the public table's columns
            plan = _join_plan(scope, joins, equalities, semijoins, beside_public, group_key)
    scope.truncate = plan.truncate
    for name, columns in scope.truncate.items():
        scope.notes.append(f"{name} is read truncated to " + ", ".join(f"{f} row(s) per {c}" for c, f in columns)
                           + " (keyed hash)")
    scope.notes.extend(plan.notes)
    scope.stability = plan.relation.stability
    scope.notes.append(f"one neighbour changes at most {scope.stability} joined row(s) (row-level stability)")
    return plan.relation


@dataclass(frozen=True)
class _JoinPlan:
    relation: stability.Relation  # the joined relation: its stability and column frequencies
    truncate: dict[str, tuple[tuple[str, int], ...]]  # table -> (key, max rows per value) it is read cut to
    used: dict[str, set[str]]  # alias -> the keys whose frequencies the chosen bounds rely on
    notes: list[str]
    beside_public: dict[str, set[str]] | None = None  # alias -> keys used only in a join to an unchanging side


def _join_plan(scope: Scope, joins: list[exp.Join], equalities: list[Equality], semijoins: list[Semijoin],
               keys: dict[str, set[str]], group_key: exp.Column | None) -> _JoinPlan:
    """The join tree's stability when the tables are truncated on `keys` (those with a declared frequency and
    no unique constraint): a left-deep tree in FROM order, each step on the equality giving the smallest
    bound. Also says which keys the chosen bounds used."""
    truncate: dict[str, dict[str, int]] = {}
    for alias, names in keys.items():
        table = scope.aliases[alias]
        for name in names:
            frequency = scope.declared_frequency(table, name)
            if frequency is not None and (table.name, name) not in scope.unique:
                truncate.setdefault(table.name, {})[name] = frequency
    used: dict[str, set[str]] = {group_key.table: {group_key.name}} if group_key is not None else {}
    beside_public: dict[str, set[str]] = {}
    notes: list[str] = []

    def relation(alias: str) -> stability.Relation:
        table = scope.aliases[alias]
        changed = 0 if table.public else 1 + len(truncate.get(table.name, {}))
        frequencies = {n: f for n in keys.get(alias, ()) if (f := scope.declared_frequency(table, n)) is not None}
        return stability.base(table.name, alias, changed, frequencies)

    sides = {j.this.alias_or_name: j.side.upper() for j in joins}
    joined, pending = [scope.outer[0]], scope.outer[1:]
    current = relation(joined[0])

    def keys_to_joined(alias: str) -> list[tuple[exp.Column, exp.Column]]:
        return [(mine, other) for left, right in equalities for mine, other in ((left, right), (right, left))
                if mine.table == alias and other.table in joined]

    while pending:
        alias = next((a for a in pending if keys_to_joined(a)), None)
        if alias is None:
            raise UnsupportedQuery(f"{scope.aliases[pending[0]].name} ({pending[0]}) is not joined on an equality "
                                   "of columns: a cross join multiplies every row by the whole other table",
                                   "join it on a declared key, e.g. JOIN t ON t.key = other.key")
        if sides.get(alias) and alias != pending[0]:
            raise UnsupportedQuery(f"outer join of {alias} must follow the tables its ON clause names",
                                   "join the tables its ON clause names first: FROM a JOIN b ON ... LEFT JOIN c ON "
                                   "c.k = b.k")
        new = relation(alias)
        # a key's frequency is needed where the other side changes (a public side never does)
        pairs = [(o, m) for m, o in keys_to_joined(alias)
                 if (f"{o.table}.{o.name}" in current.frequencies or not new.stability)
                 and (f"{m.table}.{m.name}" in new.frequencies or not current.stability)]
        if not pairs:
            mine, other = keys_to_joined(alias)[0]
            missing = mine if f"{mine.table}.{mine.name}" not in new.frequencies else other
            scope.frequency(scope.aliases[missing.table], missing)  # raises: the key's frequency is undeclared
        options = [(stability.join(current, new, f"{o.table}.{o.name}", f"{m.table}.{m.name}",
                                   sides.get(alias, "")), o, m) for o, m in pairs]
        before = current
        current, o, m = min(options, key=lambda option: option[0].stability)
        for column, other_side in ((o, new), (m, before)):
            used.setdefault(column.table, set()).add(column.name)
            if not other_side.stability:
                beside_public.setdefault(column.table, set()).add(column.name)
        joined.append(alias)
        pending.remove(alias)
        notes.append(f"join {scope.aliases[alias].name} ({alias}) on {to_sql(o)} = "
                     f"{to_sql(m)}: stability {current.stability}")
    for semijoin in semijoins:
        current, key = _semijoin_stability(scope, current, semijoin, notes)
        if key is not None:
            used.setdefault(key.table, set()).add(key.name)
    return _JoinPlan(current, {t: tuple(sorted(c.items())) for t, c in truncate.items()}, used, notes,
                     beside_public)


def _semijoin_stability(scope: Scope, outer: stability.Relation, semijoin: Semijoin,
                        notes: list[str]) -> tuple[stability.Relation, exp.Column | None]:
    """A WHERE subquery over one table, correlated on an equality: each changed row of it flips the condition
    for at most the outer key's frequency of joined rows. Also returns that outer key."""
    if all(scope.aliases[a].public for a in semijoin.aliases):
        notes.append("a subquery in WHERE reads only public tables: no extra sensitivity")
        return outer, None
    if len(semijoin.aliases) != 1:
        raise UnsupportedQuery("under row-level privacy a subquery in WHERE may read one table",
                               "write joins inside the subquery as separate conditions of the outer query")
    inner_alias = semijoin.aliases[0]
    table = scope.aliases[inner_alias]
    inner = stability.base(table.name, inner_alias, 1, {})  # read whole: one changed row is one changed row
    options = [(stability.semijoin(outer, inner, f"{o.table}.{o.name}"), o)
               for left, right in semijoin.equalities for o, i in ((left, right), (right, left))
               if i.table == inner_alias and f"{o.table}.{o.name}" in outer.frequencies]
    if not options:
        raise UnsupportedQuery(f"the subquery over {table.name} is not tied to the outer row by an equality on a "
                               "key with a declared frequency, so one of its rows could change the condition for "
                               "every row", f"correlate it, e.g. WHERE {inner_alias}.key = outer.key, and declare "
                               "max_frequency for the outer key")
    best, key = min(options, key=lambda option: option[0].stability)
    notes.append(f"subquery over {table.name} ({inner_alias}) on {to_sql(key)}: stability "
                 f"{best.stability}")
    return best, key
