"""Sensitivity analysis: from a checked query to a plan of noisy statistics with their sensitivities.

`analyze` is the stage's one public entry. It works out:
- the privacy unit of every row of the joined relation, and how many rows one unit can have there (k);
- the group keys, whether their values are public (a declared domain) or need DP partition selection, and
  how many groups one unit may touch (G, enforced by the rewrite);
- each aggregate as sums of bounded per-row expressions ("measures") plus a finishing formula: COUNT is a
  sum of 1s, AVG a centred sum over a count, variances add a sum of squares;
- each measure's L1 sensitivity: G groups, each moved by at most k rows' worth of its per-row range;
- for percentiles, MIN and MAX, a histogram over a fixed grid of the declared range, from which the
  exponential mechanism picks a cell (rank scores move by at most k per group, in at most G groups); for
  mode() the same over the declared domain of the column, scored by count;
- for `GROUP BY key ORDER BY COUNT(...) DESC LIMIT k`, a top-k selection: the keys are chosen by the
  exponential mechanism on their exact counts (each moves by at most one unit's per-group count), and only
  the chosen groups' measures are noised.
Nothing here reads the data: every number comes from the declared schema and from catalog constraints.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from itertools import product
from typing import Any

from sqlglot import exp

from dpsql.analysis import stability
from dpsql.analysis.expressions import Expressions, Range, clamp_to
from dpsql.errors import PrivacyRefusal, UnsupportedQuery
from dpsql.schema import Column, PrivacySchema, Table
from dpsql.sql import AGGREGATES, DIALECT, CheckedQuery, derived_select, semijoin_selects

ONE, BIT = Range(1, 1, True), Range(0, 1, True)  # per-row ranges of COUNT(*) and COUNT(expr)
MAX_DOMAIN = 10_000  # largest public key set released in full (every key, empty ones too)
HISTOGRAM_CELLS = 1000  # grid for quantiles of real values (integer ranges below this get one cell per value)
COUNTS = ("count", "count_units")
CHOSEN = ("quantile", "mode")


@dataclass(frozen=True)
class Measure:
    """A per-group sum of a bounded per-row expression; one noisy statistic per group."""

    name: str
    label: str
    kind: str  # sum: SUM(expr) | count: COUNT(expr), COUNT(*) if expr is None | units: distinct units
    #          | distinct: COUNT(DISTINCT expr), row-level privacy only
    expr: exp.Expression | None  # guarded per-row value
    row_range: Range  # every row's value lies here (the rewrite clamps to it)
    unit_range: tuple[float, float]  # one unit's total lies here (the rewrite clamps to it)
    sensitivity: float  # L1 over all groups for neighbouring databases
    l2_sensitivity: float  # L2 over all groups
    coordinates: int  # how many groups one neighbour can change
    centre: float = 0.0  # sum only: the statistic is SUM(expr - centre), computed as SUM(expr) - centre·COUNT(expr)

    @property
    def integer_valued(self) -> bool:
        return self.row_range.integer


@dataclass(frozen=True)
class Histogram:
    """Exact counts of a bounded value per cell of a fixed grid over its declared range, per group. The
    exponential mechanism chooses a cell from them (quantiles, MIN, MAX); one unit moves at most `rows`
    counts of each group's histogram, in at most `groups` groups."""

    name: str
    label: str
    cell: exp.Expression  # guarded per-row cell index in 0 .. cells - 1 (NULL when the value is NULL)
    cells: int
    lower: float  # cell j covers [lower + j·width, lower + (j+1)·width); integer grids hold one value each
    width: float
    integer: bool
    rows: int  # the most rows one unit keeps per group (the rewrite keeps at most this many)
    groups: int  # the most groups one unit touches
    sensitivity: float  # how far one unit moves any candidate's rank score, over all groups

    values: tuple | None = None  # categorical cells (mode over a declared domain): cell j holds values[j]

    def value(self, cell: int) -> Any:
        """The value reported for a chosen cell: the domain value, the integer itself, or the cell's midpoint."""
        if self.values is not None:
            return self.values[cell]
        return self.lower + cell * self.width + (0 if self.integer else self.width / 2)


@dataclass(frozen=True)
class Aggregate:
    """An aggregate call of the query, finished from its measures after noise."""

    name: str
    kind: str  # count | count_units | sum | avg | var_pop | var_samp | stddev_pop | stddev_samp | quantile | mode
    measures: tuple[str, ...]  # measure names; for quantile and mode, the histogram's name
    arg_range: Range | None  # the argument's range, for clamping finished averages and variances
    sql: str
    quantile: float | None = None  # for percentiles, MIN (0) and MAX (1): chosen from a histogram
    arg_type: str | None = None  # for mode: the type of the value it returns

    @property
    def chosen(self) -> bool:
        """Whether the exponential mechanism picks this aggregate's value from a histogram."""
        return self.kind in CHOSEN


@dataclass(frozen=True)
class TopK:
    """GROUP BY ... ORDER BY <count> DESC LIMIT k: the k keys with the largest counts, picked by the
    exponential mechanism (peeling) on the exact counts of `measure`."""

    measure: str
    k: int
    sensitivity: float  # the most one unit moves any one key's count
    monotone: bool  # counts under add-remove only grow when a unit is added


@dataclass(frozen=True)
class GroupKey:
    name: str
    expr: exp.Expression  # guarded
    domain: tuple | None  # public values of the key, or None
    sql: str


@dataclass(frozen=True)
class Output:
    name: str
    expr: exp.Expression  # over aggregate and group-key names, evaluated after noise
    type_name: str  # int8 | float8 | text | ...
    noisy: bool = False  # computed from noisy aggregates (False for group keys and constants)


@dataclass
class Plan:
    from_: exp.From
    joins: list[exp.Join]
    where: exp.Expression | None
    unit: exp.Expression | None  # None: each row already is one whole unit (no per-unit stage needed)
    rows_per_unit: int
    group_keys: list[GroupKey]
    max_groups: int  # groups one unit may touch (1 for ungrouped queries)
    cap_groups: bool  # whether the rewrite must enforce max_groups
    domain: list[tuple] | None  # every public key combination, or None: partition selection
    measures: list[Measure]
    histograms: list[Histogram]
    aggregates: list[Aggregate]
    outputs: list[Output]
    having: exp.Expression | None
    order: list[tuple[exp.Expression, bool, bool]]  # (expression, descending, nulls first)
    limit: int | None
    offset: int
    neighbouring: str
    top_k: TopK | None = None
    notes: list[str] = field(default_factory=list)
    # row-level privacy with joins: how many joined rows one neighbour changes, over all groups (None: per unit)
    stability: int | None = None
    truncate: dict[str, tuple[tuple[str, int], ...]] = field(default_factory=dict)  # table -> keys, frequencies

    @cached_property
    def aggregate(self) -> dict[str, Aggregate]:
        """Aggregates by name."""
        return {a.name: a for a in self.aggregates}

    @cached_property
    def histogram(self) -> dict[str, Histogram]:
        """Histograms by name."""
        return {h.name: h for h in self.histograms}

    @property
    def grouped(self) -> bool:
        return bool(self.group_keys)

    @property
    def partition_selection(self) -> bool:
        return self.grouped and self.domain is None

    @property
    def ordered_bins(self) -> bool:
        """Whether the groups are ordered histogram bins: one key over a run of consecutive integers (a bounded
        integer column or width_bucket), where NoiseFirst and StructureFirst apply."""
        if len(self.group_keys) != 1 or self.domain is None or len(self.domain) < 2:
            return False
        values = [key[0] for key in self.domain]
        return all(isinstance(v, int) and not isinstance(v, bool) for v in values) \
            and values == list(range(values[0], values[0] + len(values)))


def analyze(query: CheckedQuery, schema: PrivacySchema, unique_columns: frozenset[tuple[str, str]],
            max_groups: int | None = None) -> Plan:
    """The plan of noisy statistics for `query`. `unique_columns` are (table, column) pairs that a primary
    key or unique constraint guarantees; `max_groups` overrides the schema's groups-per-unit bound."""
    return _Analyzer(query, schema, unique_columns).run(max_groups or schema.max_groups_per_unit)


class _Analyzer:
    def __init__(self, query: CheckedQuery, schema: PrivacySchema, unique: frozenset[tuple[str, str]]):
        self.query, self.schema, self.unique = query, schema, unique
        self.tree = query.tree
        self.aliases: dict[str, Table] = {}
        self.outer: list[str] = []
        self.exprs = Expressions(self._declared_column)
        self.notes: list[str] = []
        self.stability: int | None = None  # row-level joins: joined rows one neighbour changes, in all groups
        self.truncate: dict[str, tuple[tuple[str, int], ...]] = {}  # table -> (key column, max frequency)
        self.direct = False  # whether the rewrite aggregates the joined rows directly (no per-unit stage)

    # --- the relation: tables, joins, the unit of each row --------------------------------------------------

    def run(self, max_groups_setting: int) -> Plan:
        tree = self.tree
        if tree.args.get("from_") is None:
            raise PrivacyRefusal("a query without FROM reads no private data", "dpsql answers aggregates over tables")
        from_ = tree.args["from_"]
        derived = derived_select(tree)
        if derived is not None:
            from_ = self._derive(derived, tree.args["from_"].this.alias_or_name)
        joins, private, equalities, semijoins = self._relation(derived is not None)
        if self.stability is not None:  # row-level privacy, reading a grouped subquery
            self._refuse_private_semijoins(semijoins)
            k, unit, fast, outer, determined = self.stability, None, True, False, set()
        elif self._rows_of_several_units(private, semijoins):
            k = self._join_stability(joins, equalities, semijoins).stability
            unit, fast, outer, determined = None, True, False, set()
        else:
            fanout, determined, verified = self._public_joins(equalities, private)
            unit, k_private, parent_joins = self._unit(private, equalities)
            joins += parent_joins
            self._check_semijoins(semijoins, private, equalities)
            k = k_private * fanout
            # an outer join can add rows that belong to no unit, or give one unit's rows different group keys,
            # so it always takes the per-unit path (which drops rows without a unit) and the group cap
            outer = any(j.side for j in joins)
            fast = not outer and k == 1 and verified and all(self._row_is_unit(a) for a in private)
            if not fast and unit is None:  # each row is its own unit; ctid alone repeats across partitions
                unit = exp.DPipe(this=exp.DPipe(this=exp.cast(exp.column("tableoid", table=private[0]), "text"),
                                                expression=exp.Literal.string(":")),
                                 expression=exp.cast(exp.column("ctid", table=private[0]), "text"))
            self.notes.append(f"rows per unit in the joined relation: at most {k}"
                              + (" (guaranteed by unique constraints)" if fast else " (enforced per unit)"))

        keys = self._group_keys()
        if keys and self.stability is not None:  # the changed joined rows may each fall in another group
            groups, cap = k, False
            self.notes.append(f"the {k} changed joined row(s) may fall in as many groups")
        elif keys:
            natural = not outer and all(self._determined_by_unit(k_.expr, determined) for k_ in keys)
            groups = 1 if natural else max(1, min(max_groups_setting, k))
            cap = not natural and not fast
            if natural:
                self.notes.append("group keys depend only on the unit: each unit is in one group")
            else:
                self.notes.append(f"each unit counts in at most {groups} group(s) (enforced by the rewrite)")
        else:
            groups, cap = 1, False
        domain = _domain(keys)
        if keys:
            self.notes.append("group keys come from a public domain: every key is released" if domain is not None
                              else "group keys are private: released by DP partition selection")

        measures: dict[str, Measure] = {}
        histograms: dict[str, Histogram] = {}
        self.direct = fast  # no per-unit stage: aggregates run on the joined rows themselves
        aggregates = self._aggregates(measures, histograms, k, groups)
        if not aggregates:
            raise PrivacyRefusal("the query has no aggregate, so it would release raw rows",
                                 "dpsql answers aggregates: COUNT, SUM, AVG, VARIANCE, STDDEV, e.g. "
                                 "SELECT state, COUNT(*) FROM people GROUP BY state")
        outputs, having, order = self._post_processing(keys, aggregates)
        limit, offset = self._limit()
        top_k = self._top_k(keys, aggregates, measures, order, having, limit, offset)
        return Plan(
            from_=from_ if derived is not None else _guarded(from_, self.exprs),  # a subquery comes bounded
            joins=[_guarded(j, self.exprs) for j in joins],
            where=self.exprs.guard(tree.args["where"].this) if tree.args.get("where") else None,
            unit=None if fast else unit, rows_per_unit=k, group_keys=keys, max_groups=groups,
            cap_groups=cap, domain=domain, measures=list(measures.values()),
            histograms=list(histograms.values()), aggregates=aggregates,
            outputs=outputs, having=having, order=order, limit=limit, offset=offset,
            neighbouring=self.schema.neighbouring, top_k=top_k, notes=self.notes, stability=self.stability,
            truncate=self.truncate)

    def _relation(self, derived: bool) -> tuple[list[exp.Join], list[str], list, list[_Semijoin]]:
        """The query's tables and joins: (joins, private aliases, join equalities, WHERE subqueries)."""
        tree = self.tree
        joins = list(tree.args.get("joins") or [])
        if derived and joins:
            raise UnsupportedQuery("a per-unit subquery cannot be joined to other tables here",
                                   "join the tables inside the subquery")
        for source in [tree.args["from_"].this, *(j.this for j in joins)]:
            if derived:
                break
            if not isinstance(source, exp.Table):
                raise UnsupportedQuery("only tables may appear in FROM and JOIN")
            self.aliases[source.alias_or_name] = self.schema.tables[source.name]
        private = [a for a, t in self.aliases.items() if not t.public]
        self.outer = list(self.aliases)  # the query's own tables; subqueries' and dpsql's joins come later
        semijoins = self._semijoins()
        equalities = self._equalities(joins)
        if not private:
            raise PrivacyRefusal("the query reads only public tables",
                                 "query public tables directly; dpsql answers questions about private data")
        for node in [tree.args.get("where"), *(j.args.get("on") for j in joins)]:
            if node is not None:
                self.exprs.check(node)
        return joins, private, equalities, semijoins

    # --- per-unit subqueries: FROM (SELECT unit, aggregates ... GROUP BY unit) ---------------------------

    def _derive(self, select: exp.Select, alias: str) -> exp.From:
        """Analyse the grouped subquery the query reads from. It must group by the unit, so each of its rows is
        one whole unit; its aggregates are clamped to what the unit's k rows could give, and the outer query
        sees them as a private table with those bounds and one row per unit. Returns the FROM clause that
        runs the bounded subquery."""
        inner = _Analyzer(CheckedQuery(select, ()), self.schema, self.unique)
        table, bounded = inner.per_unit_table(alias)
        self.aliases[alias] = table
        if table.unit_column is not None:
            self.unique = self.unique | {(alias, table.unit_column)}  # GROUP BY the unit: one row per unit
        self.stability, self.truncate = inner.stability, inner.truncate
        self.notes += [f"subquery {alias}: {note}" for note in inner.notes]
        return exp.From(this=exp.Subquery(this=bounded, alias=exp.TableAlias(this=exp.to_identifier(alias))))

    def per_unit_table(self, alias: str) -> tuple[Table, exp.Select]:
        """This query (a subquery grouped by the unit, or under row-level privacy by a column whose frequency is
        declared) as a table of one row per group, and its bounded SQL."""
        tree = self.tree
        group = tree.args["group"].expressions
        if tree.args.get("having") or tree.args.get("order") or tree.args.get("limit"):
            raise UnsupportedQuery(f"subquery {alias} may not have HAVING, ORDER BY or LIMIT",
                                   "filter and order in the outer query")
        if self.schema.row_level:
            joins, k = self._row_level_groups(alias, group)
        else:
            joins, private, equalities, semijoins = self._relation(False)
            unit, k, parent_joins = self._unit(private, equalities)
            joins += parent_joins
            self._check_semijoins(semijoins, private, equalities)
            k *= self._public_joins(equalities, private)[0]
            if len(group) != 1 or not isinstance(group[0], exp.Column) or not self._is_unit(group[0]):
                raise UnsupportedQuery(f"subquery {alias} must GROUP BY the privacy unit alone ("
                                       + ", ".join(self._link_text(a) for a in private if self.aliases[a].unit_column)
                                       + ")", "group by the unit inside, then aggregate or group its results outside")
        unit_sql = group[0].sql(dialect=DIALECT)
        columns: dict[str, Column] = {}
        outputs = []
        unit_name = None
        for item in tree.expressions:
            name, node = item.alias_or_name, item.unalias()
            if node.sql(dialect=DIALECT) == unit_sql:
                declared = self._declared_column(node)
                columns[name] = Column(name, declared.type if declared else "bigint")
                unit_name = name
                outputs.append(exp.alias_(group[0].copy(), name))
                continue
            expr, column = self._per_unit_aggregate(name, node, k)
            columns[name] = column
            outputs.append(exp.alias_(expr, name))
        if unit_name is None:  # the outer query needs the unit even if the subquery does not name it
            unit_name = "dpsql_unit"
            if unit_name in columns:
                raise UnsupportedQuery(f"subquery {alias} must select the unit column if it names a column "
                                       "dpsql_unit", f"add {unit_sql} to its SELECT list")
            columns[unit_name] = Column(unit_name, "bigint")
            outputs.append(exp.alias_(group[0].copy(), unit_name))
        where = self.exprs.guard(tree.args["where"].this) if tree.args.get("where") else None
        present = exp.Not(this=exp.Is(this=group[0].copy(), expression=exp.Null()))
        bounded = exp.select(*outputs).from_(_guarded(tree.args["from_"], self.exprs))
        for join in joins:
            bounded = bounded.join(_guarded(join, self.exprs))
        bounded = bounded.where(present if where is None else exp.and_(exp.paren(where), present))
        bounded = bounded.group_by(group[0].copy())
        self.notes.append(f"one row per group; each group's aggregates bounded by what {k} rows can give")
        unit_column = None if self.schema.row_level else unit_name
        return Table(alias, columns, unit_column=unit_column, max_rows_per_unit=1), bounded

    def _row_level_groups(self, alias: str, group: list[exp.Expression]) -> tuple[list[exp.Join], int]:
        """Under row-level privacy, a subquery grouped by one column: its joins, and how many joined rows one group
        holds (the column's frequency in the joined relation, enforced). Sets the stability of the table of
        groups: a change rewrites the groups its changed joined rows fall in, each a removal and an addition."""
        joins, _, equalities, semijoins = self._relation(False)
        if len(group) != 1 or not isinstance(group[0], exp.Column) or group[0].table not in self.outer:
            raise UnsupportedQuery(f"subquery {alias} must GROUP BY one column of its tables",
                                   "group by a key, e.g. GROUP BY c.c_custkey, then aggregate its results outside")
        if semijoins:
            raise UnsupportedQuery(f"subquery {alias} may not contain subqueries", "move them to the outer query")
        key = group[0]
        joined = self._join_stability(joins, equalities, [], key)
        rows = joined.frequencies.get(f"{key.table}.{key.name}")
        if rows is None:
            self._frequency(self.aliases[key.table], key)  # raises: how many rows share a group is undeclared
        touched = self._groups_touched(key, equalities)
        grouped = stability.grouped(joined, touched)
        self.notes.append(f"at most {rows} joined row(s) per group; one neighbour rewrites at most "
                          f"{grouped.stability // 2} group(s): stability {grouped.stability}")
        self.stability = grouped.stability
        return joins, rows

    def _groups_touched(self, key: exp.Column, equalities) -> int | None:
        """How many groups of `key` one changed row can touch, when each table's changed rows fix the group: the
        grouped table's own changed rows (1 + its truncated keys), or a table joined directly on the group key and
        truncated on that key alone (an added row pushes out only rows with the same key). None if unknown."""
        per_table: dict[str, int] = {}
        for alias in self.outer:
            table = self.aliases[alias]
            if table.public:
                continue
            truncated = {c for c, _ in self.truncate.get(table.name, ())}
            on_key = {mine.name for left, right in equalities for mine, other in ((left, right), (right, left))
                      if mine.table == alias and (other.table, other.name) == (key.table, key.name)}
            if alias == key.table:  # rows pushed out by truncation on the group key are in the same group
                touched = 1 if truncated <= {key.name} else 1 + len(truncated)
            elif on_key and len(truncated) <= 1 and truncated <= on_key:
                touched = 1
            else:
                return None
            per_table[table.name] = per_table.get(table.name, 0) + touched
        return max(per_table.values())

    def _per_unit_aggregate(self, name: str, node: exp.Expression, k: int) -> tuple[exp.Expression, Column]:
        """One unit's aggregate, clamped to what k of its rows could give, and its declared range outside."""
        kind = AGGREGATES.get(type(node))
        if kind not in ("count", "sum", "avg", "min", "max"):
            raise UnsupportedQuery(f"{node.sql(dialect=DIALECT)} in a per-unit subquery: use COUNT, SUM, AVG, "
                                   "MIN or MAX of a column or bounded expression, or the unit column itself")
        if kind == "count":
            return clamp_to(node, 0, k, "integer"), Column(name, "bigint", 0.0, float(k))
        argument = node.this.this if isinstance(node.this, exp.Distinct) else node.this
        row = self.exprs.numeric(argument, kind)
        lo, hi = (min(0.0, k * row.lo), max(0.0, k * row.hi)) if kind == "sum" else (row.lo, row.hi)
        guarded = node.copy()
        guarded.set("this", self.exprs.guard(node.this))
        integer = row.integer and kind != "avg"
        # SUM and AVG of integers are numeric in PostgreSQL (SUM of integer is bigint, which widens to numeric)
        result_kind = self.exprs.kind(argument)
        if kind in ("sum", "avg") and result_kind == "integer":
            result_kind = "numeric"
        return (clamp_to(guarded, lo, hi, result_kind),
                Column(name, "bigint" if integer else "double precision", lo, hi))

    def _declared_column(self, column: exp.Column):
        table = self.aliases.get(column.table)
        return table.columns.get(column.name) if table else None

    def _equalities(self, joins: list[exp.Join]) -> list[tuple[exp.Column, exp.Column]]:
        """Column = column conjuncts of WHERE and of every ON: the join conditions."""
        conditions = [self.tree.args["where"].this] if self.tree.args.get("where") else []
        for join in joins:
            if join.side.upper() == "FULL" or join.kind.upper() in ("CROSS", "NATURAL"):
                raise UnsupportedQuery(f"{(join.side or join.kind).upper()} JOIN is not supported",
                                       "use an inner or LEFT/RIGHT join on the declared key")
            if join.args.get("using"):
                raise UnsupportedQuery("JOIN ... USING is not supported", "write JOIN ... ON a.x = b.x")
            if join.args.get("on") is not None:
                conditions.append(join.args["on"])
        return _column_equalities(conditions)

    # --- semijoins: EXISTS / IN (SELECT ...) in WHERE ----------------------------------------------------

    def _semijoins(self) -> list[_Semijoin]:
        """The WHERE clause's EXISTS and IN subqueries, their tables registered under their own aliases."""
        where = self.tree.args.get("where")
        selects = semijoin_selects(self.tree)
        if not selects:
            return []
        conjuncts = {id(c.unnest()) for c in _conjuncts(where.this)}
        found = []
        for select in selects:
            condition = select.parent.parent if isinstance(select.parent, exp.Subquery) else select.parent
            top = condition.parent if isinstance(condition.parent, exp.Not) else condition
            while isinstance(top.parent, exp.Paren):
                top = top.parent
            if id(top.unnest()) not in conjuncts and id(top) not in conjuncts:
                raise UnsupportedQuery("EXISTS and IN (SELECT ...) must each be a condition of their own, joined "
                                       "to the rest of WHERE by AND", "move OR-ed subqueries into separate queries")
            aliases = []
            sub_joins = list(select.args.get("joins") or [])
            if select.args.get("from_") is None:
                raise UnsupportedQuery("a subquery in WHERE needs a FROM clause")
            for source in [select.args["from_"].this, *(j.this for j in sub_joins)]:
                if not isinstance(source, exp.Table):
                    raise UnsupportedQuery("only tables may appear in a subquery's FROM and JOIN")
                alias = source.alias_or_name
                if alias in self.aliases:
                    raise UnsupportedQuery(f'the name "{alias}" is used both outside a subquery and inside it',
                                           "give the subquery's tables aliases of their own, e.g. EXISTS (SELECT 1 "
                                           f"FROM {source.name} {source.name[0]}2 WHERE ...)")
                self.aliases[alias] = self.schema.tables[source.name]
                aliases.append(alias)
            if any(j.side or j.kind.upper() not in ("", "INNER") for j in sub_joins):
                raise UnsupportedQuery("a subquery in WHERE may use inner joins only")
            conditions = [select.args["where"].this] if select.args.get("where") else []
            equalities = _column_equalities(conditions + [j.args["on"] for j in sub_joins if j.args.get("on")])
            if isinstance(condition, exp.In):
                value = select.expressions[0].unalias()
                if isinstance(condition.this, exp.Column) and isinstance(value, exp.Column):
                    equalities.append((condition.this, value))
            found.append(_Semijoin(aliases, equalities))
        return found

    def _refuse_private_semijoins(self, semijoins: list[_Semijoin]) -> None:
        """Under row-level privacy, the table of groups a subquery in FROM yields has a stability of its own, which
        no rule here extends to subqueries in the outer WHERE: a private one there could flip every row at once
        (an uncorrelated NOT EXISTS over a table one row can make non-empty), so it is refused."""
        for semijoin in semijoins:
            private = [a for a in semijoin.aliases if not self.aliases[a].public]
            if private:
                raise UnsupportedQuery(f"a subquery in WHERE over {self.aliases[private[0]].name} cannot be bounded "
                                       "next to a grouped subquery in FROM under row-level privacy",
                                       "filter inside the grouped subquery, or use a subquery over public tables")

    def _check_semijoins(self, semijoins: list[_Semijoin], private: list[str], equalities) -> None:
        """A subquery over private tables may only read the outer row's own unit: each of its private tables
        is joined to the outer query along unit columns or parent keys. Then adding or removing a unit flips
        the condition only for that unit's rows, which its own bounds already cover. Subqueries over public
        tables depend on no unit at all."""
        for semijoin in semijoins:
            sub_private = [a for a in semijoin.aliases if not self.aliases[a].public]
            if not sub_private:
                self.notes.append("a subquery in WHERE reads only public tables: no extra sensitivity")
                continue
            _, root = self._components([*private, *semijoin.aliases], equalities + semijoin.equalities)
            outer_roots = {root(a) for a in private}
            stray = [a for a in sub_private if root(a) not in outer_roots]
            if stray:
                table = self.aliases[stray[0]]
                raise UnsupportedQuery(
                    f"the subquery reads {table.name} ({stray[0]}) without tying it to the outer row's unit, so one "
                    "person's rows could change the condition for everyone",
                    f"join it on {self._link_text(stray[0])} to a table of the outer query inside the subquery's "
                    "WHERE")
            self.notes.append("a subquery in WHERE reads only the outer row's own unit: no extra sensitivity")

    def _components(self, aliases: list[str], equalities) -> tuple[dict[str, str], Callable[[str], str]]:
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
        if self._is_unit(left) and self._is_unit(right):
            return True
        if self._is_parent_link(left, right) or self._is_parent_link(right, left):
            return True
        a, b = self.aliases.get(left.table), self.aliases.get(right.table)
        if a is None or b is None or a.public or b.public or a.parent is None or b.parent is None:
            return False
        siblings = ((a.parent.table, a.parent.key) == (b.parent.table, b.parent.key)
                    and left.name == a.parent.column and right.name == b.parent.column)
        if siblings:
            self._require_unique_parent(a.name, a.parent)
        return siblings

    def _unit(self, private: list[str], equalities) -> tuple[exp.Expression | None, int, list[exp.Join]]:
        """The unit id of each joined row, the bound on one unit's rows across the private tables, and the joins
        dpsql adds to reach the unit from tables that hold it only through a parent (`parent = "col -> t.key"`).

        Private tables must be joined on their unit columns or along parent keys, so that every joined row
        belongs to one unit. A row reached through a unique parent key is fixed by its child's row, so only the
        other tables' row bounds multiply."""
        if self.schema.row_level:  # one private table (several take the stability path)
            return None, 1, []
        component, root = self._components(private, equalities)
        links = [(child.table, parent.table)  # (child alias, parent alias): the child's row fixes the parent's
                 for left, right in equalities for child, parent in ((left, right), (right, left))
                 if child.table in component and parent.table in component and self._is_parent_link(child, parent)]
        added: list[exp.Join] = []
        pending = list(private)
        while pending:
            alias = pending.pop()
            table = self.aliases[alias]
            if table.unit_column is not None or any(child == alias for child, _ in links):
                continue
            join, parent_alias = self._parent_join(alias, table, len(added) + 1)
            added.append(join)
            component[parent_alias] = root(alias)
            links.append((alias, parent_alias))
            pending.append(parent_alias)
        aliases = list(component)
        if len({root(a) for a in aliases}) > 1:
            raise UnsupportedQuery(
                "private tables must be joined on their unit columns or along their declared parent keys ("
                + ", ".join(self._link_text(a) for a in private) + ")",
                "joins on other keys between private tables come with general equijoin support")
        free = set(aliases)
        for child, parent in links:
            if child in free and parent != child:
                free.discard(parent)
        columns = [exp.column(self.aliases[a].unit_column, table=a) for a in aliases
                   if self.aliases[a].unit_column is not None]
        unit = columns[0] if len(columns) == 1 else exp.Coalesce(this=columns[0], expressions=columns[1:])
        for join in added:
            self.notes.append(f"dpsql joins {join.this.name} AS {join.this.alias} to reach the unit")
        for alias in aliases:
            table = self.aliases[alias]
            fixed_by = next((child for child, parent in links if parent == alias and child in free), None)
            how = (f"fixed by {fixed_by}'s row (unique key)" if alias not in free and fixed_by
                   else f"at most {table.max_rows_per_unit} rows per unit (declared)")
            reach = (f"unit column {table.unit_column}" if table.unit_column
                     else f"reaches the unit through {table.parent}")
            self.notes.append(f"relation {alias} ({table.name}): {how}; {reach}")
        return unit, math.prod(self.aliases[a].max_rows_per_unit for a in aliases if a in free), added

    def _is_parent_link(self, child: exp.Column, parent: exp.Column) -> bool:
        """`child = parent` follows the child table's declared parent key (verified unique)."""
        table, other = self.aliases.get(child.table), self.aliases.get(parent.table)
        link = table.parent if table is not None and not table.public else None
        if link is None or other is None or other.public or child.name != link.column:
            return False
        if other.name != link.table or parent.name != link.key:
            return False
        self._require_unique_parent(table.name, link)
        return True

    def _parent_join(self, alias: str, table: Table, number: int) -> tuple[exp.Join, str]:
        """A LEFT JOIN of the parent table that gives `alias`'s rows their unit (rows without one are dropped
        by the per-unit stage)."""
        link = table.parent
        self._require_unique_parent(table.name, link)
        parent_alias = f"dpsql_parent_{number}"
        while parent_alias in self.aliases:  # never shadow a name the query uses itself
            parent_alias += "_"
        self.aliases[parent_alias] = self.schema.tables[link.table]
        on = exp.EQ(this=exp.column(link.key, table=parent_alias), expression=exp.column(link.column, table=alias))
        source = exp.Table(this=exp.to_identifier(link.table),
                           alias=exp.TableAlias(this=exp.to_identifier(parent_alias)))
        return exp.Join(this=source, on=on, side="LEFT"), parent_alias

    def _require_unique_parent(self, name: str, link) -> None:
        if (link.table, link.key) not in self.unique:
            raise UnsupportedQuery(f"{name} reaches the unit through {link.table}.{link.key}, which no primary key "
                                   "or unique constraint guarantees to be unique",
                                   f"add a PRIMARY KEY or UNIQUE constraint on {link.table}({link.key})")

    def _link_text(self, alias: str) -> str:
        table = self.aliases[alias]
        if table.unit_column is not None:
            return f"{alias}.{table.unit_column}"
        return f"{alias}.{table.parent.column} = {table.parent.table}.{table.parent.key}"

    def _is_unit(self, column: exp.Column) -> bool:
        table = self.aliases.get(column.table)
        return table is not None and not table.public and column.name == table.unit_column

    def _row_is_unit(self, alias: str) -> bool:
        """Each row of this private table is one whole unit: row-level privacy, or a unique unit column."""
        table = self.aliases[alias]
        return self.schema.row_level or (table.max_rows_per_unit == 1
                                         and (table.name, table.unit_column) in self.unique)

    def _public_joins(self, equalities, private: list[str]) -> tuple[int, set[str], bool]:
        """How many public rows one private row can match (declared), which aliases one unit's row
        determines, and whether the catalog guarantees every public join matches at most one row.

        A public table joins on an equality with a table already reached: a private one, or a public one
        joined before it (nation through supplier), so each joined row meets at most the key's declared
        frequency of its rows."""
        determined = {a for a in private if self._row_is_unit(a)}
        reached = set(private)
        waiting = [a for a in self.outer if self.aliases[a].public]
        fanout, verified = 1, True
        while waiting:
            progress = False
            for alias in list(waiting):
                table = self.aliases[alias]
                keys = [(mine, other) for left, right in equalities
                        for mine, other in ((left, right), (right, left))
                        if mine.table == alias and other.table in reached]
                if not keys:
                    continue
                frequency = min(self._frequency(table, mine) for mine, _ in keys)
                fanout *= frequency
                self.notes.append(f"relation {alias} ({table.name}): public, at most {frequency} row(s) per "
                                  f"joined row (key {', '.join(sorted({m.name for m, _ in keys}))})")
                unique_keys = [(m, o) for m, o in keys if (table.name, m.name) in self.unique]
                verified = verified and bool(unique_keys)
                if any(o.table in determined for _, o in unique_keys):
                    determined.add(alias)
                reached.add(alias)
                waiting.remove(alias)
                progress = True
            if not progress:
                table = self.aliases[waiting[0]]
                raise UnsupportedQuery(f"public table {table.name} must be joined on an equality with a private "
                                       "table's column (or with a public table joined to one)",
                                       f"e.g. JOIN {table.name} ON {table.name}.key = t.column")
        return fanout, determined, verified

    def _frequency(self, table: Table, column: exp.Column) -> int:
        frequency = self._declared_frequency(table, column.name)
        if frequency is None:
            raise UnsupportedQuery(f"join key {table.name}.{column.name} has no declared max_frequency",
                                   "declare unique = true or max_frequency = N for it in the privacy schema")
        return frequency

    def _declared_frequency(self, table: Table, name: str) -> int | None:
        """How many rows may share one value of the column: 1 if unique (by a constraint, or declared and then
        enforced), its declared max_frequency, or None if undeclared."""
        declared = table.columns[name]
        if declared.unique or (table.name, name) in self.unique:
            return 1
        return declared.max_frequency

    # --- row-level privacy: stability through joins -------------------------------------------------------

    def _rows_of_several_units(self, private: list[str], semijoins: list[_Semijoin]) -> bool:
        """Whether joined rows can combine rows of several units: row-level privacy with more than one private
        table read, in the joins or in a subquery."""
        subqueries = [a for s in semijoins for a in s.aliases if not self.aliases[a].public]
        return self.schema.row_level and len(private) + len(subqueries) > 1

    def _join_stability(self, joins: list[exp.Join], equalities, semijoins: list[_Semijoin],
                        group_key: exp.Column | None = None) -> stability.Relation:
        """How many joined rows one added or removed row can change (FLEX's stability, see `stability`), with every
        join key's frequency that a bound relies on enforced: its table is read truncated to max_frequency rows per
        value of the key (a keyed hash picks them), unless a unique constraint guarantees the key. One added row
        can then push out one kept row per truncated key, so a table's own stability is 1 + its truncated keys.
        Subqueries in WHERE read their table whole (only the outer key's frequency matters there)."""
        correlations = [(outer, inner) for s in semijoins for left, right in s.equalities
                        for outer, inner in ((left, right), (right, left))
                        if outer.table in self.outer and inner.table in s.aliases]
        keys: dict[str, set[str]] = {}
        if group_key is not None:  # a grouped subquery's key: how many rows share it is bounded like a join key's
            keys[group_key.table] = {group_key.name}
        for left, right in [*equalities, *correlations]:
            for column in (left, right):
                if column.table in self.outer:
                    keys.setdefault(column.table, set()).add(column.name)
        plan = self._join_plan(joins, equalities, semijoins, keys, group_key)
        if plan.used != keys:  # an equality no bound relies on still filters rows, it needs no truncation
            plan = self._join_plan(joins, equalities, semijoins, plan.used, group_key)
        self.truncate = plan.truncate
        for name, columns in self.truncate.items():
            self.notes.append(f"{name} is read truncated to " + ", ".join(f"{f} row(s) per {c}" for c, f in columns)
                              + " (keyed hash)")
        self.notes.extend(plan.notes)
        self.stability = plan.relation.stability
        self.notes.append(f"one neighbour changes at most {self.stability} joined row(s) (row-level stability)")
        return plan.relation

    def _join_plan(self, joins: list[exp.Join], equalities, semijoins: list[_Semijoin], keys: dict[str, set[str]],
                   group_key: exp.Column | None) -> _JoinPlan:
        """The join tree's stability when the tables are truncated on `keys` (those with a declared frequency and
        no unique constraint): a left-deep tree in FROM order, each step on the equality giving the smallest
        bound. Also says which keys the chosen bounds used."""
        truncate: dict[str, dict[str, int]] = {}
        for alias, names in keys.items():
            table = self.aliases[alias]
            for name in names:
                frequency = self._declared_frequency(table, name)
                if frequency is not None and (table.name, name) not in self.unique:
                    truncate.setdefault(table.name, {})[name] = frequency
        used: dict[str, set[str]] = {group_key.table: {group_key.name}} if group_key is not None else {}
        notes: list[str] = []

        def relation(alias: str) -> stability.Relation:
            table = self.aliases[alias]
            changed = 0 if table.public else 1 + len(truncate.get(table.name, {}))
            frequencies = {n: f for n in keys.get(alias, ()) if (f := self._declared_frequency(table, n)) is not None}
            return stability.base(table.name, alias, changed, frequencies)

        sides = {j.this.alias_or_name: j.side.upper() for j in joins}
        joined, pending = [self.outer[0]], self.outer[1:]
        current = relation(joined[0])

        def keys_to_joined(alias: str) -> list[tuple[exp.Column, exp.Column]]:
            return [(mine, other) for left, right in equalities for mine, other in ((left, right), (right, left))
                    if mine.table == alias and other.table in joined]

        while pending:
            alias = next((a for a in pending if keys_to_joined(a)), None)
            if alias is None:
                raise UnsupportedQuery(f"{self.aliases[pending[0]].name} ({pending[0]}) is not joined on an equality "
                                       "of columns: a cross join multiplies every row by the whole other table",
                                       "join it on a declared key, e.g. JOIN t ON t.key = other.key")
            if sides.get(alias) and alias != pending[0]:
                raise UnsupportedQuery(f"outer join of {alias} must follow the tables its ON clause names")
            new = relation(alias)
            pairs = [(o, m) for m, o in keys_to_joined(alias)
                     if f"{o.table}.{o.name}" in current.frequencies and f"{m.table}.{m.name}" in new.frequencies]
            if not pairs:
                mine, other = keys_to_joined(alias)[0]
                missing = mine if f"{mine.table}.{mine.name}" not in new.frequencies else other
                self._frequency(self.aliases[missing.table], missing)  # raises: the key's frequency is undeclared
            options = [(stability.join(current, new, f"{o.table}.{o.name}", f"{m.table}.{m.name}",
                                       sides.get(alias, "")), o, m) for o, m in pairs]
            current, o, m = min(options, key=lambda option: option[0].stability)
            for column in (o, m):
                used.setdefault(column.table, set()).add(column.name)
            joined.append(alias)
            pending.remove(alias)
            notes.append(f"join {self.aliases[alias].name} ({alias}) on {o.sql(dialect=DIALECT)} = "
                         f"{m.sql(dialect=DIALECT)}: stability {current.stability}")
        for semijoin in semijoins:
            current, key = self._semijoin_stability(current, semijoin, notes)
            if key is not None:
                used.setdefault(key.table, set()).add(key.name)
        return _JoinPlan(current, {t: tuple(sorted(c.items())) for t, c in truncate.items()}, used, notes)

    def _semijoin_stability(self, outer: stability.Relation, semijoin: _Semijoin,
                            notes: list[str]) -> tuple[stability.Relation, exp.Column | None]:
        """A WHERE subquery over one table, correlated on an equality: each changed row of it flips the condition
        for at most the outer key's frequency of joined rows. Also returns that outer key."""
        if all(self.aliases[a].public for a in semijoin.aliases):
            notes.append("a subquery in WHERE reads only public tables: no extra sensitivity")
            return outer, None
        if len(semijoin.aliases) != 1:
            raise UnsupportedQuery("under row-level privacy a subquery in WHERE may read one table",
                                   "write joins inside the subquery as separate conditions of the outer query")
        inner_alias = semijoin.aliases[0]
        table = self.aliases[inner_alias]
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
        notes.append(f"subquery over {table.name} ({inner_alias}) on {key.sql(dialect=DIALECT)}: stability "
                     f"{best.stability}")
        return best, key

    def _determined_by_unit(self, expr: exp.Expression, determined: set[str]) -> bool:
        return all(c.table in determined for c in expr.find_all(exp.Column))

    # --- group keys ------------------------------------------------------------------------------------------

    def _group_keys(self) -> list[GroupKey]:
        group = self.tree.args.get("group")
        if group is None:
            return []
        if group.args.get("rollup") or group.args.get("cube") or group.args.get("grouping_sets"):
            raise UnsupportedQuery("ROLLUP, CUBE and GROUPING SETS are not supported")
        keys = []
        for i, node in enumerate(group.expressions):
            if any(isinstance(n, tuple(AGGREGATES)) for n in node.walk()):
                raise UnsupportedQuery("aggregates are not allowed in GROUP BY")
            value_range = self.exprs.value_range(node)
            keys.append(GroupKey(f"g{i}", self.exprs.guard(node), self._key_domain(node, value_range),
                                 node.sql(dialect=DIALECT)))
        return keys

    def _key_domain(self, node: exp.Expression, value_range: Range | None) -> tuple | None:
        if isinstance(node, exp.Column):
            column = self._declared_column(node)
            if column is not None and column.domain is not None:
                return column.domain
            if column is not None and column.type == "boolean":
                return (False, True)
        if isinstance(node, exp.Case) and all(
                isinstance(b.args["true"], exp.Literal) for b in node.args.get("ifs", [])):
            default = node.args.get("default")
            if default is None or isinstance(default, exp.Literal):
                values = [b.args["true"].to_py() for b in node.args["ifs"]]
                values.append(default.to_py() if default is not None else None)
                return tuple(dict.fromkeys(values))
        if (value_range is not None and value_range.integer and value_range.bounded
                and value_range.hi - value_range.lo < MAX_DOMAIN):
            return tuple(range(int(value_range.lo), int(value_range.hi) + 1))
        return None

    # --- aggregates and their measures ----------------------------------------------------------------------

    def _aggregates(self, measures: dict[str, Measure], histograms: dict[str, Histogram], k: int,
                    groups: int) -> list[Aggregate]:
        found: dict[str, Aggregate] = {}
        nodes = [*self.tree.expressions]
        if self.tree.args.get("having"):
            nodes.append(self.tree.args["having"])
        if self.tree.args.get("order"):
            nodes.append(self.tree.args["order"])
        for top in nodes:
            for node in top.find_all(*AGGREGATES):
                sql = node.sql(dialect=DIALECT)
                if sql in found:
                    continue
                if any(isinstance(n, tuple(AGGREGATES)) for n in node.walk() if n is not node):
                    raise UnsupportedQuery("nested aggregates are not supported")
                name = f"a{len(found)}"
                if isinstance(node, exp.WithinGroup) and isinstance(node.this, exp.Mode):
                    found[sql] = self._mode(name, node, sql, histograms, k, groups)
                elif isinstance(node, exp.Min | exp.Max | exp.WithinGroup):
                    found[sql] = self._quantile(name, node, sql, histograms, k, groups)
                else:
                    found[sql] = self._aggregate(name, node, sql, measures, k, groups)
        return list(found.values())

    def _quantile(self, name: str, node: exp.Expression, sql: str, histograms: dict[str, Histogram],
                  k: int, groups: int) -> Aggregate:
        """MIN, MAX and percentile_cont/percentile_disc: a cell of a histogram, chosen by the exponential
        mechanism with the rank score -distance(q·n, ranks the cell spans)."""
        if isinstance(node, exp.WithinGroup):
            fraction = node.this.this
            ordered = node.expression.expressions
            if not (isinstance(fraction, exp.Literal) and not fraction.is_string and 0 <= float(fraction.this) <= 1):
                raise UnsupportedQuery(f"{sql}: the percentile must be a constant between 0 and 1")
            if len(ordered) != 1:
                raise UnsupportedQuery(f"{sql}: WITHIN GROUP takes one ORDER BY expression")
            q, arg = float(fraction.this), ordered[0].this
            if ordered[0].args.get("desc"):
                q = 1 - q
        else:
            q, arg = (0.0 if isinstance(node, exp.Min) else 1.0), node.this
        value_range = self.exprs.numeric(arg, f"{AGGREGATES[type(node)].upper()} argument")
        value = self.exprs.guard(arg)
        if not isinstance(arg, exp.Column):
            value = clamp_to(value, value_range.lo, value_range.hi, self.exprs.kind(arg))
        span = value_range.hi - value_range.lo
        if value_range.integer and span < HISTOGRAM_CELLS:
            cells, width, integer = int(span) + 1, 1.0, True
            cell = exp.Sub(this=value, expression=_literal(value_range.lo))
        else:
            cells, width, integer = HISTOGRAM_CELLS, span / HISTOGRAM_CELLS if span else 1.0, False
            bucket = exp.WidthBucket(this=value, min_value=_literal(value_range.lo),
                                     max_value=_literal(value_range.lo + cells * width),
                                     num_buckets=exp.Literal.number(cells))
            cell = exp.Sub(this=exp.Least(this=bucket, expressions=[exp.Literal.number(cells)]),
                           expression=exp.Literal.number(1))
        label = f"histogram of {arg.sql(dialect=DIALECT)}"
        histogram = self._histogram(histograms, label, cell, cells, value_range.lo, width, integer, k, groups,
                                    f"{cells} cells over [{value_range.lo:g}, {value_range.hi:g}], rank-score")
        return Aggregate(name, "quantile", (histogram.name,), value_range, sql, quantile=q)

    def _mode(self, name: str, node: exp.WithinGroup, sql: str, histograms: dict[str, Histogram],
              k: int, groups: int) -> Aggregate:
        """mode() WITHIN GROUP (ORDER BY c): the value of c's declared domain with the largest count, chosen by
        the exponential mechanism with the count as score."""
        ordered = node.expression.expressions
        if len(ordered) != 1:
            raise UnsupportedQuery(f"{sql}: WITHIN GROUP takes one ORDER BY expression")
        arg = ordered[0].this
        self.exprs.check(arg)
        value_range = self.exprs.value_range(arg)
        column = self._declared_column(arg) if isinstance(arg, exp.Column) else None
        label = f"counts of {arg.sql(dialect=DIALECT)}"
        arg_type = _key_type(arg, self.exprs)
        if column is not None and (column.domain is not None or column.type == "boolean"):
            values = tuple(v for v in self._key_domain(arg, value_range) if v is not None)
            cell = exp.Case(this=self.exprs.guard(arg), ifs=[
                exp.If(this=_value_literal(v), true=exp.Literal.number(i)) for i, v in enumerate(values)])
            histogram = self._histogram(histograms, label, cell, len(values), 0.0, 1.0, True, k, groups,
                                        f"{len(values)} declared values, count-score", values)
        elif (value_range is not None and value_range.integer and value_range.bounded
              and value_range.hi - value_range.lo < HISTOGRAM_CELLS):
            value = self.exprs.guard(arg)
            if column is None:
                value = clamp_to(value, value_range.lo, value_range.hi, self.exprs.kind(arg))
            cells = int(value_range.hi - value_range.lo) + 1
            histogram = self._histogram(histograms, label, exp.Sub(this=value, expression=_literal(value_range.lo)),
                                        cells, value_range.lo, 1.0, True, k, groups,
                                        f"{cells} values in [{value_range.lo:g}, {value_range.hi:g}], count-score")
        else:
            raise PrivacyRefusal(f"{sql}: the mode is chosen among declared values, and "
                                 f"{arg.sql(dialect=DIALECT)} has no declared domain or small integer range",
                                 "declare domain = [...] for the column in the privacy schema, or use "
                                 "GROUP BY c ORDER BY COUNT(*) DESC LIMIT 1 (keys by partition selection)")
        return Aggregate(name, "mode", (histogram.name,), None, sql, arg_type=arg_type)

    def _histogram(self, histograms: dict[str, Histogram], label: str, cell: exp.Expression, cells: int,
                   lower: float, width: float, integer: bool, k: int, groups: int, note: str,
                   values: tuple | None = None) -> Histogram:
        """The histogram named `label`, created once per query: one unit moves at most k counts in each of at
        most `groups` groups, so any candidate's score over all groups moves by at most k·groups."""
        if label not in histograms:
            sensitivity = k * self._spread(groups) * (2 if self.schema.neighbouring == "replace" else 1)
            histograms[label] = Histogram(f"h{len(histograms)}", label, cell, cells, lower, width, integer,
                                          k, groups, sensitivity, values)
            self.notes.append(f"{label}: {note} sensitivity {sensitivity:g} (at most {k} row(s) per unit and group)")
        return histograms[label]

    def _aggregate(self, name: str, node: exp.Expression, sql: str, measures: dict[str, Measure],
                   k: int, groups: int) -> Aggregate:
        kind = AGGREGATES[type(node)]
        arg = node.this

        def measure(label: str, measure_kind: str, expr: exp.Expression | None, row_range: Range,
                    centre: float = 0.0) -> str:
            key = f"{measure_kind}:{label if expr is None else expr.sql(dialect=DIALECT)}:{centre!r}"
            if key not in measures:
                measures[key] = replace(self._measure(f"m{len(measures)}", label, measure_kind, expr, row_range,
                                                      k, groups), centre=centre)
            return measures[key].name

        if kind == "count":
            if isinstance(arg, exp.Distinct):
                value = arg.expressions[0] if len(arg.expressions) == 1 else None
                if isinstance(value, exp.Column) and self._is_unit(value):
                    return Aggregate(name, "count_units", (measure("distinct units", "units", None, ONE),), None, sql)
                if value is not None and self.schema.row_level and self.direct:
                    # each changed row adds or removes at most one distinct value of its group
                    self.exprs.check(value)
                    label = f"COUNT(DISTINCT {value.sql(dialect=DIALECT)})"
                    return Aggregate(name, "count", (measure(label, "distinct", self.exprs.guard(value), BIT),),
                                     None, sql)
                raise UnsupportedQuery(f"{sql}: COUNT(DISTINCT ...) is answered only for the privacy unit "
                                       f"({self.schema.describe_unit()}), or for one expression under row-level "
                                       "privacy", "count distinct units, or count rows with COUNT(*)")
            if arg is None or isinstance(arg, exp.Star):
                return Aggregate(name, "count", (measure("COUNT(*)", "count", None, ONE),), None, sql)
            self.exprs.check(arg)
            label = f"COUNT({arg.sql(dialect=DIALECT)})"
            return Aggregate(name, "count", (measure(label, "count", self.exprs.guard(arg), BIT),), None, sql)
        if isinstance(arg, exp.Distinct):
            raise UnsupportedQuery(f"{sql}: DISTINCT is supported only in COUNT(DISTINCT unit)")
        value_range = self.exprs.numeric(arg, f"{kind.upper()} argument")
        value = self.exprs.guard(arg)
        if not isinstance(arg, exp.Column):  # a bare column is already clamped to exactly this range
            value = clamp_to(value, value_range.lo, value_range.hi, self.exprs.kind(arg))
        label = arg.sql(dialect=DIALECT)
        if kind == "sum":
            return Aggregate(name, kind, (measure(f"SUM({label})", "sum", value, value_range),), value_range, sql)
        # averages and variances: a count and sums centred on the midpoint of the range
        mid = (value_range.lo + value_range.hi) / 2
        half = (value_range.hi - value_range.lo) / 2
        centred = exp.Sub(this=value.copy(), expression=_literal(mid))
        integral = value_range.integer and float(mid).is_integer()
        # in exact arithmetic the centred sum is SUM(value) - mid·COUNT(value), which shares PostgreSQL's
        # aggregate states with the other measures; a float sum would round differently, so it is summed centred
        exact = self.exprs.kind(arg) != "float"
        parts = [measure(f"COUNT({label})", "count", value, BIT),
                 measure(f"SUM({label} - {mid:g})", "sum", value if exact else centred, Range(-half, half, integral),
                         mid if exact else 0.0)]
        if kind != "avg":
            square = exp.Mul(this=exp.Paren(this=centred.copy()), expression=exp.Paren(this=centred.copy()))
            parts.append(measure(f"SUM(({label} - {mid:g})^2)", "sum", square, Range(0, half * half, integral)))
        return Aggregate(name, kind, tuple(parts), value_range, sql)

    def _measure(self, name: str, label: str, kind: str, expr: exp.Expression | None, row_range: Range,
                 k: int, groups: int) -> Measure:
        # a unit contributes 1 to "distinct units", else between 0 and k rows' worth of values
        unit_range = (1.0, 1.0) if kind == "units" else (k * min(row_range.lo, 0.0), k * max(row_range.hi, 0.0))
        per_group = max(abs(unit_range[0]), abs(unit_range[1]))
        if per_group == 0:  # no mechanism is calibrated to sensitivity 0, and the value needs no data
            raise UnsupportedQuery(f"{label} is the same on every database: given the declared bounds every row "
                                   f"contributes {row_range.lo:g}", "aggregate an expression that varies")
        # under "replace" a neighbour removes one unit's contribution and adds another's
        steps = 2 if self.schema.neighbouring == "replace" else 1
        spread = self._spread(groups)
        sensitivity = steps * spread * per_group
        l2_sensitivity = steps * math.sqrt(spread) * per_group
        self.notes.append(f"{label}: per row in [{row_range.lo:g}, {row_range.hi:g}], per unit in "
                          f"[{unit_range[0]:g}, {unit_range[1]:g}], L1 sensitivity {sensitivity:g}, "
                          f"L2 {l2_sensitivity:.6g}")
        return Measure(name, label, kind, expr, row_range, unit_range, sensitivity, l2_sensitivity, steps * groups)

    def _spread(self, groups: int) -> int:
        """Over how many groups one unit's k rows per group add up: G, or 1 under row-level joins, where k already
        counts the changed joined rows of all groups together (they touch at most k groups, `coordinates`)."""
        return groups if self.stability is None else 1

    # --- what runs after noise ----------------------------------------------------------------------------

    def _post_processing(self, keys: list[GroupKey], aggregates: list[Aggregate]):
        by_sql = {a.sql: a for a in aggregates}
        key_sql = {k.sql: k for k in keys}

        def substitute(node: exp.Expression) -> exp.Expression:
            def swap(n: exp.Expression) -> exp.Expression:
                if isinstance(n, tuple(AGGREGATES)):
                    return exp.column(by_sql[n.sql(dialect=DIALECT)].name)
                if n.sql(dialect=DIALECT) in key_sql:
                    return exp.column(key_sql[n.sql(dialect=DIALECT)].name)
                if isinstance(n, exp.Column):
                    raise PrivacyRefusal(f'column "{n.sql(dialect=DIALECT)}" must appear in GROUP BY or be used '
                                         "in an aggregate", "dpsql never releases raw values")
                return n
            return node.copy().transform(swap, copy=False)

        outputs, by_alias = [], {}
        aggregate_names = {agg.name for agg in aggregates}
        for name, item in zip(self.query.output_names, self.tree.expressions, strict=True):
            expr = substitute(item.unalias())
            noisy = any(c.name in aggregate_names for c in expr.find_all(exp.Column))
            outputs.append(Output(name, expr, _output_type(expr, aggregates, keys, self.exprs, item.unalias()), noisy))
            by_alias[item.alias_or_name] = expr
        having = substitute(self.tree.args["having"].this) if self.tree.args.get("having") else None
        order = []
        for ordered in (self.tree.args["order"].expressions if self.tree.args.get("order") else []):
            target = ordered.this
            if isinstance(target, exp.Column) and not target.table and target.name in by_alias:
                expr = by_alias[target.name]
            else:
                expr = substitute(target)
            descending = bool(ordered.args.get("desc"))
            nulls_first = ordered.args.get("nulls_first")
            order.append((expr, descending, descending if nulls_first is None else bool(nulls_first)))
        return outputs, having, order

    def _top_k(self, keys: list[GroupKey], aggregates: list[Aggregate], measures: dict[str, Measure],
               order, having, limit: int | None, offset: int) -> TopK | None:
        """`GROUP BY keys ORDER BY <count> DESC LIMIT k` (no HAVING): the top-k keys are selected rather than
        every group noised; None when the query is not of that form."""
        if not keys or limit is None or having is not None or len(order) != 1:
            return None
        expr, descending, _ = order[0]
        agg = {a.name: a for a in aggregates}.get(expr.name) if isinstance(expr, exp.Column) else None
        if agg is None or agg.kind not in COUNTS or not descending or limit + offset < 1:
            return None
        measure = next(m for m in measures.values() if m.name == agg.measures[0])
        steps = 2 if self.schema.neighbouring == "replace" else 1
        sensitivity = steps * max(abs(measure.unit_range[0]), abs(measure.unit_range[1]))
        self.notes.append(f"top {limit + offset} keys by {agg.sql}: exponential mechanism (peeling), count "
                          f"sensitivity {sensitivity:g} per key")
        return TopK(measure.name, limit + offset, sensitivity, monotone=steps == 1)

    def _limit(self) -> tuple[int | None, int]:
        def integer(clause: str) -> int | None:
            node = self.tree.args.get(clause)
            if node is None:
                return None
            value = node.expression
            if not (isinstance(value, exp.Literal) and not value.is_string and value.this.isdigit()):
                raise UnsupportedQuery(f"{clause.upper()} must be a whole-number constant")
            return int(value.this)
        return integer("limit"), integer("offset") or 0


@dataclass(frozen=True)
class _JoinPlan:
    relation: stability.Relation  # the joined relation: its stability and column frequencies
    truncate: dict[str, tuple[tuple[str, int], ...]]  # table -> (key, max rows per value) it is read cut to
    used: dict[str, set[str]]  # alias -> the keys whose frequencies the chosen bounds rely on
    notes: list[str]


@dataclass(frozen=True)
class _Semijoin:
    aliases: list[str]  # the subquery's tables
    equalities: list[tuple[exp.Column, exp.Column]]  # its column = column conditions, correlations included


def _conjuncts(condition: exp.Expression) -> list[exp.Expression]:
    return list(condition.flatten()) if isinstance(condition, exp.And) else [condition]


def _column_equalities(conditions: list[exp.Expression]) -> list[tuple[exp.Column, exp.Column]]:
    """The column = column conjuncts of `conditions` between two different tables."""
    pairs = []
    for condition in conditions:
        for conjunct in _conjuncts(condition):
            conjunct = conjunct.unnest()
            if (isinstance(conjunct, exp.EQ) and isinstance(conjunct.this, exp.Column)
                    and isinstance(conjunct.expression, exp.Column)
                    and conjunct.this.table != conjunct.expression.table):
                pairs.append((conjunct.this, conjunct.expression))
    return pairs


def _domain(keys: list[GroupKey]) -> list[tuple] | None:
    if not keys or any(k.domain is None for k in keys):
        return None
    if math.prod(len(k.domain) for k in keys) > MAX_DOMAIN:
        return None
    return list(product(*(k.domain for k in keys)))


def _output_type(expr: exp.Expression, aggregates: list[Aggregate], keys: list[GroupKey], exprs: Expressions,
                 original: exp.Expression) -> str:
    if isinstance(expr, exp.Column):
        for agg in aggregates:
            if agg.name == expr.name:
                if agg.kind == "mode":
                    return agg.arg_type
                integral = agg.kind == "quantile" and agg.arg_range.integer
                return "int8" if agg.kind in COUNTS or integral else "float8"
        for key in keys:
            if key.name == expr.name:
                return _key_type(original, exprs)
    if isinstance(expr, exp.Literal):
        return "text" if expr.is_string else ("int8" if expr.is_int else "float8")
    if isinstance(expr, exp.Cast):
        if expr.to.this in (exp.DataType.Type.INT, exp.DataType.Type.BIGINT, exp.DataType.Type.SMALLINT):
            return "int8"
        if expr.to.this in (exp.DataType.Type.TEXT, exp.DataType.Type.VARCHAR):
            return "text"
    return "float8"


def _key_type(node: exp.Expression, exprs: Expressions) -> str:
    value_range = exprs.value_range(node)
    if value_range is not None:
        return "int8" if value_range.integer else "float8"
    if isinstance(node, exp.TimestampTrunc | exp.DateTrunc):
        return "timestamptz"
    if isinstance(node, exp.Column):
        column = exprs.column(node)
        if column is not None:
            return {"boolean": "bool", "date": "date", "timestamp": "timestamp",
                    "timestamptz": "timestamptz"}.get(column.type, "text")
    return "text"


def _guarded(node: exp.Expression, exprs: Expressions) -> exp.Expression:
    copy = node.copy()
    if isinstance(copy, exp.Join) and copy.args.get("on") is not None:
        copy.set("on", exprs.guard(copy.args["on"]))
    return copy


def _value_literal(value: Any) -> exp.Expression:
    """A domain value as a SQL literal."""
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int | float):
        return _literal(value)
    return exp.Literal.string(str(value))


def _literal(value: float) -> exp.Expression:
    return exp.Literal.number(str(int(value)) if float(value).is_integer() else repr(float(value)))
