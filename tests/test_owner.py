"""The data owner's first hour on a database dpsql has never seen (a clinic: patients, their appointments and
prescriptions through foreign keys, public clinics): a schema drafted from the catalog, checked against the catalog
and the data, and no analyst charged for the owner's mistakes."""

from __future__ import annotations

import json

import psycopg
import pytest

from dpsql import errors
from dpsql.accounting import Cost
from dpsql.cli import main
from dpsql.config import Settings
from dpsql.engine import Engine
from dpsql.errors import SchemaError
from dpsql.report import ledger_report, render_html
from dpsql.schema import load_schema
from tests.conftest import database_url

CLINIC_DDL = """
CREATE TYPE region AS ENUM ('North', 'South', 'East', 'West');
CREATE TABLE clinics (clinic_id integer PRIMARY KEY, name text NOT NULL, region region NOT NULL);
CREATE TABLE patients (patient_id bigint PRIMARY KEY, birth_year integer, region region, notes jsonb);
CREATE TABLE appointments (appt_id bigint PRIMARY KEY, patient_id bigint NOT NULL REFERENCES patients,
                           clinic_id integer REFERENCES clinics, day date NOT NULL, duration_min integer,
                           kind varchar(20));
CREATE TABLE prescriptions (rx_id bigint PRIMARY KEY, appt_id bigint NOT NULL REFERENCES appointments,
                            drug text NOT NULL, cost numeric(8, 2));
INSERT INTO clinics SELECT i, 'clinic ' || i, (ARRAY['North', 'South', 'East', 'West'])[1 + i % 4]::region
FROM generate_series(1, 8) i;
INSERT INTO patients SELECT i, 1930 + i % 90, (ARRAY['North', 'South', 'East', 'West'])[1 + i % 4]::region, NULL
FROM generate_series(1, 2000) i;
INSERT INTO appointments SELECT i, CASE WHEN i % 50 = 0 THEN 1 ELSE 1 + (i * 7919) % 2000 END, 1 + i % 8,
    DATE '2024-01-01' + i % 366, 10 + i % 50, (ARRAY['checkup', 'surgery', 'therapy'])[1 + i % 3]
FROM generate_series(1, 6000) i;
INSERT INTO prescriptions SELECT i, 1 + i % 6000, (ARRAY['statin', 'insulin', 'ibuprofen'])[1 + i % 3], (i % 90) + 0.5
FROM generate_series(1, 3000) i;
ANALYZE;
"""


@pytest.fixture(scope="module")
def clinic_url(server) -> str:
    url = database_url(server, "dpsql_clinic")
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS dpsql_clinic")
        conn.execute("CREATE DATABASE dpsql_clinic")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(CLINIC_DDL)
    return url


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_the_draft_finds_the_unit_and_every_table_that_reaches_it(clinic_url, tmp_path, capsys):
    code, out, err = _run(["schema", "draft", clinic_url], capsys)
    assert code == 0, err
    assert 'unit = "patients.patient_id"' in out
    assert '[tables.appointments]\nunit_column = "patient_id"' in out
    assert 'parent = "appt_id -> appointments.appt_id"' in out
    assert "[tables.clinics]\npublic = true" in out
    assert 'region = { type = "text", domain = ["North", "South", "East", "West"] }' in out  # an enum, read
    assert "notes: its type jsonb is not one dpsql reads; left out" in out
    assert "lower = ..., upper = ..." in out and "CONFIRM" in out
    path = tmp_path / "clinic.toml"
    path.write_text(out)
    code, out, err = _run(["schema", "check", str(path), "--database", clinic_url], capsys)
    assert code == 0, err  # the draft as it stands passes the check against the database
    assert "every value is inside its domain and bounds" in out


def test_the_drafted_schema_answers_an_analyst(clinic_url, tmp_path, capsys):
    _, out, _ = _run(["schema", "draft", clinic_url, "--unit", "patients.patient_id"], capsys)
    path = tmp_path / "clinic.toml"
    path.write_text(out)
    engine = Engine(Settings(database=clinic_url), load_schema(path))
    try:
        engine.ledger.add_analyst("nurse", 10.0, 1e-5)
        answer = engine.query("SELECT kind, COUNT(*) FROM appointments GROUP BY kind", analyst="nurse", epsilon=1.0)
        assert {row[0] for row in answer.rows} == {"checkup", "surgery", "therapy"}
        # the race keeps 32 rows a patient in 96% of answers (noise scale 42: ±200 failed 2.6% of runs, as CI drew
        # once), 64 in 3% (scale 84), the cap of 500 in 0.7% (scale 625): ±600 fails about 0.3% of runs
        assert all(abs(row[1] - 2000) < 600 for row in answer.rows), answer.rows
    finally:
        engine.close()


def test_a_unit_that_is_no_key_is_refused(clinic_url, capsys):
    code, _, err = _run(["schema", "draft", clinic_url, "--unit", "appointments.day"], capsys)
    assert code == 4 and "appointments.day is not a primary or unique key" in err


SCHEMA_MISTAKES = [
    ('duration = "integer"', "column appointments.duration: the table has no column duration "
                             "(did you mean duration_min?)"),
    ('duration_min = "date"', 'column appointments.duration_min is declared date but the database holds '
                              'integer: declare type = "integer"'),
    ('kind = "integer"', 'column appointments.kind is declared integer but the database holds character varying(20): '
                         'declare type = "text"'),
    ('visits = "integer"', "[tables.visits]: the database has no table visits"),
]


def _clinic_schema(appointments: str = 'unit_column = "patient_id"', column: str = "",
                   region: str = '["North", "South", "East", "West"]') -> str:
    return f"""
[privacy]
unit = "patients.patient_id"
[tables.patients.columns]
patient_id = "bigint"
region = {{ type = "text", domain = {region} }}
[tables.appointments]
{appointments}
max_rows_per_unit = 10
[tables.appointments.columns]
appt_id = "bigint"
patient_id = "bigint"
day = "date"
{column}
[tables.prescriptions]
parent = "appt_id -> appointments.appt_id"
max_rows_per_unit = 10
[tables.prescriptions.columns]
appt_id = "bigint"
cost = {{ type = "numeric", lower = 0, upper = 50 }}
"""


@pytest.mark.parametrize(("column", "message"), SCHEMA_MISTAKES)
def test_a_column_the_database_lacks_or_types_otherwise_is_caught_before_any_analyst_pays(
        clinic_url, tmp_path, capsys, column, message):
    path = tmp_path / "clinic.toml"
    text = _clinic_schema(column=column)
    if column.startswith("visits"):
        text += f"[tables.visits]\npublic = true\n[tables.visits.columns]\n{column}\n"
    path.write_text(text)
    code, _, err = _run(["schema", "check", str(path), "--database", clinic_url], capsys)
    assert code == 4 and message in err
    assert err.count(message) == 1
    with pytest.raises(SchemaError, match="does not match the database"):
        Engine(Settings(database=clinic_url), load_schema(path))  # serve, query and connect build one


def test_a_unit_column_that_is_not_the_unit_is_caught_unless_vouched_for(clinic_url, tmp_path, capsys):
    path = tmp_path / "clinic.toml"
    path.write_text(_clinic_schema(appointments='unit_column = "appt_id"'))
    code, _, err = _run(["schema", "check", str(path), "--database", clinic_url], capsys)
    assert code == 4
    assert '[tables.appointments] unit_column = "appt_id" is no foreign key, so its rows need not belong to the ' \
           "unit patients.patient_id" in err
    path.write_text(_clinic_schema(appointments='unit_column = "clinic_id"', column='clinic_id = "integer"'))
    _, _, err = _run(["schema", "check", str(path), "--database", clinic_url], capsys)
    assert 'unit_column = "clinic_id" references clinics.clinic_id' in err
    path.write_text(_clinic_schema(appointments='unit_column = "appt_id"\ntrust_link = true'))
    code, _, err = _run(["schema", "check", str(path), "--database", clinic_url], capsys)
    assert code == 0, err


def test_a_parent_path_without_a_key_is_caught(clinic_url, tmp_path, capsys):
    path = tmp_path / "clinic.toml"
    path.write_text(_clinic_schema().replace('parent = "appt_id -> appointments.appt_id"',
                                             'parent = "appt_id -> appointments.day"'))
    path.write_text(path.read_text().replace('day = "date"', 'day = "bigint"'))
    code, _, err = _run(["schema", "check", str(path), "--database", clinic_url], capsys)
    assert code == 4 and "appointments.day is not a primary or unique key" in err


def test_the_owner_sees_values_outside_the_schema(clinic_url, tmp_path, capsys):
    path = tmp_path / "clinic.toml"
    path.write_text(_clinic_schema(region='["North", "South", "East"]'))
    code, out, err = _run(["schema", "check", str(path), "--database", clinic_url], capsys)
    assert code == 0, err
    assert "patients.region: 500 rows hold 'West', outside the declared domain" in out
    assert "prescriptions.cost: 0 rows below 0 and 1,320 above 50" in out
    assert "appointments: " in out and "units hold more than max_rows_per_unit = 10 rows" in out


def _fresh_database(server, name: str) -> str:
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    return database_url(server, name)


@pytest.fixture
def clinic_engine(server, clinic_url, tmp_path, capsys):
    """The drafted clinic schema over the clinic data, with its ledger in a database of its own."""
    _, out, _ = _run(["schema", "draft", clinic_url], capsys)
    path = tmp_path / "clinic.toml"
    path.write_text(out)
    ledger_url = _fresh_database(server, "dpsql_clinic_ledger")
    engine = Engine(Settings(database=clinic_url, ledger=ledger_url), load_schema(path))
    yield engine, ledger_url, path
    engine.close()


def test_an_owner_sets_budgets_and_removing_an_analyst_keeps_the_history(clinic_engine, capsys):
    engine, ledger_url, _ = clinic_engine
    base = ["--database", ledger_url]
    assert _run(["analyst", "add", "ana", "--epsilon", "3", *base], capsys)[0] == 0
    engine.query("SELECT kind, COUNT(*) FROM appointments GROUP BY kind", analyst="ana", epsilon=1.0)
    code, _, err = _run(["analyst", "set", "ana", "--epsilon", "0.5", *base], capsys)
    assert code == 1 and 'analyst "ana" has spent ε=1' in err and "would be below it" in err
    code, out, _ = _run(["analyst", "set", "ana", "--epsilon", "1.5", "--format", "csv", *base], capsys)
    assert code == 0 and engine.budget("ana").epsilon_total == 1.5
    assert _run(["analyst", "remove", "ana", *base], capsys)[0] == 0
    assert engine.ledger.verifier("ana") is None
    with pytest.raises(errors.UnknownAnalyst):
        engine.query("SELECT COUNT(*) FROM patients", analyst="ana", epsilon=0.1)
    code, out, _ = _run(["ledger", "export", *base], capsys)
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["outcome"] for r in records] == ["add", "answered", "set", "remove"]
    charge = records[1]
    assert charge["analyst"] == "ana" and charge["epsilon"] == 1.0 and "appointments" in charge["query"]
    assert records[2]["by"] and records[2]["epsilon"] == 1.5
    _, csv_out, _ = _run(["ledger", "export", "--format", "csv", *base], capsys)
    lines = csv_out.splitlines()
    assert lines[0] == "at,analyst,kind,outcome,epsilon,delta,query,by" and len(lines) == 5
    # adding the name again brings the analyst back with what it spent: removal never resets spending
    _run(["analyst", "add", "ana", "--epsilon", "3", *base], capsys)
    assert engine.budget("ana").epsilon_spent == pytest.approx(1.0)


def test_the_report_shows_failed_and_undelivered_charges(clinic_engine):
    engine, _, _ = clinic_engine
    ledger = engine.ledger
    ledger.add_analyst("bo", 5.0, 1e-5)
    ledger.charge("bo", Cost.pure(0.5), "k1", "a query that timed out")
    ledger.settle("bo", "k1")
    ledger.charge("bo", Cost.pure(0.25), "k2", "a query PostgreSQL died under")
    charges = ledger_report(ledger, "bo")["analysts"][0]["charges"]
    assert [c["status"] for c in charges] == ["failed", "undelivered"]
    page = render_html(ledger_report(ledger, "bo"))
    assert "failed (charged: the outcome was released)" in page and "not delivered (pays for the next" in page


def test_a_backup_restores_into_an_empty_ledger_with_the_same_budgets_and_answers(server, clinic_url,
                                                                                  clinic_engine, tmp_path, capsys):
    engine, ledger_url, schema = clinic_engine
    engine.ledger.add_analyst("cy", 4.0, 1e-5)
    sql = "SELECT kind, COUNT(*) FROM appointments GROUP BY kind"
    first = engine.query(sql, analyst="cy", epsilon=1.0)
    file = tmp_path / "ledger.json"
    code, out, _ = _run(["ledger", "backup", str(file), "--database", ledger_url], capsys)
    assert code == 0 and "secret keyed-hash seed" in out and (file.stat().st_mode & 0o777) == 0o600
    assert "seed" in json.loads(file.read_text())["warning"]
    code, _, err = _run(["ledger", "restore", str(file), "--database", ledger_url], capsys)
    assert code == 1 and "the ledger is not empty" in err
    restored_url = _fresh_database(server, "dpsql_clinic_restored")
    assert _run(["ledger", "restore", str(file), "--database", restored_url], capsys)[0] == 0
    again = Engine(Settings(database=clinic_url, ledger=restored_url), load_schema(schema))
    try:
        assert again.budget("cy") == engine.budget("cy")
        answer = again.query(sql, analyst="cy", epsilon=1.0)
        assert answer.cached and answer.rows == first.rows
        assert again._hash_seed == engine._hash_seed
        again.ledger.add_analyst("dee", 1.0, 0.0)  # the restored ids go on without a clash
        again.ledger.charge("dee", Cost.pure(0.1), "k", "q")
    finally:
        again.close()
