"""Each analysis pass alone: run the passes up to the one under test and read what it added to the scope.

`test_analysis.py` checks whole plans; these tests pin each pass's own rule, so a change to one pass fails
next to it. Without a database (the unique columns are the demo database's constraints).
"""

from __future__ import annotations

import inspect

import pytest

from dpsql.analysis import PASSES, aggregates, derived, groups, outputs, relations, top_k, units
from dpsql.analysis.scope import Scope
from dpsql.sql import check_query
from dpsql.sql.dialect import postgres

UNIQUE = frozenset({("people", "person_id"), ("states", "code"), ("visits", "visit_id")})


def scope_after(step, sql: str, schema) -> Scope:
    """The scope once `step` and every pass before it have run."""
    scope = Scope(check_query(sql, schema), schema, UNIQUE, schema.max_groups_per_unit)
    for current in PASSES:
        current(scope)
        if current is step:
            return scope
    raise AssertionError(f"{step} is not a pass")


def test_every_pass_states_its_rule():
    for step in PASSES:
        module = inspect.getmodule(step)
        assert module.__doc__ and module.__doc__.startswith("Pass:"), module.__name__
        assert step.__doc__, f"{module.__name__}.{step.__name__} has no docstring"


def test_relations_registers_tables_and_join_conditions(demo_schema):
    scope = scope_after(relations.read, "SELECT COUNT(*) FROM visits v JOIN people p ON v.person_id = p.person_id "
                        "WHERE EXISTS (SELECT 1 FROM prescriptions r WHERE r.visit_id = v.visit_id)", demo_schema)
    assert scope.outer == ["v", "p"] and scope.private == ["v", "p"]
    assert [(a.sql(), b.sql()) for a, b in scope.equalities] == [("v.person_id", "p.person_id")]
    assert [s.aliases for s in scope.semijoins] == [["r"]]


def test_units_multiply_declared_rows_and_join_parents(demo_schema):
    scope = scope_after(units.bound_rows, "SELECT COUNT(*) FROM visits", demo_schema)
    assert scope.rows_per_unit == 10 and scope.unit.sql() == "visits.person_id" and not scope.direct
    scope = scope_after(units.bound_rows, "SELECT COUNT(*) FROM prescriptions", demo_schema)
    assert scope.rows_per_unit == 20 and scope.unit.sql() == "dpsql_parent_1.person_id"
    assert [j.this.name for j in scope.joins] == ["visits"]  # dpsql joins the parent to reach the unit
    scope = scope_after(units.bound_rows, "SELECT COUNT(*) FROM people", demo_schema)
    assert scope.rows_per_unit == 1 and scope.unit is None and scope.direct  # the primary key: one row per unit


def test_public_joins_keep_k_on_unique_keys(demo_schema):
    scope = scope_after(units.bound_rows, "SELECT COUNT(*) FROM people p JOIN states s ON s.code = p.state",
                        demo_schema)
    assert scope.rows_per_unit == 1 and "s" in scope.determined


def test_groups_per_unit(demo_schema):
    scope = scope_after(groups.bound_groups, "SELECT category, COUNT(*) FROM visits GROUP BY category", demo_schema)
    # 10 visits over all categories: a person reaches all 8 declared ones, uncapped
    assert (scope.max_groups, scope.cap_groups, scope.rows_total) == (8, False, True) and len(scope.domain) == 8
    scope = scope_after(groups.bound_groups, "SELECT p.state, COUNT(*) FROM visits v JOIN people p "
                        "ON v.person_id = p.person_id GROUP BY p.state", demo_schema)
    assert (scope.max_groups, scope.cap_groups, scope.domain) == (1, False, None)  # one state per person


def test_aggregates_scale_row_ranges_by_k(demo_schema):
    scope = scope_after(aggregates.measure, "SELECT category, SUM(amount) FROM visits GROUP BY category", demo_schema)
    (measure,) = scope.measures.values()  # k rows over all groups together: k·c, whatever the groups
    assert measure.unit_range == (0.0, 10 * 1000.0) and measure.sensitivity == 10 * 1000


def test_quantiles_share_one_histogram_per_argument(demo_schema):
    scope = scope_after(aggregates.measure, "SELECT MIN(age), MAX(age), percentile_cont(0.5) WITHIN GROUP "
                        "(ORDER BY age) FROM people", demo_schema)
    (histogram,) = scope.histograms.values()
    assert histogram.cells == 101 and histogram.sensitivity == 1
    assert [a.quantile for a in scope.aggregates] == [0.0, 1.0, 0.5]


def test_outputs_read_released_names_only(demo_schema):
    scope = scope_after(outputs.post_process, "SELECT sex, COUNT(*) AS n FROM people GROUP BY sex "
                        "HAVING COUNT(*) > 5 ORDER BY n DESC LIMIT 1 OFFSET 1", demo_schema)
    assert [o.expr.sql() for o in scope.outputs] == ["g0", "a0"]
    assert scope.having.sql() == "a0 > 5" and (scope.limit, scope.offset) == (1, 1)


def test_top_k_needs_a_count_ordered_descending(demo_schema):
    sql = "SELECT state, COUNT(*) FROM people GROUP BY state ORDER BY COUNT(*) {} LIMIT 3"
    assert scope_after(top_k.select, sql.format("DESC"), demo_schema).top_k.k == 3
    assert scope_after(top_k.select, sql.format("ASC"), demo_schema).top_k is None


def test_derived_tables_are_bounded_per_unit(demo_schema):
    scope = scope_after(derived.bound_subquery, "SELECT COUNT(*) FROM (SELECT person_id, COUNT(*) AS n FROM visits "
                        "GROUP BY person_id) t WHERE n > 2", demo_schema)
    table = scope.aliases["t"]
    assert table.unit_column == "person_id" and (table.columns["n"].lower, table.columns["n"].upper) == (1, 10)
    assert "INT8SMALLER(INT8LARGER(COUNT(*), 1), 10) AS n" in postgres(scope.from_)  # a group's rows: [1, k]


@pytest.mark.parametrize("sql", ["SELECT 1", "SELECT COUNT(*) FROM states"])
def test_passes_refuse_what_reads_no_private_data(sql, demo_schema):
    from dpsql.errors import PrivacyRefusal
    with pytest.raises(PrivacyRefusal):
        scope_after(relations.read, sql, demo_schema)


def test_every_aggregate_kind_finished_from_sums_has_one_home():
    """The SQL allowlist names each aggregate's node; every kind that is not a count or chosen from a histogram
    is one entry of `kinds.KINDS` (its measures and its finish), and nothing else names it."""
    from dpsql.analysis.kinds import KINDS
    from dpsql.sql import AGGREGATES

    families = {"count", "min", "max", "percentile"}  # aggregates.py and quantiles.py
    assert set(AGGREGATES.values()) - families == set(KINDS)
    assert all(kind.arguments in (1, 2) for kind in KINDS.values())
