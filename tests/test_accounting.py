"""The ledger's two privacy filters, basic composition and approximate zCDP (through dp-accounting's conversion), each
at its fixed share of the analyst's δ, and the ledger that admits what either admits."""

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


def test_budget_admits_what_either_filter_admits_each_at_its_fixed_share_of_delta():
    fresh = Budget("a", 2.0, 1e-5, 0.0, 0.0, 0.0, 0.0)
    assert fresh.epsilon_spent == 0.0 and fresh.within and fresh.account == "basic"
    assert (fresh.basic_delta_room, fresh.selection_delta_room, fresh.conversion_delta) == \
        pytest.approx((5e-6, 2.5e-6, 2.5e-6))  # the shares add up to the analyst's δ: the union's guarantee
    one = fresh.plus(Cost.pure(1.0))
    assert one.epsilon_spent == pytest.approx(1.0) and one.account == "basic"
    many = fresh
    for _ in range(60):
        many = many.plus(Cost.pure(0.05))
    assert many.epsilon_basic == pytest.approx(3.0) and not many.basic_holds  # past basic composition's target
    assert many.epsilon_zcdp == pytest.approx(zcdp.epsilon_of(60 * 0.05**2 / 2, 2.5e-6))  # at its fixed δ
    assert many.zcdp_holds and many.within and many.account == "zCDP" and many.epsilon_spent < 2.0
    assert many.delta_spent == pytest.approx(5e-6)  # the zCDP filter's own δ: its answers' room and conversion


def test_each_filter_stops_at_its_own_share_of_delta():
    """Partition selections at δ = 1e-6 each: basic composition admits 5 (half of 1e-5), zCDP 2 more (a quarter),
    then neither: the union's δ is never more than the analyst's."""
    budget, admitted = Budget("a", 100.0, 1e-5, 0.0, 0.0, 0.0, 0.0), 0
    selection = Cost(0.5, 1e-6, 0.125, 1e-6)
    while budget.plus(selection).within:
        budget, admitted = budget.plus(selection), admitted + 1
    assert admitted == 5 and budget.basic_holds
    zcdp_only = Budget("a", 100.0, 1e-5, 100.0, 0.0, 0.0, 0.0)  # basic composition spent: zCDP alone admits
    assert zcdp_only.plus(selection).plus(selection).within and not zcdp_only.repeated(selection, 3).within


def test_the_zcdp_filter_converts_at_a_delta_fixed_by_the_budget_not_by_what_was_spent():
    """A conversion at the δ the answers left over would move the filter's target with the analyst's choices, and
    a family of targets is not one filter: the δ of the conversion is a fixed share of the analyst's δ."""
    fresh = Budget("a", 10.0, 1e-5, 0.0, 0.0, 0.0, 0.0)
    selected = fresh.plus(Cost(0.5, 2e-6, 0.125, 2e-6))
    unselected = fresh.plus(Cost(0.5, 0.0, 0.125, 0.0))
    assert selected.epsilon_zcdp == unselected.epsilon_zcdp == pytest.approx(zcdp.epsilon_of(0.125, 2.5e-6))


def test_a_grant_of_delta_explains_the_spent_epsilon_and_leaves_delta_for_queries():
    from dpsql.accounting import describe_budget

    gaussian = zcdp.rho_for(0.5, 1e-7)  # answers with Gaussian noise at (0.5, 1e-7): zCDP composes them best
    spent = Budget("a", 10.0, 5e-6, 0.0, 0.0, 0.0, 0.0)
    for _ in range(20):
        spent = spent.plus(Cost(0.5, 1e-7, gaussian, 0.0))
    spent = spent.plus(Cost(0.1, 1e-14, 0.005, 1e-14))  # and one grouped answer with DP partition selection
    assert spent.epsilon_basic > spent.epsilon_total and spent.account == "zCDP" and spent.within
    granted = dataclasses.replace(spent, epsilon_total=1005.0, delta_total=5e-6 + 0.01)
    assert granted.account == "zCDP" and granted.epsilon_spent < spent.epsilon_spent / 1.5  # more δ: less ε
    assert granted.delta_committed == pytest.approx(1e-14)  # queries took only their own
    assert granted.delta_left == pytest.approx(granted.selection_delta_room - 1e-14)
    assert granted.plus(Cost(0.5, 1e-6, 0.125, 1e-6)).within
    text = describe_budget(granted, 1.0)
    assert f"ε spent {granted.epsilon_spent:.4g} of 1005" in text and "δ taken 1e-14" in text
    assert f"converted to ε at δ = {granted.conversion_delta:.3g}" in text
    assert "basic composition would give (10.1, 2e-06)" in text and "the ledger stops at (1005, 0.01)" in text
    extra = granted.plus(Cost.pure(1.0)).epsilon_spent - granted.epsilon_spent
    assert f"one more query at ε = 1 without δ spends {extra:.4g}" in text and extra > 0


def test_the_accounts_for_1_10_100_and_1000_mixed_laplace_and_gaussian_answers():
    """Each filter's total for n answers, half Laplace at ε = 0.1 and half Gaussian at (0.1, 1e-7), at an
    analyst's δ of 1e-5; the account shown is the tighter of those that hold."""
    gaussian = zcdp.rho_for(0.1, 1e-7)
    totals = {}
    for n in (1, 10, 100, 1000):
        budget = Budget("a", 1e6, 1e-5, 0.0, 0.0, 0.0, 0.0)
        for i in range(n):
            budget = budget.plus(Cost.pure(0.1) if i % 2 == 0 else Cost(0.1, 1e-7, gaussian, 0.0))
        laplace, normal = (n + 1) // 2, n // 2
        assert budget.epsilon_basic == pytest.approx(0.1 * n)
        assert budget.epsilon_zcdp == pytest.approx(zcdp.epsilon_of(laplace * 0.005 + normal * gaussian, 2.5e-6))
        totals[n] = (budget.epsilon_basic, budget.epsilon_zcdp, budget.account)
    # 1000 answers: basic composition's δ (500 · 1e-7) is past its half of 1e-5, so only zCDP holds, far below
    assert totals[1000][2] == "zCDP" and totals[1000][1] < totals[1000][0] / 4
    assert [totals[n][2] for n in (1, 10, 100)] == ["basic", "basic", "zCDP"]  # 10: 1 against 1.06


def test_partition_selection_delta_is_counted_beside_rho_not_taken_from_the_conversion():
    budget = Budget("a", 10.0, 1e-5, 0.0, 0.0, 0.0, 0.0).plus(Cost(0.5, 2e-6, 0.125, 2e-6))
    assert budget.epsilon_zcdp == pytest.approx(zcdp.epsilon_of(0.125, 2.5e-6))
    assert budget.zcdp_holds and not budget.plus(Cost(0.5, 1e-6, 0.125, 1e-6)).zcdp_holds  # 3e-6 > 2.5e-6


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
