"""The analysis without a database: ranges, guards, sensitivities and refusals of unsafe expressions."""

from __future__ import annotations

import dataclasses
import math

import pytest

from dpsql import errors
from dpsql.analysis import analyze
from dpsql.rewrite import rewrite
from dpsql.sql import check_query, to_sql

UNIQUE = frozenset({("people", "person_id"), ("states", "code")})


def plan(sql: str, schema):
    return analyze(check_query(sql, schema), schema, UNIQUE)


def test_sensitivities_follow_the_declared_bounds(demo_schema):
    p = plan("SELECT COUNT(*), SUM(income) FROM people", demo_schema)
    assert [m.sensitivity for m in p.measures] == [1, 250000]
    assert p.unit is None  # the primary key makes every row one whole unit: no per-unit stage
    # a person keeps 10 visits over all categories (8 declared), so reaches 8 groups but adds 10 rows' worth
    p = plan("SELECT category, COUNT(*), SUM(amount), COUNT(DISTINCT person_id) FROM visits GROUP BY category",
             demo_schema)
    assert p.rows_per_unit == 10 and p.rows_total and p.max_groups == 8 and not p.cap_groups
    assert [m.sensitivity for m in p.measures] == [10, 10 * 1000, 8]
    # private keys: partition selection pays for every group a unit reaches; with k = 10 rows a unit reaches at
    # most 10 days, within 4 × max_groups_per_unit, so no cap drops a unit's other days (a bias)
    p = plan("SELECT day, COUNT(*), SUM(amount) FROM visits GROUP BY day", demo_schema)
    assert p.rows_total and p.max_groups == 10 and not p.cap_groups and p.partition_selection
    assert [m.sensitivity for m in p.measures] == [10, 10 * 1000]
    # ... but a reach far beyond it is capped at max_groups_per_unit
    tight = dataclasses.replace(demo_schema, max_groups_per_unit=2)
    p = plan("SELECT day, COUNT(*), SUM(amount) FROM visits GROUP BY day", tight)
    assert p.max_groups == 2 and p.cap_groups and [m.sensitivity for m in p.measures] == [10, 10 * 1000]
    p = plan("SELECT p.state, COUNT(*) FROM visits v JOIN people p ON v.person_id = p.person_id GROUP BY 1",
             demo_schema)
    assert p.max_groups == 1 and not p.cap_groups  # a person has one state
    assert p.partition_selection


def test_averages_are_centred(demo_schema):
    p = plan("SELECT AVG(age) FROM people", demo_schema)
    labels = [m.label for m in p.measures]
    assert labels == ["COUNT(people.age)", "SUM(people.age - 50)"]
    assert [m.sensitivity for m in p.measures] == [1, 50]


def test_replace_neighbours_double_sensitivity(demo_schema):
    from dataclasses import replace
    schema = replace(demo_schema, neighbouring="replace")
    assert [m.sensitivity for m in plan("SELECT COUNT(*) FROM people", schema).measures] == [2]


def test_guards_make_partial_operations_total(demo_schema):
    sql = rewrite(plan("SELECT SUM(income / (age + 1)), SUM(sqrt(amount)), SUM(ln(amount)) "
                       "FROM visits v JOIN people p ON v.person_id = p.person_id", demo_schema)).sql
    assert "NULLIF((CAST(CASE WHEN p.age < 0 THEN 0 WHEN p.age > 100 THEN 100 ELSE p.age END AS BIGINT) + 1), 0)" in sql
    assert "SQRT(CASE WHEN" in sql and "LN(CASE WHEN" in sql  # not GREATEST: it would turn NULL into 0
    assert "'NaN'" in sql  # NaN becomes NULL when clamped


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM people WHERE CAST(state AS date) > '2020-01-01'",
    "SELECT COUNT(*) FROM people WHERE CAST(state AS numeric) > 1",
    "SELECT COUNT(*) FROM people WHERE CAST(income * 1e9 AS integer) > 1",
    "SELECT COUNT(*) FROM people WHERE CAST(income AS numeric(5, 2)) > 1",
    "SELECT COUNT(*) FROM visits WHERE visit_id * 2 > 5",
    "SELECT SUM(amount / (amount - 500)) FROM visits",
    "SELECT COUNT(*) FROM people WHERE state LIKE state",
    "SELECT COUNT(*) FROM people WHERE substring(state, age, 2) = 'C'",
    "SELECT COUNT(*) FROM visits WHERE EXTRACT(julian FROM day) > 0",
    "SELECT SUM(income * income * income) FROM people",
    "SELECT AVG(exp(age)) FROM people",  # overflows a double past 709
    "SELECT AVG(exp(-age * 10)) FROM people",  # PostgreSQL refuses an underflow too
    "SELECT AVG(power(age - 50, 0.5)) FROM people",  # a negative base to a fractional power
    "SELECT AVG(power(age, -1)) FROM people",  # zero to a negative power
    "SELECT AVG(power(income, 30)) FROM people",
    "SELECT AVG(power(income, age)) FROM people",  # an exponent that is no constant
    "SELECT AVG(log(age - 200)) FROM people",  # never defined
    "SELECT replace(state, '', 'x'), COUNT(*) FROM people GROUP BY 1",  # an empty search: backends differ
    "SELECT split_part(state, 'A', 0), COUNT(*) FROM people GROUP BY 1",  # PostgreSQL fails on field 0
    "SELECT lpad(state, 1000000, 'x'), COUNT(*) FROM people GROUP BY 1",  # would only fill memory
    "SELECT strpos(state, sex), COUNT(*) FROM people GROUP BY 1",  # a substring that is no constant
    "SELECT right(state, age), COUNT(*) FROM people GROUP BY 1",
])
def test_expressions_that_could_fail_on_some_value_are_refused(demo_schema, sql):
    with pytest.raises(errors.UnsupportedQuery):
        plan(sql, demo_schema)


def test_logarithms_exponentials_powers_and_signs_are_bounded_where_none_fails(demo_schema):
    """log(x), log10(x) and log(b, x) are ln(x) / ln(b), guarded and bounded as ln is; exp, power of a constant,
    sign and cbrt are bounded by their arguments' ranges (PostgreSQL's values: the backends' equality tests run
    the neighbour tests' queries with them)."""
    sql = ("SELECT SUM(log(age + 1)), SUM(log10(age + 1)), SUM(sign(age - 50)), SUM(cbrt(age - 50)), "
           "SUM(exp(age / 50.0)), SUM(power(age, 2)), SUM(power(age, 0.5)) FROM people")
    planned = plan(sql, demo_schema)
    ranges = [(m.arg_range.lo, m.arg_range.hi) for m in planned.aggregates]
    assert ranges[0] == (0.0, pytest.approx(math.log10(101)))  # log and log10 alike: one aggregate
    assert ranges[1:3] == [(-1, 1), (pytest.approx(-50 ** (1 / 3)), pytest.approx(50 ** (1 / 3)))]
    assert ranges[3:] == [(1.0, pytest.approx(math.e ** 2)), (0, 10_000), (0, 10)]
    assert "LN(" in rewrite(planned).sql and "LOG(" not in rewrite(planned).sql  # one logarithm for every backend


def test_a_cast_to_numeric_of_a_precision_its_bounded_value_fits_is_answered(demo_schema):
    """x::numeric(p, s) was refused outright; where the clamped value, rounded to s digits, stays below
    10^(p - s) no stored value can make it overflow (amounts up to the test schema's cap in numeric(10, 2))."""
    planned = plan("SELECT SUM(amount::numeric(10, 2)), SUM(CAST(age AS numeric(3))) FROM visits v JOIN people p "
                   "ON p.person_id = v.person_id", demo_schema)
    assert [(a.arg_range.lo, a.arg_range.integer) for a in planned.aggregates] == [(0, False), (0, True)]
    with pytest.raises(errors.UnsupportedQuery, match="could overflow"):  # 100 rounds to 100.0, past 99.9
        plan("SELECT SUM(CAST(age AS numeric(3, 1))) FROM people", demo_schema)


def test_text_functions_of_a_declared_domain_release_their_values_on_it(demo_schema):
    """replace, split_part, strpos, lpad/rpad, right and reverse of a column with a declared domain: computed on its
    declared values as PostgreSQL computes them (checked against PostgreSQL on the demo data while building)."""
    def domain(key: str) -> list:
        return [row[0] for row in plan(f"SELECT {key} AS k, COUNT(*) FROM visits GROUP BY 1", demo_schema).domain]
    assert domain("replace(category, 'a', 'A')")[:4] == ["checkup", "dentAl", "emergency", "lAb"]
    assert domain("split_part(category, 'a', 2)")[:4] == ["", "l", "b", "rm"]  # each value once
    assert domain("strpos(category, 'e')")[:4] == [3, 2, 1, 0]
    assert domain("lpad(category, 4, 'xy')")[:4] == ["chec", "dent", "emer", "xlab"]
    assert domain("rpad(category, 9)")[:4] == ["checkup  ", "dental   ", "emergency", "lab      "]
    assert domain("right(category, 3)")[:2] == ["kup", "tal"] and domain("reverse(category)")[:1] == ["pukcehc"]


def test_group_key_domains(demo_schema):
    assert len(plan("SELECT sex, COUNT(*) FROM people GROUP BY sex", demo_schema).domain) == 2
    assert len(plan("SELECT age, COUNT(*) FROM people GROUP BY age", demo_schema).domain) == 101
    assert len(plan("SELECT floor(income / 10000) b, COUNT(*) FROM people GROUP BY b", demo_schema).domain) == 26
    assert plan("SELECT CASE WHEN age < 18 THEN 'minor' END b, COUNT(*) FROM people GROUP BY b",
                demo_schema).domain == [("minor",), (None,)]
    assert plan("SELECT state, COUNT(*) FROM people GROUP BY state", demo_schema).domain is None


@pytest.mark.parametrize(("sql", "keys"), [
    ("SELECT age, AVG(income), COUNT(*) FROM people WHERE age >= 90 GROUP BY age", list(range(90, 101))),
    ("SELECT age, COUNT(*) FROM people WHERE 97 <= age AND age < 100.5 GROUP BY age", [97, 98, 99, 100]),
    ("SELECT age, COUNT(*) FROM people WHERE age > 95.5 GROUP BY 1", [96, 97, 98, 99, 100]),
    ("SELECT age / 10 AS decade, COUNT(*) FROM people WHERE age BETWEEN 20 AND 59 GROUP BY 1", [2, 3, 4, 5]),
    ("SELECT age, COUNT(*) FROM people WHERE age > 100 GROUP BY age", []),
    ("SELECT age, COUNT(*) FROM people WHERE age >= '90' GROUP BY age", list(range(101))),  # text: PostgreSQL's
    # one key of a date the WHERE narrows: the values its days give
    ("SELECT extract(month FROM day) AS m, COUNT(*) FROM visits WHERE day < '2024-04-01' GROUP BY 1", [1, 2, 3]),
    ("SELECT extract(day FROM day) AS d, COUNT(*) FROM visits WHERE day >= '2024-12-30' GROUP BY 1", [30, 31]),
    ("SELECT extract(dow FROM day), COUNT(*) FROM visits WHERE day BETWEEN '2024-03-04' AND '2024-03-06' "
     "GROUP BY 1", [1, 2, 3]),
    ("SELECT extract(month FROM day) AS m, COUNT(*) FROM visits GROUP BY 1", list(range(1, 13))),
    # and of an integer column: the bands its admitted values fall in
    ("SELECT CASE WHEN age < 30 THEN 'young' WHEN age < 60 THEN 'mid' ELSE 'old' END AS band, COUNT(*) FROM people "
     "WHERE age >= 65 GROUP BY 1", ["old"]),
    ("SELECT age >= 65 AS senior, COUNT(*) FROM people WHERE age BETWEEN 70 AND 80 GROUP BY 1", [True]),
    ("SELECT age / 10 AS d, COUNT(*) FROM people WHERE age >= 85 GROUP BY 1", [8, 9, 10]),  # (no division read)
])
def test_a_where_range_on_an_integer_key_narrows_the_keys_released(demo_schema, sql, keys):
    """`WHERE age >= 90 GROUP BY age` released all 101 ages of the declared range, 90 of them with no row: counts
    of noise around 0 and averages of the range's ends (1,000,000 for age 0), where PostgreSQL returns the ages
    from 90. The WHERE's comparisons of the key (or of the integer column a key divides) with a number narrow
    its released values, as they narrow a date's; and a key computed from a date (the month of `day`) takes the
    values the days the WHERE admits give (months 1 to 3 of the first quarter's days, not 12)."""
    assert [key for (key,) in plan(sql, demo_schema).domain] == keys


@pytest.mark.parametrize("sql, keys", [
    ("SELECT ROUND(amount::numeric, -2) AS r, COUNT(*) FROM visits WHERE amount < 300 GROUP BY 1", [0, 100, 200, 300]),
    ("SELECT CEIL(amount / 100) * 100 AS r, COUNT(*) FROM visits WHERE amount < 300 GROUP BY 1", [0, 100, 200, 300]),
    ("SELECT floor(income / 10000) * 10000 AS b, COUNT(*) FROM people WHERE income >= 50000 AND income < 80000 "
     "GROUP BY 1", [50000, 60000, 70000, 80000]),
])
def test_a_where_range_on_a_number_narrows_the_bins_computed_from_it(demo_schema, sql, keys):
    """Bins of a double column under a WHERE on it took every bin of the declared range: `round(amount::numeric,
    -2) … WHERE amount < 300` released 51 bins, 47 of them noisy counts of nothing, where PostgreSQL has 4. The key's
    range is read with the column's bounds narrowed by the WHERE (a superset of the keys its rows can give)."""
    assert [float(key) for (key,) in plan(sql, demo_schema).domain] == keys


@pytest.mark.parametrize("sql, keys", [
    ("SELECT day, COUNT(*) FROM visits WHERE day IN ('2024-01-01', '2024-01-03') GROUP BY 1", [1, 3]),
    ("SELECT day, COUNT(*) FROM visits WHERE day = DATE '2024-01-02' GROUP BY 1", [2]),
    ("SELECT day, COUNT(*) FROM visits WHERE day NOT IN ('2024-01-01', '2024-01-03') AND day < '2024-01-05' "
     "GROUP BY 1", [2, 4]),
    ("SELECT day, COUNT(*) FROM visits WHERE day IN ('2024-01-01', NULL) GROUP BY 1", [1]),
    ("SELECT day, COUNT(*) FROM visits WHERE day NOT IN ('2024-01-01', NULL) GROUP BY 1", []),
    # a calendar's list of days, joined to the visits (the rewrite reads it as an IN list)
    ("SELECT g.d::date AS day, COUNT(v.visit_id) FROM generate_series('2024-01-01'::date, '2024-01-03'::date, "
     "'1 day') g(d) LEFT JOIN visits v ON v.day = g.d GROUP BY 1", [1, 2, 3]),
])
def test_a_where_list_of_days_narrows_the_days_released(demo_schema, sql, keys):
    """`WHERE day IN ('2024-01-01', '2024-01-02') GROUP BY day` released all 366 days of the declared year, 364 of
    them noisy counts of nothing, where PostgreSQL returns the two (it reads a quoted constant compared with a
    date as a date); so did a calendar of 7 days LEFT JOINed to the visits."""
    import datetime

    domain = analyze(check_query(sql, demo_schema), demo_schema, UNIQUE, time_zone="Etc/UTC").domain
    assert [key for (key,) in domain] == [datetime.date(2024, 1, d) for d in keys]


def test_a_period_beside_another_key_of_its_date_takes_the_pairs_its_days_give(demo_schema):
    """`to_char(date_trunc('month', day), 'Mon YYYY')` beside `date_trunc('month', day)` (a label and the month
    to order by) released every label in every month, 144 cells of which 132 were noisy counts of nothing: a
    period is read as its first day, so its pairs are those the declared days give."""
    def domain(sql: str) -> list:
        return analyze(check_query(sql, demo_schema), demo_schema, UNIQUE, time_zone="Etc/UTC").domain

    labelled = domain("SELECT to_char(date_trunc('month', day), 'Mon YYYY') AS m, COUNT(*) FROM visits "
                      "GROUP BY 1, date_trunc('month', day)")
    assert len(labelled) == 12 and labelled[2][0] == "Mar 2024" and labelled[2][1].month == 3
    weeks = domain("SELECT date_trunc('week', day) AS w, EXTRACT(MONTH FROM day) AS m, COUNT(*) FROM visits "
                   "WHERE day < '2024-03-01' GROUP BY 1, 2")
    assert len(weeks) == 10  # 9 weeks, the one of Jan 29 to Feb 4 in both months


@pytest.mark.parametrize(("sql", "keys"), [
    ("SELECT date_trunc('hour', day::timestamp) AS h, COUNT(*) FROM visits GROUP BY 1", 366),
    ("SELECT date_trunc('hour', day) AS h, COUNT(*) FROM visits WHERE day < '2024-01-03' GROUP BY 1", 2),
    ("SELECT date_trunc('minute', day::timestamp) AS h, COUNT(*) FROM visits WHERE day < '2024-01-03' GROUP BY 1",
     2),
    ("SELECT EXTRACT(HOUR FROM day::timestamp) AS h, COUNT(*) FROM visits GROUP BY 1", 1),
])
def test_a_date_as_a_time_is_at_midnight(demo_schema, sql, keys):
    """A date cast to a time is its midnight: its hours are its days (8,761 hours of 2024 were released, all but
    366 noisy counts of nothing), and its hour is 0 (24 keys)."""
    domain = analyze(check_query(sql, demo_schema), demo_schema, UNIQUE, time_zone="Etc/UTC").domain
    assert len(domain) == keys and all(getattr(k, "hour", 0) == 0 for (k,) in domain)


def test_each_key_of_a_column_the_where_narrows_is_narrowed_beside_other_keys(demo_schema):
    """Beside a key of another column, each key takes the values its column's admitted values give: the first
    quarter's months by category are 24 cells, not 96 (72 of them noisy counts of nothing)."""
    by_category = plan("SELECT category, extract(month FROM day) AS m, COUNT(*) FROM visits WHERE day < '2024-04-01' "
                       "GROUP BY 1, 2", demo_schema).domain
    assert len(by_category) == 24 and {m for _, m in by_category} == {1, 2, 3}
    bands = plan("SELECT sex, CASE WHEN age < 30 THEN 'young' WHEN age < 60 THEN 'mid' ELSE 'old' END AS band, "
                 "COUNT(*) FROM people WHERE age >= 65 GROUP BY 1, 2", demo_schema).domain
    assert sorted(bands) == [("F", "old"), ("M", "old")]


def test_date_trunc_of_a_bounded_column_releases_the_periods_its_bounds_span(demo_schema):
    import datetime
    from zoneinfo import ZoneInfo

    def periods(sql: str, zone: str | None = "Etc/UTC"):
        return analyze(check_query(sql, demo_schema), demo_schema, UNIQUE, time_zone=zone).domain

    quarters = periods("SELECT date_trunc('quarter', day), COUNT(*) FROM visits GROUP BY 1")
    utc = ZoneInfo("Etc/UTC")
    assert quarters == [(datetime.datetime(2024, m, 1, tzinfo=utc),) for m in (1, 4, 7, 10)]
    # PostgreSQL truncates a date at its midnight in the session's zone: the same wall clock, another instant
    berlin = periods("SELECT date_trunc('month', day), COUNT(*) FROM visits GROUP BY 1", "Europe/Berlin")
    assert len(berlin) == 12 and berlin[0][0] == datetime.datetime(2024, 1, 1, tzinfo=ZoneInfo("Europe/Berlin"))
    assert berlin[0][0] != datetime.datetime(2024, 1, 1, tzinfo=utc)
    weeks = periods("SELECT date_trunc('week', day), COUNT(*) FROM visits GROUP BY 1")
    assert len(weeks) == 53 and weeks[0][0].weekday() == 0 and weeks[-1][0].date() == datetime.date(2024, 12, 30)
    assert len(periods("SELECT date_trunc('day', day), COUNT(*) FROM visits GROUP BY 1")) == 366
    # conditions on the column narrow the periods to those a row can fall in
    assert periods("SELECT date_trunc('month', day), COUNT(*) FROM visits WHERE day >= DATE '2024-06-01' "
                   "AND '2024-09-30' >= day GROUP BY 1") == [(datetime.datetime(2024, m, 1, tzinfo=utc),)
                                                             for m in (6, 7, 8, 9)]
    assert len(periods("SELECT date_trunc('month', day), COUNT(*) FROM visits WHERE day > '2024-06-30' "
                       "AND day < '2024-08-01' GROUP BY 1")) == 1
    assert len(periods("SELECT date_trunc('month', day), COUNT(*) FROM visits WHERE day BETWEEN '2024-02-10' "
                       "AND '2024-03-01' GROUP BY 1")) == 2
    assert periods("SELECT date_trunc('month', day), COUNT(*) FROM visits WHERE day > '2025-01-01' "
                   "GROUP BY 1") == []
    # a condition that is not a readable constant narrows nothing
    assert len(periods("SELECT date_trunc('month', day), COUNT(*) FROM visits WHERE day >= '2024-13-01' "
                       "OR day < '2024-02-01' GROUP BY 1")) == 12
    # without the backend's zone (Spark) the periods stay private keys
    assert periods("SELECT date_trunc('quarter', day), COUNT(*) FROM visits GROUP BY 1", None) is None
    assert periods("SELECT date_trunc('century', day), COUNT(*) FROM visits GROUP BY 1") is None


PARENT_UNIQUE = UNIQUE | {("visits", "visit_id")}


def test_tables_reach_the_unit_through_declared_parent_keys(demo_schema):
    p = analyze(check_query("SELECT COUNT(*), SUM(cost) FROM prescriptions", demo_schema), demo_schema,
                PARENT_UNIQUE)
    assert p.rows_per_unit == 20 and [m.sensitivity for m in p.measures] == [20, 20 * 200]
    sql = rewrite(p).sql
    assert "LEFT JOIN visits AS dpsql_parent_1 ON dpsql_parent_1.visit_id = prescriptions.visit_id" in sql
    assert "dpsql_parent_1.person_id AS dpsql_unit" in sql
    # a prescription fixes its visit (unique key), so only the prescriptions' bound counts
    p = analyze(check_query("SELECT v.category, COUNT(*) FROM prescriptions r JOIN visits v ON r.visit_id = "
                            "v.visit_id GROUP BY v.category", demo_schema), demo_schema, PARENT_UNIQUE)
    assert p.rows_per_unit == 20 and "dpsql_parent" not in rewrite(p).sql
    assert "relation v (visits): fixed by r's row (unique key); unit column person_id" in p.notes  # explain shows
    assert ("relation r (prescriptions): at most 20 rows per unit (declared); reaches the unit through "
            "visit_id -> visits.visit_id") in p.notes
    # the other way round a visit's row does not fix its prescriptions: both bounds multiply
    p = analyze(check_query("SELECT COUNT(*) FROM visits v JOIN prescriptions r ON r.visit_id = v.visit_id "
                            "JOIN prescriptions r2 ON r2.visit_id = v.visit_id", demo_schema), demo_schema,
                PARENT_UNIQUE)
    assert p.rows_per_unit == 20 * 20


@pytest.mark.parametrize(("sql", "unique", "message"), [
    ("SELECT COUNT(*) FROM prescriptions", UNIQUE, "add a PRIMARY KEY or UNIQUE constraint on visits(visit_id)"),
    ("SELECT COUNT(*) FROM prescriptions r JOIN visits v ON r.prescription_id = v.visit_id", PARENT_UNIQUE,
     "private tables must be joined on their unit columns or along their declared parent keys"),
    ("SELECT COUNT(*) FROM prescriptions r JOIN people p ON r.visit_id = p.person_id", PARENT_UNIQUE,
     "r.visit_id = visits.visit_id"),
])
def test_joins_off_the_parent_keys_are_refused(demo_schema, sql, unique, message):
    with pytest.raises(errors.UnsupportedQuery) as caught:
        analyze(check_query(sql, demo_schema), demo_schema, unique)
    assert message in str(caught.value)


@pytest.mark.parametrize(("tables", "problem"), [
    ({"items": {"parent": "visit_id visits.visit_id", "max_rows_per_unit": 2,
                "columns": {"visit_id": "bigint"}}}, 'must look like "column -> table.key"'),
    ({"items": {"parent": "visit_id -> nowhere.id", "max_rows_per_unit": 2, "columns": {"visit_id": "bigint"}}},
     "nowhere must be a declared private table"),
    ({"items": {"parent": "visit_id -> visits.nope", "max_rows_per_unit": 2, "columns": {"visit_id": "bigint"}}},
     "visits declares no column nope"),
    ({"items": {"parent": "visit_id -> visits.visit_id", "unit_column": "visit_id", "max_rows_per_unit": 2,
                "columns": {"visit_id": "bigint"}}}, "declares both unit_column and parent"),
    ({"a": {"parent": "b_id -> b.id", "max_rows_per_unit": 1, "columns": {"id": "bigint", "b_id": "bigint"}},
      "b": {"parent": "a_id -> a.id", "max_rows_per_unit": 1, "columns": {"id": "bigint", "a_id": "bigint"}}},
     "form a cycle"),
])
def test_parent_declarations_are_checked(tables, problem):
    from dpsql.schema import parse_schema
    raw = {"privacy": {"unit": "people.person_id"},
           "tables": {"people": {"columns": {"person_id": "bigint"}},
                      "visits": {"unit_column": "person_id", "max_rows_per_unit": 3,
                                 "columns": {"visit_id": "bigint", "person_id": "bigint"}}, **tables}}
    with pytest.raises(errors.SchemaError) as caught:
        parse_schema(raw)
    assert problem in str(caught.value)


@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT COUNT(*) FROM visits v WHERE NOT EXISTS (SELECT 1 FROM prescriptions WHERE drug = 'x')",
     "without tying it to the outer row's unit"),
    ("SELECT COUNT(*) FROM people p WHERE p.person_id IN (SELECT v.visit_id FROM visits v)",
     "without tying it to the outer row's unit"),
    ("SELECT COUNT(*) FROM visits v WHERE v.amount > 5 OR EXISTS (SELECT 1 FROM prescriptions r "
     "WHERE r.visit_id = v.visit_id)", "joined to the rest of WHERE by AND"),
    ("SELECT COUNT(*) FROM visits v WHERE EXISTS (SELECT 1 FROM prescriptions r WHERE r.visit_id = v.visit_id "
     "AND EXISTS (SELECT 1 FROM people))", "cannot be merged"),
    ("SELECT COUNT(*) FROM visits WHERE EXISTS (SELECT 1 FROM visits v2 WHERE v2.person_id = visits.person_id "
     "GROUP BY v2.category)", "may not aggregate, group"),
    ("SELECT COUNT(*) FROM visits v WHERE EXISTS (SELECT 1 FROM visits v WHERE v.amount > 3)",
     "without tying it to the outer row's unit"),  # inside, v is the subquery's own
    ("SELECT COUNT(*) FROM visits v WHERE EXISTS (SELECT 1 FROM prescriptions r LEFT JOIN people p "
     "ON p.person_id = v.person_id WHERE r.visit_id = v.visit_id)", "inner joins only"),
])
def test_subqueries_that_could_read_other_units_are_refused(demo_schema, sql, message):
    with pytest.raises(errors.UnsupportedQuery) as caught:
        analyze(check_query(sql, demo_schema), demo_schema, PARENT_UNIQUE)
    assert message in str(caught.value)


def test_not_in_reads_only_the_subquerys_non_null_values(demo_schema):
    query = check_query("SELECT COUNT(*) FROM visits v WHERE v.visit_id NOT IN (SELECT visit_id FROM prescriptions)",
                        demo_schema)
    assert "NOT prescriptions.visit_id IS NULL" in to_sql(query.tree)
    p = analyze(query, demo_schema, PARENT_UNIQUE)
    assert p.rows_per_unit == 10 and [m.sensitivity for m in p.measures] == [10]  # the semijoin adds nothing
    # both sides NOT NULL, it is the anti-join PostgreSQL hashes (a NOT IN it reads again for every outer row
    # where the subquery's values overflow work_mem); a grouped subquery stays NOT IN
    assert ("NOT EXISTS(SELECT 1 FROM prescriptions AS prescriptions WHERE NOT prescriptions.visit_id IS NULL AND "
            "prescriptions.visit_id = v.visit_id)") in to_sql(query.tree)
    grouped = check_query("SELECT COUNT(*) FROM people p WHERE p.person_id NOT IN (SELECT v.person_id FROM visits v "
                          "GROUP BY v.person_id HAVING COUNT(*) > 3)", demo_schema)
    assert "NOT p.person_id IN (SELECT" in to_sql(grouped.tree) and "EXISTS" not in to_sql(grouped.tree)


def test_per_unit_subqueries_earn_the_sensitivity_of_one_row_per_unit(demo_schema):
    p = plan("SELECT n, COUNT(*) FROM (SELECT person_id, COUNT(*) AS n FROM visits GROUP BY person_id) AS t "
             "GROUP BY n", demo_schema)
    assert p.unit is None and p.max_groups == 1 and [m.sensitivity for m in p.measures] == [1]
    assert p.domain is not None and len(p.domain) == 10  # n in 1..10: every key released
    sql = rewrite(p).sql
    assert "INT8SMALLER(INT8LARGER(COUNT(*), 1), 10)" in sql and "GROUP BY visits.person_id" in sql
    p = plan("SELECT SUM(total) FROM (SELECT v.person_id, SUM(v.amount) AS total FROM visits v "
             "GROUP BY v.person_id) t", demo_schema)
    assert [m.sensitivity for m in p.measures] == [10 * 1000]


def test_a_subquery_grouped_by_a_key_within_one_unit_is_a_table_of_its_groups(demo_schema):
    """GROUP BY a visit's key: each group is one unit's rows, so the subquery is grouped by the unit too (the same
    groups), and outside it is a table of a row per group whose unit holds at most its k rows' groups, bounded as
    a table's rows per unit. A key that may be NULL fixes no unit (its NULLs are one group of many units)."""
    sql = "SELECT AVG(n), COUNT(*) FROM (SELECT v.visit_id, COUNT(*) AS n FROM visits v GROUP BY v.visit_id) t"
    unique = UNIQUE | {("visits", "visit_id")}
    p = analyze(check_query(sql, demo_schema), demo_schema, unique, not_null=frozenset({("visits", "visit_id")}))
    assert [m.sensitivity for m in p.measures] == [10, 10 * 4.5, 10]  # 10 groups of n in [1, 10], centred
    rewritten = rewrite(p).sql
    assert "GROUP BY v.person_id, v.visit_id" in rewritten and "HAVING COUNT(*) > 10" in rewritten
    with pytest.raises(errors.UnsupportedQuery, match="a unique NOT NULL column"):
        analyze(check_query(sql, demo_schema), demo_schema, unique)
    not_null = frozenset({("visits", "visit_id")})
    for outer in ("people p LEFT JOIN visits v ON v.person_id = p.person_id",  # v's NULLs: one group of many
                  "visits v RIGHT JOIN people p ON v.person_id = p.person_id"):
        with pytest.raises(errors.UnsupportedQuery, match="a unique NOT NULL column"):
            analyze(check_query(f"SELECT AVG(n) FROM (SELECT v.visit_id, COUNT(*) AS n FROM {outer} "
                                "GROUP BY v.visit_id) t", demo_schema), demo_schema, unique, not_null=not_null)
    # one row per person declared (not a key): a person's groups are still counted and kept per person, never
    # taken for one row each
    visits = dataclasses.replace(demo_schema.tables["visits"], max_rows_per_unit=1)
    one = dataclasses.replace(demo_schema, tables={**demo_schema.tables, "visits": visits})
    p = analyze(check_query(sql, one), one, unique, not_null=frozenset({("visits", "visit_id")}))
    assert p.unit is not None and "FROM dpsql_rows GROUP BY dpsql_unit" in rewrite(p).sql  # the per-unit stage


def test_a_having_inside_a_per_unit_subquery_is_its_filter_outside(demo_schema):
    """The groups HAVING keeps are the rows of the per-unit table a WHERE outside keeps: the same plan, the HAVING's
    aggregates selected under names of dpsql's own (or the output already computing them)."""
    having = plan("SELECT AVG(s) FROM (SELECT person_id, SUM(amount) AS s FROM visits GROUP BY person_id "
                  "HAVING COUNT(*) > 5 AND SUM(amount) > 100) t", demo_schema)
    where = plan("SELECT AVG(s) FROM (SELECT person_id, SUM(amount) AS s, COUNT(*) AS dpsql_having_1 FROM visits "
                 "GROUP BY person_id) t WHERE t.dpsql_having_1 > 5 AND t.s > 100", demo_schema)
    assert rewrite(having).sql == rewrite(where).sql
    assert [m.sensitivity for m in having.measures] == [m.sensitivity for m in where.measures]
    # an unaliased output the HAVING repeats is read by its name (it was "column count does not exist")
    unnamed = plan("SELECT COUNT(*) FROM (SELECT person_id, day, COUNT(*) FROM visits GROUP BY 1, 2 HAVING COUNT(*) "
                   "> 1) t", demo_schema)
    named = plan("SELECT COUNT(*) FROM (SELECT person_id, day, COUNT(*) AS n FROM visits GROUP BY 1, 2) t "
                 "WHERE t.n > 1", demo_schema)
    assert [m.sensitivity for m in unnamed.measures] == [m.sensitivity for m in named.measures]


def test_a_unit_s_first_value_of_a_declared_domain_keeps_the_domain_outside(demo_schema):
    """MIN or MAX of a text column with declared values, per unit, is one of its values: outside, a key of those
    values (a unit's first category), released without partition selection."""
    p = plan("SELECT first_cat, COUNT(*) FROM (SELECT person_id, MIN(category) AS first_cat FROM visits "
             "GROUP BY person_id) t GROUP BY 1", demo_schema)
    assert [key[0] for key in p.domain] == list(demo_schema.tables["visits"].columns["category"].domain)
    assert not p.partition_selection


def test_a_unit_s_count_of_rows_is_at_least_one(demo_schema):
    """A group holds a row, so a unit's COUNT(*) is 1 or more: its keys start at 1. Key 0 was released as a noisy
    count of nothing, and `ORDER BY n LIMIT 10` showed it first where PostgreSQL starts at 1. COUNT of a column
    may be 0 (all NULL)."""
    rows = plan("SELECT n, COUNT(*) FROM (SELECT person_id, COUNT(*) AS n FROM visits GROUP BY person_id) t "
                "GROUP BY n", demo_schema)
    assert [key for (key,) in rows.domain] == list(range(1, 11))  # (the fixture declares 10 visits a person)
    values = plan("SELECT n, COUNT(*) FROM (SELECT p.person_id, COUNT(v.visit_id) AS n FROM people p LEFT JOIN "
                  "visits v ON v.person_id = p.person_id GROUP BY p.person_id) t GROUP BY n", demo_schema)
    assert [key for (key,) in values.domain][0] == 0


@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT n, COUNT(*) FROM (SELECT category, COUNT(*) AS n FROM visits GROUP BY category) t GROUP BY n",
     "must GROUP BY the privacy unit alone"),
    ("SELECT COUNT(*) FROM (SELECT person_id, COUNT(*) AS n FROM visits GROUP BY person_id ORDER BY n DESC LIMIT 9) t",
     "may not have HAVING, ORDER BY or LIMIT"),
    ("SELECT COUNT(*) FROM (SELECT day, COUNT(*) AS n FROM visits GROUP BY day) t "
     "JOIN visits v ON v.day = t.day", "must GROUP BY the privacy unit alone"),  # other units' rows, joined
    ("SELECT AVG(v) FROM (SELECT person_id, VARIANCE(amount) AS v FROM visits GROUP BY person_id) t",
     "use COUNT, SUM, AVG, MIN or MAX"),
])
def test_per_unit_subqueries_must_group_by_the_unit(demo_schema, sql, message):
    with pytest.raises(errors.UnsupportedQuery) as caught:
        plan(sql, demo_schema)
    assert message in str(caught.value)


def test_public_tables_may_join_through_other_public_tables():
    from dpsql.schema import parse_schema
    schema = parse_schema({
        "privacy": {"unit": "people.person_id"},
        "tables": {"people": {"columns": {"person_id": "bigint", "state": "text"}},
                   "states": {"public": True, "columns": {"code": {"type": "text", "unique": True},
                                                          "region": "text"}},
                   "regions": {"public": True, "columns": {"name": {"type": "text", "max_frequency": 3},
                                                           "zone": "text"}}}})
    p = plan("SELECT r.zone, COUNT(*) FROM people p JOIN states s ON s.code = p.state "
             "JOIN regions r ON r.name = s.region GROUP BY r.zone", schema)
    assert p.rows_per_unit == 3  # one state per person, up to 3 rows of regions per name
    with pytest.raises(errors.UnsupportedQuery, match="regions must be joined"):
        plan("SELECT COUNT(*) FROM people p, states s, regions r WHERE s.code = p.state", schema)


@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT COUNT(*) FROM visits v CROSS JOIN people p", "CROSS JOIN is not supported"),
    ("SELECT COUNT(*) FROM visits v, people p", "must be joined on their unit columns"),
    ("SELECT COUNT(*) FROM visits v JOIN people p ON v.person_id > p.person_id", "must be joined on their unit"),
    ("SELECT COUNT(*) FROM visits v JOIN people p ON v.person_id = p.age * 2", "must be joined on their unit"),
    ("SELECT COUNT(*) FROM visits v JOIN states s ON s.name = v.category", "has no declared max_frequency"),
    ("SELECT COUNT(*) FROM people p JOIN states s ON s.code = p.state OR s.name = p.state",
     "must be joined on an equality"),
])
def test_joins_dpsql_cannot_bound_are_refused_with_the_reason(demo_schema, sql, message):
    with pytest.raises(errors.UnsupportedQuery) as caught:
        plan(sql, demo_schema)
    assert message in str(caught.value) and caught.value.hint


# --- row-level privacy: FLEX's stability on declared, enforced frequencies ---------------------------------

def test_flex_worked_numbers():
    """FLEX's definitions at distance 0 (each table's own stability 1)."""
    from dpsql.analysis.stability import base, join
    a = base("a", "a", 1, {"k": 100, "c": 100})
    b = base("b", "b", 1, {"k": 250})
    assert join(a, b, "a.k", "b.k").stability == 250
    # two nested joins: frequencies 100 (a.k) and 5 (b.k) give a relation of stability 100 whose column a.c
    # (frequency 100) now repeats 100·5 times; joining that on a key of frequency 250 gives 250 · 100
    inner = join(a, base("b", "b", 1, {"k": 5}), "a.k", "b.k")
    assert inner.stability == 100 and inner.frequency("a.c") == 500
    assert join(inner, base("c", "c", 1, {"k": 250}), "a.c", "c.k").stability == 25000
    # a self-join on a key of frequency 1: mf·S + mf·S + S·S
    assert join(base("t", "t1", 1, {"id": 1}), base("t", "t2", 1, {"id": 1}), "t1.id", "t2.id").stability == 3
    # a public table changes nothing itself; a private row meets at most its key frequency of public rows
    assert join(a, base("p", "p", 0, {"k": 7}), "a.k", "p.k").stability == 7


ROW_LEVEL_SCHEMA = {
    "privacy": {"unit": "row"},
    "tables": {
        "a": {"columns": {"id": "bigint", "k": {"type": "bigint", "max_frequency": 100},
                          "c": {"type": "bigint", "max_frequency": 100}, "x": "bigint",
                          "v": {"type": "double precision", "lower": 0, "upper": 10}}},
        "b": {"columns": {"id": "bigint", "k": {"type": "bigint", "max_frequency": 250}, "x": "bigint"}},
        "c": {"columns": {"k": {"type": "bigint", "max_frequency": 250}}},
        "d": {"columns": {"k": {"type": "bigint", "max_frequency": 5}}},
    },
}
ROW_UNIQUE = frozenset({("a", "id"), ("b", "id")})


@pytest.fixture(scope="module")
def row_schema():
    from dpsql.schema import parse_schema
    return parse_schema(ROW_LEVEL_SCHEMA)


def row_plan(sql: str, schema):
    return analyze(check_query(sql, schema), schema, ROW_UNIQUE)


def test_row_level_join_stability_end_to_end(row_schema):
    """The same numbers through the analyzer. A self-join on a key a unique constraint guarantees needs no
    truncation: 3. Truncated keys cost a factor of 2 over FLEX's figures: an added row can push out one kept row
    of its key, and the rows it displaced join too."""
    p = row_plan("SELECT COUNT(*) FROM a a1 JOIN a a2 ON a1.id = a2.id", row_schema)
    assert p.stability == 3 and p.truncate == {} and p.measures[0].sensitivity == 3
    p = row_plan("SELECT COUNT(*), SUM(a.v) FROM a JOIN b ON a.k = b.k", row_schema)
    assert p.stability == 2 * 250 and p.truncate == {"a": (("k", 100),), "b": (("k", 250),)}
    assert [m.sensitivity for m in p.measures] == [500, 5000]
    p = row_plan("SELECT COUNT(*) FROM a JOIN d ON a.k = d.k JOIN c ON a.c = c.k", row_schema)
    assert p.stability == 250 * (2 * 100)  # a's own stability is 1 + 2 truncated keys = 3; d's is 2
    assert any("stability" in n for n in p.notes)
    # of several equalities, the one giving the smallest bound is used
    # and only the keys the chosen bounds rely on are truncated: a.k = b.k still filters rows, unenforced
    p = row_plan("SELECT COUNT(*) FROM a JOIN b ON a.id = b.id AND a.k = b.k", row_schema)
    assert p.stability == 1 and p.truncate == {}
    assert any("on a.id = b.id" in n for n in p.notes)
    p = row_plan("SELECT COUNT(*) FROM a JOIN b ON a.k = b.k AND a.c = b.x", row_schema)  # b.x: no frequency
    assert p.stability == 2 * 250 and p.truncate == {"a": (("k", 100),), "b": (("k", 250),)}


def test_row_level_semijoins_and_grouped_subqueries(row_schema):
    p = row_plan("SELECT COUNT(*) FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.id = a.id)", row_schema)
    assert p.stability == 1
    p = row_plan("SELECT COUNT(*) FROM a WHERE a.k IN (SELECT k FROM b)", row_schema)
    assert p.stability == 100  # one b row flips the condition of up to 100 a rows (b itself is not truncated)
    # TPC-H Q13's shape: a changed b row changes one group's count (rows it displaces share its key, the group
    # key); the table of groups loses that row and gains it with the new count: stability 2, 251 public bins
    p = row_plan("SELECT n, COUNT(*) FROM (SELECT a.id, COUNT(b.id) AS n FROM a LEFT JOIN b ON b.k = a.id "
                 "GROUP BY a.id) t GROUP BY n", row_schema)
    assert p.stability == 2 and len(p.domain) == 251
    p = row_plan("SELECT COUNT(DISTINCT b.x) FROM a JOIN b ON a.id = b.id", row_schema)
    assert p.measures[0].kind == "distinct" and p.measures[0].sensitivity == 1


@pytest.mark.parametrize("sql, message", [
    ("SELECT COUNT(*) FROM a CROSS JOIN b", "CROSS JOIN is not supported"),
    ("SELECT COUNT(*) FROM a, b", "not joined on an equality of columns: a cross join"),
    ("SELECT COUNT(*) FROM a JOIN b ON a.v < b.k", "not joined on an equality"),
    ("SELECT COUNT(*) FROM a JOIN b ON a.v + 1 = b.k", "not joined on an equality"),
    ("SELECT COUNT(*) FROM a JOIN b ON a.x = b.x", "has no declared max_frequency"),
    ("SELECT COUNT(*) FROM a JOIN b ON a.k = b.k OR a.id = b.id", "not joined on an equality"),
    ("SELECT COUNT(*) FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k > 3)", "not tied to the outer row"),
    ("SELECT COUNT(*) FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.x = a.x)", "not tied to the outer row"),
    ("SELECT COUNT(*) FROM a WHERE EXISTS (SELECT 1 FROM b JOIN c ON c.k = b.k WHERE b.id = a.id)", "one table"),
    ("SELECT AVG(n) FROM (SELECT a.x, COUNT(*) AS n FROM a GROUP BY a.x) t", "max_frequency"),
])
def test_row_level_joins_dpsql_cannot_bound_are_refused(row_schema, sql, message):
    with pytest.raises((errors.UnsupportedQuery, errors.PrivacyRefusal), match=message) as refused:
        row_plan(sql, row_schema)
    assert refused.value.hint or "not supported" in str(refused.value)


@pytest.mark.parametrize(("key", "values"), [
    ("age / 10", list(range(11))),
    ("age / 10 * 10", list(range(0, 101, 10))),
    ("floor(age / 10) * 10 + 5", list(range(5, 106, 10))),
    ("floor(income / 50000) * 50000", list(range(0, 250001, 50000))),
    ("(age - 50) / 20", [-2, -1, 0, 1, 2]),
])
def test_integer_key_domains_keep_their_step(demo_schema, key, values):
    plan = analyze(check_query(f"SELECT {key} AS k, COUNT(*) FROM people GROUP BY 1", demo_schema), demo_schema,
                   PARENT_UNIQUE)
    assert sorted(v for (v,) in plan.domain) == values


@pytest.mark.parametrize(("expr", "sensitivity"), [("age / 10", 10), ("age / -3", 33), ("(age - 50) / 7", 7),
                                                   ("age / (age + 1)", 100)])
def test_an_integer_quotient_is_bounded_by_its_truncated_corners(demo_schema, expr, sensitivity):
    plan = analyze(check_query(f"SELECT SUM({expr}) FROM people", demo_schema), demo_schema, PARENT_UNIQUE)
    assert [m.sensitivity for m in plan.measures] == [sensitivity]


def test_quantiles_alone_read_only_their_histograms(demo_schema):
    assert not plan("SELECT MIN(age), MAX(age), percentile_cont(0.5) WITHIN GROUP (ORDER BY age) FROM people",
                    demo_schema).needs_statistics
    assert not plan("SELECT sex, MAX(age) FROM people GROUP BY sex", demo_schema).needs_statistics  # public keys
    assert plan("SELECT state, MAX(age) FROM people GROUP BY state", demo_schema).needs_statistics  # selection
    assert plan("SELECT MAX(age), COUNT(*) FROM people", demo_schema).needs_statistics


def test_hints_show_a_query_of_the_analysts_own_schema():
    """A clinic's analysts are not shown the demo's tables: the hint's example is a query their schema answers,
    and a table bounded to one row per unit says "1 row"."""
    from dpsql.schema import parse_schema

    clinic = parse_schema({
        "privacy": {"unit": "patients.patient_id"},
        "tables": {"patients": {"columns": {"patient_id": "bigint", "region": {"type": "text"}}},
                   "appointments": {"unit_column": "patient_id", "max_rows_per_unit": 1,
                                    "columns": {"patient_id": "bigint",
                                                "kind": {"type": "text", "domain": ["new", "follow-up"]}}}}})
    with pytest.raises(errors.PrivacyRefusal) as caught:
        analyze(check_query("SELECT * FROM appointments", clinic), clinic, frozenset())
    assert caught.value.hint.endswith("SELECT kind, COUNT(*) FROM appointments GROUP BY kind")
    assert "people" not in caught.value.hint
    notes = analyze(check_query("SELECT COUNT(*) FROM appointments", clinic), clinic, frozenset()).notes
    assert any("at most 1 row per unit (declared)" in note for note in notes)
    bare = parse_schema({"privacy": {"unit": "patients.patient_id"},
                         "tables": {"patients": {"columns": {"patient_id": "bigint"}}}})
    assert bare.example_query() == "SELECT COUNT(*) FROM patients"
