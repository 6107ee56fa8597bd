"""Releases beyond one query: the Gaussian-process mechanism's distribution and calibration, the tree's split
scores, each release charged once on the ledger (and free when asked again), and what the releases are good for."""

from __future__ import annotations

import math
import random

import numpy as np
import psycopg
import pytest

from dpsql.accounting import zcdp
from dpsql.config import Settings
from dpsql.engine import Engine
from dpsql.errors import InvalidParameter, UnknownColumn
from dpsql.mechanisms.gaussian_process import GaussianProcessMechanism, gaussian_kernel
from dpsql.releases.density import release_density
from dpsql.releases.tree import gini_score, predict, render_tree
from dpsql.schema import parse_schema

# --- the Gaussian-process mechanism -------------------------------------------------------------------------------


def test_gaussian_process_noise_has_the_kernel_as_covariance():
    gp = GaussianProcessMechanism.calibrate(sensitivity=2.0, bandwidth=0.3, rho=0.5)
    assert gp.scale == pytest.approx(2.0 / math.sqrt(2 * 0.5)) and gp.rho == pytest.approx(0.5)
    points = np.linspace(0, 1, 7)
    rng = np.random.default_rng(7)
    draws = np.array([gp.noise(points, rng) for _ in range(20_000)])
    expected = gp.scale**2 * gaussian_kernel(points, points, 0.3)
    assert np.allclose(np.cov(draws.T), expected, atol=0.04 * gp.scale**2)
    assert np.allclose(draws.mean(axis=0), 0, atol=0.05 * gp.scale)


def test_the_kde_moves_by_at_most_its_rkhs_sensitivity_on_any_grid():
    """Hall et al.'s calibration: for datasets differing in k points, the change v of c·Σ K(·, x_i) on any grid
    has vᵀM⁻¹v ≤ (c·k)², M the grid's Gram matrix; so the release on the grid is the Gaussian mechanism with that
    sensitivity."""
    rng = np.random.default_rng(3)
    h = 0.2
    c = 1 / (math.sqrt(2 * math.pi) * h)
    grid = np.linspace(0, 1, 12)
    gram = gaussian_kernel(grid, grid, h) + 1e-10 * np.eye(len(grid))
    for k in (1, 3, 10):
        for _ in range(50):
            moved = rng.uniform(-0.5, 1.5, k)  # the neighbour's extra rows, anywhere
            v = c * gaussian_kernel(grid, moved, h).sum(axis=1)
            assert v @ np.linalg.solve(gram, v) <= (c * k) ** 2 * (1 + 1e-6)


def test_the_release_costs_its_epsilon_delta():
    rho = zcdp.rho_for(0.5, 1e-6)
    assert zcdp.epsilon_of(rho, 1e-6) == pytest.approx(0.5, rel=1e-6)


def test_density_error_shrinks_with_n():
    """The noise is fixed in F = c·Σ K(·, x_i), which grows like n, so the normalised density's L2 error from
    the noise falls like 1/n: about tenfold per tenfold n (counts here are a normal's expected counts, so the
    error is the mechanism's alone)."""
    rng = np.random.default_rng(1)
    edges = np.linspace(0, 1, 257)
    centres = (edges[:-1] + edges[1:]) / 2
    shares = np.diff([0.5 * (1 + math.erf((e - 0.4) / (0.1 * math.sqrt(2)))) for e in edges])
    rho = zcdp.rho_for(1.0, 1e-6)
    errors = []
    for n in (1_000, 10_000, 100_000):
        exact = release_density(centres, n * shares, 0.0, 1.0, 0.05, 1.0, 1e12, 64)  # noiseless at this ρ
        trials = [release_density(centres, n * shares, 0.0, 1.0, 0.05, 1.0, rho, 64, rng) for _ in range(30)]
        errors.append(np.mean([np.sqrt(np.trapezoid((np.array(t["density"]) - exact["density"]) ** 2,
                                                     exact["points"])) for t in trials]))
    for larger, smaller in zip(errors, errors[1:], strict=False):
        assert 6 < larger / smaller < 15, errors


# --- the tree's splits ---------------------------------------------------------------------------------------------


def test_one_row_moves_the_gini_score_by_at_most_two():
    rng = random.Random(5)
    for _ in range(2000):
        counts = {v: {c: rng.randrange(0, 30) for c in "ab"} for v in range(rng.randrange(1, 4))}
        value, label = rng.choice(list(counts)), rng.choice("ab")
        before = gini_score(counts)
        counts[value][label] += 1
        assert abs(gini_score(counts) - before) <= 2 + 1e-12


def test_the_split_is_drawn_with_the_exponential_mechanism_s_probabilities():
    """The tree's first split over a fixed table: attribute frequencies over many seeded draws match
    exp(ε·score / 2Δ), normalised."""
    from dpsql.mechanisms.exponential import ExponentialMechanism
    from dpsql.releases.tree import _grow

    rows = {(x, y, label): float(10 + 7 * x + 3 * y * label + 5 * (x == label)) for x in (0, 1) for y in (0, 1, 2)
            for label in (0, 1)}
    domains = [[0, 1], [0, 1, 2], [0, 1]]
    mechanism = ExponentialMechanism(2.0, 0.05)
    scores = []
    for attribute in (0, 1):
        split: dict = {}
        for key, count in rows.items():
            split.setdefault(key[attribute], {}).setdefault(key[-1], 0.0)
            split[key[attribute]][key[-1]] += count
        scores.append(gini_score(split))
    expected = mechanism.probabilities(scores)
    rng = random.Random(9)

    class Seeded:
        def select(self, utilities):
            return mechanism.select(utilities, rng)

    class Exact:
        def release(self, value):
            return value

    draws = 20_000
    first = sum(_grow(rows, [0, 1], 1, domains, Seeded(), Exact())["split"] == 0 for _ in range(draws))
    assert abs(first - expected[0] * draws) <= 5 * math.sqrt(draws * expected[0] * (1 - expected[0]))
    assert 0.2 < expected[0] < 0.8  # a test with both outcomes likely


# --- through the engine ---------------------------------------------------------------------------------------------


def test_density_is_charged_once_and_asked_again_is_free(engine, analyst):
    from dpsql.releases import density

    first = density(engine, analyst, "people", "income", epsilon=0.5, delta=1e-6, points=16)
    budget = engine.budget(analyst)
    assert budget.epsilon_basic == pytest.approx(0.5) and budget.delta_basic == pytest.approx(1e-6)
    assert len(engine.ledger.charges(analyst)) == 1 and first["cached"] is False
    again = density(engine, analyst, "people", "income", epsilon=0.5, delta=1e-6, points=16)
    assert again["cached"] and again["density"] == first["density"]
    assert engine.budget(analyst).epsilon_basic == pytest.approx(0.5)
    assert np.trapezoid(np.clip(first["density"], 0, None), first["points"]) == pytest.approx(1.0)
    assert first["halfwidth"] > first["lower_bound"] > 0


def test_tree_is_charged_once(engine, analyst):
    from dpsql.releases import decision_tree

    tree = decision_tree(engine, analyst, "people", "sex", ["age", "income"], epsilon=1.0, depth=2)
    assert engine.budget(analyst).epsilon_basic == pytest.approx(1.0)
    assert len(engine.ledger.charges(analyst)) == 1
    assert "DP decision tree for sex" in render_tree(tree)
    assert predict(tree, {"age": 2, "income": 1}) in ("F", "M")


@pytest.mark.parametrize("call,error", [
    (lambda e, a: __import__("dpsql.releases").releases.density(e, a, "people", "state", 1.0, 1e-6), UnknownColumn),
    (lambda e, a: __import__("dpsql.releases").releases.density(e, a, "people", "income", 1.0, 0.0),
     InvalidParameter),
    (lambda e, a: __import__("dpsql.releases").releases.decision_tree(e, a, "people", "sex", ["state"], 1.0),
     InvalidParameter),
    (lambda e, a: __import__("dpsql.releases").releases.decision_tree(e, a, "people", "sex", ["sex"], 1.0),
     InvalidParameter),
])
def test_bad_releases_are_refused_before_any_charge(engine, analyst, call, error):
    with pytest.raises(error):
        call(engine, analyst)
    assert engine.budget(analyst).epsilon_spent == 0


TREE_SCHEMA = {
    "privacy": {"unit": "patients.id"},
    "tables": {"patients": {"columns": {
        "id": "bigint",
        "smoker": {"type": "boolean"},
        "region": {"type": "text", "domain": ["n", "s", "e", "w"]},
        "age": {"type": "integer", "lower": 0, "upper": 100},
        "sick": {"type": "boolean"},
    }}},
}


def test_tree_finds_a_known_rule(server):
    """sick = smoker, with region and age irrelevant: at ε = 1 the tree predicts the rule."""
    from tests.conftest import database_url

    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS dpsql_tree")
        conn.execute("CREATE DATABASE dpsql_tree")
    url = database_url(server, "dpsql_tree")
    rng = random.Random(2)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE patients (id bigint PRIMARY KEY, smoker boolean, region text, age integer, "
                      "sick boolean)")
        with conn.cursor().copy("COPY patients FROM STDIN") as copy:
            for i in range(4000):
                smoker = rng.random() < 0.3
                copy.write_row((i, smoker, rng.choice("nsew"), rng.randrange(0, 100), smoker))
    engine = Engine(Settings(database=url), parse_schema(TREE_SCHEMA))
    try:
        engine.ledger.add_analyst("t", 10.0, 0.0)
        from dpsql.releases import decision_tree
        tree = decision_tree(engine, "t", "patients", "sick", ["region", "smoker", "age"], epsilon=1.0, depth=2)
    finally:
        engine.close()
    assert tree["features"][tree["tree"]["split"]] == "smoker"
    for smoker in (False, True):
        for region in "nsew":
            assert predict(tree, {"smoker": smoker, "region": region, "age": 2}) == str(smoker)


# --- synthetic tables ---------------------------------------------------------------------------------------------


def test_mwem_answers_a_held_out_workload_within_its_error():
    """A 4 × 5 × 3 table of 50,000 rows with structure: at ε = 1, MWEM's 2-way marginals are within 5% of the
    rows in L1 (averaged over the marginals), and the rounded rows keep its total."""
    from dpsql.releases.synth import marginal, marginals, mwem, whole_rows

    rng = np.random.default_rng(4)
    a = rng.choice(4, 50_000, p=[0.4, 0.3, 0.2, 0.1])
    b = np.minimum(a + rng.choice(3, 50_000), 4)
    c = (a + b) % 3
    exact = np.zeros((4, 5, 3))
    np.add.at(exact, (a, b, c), 1)
    synthetic, _, measured = mwem(exact, 1.0, 1.0, 6, marginals(3), rng=random.Random(1))
    assert len(measured) == 6
    errors = [np.abs(marginal(synthetic, m) - marginal(exact, m)).sum() / 50_000 for m in marginals(3, (2,))]
    assert np.mean(errors) < 0.05, errors
    rows = whole_rows(synthetic)
    assert rows.sum() == round(synthetic.sum()) and (rows >= 0).all()
    from dpsql.releases.synth import perturb
    table, _ = perturb(exact, 1.0, 1.0, rng=random.Random(2))  # what dpsql synth picks for a table this small
    assert (table >= 0).all() and abs(table.sum() - 50_000) < 100
    for way in (2, 3):  # a workload it never saw: every 2-way marginal, and the table itself
        errors = [np.abs(marginal(table, m) - marginal(exact, m)).sum() / 50_000 for m in marginals(3, (way,))]
        assert np.mean(errors) < 0.005, (way, errors)


def test_synthetic_table_is_charged_once_and_published_data_is_answered_exactly_for_free(engine, analyst, base_url,
                                                                                          demo_schema):
    from dpsql.releases.synth import publish, synthesize

    release = synthesize(engine, analyst, "people", ["sex", "age"], epsilon=1.0, bins=4)
    assert engine.budget(analyst).epsilon_basic == pytest.approx(1.0)
    assert "synth perturb" in engine.ledger.charges(analyst)[0][4]  # 2 × 5 cells: perturbation is expected best
    assert release["method"] == "perturb" and release["predicted_2way_l1"]["perturb"] < release["predicted_2way_l1"][
        "mwem"]
    declaration = publish(release, base_url, "people_synth", replace=True)
    import tomllib
    schema = parse_schema({**_raw_demo(), "tables": {**_raw_demo()["tables"], **tomllib.loads(declaration)["tables"]}})
    published = Engine(Settings(database=base_url), schema)
    try:
        published.ledger.add_analyst(f"{analyst}_p", 1.0, 0.0)
        answer = published.query("SELECT sex, COUNT(*) AS n FROM people_synth GROUP BY sex ORDER BY sex",
                                 analyst=f"{analyst}_p")
    finally:
        published.close()
    assert answer.epsilon == 0 and answer.noisy == [False, False]
    with psycopg.connect(base_url) as conn:
        exact = conn.execute("SELECT sex, COUNT(*) FROM people_synth GROUP BY sex ORDER BY sex").fetchall()
    assert answer.rows == exact
    assert sum(r[1] for r in answer.rows) == release["rows"]


def test_published_data_beside_local_reports_is_not_passed_through(engine):
    """A query joining released data to a table of local reports does not return the raw reports."""
    raw = _raw_demo()
    raw["tables"]["people_synth"] = {"public": True, "released": "test", "columns": {"sex": "text"}}
    schema = parse_schema(raw)
    from dpsql.releases.published import plan_published
    from dpsql.sql import check_query
    query = check_query("SELECT s.smoker FROM survey s JOIN people_synth p ON p.sex = s.region", schema)
    assert plan_published(query, schema) is None
    assert plan_published(check_query("SELECT sex FROM people_synth", schema), schema) is not None


def _raw_demo() -> dict:
    import tomllib

    from tests.conftest import DEMO_SCHEMA
    return tomllib.loads(DEMO_SCHEMA.read_text())


def test_released_needs_a_public_table():
    from dpsql.errors import SchemaError

    raw = {"privacy": {"unit": "row"}, "tables": {"t": {"released": "mwem", "columns": {"x": "integer"}}}}
    with pytest.raises(SchemaError, match="released"):
        parse_schema(raw)
