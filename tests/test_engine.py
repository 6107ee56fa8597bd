"""The engine end to end on a real PostgreSQL: refusals, budget, cache, released groups, accuracy."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from dpsql import errors
from dpsql.config import Settings
from dpsql.engine import Engine
from dpsql.schema import load_schema, parse_schema
from tests.conftest import DEMO_SCHEMA, PEOPLE


@pytest.fixture
def backend_calls(engine, monkeypatch):
    """Counts the statements the engine sends to PostgreSQL (the real backend still runs them)."""
    from dpsql.backends.postgres import BackendSession

    calls: list[str] = []
    real = BackendSession.run

    def counting(session, sql: str, work_mem: str | None = None):
        calls.append(sql)
        return real(session, sql, work_mem)

    monkeypatch.setattr(BackendSession, "run", counting)
    return calls


REFUSALS = [
    ("SELECT COUNT(*) FROM people; SELECT COUNT(*) FROM visits", errors.PrivacyRefusal, "42501"),
    ("SELECT COUNT(*) INTO stolen FROM people", errors.PrivacyRefusal, "42501"),
    ("WITH d AS (DELETE FROM people RETURNING *) SELECT COUNT(*) FROM d", errors.PrivacyRefusal, "42501"),
    ("WITH u AS (UPDATE people SET age = 0 RETURNING *) SELECT COUNT(*) FROM u", errors.PrivacyRefusal, "42501"),
    ("SELECT COUNT(*) FROM people FOR UPDATE", errors.PrivacyRefusal, "42501"),
    ("SELECT age FROM people", errors.PrivacyRefusal, "42501"),
    ("SELECT * FROM people LIMIT 200", errors.PrivacyRefusal, "42501"),
    ("SELECT COUNT(*), income FROM people", errors.PrivacyRefusal, "42501"),
    ("DELETE FROM people", errors.PrivacyRefusal, "42501"),
    ("EXPLAIN SELECT COUNT(*) FROM people", errors.PrivacyRefusal, "42501"),
    ("SELECT COUNT(*) FROM pg_catalog.pg_stats", errors.PrivacyRefusal, "42501"),
    ("SELECT COUNT(*) FROM people WHERE pg_sleep(1) IS NULL", errors.UnsupportedQuery, "0A000"),
    ("SELECT COUNT(*) FROM people WHERE random() < 0.5", errors.UnsupportedQuery, "0A000"),
    ("SELECT query_to_xml('select * from people', true, true, '')", errors.UnsupportedQuery, "0A000"),
    ("SELECT COUNT(*) FROM people WHERE current_setting('is_superuser') = 'on'", errors.UnsupportedQuery, "0A000"),
    ("SELECT SUM(amount) FILTER (WHERE random() < 0.5) FROM visits", errors.UnsupportedQuery, "0A000"),
    ("SELECT MAX(person_id) FROM people", errors.UnsupportedQuery, "0A000"),
    ("SELECT SUM(person_id) FROM people", errors.UnsupportedQuery, "0A000"),
    ("SELECT COUNT(*) FROM people WHERE income * income * income > 0", errors.UnsupportedQuery, "0A000"),
    ("SELECT COUNT(*) FROM people WHERE CAST(state AS integer) = 1", errors.UnsupportedQuery, "0A000"),
    ("SELECT COUNT(DISTINCT visit_id, drug) FROM prescriptions", errors.UnsupportedQuery, "0A000"),
    ("SELECT COUNT(*) FROM people p JOIN visits v ON p.age = v.amount", errors.UnsupportedQuery, "0A000"),
    ("SELECT COUNT(*) FROM people CROSS JOIN visits", errors.UnsupportedQuery, "0A000"),
    ("SELECT COUNT(*) FROM people INTERSECT SELECT COUNT(*) FROM visits", errors.UnsupportedQuery, "0A000"),
    ("SELECT COUNT(*) FROM salaries", errors.UnknownObject, "42P01"),
    ("SELECT COUNT(secret) FROM people", errors.UnknownColumn, "42703"),
    ("SELEKT COUNT(*) FROM people", errors.QuerySyntaxError, "42601"),
    ("", errors.QuerySyntaxError, "42601"),
]


@pytest.mark.parametrize("sql,error,sqlstate", REFUSALS)
def test_refusals_run_nothing_and_spend_nothing(engine, analyst, backend_calls, sql, error, sqlstate):
    before = engine.budget(analyst)
    with pytest.raises(error) as caught:
        engine.query(sql, analyst=analyst)
    assert caught.value.sqlstate == sqlstate
    assert caught.value.code.startswith("DP")
    assert backend_calls == []
    assert engine.budget(analyst) == before


@pytest.mark.parametrize("epsilon", [0, -1, math.nan, math.inf, "abc", 11])
def test_bad_epsilon_is_refused(engine, analyst, backend_calls, epsilon):
    with pytest.raises(errors.InvalidParameter):
        engine.query("SELECT COUNT(*) FROM people", analyst=analyst, epsilon=epsilon)
    assert backend_calls == []


def test_count_is_charged_exactly_epsilon_with_scale_one_over_epsilon(engine, analyst):
    answer = engine.query("SELECT COUNT(*) FROM people", analyst=analyst, epsilon=0.25)
    assert answer.epsilon == pytest.approx(0.25, rel=1e-12) and answer.delta == 0
    assert answer.accuracy[0][0].scale == pytest.approx(4.0)
    assert engine.budget(analyst).epsilon_spent == pytest.approx(0.25)
    (count,), = answer.rows
    assert isinstance(count, int) and abs(count - PEOPLE) < 200


def test_cache_returns_the_same_answer_for_free(engine, analyst, backend_calls):
    sql = "SELECT sex, AVG(income) FROM people WHERE age > %s GROUP BY sex"
    first = engine.query(sql, (30,), analyst=analyst, epsilon=0.5)
    spent = engine.budget(analyst).epsilon_spent
    again = engine.query("select SEX, avg(INCOME) from PEOPLE where AGE > %s group by SEX", (30,),
                         analyst=analyst, epsilon=0.5)
    assert again.cached and again.rows == first.rows and again.epsilon == 0
    assert engine.budget(analyst).epsilon_spent == spent
    assert len(backend_calls) == 1
    other = engine.query(sql, (31,), analyst=analyst, epsilon=0.5)  # parameters are part of the key
    assert not other.cached
    more = engine.query(sql, (30,), analyst=analyst, epsilon=0.6)  # so is ε
    assert not more.cached


def test_cache_survives_a_restart(engine, analyst, base_url, demo_schema):
    first = engine.query("SELECT COUNT(*), SUM(amount) FROM visits", analyst=analyst)
    restarted = Engine(Settings(database=base_url), demo_schema)
    try:
        again = restarted.query("SELECT COUNT(*), SUM(amount) FROM visits", analyst=analyst)
    finally:
        restarted.close()
    assert again.cached and again.rows == first.rows


def test_exhausted_budget_runs_nothing(engine, backend_calls):
    engine.ledger.add_analyst("frugal", 1.0, 0.0)
    engine.query("SELECT COUNT(*) FROM people", analyst="frugal", epsilon=0.6)
    with pytest.raises(errors.BudgetExhausted) as caught:
        engine.query("SELECT COUNT(*) FROM visits", analyst="frugal", epsilon=0.6)
    assert caught.value.sqlstate == "53400" and "0.4" in caught.value.message
    assert len(backend_calls) == 1
    with pytest.raises(errors.BudgetExhausted):  # δ is a budget too
        engine.query("SELECT state, COUNT(*) FROM people GROUP BY state", analyst="frugal", epsilon=0.1)
    assert engine.budget("frugal").epsilon_spent == pytest.approx(0.6)


def test_concurrent_queries_never_overspend(engine):
    engine.ledger.add_analyst("crowd", 10.0, 0.0)
    queries = [f"SELECT COUNT(*) FROM people WHERE age > {i}" for i in range(60)]

    def ask(sql: str) -> str:
        try:
            engine.query(sql, analyst="crowd", epsilon=0.5)
            return "ok"
        except errors.BudgetExhausted:
            return "refused"

    with ThreadPoolExecutor(max_workers=16) as pool:
        outcomes = list(pool.map(ask, queries))
    assert outcomes.count("ok") == 20 and outcomes.count("refused") == 40
    budget = engine.budget("crowd")
    assert budget.epsilon_spent == pytest.approx(10.0)


def test_a_schema_the_database_stopped_matching_is_refused_before_any_charge(base_url):
    """A column dropped after the engine started (its catalog check passed) fails whatever the data: PostgreSQL's
    planner says so (EXPLAIN, no row read), and the query is refused before its charge, without PostgreSQL's
    text."""
    with psycopg.connect(base_url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS ghosted; CREATE TABLE ghosted (person_id bigint PRIMARY KEY "
                     "REFERENCES people (person_id), ghost integer)")
    broken = _one_column_schema("ghosted", "ghost", {"type": "integer", "lower": 0, "upper": 9})
    eng = Engine(Settings(database=base_url), broken)
    try:
        with psycopg.connect(base_url, autocommit=True) as conn:
            conn.execute("ALTER TABLE ghosted DROP COLUMN ghost")
        eng.ledger.add_analyst("unlucky", 5.0, 0.0)
        with pytest.raises(errors.SchemaError) as caught:
            eng.query("SELECT SUM(ghost) FROM ghosted", analyst="unlucky", epsilon=1.0)
        assert "ghost" not in str(caught.value) and "does not exist" not in str(caught.value)
        assert "42703" in str(caught.value) and eng.budget("unlucky").epsilon_spent == 0.0
    finally:
        eng.close()
        with psycopg.connect(base_url, autocommit=True) as conn:
            conn.execute("DROP TABLE ghosted")


def test_a_rewrite_that_reads_a_name_it_did_not_make_is_a_dpsql_bug_not_a_schema_mismatch(base_url):
    """PostgreSQL says the same (42703) for a column the database lacks and for a column the rewrite forgot to
    make (`m0`, `g1`, `dpsql_rows`): the first is the schema's mismatch (DP010), the second dpsql's bug (DP905).
    COUNT(v.*) under USING was reported as a mismatch."""
    from dpsql.sql.dialect import Statement

    eng = Engine(Settings(database=base_url), load_schema(DEMO_SCHEMA))
    try:
        with pytest.raises(errors.InternalError, match="a name it did not make") as caught:
            eng.backend.check(Statement.parse("SELECT m0 FROM visits"))
        assert "bug" in caught.value.hint and "m0" not in str(caught.value)
        with pytest.raises(errors.SchemaError, match="does not match the privacy schema"):
            eng.backend.check(Statement.parse("SELECT no_such_column FROM visits"))
    finally:
        eng.close()


def _one_column_schema(table: str, column: str, declared: dict):
    """People, and `table` of one row per person with one declared `column`."""
    return parse_schema({
        "privacy": {"unit": "people.person_id"},
        "tables": {"people": {"columns": {"person_id": "bigint"}},
                   table: {"unit_column": "person_id", "max_rows_per_unit": 1,
                           "columns": {"person_id": "bigint", column: declared}}},
    })


def test_a_column_whose_type_changed_is_refused_as_types_that_do_not_fit(base_url):
    """A column the schema declares a date but the database now holds as an integer: PostgreSQL cannot plan the
    rewritten comparison (a type error, not a missing object), so the refusal says the types do not fit and
    where to look, before any charge."""
    with psycopg.connect(base_url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS retyped; CREATE TABLE retyped (person_id bigint PRIMARY KEY "
                     "REFERENCES people (person_id), d date)")
    schema = _one_column_schema("retyped", "d", {"type": "date", "lower": "2024-01-01", "upper": "2024-12-31"})
    eng = Engine(Settings(database=base_url), schema)
    try:
        with psycopg.connect(base_url, autocommit=True) as conn:
            conn.execute("ALTER TABLE retyped ALTER COLUMN d TYPE integer USING 0")
        eng.ledger.add_analyst("retyped", 5.0, 0.0)
        with pytest.raises(errors.SchemaError, match="as dpsql rewrote it .*types that do not fit") as caught:
            eng.query("SELECT COUNT(*) FROM retyped WHERE d > DATE '2024-06-01'", analyst="retyped", epsilon=1.0)
        assert "declares each column's type" in caught.value.hint and eng.budget("retyped").epsilon_spent == 0.0
    finally:
        eng.close()
        with psycopg.connect(base_url, autocommit=True) as conn:
            conn.execute("DROP TABLE retyped")


@pytest.mark.parametrize(("condition", "sqlstate", "constant"), [
    ("day >= '2024-13-01'", "22008", "'2024-13-01'"),
    ("age > 'abc'", "22P02", "'abc'"),
    ("category = 'it''s' AND day = '2024-02-30'", "22008", "'2024-02-30'"),
    ("age = 1 / 0", "22012", "1 / 0"),  # the rewrite's NULLIF(0, 0) answered it, charged, where PostgreSQL fails
    ("age % 0 = 1", "22012", "age % 0"),
    ("day > DATE '2024-06-01' - INTERVAL '1 fortnight'", "22007", "FORTNIGHT"),  # refused as "not supported"
    ("day > DATE '2024-06-01' - '2 blorps'::interval", "22007", "2 blorps"),
])
def test_a_constant_postgresql_cannot_read_is_refused_before_any_charge(engine, analyst, condition, sqlstate,
                                                                        constant):
    """Such a constant fails on every database: PostgreSQL's SQLSTATE, the constant named, nothing charged (it was
    charged and reported as a timeout, DP008)."""
    table = "visits" if "day" in condition else "people"
    with pytest.raises(errors.InvalidConstant) as caught:
        engine.query(f"SELECT COUNT(*) FROM {table} WHERE {condition}", analyst=analyst, epsilon=1.0)
    assert caught.value.sqlstate == sqlstate and constant in str(caught.value)
    assert engine.budget(analyst).epsilon_spent == 0.0


def test_a_noisy_value_divided_by_zero_fails_as_postgresql_s_before_any_charge(engine, analyst):
    """`COUNT(*) / 0` came back NULL (post-processing divides by NULLIF(0, 0)) and was charged; PostgreSQL fails."""
    with pytest.raises(errors.InvalidConstant, match="division by zero") as caught:
        engine.query("SELECT category, SUM(amount) / 0.0 FROM visits GROUP BY 1", analyst=analyst, epsilon=1.0)
    assert caught.value.sqlstate == "22012" and engine.budget(analyst).epsilon_spent == 0.0


def test_declared_domain_releases_every_key_and_nothing_else(engine, analyst):
    answer = engine.query("SELECT category, COUNT(*) FROM visits WHERE amount > 100 GROUP BY category",
                          analyst=analyst)
    categories = [row[0] for row in answer.rows]
    assert sorted(categories) == sorted(load_schema(DEMO_SCHEMA).tables["visits"].columns["category"].domain)
    # a condition on the key itself narrows the domain to what it admits (tests/test_privacy_round3.py)
    lab = engine.query("SELECT category, COUNT(*) FROM visits WHERE category = 'lab' GROUP BY category",
                       analyst=analyst)
    assert [row[0] for row in lab.rows] == ["lab"]


def test_date_trunc_periods_are_released_in_the_backends_zone(engine, analyst, base_url):
    sql = ("SELECT date_trunc('month', day) AS m, COUNT(*) FROM visits WHERE day >= '2024-10-01' GROUP BY 1 "
           "ORDER BY 1")
    answer = engine.query(sql, analyst=analyst, epsilon=1.0)
    with psycopg.connect(base_url) as conn:
        exact = conn.execute(sql).fetchall()
    assert [row[0] for row in answer.rows] == [row[0] for row in exact] and len(exact) == 3
    assert answer.delta == 0  # no partition selection: the periods are public
    assert all(abs(a[1] - e[1]) <= max(0.2 * e[1], 30) for a, e in zip(answer.rows, exact, strict=True))


def test_private_keys_go_through_partition_selection(engine, analyst):
    answer = engine.query("SELECT state, COUNT(*) AS n FROM people GROUP BY state ORDER BY n DESC",
                          analyst=analyst, epsilon=1.0)
    assert answer.delta == pytest.approx(1e-6)
    states = [row[0] for row in answer.rows]
    assert states[0] == "CA"  # the skewed distribution's top state
    assert len(states) < 50  # rare states (a handful of people) are not released


def test_having_order_limit_and_expressions_run_on_noisy_values(engine, analyst):
    answer = engine.query(
        "SELECT width_bucket(age, 0, 100, 10) AS band, COUNT(*) AS n, ROUND(AVG(income) / 1000, 1) AS k "
        "FROM people GROUP BY band HAVING COUNT(*) > 100 ORDER BY n DESC LIMIT 3", analyst=analyst, epsilon=2.0)
    assert answer.names == ["band", "n", "k"]
    assert answer.types == ["int8", "int8", "float8"]
    counts = [row[1] for row in answer.rows]
    assert len(counts) == 3 and counts == sorted(counts, reverse=True) and min(counts) > 100
    for row in answer.accuracy:
        assert row[0] is None  # a public key: exact
        assert row[1].scale is not None and row[1].ci_low <= row[1].ci_high
        assert row[2].scale is None and row[2].ci_low <= row[2].ci_high  # simulated interval


def test_accuracy_is_plausible(engine, analyst):
    answer = engine.query("SELECT AVG(age), SUM(amount) FROM visits v JOIN people p ON v.person_id = p.person_id",
                          analyst=analyst, epsilon=5.0)
    (avg_age, total), = answer.rows
    assert 30 < avg_age < 55
    lo, hi = answer.accuracy[0][0].ci_low, answer.accuracy[0][0].ci_high
    assert lo <= avg_age <= hi


def test_quantiles_through_the_exponential_mechanism(engine, analyst):
    answer = engine.query("SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY age) AS median_age, MIN(age), "
                          "MAX(income) FROM people", analyst=analyst, epsilon=3.0)
    assert answer.names == ["median_age", "min", "max"]
    assert answer.types == ["float8", "int8", "float8"]  # as PostgreSQL: percentile_cont interpolates
    (median, low, high), = answer.rows
    assert 30 <= median <= 50 and 0 <= low <= 15 and 200_000 <= high <= 250_000
    assert all(a.rank_error is not None and a.scale is None for a in answer.accuracy[0])
    assert answer.epsilon == pytest.approx(3.0)


def test_a_histogram_counts_null_values_in_no_cell(engine, base_url):
    """PostgreSQL's percentiles skip NULLs. A histogram's cell was clamped with LEAST, which skips a NULL too, so
    every NULL value was counted in the top cell, as if it were the range's upper bound."""
    sql = "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY CASE WHEN sex = 'F' THEN income END) FROM people"
    prepared = engine.prepare(sql)
    (histogram,) = prepared.plan.histograms
    with psycopg.connect(base_url) as conn:
        cells = conn.execute(prepared.rewritten.histograms[histogram.name]).fetchall()
        women, = conn.execute("SELECT COUNT(*) FROM people WHERE sex = 'F' AND income IS NOT NULL").fetchone()
    assert sum(count for _, count in cells) == women  # the men's NULLs counted nowhere


def test_a_real_value_s_cell_is_within_about_one_percent_of_it_and_never_coarser_than_twice_an_even_grid(
        base_url):
    """The graded grid of real values, as the backend lays it: a value's cell reports within 0.6% of it above a
    hundredth of the range's top (an even grid of 1,000 cells over a cap of 1,000 reported the median cost, 20,
    as 20.5), and within two even cells of 2,000 anywhere, the ends and zero included."""
    from sqlglot import exp

    from dpsql.analysis.plan import GradedGrid, Histogram
    from dpsql.analysis.quantiles import GRADED_CELLS, _even_cells
    from dpsql.sql import to_sql

    for lo, hi in ((0.0, 1000.0), (-50.0, 200.0), (1000.0, 1001.0)):
        grid = GradedGrid.over(lo, hi)
        cell, lower, width = _even_cells(grid.sql(exp.column("v")), grid.position(lo), grid.position(hi),
                                         GRADED_CELLS)
        histogram = Histogram("h0", "v", cell, GRADED_CELLS, lower, width, False, 1, 1, 1.0, graded=grid)
        values = sorted({lo, hi, 0.0 if lo <= 0 <= hi else lo, *(lo + (hi - lo) * f for f in
                         (1e-6, 1e-4, 0.003, 0.0201, 0.05, 0.31, 0.5, 0.77, 0.999999))})
        listed = ", ".join(f"({v!r}::float8)" for v in values)
        with psycopg.connect(base_url) as conn:
            cells = conn.execute(f"SELECT v, {to_sql(cell)} FROM (VALUES {listed}) AS t (v)").fetchall()
        for value, index in cells:
            reported = histogram.value(index)
            assert 0 <= index < GRADED_CELLS and abs(reported - value) <= 2 * (hi - lo) / GRADED_CELLS, (lo, hi, value)
            if abs(value) >= max(abs(lo), abs(hi)) / 100:
                assert abs(reported - value) <= 0.006 * abs(value), (lo, hi, value, reported)


def test_grouped_quantiles(engine, analyst):
    answer = engine.query("SELECT sex, percentile_disc(0.5) WITHIN GROUP (ORDER BY income) FROM people "
                          "GROUP BY sex ORDER BY sex", analyst=analyst, epsilon=2.0)
    assert [row[0] for row in answer.rows] == ["F", "M"]
    assert all(20_000 < row[1] < 90_000 for row in answer.rows)


def test_top_k_keys_are_selected_not_thresholded(engine, analyst):
    """ORDER BY COUNT(*) DESC LIMIT k over private keys, with another statistic beside the count: partition
    selection gives the candidates, the exponential mechanism picks k of them, and only their values are noised."""
    sql = "SELECT state, COUNT(*), AVG(income) FROM people GROUP BY state ORDER BY COUNT(*) DESC LIMIT 3"
    prepared = engine.prepare(sql, epsilon=2.0)
    assert prepared.plan.top_k.k == 3 and prepared.plan.top_k.sensitivity == 1 and prepared.plan.top_k.monotone
    assert prepared.calibration.top_k is not None
    answer = engine.query(sql, analyst=analyst, epsilon=2.0)
    assert [row[0] for row in answer.rows][:1] == ["CA"]  # by far the largest state in the demo data
    assert len(answer.rows) == 3 and answer.epsilon == pytest.approx(2.0)
    counts = [row[1] for row in answer.rows]
    assert counts == sorted(counts, reverse=True)
    assert all(row[0].count_gap is not None and row[1].scale is not None for row in answer.accuracy)


def test_a_top_k_of_counts_that_select_themselves_orders_the_released_counts(engine, analyst):
    """A unit's own table has one row per unit: COUNT(*) per state is a count of units, which selects its own
    groups with all of ε, and ORDER BY ... LIMIT 3 orders and cuts those released counts (post-processing), as
    SmartNoise answers it, instead of peeling at a third of ε and noising the three counts at another third."""
    from dpsql.explain import explain_text

    sql = "SELECT state, COUNT(*) FROM people GROUP BY state ORDER BY COUNT(*) DESC LIMIT 3"
    prepared = engine.prepare(sql, epsilon=2.0)
    cost = prepared.calibration
    (measure,) = prepared.plan.measures
    assert prepared.plan.top_k.k == 3 and cost.top_k is None and cost.selected_by == measure.name
    assert cost.mechanisms[measure.name].scale == pytest.approx(0.5) and cost.epsilon == pytest.approx(2.0)
    assert "ordered and cut to the first 3 (post-processing: free)" in explain_text(prepared)
    answer = engine.query(sql, analyst=analyst, epsilon=2.0)
    assert [row[0] for row in answer.rows][:1] == ["CA"] and len(answer.rows) == 3
    counts = [row[1] for row in answer.rows]
    assert counts == sorted(counts, reverse=True) and all(c >= cost.selection.threshold for c in counts)
    assert all(row[0] is None and row[1].scale == pytest.approx(0.5) for row in answer.accuracy)
    # a person's visits may share a day: COUNT(*) per day moves by up to their rows, and selection keeps its share
    visits = engine.prepare("SELECT day, COUNT(*) FROM visits GROUP BY day ORDER BY 2 DESC LIMIT 3", epsilon=2.0)
    assert visits.calibration.selected_by is None and visits.calibration.top_k is not None


def test_mode_over_a_declared_domain(engine, analyst):
    answer = engine.query("SELECT mode() WITHIN GROUP (ORDER BY category) AS top_category FROM visits",
                          analyst=analyst, epsilon=2.0)
    assert answer.names == ["top_category"] and answer.types == ["text"]
    assert answer.rows == [("checkup",)]  # 25% of visits, the next is 20%: far beyond the count gap
    assert answer.accuracy[0][0].count_gap is not None
    grouped = engine.query("SELECT sex, mode() WITHIN GROUP (ORDER BY age) FROM people GROUP BY sex ORDER BY sex",
                           analyst=analyst, epsilon=2.0)
    assert [r[0] for r in grouped.rows] == ["F", "M"] and grouped.types == ["text", "int8"]
    assert all(0 <= r[1] <= 100 for r in grouped.rows)


def test_mode_needs_declared_values(engine, analyst, backend_calls):
    with pytest.raises(errors.PrivacyRefusal) as caught:
        engine.query("SELECT mode() WITHIN GROUP (ORDER BY state) FROM people", analyst=analyst)
    assert "no declared domain" in str(caught.value) and "ORDER BY COUNT(*) DESC LIMIT 1" in caught.value.hint
    assert backend_calls == []


def test_gaussian_mechanism_charges_both_accounts(engine, analyst):
    from dpsql.session import Options

    sql = "SELECT category, COUNT(*), SUM(amount) FROM visits GROUP BY category"
    laplace = engine.prepare(sql, epsilon=1.0)
    gaussian = engine.prepare(sql, epsilon=1.0, options=Options(mechanism="gaussian"))
    assert gaussian.calibration.mechanism == "gaussian" and gaussian.key != laplace.key
    count = gaussian.plan.measures[0]
    # 10 visits over all categories: L1 = 10, and L2 = 10 too (all of them may fall in one category)
    assert count.sensitivity == 10 and count.l2_sensitivity == pytest.approx(10)
    cost = gaussian.calibration.cost
    assert cost.epsilon == pytest.approx(1.0) and cost.delta == pytest.approx(engine.settings.delta)
    assert cost.rho == pytest.approx(zcdp_rho(1.0, engine.settings.delta), rel=1e-6)
    answer = engine.query(sql, analyst=analyst, options=Options(mechanism="gaussian"))
    assert len(answer.rows) == 8 and answer.delta > 0
    assert all(acc[1].ci_low <= row[1] <= acc[1].ci_high for row, acc in zip(answer.rows, answer.accuracy,
                                                                               strict=True))
    budget = engine.budget(analyst)
    assert budget.rho == pytest.approx(cost.rho) and budget.delta_basic == pytest.approx(cost.delta)


def zcdp_rho(epsilon: float, delta: float) -> float:
    from dpsql.accounting import zcdp

    return zcdp.rho_for(epsilon, delta)


def test_histogram_methods_on_ordered_bins(engine, analyst):
    from dpsql.session import Options

    sql = "SELECT age, COUNT(*) FROM people GROUP BY age ORDER BY age"
    for method in ("noisefirst", "structurefirst"):
        prepared = engine.prepare(sql, epsilon=0.5, options=Options(histogram=method))
        assert prepared.calibration.histogram == method
        answer = engine.query(sql, analyst=analyst, epsilon=0.5, options=Options(histogram=method))
        assert [row[0] for row in answer.rows] == list(range(101))
        assert answer.epsilon == pytest.approx(0.5)
        total = sum(row[1] for row in answer.rows)
        if method == "noisefirst":  # post-processing of plain noisy bins: the total stays close
            assert abs(total - PEOPLE) < 0.2 * PEOPLE
        else:  # StructureFirst clamps counts to a noisy F, which (rarely, by design) cuts the total
            assert 0 < total < 1.2 * PEOPLE
        assert all(a[1].ci_low <= row[1] <= a[1].ci_high for row, a in zip(answer.rows, answer.accuracy,
                                                                             strict=True))
    # not ordered bins: the setting does not apply
    other = engine.prepare("SELECT sex, COUNT(*) FROM people GROUP BY sex", options=Options(histogram="noisefirst"))
    assert other.calibration.histogram == "plain"


def test_a_cancelled_query_stops_in_postgresql(engine):
    import threading
    import time

    from dpsql.backends import Cancellation
    cancellation = Cancellation()
    threading.Timer(0.3, cancellation.cancel).start()
    started = time.monotonic()
    with pytest.raises(errors.QueryCancelled) as caught:
        engine.backend.execute("SELECT pg_sleep(20)", cancellation)
    assert time.monotonic() - started < 10 and caught.value.sqlstate == "57014"
    with pytest.raises(errors.QueryCancelled):  # once cancelled, nothing more starts
        engine.backend.execute("SELECT 1", cancellation)


def test_a_table_reaches_the_unit_through_its_parent(engine, analyst):
    answer = engine.query("SELECT drug, COUNT(*) FROM prescriptions GROUP BY drug", analyst=analyst, epsilon=2.0)
    assert len(answer.rows) == 8  # the declared domain
    assert 0.5 * PEOPLE < sum(row[1] for row in answer.rows) < 3 * PEOPLE
    notes = engine.prepare("SELECT COUNT(*) FROM prescriptions").plan.notes
    assert "dpsql joins visits AS dpsql_parent_1 to reach the unit" in notes


def test_each_count_sum_and_mean_carries_the_least_error_any_mechanism_could_have(engine, analyst):
    """Lower bounds for the query's own sensitivities and (ε, δ), by hand (see test_mechanisms for m₀)."""
    answer = engine.query("SELECT category, COUNT(*) FROM visits GROUP BY category", analyst=analyst, epsilon=1.0)
    for _, accuracy in answer.accuracy:
        # one person moves a category's count by at most k = 10; at ε = 1, m₀ = 3: no mechanism promises < ±10
        assert accuracy.lower_bound == 10.0
        assert accuracy.error_bound == pytest.approx(10 / (2 * (1 + math.e)))
        assert accuracy.optimality_ratio == pytest.approx(3.0, abs=0.05)  # Laplace: ±10·ln 20
    (sums,) = engine.query("SELECT SUM(amount) FROM visits", analyst=analyst, epsilon=1.0).accuracy
    assert sums[0].lower_bound == 10 * 1000.0  # ten visits of at most 1000
    ((mean,),) = engine.query("SELECT AVG(income) FROM people", analyst=analyst, epsilon=1.0).accuracy
    # a count and a centred sum at ε = 0.5 each; replacing a person (two steps: ε 2) moves the mean by 250000/n,
    # and at ε = 2 m₀ = 2 (e^2·0.05 < 0.95 ≤ e^4·0.05): γ ≥ 250000 / (2n) for the released n
    assert 250000 / (2 * (PEOPLE + 60)) <= mean.lower_bound <= 250000 / (2 * (PEOPLE - 60))
    assert mean.optimality_ratio > 1


def test_the_notice_and_explain_show_the_lower_bound(engine):
    from dpsql.explain import explain_text
    from dpsql.postprocess import Accuracy, describe_accuracy

    explained = explain_text(engine.prepare("SELECT COUNT(*) FROM people", epsilon=1.0))
    assert "95% ± 3, where no mechanism with its ε and δ could promise under ±1 for one group (3×)" in explained
    text = describe_accuracy(Accuracy(1.0, 97.0, 103.0, lower_bound=1.0, error_bound=0.13))  # the NOTICE's words
    assert text == "[97, 103] (≥ ±1 for any mechanism at this ε, δ: 3×)"


def test_a_minimum_frequency_in_the_schema_is_a_floor_sessions_can_only_raise(base_url, demo_schema):
    import dataclasses

    import psycopg

    from dpsql.session import Options

    strict = dataclasses.replace(demo_schema, min_frequency=40)
    engine = Engine(Settings(database=base_url), strict)
    try:
        engine.ledger.add_analyst("officer", 10.0, 1e-4)
        assert engine.options(Options(min_frequency=1)).min_frequency == 40
        assert engine.options(Options(min_frequency=100)).min_frequency == 100
        answer = engine.query("SELECT state, COUNT(*) FROM people GROUP BY state", analyst="officer", epsilon=1.0)
        with psycopg.connect(base_url) as conn:
            people = dict(conn.execute("SELECT state, COUNT(*) FROM people GROUP BY state").fetchall())
        assert answer.rows and all(people[state] >= 40 for state, _ in answer.rows)
        sexes = engine.query("SELECT sex, COUNT(*) FROM people WHERE age = 37 GROUP BY sex", analyst="officer")
        assert sexes.rows == []  # declared keys too: about 15 people of each sex are 37
    finally:
        engine.close()


def test_minimum_frequency_and_group_size_are_validated():
    raw = {"privacy": {"unit": "row", "min_frequency": 0, "group_size": "four"},
           "tables": {"t": {"columns": {"x": "integer"}}}}
    with pytest.raises(errors.SchemaError) as caught:
        parse_schema(raw)
    assert "min_frequency = 0 must be a whole number >= 1" in str(caught.value)
    assert "group_size = 'four' must be a whole number >= 1" in str(caught.value)


def test_a_lone_count_of_people_per_private_key_selects_itself_with_all_of_epsilon(engine, analyst):
    """One noisy count of distinct units per group is also its group's selection count (its noise is the
    selection's, one scale): the count gets all of ε instead of half, and the threshold is the selection's."""
    sql = "SELECT p.state, COUNT(DISTINCT v.person_id) FROM visits v JOIN people p ON p.person_id = v.person_id " \
          "GROUP BY p.state"
    prepared = engine.prepare(sql, epsilon=1.0)
    cost = prepared.calibration
    (measure,) = prepared.plan.measures
    assert cost.selected_by == measure.name and cost.epsilon == 1.0 and cost.delta == 1e-6
    assert cost.mechanisms[measure.name].epsilon == pytest.approx(1.0)
    assert cost.selection.scale == cost.mechanisms[measure.name].scale_units
    answer = engine.query(sql, analyst=analyst, epsilon=1.0)
    assert answer.rows and all(count >= cost.selection.threshold for _, count in answer.rows)
    # with anything else released beside it, selection has its own share as before
    assert engine.prepare(sql.replace("COUNT(DISTINCT", "COUNT(*), COUNT(DISTINCT"), epsilon=1.0
                          ).calibration.selected_by is None


def test_without_an_index_on_the_unit_explain_names_one_and_the_statement_hashes_in_memory(server, template,
                                                                                            demo_schema):
    """The demo indexes visits(person_id): the server's work_mem, no hint. Without that index the statement gets
    work_mem of its own (hashing every unit), explain says which index to create, and the answer is the same."""
    import psycopg

    from dpsql.explain import explain_text
    from tests.conftest import copy_database

    sql = "SELECT category, COUNT(*) FROM visits GROUP BY category"
    url = copy_database(server, template, "dpsql_unindexed")
    indexed = Engine(Settings(database=url), demo_schema)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP INDEX visits_person")
    unindexed = Engine(Settings(database=url), demo_schema)
    try:
        with_index, without = indexed.prepare(sql), unindexed.prepare(sql)
        assert with_index.rewritten.work_mem is None and "CREATE INDEX" not in explain_text(with_index)
        assert without.rewritten.work_mem == "64MB"
        assert "CREATE INDEX ON visits (person_id)" in explain_text(without)
        assert sorted(indexed.backend.execute(with_index.rewritten.sql)) == sorted(
            unindexed.backend.execute(without.rewritten.sql))
        with unindexed.backend.session() as session:
            assert session.run_text("SHOW work_mem", "64MB") == [("64MB",)]
            assert session.run_text("SHOW work_mem") != [("64MB",)]  # for that statement alone
    finally:
        indexed.close()
        unindexed.close()
