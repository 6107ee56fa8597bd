"""Shared fixtures: one real embedded PostgreSQL per test session, with the demo data and a neighbour."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from dpsql.config import Settings
from dpsql.demo import load_demo_data
from dpsql.embedded import EmbeddedPostgres
from dpsql.engine import Engine
from dpsql.schema import load_schema
from tests import golden

if golden.RECORD_ENV in os.environ:  # `python -m tests.golden` collects the queries of one test run
    golden.install_recorder(os.environ[golden.RECORD_ENV])

ROOT = Path(__file__).resolve().parent.parent
DEMO_SCHEMA = ROOT / "schemas" / "demo.toml"
PEOPLE = 3000
EXTREME_ID = 10**9
_names = itertools.count()


@pytest.fixture(scope="session")
def server() -> Iterator[EmbeddedPostgres]:
    pg = EmbeddedPostgres()
    pg.start()
    yield pg
    pg.stop()


def database_url(server: EmbeddedPostgres, name: str) -> str:
    return server.url.replace("/postgres?", f"/{name}?")


@pytest.fixture(scope="session")
def template(server: EmbeddedPostgres) -> str:
    """The demo data (PEOPLE people) in a database that only serves as a template for copies."""
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE dpsql_template")
    load_demo_data(database_url(server, "dpsql_template"), people=PEOPLE, seed=11)
    return "dpsql_template"


def copy_database(server: EmbeddedPostgres, template: str, name: str) -> str:
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {template}")
    return database_url(server, name)


@pytest.fixture(scope="session")
def base_url(server: EmbeddedPostgres, template: str) -> str:
    """A database with the demo data."""
    return copy_database(server, template, "dpsql_base")


@pytest.fixture(scope="session")
def neighbour_url(server: EmbeddedPostgres, template: str) -> str:
    """The base database plus one unit with extreme values: out-of-bound numbers, NaN, NULL, thousands of
    visits in every category and in undeclared ones, and a state no one else has."""
    url = copy_database(server, template, "dpsql_neighbour")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO people VALUES (%s, 2147483647, 'M', 'ZZ', 1e300)", (EXTREME_ID,))
        categories = ["checkup", "dental", "emergency", "lab", "pharmacy", "physio", "specialist",
                      "vaccination", "undeclared"]
        amounts = ["1e308", "-1e308", "NaN", None, "5e5", "-5", "999.5"]
        rows = [(EXTREME_ID * 10 + i, EXTREME_ID, f"2024-{1 + i % 12:02d}-{1 + i % 28:02d}",
                 categories[i % len(categories)], amounts[i % len(amounts)]) for i in range(5000)]
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO visits VALUES (%s, %s, %s, %s, %s::double precision)", rows)
            # three prescriptions on each of 3000 of its visits: drugs beyond the domain, costs out of bounds
            drugs = ["insulin", "ibuprofen", "undeclared"]
            costs = ["1e308", "-1e308", "NaN", None, "7e4", "499.5"]
            prescriptions = [(EXTREME_ID * 100 + i, EXTREME_ID * 10 + i // 3, drugs[i % 3], costs[i % len(costs)])
                             for i in range(9000)]
            cur.executemany("INSERT INTO prescriptions VALUES (%s, %s, %s, %s::double precision)", prescriptions)
    return url


@pytest.fixture(scope="session")
def demo_schema():
    return load_schema(DEMO_SCHEMA)


@pytest.fixture(scope="session")
def engine(base_url: str, demo_schema) -> Iterator[Engine]:
    eng = Engine(Settings(database=base_url, schema=str(DEMO_SCHEMA)), demo_schema)
    yield eng
    eng.close()


@pytest.fixture
def analyst(engine: Engine) -> str:
    """A fresh analyst with ε = 100 and δ = 1e-3, so tests never share a budget or a cache."""
    name = f"analyst_{next(_names)}"
    engine.ledger.add_analyst(name, 100.0, 1e-3)
    return name


@pytest.fixture(scope="session")
def fuzz_world(server: EmbeddedPostgres):
    """The neighbour fuzzer's worlds (tests/fuzzing.py), each built once: name -> (base URL, neighbour URLs)."""
    from tests import fuzzing

    built: dict[str, tuple[str, dict[str, str]]] = {}

    def get(name: str) -> tuple[str, dict[str, str]]:
        if name not in built:
            built[name] = fuzzing.build_world(server.url, lambda db: database_url(server, db), name)
        return built[name]
    return get
