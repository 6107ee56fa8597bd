"""Constant date and time arithmetic, folded as PostgreSQL computes it, and comparisons of a column ± a step solved
for the column exactly (dpsql/sql/times.py): checked against PostgreSQL itself."""

from __future__ import annotations

import re

import psycopg
import pytest
from sqlglot import exp

from dpsql import errors
from dpsql.sql import check_query
from dpsql.sql.query import to_sql
from tests.test_analysis import plan

CONSTANTS = [
    "DATE '2024-07-01' - INTERVAL '30 days'",
    "DATE '2024-03-31' - INTERVAL '1 month'",  # the day clamped to February's end
    "DATE '2024-01-31' + INTERVAL '1 month'",
    "DATE '2023-02-28' + INTERVAL '1 year'",
    "DATE '2024-02-29' + INTERVAL '1 year'",
    "DATE '2024-07-01' - INTERVAL '3 months'",
    "DATE '2024-07-01' + 7",
    "DATE '2024-07-01' - 400",
    "TIMESTAMP '2024-01-31 10:30:00' + INTERVAL '1 month 2 days 3 hours'",
    "TIMESTAMP '2024-12-31 23:00:00' + INTERVAL '90 minutes'",
    "DATE '2024-07-01' - INTERVAL '2 weeks'",
    "CAST('2024-07-01' AS DATE) + INTERVAL '-1 day'",
    "'2024-07-01'::date + INTERVAL '1 year 2 months'",
    "(DATE '2024-07-01' - INTERVAL '1 day') - INTERVAL '12 hours'",
    "TO_TIMESTAMP('2024-01-01 00:00:00.000000', 'YYYY-MM-DD HH24:MI:SS.US')",  # Superset's time range
    "to_timestamp('2024-06-30 23:59:59', 'YYYY-MM-DD HH24:MI:SS')",
    "to_date('2024-07-01', 'YYYY-MM-DD')",
    "to_timestamp(1700000000)",
    "make_date(2024, 2, 29)",
    "make_timestamp(2024, 6, 30, 23, 59, 59)",
]


def _folded(sql: str, schema) -> exp.Expression:
    return check_query(sql, schema).tree.args["where"].this.expression


@pytest.mark.parametrize("constant", CONSTANTS)
def test_constant_time_arithmetic_folds_to_what_postgresql_computes(base_url, demo_schema, constant):
    folded = _folded(f"SELECT COUNT(*) FROM visits WHERE day >= {constant}", demo_schema)
    assert not folded.find(exp.Interval, exp.Add, exp.Sub, exp.StrToTime, exp.StrToDate, exp.UnixToTime,
                           exp.Anonymous, exp.TimestampFromParts), \
        to_sql(folded)
    with psycopg.connect(base_url) as conn:
        expected, ours = conn.execute(f"SELECT {constant}, {to_sql(folded)}").fetchone()
    assert ours == expected and type(ours) is type(expected)


SOLVED = [
    ("day + 7 > DATE '2024-12-01'", "day > CAST('2024-11-24' AS DATE)"),
    ("day - 7 <= DATE '2024-03-01'", "day <= CAST('2024-03-08' AS DATE)"),
    ("DATE '2024-06-01' < day + INTERVAL '12 hours'", "CAST('2024-05-31 12:00:00' AS TIMESTAMP) < day"),
    ("day + INTERVAL '7 days' >= DATE '2024-12-01' - INTERVAL '1 month'",
     "day >= CAST('2024-10-25 00:00:00' AS TIMESTAMP)"),
    ("day - INTERVAL '1 week' = DATE '2024-05-01'", "day = CAST('2024-05-08 00:00:00' AS TIMESTAMP)"),
]


@pytest.mark.parametrize(("condition", "solved"), SOLVED)
def test_a_column_plus_a_step_compared_with_a_constant_is_solved_exactly(base_url, demo_schema, condition, solved):
    where = _folded(f"SELECT COUNT(*) FROM visits WHERE {condition}", demo_schema).parent
    assert to_sql(where).replace('"', "").replace("visits.", "") == solved
    with psycopg.connect(base_url) as conn:  # the same rows, on the data
        before = conn.execute(f"SELECT COUNT(*) FROM visits WHERE {condition}").fetchone()[0]
        after = conn.execute(f"SELECT COUNT(*) FROM visits WHERE {solved}").fetchone()[0]
    assert before == after


@pytest.mark.parametrize("condition", [
    "day + INTERVAL '1 month' > DATE '2024-03-31'",  # not invertible: never rewritten
    "date_trunc('month', day + INTERVAL '1 day') = DATE '2024-03-01'",
])
def test_steps_that_cannot_be_solved_exactly_shift_the_bounded_column_as_written(demo_schema, condition):
    """Left as written (never solved), and answered by shifting the date clamped to its declared bounds; a time
    whose bounds are not known is refused with what to write."""
    checked = check_query(f"SELECT COUNT(*) FROM visits WHERE {condition}", demo_schema)
    assert checked.tree.find(exp.Interval) is not None
    plan(f"SELECT COUNT(*) FROM visits WHERE {condition}", demo_schema)
    with pytest.raises(errors.UnsupportedQuery) as refused:
        plan(f"SELECT COUNT(*) FROM visits WHERE {condition.replace('day +', 'to_timestamp(amount) +')}",
             demo_schema)
    assert "only to a date or timestamp column with declared bounds" in refused.value.message
    assert "move the interval" not in refused.value.hint and "declare lower and upper" in refused.value.hint


def test_a_query_with_date_arithmetic_is_answered_and_charged_as_its_folded_form(engine, analyst):
    answer = engine.query("SELECT COUNT(*) FROM visits WHERE day >= DATE '2024-07-01' - INTERVAL '3 months' "
                          "AND day + 7 < DATE '2025-01-01'", analyst=analyst, epsilon=1.0)
    same = engine.query("SELECT COUNT(*) FROM visits WHERE day >= TIMESTAMP '2024-04-01 00:00:00' "
                        "AND day < DATE '2024-12-25'", analyst=analyst, epsilon=1.0)
    assert same.cached and same.rows == answer.rows  # one canonical query: the second asking is free


def test_a_date_no_calendar_has_fails_as_postgresql_fails_before_anything_runs(demo_schema):
    with pytest.raises(errors.InvalidConstant, match="date field value out of range: 2024-2-30") as failed:
        check_query("SELECT COUNT(*) FROM visits WHERE day >= make_date(2024, 2, 30)", demo_schema)
    assert failed.value.sqlstate == "22008"  # PostgreSQL's own


TO_CHAR_TEMPLATES = ["Mon YYYY", "YYYY-MM", "Month YYYY", "FMMonth YYYY", "YYYY-MM-DD HH24:MI:SS", "Dy DD Mon", "Q",
                     "IYYY-IW", 'YYYY"Q"Q', "DD/MM/YY", "MON mon", "HH12 AM", "hh:mi pm", "Day", "FMDay, FMDDth Month",
                     "DDD", "J", "CC", "WW W", "RM FMrm", "Y,YYY", "yyyy-mm-dd", "IDDD ID", "MS US", "SSSS",
                     "A.M. p.m.", "AD bc", "DDTH ddth", "YYY YY Y", "FMMM/FMDD", 'YYYY\\"MM', "DAY dy month",
                     "FMHH12:MI:SS AM", "HH HH24 D", "it''s week IW"]


def test_to_char_of_a_released_time_is_postgresql_s(base_url):
    """to_char over released keys runs in Python: for each template as the analysis reads it (through sqlglot's
    spelling and back) and times across years, days of the week, ISO weeks and microseconds, the text is
    PostgreSQL's own."""
    import datetime
    import random

    from dpsql.sql.parse import parse_select
    from dpsql.sql.to_char import template_of, to_char

    draws = random.Random(7)
    times = [datetime.datetime(2024, 1, 1), datetime.datetime(2024, 12, 31, 23, 59, 59, 123456),
             datetime.datetime(2021, 1, 3, 12), datetime.datetime(2024, 2, 29, 13, 1, 2, 3000),
             datetime.date(2019, 12, 30)]
    times += [datetime.datetime(2000, 1, 1) + datetime.timedelta(seconds=draws.randrange(10**9),
                                                                 microseconds=draws.randrange(10**6))
              for _ in range(10)]
    with psycopg.connect(base_url) as conn:
        for written in TO_CHAR_TEMPLATES:
            node = parse_select(f"SELECT to_char(day, '{written}') FROM visits").expressions[0].unalias()
            for time in times:
                expected = conn.execute("SELECT to_char(%s::timestamp, %s)", (time, written.replace("''", "'")))
                assert to_char(time, template_of(node)) == expected.fetchone()[0], (written, time)


def test_a_period_s_first_day_computed_in_python_is_postgresql_s(base_url):
    """date_trunc(unit, d)::date, read in Python to find the key combinations a date column's days give: for every
    unit and dates across leap days, year, decade, century and millennium ends, PostgreSQL's own day."""
    import datetime

    from dpsql.postprocess.evaluate import PERIOD_STARTS, evaluate
    from dpsql.sql.parse import parse_select

    days = [datetime.date(2024, 2, 29), datetime.date(2024, 12, 30), datetime.date(2000, 1, 1),
            datetime.date(2001, 1, 1), datetime.date(1999, 12, 31), datetime.date(2100, 6, 15),
            datetime.date(2023, 1, 1), datetime.date(1901, 1, 1)]
    with psycopg.connect(base_url) as conn:
        for unit in PERIOD_STARTS:
            node = parse_select(f"SELECT date_trunc('{unit}', day)::date FROM visits").expressions[0].unalias()
            for day in days:
                expected = conn.execute(f"SELECT date_trunc('{unit}', %s::date)::date", (day,)).fetchone()[0]
                assert evaluate(node, {"day": day}) == expected, (unit, day)


def test_to_char_of_a_released_key_is_post_processing(engine, analyst, base_url):
    """Metabase and Superset label a month as text over the key they group by; the label is computed from the
    released key, so the months are the declared domain's, and each label is PostgreSQL's for its month."""
    answer = engine.query("SELECT to_char(date_trunc('month', day), 'FMMonth YYYY') AS m, COUNT(*) FROM visits "
                          "GROUP BY date_trunc('month', day) ORDER BY date_trunc('month', day)", analyst=analyst,
                          epsilon=1.0)
    with psycopg.connect(base_url) as conn:
        months = [r[0] for r in conn.execute("SELECT to_char(m, 'FMMonth YYYY') FROM generate_series("
                                             "'2024-01-01'::timestamp, '2024-12-01', '1 month') m")]
    assert [row[0] for row in answer.rows] == months and answer.types == ["text", "int8"]
    with pytest.raises(errors.UnsupportedQuery, match="over a GROUP BY key or a number, not a noisy date"):
        engine.prepare("SELECT category, to_char(MIN(day), 'YYYY') FROM visits GROUP BY category")


@pytest.mark.parametrize("written", [t for t in TO_CHAR_TEMPLATES if "MS" not in t and "SS" not in t])
def test_to_char_of_a_declared_time_is_a_public_key_of_postgresql_s_texts(engine, base_url, written):
    """Looker groups months as text (to_char(date_trunc('month', day), 'YYYY-MM')), and analysts write
    to_char(day, 'YYYY-MM'): the texts of the declared days' periods, as PostgreSQL prints them, are released
    every one (narrowed by the WHERE), without partition selection. Before, they were private keys: at 3,000 demo
    people 48 of 120 months were released, at 20,000 people and ε = 0.1 none."""
    template = written.replace("''", "'")
    with psycopg.connect(base_url) as conn:
        texts = conn.execute("SELECT DISTINCT to_char(d, %s) FROM generate_series('2024-03-01'::timestamp, "
                             "'2024-12-31', '1 day') d", (template,)).fetchall()
    for key in (f"to_char(day, '{written}')", f"to_char(date_trunc('day', day), '{written}')"):
        plan = engine.prepare(f"SELECT {key} AS k, COUNT(*) FROM visits WHERE day >= DATE '2024-03-01' "
                              "GROUP BY 1").plan
        assert not plan.partition_selection and set(plan.domain) == set(texts), key


@pytest.mark.parametrize("written", ["YYYY-MM-DD HH24:MI:SS", "TMMonth YYYY", "MS"])
def test_to_char_of_seconds_or_translated_names_stays_private(engine, written):
    """Seconds would be too many texts, and TM prints names in the database's locale, which dpsql does not
    compute: those keys stay private, released by partition selection."""
    assert engine.prepare(f"SELECT to_char(day, '{written}') AS k, COUNT(*) FROM visits GROUP BY 1"
                          ).plan.partition_selection


def test_a_time_at_a_named_zone_is_answered_with_its_periods_and_a_zone_postgresql_lacks_costs_nothing(
        engine, analyst, base_url):
    """`day AT TIME ZONE 'America/New_York'` keeps the day's declared bounds, a day wider on either side (every
    zone PostgreSQL lists is within a day of UTC), so date_trunc of it releases the months of that span; at UTC
    in a UTC session the span is the column's own. A zone PostgreSQL does not list ('UTC+100', a POSIX zone
    over four days off, or a misspelt name) is refused with 22023 before anything runs, and a zone that is not
    a constant with a hint; a number at a zone is PostgreSQL's 42883."""
    with psycopg.connect(base_url) as conn:
        zone = conn.execute("SHOW TimeZone").fetchone()[0]
    months = "SELECT date_trunc('month', day AT TIME ZONE '{}') AS m, COUNT(*) FROM visits GROUP BY 1"
    new_york = engine.query(months.format("America/New_York"), analyst=analyst, epsilon=1.0)
    assert [str(row[0].date()) for row in new_york.rows[:2]] == ["2023-12-01", "2024-01-01"]
    assert new_york.types[0] == "timestamp" and len(new_york.rows) == 14
    utc = engine.query(months.format("UTC"), analyst=analyst, epsilon=1.0)
    assert len(utc.rows) == (12 if zone.lower() in ("utc", "etc/utc") else 14)
    spent = engine.budget(analyst).epsilon_basic
    for bad in ("UTC+100", "Mars/Olympus"):
        refused = re.escape(f'time zone "{bad}" is not one PostgreSQL lists')
        with pytest.raises(errors.InvalidConstant, match=refused) as err:
            engine.query(f"SELECT COUNT(*) FROM visits WHERE day AT TIME ZONE '{bad}' > TIMESTAMP '2024-06-01'",
                         analyst=analyst, epsilon=1.0)
        assert err.value.sqlstate == "22023"
    with pytest.raises(errors.UnsupportedQuery, match="AT TIME ZONE") as err:
        engine.query("SELECT COUNT(*) FROM visits v JOIN people p ON v.person_id = p.person_id "
                     "WHERE day AT TIME ZONE p.state > TIMESTAMP '2024-06-01'", analyst=analyst, epsilon=1.0)
    assert "AT TIME ZONE 'America/New_York'" in err.value.hint
    with pytest.raises(errors.InvalidQuery, match="reads a date or a time") as err:
        engine.query("SELECT COUNT(*) FROM people WHERE age AT TIME ZONE 'UTC' > 3", analyst=analyst, epsilon=1.0)
    assert err.value.sqlstate == "42883"
    assert engine.budget(analyst).epsilon_basic == spent  # none of them charged


def test_days_and_weeks_of_a_moved_date_are_public_keys(engine, base_url):
    """Looker's `(DATE(day AT TIME ZONE 'UTC'))` and Metabase's `date_trunc('week', CAST(day AS timestamp))`
    release the periods of the column's declared bounds (the zone's a day wider; the cast's narrowed by the
    WHERE), every one, without partition selection: before, both were private keys, and on 3,000 demo people
    their days and weeks were dropped by partition selection (0 rows)."""
    with psycopg.connect(base_url) as conn:
        zone = conn.execute("SHOW TimeZone").fetchone()[0]
    days = engine.prepare("SELECT (DATE(day AT TIME ZONE 'UTC')) AS d, COUNT(*) FROM visits GROUP BY 1").plan
    assert not days.partition_selection and len(days.domain) == (366 if zone.lower() in ("utc", "etc/utc") else 368)
    weeks = engine.prepare("SELECT date_trunc('week', CAST(day AS timestamp)) AS w, COUNT(*) FROM visits "
                           "WHERE day >= DATE '2024-12-01' GROUP BY 1").plan
    assert not weeks.partition_selection
    assert [str(w) for (w,) in weeks.domain] == ["2024-11-25 00:00:00", "2024-12-02 00:00:00", "2024-12-09 00:00:00",
                                                 "2024-12-16 00:00:00", "2024-12-23 00:00:00", "2024-12-30 00:00:00"]


def test_the_periods_of_a_date_cast_to_a_date_are_public_keys(engine, base_url):
    """Tableau truncates a date column as `DATE_TRUNC('MONTH', CAST("visits"."day" AS DATE))`: the cast changes
    nothing, so its months are the column's, every one released. Before, they were private keys: partition
    selection took its share of ε, and on 3,000 demo people 4 to 8 of the 12 months came back."""
    for sql in ("SELECT DATE_TRUNC('MONTH', CAST(day AS DATE)) AS m, COUNT(*) FROM visits GROUP BY 1",
                "SELECT CAST(DATE_TRUNC('MONTH', CAST(CAST(day AS DATE) AS DATE)) AS DATE) AS m, COUNT(*) FROM visits "
                "WHERE day >= DATE '2024-07-01' GROUP BY 1"):
        plan = engine.prepare(sql).plan
        with psycopg.connect(base_url) as conn:
            truth = {m.strftime("%Y-%m") for (m, _) in conn.execute(sql).fetchall()}
        months = [m.strftime("%Y-%m") for (m,) in plan.domain]
        assert not plan.partition_selection and truth <= set(months), (sql, months)
        assert months[-1] == "2024-12" and months[0] == ("2024-01" if "WHERE" not in sql else "2024-07"), months


@pytest.mark.parametrize("condition,first,last", [
    ("day >= '2024-06-15 12:00:00'", "2024-06", "2024-12"),  # day >= 2024-06-16
    ("day > TIMESTAMP '2024-06-30 00:00:00'", "2024-07", "2024-12"),
    ("day < TIMESTAMP '2024-03-01 00:00:01'", "2024-01", "2024-03"),  # day <= 2024-03-01
    ("day BETWEEN TIMESTAMP WITH TIME ZONE '2024-01-01 00:00:00.000Z' AND "
     "TIMESTAMP WITH TIME ZONE '2024-03-31 23:59:59.999Z'", "2024-01", "2024-03"),  # Metabase's range
    ("day = TIMESTAMP '2024-05-05 10:00:00'", None, None),  # no date is that time: nothing to release
])
def test_a_date_keys_periods_are_narrowed_by_comparisons_with_times(engine, base_url, condition, first, last):
    """A date compares with a time as its midnight (in the session's zone for a timestamptz), so a condition on a
    date column with a time between two midnights narrows its periods to whole days (day >= '2024-06-15 12:00'
    is day >= 2024-06-16). Before, such a condition narrowed nothing: every month of the declared year was
    released, the ones outside the filter as noisy zeros."""
    with psycopg.connect(base_url) as conn:
        if conn.execute("SHOW TimeZone").fetchone()[0].lower() not in ("utc", "etc/utc"):
            pytest.skip("the timestamptz case is written for a UTC session")
        truth = conn.execute(f"SELECT to_char(date_trunc('month', day), 'YYYY-MM') FROM visits WHERE {condition} "
                             "GROUP BY 1 ORDER BY 1").fetchall()
    plan = engine.prepare(f"SELECT date_trunc('month', day) AS m, COUNT(*) FROM visits WHERE {condition} "
                          "GROUP BY 1").plan
    months = [m.strftime("%Y-%m") for (m,) in plan.domain]
    span = (months[0], months[-1]) if months else (None, None)
    assert span == (first, last), months
    assert {m for (m,) in truth} <= set(months)  # every month PostgreSQL finds rows in is released


def test_nested_aggregates_are_postgresql_s_grouping_error(engine, analyst):
    with pytest.raises(errors.InvalidQuery, match="aggregate function calls cannot be nested") as err:
        engine.query("SELECT AVG(MAX(amount)) FROM visits GROUP BY category", analyst=analyst)
    assert err.value.sqlstate == "42803" and "subquery" in err.value.hint
