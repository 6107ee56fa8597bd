"""Accuracy is correctness (issue 36): on the demo data, whose heaviest 2% of people hold about 14% of the visits,
the shipped schema's answers carry no bias beyond 1% and their 95% intervals cover the exact answer at least 93%
of the time, for each query class a new user meets first.

Each check is a test of a hypothesis on fresh answers: it fails when the bias is demonstrably beyond 1% (by more
than three standard errors) or the coverage demonstrably below 93%, so a true 95% coverage does not fail one run in
fifty by chance. `benchmarks/bench_accuracy.py` measures the same classes at 20,000 and 100,000 people and prints
the point estimates (benchmarks/results/accuracy.md).
"""

from __future__ import annotations

import math

import psycopg
import pytest

from dpsql.config import Settings
from dpsql.demo import load_demo_data
from dpsql.engine import Engine
from dpsql.schema import load_schema
from dpsql.session import Options
from tests.accuracy import QUESTIONS, exact, measure
from tests.conftest import SHIPPED_SCHEMA, database_url

MAX_BIAS = 0.01
MIN_COVERAGE = 0.93
RUNS = 60
PEOPLE = 20_000
CLASSES = ["visits by quarter", "visits by month", "visits by category", "SUM(amount) by quarter", "lab and dental",
           "AVG(amount)", "AVG(amount) by category", "SUM(amount)", "spend per person",
           "visits per drug", "AVG(income) by sex", "stddev(amount)", "days beside visits, by category"]


@pytest.fixture(scope="module")
def people_url(server) -> str:
    """The demo data with 20,000 people (a fifth of what `dpsql demo` makes)."""
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS dpsql_accuracy")
        conn.execute("CREATE DATABASE dpsql_accuracy")
    url = database_url(server, "dpsql_accuracy")
    load_demo_data(url, people=PEOPLE, seed=3)
    return url


@pytest.fixture(scope="module")
def shipped(people_url):
    engine = Engine(Settings(database=people_url), load_schema(SHIPPED_SCHEMA))
    yield engine
    engine.close()


@pytest.mark.parametrize("label", CLASSES)
def test_answers_are_unbiased_and_their_intervals_cover_the_truth(shipped, people_url, label):
    _assert_unbiased_and_covered(shipped, people_url, label, 1.0)


@pytest.mark.parametrize("label", ["visits by quarter", "visits by category"])
def test_at_small_epsilon_a_coarse_race_keeps_the_tail_of_the_counts(shipped, people_url, label):
    """At ε = 0.1 the race resolves the demo's counts only coarsely (5 shifts): with MARGIN alone they came back
    3-5% low with 36-75% coverage; twice the margin keeps the heavy people's visits."""
    _assert_unbiased_and_covered(shipped, people_url, label, 0.1)


def _assert_unbiased_and_covered(engine: Engine, url: str, label: str, epsilon: float) -> None:
    sql = QUESTIONS[label]
    truth = exact(url, sql)
    found = measure(engine, sql, truth, RUNS, epsilon)
    covered = len(found.covered)
    coverage_error = math.sqrt(MIN_COVERAGE * (1 - MIN_COVERAGE) / covered)
    print(f"{label} at ε = {epsilon:g}: bias {found.bias:+.4f} ± {found.bias_error:.4f}, coverage "
          f"{found.coverage:.3f} of {covered}, median error {found.median_error:.4f}")
    assert abs(found.bias) - 3 * found.bias_error <= MAX_BIAS, f"{label}: bias {found.bias:+.2%}"
    assert found.coverage + 3 * coverage_error >= MIN_COVERAGE, f"{label}: coverage {found.coverage:.1%}"
    assert found.keys == set(truth)  # every key asked for, and no other (public keys: all of them)


def test_where_the_race_cannot_resolve_the_data_the_answer_lends_it_a_sparse_vector_choice(shipped, people_url):
    """At ε = 0.1 the race's share cannot see the demo's per-person totals (before the resolution rule, sums and
    averages came back 34% low; with the rule alone they kept the cap, at 65% median error): a quarter of the
    answer's ε chooses the first bound that few people exceed, and the answer keeps the rest. At ε = 1 the race
    resolves the data and the answer keeps its whole share."""
    sql = QUESTIONS["SUM(amount) by quarter"]
    with psycopg.connect(people_url) as conn:
        for epsilon, resolved in ((0.1, False), (1.0, True)):
            prepared = shipped.prepare(sql, epsilon=epsilon)
            truncated = [float(v) for v in conn.execute(prepared.race_sql).fetchone()]
            chosen = [shipped.bounded_by_race(prepared, truncated)[0] for _ in range(20)]
            kept = {round(c.calibration.epsilon / prepared.calibration.epsilon, 6) for c in chosen}
            # lent: a quarter to the fallback's choice where the race cannot resolve the data, 5% to count the
            # units over a bound below the cap, and where the race resolved it, 10% to raise a bound that count
            # shows many units exceed (never the fallback's: CI once saw 0.6 at ε = 0.1)
            assert kept <= ({1.0, 0.95, 0.85} if resolved else {0.75, 0.7}), (epsilon, kept)
            below_cap = [c.plan.unit_total for c in chosen if c.plan.unit_total is not None]
            assert len(below_cap) >= 15, (epsilon, below_cap)


def test_an_averages_count_shares_the_sparse_vector_choice_where_its_race_cannot_resolve(shipped, people_url):
    """An AVG's count races each unit's rows beside the race over its totals; at ε = 0.1 neither resolves the
    demo's data. Before, the count kept its declared cap (100 rows a person) and its noise dwarfed the small
    categories' counts (AVG by category: 81% median error, +480% bias); now the two choices share the quarter the
    answer lends, so the answer keeps what it kept before and the count's bound is chosen too."""
    sql = QUESTIONS["AVG(amount) by category"]
    with psycopg.connect(people_url) as conn:
        prepared = shipped.prepare(sql, epsilon=0.1)
        truncated = [float(v) for v in conn.execute(prepared.race_sql).fetchone()]
    chosen = [shipped.bounded_by_race(prepared, truncated)[0] for _ in range(20)]
    kept = {round(c.calibration.epsilon / prepared.calibration.epsilon, 6) for c in chosen}
    assert kept <= {0.75, 0.7}, kept  # a quarter lent in all (and 5% to count the units over a bound below the cap)
    rows_below_cap = [c.plan.rows_per_unit for c in chosen if c.plan.rows_per_unit < prepared.rows_race.taus[-1]]
    assert len(rows_below_cap) >= 10, rows_below_cap  # before: none (the cap kept)


def test_an_answer_bounded_at_the_cap_says_so(shipped):
    """Where the race ends at its cap (here every unit holds more than it), the answer's noise is the cap's: it
    said nothing of its bound before; it names the cap and why its interval is wide. Where the margin kept above
    the bound chosen reaches the cap, it says that instead."""
    prepared = shipped.prepare("SELECT SUM(amount) FROM visits", epsilon=1.0)
    truncated = [1000.0 * tau for tau in prepared.race.taus]  # 1,000 units, each beyond every τ
    bounded, _ = shipped.bounded_by_race(prepared, truncated)
    assert bounded.bound_note.startswith(f"bounded at the cap, a total of {prepared.race.taus[-1]:,} per unit")
    assert "the data did not show a smaller bound" in bounded.bound_note  # every τ leaves the 1,000 units above
    counted = shipped.prepare("SELECT COUNT(*) FROM visits", epsilon=1.0)  # every unit holds 50 rows: τ = 64,
    truncated = [1000.0 * min(tau, 50) for tau in counted.race.taus]  # its margin beyond the cap of 100
    notes = {shipped.bounded_by_race(counted, truncated)[0].bound_note for _ in range(20)}
    assert any("bound chosen from the data (64)" in (note or "") for note in notes), notes


def test_the_schema_sets_the_default_and_a_session_may_declare_instead(shipped):
    """`[privacy] rows_per_unit = "auto"` makes every query choose its bounds; `SET dpsql.rows_per_unit =
    'declared'` answers with the declared caps; another value is refused with what it may be."""
    from dpsql.errors import SchemaError
    from dpsql.schema import parse_schema

    assert shipped.schema.rows_per_unit == "auto"
    assert shipped.prepare("SELECT COUNT(*) FROM visits").race is not None
    assert shipped.prepare("SELECT COUNT(*) FROM visits", options=Options(rows_per_unit="declared")).race is None
    with pytest.raises(SchemaError, match="rows_per_unit = 'guess' must be one of declared, auto"):
        parse_schema({"privacy": {"unit": "people.person_id", "rows_per_unit": "guess"},
                      "tables": {"people": {"columns": {"person_id": "bigint"}}}})


def test_an_answer_bounded_by_the_race_says_how_many_units_hold_more(shipped):
    """Below the cap, 5% of the answer's ε counts the units holding more than the chosen bound, and the answer
    says so with its interval and share of the units read; a loss over 1% of the units even at the interval's
    low end is called out. Where the count sent the bound higher (`RaceToTheTop.raised`), the answer says which
    bound it keeps and why."""
    from dpsql.mechanisms.race import UnitsOver
    from dpsql.postprocess import describe_units_over

    shipped.ledger.add_analyst("units_over", 100.0, 1e-3)
    notes = [shipped.query("SELECT SUM(amount) FROM visits", analyst="units_over", epsilon=1.0,
                           options=Options(rows_per_unit="auto")).notes for _ in range(3)]
    told = [n for answer in notes for n in answer if "chosen from the data" in n]
    assert told and all("units read hold more (95%:" in n and "counted at ε = 0.04" in n for n in told), notes
    quiet = describe_units_over(UnitsOver(64, 20.0, 60.0, 10_000.0, 0.04), totals=False)
    assert quiet.startswith("bounded at 64 rows per unit") and "at least" not in quiet
    loud = describe_units_over(UnitsOver(64, 400.0, 60.0, 10_000.0, 0.04), totals=True)
    assert "at least 3.4% of the units lose their totals beyond it" in loud
    assert describe_units_over(None, totals=False) is None
    few = describe_units_over(UnitsOver(4, 41.0, 60.0, 12.0, 0.04), totals=False)  # noisy counts of few units
    assert "about 12 of the 12 units read hold more (95%: 0 to 12, 0-100%" in few
    raised = describe_units_over(UnitsOver(4_096, 400.0, 60.0, 10_000.0, 0.04), totals=True, raised=131_072)
    assert raised.startswith("bounded at a total of 131,072 per unit, chosen from the data: above the race's bound "
                             "of a total of 4,096 per unit about 400 of the 10,000 units read hold more")
    assert raised.endswith("a sparse vector raised it to the first bound that few units exceed")
    from dpsql.postprocess import describe_chosen  # nothing counted over it (a count of distinct values' race)
    assert describe_chosen(8, totals=False) == "bounded at 8 rows per unit, chosen from the data"


def test_a_cut_shows_beside_the_answer_s_noise_over_all_its_cells(shipped):
    """`visible_cut`: the units over a bound, each cutting at least the bound, whose cut exceeds the 95% half-width
    of the answer's noise on its total over all cells, in bounds: √cells times a cell's half-width per bound. It
    reads the calibration at the declared caps and the cells, both public; a Gaussian answer has one too."""
    from dpsql.chosen_bounds import visible_cut

    for sql, cells in (("SELECT SUM(amount) FROM visits", 1),
                       ("SELECT category, SUM(amount) FROM visits GROUP BY category", 8)):
        for mechanism in ("laplace", "gaussian"):
            prepared = shipped.prepare(sql, epsilon=1.0, options=Options(rows_per_unit="auto", mechanism=mechanism))
            (sum_noise,) = prepared.calibration.mechanisms.values()
            found = visible_cut(prepared.calibration, prepared.plan.cells, prepared.race.steps)
            assert found == pytest.approx(sum_noise.ci_halfwidth() / sum_noise.sensitivity * math.sqrt(cells)), sql
            assert 0 < found < prepared.race.fallback_threshold(0.08)  # more eager than the sparse vector's alone


def test_a_median_by_category_lands_within_its_rank_error_of_the_asked_rank(shipped, people_url):
    """A percentile is chosen from a histogram whose rank error is proportional to the rows each unit keeps: 8
    (`chosen_bounds.CHOSEN_ROWS`), not a race's choice. At four times the race's τ the demo's median amount by
    category was 7.1% off (median of 30 answers; 38% at the 90th percentile), at τ 1.5% (8.7%), at 8 rows 1.2%
    (5.4%). Each answer's
    rank in the exact data is within its reported rank error of the asked rank (the rows the bound leaves out
    move it little: the demo's heavy people spend as others do) in at least 93% of the cells, and the median error
    is a few percent."""
    import bisect

    sql = "SELECT category, percentile_cont(0.5) WITHIN GROUP (ORDER BY amount) FROM visits GROUP BY category"
    with psycopg.connect(people_url) as conn:
        values: dict[str, list[float]] = {}
        for category, amount in conn.execute("SELECT category, amount FROM visits WHERE amount IS NOT NULL"):
            values.setdefault(category, []).append(float(amount))
        truth = dict(conn.execute(sql).fetchall())
    for found in values.values():
        found.sort()
    covered, errors = [], []
    for run in range(20):
        analyst = f"median_{run}"
        shipped.ledger.add_analyst(analyst, 100.0, 1e-3)
        answer = shipped.query(sql, analyst=analyst, epsilon=1.0)
        for (category, value), (_, accuracy) in zip(answer.rows, answer.accuracy, strict=True):
            found = values[category]
            below, upto = bisect.bisect_left(found, value), bisect.bisect_right(found, value)
            asked = 0.5 * len(found)
            covered.append(max(0.0, below - asked, asked - upto) <= accuracy.rank_error)
            errors.append(abs(value - truth[category]) / truth[category])
    coverage = sum(covered) / len(covered)
    median_error = sorted(errors)[len(errors) // 2]
    print(f"median by category: rank coverage {coverage:.3f} of {len(covered)}, median error {median_error:.4f}")
    assert coverage >= MIN_COVERAGE and median_error < 0.05, (coverage, median_error)
