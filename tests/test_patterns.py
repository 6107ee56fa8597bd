"""Regular expressions (`~`, `~*`, `SIMILAR TO`): a pattern is answered only where PostgreSQL compiles it
whatever the data (it compiles a pattern when a row first reaches it, so a failure would tell whether one
does), and every backend reads it alike."""

from __future__ import annotations

import random
import re

import duckdb
import psycopg
import pytest

from dpsql import errors
from dpsql.sql.patterns import check_regex, similar_to_regex

ALPHABET = list("ab.^$|()[]*+?{}\\-:,0129dwyiD") + ["(?:", "(?i)", "{2,3}", "[a-z]", "\\d"]


def _accepted(pattern: str) -> bool:
    try:
        check_regex(pattern)
    except errors.UnsupportedQuery:
        return False
    return True


def test_every_pattern_dpsql_accepts_compiles_on_postgresql_and_duckdb(server):
    """2,000 random strings over the regular expressions' characters: each that `check_regex` accepts compiles
    on PostgreSQL (constant-folded when planned, so no row is read) and on DuckDB (RE2)."""
    rng = random.Random(7)
    patterns = {"".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 9))) for _ in range(2000)}
    accepted = sorted(p for p in patterns if _accepted(p))
    assert len(accepted) > 150  # the grammar is exercised, not only its refusals
    failed = []
    with psycopg.connect(server.url, autocommit=True) as conn:
        for pattern in accepted:
            try:
                conn.execute("SELECT 'ab' ~ %s", (pattern,))
            except psycopg.errors.InvalidRegularExpression as exc:
                failed.append((pattern, "postgresql", str(exc)))
    duck = duckdb.connect()
    for pattern in accepted:
        try:
            duck.execute("SELECT regexp_matches('ab', ?)", [pattern]).fetchall()
        except duckdb.Error as exc:
            failed.append((pattern, "duckdb", str(exc)))
    assert not failed, failed[:10]


@pytest.mark.parametrize("pattern", ["^ph", "(?i)lab|dent", "^[A-M]\\w*$", "(?:ab)+c{2,3}?", "\\.", "[\\d_-]", "a|"])
def test_the_patterns_analysts_write_are_accepted(pattern):
    check_regex(pattern)


@pytest.mark.parametrize("pattern,named", [
    ("(a", "unmatched '('"), ("a)", "unmatched ')'"), ("a**", "nothing to repeat"), ("a{256}", "at most 255"),
    ("[z-a]", "range z-a"), ("[[:alpha:]]", "POSIX classes"), ("\\y", "escape \\y"), ("(?=a)", "group option"),
    ("x}", "stray '}'"), ("(a{2}){3}", "counted repetition"), ("a" * 201, "over dpsql's 200"),
])
def test_a_pattern_outside_the_shared_subset_is_refused_by_what_is_wrong(pattern, named):
    with pytest.raises(errors.UnsupportedQuery) as refused:
        check_regex(pattern)
    assert named in str(refused.value)


def test_similar_to_is_postgresqls_own_translation(server):
    """`x SIMILAR TO p` is answered as `x ~ similar_to_regex(p)`: on PostgreSQL both match the same values."""
    values = ["CA", "CO", "ca", "C", "", "a.b", "axb", "abcd", "cd", "%x", "_x", "ab.cd"]
    patterns = ["C%", "a_b", "(ab|cd)%", "[%_]x", "%.%", "C_", "a\\.b", "(ab)*"]
    with psycopg.connect(server.url, autocommit=True) as conn:
        for pattern in patterns:
            regex = similar_to_regex(pattern)
            check_regex(regex)
            for value in values:
                similar, matched = conn.execute("SELECT %s SIMILAR TO %s, %s ~ %s",
                                                (value, pattern, value, regex)).fetchone()
                assert similar == matched, (value, pattern, regex)


def test_pattern_matches_are_answered_and_a_bad_pattern_costs_nothing(engine, analyst):
    answer = engine.query("SELECT category, COUNT(*) FROM visits WHERE category ~* '^(LAB|dent)' GROUP BY 1",
                          analyst=analyst, epsilon=1.0)
    assert answer.names == ["category", "count"]
    similar = engine.query("SELECT COUNT(*) FROM people WHERE state SIMILAR TO 'C%'", analyst=analyst, epsilon=1.0)
    assert len(similar.rows) == 1
    before = engine.budget(analyst)
    with pytest.raises(errors.UnsupportedQuery, match="unmatched"):
        engine.query("SELECT COUNT(*) FROM people WHERE state ~ '(a'", analyst=analyst, epsilon=1.0)
    with pytest.raises(errors.UnsupportedQuery, match=re.escape("the SIMILAR TO pattern '(a%' (read as")):
        engine.query("SELECT COUNT(*) FROM people WHERE state SIMILAR TO '(a%'", analyst=analyst, epsilon=1.0)
    with pytest.raises(errors.UnsupportedQuery, match="is not text"):
        engine.query("SELECT COUNT(*) FROM people WHERE age ~ '1'", analyst=analyst, epsilon=1.0)
    assert engine.budget(analyst) == before
