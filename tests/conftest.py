"""Shared fixtures: one real embedded PostgreSQL per test session (per worker under pytest-xdist), with the demo
data and a neighbour."""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from dpsql.config import Settings
from dpsql.demo import load_demo_data
from dpsql.embedded import EmbeddedPostgres
from dpsql.engine import Engine
from dpsql.schema import load_schema
from dpsql.server import ListenAddress, Server, build_server
from dpsql.server.auth import md5_verifier, scram_verifier
from tests import golden

if golden.RECORD_ENV in os.environ:  # `python -m tests.golden` collects the queries of one test run
    golden.install_recorder(os.environ[golden.RECORD_ENV])

ROOT = Path(__file__).resolve().parent.parent
SHIPPED_SCHEMA = ROOT / "schemas" / "demo.toml"
# what most tests check is the mechanics of declared bounds (sensitivities, neighbours, rewrites): they use the
# shipped schema with the rows per person and the visit amounts it declared before it chose bounds from the data
# (rows_per_unit = "auto"); tests/test_accuracy.py, the README's examples and `dpsql demo` use the shipped schema itself
DECLARED_ROWS = {"visits": 10, "prescriptions": 20}
DECLARED_AMOUNT = 1000  # the shipped schema's cap is 5,000: its sums choose their own bound
DECLARED_INCOME = 250000  # the shipped schema's cap is 1,000,000, above every income the demo data holds
DECLARED_COST = 200  # the shipped schema's cap is 1,000, above all but a few costs in 100,000 people's


def _declared_schema() -> Path:
    text = SHIPPED_SCHEMA.read_text(encoding="utf-8").replace('rows_per_unit = "auto"', 'rows_per_unit = "declared"')
    for table, rows in DECLARED_ROWS.items():
        text, found = re.subn(rf"(\[tables\.{table}\][^\[]*?max_rows_per_unit = )\d+", rf"\g<1>{rows}", text)
        assert found == 1, f"the shipped schema no longer bounds {table}'s rows"
    text, found = re.subn(r"(amount = \{[^}]*upper = )\d+", rf"\g<1>{DECLARED_AMOUNT}", text)
    assert found == 1, "the shipped schema no longer bounds visits.amount"
    text, found = re.subn(r"(income = \{[^}]*upper = )\d+", rf"\g<1>{DECLARED_INCOME}", text)
    assert found == 1, "the shipped schema no longer bounds people.income"
    text, found = re.subn(r"(cost = \{[^}]*upper = )\d+", rf"\g<1>{DECLARED_COST}", text)
    assert found == 1, "the shipped schema no longer bounds prescriptions.cost"
    path = Path(tempfile.mkdtemp(prefix="dpsql-schema-")) / "demo.toml"
    path.write_text(text, encoding="utf-8")
    return path


DEMO_SCHEMA = _declared_schema()
PEOPLE = 3000
EXTREME_ID = 10**9
_names = itertools.count()
PASSWORD = "s3cret pass"  # of the analysts `served` creates


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
        days = ["infinity", "-infinity", "1900-01-01", "2999-12-31"]  # beyond the declared 2024 on either side
        days += [f"2024-{1 + i % 12:02d}-{1 + i % 28:02d}" for i in range(len(days), 5000)]
        rows = [(EXTREME_ID * 10 + i, EXTREME_ID, days[i],
                 categories[i % len(categories)], amounts[i % len(amounts)]) for i in range(5000)]
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO visits VALUES (%s, %s, %s, %s, %s::double precision)", rows)
            # three prescriptions on each of 3000 of its visits: drugs beyond the domain, costs out of bounds
            drugs = ["insulin", "ibuprofen", "undeclared"]
            costs = ["1e308", "-1e308", "NaN", None, "7e4", "499.5"]
            prescriptions = [(EXTREME_ID * 100 + i, EXTREME_ID * 10 + i // 3, drugs[i % 3], costs[i % len(costs)])
                             for i in range(9000)]
            cur.executemany("INSERT INTO prescriptions VALUES (%s, %s, %s, %s::double precision)", prescriptions)
            cur.execute("INSERT INTO screenings VALUES (%s, true)", (EXTREME_ID,))
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


def in_threads(task, count: int) -> tuple[list, list[Exception]]:
    """`task()` run by `count` threads at once: what they returned, and what they raised."""
    results: list = []
    failures: list[Exception] = []

    def run() -> None:
        try:
            results.append(task())
        except Exception as exc:  # noqa: BLE001 - returned to the caller
            failures.append(exc)

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results, failures


# --- dpsql serve in front of the demo data --------------------------------------------------------------------


@dataclass
class Running:
    engine: Engine
    server: Server
    loop: asyncio.AbstractEventLoop
    url: str  # of the database behind it

    @property
    def port(self) -> int:
        return self.server.port

    def dsn(self, user: str = "ana", password: str = PASSWORD, **extra: str) -> str:
        options = {"host": "127.0.0.1", "port": str(self.port), "user": user, "password": password,
                   "dbname": "demo", "sslmode": "disable", **extra}
        return " ".join(f"{k}='{v}'" for k, v in options.items())

    def start(self, **kwargs) -> Server:
        """Another server on the same gateway (other auth method, TLS)."""
        server = Server(self.server.gateway, ListenAddress("127.0.0.1", 0), **kwargs)
        asyncio.run_coroutine_threadsafe(server.start(), self.loop).result()
        return server

    def stop(self, server: Server) -> None:
        asyncio.run_coroutine_threadsafe(server.close(), self.loop).result()


@pytest.fixture(scope="module")
def served(request, server, template) -> Iterator[Running]:
    """`dpsql serve` on a copy of the demo data, for one test module: analysts ana, md5user and poor."""
    url = copy_database(server, template, f"dpsql_serve_{request.module.__name__.split('.')[-1]}")
    engine, dp_server = build_server(Settings(database=url, schema=str(DEMO_SCHEMA), listen="127.0.0.1:0"))
    engine.ledger.add_analyst("ana", 1000.0, 1e-3)
    engine.ledger.set_verifier("ana", scram_verifier(PASSWORD))
    engine.ledger.add_analyst("md5user", 10.0, 1e-5)
    engine.ledger.set_verifier("md5user", md5_verifier("md5user", PASSWORD))
    engine.ledger.add_analyst("poor", 0.5, 0.0)
    engine.ledger.set_verifier("poor", scram_verifier(PASSWORD))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(dp_server.start(), loop).result()
    running = Running(engine, dp_server, loop, url)
    yield running
    running.stop(dp_server)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    dp_server.gateway.close()
    engine.close()


@pytest.fixture(scope="session")
def node_pg(tmp_path_factory) -> Path:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node.js and npm are not installed")
    folder = Path(os.environ.get("DPSQL_NODE_PG", tmp_path_factory.mktemp("node")))
    if not (folder / "node_modules" / "pg").exists():
        done = subprocess.run(["npm", "install", "--silent", "--no-audit", "--no-fund", "pg@8"], cwd=folder,
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            pytest.skip(f"cannot install node-postgres from npm: {done.stderr.strip()[:200]}")
    return folder


@pytest.fixture(scope="session")
def within_bounds(server, template) -> str:
    """The demo data with no unit over its row bounds (10 visits, 20 prescriptions): which rows a bound keeps then
    cannot differ between the backends' keyed hashes, so their pre-noise answers must be equal."""
    url = copy_database(server, template, "dpsql_engines_base")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM prescriptions WHERE visit_id IN (SELECT visit_id FROM (SELECT visit_id, "
                     "ROW_NUMBER() OVER (PARTITION BY person_id ORDER BY visit_id) AS n FROM visits) v WHERE n > 10)")
        conn.execute("DELETE FROM visits WHERE visit_id IN (SELECT visit_id FROM (SELECT visit_id, "
                     "ROW_NUMBER() OVER (PARTITION BY person_id ORDER BY visit_id) AS n FROM visits) v WHERE n > 10)")
        conn.execute("DELETE FROM prescriptions WHERE prescription_id IN (SELECT prescription_id FROM (SELECT "
                     "prescription_id, ROW_NUMBER() OVER (PARTITION BY v.person_id ORDER BY prescription_id) AS n "
                     "FROM prescriptions p JOIN visits v USING (visit_id)) x WHERE n > 20)")
    return url


# --- markers: unit, integration, adversarial (`pytest -m unit` is the fast set) --------------------------------

# fuzzers and red-team regressions: they attack the guarantee, whatever parts they need
ADVERSARIAL = {"test_fuzz", "test_red_team", "test_adversarial", "test_protocol_fuzz", "test_privacy_round3"}
# fixtures that start a real PostgreSQL (or Spark, or a server process): a test that uses one is an integration test
REAL_PARTS = {"server", "node_pg", "served"}
# modules that start real parts without those fixtures (a subprocess, their own server, a Spark session)
INTEGRATION = {"test_spark", "test_cli", "test_readme", "test_owner_guide", "test_clients", "test_workers", "test_demo",
               "test_operations", "test_server"}


BACKENDS = {"test_spark": "spark", "test_duckdb": "duckdb"}


GOLDEN = "tests/test_golden.py"
SPARK = "tests/test_spark.py"
# under pytest-xdist (`-n 2`, the README's command): each worker collects every test and runs the files it is sent
IN_WORKER = "PYTEST_XDIST_WORKER" in os.environ


def pytest_collection_finish(session: pytest.Session) -> None:
    """The golden replay (pure computation over one process per core) starts now, runs beside the other tests,
    and its test comes last (see pytest_collection_modifyitems) to wait for it. Under xdist the worker that is
    sent the golden test starts it there, beside the other worker."""
    if not IN_WORKER and any(item.nodeid.startswith(GOLDEN) for item in session.items):
        from tests import test_golden

        test_golden.start_replay(alone=len(session.items) == 1)


def pytest_sessionfinish(session: pytest.Session) -> None:
    from tests import test_golden

    test_golden.stop_replay()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test gets one of three markers: adversarial (by module), integration (it uses a real database,
    server or cluster), else unit; and the suites of the other engines their engine's marker."""
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1]
        if module in BACKENDS:  # the suites that run on another engine: `pytest -m spark`, `-m duckdb`
            item.add_marker(getattr(pytest.mark, BACKENDS[module]))
        if module in ADVERSARIAL:
            item.add_marker(pytest.mark.adversarial)
        elif module in INTEGRATION or REAL_PARTS & set(item.fixturenames) or item.get_closest_marker("integration"):
            item.add_marker(pytest.mark.integration)
        else:
            item.add_marker(pytest.mark.unit)
    if IN_WORKER:  # the longest files first, so that no worker is left alone with one at the end: --dist loadfile
        # sends files in this order
        items.sort(key=lambda item: not item.nodeid.startswith((SPARK, GOLDEN)))
    else:
        items.sort(key=lambda item: item.nodeid.startswith(GOLDEN))  # stable: only the golden test moves, to the end
