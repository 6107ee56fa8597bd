"""Stability of joined relations under row-level privacy: FLEX's rules on declared, enforced frequencies.

A relation's *stability* is how many of its rows one neighbouring change can add or remove; a column's *max
frequency* is how many rows can share one of its values. FLEX (Johnson, Near, Song 2018) propagates both through
joins; dpsql evaluates the same rules at distance 0 on frequencies that hold in every database, because the
rewrite enforces them (truncation by keyed hash) or a unique constraint guarantees them. Nothing here reads data.

Rules, for an equijoin of r1 and r2 on r1.a1 = r2.a2:
- inner join: S = max(mf(a1)·S(r2), mf(a2)·S(r1)); if r1 and r2 read a common base table, a change reaches both
  sides, so S = mf(a1)·S(r2) + mf(a2)·S(r1) + S(r1)·S(r2) (the self-join cross term);
- every column of r1 has its frequency multiplied by mf(a2), every column of r2 by mf(a1);
- an outer join keeps the preserved side's unmatched rows NULL-extended, so a change on the other side can turn
  a NULL-extended row into a matched one: a change on that side costs twice as many rows;
- a semijoin (EXISTS / IN) or antijoin (NOT EXISTS / NOT IN) of r on r.a = s.b keeps or drops r's rows without
  repeating them: S = max(S(r), mf(a)·S(s)), or the sum of the two when r and s share a base table;
- a public table has stability 0: a change never reaches it, so the other side's key frequency bounds nothing
  but the public side's column frequencies, which are unknown (and refused as join keys later) when it is
  undeclared.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Relation:
    """A relation in a join plan: its stability, the max frequency of each column that has one, and the base
    tables it reads (to detect self-joins)."""

    stability: int
    frequencies: dict[str, int]  # "alias.column" -> max rows sharing one value
    bases: frozenset[str]

    def frequency(self, column: str) -> int | None:
        return self.frequencies.get(column)


def base(table: str, alias: str, stability: int, frequencies: dict[str, int]) -> Relation:
    """A table read under `alias`: `stability` rows change per neighbour (0 for public tables; 1, or more where
    truncation lets an added row displace others)."""
    return Relation(stability, {f"{alias}.{c}": f for c, f in frequencies.items()},
                    frozenset([table]) if stability else frozenset())


def join(left: Relation, right: Relation, left_key: str, right_key: str, side: str = "") -> Relation:
    """`left JOIN right ON left_key = right_key`; side is "", "LEFT" or "RIGHT" (which side is preserved). A key's
    frequency may be unknown (None) only where the other side never changes (public tables)."""
    mf_left, mf_right = left.frequency(left_key), right.frequency(right_key)
    if (mf_left is None and right.stability) or (mf_right is None and left.stability):
        raise KeyError(left_key if mf_left is None else right_key)
    # a changed row on one side meets at most the other side's key frequency of rows; if the other side is
    # preserved, each of those may also lose (or regain) its NULL-extended row
    per_right_change = (mf_left or 0) * right.stability * (2 if side == "LEFT" else 1)
    per_left_change = (mf_right or 0) * left.stability * (2 if side == "RIGHT" else 1)
    if left.bases & right.bases:
        stability = per_right_change + per_left_change + left.stability * right.stability
    else:
        stability = max(per_right_change, per_left_change)
    # unmatched preserved rows still appear once, so their frequencies grow by at least one
    grow_left = None if mf_right is None else max(mf_right, 1) if side == "LEFT" else mf_right
    grow_right = None if mf_left is None else max(mf_left, 1) if side == "RIGHT" else mf_left
    frequencies = {c: f * grow_left for c, f in left.frequencies.items() if grow_left is not None}
    frequencies.update({c: f * grow_right for c, f in right.frequencies.items() if grow_right is not None})
    return Relation(stability, frequencies, left.bases | right.bases)


def semijoin(outer: Relation, inner: Relation, outer_key: str) -> Relation:
    """`outer WHERE [NOT] EXISTS (inner correlated on outer_key)`: each changed inner row flips the condition of
    at most mf(outer_key) outer rows."""
    flips = outer.frequency(outer_key) * inner.stability
    shared = bool(outer.bases & inner.bases)
    stability = outer.stability + flips if shared else max(outer.stability, flips)
    return replace(outer, stability=stability, bases=outer.bases | inner.bases)


def grouped(inner: Relation, groups_touched: int | None) -> Relation:
    """The relation of one row per group of `inner` (a GROUP BY subquery): a change rewrites at most
    `groups_touched` group rows (or, when that is not known, one per changed inner row), each a removal plus an
    addition."""
    touched = inner.stability if groups_touched is None else min(groups_touched, inner.stability)
    return Relation(2 * touched, {}, inner.bases)
