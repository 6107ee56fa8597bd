"""Every refusal says what to write instead: no refusal of dpsql's code is raised without a hint, and no hint
sends the analyst to the README."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dpsql import errors
from tests.conftest import ROOT

REFUSALS = {"UnsupportedQuery", "PrivacyRefusal", "UnknownColumn"}  # syntax errors carry PostgreSQL's text alone


def _refusals_without_hint() -> list[str]:
    missing = []
    for path in sorted((ROOT / "dpsql").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)):
                continue
            function = node.exc.func
            name = function.id if isinstance(function, ast.Name) else getattr(function, "attr", "")
            if name in REFUSALS and len(node.exc.args) < 2 and not any(k.arg == "hint" for k in node.exc.keywords):
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return missing


def test_every_refusal_in_the_code_carries_a_hint():
    assert _refusals_without_hint() == []
    assert "see the README" not in "".join(p.read_text() for p in Path(ROOT / "dpsql").rglob("*.py"))


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM visits TABLESAMPLE SYSTEM (10)",
    "SELECT COUNT(*) FROM visits WHERE category = ANY('{{lab},{dental}}')",  # an array of arrays
    "SELECT SUM(COUNT(*)) FROM visits",
    "SELECT COUNT(*) FROM visits WHERE category LIKE category",
    "SELECT round(AVG(amount), age) FROM visits JOIN people USING (person_id) GROUP BY age",
    "SELECT COUNT(*) FROM visits WHERE to_timestamp(amount) + INTERVAL '1 month' > DATE '2024-03-31'",
    "SELECT xmlagg(category) FROM visits",
])
def test_a_refusal_names_the_construct_and_shows_what_to_write(engine, analyst, sql):
    with pytest.raises(errors.Error) as refused:
        engine.query(sql, analyst=analyst)
    hint = refused.value.hint or ""
    assert hint and "README" not in hint and any(word in hint for word in ("SELECT", "(", "=", "'")), hint
    assert engine.budget(analyst).epsilon_spent == 0


@pytest.mark.parametrize("sql,construct,instead", [
    ("SELECT c, COUNT(*) FROM (SELECT DISTINCT ON (category) person_id, category AS c FROM visits ORDER BY "
     "category, day) t GROUP BY 1", "DISTINCT ON", "DISTINCT ON (<unit column>) <unit column>, category AS c"),
    ("SELECT region, COUNT(*) FILTER (WHERE 'fever' = ANY(symptom)) FROM survey GROUP BY 1", "ANY",
     "SELECT symptom, COUNT(*)"),
    ("SELECT category, COUNT(*) FROM (SELECT person_id, category, ROW_NUMBER() OVER (PARTITION BY category "
     "ORDER BY day) AS rn FROM visits) t WHERE rn = 1 GROUP BY 1", "ROW_NUMBER() OVER (PARTITION BY category",
     "ROW_NUMBER() OVER (PARTITION BY person_id ORDER BY day)"),
    ("SELECT date_trunc('week', day AT TIME ZONE p.state) AS t, COUNT(*) FROM visits v JOIN people p "
     "ON v.person_id = p.person_id GROUP BY 1", "AT TIME ZONE p.state", "day AT TIME ZONE 'America/New_York'"),
    ("SELECT COUNT(*) FROM (SELECT person_id, category FROM visits INTERSECT SELECT person_id, category FROM "
     "visits WHERE amount > 100) t", "INTERSECT", "SELECT COUNT(*) FROM (SELECT <unit column> FROM t WHERE a "
     "INTERSECT"),
    ("SELECT date_part('hour', day) AS h, COUNT(*) FROM visits GROUP BY 1", "visits.day, a date, which has no hour",
     "EXTRACT(DOW FROM visits.day)"),
    ("SELECT COUNT(*) FROM visits TABLESAMPLE SYSTEM (10)", "TABLESAMPLE SYSTEM (10)", "TABLESAMPLE BERNOULLI (10)"),
    ("SELECT AVG(a) FROM (SELECT person_id, (array_agg(amount ORDER BY day))[2] AS a FROM visits GROUP BY "
     "person_id) t", "(ARRAY_AGG(amount ORDER BY day))[2]", "(array_agg(category ORDER BY day))[1] AS first_cat"),
    # windows dpsql computes apart (a per-unit subquery, a windowed source's column) are named as written
    ("SELECT category, AVG(share) FROM (SELECT category, amount / NULLIF(SUM(amount) OVER (PARTITION BY person_id), "
     "0) AS share FROM visits) t GROUP BY category", "the divisor NULLIF(SUM(amount) OVER (PARTITION BY person_id)",
     "visits.amount / GREATEST(SUM(amount) OVER (PARTITION BY person_id), 1)"),
    ("SELECT category, AVG(d) FROM (SELECT v.*, amount / (amount - LAG(amount) OVER (PARTITION BY person_id ORDER "
     "BY day)) AS d FROM visits v) t GROUP BY category",
     "the divisor (v.amount - LAG(amount) OVER (PARTITION BY person_id ORDER BY day))", "GREATEST(x, 1)"),
])
def test_a_refusal_of_a_construct_says_the_form_dpsql_answers(engine, analyst, sql, construct, instead):
    """DISTINCT ON (a unit's first row), ANY over an array column, AT TIME ZONE a column, a set operation not of
    sets of people, a divisor that reaches 0: each refusal names the construct as written, never by a name dpsql
    gave it, and the nearest form that is answered."""
    with pytest.raises(errors.UnsupportedQuery) as refused:
        engine.query(sql, analyst=analyst)
    assert construct in str(refused.value) and instead in refused.value.hint
    assert "dpsql_" not in str(refused.value)
    assert engine.budget(analyst).epsilon_spent == 0


def test_explain_and_an_answer_s_notes_name_a_window_dpsql_computes_apart_as_written(engine):
    """A window over each person's rows that dpsql reads from a per-unit subquery of its own (dpsql_w) is named as
    the analyst wrote it wherever a person reads about it: explain's plan and noise, and the caveat said with the
    answer (which suggests aggregating over the person's own subquery). Only the rewritten SQL keeps dpsql's
    names, since it is what PostgreSQL runs."""
    from dpsql.explain import explain_text

    sql = ("SELECT category, AVG(share) FROM (SELECT category, amount / GREATEST(SUM(amount) OVER (PARTITION BY "
           "person_id), 1) AS share FROM visits) t GROUP BY category")
    window = "SUM(amount) OVER (PARTITION BY person_id)"
    told, rewritten = explain_text(engine.prepare(sql)).split("Rewritten SQL:")
    assert window in told and "dpsql_" not in told.replace("dpsql.", "") and "dpsql_w" in rewritten
    caveat = engine.prepare(sql).plan.caveat
    assert caveat.startswith(f"{window}: one value per unit") and "(SELECT person_id, … GROUP BY 1) t" in caveat
