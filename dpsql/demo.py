"""The demo: a seeded synthetic dataset (people, their visits, a public table of states) and a short tour."""

from __future__ import annotations

import io
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psycopg

STATES = [
    ("CA", "California", "West"), ("TX", "Texas", "South"), ("FL", "Florida", "South"),
    ("NY", "New York", "Northeast"), ("PA", "Pennsylvania", "Northeast"), ("IL", "Illinois", "Midwest"),
    ("OH", "Ohio", "Midwest"), ("GA", "Georgia", "South"), ("NC", "North Carolina", "South"),
    ("MI", "Michigan", "Midwest"), ("NJ", "New Jersey", "Northeast"), ("VA", "Virginia", "South"),
    ("WA", "Washington", "West"), ("AZ", "Arizona", "West"), ("MA", "Massachusetts", "Northeast"),
    ("TN", "Tennessee", "South"), ("IN", "Indiana", "Midwest"), ("MO", "Missouri", "Midwest"),
    ("MD", "Maryland", "South"), ("WI", "Wisconsin", "Midwest"), ("CO", "Colorado", "West"),
    ("MN", "Minnesota", "Midwest"), ("SC", "South Carolina", "South"), ("AL", "Alabama", "South"),
    ("LA", "Louisiana", "South"), ("KY", "Kentucky", "South"), ("OR", "Oregon", "West"),
    ("OK", "Oklahoma", "South"), ("CT", "Connecticut", "Northeast"), ("UT", "Utah", "West"),
    ("NV", "Nevada", "West"), ("IA", "Iowa", "Midwest"), ("AR", "Arkansas", "South"),
    ("MS", "Mississippi", "South"), ("KS", "Kansas", "Midwest"), ("NM", "New Mexico", "West"),
    ("NE", "Nebraska", "Midwest"), ("ID", "Idaho", "West"), ("WV", "West Virginia", "South"),
    ("HI", "Hawaii", "West"), ("NH", "New Hampshire", "Northeast"), ("ME", "Maine", "Northeast"),
    ("MT", "Montana", "West"), ("RI", "Rhode Island", "Northeast"), ("DE", "Delaware", "South"),
    ("SD", "South Dakota", "Midwest"), ("ND", "North Dakota", "Midwest"), ("AK", "Alaska", "West"),
    ("VT", "Vermont", "Northeast"), ("WY", "Wyoming", "West"),
]
CATEGORIES = ["checkup", "dental", "emergency", "lab", "pharmacy", "physio", "specialist", "vaccination"]
CATEGORY_WEIGHTS = [0.25, 0.12, 0.05, 0.15, 0.2, 0.08, 0.1, 0.05]
DRUGS = ["amoxicillin", "atorvastatin", "ibuprofen", "insulin", "lisinopril", "metformin", "omeprazole",
         "salbutamol"]

DDL = """
DROP TABLE IF EXISTS prescriptions, visits, screenings, people, states, survey, checkins;
CREATE TABLE states (code text PRIMARY KEY, name text NOT NULL, region text NOT NULL);
CREATE TABLE people (person_id bigint PRIMARY KEY, age integer, sex text, state text, income double precision);
CREATE TABLE visits (visit_id bigint PRIMARY KEY, person_id bigint NOT NULL REFERENCES people(person_id),
                     day date NOT NULL, category text NOT NULL, amount double precision);
CREATE TABLE prescriptions (prescription_id bigint PRIMARY KEY, visit_id bigint NOT NULL REFERENCES visits(visit_id),
                            drug text NOT NULL, cost double precision);
CREATE TABLE survey (respondent_id bigint PRIMARY KEY, region text NOT NULL, smoker boolean, diet text,
                     symptom boolean[]);
CREATE TABLE checkins (checkin_id bigint PRIMARY KEY, hour integer NOT NULL, cell integer);
CREATE TABLE screenings (person_id bigint PRIMARY KEY REFERENCES people(person_id), positive boolean NOT NULL);
"""
REGIONS = ["Midwest", "Northeast", "South", "West"]
DIETS = ["omnivore", "pescatarian", "vegetarian", "vegan"]
SYMPTOMS = ["cough", "fatigue", "fever", "headache", "none"]
HOTSPOTS = [(2.5, 2.5, 1.0, 0.5), (7.0, 6.0, 1.5, 0.35), (4.0, 8.5, 0.8, 0.15)]  # x, y, spread (km), share
CHUNK = 50_000

DEMO_QUERIES = [
    ("How many people?", "SELECT COUNT(*) FROM people"),
    ("Average income by sex", "SELECT sex, AVG(income) AS avg_income, COUNT(*) AS people FROM people GROUP BY sex"),
    ("Visits and spending per category",
     "SELECT category, COUNT(*) AS visits, SUM(amount) AS spent FROM visits GROUP BY category ORDER BY visits DESC"),
    ("Median income and age range (exponential mechanism)",
     "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY income) AS median_income, MIN(age), MAX(age) FROM people"),
    ("People per age band",
     "SELECT width_bucket(age, 0, 100, 5) AS band, COUNT(*) FROM people GROUP BY band ORDER BY band"),
    ("States with the most people (private keys: DP partition selection)",
     "SELECT state, COUNT(*) AS people FROM people GROUP BY state ORDER BY people DESC LIMIT 5"),
    ("Prescription costs per drug (prescriptions reach a person through their visit)",
     "SELECT drug, COUNT(*) AS prescriptions, AVG(cost) AS avg_cost FROM prescriptions GROUP BY drug ORDER BY drug"),
    ("Smokers among survey respondents (randomized response on each phone: estimates, free)",
     "SELECT smoker, COUNT(*) AS respondents FROM survey GROUP BY smoker"),
    ("Check-ins per 2 km cell, busiest first (planar Laplace on each phone: estimates, free)",
     "SELECT cell, COUNT(*) AS checkins FROM checkins GROUP BY cell ORDER BY checkins DESC LIMIT 5"),
    ("Emergency visits by region (join to a public table)",
     "SELECT s.region, COUNT(*) AS visits FROM visits v JOIN people p ON v.person_id = p.person_id "
     "JOIN states s ON s.code = p.state WHERE v.category = 'emergency' GROUP BY s.region ORDER BY s.region"),
]


def load_demo_data(url: str, people: int = 100_000, seed: int = 7,
                   progress: Callable[[str, int, int], None] | None = None) -> dict[str, int]:
    """Create and fill the demo tables; returns row counts. Same seed, same data."""
    rng = np.random.default_rng(seed)
    weights = 1 / np.arange(1, len(STATES) + 1) ** 1.1
    weights /= weights.sum()
    visits_per_person = np.minimum(rng.geometric(0.3, people) - 1 + (rng.random(people) < 0.02) * 25, 60)
    total_visits = int(visits_per_person.sum())
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(DDL)
        _copy(conn, "states", [f"{c}\t{n}\t{r}\n" for c, n, r in STATES])
        for start in range(0, people, CHUNK):
            n = min(CHUNK, people - start)
            ids = np.arange(start + 1, start + n + 1)
            age = np.clip(rng.normal(41, 19, n), 0, 99).astype(int)
            sex = rng.choice(["F", "M"], n)
            state = rng.choice([s[0] for s in STATES], n, p=weights)
            income = np.round(rng.lognormal(10.6, 0.75, n), 2)
            _copy(conn, "people", [f"{i}\t{a}\t{s}\t{st}\t{inc}\n" for i, a, s, st, inc in
                                   zip(ids, age, sex, state, income, strict=True)])
            if progress:
                progress("people", start + n, people)
        owner = np.repeat(np.arange(1, people + 1), visits_per_person)
        days = np.datetime64("2024-01-01") + rng.integers(0, 366, total_visits)
        category = rng.choice(CATEGORIES, total_visits, p=CATEGORY_WEIGHTS)
        amount = np.round(rng.lognormal(4.2, 1.0, total_visits), 2)
        for start in range(0, total_visits, CHUNK):
            end = min(start + CHUNK, total_visits)
            _copy(conn, "visits", [f"{i + 1}\t{p}\t{d}\t{c}\t{a}\n" for i, p, d, c, a in
                                   zip(range(start, end), owner[start:end], days[start:end], category[start:end],
                                       amount[start:end], strict=True)])
            if progress:
                progress("visits", end, total_visits)
        prescriptions = _load_prescriptions(conn, category, np.random.default_rng(seed + 1), progress)
        local = _load_local_reports(conn, people, seed + 2, progress)
        conn.execute("CREATE INDEX visits_person ON visits (person_id); "
                     "CREATE INDEX prescriptions_visit ON prescriptions (visit_id); "
                     "ANALYZE people; ANALYZE visits; ANALYZE prescriptions")
    return {"people": people, "visits": total_visits, "prescriptions": prescriptions, "states": len(STATES),
            **local}


def _load_local_reports(conn: psycopg.Connection, people: int, seed: int,
                        progress: Callable[[str, int, int], None] | None) -> dict[str, int]:
    """Tables of reports randomized as each person's phone would before sending them, with the randomizers the
    demo schema declares: a survey and check-ins (public tables: who answered is public, the answers are not),
    and screening results of half the people (a private table). Seeded, as all demo data is; a real device
    uses `dpsql.local.randomize`, which draws from the OS."""
    import random
    from importlib.resources import files

    from dpsql.local import randomizer
    from dpsql.schema import load_schema

    tables = load_schema(str(files("dpsql") / "schemas" / "demo.toml")).tables
    device = random.Random(seed)  # simulated devices: reproducible demo data, not a privacy mechanism
    rng = np.random.default_rng(seed)
    spec = {f"{t}.{c}": randomizer(tables[t].columns[c].local) for t, c in
            [("survey", "smoker"), ("survey", "diet"), ("survey", "symptom"), ("checkins", "cell"),
             ("screenings", "positive")]}
    respondents = people // 2
    smoker = rng.random(respondents) < 0.18
    diet = rng.choice(DIETS, respondents, p=[0.72, 0.08, 0.14, 0.06])
    symptom = rng.choice(SYMPTOMS, respondents, p=[0.2, 0.25, 0.1, 0.15, 0.3])
    region = rng.choice(REGIONS, respondents, p=[0.21, 0.17, 0.38, 0.24])
    lines = []
    for i in range(respondents):
        bits = ",".join("t" if b else "f" for b in spec["survey.symptom"].randomize(symptom[i], device))
        lines.append(f"{i + 1}\t{region[i]}\t{spec['survey.smoker'].randomize(bool(smoker[i]), device)}\t"
                     f"{spec['survey.diet'].randomize(diet[i], device)}\t{{{bits}}}\n")
    _copy(conn, "survey", lines)
    checkins = people // 2
    spot = rng.choice(len(HOTSPOTS), checkins, p=[s[3] for s in HOTSPOTS] / np.sum([s[3] for s in HOTSPOTS]))
    centre = np.array([s[:2] for s in HOTSPOTS])[spot]
    where = centre + rng.normal(0, 1, (checkins, 2)) * np.array([s[2] for s in HOTSPOTS])[spot][:, None]
    hour = rng.integers(6, 23, checkins)
    _copy(conn, "checkins", [f"{i + 1}\t{hour[i]}\t{spec['checkins.cell'].randomize(tuple(where[i]), device)}\n"
                             for i in range(checkins)])
    screened = rng.choice(np.arange(1, people + 1), people // 2, replace=False)
    positive = rng.random(len(screened)) < 0.1
    _copy(conn, "screenings", [f"{p}\t{spec['screenings.positive'].randomize(bool(v), device)}\n"
                               for p, v in zip(screened, positive, strict=True)])
    if progress:
        progress("local reports", 1, 1)
    return {"survey": respondents, "checkins": checkins, "screenings": len(screened)}


def _load_prescriptions(conn: psycopg.Connection, category: np.ndarray, rng: np.random.Generator,
                        progress: Callable[[str, int, int], None] | None) -> int:
    """Prescriptions of the visits (their own random stream, so people and visits stay as they were): about one
    per pharmacy or specialist visit, fewer for the rest."""
    rate = np.where(np.isin(category, ["pharmacy", "specialist"]), 1.2, 0.2)
    per_visit = np.minimum(rng.poisson(rate), 4)
    visit = np.repeat(np.arange(1, len(category) + 1), per_visit)
    total = len(visit)
    drug = rng.choice(DRUGS, total)
    cost = np.round(rng.lognormal(3.0, 1.0, total), 2)
    for start in range(0, total, CHUNK):
        end = min(start + CHUNK, total)
        _copy(conn, "prescriptions", [f"{i + 1}\t{v}\t{d}\t{c}\n" for i, v, d, c in
                                      zip(range(start, end), visit[start:end], drug[start:end], cost[start:end],
                                          strict=True)])
        if progress:
            progress("prescriptions", end, total)
    return total


def _copy(conn: psycopg.Connection, table: str, lines: list[str]) -> None:
    with conn.cursor().copy(f"COPY {table} FROM STDIN") as copy:
        copy.write(io.StringIO("".join(lines)).getvalue())


_last_drawn = [0.0]


def progress_bar(label: str, done: int, total: int, stream=sys.stderr) -> None:
    """A one-line progress bar on a terminal, redrawn at most ten times a second; elsewhere (a log, a pipe) one
    line per table once it is loaded."""
    if not stream.isatty():
        if done >= total:
            stream.write(f"  loaded {label:<13} {total:>9,}\n")
            stream.flush()
        return
    now = time.monotonic()
    if done < total and now - _last_drawn[0] < 0.1:
        return
    _last_drawn[0] = now
    width = 30
    filled = int(width * done / max(total, 1))
    stream.write(f"\r  loading {label:<13} [{'#' * filled}{'.' * (width - filled)}] {done:>9,}/{total:,}")
    if done >= total:
        stream.write("\n")
    stream.flush()


SPARK_TABLES = ("people", "visits", "prescriptions", "states", "screenings", "survey", "checkins")


def export_parquet(url: str, directory: str | Path, tables: tuple[str, ...] = SPARK_TABLES) -> dict[str, Path]:
    """The demo tables of a PostgreSQL database as Parquet files for the Spark backend (pyarrow; dates and
    timestamps Spark cannot hold, ±infinity or outside years 1 to 9999, as NULL). NULL and NaN stay apart, as the
    bounds' clamps need. An unbounded numeric becomes a double (Spark's decimals stop at 38 digits and hold no
    NaN)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    types = {"bigint": pa.int64(), "integer": pa.int32(), "double precision": pa.float64(), "text": pa.string(),
             "date": pa.date32(), "boolean": pa.bool_(), "ARRAY": pa.list_(pa.bool_()),  # the demo's boolean[]
             "numeric": pa.float64(), "timestamp with time zone": pa.timestamp("us", tz="UTC"),
             "character": pa.string()}
    spark_range = {"date": ("'0001-01-01'", "'9999-12-31'"),
                   "timestamp with time zone": ("'0001-01-01 00:00+00'", "'9999-12-31 23:59:59+00'")}
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    with psycopg.connect(url) as conn:
        for table in tables:
            columns = conn.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = "
                                   "%s AND table_schema = 'public' ORDER BY ordinal_position", (table,)).fetchall()
            select = ", ".join(_spark_value(c, t, spark_range) for c, t in columns)
            rows = conn.execute(f"SELECT {select} FROM {table}").fetchall()
            arrays = [pa.array([r[i] for r in rows], type=types[t]) for i, (_, t) in enumerate(columns)]
            paths[table] = directory / f"{table}.parquet"
            pq.write_table(pa.Table.from_arrays(arrays, names=[c for c, _ in columns]), paths[table])
    return paths


def _spark_value(column: str, type_name: str, spark_range: dict[str, tuple[str, str]]) -> str:
    """`column` as Spark can hold it: dates and timestamps within Spark's years, numerics as doubles (NaN kept;
    beyond a double's range, NULL), char(n) as its text (trailing spaces, which its equality ignores, dropped), other
    types as they are."""
    if type_name == "character":
        return f"CAST({column} AS text)"
    if type_name in spark_range:
        low, high = spark_range[type_name]
        return f"CASE WHEN {column} BETWEEN {low} AND {high} THEN {column} END"
    if type_name == "numeric":
        return (f"CASE WHEN abs({column}) <= 1e300 THEN {column}::float8 WHEN {column} = 'NaN' THEN 'NaN'::float8 "
                "END")
    return column


def duckdb_file(url: str, directory: str | Path) -> Path:
    """The demo tables of a PostgreSQL database in a DuckDB file with the demo's keys (for the DuckDB backend):
    tables made by the demo's DDL, filled from their Parquet copies (`export_parquet`) parents first."""
    import duckdb

    directory = Path(directory)
    paths = export_parquet(url, directory / "parquet", SPARK_TABLES)
    path = directory / "demo.duckdb"
    path.unlink(missing_ok=True)
    with duckdb.connect(str(path)) as conn:
        for statement in DDL.split(";")[1:]:  # the CREATE statements, after PostgreSQL's DROP of several tables
            if statement.strip():
                conn.execute(statement)
        for table in ("states", "people", "visits", "prescriptions", "survey", "checkins", "screenings"):
            conn.execute(f"INSERT INTO {table} SELECT * FROM read_parquet(?)", [str(paths[table])])
    return path


def spark_schema_text(schema_text: str, paths: dict[str, Path]) -> str:
    """A privacy schema's text with `path = ...` for each exported table (for the Spark backend)."""
    for table, path in paths.items():
        schema_text = schema_text.replace(f"[tables.{table}]\n", f'[tables.{table}]\npath = "{path}"\n', 1)
    return schema_text
