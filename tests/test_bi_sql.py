"""SQL that analysts and BI tools write (issue 17): each construct answered with a sound bound, or refused with a
message that names what the user wrote. Neighbour tests of the answered ones are in tests/test_neighbours.py."""

from __future__ import annotations

import datetime

import pytest

from dpsql import errors
from dpsql.sql import check_query
from dpsql.sql.bind import fix_the_time
from dpsql.sql.parse import parse_select
from tests.test_analysis import plan


def test_filter_is_the_aggregate_of_a_case(demo_schema):
    filtered = check_query("SELECT COUNT(*) FILTER (WHERE amount > 100), SUM(amount) FILTER (WHERE category = 'lab'), "
                           "percentile_cont(0.5) WITHIN GROUP (ORDER BY amount) FILTER (WHERE amount > 1) "
                           "FROM visits", demo_schema)
    spelled = check_query("SELECT COUNT(CASE WHEN amount > 100 THEN 1 END), SUM(CASE WHEN category = 'lab' THEN "
                          "amount END), percentile_cont(0.5) WITHIN GROUP (ORDER BY CASE WHEN amount > 1 THEN amount "
                          "END) FROM visits", demo_schema)
    assert filtered.canonical == spelled.canonical


def test_a_filtered_count_is_answered(engine, analyst):
    answer = engine.query("SELECT category, COUNT(*) FILTER (WHERE amount > 100) AS big, COUNT(*) FROM visits "
                          "GROUP BY category", analyst=analyst, epsilon=1.0)
    assert answer.names == ["category", "big", "count"] and len(answer.rows) == 8


@pytest.mark.parametrize(("sql", "named"), [
    ("SELECT to_char(day, 'YYYY-MM'), COUNT(*) FROM visits GROUP BY 1", "function to_char()"),
    ("SELECT bool_or(age > 30) FROM people", "function bool_or()"),
    ("SELECT string_agg(state, ',') FROM people", "function string_agg()"),
])
def test_refusals_name_the_function_the_user_wrote(demo_schema, sql, named):
    with pytest.raises(errors.UnsupportedQuery, match=named.replace("(", r"\(").replace(")", r"\)")):
        check_query(sql, demo_schema)


def test_a_limit_that_cannot_cut_is_a_row_limit_not_a_top_k(demo_schema, engine, analyst):
    superset = ("SELECT category AS category, COUNT(*) AS count FROM public.visits GROUP BY category "
                "ORDER BY count DESC LIMIT 10000")
    assert plan(superset, demo_schema).top_k is None
    assert plan("SELECT state, COUNT(*) FROM people GROUP BY state ORDER BY 2 DESC LIMIT 50", demo_schema).top_k is None
    assert plan("SELECT category, COUNT(*) FROM visits GROUP BY 1 ORDER BY 2 DESC LIMIT 3", demo_schema).top_k.k == 3
    answer = engine.query(superset, analyst=analyst, epsilon=1.0)
    counts = [row[1] for row in answer.rows]
    assert len(counts) == 8 and counts == sorted(counts, reverse=True)


def test_join_conditions_in_brackets_are_read_as_their_conjuncts(demo_schema):
    p = plan("SELECT COUNT(*) FROM visits v JOIN people p ON ((v.person_id = p.person_id) AND (p.age > 30))",
             demo_schema)
    assert [m.sensitivity for m in p.measures] == [10]


NOW = datetime.datetime(2026, 11, 23, 7, 30, tzinfo=datetime.UTC)


@pytest.mark.parametrize(("clause", "literal"), [
    ("now() - interval '30 days'", "CAST('2026-10-24 07:30:00+00:00' AS TIMESTAMPTZ)"),
    ("current_timestamp - interval '2 hours'", "CAST('2026-11-23 05:30:00+00:00' AS TIMESTAMPTZ)"),
    ("current_date - 7", "CAST('2026-11-16' AS DATE)"),
    ("current_date - interval '1 day'", "CAST('2026-11-22 00:00:00' AS TIMESTAMP)"),
    ("CAST(now() AS date)", "CAST('2026-11-23' AS DATE)"),
])
def test_the_clock_is_fixed_when_the_query_arrives(clause, literal):
    tree = fix_the_time(parse_select(f"SELECT COUNT(*) FROM visits WHERE day >= {clause}"), NOW)
    assert tree.args["where"].this.expression.sql(dialect="postgres") == literal


def test_a_query_over_the_clock_is_answered_and_never_reuses_an_old_time(demo_schema, engine):
    sql = "SELECT COUNT(*) FROM visits WHERE day >= now() - interval '30 days'"
    first, second = engine.prepare(sql), engine.prepare(sql)
    assert first.plan.measures and first.query.timed and first.query is not second.query
    assert check_query("SELECT COUNT(*) FROM visits WHERE day < current_date", demo_schema).timed


def test_a_cast_of_a_released_value_is_post_processing(demo_schema):
    from dpsql.postprocess import evaluate

    p = plan("SELECT AVG(income)::numeric(10,2) AS a FROM people", demo_schema)
    name = p.aggregates[0].name
    assert [evaluate(p.outputs[0].expr, {name: v}) for v in (12345.675, -2.345, 0.004)] == [12345.68, -2.35, 0.0]
    with pytest.raises(errors.UnsupportedQuery, match="could overflow"):  # inside an aggregate it is not
        plan("SELECT SUM(CAST(income AS numeric(3, 1))) FROM people", demo_schema)
