"""Local differential privacy: the randomizers' exact distributions and guarantees, the estimators' bias and
interval coverage, and queries over locally randomized columns (free when only reports are read, central noise
and de-biasing when private tables are read too, refusals of biased uses)."""

from __future__ import annotations

import math
import random
from collections import Counter
from pathlib import Path

import numpy as np
import psycopg
import pytest
from scipy import stats

from dpsql.errors import PrivacyRefusal, SchemaError, UnsupportedQuery
from dpsql.local import local_spec, randomize, randomizer
from dpsql.mechanisms.local import (
    Grid,
    KaryResponse,
    OptimalObfuscation,
    PlanarLaplace,
    UnaryEncoding,
    estimate_counts,
    randomized_response,
)
from dpsql.schema import parse_schema

SAMPLES = 40_000


def _assert_frequencies(samples: list, probabilities: dict) -> None:
    """Chi-square goodness of fit of samples to the given probabilities (cells under 20 expected pooled)."""
    counts = Counter(samples)
    n = len(samples)
    big = [v for v, p in probabilities.items() if p * n >= 20]
    observed = [counts.get(v, 0) for v in big] + [n - sum(counts.get(v, 0) for v in big)]
    expected = [probabilities[v] * n for v in big] + [n - sum(probabilities[v] * n for v in big)]
    if expected[-1] < 1e-9:
        observed, expected = observed[:-1], expected[:-1]
    for o, e in zip(observed, expected, strict=True):
        assert abs(o - e) <= 5 * math.sqrt(e) + 1, (o, e)
    assert stats.chisquare(observed, expected).pvalue > 1e-4


# --- randomizers ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0])
def test_randomized_response_keeps_with_probability_e_eps_over_one_plus_e_eps(epsilon):
    rr = randomized_response(epsilon)
    keep = math.exp(epsilon) / (1 + math.exp(epsilon))
    assert rr.transition == pytest.approx(np.array([[keep, 1 - keep], [1 - keep, keep]]))
    rng = random.Random(1)
    _assert_frequencies([rr.randomize(True, rng) for _ in range(SAMPLES)], {True: keep, False: 1 - keep})


@pytest.mark.parametrize("epsilon,k", [(1.0, 3), (0.5, 5), (2.0, 8)])
def test_k_ary_response_transition_and_ratio(epsilon, k):
    domain = tuple(f"v{i}" for i in range(k))
    krr = KaryResponse(epsilon, domain)
    keep = math.exp(epsilon) / (math.exp(epsilon) + k - 1)
    other = 1 / (math.exp(epsilon) + k - 1)
    rng = random.Random(2)
    _assert_frequencies([krr.randomize("v1", rng) for _ in range(SAMPLES)],
                        {v: keep if v == "v1" else other for v in domain})
    m = krr.transition
    ratio = (m[:, None, :] / m[None, :, :]).max()  # the largest ratio of two inputs' probabilities of one report
    assert ratio == pytest.approx(math.exp(epsilon)) and ratio <= math.exp(epsilon) * (1 + 1e-12)
    assert np.allclose(m.sum(axis=1), 1)


def test_unary_encoding_bit_probabilities():
    oue = UnaryEncoding(1.0, ("a", "b", "c", "d"))
    rng = random.Random(3)
    reports = [oue.randomize("b", rng) for _ in range(SAMPLES)]
    q = 1 / (math.e + 1)
    for i, p in enumerate([q, 0.5, q, q]):
        ones = sum(r[i] for r in reports)
        assert abs(ones - p * SAMPLES) <= 5 * math.sqrt(SAMPLES * p * (1 - p))
    # values x and x' change only bits x and x': the likeliest report of x over that of x' is (1/2)/q at bit x
    # times (1 - q)/(1/2) at bit x', which is e^ε
    assert (0.5 / q) * ((1 - q) / 0.5) == pytest.approx(math.e)


def test_planar_laplace_radius_is_gamma_two_over_epsilon():
    """Unclipped, the distance moved is Gamma(2, 1/ε): mean 2/ε; the angle is uniform."""
    grid = Grid(-1000, 1000, -1000, 1000, 40.0)  # cells of 40, small beside the mean move of 200
    geo = PlanarLaplace(0.01, grid)
    rng = random.Random(4)
    moves = [np.hypot(*(np.array(grid.centre(geo.randomize((20.0, 20.0), rng))) - 20)) for _ in range(4000)]
    assert np.mean(moves) == pytest.approx(2 / 0.01, rel=0.05)


def test_planar_laplace_on_a_grid_is_epsilon_d_indistinguishable_and_sampled_as_computed():
    grid = Grid(0, 5, 0, 4, 1.0)
    epsilon = 0.7
    geo = PlanarLaplace(epsilon, grid)
    m = geo.transition
    assert np.allclose(m.sum(axis=1), 1, atol=1e-9)
    d = grid.distances
    log_ratio = np.log(m[:, None, :] / m[None, :, :]).max(axis=2)  # over reports, for every pair of cells
    off = d > 0
    assert (log_ratio[off] <= epsilon * d[off] * (1 + 1e-5)).all()
    # the sampler draws exactly the matrix's row (for a person at a cell's centre)
    rng = random.Random(5)
    samples = [geo.randomize(grid.centre(7), rng) for _ in range(SAMPLES)]
    _assert_frequencies(samples, dict(enumerate(m[7])))


def test_optimal_obfuscation_of_two_cells_is_randomized_response():
    """By hand: with two cells at distance 1 and a uniform prior, the LP maximises the diagonal subject to
    a ≤ e^ε(1 - b) and b ≤ e^ε(1 - a), so a = b = e^ε / (1 + e^ε)."""
    lp = OptimalObfuscation(1.0, Grid(0, 2, 0, 1, 1.0))
    keep = math.e / (1 + math.e)
    assert lp.transition == pytest.approx(np.array([[keep, 1 - keep], [1 - keep, keep]]), abs=1e-6)


def test_optimal_obfuscation_satisfies_the_constraint_as_sampled_and_beats_planar_laplace():
    grid, epsilon = Grid(0, 4, 0, 4, 1.0), 0.7
    lp = OptimalObfuscation(epsilon, grid)
    p = lp.weights / lp.weights.sum(axis=1, keepdims=True)  # exactly what randomize draws from
    ratio = p[:, None, :] / p[None, :, :]
    assert (ratio <= np.exp(epsilon * grid.distances)[:, :, None] * (1 + 1e-12)).all()
    assert lp.expected_distance_error() < PlanarLaplace(epsilon, grid).expected_distance_error()
    rng = random.Random(6)
    _assert_frequencies([lp.randomize(grid.centre(5), rng) for _ in range(SAMPLES)], dict(enumerate(p[5])))


def test_invalid_randomizers_are_refused():
    with pytest.raises(ValueError):
        KaryResponse(1.0, ("a",))
    with pytest.raises(ValueError):
        Grid(0, 10, 0, 10, 3.0)  # not a whole number of steps
    with pytest.raises(ValueError):
        OptimalObfuscation(1.0, Grid(0, 10, 0, 10, 1.0))  # too many cells for the LP
    with pytest.raises(ValueError):
        randomized_response(0)


# --- estimators -------------------------------------------------------------------------------------------------


def _coverage(true_counts, simulate, estimate, runs: int = 1500) -> tuple[np.ndarray, float]:
    """Mean estimate and the share of 95% intervals covering the truth, over seeded simulations."""
    estimates, covered = [], 0
    for run in range(runs):
        result = estimate(simulate(np.random.default_rng(run)))
        estimates.append(result.counts)
        covered += sum(lo <= t <= hi for (lo, hi), t in zip(result.intervals(), true_counts, strict=True))
    return np.mean(estimates, axis=0), covered / (runs * len(true_counts))


@pytest.mark.parametrize("mechanism", ["krr", "geo", "geo-lp"])
def test_matrix_estimates_are_unbiased_and_their_intervals_cover(mechanism):
    if mechanism == "krr":
        randomizer_ = KaryResponse(1.0, ("a", "b", "c", "d"))
        true = np.array([600, 250, 100, 50])
    else:
        grid = Grid(0, 3, 0, 2, 1.0)
        randomizer_ = PlanarLaplace(1.5, grid) if mechanism == "geo" else OptimalObfuscation(1.5, grid)
        true = np.array([400, 100, 50, 300, 100, 50])
    m = randomizer_.transition

    def simulate(rng):
        return sum(rng.multinomial(n, row) for n, row in zip(true, m, strict=True))

    mean, coverage = _coverage(true, simulate, randomizer_.estimate)
    spread = np.sqrt(randomizer_.estimate(true @ m).variances / 1500)
    assert np.all(np.abs(mean - true) <= 4 * spread + 1e-9), (mean, true)
    assert 0.93 <= coverage <= 0.97


def test_estimates_with_central_noise_cover_both():
    krr = KaryResponse(1.0, ("a", "b", "c"))
    true, scale = np.array([500, 300, 200]), 8.0

    def simulate(rng):
        reported = sum(rng.multinomial(n, row) for n, row in zip(true, krr.transition, strict=True))
        return reported + rng.laplace(0, scale, 3)

    mean, coverage = _coverage(true, simulate, lambda c: krr.estimate(c, noise_variance=2 * scale**2))
    assert np.allclose(mean, true, atol=6)
    assert 0.93 <= coverage <= 0.975


def test_a_rate_read_from_de_biased_counts_has_an_interval_that_covers_it(demo_schema):
    """A positivity rate over a private table's randomized-response boolean is the de-biased count of true over
    that of both (`compose`'s outer query over the counts per reported value). The two counts err in opposite
    directions (a report moved from true to false), so their sum is nearly exact and adding up their noise as if
    independent would say too little about the rate; its interval is bounded over both counts' 97.5% intervals
    instead, which holds whatever their dependence. Measured over seeded simulations of the reports and the
    central noise: bias and coverage, in three groups from rare to even."""
    from dpsql.postprocess import Accuracy
    from dpsql.released_rows import aggregate_released
    from dpsql.sql.compose import compose

    outer = compose("SELECT AVG(positive::int) AS rate FROM screenings", None, demo_schema).outer
    rr, scale, z = randomized_response(1.0), 4.0, 1.959963984540054
    transition = rr.transition
    for true in ([60, 1440], [300, 1200], [500, 500]):
        rate, rates, covered = true[1] / sum(true), [], 0
        for run in range(1000):
            rng = np.random.default_rng(run)
            reported = sum(rng.multinomial(n, row) for n, row in zip(true, transition, strict=True))
            estimate = rr.estimate(reported + rng.laplace(0, scale, 2), noise_variance=2 * scale**2)
            rows = list(zip(rr.inputs, estimate.counts.tolist(), strict=True))
            accuracy = [(None, Accuracy(None, n - w, n + w, halfwidth=w))
                        for n, w in zip(estimate.counts, z * np.sqrt(estimate.variances), strict=True)]
            (value,), (interval,) = aggregate_released(outer, ["positive", "dpsql_reports"], rows, accuracy)
            rates.append(value[0])
            covered += interval[0].ci_low <= rate <= interval[0].ci_high
        spread = np.std(rates) / math.sqrt(len(rates))
        assert abs(np.mean(rates) - rate) <= 4 * spread, true
        assert 0.95 <= covered / 1000 <= 0.995, (true, covered)


def test_unary_encoding_estimates_are_unbiased_and_cover():
    oue = UnaryEncoding(1.0, ("a", "b", "c", "d", "e"))
    true = np.array([400, 300, 200, 80, 20])
    n = true.sum()

    def simulate(rng):
        return rng.binomial(true, 0.5) + rng.binomial(n - true, oue.q)

    mean, coverage = _coverage(true, simulate, lambda ones: oue.estimate(ones, n))
    assert np.allclose(mean, true, rtol=0.03, atol=5)
    assert 0.93 <= coverage <= 0.97


def test_simplex_estimates_are_counts():
    krr = KaryResponse(0.5, ("a", "b", "c", "d"))
    reported = np.array([200.0, 240, 230, 330])  # its unbiased estimate is negative somewhere
    assert (krr.estimate(reported).counts < 0).any()
    simplex = krr.estimate(reported, simplex=True).counts
    assert (simplex >= 0).all() and simplex.sum() == pytest.approx(reported.sum())


def test_singular_randomization_asks_for_the_simplex():
    matrix = np.array([[0.5, 0.5], [0.5, 0.5]])
    with pytest.raises(ValueError, match="simplex"):
        estimate_counts(matrix, np.array([10.0, 10.0]))
    assert estimate_counts(matrix, np.array([10.0, 10.0]), simplex=True).counts.sum() == pytest.approx(20)


# --- the schema and collection ------------------------------------------------------------------------------------


def test_client_randomize_and_column_specs():
    assert randomize(True, {"mechanism": "rr", "epsilon": 1.0}) in (True, False)
    assert randomize("b", {"mechanism": "krr", "epsilon": 1.0, "domain": ["a", "b", "c"]}) in ("a", "b", "c")
    cell = randomize((3.2, 7.9), {"mechanism": "geo", "epsilon": 0.5, "grid": {"x": [0, 10], "y": [0, 10],
                                                                             "step": 1}})
    assert 0 <= cell < 100
    bits = randomize(2, {"mechanism": "oue", "epsilon": 1.0, "domain": [1, 2, 3]})
    assert len(bits) == 3 and all(isinstance(b, bool) for b in bits)
    with pytest.raises(SchemaError, match="domain"):
        local_spec({"mechanism": "krr", "epsilon": 1.0})


@pytest.mark.parametrize("column,message", [
    ({"type": "text", "local": {"mechanism": "rr", "epsilon": 1}}, "type boolean"),
    ({"type": "boolean", "local": {"mechanism": "rr", "epsilon": 0}}, "epsilon must be a number > 0"),
    ({"type": "boolean", "local": {"mechanism": "coin", "epsilon": 1}}, "must be one of"),
    ({"type": "integer", "local": {"mechanism": "geo", "epsilon": 1}}, "grid must look like"),
    ({"type": "integer", "local": {"mechanism": "geo-lp", "epsilon": 1,
                                   "grid": {"x": [0, 10], "y": [0, 10], "step": 1}}}, "at most 49"),
    ({"type": "boolean[]", "local": {"mechanism": "oue", "epsilon": 1}}, "needs a domain"),
    ({"type": "boolean[]"}, r"boolean\[\] for local"),
    ({"type": "integer", "lower": 0, "upper": 3, "domain": [0, 1, 2, 3], "local": {"mechanism": "krr",
                                                                                   "epsilon": 1}},
     "bounds do not apply"),
])
def test_schema_refuses_bad_local_columns(column, message):
    raw = {"privacy": {"unit": "row"}, "tables": {"t": {"columns": {"c": column}}}}
    with pytest.raises(SchemaError, match=message):
        parse_schema(raw)


# --- queries ------------------------------------------------------------------------------------------------------


def _raw(base_url: str, sql: str) -> list[tuple]:
    with psycopg.connect(base_url) as conn:
        return conn.execute(sql).fetchall()


def test_counts_per_value_of_a_report_column_are_free_and_are_the_estimates(engine, base_url, analyst,
                                                                            demo_schema):
    before = engine.budget(analyst)
    answer = engine.query("SELECT diet, COUNT(*) AS n FROM survey GROUP BY diet", analyst=analyst)
    assert answer.epsilon == 0 and engine.budget(analyst).epsilon_spent == before.epsilon_spent
    krr = randomizer(demo_schema.tables["survey"].columns["diet"].local)
    reported = dict(_raw(base_url, "SELECT diet, COUNT(*) FROM survey GROUP BY diet"))
    expected = krr.estimate([reported.get(v, 0) for v in krr.outputs])
    got = {row[0]: (row[1], acc[1]) for row, acc in zip(answer.rows, answer.accuracy, strict=True)}
    assert set(got) == set(krr.inputs)
    for value, count, (low, high) in zip(krr.inputs, expected.counts, expected.intervals(), strict=True):
        assert got[value][0] == pytest.approx(count)
        assert (got[value][1].ci_low, got[value][1].ci_high) == pytest.approx((low, high))
    assert answer.noisy == [False, True]
    assert "randomization of the reports" in answer.intervals_cover


def test_the_share_of_a_randomized_response_boolean_per_public_group(engine, base_url, analyst):
    answer = engine.query("SELECT region, AVG(smoker::int) AS share, COUNT(*) FROM survey WHERE region <> 'South' "
                          "GROUP BY region HAVING COUNT(*) > 10 ORDER BY region", analyst=analyst)
    raw = _raw(base_url, "SELECT region, COUNT(*), SUM(smoker::int) FROM survey WHERE region <> 'South' "
               "GROUP BY region ORDER BY region")
    keep = math.e / (1 + math.e)
    assert [r[0] for r in answer.rows] == [r[0] for r in raw]
    assert answer.types == ["text", "float8", "int8"]
    for (_, share, count), (_, n, true_reports) in zip(answer.rows, raw, strict=True):
        assert count == n
        assert share == pytest.approx((true_reports / n - (1 - keep)) / (2 * keep - 1))


def test_the_spellings_of_a_count_or_share_of_a_randomized_response_boolean_are_one_estimate(engine, analyst):
    """SUM(CASE WHEN smoker THEN 1 ELSE 0 END), COUNT(*) FILTER (WHERE smoker) and COUNT(CASE WHEN smoker THEN 1
    END) are SUM(smoker::int): the de-biased count of true values, with its interval; NOT smoker counts the false
    ones (the two add up to the reports); AVG(CASE ... ELSE 0 END) averages over every row. An average of a CASE
    without ELSE (1 wherever it is not NULL) is refused."""
    def answered(select: str) -> tuple:
        answer = engine.query(f"SELECT region, {select} FROM survey GROUP BY region ORDER BY region",
                              analyst=analyst)
        assert answer.epsilon == 0 and answer.noisy == [False, True]
        return [v for row, acc in zip(answer.rows, answer.accuracy, strict=True)
                for v in (row[1], acc[1].ci_low, acc[1].ci_high)]  # each region's value and interval

    smokers = answered("SUM(smoker::int)")
    for spelling in ("SUM(CASE WHEN smoker THEN 1 ELSE 0 END)", "COUNT(*) FILTER (WHERE smoker)",
                     "COUNT(CASE WHEN smoker = true THEN 'y' END)", "SUM(CASE WHEN smoker IS TRUE THEN 1 END)"):
        assert answered(spelling) == pytest.approx(smokers), spelling
    others = answered("SUM(CASE WHEN NOT smoker THEN 1 ELSE 0 END)")
    rows = [row[1] for row in engine.query("SELECT region, COUNT(*) FROM survey GROUP BY region ORDER BY region",
                                           analyst=analyst).rows]  # every row holds a report
    assert [a + b for a, b in zip(smokers[::3], others[::3], strict=True)] == pytest.approx(rows)
    shares = answered("AVG(CASE WHEN smoker THEN 1.0 ELSE 0.0 END)")
    assert shares[::3] == pytest.approx([count / n for count, n in zip(smokers[::3], rows, strict=True)])
    with pytest.raises(UnsupportedQuery, match="cannot be estimated"):
        engine.query("SELECT AVG(CASE WHEN smoker THEN 1 END) FROM survey", analyst=analyst)


@pytest.mark.parametrize("where,value", [("smoker", True), ("NOT smoker", False)])
def test_a_count_of_one_reported_value_per_public_group_is_picked_from_the_counts_per_value(engine, analyst,
                                                                                          where, value):
    """GROUP BY public keys with WHERE on the local column: each group's de-biased count of that value, with its
    interval, read from the counts per (key, value); ORDER BY and LIMIT over the picked rows."""
    answer = engine.query(f"SELECT region, COUNT(*) AS n FROM survey WHERE {where} AND region <> 'West' "
                          "GROUP BY 1 ORDER BY n DESC LIMIT 2", analyst=analyst)
    grouped = engine.query("SELECT region, smoker, COUNT(*) FROM survey WHERE region <> 'West' "
                           "GROUP BY region, smoker", analyst=analyst)
    picked = sorted(((row[0], row[2]), acc[2]) for row, acc in zip(grouped.rows, grouped.accuracy, strict=True)
                    if row[1] is value)
    best = sorted(picked, key=lambda p: -p[0][1])[:2]
    assert answer.names == ["region", "n"] and answer.epsilon == 0
    assert [(tuple(row), acc[1]) for row, acc in zip(answer.rows, answer.accuracy, strict=True)] == best


def test_unary_encoded_counts_and_location_cells(engine, analyst):
    symptoms = engine.query("SELECT symptom, COUNT(*) FROM survey GROUP BY symptom", analyst=analyst)
    assert [r[0] for r in symptoms.rows] == ["cough", "fatigue", "fever", "headache", "none"]
    cells = engine.query("SELECT cell, COUNT(*) AS c FROM checkins GROUP BY cell ORDER BY c DESC LIMIT 3",
                         analyst=analyst)
    assert len(cells.rows) == 3 and cells.rows[0][1] >= cells.rows[2][1]
    by_position = engine.query("SELECT diet, COUNT(*) FROM survey GROUP BY diet ORDER BY 2 DESC", analyst=analyst)
    assert [row[1] for row in by_position.rows] == sorted((row[1] for row in by_position.rows), reverse=True)
    assert engine.budget(analyst).epsilon_spent == 0


def test_simplex_estimates_on_request(engine, analyst):
    from dpsql.session import Options

    answer = engine.query("SELECT cell, COUNT(*) FROM checkins GROUP BY cell", analyst=analyst,
                          options=Options(local_estimate="simplex"))
    counts = [r[1] for r in answer.rows]
    assert min(counts) >= 0 and sum(counts) == pytest.approx(_total(engine, "checkins"))


def _total(engine, table: str) -> int:
    with engine.backend.session() as backend:
        return backend.run_text(f"SELECT COUNT(*) FROM {table}")[0][0]


def test_explain_says_estimates_cost_nothing(engine):
    from dpsql.explain import explain_statement

    text = explain_statement(*engine.prepare_parts("SELECT smoker, COUNT(*) FROM survey GROUP BY smoker"))
    assert "no budget is charged" in text and "ε = 0" in text and "randomized response" in text


def test_a_query_over_private_tables_gets_central_noise_and_is_de_biased(engine, analyst, base_url):
    sql = "SELECT positive, COUNT(*) FROM screenings GROUP BY positive"
    answer = engine.query(sql, analyst=analyst, epsilon=1.0)
    assert answer.epsilon == pytest.approx(1.0)
    reported = dict(_raw(base_url, sql))
    keep = math.e / (1 + math.e)
    n = sum(reported.values())
    true_positive = (reported[True] - n * (1 - keep)) / (2 * keep - 1)
    got = dict(answer.rows)
    assert abs(got[True] - true_positive) < 60  # de-biased: the raw report count is far off
    assert abs(reported[True] - true_positive) > 200
    accuracy = dict(zip([r[0] for r in answer.rows], [a[1] for a in answer.accuracy], strict=True))
    assert "the noise and the randomization" in answer.intervals_cover
    laplace_only = 2 * math.log(20)  # a count's 95% interval at ε = 1 without the randomization
    assert accuracy[True].ci_high - accuracy[True].ci_low > 10 * laplace_only


@pytest.mark.parametrize("where,value,rest", [
    ("positive", True, ""), ("NOT positive", False, ""), ("positive = false", False, ""),
    ("(s.positive IS TRUE) AND s.person_id > 9", True, "WHERE person_id > 9")])
def test_a_count_of_one_reported_value_is_picked_from_the_counts_per_value(engine, analyst, where, value, rest):
    """COUNT(*) WHERE a locally randomized column has one value: the de-biased count of that value, with its
    interval, from the counts per value (a filter on the reports themselves would count reports)."""
    answer = engine.query(f"SELECT COUNT(*) AS n FROM screenings s WHERE {where}", analyst=analyst, epsilon=1.0)
    assert answer.names == ["n"] and answer.types == ["int8"] and len(answer.rows) == 1
    assert answer.epsilon == pytest.approx(1.0)
    grouped = engine.query(f"SELECT positive, COUNT(*) FROM screenings {rest} GROUP BY positive", analyst=analyst,
                           epsilon=1.0)
    assert grouped.epsilon == 0  # the same released counts, kept for this analyst
    picked = {row[0]: (row[1], acc[1]) for row, acc in zip(grouped.rows, grouped.accuracy, strict=True)}[value]
    assert (answer.rows[0][0], answer.accuracy[0][0]) == picked


def test_the_people_reporting_one_value_of_an_array_column_are_picked_from_its_counts_per_value(engine, analyst):
    """`WHERE 'fever' = ANY(symptom)` over a locally randomized array: was refused (ANY); it is the de-biased
    count of that domain value, with its interval, from `SELECT symptom, COUNT(*) ... GROUP BY symptom`; a value
    outside the domain counts no one."""
    answer = engine.query("SELECT COUNT(*) AS n FROM survey WHERE 'fever' = ANY(symptom)", analyst=analyst)
    grouped = engine.query("SELECT symptom, COUNT(*) FROM survey GROUP BY symptom", analyst=analyst)
    picked = {row[0]: (row[1], acc[1]) for row, acc in zip(grouped.rows, grouped.accuracy, strict=True)}["fever"]
    assert answer.names == ["n"] and (answer.rows[0][0], answer.accuracy[0][0]) == picked
    assert engine.query("SELECT COUNT(*) FROM survey WHERE 'nonsense' = ANY(symptom)", analyst=analyst).rows == [(0,)]
    filtered = engine.query("SELECT COUNT(*) FILTER (WHERE 'fever' = ANY(symptom)) AS n FROM survey", analyst=analyst)
    assert (filtered.names, filtered.rows, filtered.accuracy) == (answer.names, answer.rows, answer.accuracy)


@pytest.mark.parametrize("asked,read", [
    ("AVG(s.positive::int)", lambda n: n[True] / (n[True] + n[False])),
    ("COUNT(*) FILTER (WHERE s.positive) * 1.0 / COUNT(s.positive)", lambda n: n[True] / (n[True] + n[False])),
    ("COUNT(*) FILTER (WHERE NOT s.positive)", lambda n: n[False]),
    ("SUM(CASE WHEN s.positive THEN 1 ELSE 0 END)", lambda n: n[True])])
def test_aggregates_of_a_private_tables_reports_are_read_from_the_counts_per_value(engine, analyst, asked, read):
    """A positivity rate over a private table's randomized-response boolean (`AVG(positive::int)`, a FILTER
    count over COUNT(positive), a count of one value): read from the de-biased counts per reported value, which
    are the one part charged; asked again, those counts are the same answer, free."""
    sql = (f"SELECT p.sex, {asked} AS v FROM screenings s JOIN people p ON p.person_id = s.person_id "
           "WHERE p.age >= 18 GROUP BY 1")
    answer = engine.query(sql, analyst=analyst, epsilon=1.0)
    assert answer.epsilon == pytest.approx(1.0)
    counts = engine.query("SELECT p.sex, s.positive, COUNT(*) AS dpsql_reports FROM screenings s JOIN people p "
                          "ON p.person_id = s.person_id WHERE p.age >= 18 GROUP BY p.sex, s.positive",
                          analyst=analyst, epsilon=1.0)
    assert counts.epsilon == 0  # the same released counts
    per_sex: dict = {}
    for sex, positive, n in counts.rows:
        per_sex.setdefault(sex, {})[positive] = n
    assert {sex: pytest.approx(read(n)) for sex, n in per_sex.items()} == dict(answer.rows)
    assert all(acc[1].ci_low <= v <= acc[1].ci_high for (_, v), acc in zip(answer.rows, answer.accuracy, strict=True))
    assert answer.noisy == [False, True]  # the key is not (an interval for sex was once said to be missing)


def test_count_of_rows_beside_reports_is_answered_where_every_row_holds_a_report(engine, analyst):
    """COUNT(*) beside the reports, and an average that reads a NULL report as 0, count the rows without a
    report too, which the counts per reported value leave out. Where the catalog declares the column NOT NULL
    (the demo's screenings.positive) and no outer join adds a row without it, they are the reports' own count and
    average; under a LEFT JOIN they are refused, each with a hint."""
    rate = engine.query("SELECT AVG(positive::int) AS r, COUNT(positive) AS n FROM screenings", analyst=analyst)
    for written in ("SELECT AVG(CASE WHEN positive THEN 1 ELSE 0 END) AS r, COUNT(*) AS n FROM screenings",
                    "SELECT COUNT(*) FILTER (WHERE positive) * 1.0 / COUNT(*) AS r, COUNT(*) AS n FROM screenings"):
        answer = engine.query(written, analyst=analyst)
        assert answer.epsilon == 0 and answer.rows[0] == pytest.approx(rate.rows[0])  # the same released counts
    left = "FROM people p LEFT JOIN screenings s ON s.person_id = p.person_id"
    with pytest.raises(UnsupportedQuery, match="NULL report") as refused:
        engine.query(f"SELECT AVG(CASE WHEN s.positive THEN 1 ELSE 0 END) {left}", analyst=analyst)
    assert "AVG(positive::int)" in refused.value.hint
    with pytest.raises(UnsupportedQuery, match="NULL reports too") as refused:
        engine.query(f"SELECT COUNT(*) FILTER (WHERE s.positive) * 1.0 / COUNT(*) {left}", analyst=analyst)
    assert "COUNT(positive)" in refused.value.hint


def test_a_count_of_a_value_no_report_has_is_zero(engine, analyst):
    answer = engine.query("SELECT COUNT(*) FROM survey WHERE diet = 'carnivore'", analyst=analyst)
    assert answer.rows == [(0,)] and answer.epsilon == 0


@pytest.mark.parametrize("sql,error,message", [
    ("SELECT COUNT(*) FROM screenings WHERE positive OR person_id > 5", UnsupportedQuery, "only count them"),
    ("SELECT p.state, s.positive, COUNT(*) FROM screenings s JOIN people p ON p.person_id = s.person_id "
     "GROUP BY p.state, s.positive", UnsupportedQuery, "every value of it released"),
    ("SELECT s.positive, AVG(p.income) FROM screenings s JOIN people p ON p.person_id = s.person_id "
     "GROUP BY s.positive", UnsupportedQuery, "cannot be de-biased"),
    ("SELECT positive, COUNT(*) FROM screenings WHERE positive OR person_id > 5 GROUP BY positive",
     UnsupportedQuery, "filtering, joining or computing"),
    ("SELECT smoker, COUNT(*) FROM survey WHERE smoker GROUP BY smoker", PrivacyRefusal, "selects reports"),
    ("SELECT smoker, diet, COUNT(*) FROM survey GROUP BY smoker, diet", UnsupportedQuery, "one locally"),
    ("SELECT smoker FROM survey", UnsupportedQuery, "cannot be estimated"),
    ("SELECT AVG(diet::int) FROM survey", UnsupportedQuery, "cannot be estimated"),
    ("SELECT cell, COUNT(*) FROM checkins c JOIN states s ON s.code = 'CA' GROUP BY cell", UnsupportedQuery,
     "without joins"),
    ("SELECT s.symptom, COUNT(*) FROM survey s JOIN people p ON s.respondent_id = p.person_id GROUP BY s.symptom",
     UnsupportedQuery, "only count them per value"),
])
def test_biased_uses_of_reports_are_refused_before_anything_is_charged(engine, analyst, sql, error, message):
    with pytest.raises(error, match=message):
        engine.query(sql, analyst=analyst)
    assert engine.budget(analyst).epsilon_spent == 0


def test_reports_filtered_by_a_private_subquery_are_not_answered_for_free(engine, analyst):
    """A subquery over private tables is not post-processing of reports: the free path does not take it (and
    the central analysis does not answer a query whose own tables are all public)."""
    sql = ("SELECT smoker, COUNT(*) FROM survey WHERE respondent_id IN (SELECT person_id FROM people WHERE age > 50) "
           "GROUP BY smoker")
    with pytest.raises(PrivacyRefusal, match="only public tables"):
        engine.query(sql, analyst=analyst)
    assert engine.budget(analyst).epsilon_spent == 0


def test_reports_joined_to_private_tables_go_through_central_noise(engine, analyst):
    answer = engine.query("SELECT s.smoker, COUNT(*) FROM survey s JOIN people p ON s.respondent_id = p.person_id "
                          "GROUP BY s.smoker", analyst=analyst, epsilon=0.5)
    assert answer.epsilon == pytest.approx(0.5) and {r[0] for r in answer.rows} == {False, True}


# --- ingest -------------------------------------------------------------------------------------------------------


INGEST_SCHEMA = """
[privacy]
unit = "row"
[tables.poll]
public = true
[tables.poll.columns]
id = "bigint"
answer = { type = "boolean", local = { mechanism = "rr", epsilon = 1.0 } }
where_ = { type = "integer", local = { mechanism = "geo", epsilon = 1.0, grid = { x = [0, 4], y = [0, 2], step = 1 } } }
items = { type = "boolean[]", domain = ["a", "b", "c"], local = { mechanism = "oue", epsilon = 1.0 } }
[tables.private]
[tables.private.columns]
x = "integer"
"""


def _cli(*args: str):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "dpsql.cli", *args], capture_output=True, text=True, timeout=120)


def _empty_database_and_schema(server, tmp_path, name: str) -> tuple[str, Path]:
    from tests.conftest import database_url

    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    schema = tmp_path / "poll.toml"
    schema.write_text(INGEST_SCHEMA)
    return database_url(server, name), schema


def test_ingest_checks_every_report_and_loads_all_or_nothing(tmp_path, server):
    url, schema = _empty_database_and_schema(server, tmp_path, "dpsql_ingest")
    bad = tmp_path / "bad.csv"
    bad.write_text('id,answer,where_,items\n1,true,3,"{t,f,f}"\n2,maybe,8,101\n3,f,,1101\n4,t,1,{t,f,f}\n')
    result = _cli("ingest", "poll", str(bad), "--database", url, "--schema", str(schema))
    assert result.returncode == 1
    assert "line 3, answer = 'maybe'" in result.stderr and "line 3, where_ = '8'" in result.stderr
    assert "line 4, items = '1101'" in result.stderr and "nothing was loaded" in result.stderr
    assert "line 5 has 6 values where the header names 4" in result.stderr
    good = tmp_path / "good.csv"
    good.write_text('id,answer,where_,items\n1,true,3,"{t,f,f}"\n2,f,7,101\n3,,0,"[false,false,true]"\n')
    result = _cli("ingest", "poll", str(good), "--database", url, "--schema", str(schema))
    assert result.returncode == 0, result.stderr
    assert "loaded 3 rows into poll" in result.stdout
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT * FROM poll ORDER BY id").fetchall() == [
            (1, True, 3, [True, False, False]), (2, False, 7, [True, False, True]), (3, None, 0, [False, False, True])]


def test_ingest_reads_parquet(tmp_path, server):
    import pandas as pd

    url, schema = _empty_database_and_schema(server, tmp_path, "dpsql_ingest_parquet")
    path = tmp_path / "poll.parquet"
    pd.DataFrame({"id": [1, 2], "answer": [True, None], "where_": [5, 2],
                  "items": [[True, False, False], [False, True, True]]}).to_parquet(path)
    result = _cli("ingest", "poll", str(path), "--database", url, "--schema", str(schema))
    assert result.returncode == 0, result.stderr
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT * FROM poll ORDER BY id").fetchall() == [
            (1, True, 5, [True, False, False]), (2, None, 2, [False, True, True])]
