"""What one analysis knows so far, and the lookups on the declared schema that every pass shares.

The passes in `analysis/__init__.py` fill a `Scope` in order: the relation (tables, joins, subqueries), the
rows one unit holds in it, the group keys, the aggregates and their measures, what runs after noise. Each
pass reads what the passes before it found and writes its own fields; `analyze` turns the finished scope
into a `Plan`. The lookups here only read the privacy schema and the catalog's unique columns: whether a
column is the unit, how many rows may share a key's value, which tables' rows belong to one unit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sqlglot import exp

from dpsql.analysis.expressions import Expressions
from dpsql.analysis.plan import Aggregate, GroupKey, Histogram, Measure, Output, TopK
from dpsql.errors import UnsupportedQuery
from dpsql.schema import Column, ParentKey, PrivacySchema, Table
from dpsql.schema.model import LocalRandomizer
from dpsql.sql import CheckedQuery

Equality = tuple[exp.Column, exp.Column]  # a column = column condition between two tables


@dataclass(frozen=True)
class Semijoin:
    """An EXISTS or IN (SELECT ...) condition of WHERE."""

    aliases: list[str]  # the subquery's tables
    equalities: list[Equality]  # its column = column conditions, correlations included


@dataclass(eq=False)
class Scope:
    query: CheckedQuery
    schema: PrivacySchema
    unique: frozenset[tuple[str, str]]  # (table, column) pairs a primary key or unique constraint guarantees
    max_groups_setting: int = 1  # the configured bound on groups per unit
    notes: list[str] = field(default_factory=list)  # what `dpsql explain` shows, in the order it was found
    every_group: str | None = None  # with private keys: how to write the query so that every group is released
    unique_sets: frozenset[tuple[str, frozenset[str]]] = frozenset()  # (table, columns): keys of several columns

    # the relation (derived, relations, units)
    aliases: dict[str, Table] = field(default_factory=dict)
    outer: list[str] = field(default_factory=list)  # the query's own tables; subqueries' and dpsql's joins later
    from_: exp.From | None = None  # a subquery in FROM, bounded; None when the query reads tables
    joins: list[exp.Join] = field(default_factory=list)
    bounded_joins: dict[str, exp.Subquery] = field(default_factory=dict)  # per-unit subqueries JOINed, bounded
    windowed: dict[str, exp.Subquery] = field(default_factory=dict)  # windowed sources, ties broken, guarded
    unit_links: dict[str, exp.Expression] = field(default_factory=dict)  # by the join's source: ANDed to its ON
    private: list[str] = field(default_factory=list)  # aliases of private tables in FROM and JOIN
    equalities: list[Equality] = field(default_factory=list)  # the join conditions
    semijoins: list[Semijoin] = field(default_factory=list)

    # the rows of one unit (units)
    stability: int | None = None  # row-level joins: joined rows one neighbour changes, in all groups
    truncate: dict[str, tuple[tuple[str, int], ...]] = field(default_factory=dict)  # table -> (key, frequency)
    rows_per_unit: int = 1
    rows_cap: int | None = None  # a smaller bound on rows per unit chosen for this query (R2T's race), or None
    histogram_rows: int | None = None  # a smaller bound on rows per unit and group for histograms alone
    total_cap: float | None = None  # a bound on each unit's total of a sum over all groups (R2T's race), or None
    # the bound is on each unit's total of a variance's sum of squares: the plain sums beside it are bounded by it
    # (`aggregates._measure`)
    total_of_squares: bool = False
    unit: exp.Expression | None = None  # the unit of each joined row; None when each row is a whole unit
    direct: bool = False  # whether the rewrite aggregates the joined rows directly (no per-unit stage)
    outer_join: bool = False
    determined: set[str] = field(default_factory=set)  # aliases whose row one unit's row determines

    # the groups (groups)
    group_keys: list[GroupKey] = field(default_factory=list)
    max_groups: int = 1
    min_units: int = 1  # the minimum frequency: groups of fewer units are released with probability ≤ δ
    not_null: frozenset[tuple[str, str]] = frozenset()  # (table, column) pairs the catalog declares NOT NULL
    time_zone: str | None = None  # the backend session's, where date_trunc's periods are computed (None: not)
    cap_groups: bool = False
    domain: list[tuple] | None = None
    public_keys: Mapping[str, tuple] = field(default_factory=dict)  # a public table's values of a key, by its SQL
    rows_total: bool = False  # k rows per unit over all groups together, enforced by the rewrite

    # the statistics (aggregates, quantiles)
    measures: dict[str, Measure] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)
    aggregates: list[Aggregate] = field(default_factory=list)

    # after noise (outputs, top_k)
    outputs: list[Output] = field(default_factory=list)
    having: exp.Expression | None = None
    order: list[tuple[exp.Expression, bool, bool]] = field(default_factory=list)
    windows: list[tuple[str, exp.Window]] = field(default_factory=list)  # (column name, window over released rows)
    limit: int | None = None
    offset: int = 0
    top_k: TopK | None = None
    local_key: tuple[int, LocalRandomizer] | None = None  # a locally randomized group key: (position, randomizer)

    def __post_init__(self) -> None:
        self.exprs = Expressions(self.declared_column, lambda: self.time_zone)

    @property
    def read_as(self) -> dict[str, exp.Subquery]:
        """The SQL read in place of a FROM or JOIN source, by its alias: a bounded per-unit subquery or a windowed
        source as the analysis wrote it."""
        return {**self.bounded_joins, **self.windowed}

    @property
    def tree(self) -> exp.Select:
        return self.query.tree

    # --- columns and tables ----------------------------------------------------------------------------------

    def declared_column(self, column: exp.Column) -> Column | None:
        table = self.aliases.get(column.table)
        return table.columns.get(column.name) if table else None

    def nullable(self) -> set[str]:
        """The aliases an outer join may fill with NULLs: a LEFT JOIN's table, those before a RIGHT JOIN, both sides
        of a FULL one."""
        before = [self.tree.args["from_"].this.alias_or_name]
        found: set[str] = set()
        for join in self.joins:
            side, alias = (join.side or "").upper(), join.this.alias_or_name
            if side in ("LEFT", "FULL"):
                found.add(alias)
            if side in ("RIGHT", "FULL"):
                found.update(before)
            before.append(alias)
        return found

    def is_unit(self, column: exp.Column) -> bool:
        table = self.aliases.get(column.table)
        return table is not None and not table.public and column.name == table.unit_column

    def row_is_unit(self, alias: str) -> bool:
        """Each row of this private table is one whole unit: row-level privacy, or a unique unit column."""
        table = self.aliases[alias]
        return self.schema.row_level or (table.max_rows_per_unit == 1
                                         and (table.name, table.unit_column) in self.unique)

    @staticmethod
    def relation_text(alias: str, name: str) -> str:
        """A relation as explain names it: its alias, and the table's name where the alias differs."""
        return alias if alias == name else f"{alias} ({name})"

    def link_text(self, alias: str) -> str:
        """How the table reaches its unit, as the user would write the join."""
        table = self.aliases[alias]
        if table.unit_column is not None:
            return f"{alias}.{table.unit_column}"
        return f"{alias}.{table.parent.column} = {table.parent.table}.{table.parent.key}"

    def guarded(self, node: exp.Expression) -> exp.Expression:
        """A copy of a FROM or JOIN clause whose ON condition cannot fail on any value."""
        copy = node.copy()
        if isinstance(copy, exp.Join) and copy.args.get("on") is not None:
            copy.set("on", self.exprs.guard(copy.args["on"]))
        return copy

    # --- how many rows share a value -------------------------------------------------------------------------

    def frequency(self, table: Table, column: exp.Column) -> int:
        """The declared frequency of a join key; refuses the query when there is none."""
        frequency = self.declared_frequency(table, column.name)
        if frequency is None:
            raise UnsupportedQuery(f"join key {table.name}.{column.name} has no declared max_frequency",
                                   "declare unique = true or max_frequency = N for it in the privacy schema")
        return frequency

    def whole_keys(self, table: str, names: set[str]) -> list[frozenset[str]]:
        """The keys of `table` that the catalog guarantees unique (of one column or several) lying wholly within
        `names`: a row matched on all of them meets at most one of the table's rows."""
        single = [frozenset({n}) for n in names if (table, n) in self.unique]
        return single + [columns for name, columns in self.unique_sets if name == table and columns <= names]

    def declared_frequency(self, table: Table, name: str) -> int | None:
        """How many rows may share one value of the column: 1 if unique (by a constraint, or declared and then
        enforced), its declared max_frequency, or None if undeclared."""
        declared = table.columns[name]
        if declared.unique or (table.name, name) in self.unique:
            return 1
        return declared.max_frequency

    # --- which rows belong to one unit -----------------------------------------------------------------------

    def unit_components(self, aliases: list[str], equalities: list[Equality]) \
            -> tuple[dict[str, str], Callable[[str], str]]:
        """Union-find of the aliases whose rows belong to one unit: joined on unit columns, along a parent key,
        or as two children of one parent row."""
        component = {a: a for a in aliases}

        def root(a: str) -> str:
            while component[a] != a:
                a = component[a]
            return a

        for left, right in equalities:
            if left.table in component and right.table in component and self._same_unit(left, right):
                component[root(left.table)] = root(right.table)
        return component, root

    def _same_unit(self, left: exp.Column, right: exp.Column) -> bool:
        if self.is_unit(left) and self.is_unit(right):
            return True
        if self.is_parent_link(left, right) or self.is_parent_link(right, left):
            return True
        a, b = self.aliases.get(left.table), self.aliases.get(right.table)
        if a is None or b is None or a.public or b.public or a.parent is None or b.parent is None:
            return False
        siblings = ((a.parent.table, a.parent.key) == (b.parent.table, b.parent.key)
                    and left.name == a.parent.column and right.name == b.parent.column)
        if siblings:
            self.require_unique_parent(a.name, a.parent)
        return siblings

    def is_parent_link(self, child: exp.Column, parent: exp.Column) -> bool:
        """`child = parent` follows the child table's declared parent key (verified unique)."""
        table, other = self.aliases.get(child.table), self.aliases.get(parent.table)
        link = table.parent if table is not None and not table.public else None
        if link is None or other is None or other.public or child.name != link.column:
            return False
        if other.name != link.table or parent.name != link.key:
            return False
        self.require_unique_parent(table.name, link)
        return True

    def require_unique_parent(self, name: str, link: ParentKey) -> None:
        if (link.table, link.key) not in self.unique:
            raise UnsupportedQuery(f"{name} reaches the unit through {link.table}.{link.key}, which no primary key "
                                   "or unique constraint guarantees to be unique",
                                   f"add a PRIMARY KEY or UNIQUE constraint on {link.table}({link.key}) (on Spark, "
                                   f"which verifies no key, give {name} the unit column instead)")

    # --- the shape of a neighbour ----------------------------------------------------------------------------

    @property
    def steps(self) -> int:
        """Under "replace" a neighbour removes one unit's contribution and adds another's: two steps."""
        return 2 if self.schema.neighbouring == "replace" else 1

    def spread(self, groups: int) -> int:
        """Over how many groups one unit's k rows per group add up: G, or 1 where k already counts the rows of all
        groups together: under row-level joins (the changed joined rows touch at most k groups, `coordinates`)
        and where the rewrite keeps k rows per unit over all groups (`rows_total`)."""
        return 1 if self.stability is not None or self.rows_total else groups
