"""The bounds' effect (`SET dpsql.bounds_epsilon`): noisy counts of the units whose rows the declared bounds cut
or whose values they clamp. Its statement moves each count by at most 1 between neighbours (the sensitivity it
is priced at), it is charged once, and every door shows it."""

from __future__ import annotations

import psycopg
import pytest

import dpsql
from dpsql.cli import main
from dpsql.config import Settings
from dpsql.engine import Engine
from dpsql.explain import explain_text
from dpsql.session import Options
from tests.conftest import DEMO_SCHEMA, EXTREME_ID

QUERIES = [
    "SELECT category, COUNT(*), AVG(amount) FROM visits GROUP BY category",  # k rows over all groups
    "SELECT COUNT(*), SUM(amount) FROM visits",
    "SELECT date_trunc('month', day) AS m, COUNT(*) FROM visits GROUP BY 1",  # private keys: a group cap
    "SELECT p.sex, SUM(v.amount) FROM visits v JOIN people p ON v.person_id = p.person_id GROUP BY p.sex",
    "SELECT sex, AVG(income), MAX(age) FROM people GROUP BY sex",  # each row a unit: clamps only
    "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY amount) FROM visits",
]


def _counts(url: str, sql: str) -> list[int]:
    with psycopg.connect(url) as conn:
        return [int(v or 0) for v in conn.execute(sql).fetchone()]


@pytest.mark.parametrize("sql", QUERIES)
def test_neighbour_moves_each_count_by_at_most_one(engine, base_url, neighbour_url, sql):
    statement = engine.prepare(sql).rewritten.bounds
    assert statement is not None and len(statement.labels) >= 2
    before, after = _counts(base_url, statement.statement.sql), _counts(neighbour_url, statement.statement.sql)
    assert len(before) == len(statement.labels)
    assert all(abs(a - b) <= 1 for a, b in zip(before, after, strict=True)), (before, after)
    assert after[0] == before[0] + 1  # the extreme unit is read, and it is over every bound it meets
    assert after[1:] == [b + 1 for b in before[1:]], statement.labels


def test_a_query_no_bound_can_change_is_not_estimated_or_charged(engine, analyst):
    prepared = engine.prepare("SELECT sex, COUNT(*) FROM people GROUP BY sex")
    assert prepared.rewritten.bounds is None
    spent = engine.budget(analyst).epsilon_basic
    answer = engine.query("SELECT sex, COUNT(*) FROM people GROUP BY sex", analyst=analyst,
                          options=Options(epsilon=0.5, bounds_epsilon=0.1))
    assert answer.bounds_effect is None and engine.budget(analyst).epsilon_basic == pytest.approx(spent + 0.5)


def test_charged_once_and_shown_by_explain(engine, analyst):
    sql = "SELECT category, COUNT(*) FROM visits GROUP BY category"
    options = Options(epsilon=0.5, bounds_epsilon=0.2)
    spent = engine.budget(analyst).epsilon_basic
    first = engine.query(sql, analyst=analyst, options=options)
    assert engine.budget(analyst).epsilon_basic == pytest.approx(spent + 0.7)
    effect = first.bounds_effect
    assert effect["epsilon"] == 0.2 and not effect["cached"]
    labels = [c["label"] for c in effect["counts"]]
    assert labels[0] == "units read" and "more than 10 rows" in labels[1] and "visits.amount" not in labels[-1]
    assert all(c["low"] <= c["units"] <= c["high"] for c in effect["counts"])
    again = engine.query(sql, analyst=analyst, options=options)
    assert again.bounds_effect["cached"] and again.bounds_effect["counts"] == effect["counts"]
    assert engine.budget(analyst).epsilon_basic == pytest.approx(spent + 0.7)
    text = explain_text(engine.prepare(sql, options=options))
    assert "Bounds' effect (dpsql.bounds_epsilon): ε = 0.2 more" in text and "bounds' effect: WITH" in text
    assert "SET dpsql.bounds_epsilon" in explain_text(engine.prepare(sql))


def test_doors(capsys, base_url, engine, analyst):
    sql = "SELECT category, AVG(amount) FROM visits GROUP BY category"
    code = main(["query", sql, "--epsilon", "0.5", "--bounds-epsilon", "0.1", "--database", base_url, "--schema",
                 str(DEMO_SCHEMA), "--analyst", analyst])
    out, _ = capsys.readouterr()
    assert code == 0 and "bounds' effect (noisy counts of units, ε = 0.1 spent):" in out
    assert "with visits.amount outside [0, 1000] or NaN (clamped)" in out and "% of the units read)" in out
    with dpsql.connect(database=base_url, schema=str(DEMO_SCHEMA), analyst=analyst, epsilon=0.5) as conn:
        cursor = conn.cursor()
        cursor.execute("SET dpsql.bounds_epsilon = 0.1")
        cursor.execute(sql)
        assert cursor.bounds_effect["cached"]  # the CLI's, kept: the same query and ε
        cursor.execute("RESET dpsql.bounds_epsilon")
        cursor.execute("SELECT COUNT(*) FROM visits")
        assert cursor.bounds_effect is None


def test_extreme_unit_is_counted_in_the_neighbour(neighbour_url, demo_schema):
    engine = Engine(Settings(database=neighbour_url), demo_schema)
    try:
        statement = engine.prepare("SELECT COUNT(*), SUM(amount) FROM visits WHERE person_id = %s",
                                   (EXTREME_ID,)).rewritten.bounds
        assert _counts(neighbour_url, statement.statement.sql) == [1, 1, 1]  # read, over 10 rows, amounts clamped
    finally:
        engine.close()
