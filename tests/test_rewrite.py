"""The rewritten SQL computes exactly the statistics the analysis describes, on a real PostgreSQL: clamped values,
NULL and NaN left out as PostgreSQL's aggregates leave NULL out, and SQL types the clamps were chosen for."""

from __future__ import annotations

import math
from decimal import Decimal

import psycopg
import pytest
import sqlglot

from dpsql.analysis.expressions import Expressions
from dpsql.config import Settings
from dpsql.engine import Engine
from dpsql.schema import parse_schema
from dpsql.sql import DIALECT
from tests.conftest import copy_database

SCHEMA = {
    "privacy": {"unit": "row"},
    "tables": {"readings": {"columns": {
        "id": {"type": "bigint"},
        "x": {"type": "numeric", "lower": 1, "upper": 50},
        "y": {"type": "double precision", "lower": -1, "upper": 1},
        "n": {"type": "integer", "lower": 0.5, "upper": 10.5},  # the integers in it are 1 to 10
        "s": {"type": "smallint", "lower": 0, "upper": 5},
        "w": {"type": "numeric", "lower": 0, "upper": 10},  # stored as double precision: a schema slip
    }}},
}
NAN, INF = float("nan"), float("inf")
ROWS = [  # x, y, n, s
    (Decimal("10"), 0.5, 3, 1), (None, None, None, None), (Decimal("NaN"), NAN, 7, 2), (Decimal("99"), INF, 11, 9),
    (Decimal("-4"), -INF, 0, 0), (Decimal("2.5"), 0.25, None, 4), (Decimal("50"), -0.75, 10, None),
]


def clamped(value, lo: float, hi: float, integer: bool = False):
    """What a stored value counts as: NULL and NaN are left out, others limited to [lo, hi] (for an integer
    column, to the integers in it)."""
    if value is None or value != value:
        return None
    if integer:
        lo, hi = math.ceil(lo), math.floor(hi)
    return min(max(float(value), lo), hi)


@pytest.fixture(scope="module")
def readings(server, template) -> Engine:
    url = copy_database(server, template, "dpsql_readings")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE readings (id bigint PRIMARY KEY, x numeric(6, 2), y double precision, "
                     "n integer, s smallint, w double precision)")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO readings VALUES (%s, %s, %s, %s, %s, %s)",
                            [(i, *row, row[1]) for i, row in enumerate(ROWS)])
    eng = Engine(Settings(database=url), parse_schema(SCHEMA))
    yield eng
    eng.close()


def _measures(engine: Engine, sql: str) -> dict[str, float | None]:
    prepared = engine.prepare(sql)
    (row,) = engine.backend.execute(prepared.rewritten.sql)
    return {m.label.replace("readings.", ""): None if v is None else float(v)
            for m, v in zip(prepared.plan.measures, row, strict=False)}


def test_null_and_nan_are_left_out_and_other_values_clamped(readings):
    x = [clamped(r[0], 1, 50) for r in ROWS]
    y = [clamped(r[1], -1, 1) for r in ROWS]
    n = [clamped(r[2], 0.5, 10.5, integer=True) for r in ROWS]
    products = [a * b for a, b in zip(x, n, strict=True) if a is not None and b is not None]
    got = _measures(readings, "SELECT COUNT(x), SUM(x), AVG(x), COUNT(y), SUM(y), AVG(n), SUM(x * n), "
                              "AVG(x * n), COUNT(s) FROM readings")
    present = [v for v in x if v is not None]
    assert got["COUNT(x)"] == len(present) == 5
    assert got["SUM(x)"] == pytest.approx(sum(present))
    assert got["SUM(x - 25.5)"] == pytest.approx(sum(v - 25.5 for v in present))
    assert got["COUNT(y)"] == 5 and got["SUM(y)"] == pytest.approx(sum(v for v in y if v is not None))
    assert got["COUNT(n)"] == 5 and got["SUM(n - 5.5)"] == pytest.approx(sum(v - 5.5 for v in n if v is not None))
    assert got["SUM(x * n)"] == pytest.approx(sum(min(max(p, 1), 500) for p in products))
    assert got["COUNT(x * n)"] == len(products) == 4
    assert got["COUNT(s)"] == 5


def test_a_numeric_declaration_over_a_float_column_still_runs(readings):
    """Computed values are clamped with the functions of their declared type; a float stored where the schema
    says numeric is converted rather than failing."""
    w = [clamped(r[1], 0, 10) for r in ROWS]
    got = _measures(readings, "SELECT SUM(w * 2), AVG(w + 1) FROM readings")
    assert got["SUM(w * 2)"] == pytest.approx(sum(2 * v for v in w if v is not None))
    assert got["COUNT(w + 1)"] == sum(v is not None for v in w)


@pytest.mark.parametrize("expression", [
    "x", "y", "n", "s", "x * n", "n + s", "n / 2", "n % 3", "x % 3", "y * n", "-n", "abs(n)", "abs(x)", "1.5",
    "2", "1e3", "n * 1.5", "floor(n)", "floor(x)", "ceil(y)", "round(n)", "round(x, 1)", "sqrt(n)", "sqrt(x)",
    "ln(x + 1)", "greatest(n, 2)", "greatest(n, 2.5)", "least(x, y)", "coalesce(n, 0)", "nullif(n, 3)",
    "CASE WHEN n > 3 THEN n ELSE 0 END", "CASE WHEN n > 3 THEN x END", "CAST(y AS integer)",
    "CAST(n AS numeric)", "CAST(x AS double precision)", "width_bucket(x, 0, 50, 5)", "EXTRACT(year FROM NOW())",
])
def test_inferred_sql_kinds_match_postgresql(readings, expression):
    """The clamps call PostgreSQL's type-specific larger/smaller functions, chosen by the inferred kind; a wrong
    guess would make the query fail."""
    columns = parse_schema(SCHEMA).tables["readings"].columns
    kinds = Expressions(lambda column: columns.get(column.name))
    node = sqlglot.parse_one(f"SELECT {expression} FROM readings", dialect=DIALECT).expressions[0]
    ((actual,),) = readings.backend.execute(f"SELECT pg_typeof({expression})::text FROM readings LIMIT 1")
    family = {"smallint": "integer", "integer": "integer", "bigint": "integer", "numeric": "numeric",
              "double precision": "float", "real": "float"}[actual]
    assert kinds.kind(node) == family, (expression, actual)



def test_sqrt_of_null_stays_null(readings):
    """sqrt's guard keeps its argument non-negative without turning NULL into 0 (GREATEST(NULL, 0) is 0, so
    COUNT(sqrt(y)) counted the NULL rows)."""
    y = [clamped(r[1], -1, 1) for r in ROWS]
    got = _measures(readings, "SELECT COUNT(sqrt(y)), SUM(sqrt(y)) FROM readings")
    assert got["COUNT(SQRT(y))"] == sum(v is not None for v in y)
    assert got["SUM(SQRT(y))"] == pytest.approx(sum(math.sqrt(max(v, 0)) for v in y if v is not None))


@pytest.mark.parametrize("sql", [
    "SELECT category, COUNT(*), AVG(amount), SUM(amount) FROM visits GROUP BY category",
    "SELECT category, COUNT(DISTINCT person_id) FROM visits GROUP BY category",
    "SELECT date_trunc('month', day) AS m, COUNT(*) FROM visits WHERE amount > 10 GROUP BY 1",
    "SELECT date_trunc('month', day) AS m, COUNT(DISTINCT person_id) FROM visits GROUP BY 1",
])
def test_all_rows_corrected_equal_the_kept_rows(neighbour_url, demo_schema, sql):
    """The statistics over all rows, corrected by the rows of units over k, equal the statistics over the kept
    rows (at most k per unit by the keyed hash; distinct units alone: k distinct groups per unit), on the
    neighbour whose extreme unit has 5,000 visits over every category and undeclared ones, with NaN, NULL and
    out-of-range amounts."""
    from dpsql.rewrite import per_unit
    from dpsql.rewrite.fragments import present, unit_and_keys, within_rows_per_unit
    from dpsql.rewrite.truncation import rows_cte
    from dpsql.sql.dialect import Statement

    engine = Engine(Settings(database=neighbour_url), demo_schema)
    try:
        plan = engine.prepare(sql).plan
        assert plan.rows_total and not plan.cap_groups
        corrected = per_unit.statistics(plan, 7)
        assert "dpsql_ranked" in corrected
        keys = [k.name for k in plan.group_keys]
        valued = [m for m in plan.measures if per_unit._column(plan, m) == m.name]  # as `statistics` writes them
        items = [*unit_and_keys(plan), *(f"{per_unit.sql(m.expr)} AS {m.name}" for m in valued)]
        columns = ["dpsql_unit", *keys, *(m.name for m in valued)]
        rows = rows_cte(plan, items, present(plan.unit), 7)
        if all(m.kind == "units" for m in plan.measures):  # the groups a unit is in: deduplicated first
            rows = rows.replace("dpsql_rows AS", "dpsql_raw AS", 1) + \
                ", dpsql_rows AS (SELECT DISTINCT * FROM dpsql_raw)"
        ctes = [rows, *within_rows_per_unit(columns, plan.rows_per_unit, 7)]
        kept = per_unit._kept_rows_per_group(plan, ctes)
        by_key = {}
        for name, statement in (("corrected", corrected), ("kept", kept)):
            with engine.backend.session() as session:  # the rewrite's text, with its dialect nodes, rendered
                result = session.run(Statement.parse(statement))
            by_key[name] = {tuple(r[:len(keys)]): [float(v or 0) for v in r[len(keys):-1]] for r in result}
        assert by_key["corrected"].keys() == by_key["kept"].keys()
        for key, values in by_key["kept"].items():
            assert by_key["corrected"][key] == pytest.approx(values, rel=1e-9, abs=1e-6), key
    finally:
        engine.close()


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM visits",
    "SELECT SUM(amount) FROM visits",
    "SELECT category, COUNT(*), AVG(amount) FROM visits GROUP BY category",
    "SELECT category, COUNT(*) FROM visits GROUP BY category",
    "SELECT date_trunc('month', day) AS m, COUNT(DISTINCT person_id) FROM visits GROUP BY 1",
])
def test_units_read_in_index_order_give_the_same_statistics(neighbour_url, demo_schema, sql):
    """Where an index leads with the unit's column, the groupings by unit ask for the units in its order
    (`fragments.in_order_of_units`): the race's values, and the statistics at the declared bounds and at bounds
    a race could choose, are those of the hashed form, on the neighbour whose extreme unit has 5,000 visits."""
    from dpsql.rewrite import Statement, contributions, per_unit

    engine = Engine(Settings(database=neighbour_url), demo_schema)
    try:
        prepared = engine.prepare(sql)
        assert engine._in_unit_order(prepared.plan)
        pairs = []
        if prepared.race is not None:
            raced = engine._totals_plan(prepared.query, prepared.plan, prepared.options) or prepared.plan
            rows_caps = prepared.rows_race.taus if prepared.rows_race is not None else ()
            pairs.append([contributions(raced, 7, prepared.race.taus, prepared.race_totals, rows_caps, ordered).sql
                          for ordered in (True, False)])
        bounds = [(None, None), (4, None), *([(None, 512.0), (4, 512.0)] if prepared.race_totals else [])]
        for rows, total in bounds:
            plan, _ = engine._analysed(prepared.query, 1, rows, total)
            pairs.append([Statement.parse(per_unit.statistics(plan, 7, ordered)).sql for ordered in (True, False)])
        for ordered, hashed in pairs:
            assert "ORDER BY dpsql_unit" in ordered and "ORDER BY dpsql_unit" not in hashed
            got, expected = (sorted(engine.backend.execute(s), key=repr) for s in (ordered, hashed))
            assert len(got) == len(expected)
            for row, want in zip(got, expected, strict=True):
                assert _keys_of(row) == _keys_of(want)
                assert _numbers_of(row) == pytest.approx(_numbers_of(want), rel=1e-9), sql
    finally:
        engine.close()


def _numbers_of(row: tuple) -> list[float]:
    return [float(v) for v in row if isinstance(v, Decimal | float | int)]


def _keys_of(row: tuple) -> list:
    return [v for v in row if not isinstance(v, Decimal | float | int)]
