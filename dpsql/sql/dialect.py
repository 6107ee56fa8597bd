"""The seam between the rewrite and the engines: the few things the rewrite needs that engines spell differently.

The rewrite writes standard SQL (parsed and printed by sqlglot in PostgreSQL's dialect) plus a few calls with
reserved names, the dialect nodes below. A statement is a tree (`Statement`); each backend renders it in its own
dialect, spelling each node its own way, and no backend ever parses SQL text. (sqlglot's compiled build allows no
new expression classes, so a node is a call of a reserved `dpsql_` name, made only by the constructors here.)

- `dpsql_keyed_hash(seed, fields...)` (written as text by `rewrite.fragments.keyed_hash`): a deterministic, seeded
  64-bit hash of a tuple, independent across tuples, that ranks which rows or groups a unit keeps (PostgreSQL:
  `hashtextextended` of the record's text).
- `truncated(table, seed, key, limit, ...)`, in FROM: the table's rows, at most `limit` rows per value of each
  key, a row dropped when a keyed hash of the whole row ranks it past a key's limit (PostgreSQL: NOT IN over the
  rows' physical identity).
- `strict_bound(x, bound, kind, larger)`: the larger (or smaller) of x and a bound, NULL kept NULL (PostgreSQL:
  `int8larger`, `numeric_smaller`, ...; LEAST and GREATEST would skip the NULL).
- `row_id(table)`: a text that identifies one row of a table read in the query (PostgreSQL: tableoid and ctid).
- `earliest()`, `latest()`: the dates and timestamps within which the engine's date functions cannot overflow.

PostgreSQL's spelling is here (`postgres`), as it is also what `EXPLAIN`-like output and the golden corpus show;
other engines spell the nodes in their own backend module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp

from dpsql.sql.query import DIALECT, forget_positions, to_sql

KEYED_HASH, TRUNCATED, STRICT_BOUND, ROW_ID = "dpsql_keyed_hash", "dpsql_truncated", "dpsql_strict_bound", \
    "dpsql_row_id"
EARLIEST, LATEST = "dpsql_earliest", "dpsql_latest"
NODES = (KEYED_HASH, TRUNCATED, STRICT_BOUND, ROW_ID, EARLIEST, LATEST)
# PostgreSQL's dates and timestamps inside this range survive a cast to timestamp(tz) in any time zone and
# date_trunc to any unit (date_trunc('millennium', 4001 BC) and dates past 294276 AD overflow; its dates reach
# 5874897 AD)
POSTGRES_TEMPORAL = ("4000-01-01 BC", "294276-12-01")
# PostgreSQL's strict larger and smaller functions, per kind of number
POSTGRES_BOUNDS = {"integer": ("int8larger", "int8smaller"), "numeric": ("numeric_larger", "numeric_smaller"),
                   "float": ("float8larger", "float8smaller")}


# --- the nodes, as the rewrite and the analysis write them -----------------------------------------------------


def truncated(table: str, seed: int, limits: list[tuple[str, int]], alias: str) -> exp.Expression:
    """`table AS alias` read with at most `limit` rows per value of each (key column, limit)."""
    args = [exp.column(table), exp.Literal.number(int(seed))]
    for column, limit in limits:
        args += [exp.column(column), exp.Literal.number(int(limit))]
    return exp.Table(this=exp.Anonymous(this=TRUNCATED, expressions=args),
                     alias=exp.TableAlias(this=exp.to_identifier(alias)))


def strict_bound(node: exp.Expression, bound: exp.Expression, kind: str, larger: bool) -> exp.Expression:
    """The larger (`larger`) or smaller of `node` and `bound`, of kind integer, numeric or float; NULL stays NULL."""
    return exp.Anonymous(this=STRICT_BOUND, expressions=[node, bound, exp.Literal.string(kind),
                                                         exp.Boolean(this=larger)])


def row_id(table: str) -> exp.Expression:
    return exp.Anonymous(this=ROW_ID, expressions=[exp.column(table)])


def earliest() -> exp.Expression:
    return exp.Anonymous(this=EARLIEST, expressions=[])


def latest() -> exp.Expression:
    return exp.Anonymous(this=LATEST, expressions=[])


def nodes(tree: exp.Expression, *names: str) -> Iterator[exp.Anonymous]:
    """The dialect nodes of `tree` with one of `names`, innermost first (so a renderer replacing them may nest)."""
    for node in reversed(list(tree.find_all(exp.Anonymous))):
        if node.name.lower() in names:
            yield node


def bound_parts(node: exp.Anonymous) -> tuple[exp.Expression, exp.Expression, str, bool]:
    """(value, bound, kind, larger) of a `strict_bound` node."""
    value, bound, kind, larger = node.expressions
    return value, bound, kind.name, larger.this is True or str(larger.this).lower() == "true"


def truncation_parts(node: exp.Anonymous) -> tuple[str, int, list[tuple[str, int]]]:
    """(table, seed, [(key column, limit)]) of a `truncated` node."""
    table, seed, *pairs = node.expressions
    return table.name, int(seed.name), [(pairs[i].name, int(pairs[i + 1].name)) for i in range(0, len(pairs), 2)]


# --- statements ------------------------------------------------------------------------------------------------


@dataclass(eq=False)
class Statement:
    """One statement the rewrite wrote, as a tree, with its renderings (one per engine, each made once: a plan
    and its statements are remembered per query text, so a repeated query renders nothing)."""

    tree: exp.Expression
    _renderings: dict[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def parse(cls, text: str) -> Statement:
        """The statement the rewrite wrote as `text` (standard SQL and dialect nodes, PostgreSQL's syntax): the
        rewrite's own text, parsed once where it is written."""
        return cls(forget_positions(sqlglot.parse_one(text, dialect=DIALECT)))

    def render(self, engine: str, spell: Callable[[exp.Expression], str]) -> str:
        text = self._renderings.get(engine)
        if text is None:
            text = self._renderings[engine] = spell(self.tree)
        return text

    @property
    def sql(self) -> str:
        """PostgreSQL's text of the statement."""
        return self.render("postgres", postgres)


# --- PostgreSQL's spelling -------------------------------------------------------------------------------------


Spelling = Callable[[exp.Anonymous], exp.Expression]


def spell(tree: exp.Expression, spellings: dict[str, Spelling]) -> exp.Expression:
    """`tree` (changed in place; returned, as its root may be a node) with each dialect node replaced by an
    engine's spelling of it (`spellings`, by node name), innermost first so that nested nodes nest. A truncated
    table's spelling replaces the whole table read, and keeps its alias."""
    for node in list(nodes(tree, *NODES)):
        name = node.name.lower()
        target = node.parent if name == TRUNCATED else node
        spelled = spellings[name](node)
        tree = spelled if target is tree else tree
        target.replace(spelled)
    return tree


def postgres(tree: exp.Expression) -> str:
    """The tree in PostgreSQL's SQL, each dialect node spelled as PostgreSQL's functions and row identity give it."""
    return to_sql(spell(tree.copy(), _POSTGRES), disposable=True)


def _keyed_hash(node: exp.Anonymous) -> exp.Expression:
    # the record's text, one string: independent across units (see fragments.keyed_hash)
    seed, *fields = node.expressions
    record = exp.cast(exp.Anonymous(this="ROW", expressions=fields), "text")
    return exp.Anonymous(this="hashtextextended", expressions=[record, seed])


def _strict_bound(node: exp.Anonymous) -> exp.Expression:
    value, bound, kind, larger = bound_parts(node)
    return exp.Anonymous(this=POSTGRES_BOUNDS[kind][0 if larger else 1], expressions=[value, bound])


def _row_id(node: exp.Anonymous) -> exp.Expression:
    # tableoid too: ctid alone repeats across the partitions of a partitioned table
    table = node.expressions[0].name
    return exp.DPipe(this=exp.DPipe(this=exp.cast(exp.column("tableoid", table=table), "text"),
                                    expression=exp.Literal.string(":")),
                     expression=exp.cast(exp.column("ctid", table=table), "text"))


def _truncated(node: exp.Anonymous) -> exp.Expression:
    """A row is dropped when, within the rows sharing one of its keys, the keyed hash of the whole row ranks it past
    that key's limit. Ties, which only identical rows can have, are broken by the row's text and then its physical
    identity (tableoid, ctid), so every key's ranking follows one total order and two keys never drop two different
    copies of a row where one would do. Only the rows of over-full keys are ranked, so data within its bounds costs
    one grouping per key."""
    table, seed, limits = truncation_parts(node)
    name = to_sql(exp.to_identifier(table))
    # the row's text, not hash_record_extended: a table may hold types without a hash function (json)
    order = f"hashtextextended(dpsql_r::text, {seed}), dpsql_r::text, dpsql_r.tableoid, dpsql_r.ctid"
    excess = []
    for column, limit in limits:
        key = to_sql(exp.to_identifier(column))
        excess.append(f"SELECT tableoid, ctid FROM (SELECT dpsql_r.tableoid, dpsql_r.ctid, ROW_NUMBER() OVER "
                      f"(PARTITION BY dpsql_r.{key} ORDER BY {order}) AS dpsql_rank FROM {name} AS dpsql_r "
                      f"WHERE dpsql_r.{key} IN "
                      f"(SELECT {key} FROM {name} GROUP BY {key} HAVING COUNT(*) > {limit})) AS dpsql_x "
                      f"WHERE dpsql_rank > {limit}")
    select = sqlglot.parse_one(f"SELECT * FROM {name} AS dpsql_t WHERE (dpsql_t.tableoid, dpsql_t.ctid) "
                               f"NOT IN ({' UNION ALL '.join(excess)})", dialect=DIALECT)
    return exp.Subquery(this=select, alias=node.parent.args["alias"])  # the table read, under its alias


_POSTGRES: dict[str, Callable[[exp.Anonymous], exp.Expression]] = {
    KEYED_HASH: _keyed_hash, STRICT_BOUND: _strict_bound, ROW_ID: _row_id, TRUNCATED: _truncated,
    EARLIEST: lambda node: exp.Literal.string(POSTGRES_TEMPORAL[0]),
    LATEST: lambda node: exp.Literal.string(POSTGRES_TEMPORAL[1]),
}
