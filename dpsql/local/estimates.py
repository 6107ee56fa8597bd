"""Estimates over locally randomized columns (declared `local = { mechanism = ..., epsilon = ... }`).

Such a column holds reports that each person's device randomized before sending them; the randomization is
known, so counts of reports can be turned into unbiased estimates of the counts of true values, with their exact
variance (`dpsql.mechanisms.local`). Two paths lead here:

- **Local only** (`plan_local`, `answer_local`): a query over one public table, reading one local column and
  otherwise public ones. Who is in a public table is public, and each report is already ε-LDP, so the answer is
  post-processing: no noise, no charge on the ledger. Allowed: GROUP BY the local column with COUNT(*), or
  AVG/SUM(col::int) of a randomized-response boolean, each per group of public keys; WHERE, HAVING, ORDER BY and
  LIMIT over public columns and the estimates.
- **Central** (`debias`): a query over private tables that groups by a local column. Its counts of reports get
  central noise as any count does; each group's noisy counts are then de-biased the same way, and the interval
  covers both the randomization and the central noise. Any other use of a local column (a filter on it, an
  aggregate of it) would count reports instead of people's values, so the analysis refuses it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from dpsql.analysis.plan import Output
from dpsql.errors import PrivacyRefusal, UnsupportedQuery
from dpsql.local import randomizer
from dpsql.mechanisms.histograms import onto_simplex
from dpsql.mechanisms.local import CategoricalRandomizer, Estimate, UnaryEncoding
from dpsql.noise import Calibration, NoisyGroup
from dpsql.postprocess import Accuracy, Result, evaluate, sort_rows
from dpsql.schema import Column, PrivacySchema, Table
from dpsql.schema.model import LocalRandomizer
from dpsql.sql import CheckedQuery, to_sql
from dpsql.sql.dialect import Statement
from dpsql.sql.query import indicator_of

Z95 = 1.959963984540054
LOCAL_INTERVALS = ("the intervals cover the randomization of the reports (each device randomized its own value; a "
                   "location is counted as if at its cell's centre)")
DEBIASED_INTERVALS = ("the intervals cover the noise and the randomization of the reports; rows or groups a unit has "
                      "beyond its bounds move the answer outside")
HINT = ("write SELECT col, COUNT(*) FROM t GROUP BY col (per value of a locally randomized column), or "
        "SELECT AVG(col::int) FROM t for a randomized-response boolean")


@dataclass(frozen=True)
class LocalItem:
    name: str
    kind: str  # key (the local column) | key:<name> (a public key) | count | sum | avg (over the reports) |
    # avg_rows (over every row: a report of NULL adds 0)
    type_name: str
    value: bool = True  # sum, avg, avg_rows: the randomized-response value counted

    @property
    def estimated(self) -> bool:
        """Whether the value is an estimate (with an interval); a count without the local key is exact."""
        return self.kind in ("sum", "avg", "avg_rows") or (self.kind == "count" and self.type_name == "float8")


@dataclass
class LocalQuery:
    """A query answered from locally randomized reports alone."""

    table: str
    column: Column  # the local column
    statement: Statement  # report counts per group: public keys, then the local key (categorical), then the counts
    keys: list[str]  # the public group keys' names (internal)
    local_key: bool  # whether the query groups by the local column
    items: list[LocalItem]
    having: exp.Expression | None
    order: list[tuple[exp.Expression, bool, bool]]
    limit: int | None
    offset: int
    notes: list[str] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return [item.name for item in self.items]

    @property
    def outputs(self) -> list[Output]:
        return [Output(item.name, exp.column(item.name), item.type_name, item.estimated) for item in self.items]


def plan_local(query: CheckedQuery, schema: PrivacySchema) -> LocalQuery | None:
    """The local-only plan of a query over public tables that reads a local column, or None for any other
    query (which the central analysis takes)."""
    tree = query.tree
    if not tree.args.get("from_"):  # values computed from scalar subqueries alone
        return None
    tables = [tree.args["from_"].this, *(j.this for j in tree.args.get("joins") or [])]
    read = [*tables, *tree.find_all(exp.Table, exp.Subquery)]  # subqueries too: a private one needs noise
    if not all(isinstance(t, exp.Table) and t.name in schema.tables and schema.tables[t.name].public
               for t in read):
        return None
    local = _local_columns(tree, schema, {t.alias_or_name: t.name for t in tables})
    if not local:
        return None
    if len(tables) > 1:
        raise UnsupportedQuery("a table of locally randomized reports is answered alone here, without joins",
                               "query the table on its own, grouping by its public columns")
    if len({c.name for _, c in local}) > 1:
        raise UnsupportedQuery("a query may read one locally randomized column (their joint distribution is not "
                               "estimated)", HINT)
    table = schema.tables[tables[0].name]
    column = local[0][1]
    where = tree.args.get("where")
    if where is not None and _reads(where.this, column, table.name, tables[0].alias_or_name):
        raise PrivacyRefusal(f"a filter on {column.name} selects reports, not people's true values: the estimate "
                             "would be biased", f"group by {column.name} instead, and filter on public columns")
    return _build(query, table, column, tables[0].alias_or_name)


def _local_columns(tree: exp.Expression, schema: PrivacySchema, aliases: dict[str, str]) -> list[tuple[exp.Column,
                                                                                                         Column]]:
    found = []
    for node in tree.find_all(exp.Column):
        table = schema.tables.get(aliases.get(node.table, ""))
        column = table.columns.get(node.name) if table is not None else None
        if column is not None and column.local is not None:
            found.append((node, column))
    return found


def _reads(node: exp.Expression, column: Column, table: str, alias: str) -> bool:
    return any(c.name == column.name and c.table in (table, alias) for c in node.find_all(exp.Column))


def _build(query: CheckedQuery, table: Table, column: Column, alias: str) -> LocalQuery:
    tree = query.tree
    spec = column.local
    group = list(tree.args["group"].expressions) if tree.args.get("group") else []
    if not all(isinstance(g, exp.Column) for g in group):
        raise UnsupportedQuery("GROUP BY over locally randomized reports takes plain columns", HINT)
    local_key = any(g.name == column.name for g in group)
    public_keys = [g for g in group if g.name != column.name]
    key_names = {g.name: f"k{i}" for i, g in enumerate(public_keys)}
    items, aggregates = [], {}
    for node, name in zip(tree.expressions, query.output_names, strict=True):
        inner = node.this if isinstance(node, exp.Alias) else node
        items.append(_item(inner, name, column, local_key, key_names, aggregates, table.columns))
    if spec.mechanism == "oue" and not local_key:
        raise UnsupportedQuery(f"{column.name} holds unary-encoded reports: count them per value", HINT)
    if spec.mechanism in ("geo", "geo-lp") and not local_key:
        raise UnsupportedQuery(f"{column.name} holds location cells: count them per cell", HINT)
    having = tree.args.get("having")
    having = _over_items(having.this, items, tree, aggregates) if having is not None else None
    order = [(_over_items(o.this, items, tree, aggregates), bool(o.args.get("desc")), bool(o.args.get("nulls_first")))
             for o in (tree.args["order"].expressions if tree.args.get("order") else [])]
    limit = int(tree.args["limit"].expression.to_py()) if tree.args.get("limit") else None
    offset = int(tree.args["offset"].expression.to_py()) if tree.args.get("offset") else 0
    return LocalQuery(table.name, column, _counts_statement(tree, column, alias, public_keys, local_key),
                      list(key_names.values()), local_key, items, having, order, limit, offset,
                      _notes(column, local_key))


def _item(node: exp.Expression, name: str, column: Column, local_key: bool, keys: dict[str, str],
          aggregates: dict[str, str], columns: dict[str, Column]) -> LocalItem:
    """What one select item is: a group key, or an estimate dpsql knows how to make."""
    if isinstance(node, exp.Column):
        if node.name == column.name and local_key:
            return LocalItem(name, "key", _key_type(column))
        if node.name in keys:
            return LocalItem(name, "key:" + keys[node.name], columns[node.name].wire_type)
    if isinstance(node, exp.Count) and isinstance(node.this, exp.Star) and not node.args.get("distinct"):
        aggregates[to_sql(node)] = name
        return LocalItem(name, "count", "float8" if local_key else "int8")
    if isinstance(node, exp.Avg | exp.Sum | exp.Count) and not local_key and column.local.mechanism == "rr":
        indicator = indicator_of(node.this, column.name, node)
        if indicator is not None and not node.args.get("distinct"):
            value, over_rows = indicator
            kind = "sum" if not isinstance(node, exp.Avg) else "avg_rows" if over_rows else "avg"
            aggregates[to_sql(node)] = name
            return LocalItem(name, kind, "float8", value)
    raise UnsupportedQuery(f"{to_sql(node)} cannot be estimated from the locally randomized reports of "
                           f"{column.name}", HINT)


def _key_type(column: Column) -> str:
    if column.local.mechanism == "oue":  # the values the bits stand for
        return "text" if isinstance(column.local.labels[0], str) else "int8"
    return column.wire_type


def _over_items(node: exp.Expression, items: list[LocalItem], tree: exp.Select,
                aggregates: dict[str, str]) -> exp.Expression:
    """HAVING or ORDER BY as an expression over the select items' names (aggregates it names must be selected)."""
    names = {item.name for item in items}
    outputs = {to_sql(e.this if isinstance(e, exp.Alias) else e): item.name
               for e, item in zip(tree.expressions, items, strict=True)}
    # the names qualifying gave the outputs (ORDER BY 2 reads `_col_1`, COUNT(*)'s), as the items' names
    aliases = {e.alias: item.name for e, item in zip(tree.expressions, items, strict=True) if isinstance(e, exp.Alias)}

    def replace(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Column) and not n.table and n.name in aliases:
            return exp.column(aliases[n.name])
        text = to_sql(n)
        if isinstance(n, exp.AggFunc) or text in outputs:
            name = aggregates.get(text) or outputs.get(text)
            if name is None:
                raise UnsupportedQuery(f"{text} in HAVING or ORDER BY must also be in the SELECT list", HINT)
            return exp.column(name)
        if isinstance(n, exp.Column) and (n.table or n.name not in names):
            raise UnsupportedQuery(f"{text} in HAVING or ORDER BY must also be in the SELECT list", HINT)
        return n

    return node.copy().transform(replace)


def _counts_statement(tree: exp.Select, column: Column, alias: str, public_keys: list[exp.Column],
                      local_key: bool) -> Statement:
    """Report counts per group: the public keys, the local column's report (categorical), then COUNT(*) and, for
    unary encoding, one bit count per value, or for an average of a boolean, the reports of true."""
    ref = exp.column(column.name, table=alias)
    keys = [k.copy() for k in public_keys]
    select = [*keys]
    spec = column.local
    if local_key and spec.mechanism != "oue":
        keys.append(ref.copy())
        select.append(ref.copy())
    select.append(exp.Count(this=exp.Star()))
    if spec.mechanism == "oue" or not local_key:  # the reports (rows whose report is not NULL)
        select.append(exp.Count(this=ref.copy()))
    if spec.mechanism == "oue":
        bits = [exp.Bracket(this=ref.copy(), expressions=[exp.Literal.number(i + 1)], offset=1)  # 1-based
                for i in range(len(spec.labels))]
        select += [exp.Sum(this=exp.Cast(this=bit, to=exp.DataType.build("int"))) for bit in bits]
    elif not local_key:  # a randomized-response boolean's true reports
        select.append(exp.Sum(this=exp.Cast(this=ref.copy(), to=exp.DataType.build("int"))))
    query = exp.select(*select).from_(tree.args["from_"].this.copy())
    if tree.args.get("where") is not None:
        query = query.where(tree.args["where"].this.copy())
    if keys:
        query = query.group_by(*keys)
    return Statement(query)


def _notes(column: Column, local_key: bool) -> list[str]:
    spec = column.local
    return [f"{column.name} holds reports randomized on each person's device ({describe_randomizer(spec)}); the "
            "table is public, so this answer is post-processing of already private reports: no noise is added and "
            "no budget is charged",
            "the estimates undo the known randomization (unbiased, so a count may come out negative; SET "
            "dpsql.local_estimate = 'simplex' for maximum-likelihood counts on the simplex); the 95% intervals "
            "come from their exact variance"]


def describe_randomizer(spec: LocalRandomizer) -> str:
    what = {"rr": "randomized response", "krr": "k-ary randomized response", "oue": "optimized unary encoding",
            "geo": "planar Laplace on a grid", "geo-lp": "an optimal obfuscation matrix on a grid"}[spec.mechanism]
    unit = " per unit of distance" if spec.grid is not None else ""
    return f"{what}, ε = {spec.epsilon:g}{unit} per report"


def answer_local(plan: LocalQuery, rows: list[tuple], simplex: bool) -> Result:
    """The estimates from the report counts `rows` (in the order `plan.statement` gives them)."""
    spec = plan.column.local
    mechanism = randomizer(spec)
    n_keys = len(plan.keys)
    groups: dict[tuple, list[tuple]] = {}
    for row in rows:
        groups.setdefault(tuple(row[:n_keys]), []).append(row[n_keys:])
    released: list[tuple[dict[str, Any], dict[str, tuple[float, float]]]] = []
    for keys, counts in groups.items():
        shared = dict(zip(plan.keys, keys, strict=True))
        released += _estimate_group(plan, mechanism, shared, counts, simplex)
    kept = [(env, ci) for env, ci in released if plan.having is None or bool(evaluate(plan.having, env))]
    ordered = [(env, ci, [evaluate(expr, env) for expr, _, _ in plan.order]) for env, ci in kept]
    sort_rows(ordered, lambda row, i: row[2][i], [(d, n) for _, d, n in plan.order])
    end = None if plan.limit is None else plan.offset + plan.limit
    ordered = ordered[plan.offset:end]
    values, accuracy = [], []
    for env, ci, _ in ordered:
        values.append(tuple(env[item.name] for item in plan.items))
        accuracy.append(tuple(Accuracy(None, *ci[item.name]) if item.name in ci else None for item in plan.items))
    return Result(plan.names, [i.type_name for i in plan.items], values, accuracy)


def _estimate_group(plan: LocalQuery, mechanism: Any, shared: dict[str, Any], counts: list[tuple],
                    simplex: bool) -> list[tuple[dict[str, Any], dict[str, tuple[float, float]]]]:
    """One group of public keys: a row per true value (grouped by the local column), or one row."""
    env = {item.name: shared[item.kind[4:]] for item in plan.items if item.kind.startswith("key:")}
    if isinstance(mechanism, UnaryEncoding):
        (_rows, reports, *ones), = counts
        ones = [float(v or 0) for v in ones]
        estimate = mechanism.estimate(ones, float(reports))
        if simplex:
            estimate = Estimate(onto_simplex(estimate.counts, float(reports)), estimate.variances)
        return _per_value(plan, env, mechanism.domain, estimate)
    if plan.local_key:
        by_report = {row[0]: row[1] for row in counts}
        reported = [float(by_report.get(value, 0)) for value in mechanism.outputs]
        return _per_value(plan, env, mechanism.inputs, mechanism.estimate(reported, simplex))
    (rows, reports, true_reports), = counts
    reports, true_reports = float(reports), float(true_reports or 0)
    estimate = mechanism.estimate([reports - true_reports, true_reports], simplex)
    ci: dict[str, tuple[float, float]] = {}
    for item in plan.items:
        count, variance = float(estimate.counts[int(item.value)]), float(estimate.variances[int(item.value)])
        if item.kind == "count":
            env[item.name] = int(rows)
        elif item.kind == "sum":
            env[item.name], ci[item.name] = count, _interval(count, variance)
        elif item.kind in ("avg", "avg_rows"):
            over = reports if item.kind == "avg" else float(rows)
            mean = count / over if over else None
            env[item.name] = mean
            ci[item.name] = _interval(mean, variance / over**2) if over else (None, None)
    return [(env, ci)]


def _per_value(plan: LocalQuery, shared: dict[str, Any], values: tuple, estimate: Estimate) -> list:
    released = []
    for value, count, variance in zip(values, estimate.counts.tolist(), estimate.variances.tolist(), strict=True):
        env, ci = dict(shared), {}
        for item in plan.items:
            if item.kind == "key":
                env[item.name] = value
            elif item.kind == "count":
                env[item.name], ci[item.name] = count, _interval(count, variance)
        released.append((env, ci))
    return released


def _interval(value: float, variance: float) -> tuple[float, float]:
    spread = Z95 * math.sqrt(max(variance, 0.0))
    return value - spread, value + spread


# --- the central path: noisy counts of reports, de-biased ------------------------------------------------------


def debias(local_key: tuple[int, LocalRandomizer] | None, count_measures: list[str], calibration: Calibration,
           groups: list[NoisyGroup], simplex: bool) -> list[NoisyGroup]:
    """Each group's noisy counts of reports per value of the local key (key number `local_key[0]`) as estimates
    of the counts of true values, with intervals widened to cover the randomization as well as the noise."""
    if local_key is None:
        return groups
    position, spec = local_key
    mechanism: CategoricalRandomizer = randomizer(spec)
    by_rest: dict[tuple, dict[Any, NoisyGroup]] = {}
    for group in groups:
        rest = group.keys[:position] + group.keys[position + 1:]
        by_rest.setdefault(rest, {})[group.keys[position]] = group
    out = []
    for members in by_rest.values():
        if set(members) != set(mechanism.outputs):
            raise PrivacyRefusal("a group is missing some values of the locally randomized key, so its counts "
                                 "cannot be de-biased", "declare a domain for the other group keys")
        updated = {value: (dict(g.measures), dict(g.interval_factor)) for value, g in members.items()}
        for name in count_measures:
            noise = calibration.mechanisms[name]
            reported = [members[value].measures[name] for value in mechanism.outputs]
            estimate = mechanism.estimate(reported, simplex, noise_variance=noise.variance)
            for value, count, variance in zip(mechanism.inputs, estimate.counts, estimate.variances, strict=True):
                measures, factors = updated[value]
                measures[name] = float(count)
                factors[name] = Z95 * math.sqrt(max(variance, 0.0)) / noise.ci_halfwidth()
        out += [NoisyGroup(g.keys, updated[v][0], g.choices, g.key_gap, updated[v][1]) for v, g in members.items()]
    return out


__all__ = ["LocalQuery", "answer_local", "debias", "describe_randomizer", "plan_local"]
