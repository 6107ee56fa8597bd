"""The ledger's two accounts: basic composition and zCDP (through dp-accounting), and their conversion."""

from __future__ import annotations

import dataclasses
import math
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from scipy.optimize import minimize_scalar

from dpsql import errors
from dpsql.accounting import Budget, Cost, Ledger, zcdp
from tests.conftest import copy_database


def _cks_conversion(rho: float, delta: float) -> float:
    """Canonne-Kamath-Steinke (2020, Prop. 12 with Balle et al.'s refinement), minimised independently:
    ε = min over α > 1 of αρ + (ln(1/δ) + (α - 1) ln(1 - 1/α) - ln α) / (α - 1)."""
    def epsilon(alpha: float) -> float:
        return alpha * rho + (math.log(1 / delta) + (alpha - 1) * math.log(1 - 1 / alpha) - math.log(alpha)) \
            / (alpha - 1)
    return minimize_scalar(epsilon, bounds=(1.0001, 1e5), method="bounded").fun


@pytest.mark.parametrize("rho, delta", [(0.005, 1e-6), (0.125, 1e-6), (0.5, 1e-5), (2.5, 1e-9)])
def test_zcdp_conversion_matches_the_closed_form_and_beats_the_classic_bound(rho, delta):
    epsilon = zcdp.epsilon_of(rho, delta)
    assert epsilon == pytest.approx(_cks_conversion(rho, delta), rel=0.02)  # dp-accounting's orders are a grid
    assert rho < epsilon < rho + 2 * math.sqrt(rho * math.log(1 / delta))


def test_rho_for_inverts_the_conversion():
    for epsilon, delta in ((0.5, 1e-6), (1.0, 5e-7), (3.0, 1e-5)):
        rho = zcdp.rho_for(epsilon, delta)
        assert zcdp.epsilon_of(rho, delta) <= epsilon
        assert zcdp.epsilon_of(rho * 1.001, delta) > epsilon


def test_budget_takes_the_better_account():
    fresh = Budget("a", 2.0, 1e-5, 0.0, 0.0, 0.0, 0.0)
    assert fresh.epsilon_spent == 0.0 and fresh.within
    one = fresh.plus(Cost.pure(1.0))
    assert one.epsilon_spent == pytest.approx(1.0) and not one.zcdp_is_better  # one big answer: basic wins
    many = fresh
    for _ in range(60):
        many = many.plus(Cost.pure(0.05))
    assert many.epsilon_basic == pytest.approx(3.0)  # over the budget under basic composition ...
    assert many.zcdp_is_better and many.epsilon_spent == pytest.approx(zcdp.epsilon_of(60 * 0.05**2 / 2, 1e-5))
    assert many.epsilon_spent < 2.0 and many.within  # ... within it under zCDP
    assert many.delta_spent == 1e-5  # the zCDP account converts at the whole δ


def test_a_grant_of_delta_explains_the_spent_epsilon_and_leaves_delta_for_queries():
    from dpsql.accounting import describe_budget

    spent = Budget("a", 5.0, 1e-13, 0.0, 0.0, 0.0, 0.0)
    for _ in range(49):  # many small answers, and one grouped answer with DP partition selection
        spent = spent.plus(Cost.pure(0.1))
    spent = spent.plus(Cost(0.1, 1e-14, 0.005, 1e-14))
    assert not spent.zcdp_is_better and spent.epsilon_spent == pytest.approx(5.0)  # too little δ to convert at
    assert spent.delta_left == pytest.approx(9e-14)
    granted = dataclasses.replace(spent, epsilon_total=1005.0, delta_total=1e-13 + 0.01)
    assert granted.zcdp_is_better and granted.epsilon_spent < 5.0  # more δ to convert at: less ε spent
    assert granted.delta_spent == granted.delta_total  # the guarantee is at the whole δ ...
    assert granted.delta_committed == pytest.approx(1e-14)  # ... but queries took only their own
    assert granted.delta_left == pytest.approx(0.01) and granted.plus(Cost(0.5, 1e-6, 0.125, 1e-6)).within
    text = describe_budget(granted, 1.0)
    assert f"ε spent {granted.epsilon_spent:.4g} of 1005" in text and "δ taken 1e-14 of 0.01 (left 0.01)" in text
    assert "converted to ε at the δ not taken (0.01)" in text and "basic composition would give (5, 1e-14)" in text
    extra = granted.plus(Cost.pure(1.0)).epsilon_spent - granted.epsilon_spent
    assert f"one more query at ε = 1 without δ spends {extra:.4g}" in text and extra > 0  # (more than 1 here:
    # under zCDP a big answer costs more than its ε, and the account in use is the better one after it too)


def test_partition_selection_delta_is_set_aside_before_conversion():
    budget = Budget("a", 10.0, 1e-5, 0.0, 0.0, 0.0, 0.0).plus(Cost(0.5, 4e-6, 0.125, 4e-6))
    assert budget.epsilon_zcdp == pytest.approx(zcdp.epsilon_of(0.125, 6e-6))


def test_ledger_admits_more_small_answers_than_basic_composition(base_url):
    ledger = Ledger(base_url)
    try:
        ledger.add_analyst("zcdp_many", 2.0, 1e-5)
        admitted = 0
        with pytest.raises(errors.BudgetExhausted):
            while admitted < 1000:
                ledger.charge("zcdp_many", Cost.pure(0.05), f"q{admitted}")
                admitted += 1
        assert admitted > 40  # basic composition stops at 2.0 / 0.05 = 40
        budget = ledger.budget("zcdp_many")
        assert budget.epsilon_spent <= 2.0 and budget.rho == pytest.approx(admitted * 0.05**2 / 2)
        mixed = ledger.charge("zcdp_many", Cost(0.0, 0.0, 0.0, 0.0), "free")
        assert mixed.rho == pytest.approx(budget.rho)
    finally:
        ledger.remove("zcdp_many")
        ledger.close()


def test_concurrent_gaussian_charges_never_overspend(base_url):
    """Mixed Laplace and Gaussian charges from many threads: the spending never passes the budget."""
    ledger = Ledger(base_url)
    try:
        ledger.add_analyst("zcdp_race", 3.0, 1e-5)
        gaussian = Cost(0.3, 1e-7, zcdp.rho_for(0.3, 1e-7), 0.0)

        def charge(i: int) -> bool:
            try:
                ledger.charge("zcdp_race", gaussian if i % 2 else Cost.pure(0.3), f"r{i}")
                return True
            except errors.BudgetExhausted:
                return False

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(charge, range(80)))
        budget = ledger.budget("zcdp_race")
        assert budget.within and budget.epsilon_spent <= 3.0
        assert sum(results) >= 10  # at least what basic composition allows
        assert budget.rho == pytest.approx(sum(
            (gaussian.rho if i % 2 else 0.045) for i, ok in enumerate(results) if ok))
    finally:
        ledger.remove("zcdp_race")
        ledger.close()


def test_spending_from_before_the_zcdp_account_is_carried_over(server, template):
    """A ledger created by the first release (no ρ columns) is upgraded without forgetting what was spent."""
    url = copy_database(server, template, "dpsql_old_ledger")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA dpsql")
        conn.execute("CREATE TABLE dpsql.analysts (name text PRIMARY KEY, epsilon_total double precision NOT NULL, "
                     "delta_total double precision NOT NULL, epsilon_spent double precision NOT NULL DEFAULT 0, "
                     "delta_spent double precision NOT NULL DEFAULT 0, password_verifier text, "
                     "created_at timestamptz NOT NULL DEFAULT now())")
        conn.execute("CREATE TABLE dpsql.charges (id bigserial PRIMARY KEY, analyst text NOT NULL, "
                     "at timestamptz NOT NULL DEFAULT now(), epsilon double precision NOT NULL, "
                     "delta double precision NOT NULL, query_key text NOT NULL)")
        conn.execute("INSERT INTO dpsql.analysts (name, epsilon_total, delta_total, epsilon_spent, delta_spent) "
                     "VALUES ('old', 10, 1e-5, 9.5, 2e-6)")
    ledger = Ledger(url)
    try:
        budget = ledger.budget("old")
        assert budget.rho == pytest.approx(9.5**2 / 2) and budget.approx_delta == pytest.approx(2e-6)
        assert budget.epsilon_spent == pytest.approx(9.5)  # not 0: basic composition still holds it
        with pytest.raises(errors.BudgetExhausted):
            ledger.charge("old", Cost.pure(1.0), "k")
    finally:
        ledger.close()


def test_group_privacy_is_k_epsilon_and_k_e_to_the_k_minus_one_epsilon_delta():
    from dpsql.accounting import describe_budget, group_guarantee

    assert group_guarantee(0.5, 1e-6, 1) == (0.5, 1e-6)
    epsilon, delta = group_guarantee(0.5, 1e-6, 4)
    assert epsilon == 2.0 and delta == pytest.approx(4 * math.exp(1.5) * 1e-6)
    assert group_guarantee(5.0, 0.01, 4)[1] == 1.0  # past 1 a δ says nothing
    budget = Budget("a", 10.0, 1e-5, 1.0, 1e-6, 0.5, 1e-6)
    assert "for groups of up to 4 units: (4, 8.03e-05)-DP" in describe_budget(budget, group_size=4)
