"""dpsql beside SmartNoise SQL and the exact query, on the same data, queries and PostgreSQL (issue 16).

    python benchmarks/bench_peers.py --people 100000 1000000 --reps 5

needs SmartNoise in the same environment (`pip install smartnoise-sql psycopg2-binary`; it pins opendp 0.14, so a
venv of its own with `pip install -e .` beside it is simplest). Without it only dpsql and the exact query run.

Data: people(person_id, age, sex, state, income, height) and visits(visit_id, person_id, day, amount, category),
NOT NULL as SmartNoise's metadata says, seeded: 50 states with Zipf-like weights, a rare sex 'X', incomes
log-normal with 5% zeros, 10% of people without visits and the rest Geometric(0.3) visits (mean about 3.3, a
tail past 10), 8 categories. Both systems get the same bounds: people one row per person, visits at most 10 rows
per person, no public key lists, dpsql's `max_groups_per_unit = 4`. ε = 1 and δ = 1e-6 per query; every
repetition is a new dpsql analyst (no cache). SmartNoise charges each aggregate its ε and the key count of
`censor_dims` another, so a third column runs dpsql at the ε SmartNoise charged: accuracy at equal privacy.
*dpsql, bounds chosen* is the same data under a schema that guesses no per-person bound: `rows_per_unit =
"auto"`, each query choosing its own from the data below a loose hard cap of 100 visits a person; it too runs
again at SmartNoise's ε.
Per query and system: median latency and its ratio to the exact query's (measured in the same loop), the
median relative error of every released value, the bias (relative error of the values' sum, averaged over
repetitions), and the share of true groups released. Results: benchmarks/results/peers.md.
"""

from __future__ import annotations

import argparse
import datetime
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dpsql.config import Settings  # noqa: E402
from dpsql.embedded import EmbeddedPostgres  # noqa: E402
from dpsql.engine import Engine  # noqa: E402
from dpsql.errors import Error  # noqa: E402
from dpsql.schema import parse_schema  # noqa: E402

EPSILON, DELTA = 1.0, 1e-6
CHOSEN, MATCHED, CHOSEN_MATCHED = "dpsql, bounds chosen", "dpsql at SmartNoise's ε", "bounds chosen at SmartNoise's ε"
SYSTEMS = ("dpsql", CHOSEN, "SmartNoise", MATCHED, CHOSEN_MATCHED)
STATES = [f"S{i:02d}" for i in range(50)]
CATEGORIES = ["checkup", "dental", "emergency", "lab", "pharmacy", "physio", "specialist", "vaccination"]
QUERIES = [  # (name, SQL, number of group-key columns)
    ("count people", "SELECT COUNT(*) AS n FROM public.people", 0),
    ("distinct visitors", "SELECT COUNT(DISTINCT person_id) AS users FROM public.visits", 0),
    ("count visits", "SELECT COUNT(*) AS n FROM public.visits", 0),
    ("sum income", "SELECT SUM(income) AS total FROM public.people", 0),
    ("avg age", "SELECT AVG(age) AS avg_age FROM public.people", 0),
    ("variance height", "SELECT VARIANCE(height) AS v FROM public.people", 0),
    ("stddev age", "SELECT STDDEV(age) AS sd FROM public.people", 0),
    ("count by sex", "SELECT sex, COUNT(*) AS n FROM public.people GROUP BY sex", 1),
    ("count by state", "SELECT state, COUNT(*) AS n FROM public.people GROUP BY state", 1),
    ("avg income by state", "SELECT state, COUNT(*) AS n, AVG(income) AS a FROM public.people GROUP BY state", 1),
    ("count by state, sex", "SELECT state, sex, COUNT(*) AS n FROM public.people GROUP BY state, sex", 2),
    ("seniors", "SELECT COUNT(*) AS n, AVG(income) AS a FROM public.people WHERE age >= 65", 0),
    ("age bands", "SELECT CASE WHEN age < 18 THEN 'a' WHEN age < 40 THEN 'b' WHEN age < 65 THEN 'c' ELSE 'd' END "
                  "AS band, COUNT(*) AS n FROM public.people GROUP BY CASE WHEN age < 18 THEN 'a' WHEN age < 40 "
                  "THEN 'b' WHEN age < 65 THEN 'c' ELSE 'd' END", 1),
    ("sum amount", "SELECT SUM(amount) AS total FROM public.visits", 0),
    ("visits by category", "SELECT category, COUNT(*) AS n, AVG(amount) AS a FROM public.visits GROUP BY category",
     1),
    ("visitors by category", "SELECT category, COUNT(DISTINCT person_id) AS users FROM public.visits "
                             "GROUP BY category", 1),
    ("top 3 states", "SELECT state, COUNT(*) AS n FROM public.people GROUP BY state ORDER BY n DESC LIMIT 3", 1),
    ("median income", "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY income) AS m FROM public.people", 0),
    ("visits by state (join)", "SELECT p.state, COUNT(*) AS n FROM public.people p JOIN public.visits v "
                               "ON p.person_id = v.person_id GROUP BY p.state", 1),
]

SCHEMA = {
    "privacy": {"unit": "people.person_id", "max_groups_per_unit": 4},
    "tables": {
        "people": {"columns": {"person_id": "bigint", "age": {"type": "integer", "lower": 0, "upper": 100},
                               "sex": "text", "state": "text",
                               "income": {"type": "integer", "lower": 0, "upper": 500000},
                               "height": {"type": "double precision", "lower": 120, "upper": 220}}},
        "visits": {"unit_column": "person_id", "max_rows_per_unit": 10, "columns": {
            "visit_id": "bigint", "person_id": "bigint", "day": {"type": "integer", "lower": 0, "upper": 364},
            "amount": {"type": "double precision", "lower": 0, "upper": 1000}, "category": "text"}},
    },
}


# The same data with no per-person bound guessed: each query chooses its own from the data (R2T's race, 20% of
# its ε) below a loose hard cap of 100 visits a person; value ranges stay declared.
CHOSEN_SCHEMA = {**SCHEMA, "privacy": {**SCHEMA["privacy"], "rows_per_unit": "auto"},
                 "tables": {**SCHEMA["tables"], "visits": {**SCHEMA["tables"]["visits"], "max_rows_per_unit": 100}}}


LEVEL = 0.01  # errors within this share of SmartNoise's are reported as level with it, not above


def smartnoise_metadata(people: int) -> dict:
    """The same bounds for SmartNoise: user-level privacy on person_id, 10 visit rows per person."""
    common = {"row_privacy": False, "censor_dims": True, "clamp_counts": True, "clamp_columns": True}
    return {"engine": "postgres", "bench": {"public": {
        "people": {**common, "rows": people, "max_ids": 1, "sample_max_ids": False,
                   "person_id": {"type": "int", "private_id": True},
                   "age": {"type": "int", "lower": 0, "upper": 100, "nullable": False},
                   "sex": {"type": "string", "cardinality": 3, "nullable": False},
                   "state": {"type": "string", "cardinality": 50, "nullable": False},
                   "income": {"type": "int", "lower": 0, "upper": 500000, "nullable": False},
                   "height": {"type": "float", "lower": 120.0, "upper": 220.0, "nullable": False}},
        "visits": {**common, "rows": people * 3, "max_ids": 10, "sample_max_ids": True,
                   "visit_id": {"type": "int", "nullable": False},
                   "person_id": {"type": "int", "private_id": True},
                   "day": {"type": "int", "lower": 0, "upper": 364, "nullable": False},
                   "amount": {"type": "float", "lower": 0.0, "upper": 1000.0, "nullable": False},
                   "category": {"type": "string", "cardinality": 8, "nullable": False}}}}}


def load(url: str, people: int, seed: int = 20261123) -> int:
    """The seeded data; returns the number of visits."""
    rng = np.random.default_rng(seed)
    weights = 1 / np.arange(1, 51) ** 1.1
    state = rng.choice(STATES, people, p=weights / weights.sum())
    sex = rng.choice(["F", "M", "X"], people, p=[0.495, 0.495, 0.01])
    age = rng.integers(0, 96, people)
    income = np.where(rng.random(people) < 0.05, 0, np.minimum(rng.lognormal(10.6, 0.7, people), 500000)).astype(int)
    height = np.clip(np.where(sex == "M", rng.normal(176, 8, people), rng.normal(163, 7, people)), 120, 220)
    visits = np.where(rng.random(people) < 0.1, 0, rng.geometric(0.3, people))
    owner = np.repeat(np.arange(1, people + 1), visits)
    total = len(owner)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS visits, people; CREATE TABLE people (person_id bigint PRIMARY KEY, "
                     "age integer NOT NULL, sex text NOT NULL, state text NOT NULL, income integer NOT NULL, "
                     "height double precision NOT NULL); CREATE TABLE visits (visit_id bigint PRIMARY KEY, "
                     "person_id bigint NOT NULL, day integer NOT NULL, amount double precision NOT NULL, "
                     "category text NOT NULL)")
        _copy(conn, "people", zip(range(1, people + 1), age, sex, state, income, np.round(height, 1), strict=True))
        _copy(conn, "visits", zip(range(1, total + 1), owner, rng.integers(0, 365, total),
                                  np.round(np.minimum(rng.lognormal(4, 1, total), 1000), 2),
                                  rng.choice(CATEGORIES, total, p=[.25, .12, .05, .15, .2, .08, .1, .05]), strict=True))
        # VACUUM as autovacuum would: index-only scans need the visibility map
        conn.execute("CREATE INDEX ON visits (person_id)")
        conn.execute("ALTER TABLE visits ADD FOREIGN KEY (person_id) REFERENCES people")  # the unit's link
        conn.execute("VACUUM ANALYZE people")
        conn.execute("VACUUM ANALYZE visits")
    return total


def _copy(conn: psycopg.Connection, table: str, rows) -> None:
    buffer = io.StringIO("".join("\t".join(map(str, row)) + "\n" for row in rows))
    with conn.cursor().copy(f"COPY {table} FROM STDIN") as copy:
        copy.write(buffer.getvalue())


def groups_of(rows: list, keys: int) -> dict[tuple, list[float]]:
    return {tuple(row[:keys]): [float(v) if v is not None else float("nan") for v in row[keys:]] for row in rows}


def timed(run) -> tuple[float, Any]:
    started = time.perf_counter()
    result = run()
    return (time.perf_counter() - started) * 1000, result


def measure(url: str, people: int, reps: int) -> list[dict]:
    engine = Engine(Settings(database=url, epsilon=EPSILON, delta=DELTA), parse_schema(SCHEMA))
    chosen = Engine(Settings(database=url, epsilon=EPSILON, delta=DELTA), parse_schema(CHOSEN_SCHEMA, "peers_auto"))
    smartnoise = _smartnoise(url, people)
    exact_conn = psycopg.connect(url, autocommit=True)
    results = []
    try:
        for name, sql, keys in QUERIES:
            row = {"name": name, "exact_ms": [], "systems": {}}
            systems = row["systems"]
            for system in SYSTEMS:
                systems[system] = {"ms": [], "rel": [], "bias": [], "recall": [], "error": None, "epsilon": None}
            # SmartNoise charges each aggregate ε and its key count another: dpsql at that ε compares accuracy at
            # equal privacy
            matched = _smartnoise_cost(smartnoise, sql)
            for rep in range(reps):
                ms, exact_rows = timed(lambda q=sql: exact_conn.execute(q.replace("public.", "")).fetchall())
                row["exact_ms"].append(ms)
                truth = groups_of(exact_rows, keys)
                analyst = f"bench_{people}_{len(results)}_{rep}"
                engine.ledger.add_analyst(analyst, 1e6, 1e-3)
                chosen.ledger.add_analyst(f"{analyst}_chosen", 1e6, 1e-3)  # the same ledger: another analyst
                runs = {"dpsql": lambda a=analyst, q=sql, s=systems: _dpsql(engine, q, a, EPSILON, s["dpsql"]),
                        CHOSEN: lambda a=f"{analyst}_chosen", q=sql, s=systems: _dpsql(chosen, q, a, EPSILON,
                                                                                       s[CHOSEN])}
                if smartnoise is not None:
                    runs["SmartNoise"] = lambda q=sql, s=systems: _smartnoise_rows(smartnoise, q, s["SmartNoise"])
                if matched is not None:  # its own analyst: the same query at the same ε would be the stored answer
                    for system, eng in ((MATCHED, engine), (CHOSEN_MATCHED, chosen)):
                        other = f"{analyst}_{system}"
                        eng.ledger.add_analyst(other, 1e6, 1e-3)
                        runs[system] = lambda a=other, q=sql, e=matched, s=systems[system], g=eng: _dpsql(g, q, a, e, s)
                for system, run in runs.items():
                    stats = row["systems"][system]
                    try:
                        ms, released = timed(run)
                    except (Error, Exception) as exc:  # noqa: BLE001 - a refusal is a result
                        stats["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
                        continue
                    stats["ms"].append(ms)
                    _score(stats, truth, groups_of(released, keys))
            results.append(row)
            print(_line(row), flush=True)
    finally:
        exact_conn.close()
        engine.close()
        chosen.close()
    return results


def _dpsql(engine: Engine, sql: str, analyst: str, epsilon: float, stats: dict) -> list:
    answer = engine.query(sql, analyst=analyst, epsilon=epsilon)
    stats["epsilon"] = answer.epsilon
    return answer.rows


def _smartnoise_cost(reader, sql: str) -> float | None:
    if reader is None:
        return None
    try:
        return float(reader.get_privacy_cost(sql)[0])
    except Exception:  # noqa: BLE001 - a query SmartNoise refuses
        return None


def _smartnoise_rows(reader, sql: str, stats: dict) -> list:
    rows = reader.execute(sql)[1:]
    stats["epsilon"] = reader.get_privacy_cost(sql)[0]  # what its odometer charges for the query
    return rows


def _smartnoise(url: str, people: int):
    try:
        import psycopg2
        import snsql
        from snsql.metadata import Metadata
    except ImportError:
        print("SmartNoise is not installed: measuring dpsql and the exact query only", file=sys.stderr)
        return None
    info = psycopg.conninfo.conninfo_to_dict(url)
    conn = psycopg2.connect(**{k: v for k, v in info.items() if v})
    conn.autocommit = True
    return snsql.from_connection(conn, privacy=snsql.Privacy(epsilon=EPSILON, delta=DELTA),
                                 metadata=Metadata.from_dict(smartnoise_metadata(people)))


def _score(stats: dict, truth: dict[tuple, list[float]], released: dict[tuple, list[float]]) -> None:
    """Relative errors of every released value of a true group, the relative error of each column's sum (the
    bias, over repetitions) and the share of true groups released."""
    shared = [k for k in truth if k in released]
    for key in shared:
        for exact, noisy in zip(truth[key], released[key], strict=False):
            if exact:
                stats["rel"].append(abs(noisy - exact) / abs(exact))
    exact_total = sum(truth[k][0] for k in shared)
    if shared and exact_total:
        stats["bias"].append((sum(released[k][0] for k in shared) - exact_total) / abs(exact_total))
    stats["recall"].append(len(shared) / len(truth) if truth else 1.0)


def _line(row: dict) -> str:
    exact = statistics.median(row["exact_ms"])
    cells = [row["name"], f"{exact:.3g}"]
    for stats in row["systems"].values():
        if not stats["ms"]:
            cells += ["no" if stats["error"] else "–", "", "", "", ""]
            continue
        ms = statistics.median(stats["ms"])
        rel = statistics.median(stats["rel"]) if stats["rel"] else float("nan")
        bias = statistics.mean(stats["bias"]) if stats["bias"] else float("nan")
        cells += [f"{ms:.3g} (×{ms / exact:.3g})", f"{rel:.3g}", f"{bias:+.3g}",
                  f"{statistics.mean(stats['recall']):.3g}", f"{stats['epsilon']:.3g}"]
    return "| " + " | ".join(cells) + " |"


def report(people: int, visits: int, reps: int, results: list[dict]) -> str:
    lines = [f"## {people:,} people ({visits:,} visits), {reps} repetitions, ε = {EPSILON:g}, δ = {DELTA:g}",
             f"Run {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}.", "",
             "| query | exact ms | " + " | ".join(f"{s} {m}" for s in SYSTEMS for m in (
                 "ms (×exact)", "rel. error", "bias", "recall", "ε")) + " |",
             "|---|---|" + "---|" * 5 * len(SYSTEMS)]
    lines += [_line(row) for row in results]
    refusals = [f"- {row['name']}, {system}: {stats['error']}" for row in results
                for system, stats in row["systems"].items() if stats["error"] and not stats["ms"]]
    both = [row for row in results if row["systems"]["dpsql"]["ms"] and row["systems"]["SmartNoise"]["ms"]]
    if both:
        speedups = [statistics.median(r["systems"]["SmartNoise"]["ms"]) / statistics.median(r["systems"]["dpsql"]["ms"])
                    for r in both]
        slower = [r["name"] for r, s in zip(both, speedups, strict=True) if s < 1]
        lines += ["", f"dpsql over SmartNoise on {len(both)} queries both answer: median "
                  f"{statistics.median(speedups):.3g}× faster, min {min(speedups):.3g}×, max {max(speedups):.3g}×"
                  + (f"; slower on: {', '.join(slower)}" if slower else "; faster on every one")]
    for system in (MATCHED, CHOSEN_MATCHED):  # accuracy at equal privacy
        compared = [r for r in both if r["systems"][system]["rel"] and r["systems"]["SmartNoise"]["rel"]]
        errors = [(r["name"], statistics.median(r["systems"][system]["rel"]),
                   statistics.median(r["systems"]["SmartNoise"]["rel"])) for r in compared]
        # within 1% is level: where both truncate at one declared bound their errors are that bias, alike to 3 digits
        worse = [f"{name} ({ours:.3g} against {theirs:.3g})" for name, ours, theirs in errors
                 if ours > theirs * (1 + LEVEL)]
        level = [f"{name} ({ours:.3g} against {theirs:.3g})" for name, ours, theirs in errors
                 if theirs * (1 + 1e-9) < ours <= theirs * (1 + LEVEL)]
        lines.append(f"{system}, median relative error on {len(compared)} queries both answer: "
                     + (f"above SmartNoise's on {', '.join(worse)}" if worse else "at most SmartNoise's on every one")
                     + (f"; level with it (within {LEVEL:.0%}) on {', '.join(level)}" if level else ""))
    overheads = sorted((statistics.median(r["systems"]["dpsql"]["ms"]) / statistics.median(r["exact_ms"]), r["name"])
                       for r in results if r["systems"]["dpsql"]["ms"])
    chosen_overheads = sorted((statistics.median(r["systems"][CHOSEN]["ms"]) / statistics.median(r["exact_ms"]),
                               r["name"]) for r in results if r["systems"][CHOSEN]["ms"])
    if chosen_overheads:
        lines.append(f"{CHOSEN} over the exact query: median {statistics.median(o for o, _ in chosen_overheads):.3g}×, "
                     "worst " + ", ".join(f"{name} {o:.3g}×" for o, name in chosen_overheads[-3:][::-1]))
    if overheads:
        lines.append(f"dpsql over the exact query: median {statistics.median(o for o, _ in overheads):.3g}×, worst "
                     + ", ".join(f"{name} {o:.3g}×" for o, name in overheads[-3:][::-1]))
    if refusals:
        lines += ["", "Refused:", *refusals]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--people", type=int, nargs="+", default=[100_000])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "peers.md"))
    args = parser.parse_args()
    sections = []
    with tempfile.TemporaryDirectory(prefix="dpsql-peers-") as directory, EmbeddedPostgres(directory) as url:
        for people in args.people:
            print(f"loading {people:,} people ...", file=sys.stderr, flush=True)
            visits = load(url, people)
            sections.append(report(people, visits, args.reps, measure(url, people, args.reps)))
            print(sections[-1], flush=True)
    Path(args.out).write_text("# dpsql beside SmartNoise SQL and the exact query\n\n`python benchmarks/bench_peers.py "
                              f"--people {' '.join(map(str, args.people))} --reps {args.reps}`\n\n"
                              + "\n\n".join(sections) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
