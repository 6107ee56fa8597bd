"""TABLESAMPLE BERNOULLI: answered over the rows sampled, as PostgreSQL answers over them, with one secret seed for
every read of the table in a statement; REPEATABLE, SYSTEM, a percentage PostgreSQL rejects and other backends are
refused before any charge. (That a sample moves within the sensitivity: `test_neighbours.SAMPLED_QUERIES`.)"""

from __future__ import annotations

import re

import psycopg
import pytest

from dpsql import errors

SEED = re.compile(r"TABLESAMPLE BERNOULLI \(30\) REPEATABLE \((\d+)\)")


def _seed(statement: str) -> str:
    (seed,) = set(SEED.findall(statement))
    return seed


def test_a_sample_s_pre_noise_answer_is_postgresql_s_answer_over_the_same_rows(engine, base_url):
    sql = "SELECT sex, COUNT(*) FROM people TABLESAMPLE BERNOULLI (30) GROUP BY sex"
    prepared = engine.prepare(sql, epsilon=1.0)
    seeded = sql.replace("(30)", f"(30) REPEATABLE ({_seed(prepared.rewritten.sql)})")
    with psycopg.connect(base_url) as conn:
        ours = {row[0]: row[1] for row in conn.execute(prepared.rewritten.sql).fetchall()}
        exact = dict(conn.execute(seeded).fetchall())
        whole = dict(conn.execute("SELECT sex, COUNT(*) FROM people GROUP BY sex").fetchall())
    assert ours == exact  # one row a person: nothing cut
    assert all(0.2 * whole[k] < exact[k] < 0.4 * whole[k] for k in exact)


def test_each_query_draws_a_secret_seed_that_every_read_shares(engine, analyst):
    """A CTE read twice is one sample (PostgreSQL materialises it); the race and the answer read the same rows;
    the same text asked again is a new sample, charged again, as PostgreSQL draws a new one; the ledger records
    the query without its seed."""
    sql = "SELECT category, COUNT(*), SUM(amount) FROM visits TABLESAMPLE BERNOULLI (30) GROUP BY category"
    first, second = engine.prepare(sql, epsilon=1.0), engine.prepare(sql, epsilon=1.0)
    seeds = [set(SEED.findall(p.rewritten.sql)) for p in (first, second)]
    assert all(len(s) == 1 for s in seeds) and seeds[0] != seeds[1], seeds
    if first.race_statement is not None:
        assert set(SEED.findall(first.race_statement.sql)) == seeds[0]
    twice = engine.prepare("WITH s AS (SELECT person_id, amount FROM visits TABLESAMPLE BERNOULLI (30)) "
                           "SELECT COUNT(*), SUM(a.amount) FROM s a JOIN s b ON a.person_id = b.person_id",
                           epsilon=1.0)
    assert len(set(SEED.findall(twice.rewritten.sql))) == 1
    engine.query(sql, analyst=analyst, epsilon=0.5)
    engine.query(sql, analyst=analyst, epsilon=0.5)
    assert engine.budget(analyst).epsilon_spent == pytest.approx(1.0)
    recorded = [charge[4] for charge in engine.ledger.charges(analyst)]
    assert recorded and all("TABLESAMPLE BERNOULLI (30)" in t and "REPEATABLE" not in t for t in recorded), recorded


@pytest.mark.parametrize("sql,error,shown", [
    ("SELECT COUNT(*) FROM visits TABLESAMPLE BERNOULLI (10) REPEATABLE (42)", errors.UnsupportedQuery,
     "REPEATABLE is not supported"),  # a known seed ties the others' sample to where one person's rows are stored
    ("SELECT COUNT(*) FROM visits TABLESAMPLE SYSTEM (10)", errors.UnsupportedQuery, "TABLESAMPLE SYSTEM (10)"),
    ("SELECT COUNT(*) FROM visits TABLESAMPLE BERNOULLI ('150')", errors.InvalidConstant,
     "sample percentage must be between 0 and 100"),
    ("SELECT COUNT(*) FROM visits TABLESAMPLE BERNOULLI ('ten')", errors.InvalidConstant,
     'invalid input syntax for type real: "ten"'),
])
def test_a_sample_dpsql_does_not_answer_is_refused_before_any_charge(engine, analyst, sql, error, shown):
    with pytest.raises(error) as refused:
        engine.query(sql, analyst=analyst)
    assert shown in refused.value.message and "REPEATABLE (" not in refused.value.message  # no seed dpsql drew
    assert refused.value.hint and "BERNOULLI" in refused.value.hint
    if error is errors.InvalidConstant:  # PostgreSQL's invalid_tablesample_argument, invalid_text_representation
        assert refused.value.sqlstate == ("2202H" if "percentage" in shown else "22P02")
    assert engine.budget(analyst).epsilon_spent == 0


def test_a_sample_s_answers_are_unbiased_and_their_intervals_cover_the_sampled_truth(engine, base_url):
    """Over 200 answers, each of a new sample: the error against that sample's own count is centred on zero and
    its 95% interval holds it about as often as it says."""
    sql = "SELECT COUNT(*) FROM people TABLESAMPLE BERNOULLI (30)"
    engine.ledger.add_analyst("sampler", 1000.0, 1e-3)
    errors_, covered = [], 0
    with psycopg.connect(base_url) as conn:
        for _ in range(200):
            prepared = engine.prepare(sql, epsilon=0.5)
            (truth,), = conn.execute(sql.replace("(30)", f"(30) REPEATABLE ({_seed(prepared.rewritten.sql)})"))
            answer = engine._query(prepared, "sampler", None)
            value, accuracy = answer.rows[0][0], answer.accuracy[0][0]
            errors_.append(value - truth)
            covered += accuracy.ci_low <= truth <= accuracy.ci_high
    mean = sum(errors_) / len(errors_)
    spread = (sum((e - mean) ** 2 for e in errors_) / (len(errors_) - 1)) ** 0.5
    assert abs(mean) <= 4 * spread / len(errors_) ** 0.5, (mean, spread)
    assert 0.9 <= covered / len(errors_) <= 0.99, covered
