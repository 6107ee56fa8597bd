"""A neighbour fuzzer, in the spirit of SQLancer: random queries from a grammar of what dpsql accepts, each run
before noise on a database and on neighbours that differ by one unit (or, under row-level privacy, one row) with
extreme values. For every pair it asserts what the privacy argument needs:

- the query is refused before anything runs, or it runs on both databases without an error (an error on one
  side only is a membership test; an error on both is an accepted query that is not total);
- every exact pre-noise statistic moves by no more than the analysis claims (L1, L2, groups touched), the count
  of units per group moves within the group cap, histogram and top-k scores within their sensitivities, and a
  key released by partition selection appears or disappears only with its count of units;
- the answer cache merges only what PostgreSQL answers alike: each query is respelled (literals with leading or
  trailing zeros, an exponent), and where the respelling gets the same cache key its exact rows on the base
  must be the same;
- a key present on both sides reads the same as a client would receive it (its exact text, after the engine's
  `released_key`): PostgreSQL returns a group's key as its first row spells it, so a neighbour that only spells
  a value differently (`5.0`/`5.00`, `0`/`-0`), stored first, must not change the text.

`tests/test_fuzz.py` runs a few hundred pairs in CI; `benchmarks/fuzz_neighbours.py` runs as many as asked and
reports what it tried and found. Everything is seeded: a violation is reproduced by its seed and query number.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from dpsql import errors
from dpsql.accounting import new_hash_seed
from dpsql.backends import PostgresBackend
from dpsql.config import Settings
from dpsql.engine import Engine
from dpsql.mechanisms import rank_scores
from dpsql.noise import released_key
from dpsql.prepared import Prepared
from dpsql.schema import parse_schema
from dpsql.session import Options
from dpsql.sql.dialect import Statement

EXTREME = 10**9

# --- the unit-level world: people, their visits, prescriptions through visits, public states -----------------

UNIT_SCHEMA = {
    "privacy": {"unit": "people.person_id", "max_groups_per_unit": 3},
    "tables": {
        "people": {"columns": {
            "person_id": "bigint", "age": {"type": "integer", "lower": 0, "upper": 100},
            "income": {"type": "double precision", "lower": 0, "upper": 200000},
            "score": "double precision", "balance": "numeric", "state": "text",
            "sex": {"type": "text", "domain": ["F", "M"]},
            "born": {"type": "date", "lower": "1930-01-01", "upper": "2020-12-31"},
            "seen": {"type": "timestamptz", "lower": "2024-01-01T00:00:00+00:00",
                     "upper": "2024-12-31T23:59:59+00:00"},
            "nick": "text"}},  # bpchar in the database: equality ignores trailing spaces, its text keeps them
        # no foreign keys (trust_link): orphan and NULL links are part of what is fuzzed
        "visits": {"unit_column": "person_id", "max_rows_per_unit": 5, "trust_link": True, "columns": {
            "visit_id": "bigint", "person_id": "bigint", "day": "date", "category": "text",
            "amount": {"type": "double precision", "lower": 0, "upper": 1000}, "note": "text"}},
        "prescriptions": {"parent": "visit_id -> visits.visit_id", "max_rows_per_unit": 8, "trust_link": True,
                          "columns": {
            "rx_id": "bigint", "visit_id": "bigint", "drug": "text",
            "cost": {"type": "double precision", "lower": 0, "upper": 200}}},
        "states": {"public": True, "columns": {"code": {"type": "text", "unique": True}, "region": "text"}},
    },
}
UNIT_DDL = """
CREATE TABLE people (person_id bigint PRIMARY KEY, age integer, income double precision, score double precision,
                     balance numeric, state text, sex text, born date, seen timestamptz, nick bpchar);
CREATE TABLE visits (visit_id bigint PRIMARY KEY, person_id bigint, day date, category text,
                     amount double precision, note text);
CREATE TABLE prescriptions (rx_id bigint, visit_id bigint, drug text, cost double precision);
CREATE TABLE states (code text PRIMARY KEY, region text);
INSERT INTO states VALUES ('CA', 'West'), ('NY', 'East'), ('TX', 'South'), ('WA', 'West'), ('ZZ', 'Nowhere');
"""
STATES = ["CA", "NY", "TX", "WA", None]
CATEGORIES = ["lab", "dental", "checkup", "", "a|b", None]
NOTES = ["ok", "", "x|y", "back\\slash", None, "lab"]
NICKS = ["a", "a", "b ", "", None]
DRUGS = ["insulin", "ibuprofen", "", None]


def _maybe(rng: random.Random, value: Any, null_share: float = 0.08) -> Any:
    return None if rng.random() < null_share else value


def load_unit_world(url: str, people: int = 150, seed: int = 5) -> None:
    """A small base database: NULLs, empty strings and separators in keys, rows without a unit."""
    rng = random.Random(seed)
    person_rows, visit_rows, rx_rows = [], [], []
    for pid in range(1, people + 1):
        person_rows.append((pid, _maybe(rng, rng.randint(0, 100)), _maybe(rng, rng.uniform(0, 150000)),
                            _maybe(rng, rng.uniform(-5, 15)), _maybe(rng, round(rng.uniform(-100, 1000), 2)),
                            rng.choice(STATES), _maybe(rng, rng.choice("FM")),
                            _maybe(rng, f"{rng.randint(1930, 2020)}-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}"),
                            _maybe(rng, f"2024-0{rng.randint(1, 9)}-1{rng.randint(0, 9)} {rng.randint(10, 23)}:00+00"),
                            rng.choice(NICKS)))
        for _ in range(rng.randint(0, 4)):
            vid = len(visit_rows) + 1
            visit_rows.append((vid, pid, _maybe(rng, f"2024-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}"),
                               rng.choice(CATEGORIES), _maybe(rng, rng.uniform(0, 900)), rng.choice(NOTES)))
            for _ in range(rng.randint(0, 2)):
                rx_rows.append((len(rx_rows) + 1, vid, rng.choice(DRUGS), _maybe(rng, rng.uniform(0, 150))))
    for _ in range(5):  # visits of nobody: no unit, so no neighbour may move them
        visit_rows.append((len(visit_rows) + 1, None, "2024-05-05", "lab", 100.0, "orphan"))
        rx_rows.append((len(rx_rows) + 1, None, "insulin", 10.0))
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(UNIT_DDL)
        cur.executemany("INSERT INTO people VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)", person_rows)
        cur.executemany("INSERT INTO visits VALUES (%s, %s, %s, %s, %s, %s)", visit_rows)
        cur.executemany("INSERT INTO prescriptions VALUES (%s, %s, %s, %s)", rx_rows)
        cur.execute("ANALYZE")


def _add_person(conn: psycopg.Connection, person: tuple, visits: list[tuple], drugs: list[str],
                costs: list[str | None]) -> None:
    """Adds one unit: the person, its visits and three prescriptions on each visit."""
    pid = person[0]
    with conn.cursor() as cur:
        cur.execute("INSERT INTO people VALUES (%s, %s, %s::float8, %s::float8, %s::numeric, %s, %s, %s::date, "
                    "%s::timestamptz, %s)", (*person, *(["a"] if len(person) == 9 else [])))
        rows = [(pid * 10_000 + i, pid, *visit) for i, visit in enumerate(visits)]
        cur.executemany("INSERT INTO visits VALUES (%s, %s, %s::date, %s, %s::float8, %s)", rows)
        rx = [(pid * 100_000 + i, pid * 10_000 + i // 3, drugs[i % len(drugs)], costs[i % len(costs)])
              for i in range(3 * len(rows))]
        cur.executemany("INSERT INTO prescriptions VALUES (%s, %s, %s, %s::float8)", rx)


def _extreme_numbers(conn: psycopg.Connection) -> None:
    amounts = ["1e308", "-1e308", "NaN", None, "5e5", "-5", "999.5", "Infinity", "-Infinity"]
    visits = [(f"2024-0{1 + i % 9}-1{i % 10}", ["lab", "brand-new", "", None][i % 4], amounts[i % len(amounts)],
               ["x" * 100_000, "", "a|b", None][i % 4]) for i in range(400)]
    _add_person(conn, (EXTREME, 2147483647, "1e300", "NaN", "1e400", "ZZ", "X", "2024-01-01", "2024-01-01 00:00+00"),
                visits, ["insulin", "undeclared", None], ["1e308", "-1e308", "NaN", None, "7e4", "Infinity"])


def _extreme_dates(conn: psycopg.Connection) -> None:
    days = ["infinity", "-infinity", "1000000-01-01", "4713-01-01 BC", "9999-12-31", "0001-01-01", None]
    visits = [(days[i % len(days)], ["lab", None, "", "a|b"][i % 4], str(i), ["back\\", "\\", "%_", None][i % 4])
              for i in range(60)]
    _add_person(conn, (EXTREME, -2147483648, "-1e300", "Infinity", "-1e400", None, None, "infinity",
                       "294276-12-31 00:00+00"), visits, ["", None], [None, "-Infinity"])


def _heavy_ties(conn: psycopg.Connection) -> None:
    """Thousands of rows, identical duplicates, and groups that differ only by where a NULL is."""
    visits = [("2024-03-03", ["lab", None][i % 2], "10", [None, "lab"][i % 2]) for i in range(3000)]
    _add_person(conn, (EXTREME, 50, "50000", "5", "5", "CA", "F", "1980-01-01", None), visits,
                ["insulin", "insulin", None], ["10"])


def _unit_removed(conn: psycopg.Connection) -> None:
    """The other direction of add-remove: the base without its heaviest person."""
    heavy = conn.execute("SELECT person_id FROM visits WHERE person_id IS NOT NULL GROUP BY 1 "
                         "ORDER BY COUNT(*) DESC, 1 LIMIT 1").fetchone()[0]
    conn.execute("DELETE FROM prescriptions WHERE visit_id IN (SELECT visit_id FROM visits WHERE person_id = %s)",
                 (heavy,))
    conn.execute("DELETE FROM visits WHERE person_id = %s", (heavy,))
    conn.execute("DELETE FROM people WHERE person_id = %s", (heavy,))


def _spelling(conn: psycopg.Connection) -> None:
    """One person added, stored and numbered (-1) before everyone else, whose values equal others' but are spelled
    otherwise: the first person's balance with trailing zeros, an income whose key rounds to -0 where others'
    round to 0, a nickname with trailing spaces (bpchar), and a visit with its amount spelled with zeros."""
    first = conn.execute("SELECT balance FROM people WHERE balance IS NOT NULL ORDER BY person_id LIMIT 1").fetchone()
    balance = f"{first[0]:f}" + ("000" if "." in f"{first[0]:f}" else ".000")
    for table in ("people", "visits"):
        conn.execute(f"CREATE TEMP TABLE kept_{table} AS SELECT * FROM {table}")
        conn.execute(f"TRUNCATE {table}")  # a new, empty heap: the added person's rows are read first
    _add_person(conn, (-1, 40, "40000", "-0", balance, "CA", "F", "1980-01-01", "2024-03-03 10:00+00", "a   "),
                [("2024-03-03", "lab", "100.000", "ok")], ["insulin"], ["10.00"])
    for table in ("people", "visits"):
        conn.execute(f"INSERT INTO {table} SELECT * FROM kept_{table}")
    conn.execute("ANALYZE")


UNIT_NEIGHBOURS: dict[str, Callable[[psycopg.Connection], None]] = {
    "extreme_numbers": _extreme_numbers, "extreme_dates": _extreme_dates, "heavy_ties": _heavy_ties,
    "unit_removed": _unit_removed, "spelling": _spelling,
}

# --- the row-level world: events in a LIST-partitioned table, accounts without a unique constraint ------------

ROW_SCHEMA = {
    "privacy": {"unit": "row", "max_groups_per_unit": 1},
    "tables": {
        "events": {"columns": {
            "event_id": {"type": "bigint", "unique": True}, "account_id": {"type": "bigint", "max_frequency": 6},
            "kind": {"type": "text", "domain": [f"k{i}" for i in range(8)]},
            "amount": {"type": "double precision", "lower": 0, "upper": 100}, "day": "date"}},
        "accounts": {"columns": {
            "account_id": {"type": "bigint", "unique": True}, "tier": "text",
            "balance": {"type": "double precision", "lower": 0, "upper": 1000}}},
        "regions": {"public": True, "columns": {"code": {"type": "text", "unique": True}, "area": "text"}},
    },
}
ROW_DDL = """
CREATE TABLE events (event_id bigint, account_id bigint, kind text, amount double precision, day date)
    PARTITION BY LIST (kind);
CREATE TABLE accounts (account_id bigint, tier text, balance double precision);
CREATE TABLE regions (code text PRIMARY KEY, area text);
INSERT INTO regions VALUES ('gold', 'A'), ('silver', 'B');
"""


def load_row_world(url: str, seed: int = 7) -> None:
    """Events spread over eight partitions (so ctids repeat across them), an account over its declared frequency
    (so truncation ranks rows), and events without an account (NULL keys under NOT IN)."""
    rng = random.Random(seed)
    ddl = ROW_DDL + "".join(f"CREATE TABLE events_k{i} PARTITION OF events FOR VALUES IN ('k{i}');\n"
                            for i in range(8))
    accounts = [(a, rng.choice(["gold", "silver", None]), rng.uniform(0, 900)) for a in range(1, 61)]
    events = []
    for e in range(1, 401):
        account = 1 if e <= 12 else (None if e % 25 == 0 else rng.randint(2, 60))
        events.append((e if e != 7 else 8, account, f"k{e % 8}", _maybe(rng, rng.uniform(0, 90)),
                       f"2024-0{1 + e % 9}-1{e % 10}"))
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(ddl)
        cur.executemany("INSERT INTO accounts VALUES (%s, %s, %s)", accounts)
        cur.executemany("INSERT INTO events VALUES (%s, %s, %s, %s, %s)", events)
        cur.execute("ANALYZE")


ROW_NEIGHBOURS: dict[str, Callable[[psycopg.Connection], None]] = {
    "event_in_full_account": lambda c: c.execute(
        "INSERT INTO events VALUES (8, 1, 'k3', 'NaN', 'infinity')"),
    "account_duplicated": lambda c: c.execute("INSERT INTO accounts VALUES (1, 'gold', 1e308)"),
    "event_without_account": lambda c: c.execute(
        "INSERT INTO events VALUES (999999, NULL, 'k5', 1e308, '1000000-01-01')"),
    "account_removed": lambda c: c.execute("DELETE FROM accounts WHERE account_id = 2"),
}


# --- the grammar --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Source:
    sql: str
    aliases: tuple[str, ...]


UNIT_SOURCES = [
    Source("people p", ("p",)), Source("visits v", ("v",)), Source("prescriptions r", ("r",)),
    Source("visits v JOIN people p ON v.person_id = p.person_id", ("v", "p")),
    Source("people p LEFT JOIN visits v ON v.person_id = p.person_id", ("p", "v")),
    Source("prescriptions r JOIN visits v ON r.visit_id = v.visit_id", ("r", "v")),
    Source("people p JOIN states s ON s.code = p.state", ("p", "s")),
    Source("states s LEFT JOIN people p ON p.state = s.code", ("s", "p")),  # every state a key, even empty ones
    Source("visits v LEFT JOIN prescriptions r ON r.visit_id = v.visit_id", ("v", "r")),
    # per-unit subqueries joined to a unit's several rows: tables of one row per unit, their values clamped
    Source("visits v JOIN (SELECT w.person_id, COUNT(*) AS n, SUM(w.amount) AS s FROM visits w "
           "GROUP BY w.person_id) t ON t.person_id = v.person_id", ("v", "t")),
    Source("(SELECT person_id, CASE WHEN COUNT(*) > 2 THEN 'many' ELSE 'few' END AS b, MAX(amount) AS m FROM visits "
           "WHERE amount > 10 GROUP BY person_id HAVING SUM(amount) > 50) u RIGHT JOIN visits v "
           "ON u.person_id = v.person_id", ("u", "v")),
    # windows over each person's rows, read from a windowed source (ties broken by the row), and DISTINCT ON
    Source("(SELECT v.*, ROW_NUMBER() OVER (PARTITION BY v.person_id ORDER BY v.day) AS rn, LAG(v.amount) OVER "
           "(PARTITION BY v.person_id ORDER BY v.day) AS prev FROM visits v WHERE v.amount > 10) v", ("v", "vw")),
    Source("(SELECT DISTINCT ON (person_id) * FROM visits ORDER BY person_id, day DESC) v JOIN people p "
           "ON p.person_id = v.person_id", ("v", "p")),
    # a window over a person's rows joined to their one row, a LAG's default, inside the subquery
    Source("(SELECT v.*, p.sex, ROW_NUMBER() OVER (PARTITION BY v.person_id ORDER BY v.amount DESC) AS rn, "
           "LAG(v.amount, 1, -1) OVER (PARTITION BY v.person_id ORDER BY v.day) AS prev FROM visits v LEFT JOIN "
           "people p ON p.person_id = v.person_id WHERE p.age > 30) v", ("v", "vw")),
]
BOUNDED = {"p": ["p.age", "p.income"], "v": ["v.amount"], "r": ["r.cost"], "t": ["t.n", "t.s"], "u": ["u.m"],
           "vw": ["v.rn", "v.prev"]}
UNBOUNDED = {"p": ["p.score", "p.balance"]}
TEXT = {"p": ["p.state", "p.sex"], "v": ["v.category", "v.note"], "r": ["r.drug"], "s": ["s.region"], "u": ["u.b"]}
DATES = {"p": ["p.born", "p.seen"], "v": ["v.day"]}
BOUNDED_DATES = {"p": ["p.born", "p.seen"]}
UNIT_OF = {"p": "p.person_id", "v": "v.person_id"}


def _pick(rng: random.Random, pools: dict[str, list[str]], aliases: tuple[str, ...]) -> str | None:
    options = [c for a in aliases for c in pools.get(a, [])]
    return rng.choice(options) if options else None


def _predicate(rng: random.Random, aliases: tuple[str, ...]) -> str | None:
    number, text = _pick(rng, BOUNDED, aliases), _pick(rng, TEXT, aliases)
    date, loose = _pick(rng, DATES, aliases), _pick(rng, UNBOUNDED, aliases)
    unit = next((UNIT_OF[a] for a in aliases if a in UNIT_OF), None)
    choices: list[str | None] = [
        number and f"{number} > {rng.choice([0, 10, 500, 1e6])}",
        number and f"{number} BETWEEN 10 AND 100",
        number and f"{number} IS NULL",
        number and f"{number} / (floor({number} / 50) + 1) > 1",
        text and f"{text} IN ('lab', '', 'CA', 'a|b')",
        text and f"{text} LIKE '{rng.choice(['a%', '%|%', '%', 'Z%', 'back%'])}'",
        text and f"{text} LIKE '{rng.choice(['Z', 'back', 'lab'])}\\'",  # ends in its escape: refused
        text and f"{text} ILIKE '%\\\\%'",
        text and f"substring({text}, {rng.choice([1, -3, 2])}, {rng.choice([2, 0, -1])}) = 'la'",
        text and f"substring({text} FROM '(') = 'x'",
        text and f"length({text}) > {rng.choice([0, 3, 1000])}",
        text and f"lower({text}) || 'x' = 'labx'",
        date and f"EXTRACT({rng.choice(['YEAR', 'MONTH', 'DOW', 'HOUR'])} FROM {date}) > 3",
        date and f"date_trunc('{rng.choice(['month', 'millennium', 'week', 'fortnight'])}', {date}) IS NULL",
        date and f"CAST({date} AS timestamp) > '2024-01-01'",
        date and f"{date} >= '2024-06-01'",
        loose and f"width_bucket({loose}, 0, 10, 5) = 1",
        loose and f"CAST({loose} AS double precision) > 0",
        loose and f"CAST({loose} AS real) > 0",
        loose and f"{loose} > 0",
        unit and f"EXISTS (SELECT 1 FROM visits w WHERE w.person_id = {unit} AND w.amount > 500)",
        unit and f"{unit} NOT IN (SELECT w.person_id FROM visits w WHERE w.amount > 999)",
        unit and f"{unit} IN (SELECT w.person_id FROM visits w WHERE w.category = 'lab')",
        unit and f"EXISTS (SELECT 1 FROM visits w WHERE w.person_id = {unit} AND w.category = 'lab') AND NOT EXISTS "
                 f"(SELECT 1 FROM visits w WHERE w.person_id = {unit} AND w.amount > 999)",  # one name, two scopes
        "v" in aliases and "NOT EXISTS (SELECT 1 FROM prescriptions q WHERE q.visit_id = v.visit_id AND q.cost > 100)",
        "p" in aliases and "p.state IN (SELECT code FROM states WHERE region = 'West')",
        "p" in aliases and "p.state NOT IN (SELECT code FROM states WHERE region = 'Nowhere')",
        "NOT EXISTS (SELECT 1 FROM visits w WHERE w.amount > 999)",  # not tied to the unit: refused
        "CAST(2.50 AS text) = '2.50'",  # true, and false for 2.500: a literal's scale is part of the question
    ]
    return rng.choice([c for c in choices if c])


def _group_key(rng: random.Random, aliases: tuple[str, ...]) -> str | None:
    pools = {
        "p": ["p.sex", "p.state", "p.balance", "round((p.income - 50000) / 100000)", "p.nick",
              "width_bucket(p.age, 0, 100, 5)", "floor(p.income / 50000)",
              "CASE WHEN p.age < 30 THEN 'young' ELSE 'old' END", "p.born", "date_trunc('year', p.born)",
              "EXTRACT(YEAR FROM p.born)", "p.seen", "date_trunc('month', p.seen)", "width_bucket(p.score, 0, 10, 5)",
              "CAST(p.born AS timestamp)", "to_char(p.born, 'YYYY-MM')",
              "to_timestamp(floor(extract(epoch from p.seen) / 3600) * 3600)", "p.seen + INTERVAL '90 minutes'",
              "date_trunc('week', p.born + INTERVAL '1 day') - INTERVAL '1 day'", "extract(epoch from p.born) * 1000",
              "round(p.age::numeric, -1)"],
        "v": ["v.category", "v.day", "date_trunc('month', v.day)", "EXTRACT(MONTH FROM v.day)", "v.note",
              "substring(v.note, 1, 2)", "lower(v.category)", "floor(extract(epoch from v.day) / 86400) * 86400",
              "to_char(v.day, 'IYYY-IW')"],
        "r": ["r.drug"], "s": ["s.region"], "t": ["t.n", "CASE WHEN t.s > 200 THEN 'big' ELSE 'small' END"],
        "u": ["u.b", "u.m > 100"],
    }
    return _pick(rng, pools, aliases)


def _measure(rng: random.Random, aliases: tuple[str, ...]) -> str:
    number, text, date = _pick(rng, BOUNDED, aliases), _pick(rng, TEXT, aliases), _pick(rng, DATES, aliases)
    bounded_date = _pick(rng, BOUNDED_DATES, aliases)
    unit = next((UNIT_OF[a] for a in aliases if a in UNIT_OF), None)
    choices: list[str | None] = [
        "COUNT(*)", text and f"COUNT({text})", unit and f"COUNT(DISTINCT {unit})",
        text and f"COUNT(DISTINCT {text})", date and f"COUNT(DISTINCT {date})",
        number and f"{rng.choice(['SUM', 'AVG', 'VAR_POP', 'STDDEV'])}({number})",
        number and f"SUM({number} * 2 + 1)", number and f"AVG(COALESCE({number}, 0))",
        number and f"SUM(GREATEST({number} - 100, 0))", number and f"SUM(sqrt({number}))",
        number and f"SUM(ln({number} + 1))", number and f"SUM(round({number}))",
        number and f"SUM(sign({number} - 50) + cbrt({number}))", number and f"AVG(log({number} + 1))",
        number and f"SUM(power({number}, 2))",
        number and f"SUM(floor({number} / 250) / (floor({number} / 50) + 1))",
        number and f"SUM(CASE WHEN {number} > 50 THEN 1 ELSE 0 END)",
        number and f"percentile_cont(0.5) WITHIN GROUP (ORDER BY {number})",
        number and f"{rng.choice(['MIN', 'MAX'])}({number})",
        date and f"SUM(EXTRACT(MONTH FROM {date}))",
        bounded_date and f"{rng.choice(['MIN', 'MAX'])}({bounded_date})",
        "p" in aliases and "COUNT(ROUND(p.balance, 1) * 2 + p.score)",
        bounded_date and f"percentile_disc(0.3) WITHIN GROUP (ORDER BY {bounded_date})",
        date and f"SUM(CAST(EXTRACT(YEAR FROM {date}) AS integer) - 2000)",
        "p" in aliases and "mode() WITHIN GROUP (ORDER BY p.sex)",
        "p" in aliases and "SUM(width_bucket(p.score, 0, 10, 5))",
        number and f"{rng.choice(['CORR', 'COVAR_POP', 'COVAR_SAMP', 'REGR_SLOPE', 'REGR_INTERCEPT'])}"
                   f"({number}, {_pick(rng, BOUNDED, aliases)})",
    ]
    return rng.choice([c for c in choices if c])


DERIVED = [
    "SELECT n, COUNT(*) FROM (SELECT person_id, COUNT(*) AS n FROM visits GROUP BY person_id) t GROUP BY n",
    # a person's first value by an ordered array (a windowed source's FIRST_VALUE, read by its MIN)
    "SELECT first_cat, COUNT(*), SUM(n), AVG(a) FROM (SELECT person_id, COUNT(*) AS n, (array_agg(category ORDER BY "
    "amount DESC))[1] AS first_cat, (array_agg(amount ORDER BY day))[1] AS a FROM visits WHERE amount > 1 "
    "GROUP BY person_id) t GROUP BY 1",
    "SELECT COUNT(*), AVG(total) FROM (SELECT v.person_id, SUM(v.amount) AS total FROM visits v "
    "GROUP BY v.person_id) t",
    "SELECT COUNT(*) FROM (SELECT person_id, COUNT(*) AS n FROM visits GROUP BY person_id) t "
    "WHERE EXISTS (SELECT 1 FROM visits w WHERE w.person_id = t.person_id AND w.amount > 500)",
    # chains of WITH queries, inlined as the nested subqueries above
    "WITH a AS (SELECT person_id, COUNT(*) AS n FROM visits GROUP BY person_id), b AS (SELECT n, COUNT(*) AS c "
    "FROM a GROUP BY n) SELECT * FROM b",
    "WITH f AS (SELECT v.person_id, SUM(v.amount) AS total FROM visits v GROUP BY v.person_id), g AS (SELECT total "
    "FROM f WHERE total > 100) SELECT COUNT(*), AVG(total) FROM g",
    # a unit's first date, and columns of the unit's own row beside the unit in the subquery's GROUP BY
    "SELECT date_trunc('year', b) AS y, COUNT(*) FROM (SELECT p.person_id, MIN(p.born) AS b, COUNT(v.visit_id) AS n "
    "FROM people p LEFT JOIN visits v ON v.person_id = p.person_id GROUP BY p.person_id) t GROUP BY 1",
    "SELECT m, COUNT(*), SUM(n) FROM (SELECT p.person_id, MIN(date_trunc('month', p.born)::date) AS m, "
    "COUNT(v.visit_id) AS n FROM people p LEFT JOIN visits v ON v.person_id = p.person_id GROUP BY p.person_id) t "
    "GROUP BY m",
    "SELECT sex, COUNT(*), SUM(n) FROM (SELECT p.person_id, p.sex, p.nick, COUNT(v.visit_id) AS n FROM people p "
    "LEFT JOIN visits v ON v.person_id = p.person_id GROUP BY p.person_id, p.sex, p.nick) t GROUP BY sex",
    "SELECT region, COUNT(*) FROM (SELECT p.person_id, s.region, SUM(v.amount) AS total FROM people p JOIN states s "
    "ON s.code = p.state JOIN visits v ON v.person_id = p.person_id GROUP BY p.person_id, s.region) t "
    "WHERE total > 100 GROUP BY region",
    # a per-unit subquery joined to the unit's own row, and a public table to that row: joined inside it
    "SELECT p.sex, COUNT(*), AVG(t.total) FROM people p JOIN (SELECT person_id, SUM(amount) AS total FROM visits "
    "WHERE amount > 10 GROUP BY person_id) t ON t.person_id = p.person_id GROUP BY p.sex",
    "WITH t AS (SELECT person_id, COUNT(*) AS n FROM visits GROUP BY person_id) SELECT s.region, SUM(t.n), COUNT(*) "
    "FROM t LEFT JOIN people p ON p.person_id = t.person_id LEFT JOIN states s ON s.code = p.state GROUP BY 1",
    "SELECT p.sex, COUNT(t.person_id), AVG(COALESCE(t.n, 0)) FROM people p LEFT JOIN (SELECT person_id, COUNT(*) "
    "AS n FROM visits WHERE category <> 'lab' GROUP BY person_id) t ON t.person_id = p.person_id GROUP BY p.sex",
    # outputs computed from a per-unit subquery's aggregates (computed outside it), and a condition as a key
    "SELECT bucket, COUNT(*), AVG(spend) FROM (SELECT p.person_id, CASE WHEN COUNT(v.visit_id) = 0 THEN 'none' "
    "ELSE 'some' END AS bucket, SUM(v.amount) / COUNT(v.visit_id) AS spend FROM people p LEFT JOIN visits v "
    "ON v.person_id = p.person_id GROUP BY p.person_id) t GROUP BY bucket",
    "SELECT v.amount > 100 AS big, COUNT(*), SUM(v.amount) FROM visits v GROUP BY 1",
    # a window over each person's rows inside a subquery: a per-person subquery joined to them
    "SELECT bucket, COUNT(*), SUM(m) FROM (SELECT v.amount AS m, CASE WHEN SUM(v.amount) OVER (PARTITION BY "
    "v.person_id) > 100 THEN 'hi' ELSE 'lo' END AS bucket FROM visits v WHERE v.amount > 10) t GROUP BY 1",
    "SELECT t.category, COUNT(*), SUM(t.running), AVG(t.q) FROM (SELECT v.category, SUM(v.amount) OVER (PARTITION BY "
    "v.person_id ORDER BY v.day ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) AS running, NTILE(3) OVER (PARTITION BY "
    "v.person_id ORDER BY v.amount) AS q FROM visits v) t WHERE t.running > 20 GROUP BY 1",
    # a subquery by unit and key regrouped by the key, and the people beside a sum
    "SELECT t.note, COUNT(*), AVG(t.n), SUM(t.s) FROM (SELECT v.person_id, v.note, COUNT(*) AS n, SUM(v.amount) AS s "
    "FROM visits v WHERE v.amount > 10 GROUP BY 1, 2) t GROUP BY t.note",
    "SELECT v.category, SUM(v.amount), COUNT(DISTINCT v.person_id) FROM visits v GROUP BY 1",
    # groups within a unit: by a visit (its key, or the prescriptions' parent key), a row per group outside
    "SELECT AVG(t.n), COUNT(*), SUM(t.s), MAX(t.s) FROM (SELECT r.visit_id, COUNT(*) AS n, SUM(r.cost) AS s "
    "FROM prescriptions r GROUP BY r.visit_id) t",
    "SELECT t.n, COUNT(*), AVG(t.a) FROM (SELECT v.visit_id, v.note, COUNT(r.rx_id) AS n, MAX(v.amount) AS a "
    "FROM visits v LEFT JOIN prescriptions r ON r.visit_id = v.visit_id GROUP BY v.visit_id, v.note) t GROUP BY t.n",
    "SELECT t.note, MAX(t.n), COUNT(*) FROM (SELECT p.person_id, v.note, COUNT(v.visit_id) AS n FROM people p "
    "LEFT JOIN visits v ON v.person_id = p.person_id GROUP BY p.person_id, v.note) t GROUP BY t.note",
    "SELECT v.note, COUNT(DISTINCT v.person_id) FILTER (WHERE v.amount > 10), COUNT(DISTINCT CASE WHEN v.category "
    "= 'a' THEN v.person_id END) FROM visits v GROUP BY 1",
    "SELECT p.sex, COUNT(v.*), AVG(v.amount) FROM people p LEFT JOIN visits v ON v.person_id = p.person_id "
    "GROUP BY p.sex",  # COUNT(v.*): the rows v matched
    # sets of people combined by INTERSECT, EXCEPT and UNION (a subquery by person with HAVING, or semijoins)
    "SELECT COUNT(*) FROM (SELECT person_id FROM visits WHERE amount > 10 INTERSECT SELECT w.person_id FROM visits w "
    "WHERE w.category = 'a' EXCEPT SELECT person_id FROM visits WHERE note = 'x') t",
    "SELECT p.sex, COUNT(*), SUM(p.income) FROM people p WHERE p.person_id IN (SELECT person_id FROM visits WHERE "
    "amount > 100 UNION SELECT person_id FROM visits WHERE category = 'a') GROUP BY p.sex",
    # a calendar and a list of keys joined to a table: the table filtered to the list, every listed key released
    "SELECT d::date, COUNT(v.visit_id), SUM(v.amount) FROM generate_series(DATE '2024-01-01', DATE '2024-03-31', "
    "INTERVAL '1 week') d LEFT JOIN visits v ON v.day = d::date GROUP BY 1",
    "SELECT c.k, COUNT(v.visit_id), AVG(v.amount) FROM (VALUES ('lab'), ('dental'), ('a|b'), ('')) AS c(k) "
    "LEFT JOIN visits v ON v.category = c.k AND v.amount > 10 GROUP BY c.k",
    "SELECT n, COUNT(p.person_id) FROM generate_series(0, 120, 10) n JOIN people p ON p.age = n GROUP BY n",
]


def unit_query(rng: random.Random) -> str:
    """A random query over the unit-level world."""
    if rng.random() < 0.06:
        return rng.choice(DERIVED)
    source = rng.choice(UNIT_SOURCES)
    measures = list(dict.fromkeys(_measure(rng, source.aliases) for _ in range(rng.randint(1, 3))))
    keys = list(dict.fromkeys(k for _ in range(rng.choice([0, 1, 1, 2])) if (k := _group_key(rng, source.aliases))))
    conditions = [c for _ in range(rng.choice([0, 1, 1, 2])) if (c := _predicate(rng, source.aliases))]
    sql = f"SELECT {', '.join([*keys, *measures])} FROM {source.sql}"
    if conditions:
        sql += " WHERE " + " AND ".join(conditions)
    if keys:
        sql += " GROUP BY " + ", ".join(keys)
        if "COUNT(*)" in measures and rng.random() < 0.3:
            sql += " ORDER BY COUNT(*) DESC LIMIT 2"
    return sql


ROW_SOURCES = [
    Source("events e", ("e",)), Source("events e JOIN accounts a ON a.account_id = e.account_id", ("e", "a")),
    Source("accounts a LEFT JOIN events e ON e.account_id = a.account_id", ("a", "e")),
    Source("events e JOIN accounts a ON a.account_id = e.account_id JOIN regions g ON g.code = a.tier",
           ("e", "a", "g")),
]
ROW_CONDITIONS = [
    "e.amount > 50", "e.kind IN ('k1', 'k3')", "e.day >= '2024-05-01'",
    "EXISTS (SELECT 1 FROM accounts b WHERE b.account_id = e.account_id AND b.tier = 'gold')",
    "e.account_id NOT IN (SELECT b.account_id FROM accounts b WHERE b.balance > 999)",
    "e.account_id IN (SELECT b.account_id FROM accounts b WHERE b.balance > 500)",
    "NOT EXISTS (SELECT 1 FROM accounts b WHERE b.balance > 999)",
]
ROW_DERIVED = [
    "SELECT COUNT(*), SUM(n) FROM (SELECT e.account_id, COUNT(*) AS n FROM events e GROUP BY e.account_id) t",
    "SELECT COUNT(*), SUM(n) FROM (SELECT e.account_id, COUNT(*) AS n FROM events e GROUP BY e.account_id) t "
    "WHERE NOT EXISTS (SELECT 1 FROM accounts b WHERE b.balance > 999)",
    "SELECT n, COUNT(*) FROM (SELECT e.account_id, COUNT(*) AS n FROM events e GROUP BY e.account_id) t GROUP BY n",
]


def row_query(rng: random.Random) -> str:
    """A random query over the row-level world."""
    if rng.random() < 0.15:
        return rng.choice(ROW_DERIVED)
    source = rng.choice(ROW_SOURCES)
    aggregates = ["COUNT(*)", "SUM(e.amount)", "AVG(e.amount)", "COUNT(DISTINCT e.account_id)",
                  "percentile_cont(0.5) WITHIN GROUP (ORDER BY e.amount)"]
    keys = [k for k in ("e.kind", "e.day", "a.tier", "g.area") if k[0] in source.aliases and rng.random() < 0.3][:1]
    conditions = [c for c in ROW_CONDITIONS if rng.random() < 0.15]
    sql = f"SELECT {', '.join([*keys, *rng.sample(aggregates, rng.randint(1, 2))])} FROM {source.sql}"
    if conditions:
        sql += " WHERE " + " AND ".join(conditions)
    if keys:
        sql += " GROUP BY " + ", ".join(keys)
    return sql


# --- the databases -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class World:
    schema: dict
    load: Callable[[str], None]
    neighbours: dict[str, Callable[[psycopg.Connection], None]]
    generate: Callable[[random.Random], str]


WORLDS = {"unit": World(UNIT_SCHEMA, load_unit_world, UNIT_NEIGHBOURS, unit_query),
          "row": World(ROW_SCHEMA, load_row_world, ROW_NEIGHBOURS, row_query)}


def build_world(admin_url: str, url_for: Callable[[str], str], name: str) -> tuple[str, dict[str, str]]:
    """Creates the world's base database and one copy per neighbour; returns their URLs."""
    world = WORLDS[name]
    template = f"dpsql_fuzz_{name}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for db in [template, f"{template}_base", *(f"{template}_{n}" for n in world.neighbours)]:
            conn.execute(f"DROP DATABASE IF EXISTS {db}")
        conn.execute(f"CREATE DATABASE {template}")
        world.load(url_for(template))
        conn.execute(f"CREATE DATABASE {template}_base TEMPLATE {template}")
        for neighbour in world.neighbours:
            conn.execute(f"CREATE DATABASE {template}_{neighbour} TEMPLATE {template}")
    for neighbour, change in world.neighbours.items():
        with psycopg.connect(url_for(f"{template}_{neighbour}"), autocommit=True) as conn:
            change(conn)
    return url_for(f"{template}_base"), {n: url_for(f"{template}_{n}") for n in world.neighbours}


@contextmanager
def open_world(name: str, base: str, neighbours: dict[str, str]) -> Iterator[tuple[Engine, dict[str, PostgresBackend]]]:
    """An engine over world `name`'s base database, and a backend for the base ("base") and each neighbour."""
    engine = Engine(Settings(database=base), parse_schema(WORLDS[name].schema))
    backends = {n: PostgresBackend(url, max_connections=1) for n, url in {"base": base, **neighbours}.items()}
    try:
        yield engine, backends
    finally:
        for backend in backends.values():
            backend.close()
        engine.close()


class SparkDatabase:
    """One exported database on the shared Spark session: its Parquet files become the tables' views before each
    statement (the fuzzer runs one statement at a time)."""

    def __init__(self, engine, paths: dict[str, Path]):
        self.engine, self.paths = engine, paths

    @contextmanager
    def session(self) -> Iterator:
        spark = self.engine.backend.spark
        for table, path in self.paths.items():
            spark.read.parquet(str(path)).createOrReplaceTempView(table)
        with self.engine.backend.session() as session:
            yield session


@contextmanager
def spark_world(name: str, base: str, neighbours: dict[str, str], folder: Path):
    """An engine on a local Spark session over world `name`, and a database per exported copy."""
    from dpsql.demo import export_parquet

    world = WORLDS[name]
    tables = tuple(t for t, spec in world.schema["tables"].items())
    exported = {n: export_parquet(url, folder / n, tables) for n, url in {"base": base, **neighbours}.items()}
    raw = {**world.schema, "tables": {t: {**spec, "path": str(exported["base"][t])}
                                      for t, spec in world.schema["tables"].items()}}
    engine = Engine(Settings(database="spark://local[2]", ledger=base), parse_schema(raw))
    try:
        yield engine, {n: SparkDatabase(engine, paths) for n, paths in exported.items()}
    finally:
        engine.close()


@contextmanager
def duckdb_world(name: str, base: str, neighbours: dict[str, str], folder: Path):
    """An engine on DuckDB per exported copy of world `name` (each loads its copy's Parquet files into its own
    in-memory database): the base's engine, and each copy's backend to read it."""
    from dpsql.demo import export_parquet

    world = WORLDS[name]
    engines = {}
    try:
        for copy, url in {"base": base, **neighbours}.items():
            paths = export_parquet(url, folder / copy, tuple(world.schema["tables"]))
            raw = {**world.schema, "tables": {t: {**spec, "path": str(paths[t])}
                                              for t, spec in world.schema["tables"].items()}}
            engines[copy] = Engine(Settings(database="duckdb:///:memory:", ledger=base), parse_schema(raw))
        yield engines["base"], {copy: engine.backend for copy, engine in engines.items()}
    finally:
        for engine in engines.values():
            engine.close()


# --- the check ----------------------------------------------------------------------------------------------

@dataclass
class Exact:
    """Pre-noise results of one prepared query on one database: rows by group key and histograms."""

    rows: dict[tuple, list[float]]
    histograms: dict[str, dict[tuple, list[int]]]
    bounds: list[int] | None = None  # the bounds' effect: counts of units (rewrite/bounds.py)
    spelled: dict[tuple, tuple[str, ...]] = field(default_factory=dict)  # each key's text, as a client reads it


def run_exact(prepared: Prepared, backend: PostgresBackend) -> Exact:
    """The rewritten SQL on one database, read the way the engine reads it (its backend, its loaders)."""
    plan = prepared.plan
    n_keys = len(plan.group_keys)
    read = _read(backend, prepared.rewritten.statement)
    rows = {released_key(r[:n_keys]): [float(v or 0) for v in r[n_keys:]] for r in read}
    spelled = {released_key(r[:n_keys]): tuple(map(str, released_key(r[:n_keys]))) for r in read}
    histograms = {}
    for histogram in plan.histograms:
        cells: dict[tuple, list[int]] = {}
        for r in _read(backend, prepared.rewritten.histogram_statements[histogram.name]):
            cells.setdefault(released_key(r[:n_keys]), [0] * histogram.cells)[int(r[n_keys])] += int(r[n_keys + 1])
        histograms[histogram.name] = cells
    statement = prepared.rewritten.bounds
    bounds = None if statement is None else [int(v or 0) for v in _read(backend, statement.statement)[0]]
    return Exact(rows, histograms, bounds, spelled)


def _read(backend: PostgresBackend | SparkDatabase, statement: Statement) -> list[tuple]:
    """The rows of one statement on one database, rendered and read as the engine renders and reads it."""
    with backend.session() as session:
        return session.run(statement)


def claim_violations(prepared: Prepared, before: Exact, after: Exact) -> list[str]:
    """Every way the exact answers on two neighbouring databases move more than the analysis claims."""
    plan = prepared.plan
    found = []
    width = len(plan.measures) + 1
    zero = [0.0] * width
    keys = before.rows.keys() | after.rows.keys()
    for i, measure in enumerate(plan.measures):
        pairs = [(before.rows.get(k, zero)[i], after.rows.get(k, zero)[i]) for k in keys]
        moves = [abs(b - a) for a, b in pairs]
        l1, l2 = sum(moves), math.sqrt(sum(m * m for m in moves))
        if l1 > measure.sensitivity * (1 + 1e-9) + 1e-9:
            found.append(f"{measure.label}: L1 move {l1:g} > sensitivity {measure.sensitivity:g}")
        if l2 > measure.l2_sensitivity * (1 + 1e-9) + 1e-9:
            found.append(f"{measure.label}: L2 move {l2:g} > {measure.l2_sensitivity:g}")
        # a float sum's last bits follow the plan's summation order, also in groups no neighbour touched: a group
        # whose terms reach 5e7 each and whose sum is near 1 moved by 1.9e-9 (seed 57, a centred product's sum)
        rounding = 1e-12 * max(abs(measure.row_range.lo), abs(measure.row_range.hi))
        shifts = sorted((abs(b - a) for a, b in pairs if abs(b - a) > max(1e-9 * max(1.0, abs(a), abs(b)), rounding)),
                        reverse=True)
        if len(shifts) > measure.coordinates:
            found.append(f"{measure.label}: {len(shifts)} groups moved > {measure.coordinates} (by "
                         f"{', '.join(f'{shift:.3g}' for shift in shifts[:4])})")
        if plan.top_k is not None and plan.top_k.measure == measure.name and moves \
                and max(moves) > plan.top_k.sensitivity + 1e-9:
            found.append(f"top-k count moved {max(moves):g} > {plan.top_k.sensitivity:g}")
    # the counts partition selection reads: units (once per group, in max_groups groups), or rows (a unit's k
    # kept rows; the joined rows under row-level joins), each within what the selection was calibrated for
    units = [abs(after.rows.get(k, zero)[-1] - before.rows.get(k, zero)[-1]) for k in keys]
    per_group, total = plan.selection_moves
    total = plan.max_groups * per_group if total is None else total
    if any(m > per_group for m in units) or sum(units) > total:
        found.append(f"selection counts moved {units} (each at most {per_group}, {total} in all)")
    for agg in plan.aggregates:
        if agg.kind not in ("quantile", "mode"):
            continue
        histogram = plan.histogram[agg.measures[0]]
        old_cells, new_cells = before.histograms[histogram.name], after.histograms[histogram.name]
        empty = [0] * histogram.cells
        moves = []
        for k in old_cells.keys() | new_cells.keys():
            old, new = old_cells.get(k, empty), new_cells.get(k, empty)
            if agg.kind == "quantile":
                old, new = rank_scores(old, agg.quantile), rank_scores(new, agg.quantile)
            moves.append(max(abs(a - b) for a, b in zip(old, new, strict=True)))
        if moves and (max(moves) > histogram.rows or sum(moves) > histogram.sensitivity):
            found.append(f"{agg.sql}: scores moved {max(moves)} in a group, {sum(moves)} in all "
                         f"(claims {histogram.rows}, {histogram.sensitivity:g})")
    respelled = [(before.spelled[k], after.spelled[k]) for k in before.spelled.keys() & after.spelled.keys()
                 if before.spelled[k] != after.spelled[k]]
    if respelled:
        found.append(f"keys spelled otherwise on the neighbour: {respelled[:3]}")
    if before.bounds is not None and any(abs(a - b) > 1 for a, b in zip(before.bounds, after.bounds, strict=True)):
        found.append(f"bounds' effect counts moved from {before.bounds} to {after.bounds} (each at most 1)")
    return found


_NUMBER = re.compile(r"(?<![\w.])(\d+)(\.\d+)?(?![\w.])")


def respell(sql: str, rng: random.Random) -> str:
    """`sql` with its number literals (outside strings) spelled otherwise: a leading zero, a trailing zero after
    the point (another scale: a different literal in PostgreSQL), or a decimal written with an exponent."""
    def spell(match: re.Match) -> str:
        whole, fraction = match.group(1), match.group(2) or ""
        choice = rng.randrange(4)
        if choice == 0:
            return f"0{whole}{fraction}"
        if choice == 1 and fraction:
            return f"{whole}{fraction}0"
        if choice == 2 and fraction:
            return f"{whole}{fraction[1:]}e-{len(fraction) - 1}"
        return match.group(0)
    parts = sql.split("'")
    return "'".join(_NUMBER.sub(spell, part) if i % 2 == 0 else part for i, part in enumerate(parts))


@dataclass
class Report:
    pairs: int = 0  # query and neighbour pairs compared
    queries: int = 0
    refused: int = 0
    respelled: int = 0  # respellings that got the query's cache key, their exact rows compared
    race_reads: int = 0  # answers read from the race's pass compared with their bounded statement
    weighted: int = 0  # bounded answers whose partition selection weighs each unit's kept rows
    violations: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"{self.queries} queries ({self.refused} refused before execution), {self.pairs} neighbour pairs "
                f"compared, {self.respelled} respellings sharing a cache key compared, {self.race_reads} answers "
                f"read from the race compared, {self.weighted} bounded answers with weighted selection, "
                f"{len(self.violations)} violations")


def _same_values(one: dict[tuple, list[float]], other: dict[tuple, list[float]]) -> bool:
    """The same groups with the same values, up to the last bits of a float sum: DuckDB adds a group's floats in
    parallel, in an order that changes from run to run (27.333973147668 and 27.333973147667997 for one statement
    run twice)."""
    return one.keys() == other.keys() and all(
        len(one[k]) == len(other[k]) and all(math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)
                                             for a, b in zip(one[k], other[k], strict=True)) for k in one)


def respelling_violations(engine: Engine, prepared: Prepared, sql: str, before: Exact, base: PostgresBackend,
                          rng: random.Random) -> tuple[bool, list[str]]:
    """Whether a respelling of `sql` shares its cache key, and how its exact rows differ from `before` if so."""
    variant = respell(sql, rng)
    try:
        other = engine.prepare(variant)
    except errors.Error:
        return False, []
    if other.key != prepared.key:
        return False, []
    again = run_exact(other, base)
    if (again.spelled, again.histograms) != (before.spelled, before.histograms) \
            or not _same_values(again.rows, before.rows):
        return True, [f"the respelling {variant!r} shares the cache key but answers otherwise"]
    return True, []


def fuzz(engine: Engine, generate: Callable[[random.Random], str], base: PostgresBackend,
         neighbours: dict[str, PostgresBackend], count: int, seed: int, report: Report | None = None) -> Report:
    """Generate `count` queries with `seed` and compare each, run on `base`, with every neighbour."""
    report = report or Report()
    rng = random.Random(seed)
    # which rows a bound keeps follows the ledger's keyed-hash seed, drawn when a world's ledger is created
    hash_seed = engine.ledger.setting("hash_seed", new_hash_seed)  # the engine stored it; this only reads it
    for number in range(count):
        sql = generate(rng)
        report.queries += 1
        where = f"[seed {seed}, query {number}, hash seed {hash_seed}] {sql}"
        try:
            prepared = engine.prepare(sql)
        except errors.Error:
            report.refused += 1
            continue
        except Exception as exc:  # noqa: BLE001 - a crash in the analysis is a finding, not a test error
            report.violations.append(f"{where}: prepare crashed: {type(exc).__name__}: {exc}")
            continue
        try:
            before = run_exact(prepared, base)
        except errors.Error as exc:
            report.violations.append(f"{where}: fails on the base: {exc}")
            continue
        # its own generator, so the queries a seed generates stay the ones it generated before this check
        compared, wrong = respelling_violations(engine, prepared, sql, before, base, random.Random(f"{seed}/{number}"))
        report.respelled += compared
        report.violations += [f"{where}: {v}" for v in wrong]
        report.violations += [f"{where}: {v}" for v in
                              _neighbour_violations(prepared, before, base, neighbours, report)]
        # rows per unit chosen from the data (dpsql.rows_per_unit = auto): what the race reads moves by at most
        # each τ, and the answer bounded at a smaller k (any the race may choose) keeps its claims
        rows_rng = random.Random(f"{seed}/{number}/rows")
        auto = engine.prepare(sql, options=Options(rows_per_unit="auto"))
        if auto.race is not None and rows_rng.random() < 0.5:
            report.violations += [f"{where} (rows per unit auto): {v}"
                                  for v in race_violations(auto, base, neighbours)]
            tau = rows_rng.choice(auto.race.taus)
            rows_tau = rows_rng.choice(auto.rows_race.taus) if auto.rows_race is not None else None
            # at a cap, the fallback's declared plan, or the margin's reach analysed as chosen
            bounded = engine._bounded_at(auto, tau, 0.0, rows_tau, rows_rng.random() < 0.5)
            report.weighted += bounded.plan.selects_on_weights
            exact = run_exact(bounded, base)
            report.violations += [f"{where} (at {bounded.plan.rows_per_unit} rows per unit): {v}" for v in
                                  _neighbour_violations(bounded, exact, base, neighbours, report)]
            if auto.race_answers and tau < auto.race.taus[-1]:
                report.race_reads += 1
                report.violations += [f"{where} (at τ = {tau}): {v}" for v in _read_from_race(auto, tau, exact, base)]
    return report


def _neighbour_violations(prepared: Prepared, before: Exact, base: PostgresBackend,
                          neighbours: dict[str, PostgresBackend], report: Report) -> list[str]:
    found = []
    for name, backend in neighbours.items():
        report.pairs += 1
        try:
            after = run_exact(prepared, backend)
        except errors.Error as exc:
            found.append(f"runs on the base but fails on neighbour {name}: {exc}")
            continue
        found += [f"neighbour {name}: {v}" for v in claim_violations(prepared, before, after)]
    return found


def _read_from_race(prepared: Prepared, tau: int, exact: Exact, base: PostgresBackend) -> list[str]:
    """Where the engine reads the answer from the race's pass (`race_answers`, below the cap), the race's value
    at τ must be the bounded statement's own measure: the neighbour checks of that statement then cover it."""
    read = float(_read(base, prepared.race_statement)[0][prepared.race.taus.index(tau)])
    statement = exact.rows.get((), [0.0])[0]
    if abs(read - statement) > 1e-9 * max(1.0, abs(statement)):
        return [f"the race read {read} where the statement bounded at τ returns {statement}"]
    return []


def race_violations(prepared: Prepared, base: PostgresBackend, neighbours: dict[str, PostgresBackend]) -> list[str]:
    """Each of the race's truncated counts moves by at most its τ (times 2 under replace) on every neighbour (truncated
    sums of floats up to the rounding of their summation order, which the grid the race releases them on covers),
    and each count of the units above a τ that its fallback compares by at most 1 (2)."""
    steps = 2 if prepared.plan.neighbouring == "replace" else 1
    races = [race for race in (prepared.race, prepared.rows_race) if race is not None]  # their values, in order
    taus = [tau for race in races for tau in race.taus]
    before = [float(v) for v in _read(base, prepared.race_statement)[0]]
    found = []
    for name, backend in neighbours.items():
        after = [float(v) for v in _read(backend, prepared.race_statement)[0]]
        moves = [abs(a - b) for a, b in zip(before, after, strict=True)]
        slack = [1e-12 * max(1.0, abs(a), abs(b)) for a, b in zip(before, after, strict=True)]
        if any(move > steps * tau + s for move, tau, s in zip(moves, taus, slack, strict=True)):
            found.append(f"neighbour {name}: the race's counts moved {moves} (each at most {taus})")
        # the sparse vector fallback compares the units above each τ, each of sensitivity `steps`
        start = 0
        for race in races:
            end = start + len(race.taus)
            above = [abs(a - b) for a, b in zip(race.units_above(before[start:end]), race.units_above(after[start:end]),
                                                strict=True)]
            if any(move > steps + 1e-12 * max(1.0, *map(abs, before)) for move in above):
                found.append(f"neighbour {name}: the units above each τ moved {above} (each at most {steps})")
            start = end
    return found
