"""A black-box statistical auditor of what leaves the door: a query is answered many times on a database and on a
neighbour, and from the two samples of what the client received an ε is found that the mechanism must at least
spend, with a stated confidence. Sensitivity tests check the SQL; this checks the released rows, with the key
spelling, rounding, clamping, partition selection, HAVING, LIMIT and every other post-processing step included.

The method is the one of DP-Auditorium's and the SQL-level testers' hockey-stick estimates, reduced to events:
(ε, δ)-DP says P[M(D) ∈ S] ≤ e^ε · P[M(D') ∈ S] + δ for every set S of outputs, so an event S that one side
shows far more often than the other bounds ε from below:

    ε ≥ ln((p_D(S) − δ) / p_D'(S)).

The draws are split in two. The first half chooses, among candidate events, the one with the largest estimate in
each direction (which side is D is part of the choice); the second half measures the two chosen events afresh,
with one-sided Clopper-Pearson bounds (the lower one for the numerator, the upper one for the denominator) at
confidence 1 − α/4 each, so the reported bound holds with probability at least 1 − α whichever events were
chosen. A bound above the claimed ε is then a violation at that confidence, not sampling error.

Candidate events read an output as the client does, as text: the exact text of every key column and the number
of rows (an output's *shape*: `5.0` and `5.00` are different outputs), and for each noisy cell thresholds at the
pooled sample's quantiles (`value ≤ t` and `value ≥ t`, a missing cell counting as neither).

Each draw must be a fresh release: an analyst asking again gets the kept answer, so every draw comes from a new
analyst (as an adversary with many accounts would ask). The world is small and built for it (`build_world`): a
base of PEOPLE people and a neighbour with one more, numbered and stored first, whose values equal others' but
are spelled otherwise (5.00 for 5.0, -0.02 where others have 0.02, 'a  ' in a bpchar column). `QUERY_CLASSES`
covers each mechanism and post-processing path; `tests/test_privacy_round3.py` runs the fast ones in CI, through
the engine and through the wire port, and `benchmarks/audit.py` runs all of them with many draws.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from scipy.stats import beta

Output = tuple[tuple[str, ...], ...]  # the rows a client received, every value as its text
THRESHOLDS = 16  # per noisy cell, quantiles of the pooled sample


@dataclass(frozen=True)
class Audit:
    name: str
    draws: int  # per database
    epsilon_lower_bound: float  # with probability >= 1 - alpha, the mechanism spends at least this
    claimed_epsilon: float
    claimed_delta: float
    event: str  # the event that gave the bound

    @property
    def violated(self) -> bool:
        return self.epsilon_lower_bound > self.claimed_epsilon * (1 + 1e-9)

    def row(self) -> str:
        bound = "∞" if math.isinf(self.epsilon_lower_bound) else f"{self.epsilon_lower_bound:.3f}"
        return (f"| {self.name} | {self.draws} | {bound} | {self.claimed_epsilon:g} | {self.claimed_delta:g} | "
                f"{'VIOLATED' if self.violated else 'ok'} | {self.event} |")


HEADER = ("| query class | draws per database | ε lower bound (95%) | claimed ε | claimed δ | verdict | event |\n"
          "|---|---|---|---|---|---|---|")


def as_text(rows: Sequence[Sequence[object]]) -> Output:
    """Rows as a client reads them: each value's text (None as NULL)."""
    return tuple(tuple("NULL" if v is None else str(v) for v in row) for row in rows)


def audit(name: str, draw: Callable[[str], Output], draws: int, keys: int, claimed_epsilon: float,
          claimed_delta: float = 0.0, alpha: float = 0.05) -> Audit:
    """Draw `draws` outputs from each side (`draw("base")`, `draw("neighbour")`), whose first `keys` columns are
    exact and the others noisy, and bound ε from below at confidence 1 - alpha."""
    base = [draw("base") for _ in range(draws)]
    neighbour = [draw("neighbour") for _ in range(draws)]
    half = draws // 2
    events = _events(base[:half] + neighbour[:half], keys)
    best = max(epsilon_lower_bound(base, neighbour, half, events, claimed_delta, alpha),
               epsilon_lower_bound(neighbour, base, half, events, claimed_delta, alpha, swapped=True))
    return Audit(name, draws, best[0], claimed_epsilon, claimed_delta, best[1])


def epsilon_lower_bound(first: list[Output], second: list[Output], half: int,
                        events: list[tuple[str, Callable[[Output], bool]]], delta: float, alpha: float,
                        swapped: bool = False) -> tuple[float, str]:
    """The event that most separates `first` from `second` on the first `half` draws, and the bound its
    frequencies on the remaining draws give (ln((p1 − δ)/p2) with Clopper-Pearson ends at 1 − alpha/4)."""
    chosen, best = None, -math.inf
    for label, test in events:
        hits1 = sum(map(test, first[:half]))
        hits2 = sum(map(test, second[:half]))
        estimate = math.log((hits1 + 0.5) / (hits2 + 0.5))  # a smoothed estimate, for choosing only
        if estimate > best:
            chosen, best = (label, test), estimate
    if chosen is None:
        return 0.0, "no event"
    label, test = chosen
    n1, n2 = len(first) - half, len(second) - half
    hits1, hits2 = sum(map(test, first[half:])), sum(map(test, second[half:]))
    low1 = _clopper_pearson_low(hits1, n1, alpha / 4)
    high2 = _clopper_pearson_high(hits2, n2, alpha / 4)
    if low1 - delta <= 0:
        return 0.0, label
    bound = math.inf if high2 == 0 else max(0.0, math.log((low1 - delta) / high2))
    side = "neighbour" if swapped else "base"
    return bound, f"{label} ({hits1}/{n1} on the {side}, {hits2}/{n2} on the other)"


def _clopper_pearson_low(hits: int, n: int, alpha: float) -> float:
    return 0.0 if hits == 0 else float(beta.ppf(alpha, hits, n - hits + 1))


def _clopper_pearson_high(hits: int, n: int, alpha: float) -> float:
    return 1.0 if hits == n else float(beta.ppf(1 - alpha, hits + 1, n - hits))


def _shape(output: Output, keys: int) -> tuple:
    return tuple(row[:keys] for row in output)


def _cells(output: Output, keys: int) -> dict[tuple, float]:
    """Each noisy value by (its row's key text, its column)."""
    cells = {}
    for row in output:
        for j, text in enumerate(row[keys:]):
            try:
                cells[(row[:keys], j)] = float(text)
            except ValueError:
                continue
    return cells


def _events(sample: list[Output], keys: int) -> list[tuple[str, Callable[[Output], bool]]]:
    """Candidate events from a pooled sample: each shape seen, and thresholds on each noisy cell."""
    events: list[tuple[str, Callable[[Output], bool]]] = []
    for shape in dict.fromkeys(_shape(o, keys) for o in sample):
        events.append((f"keys {list(shape)[:4]}{'…' if len(shape) > 4 else ''}",
                       lambda o, s=shape: _shape(o, keys) == s))
    values: dict[tuple, list[float]] = {}
    for output in sample:
        for cell, value in _cells(output, keys).items():
            values.setdefault(cell, []).append(value)
    for cell, seen in values.items():
        seen.sort()
        for t in dict.fromkeys(seen[int(q * (len(seen) - 1) / THRESHOLDS)] for q in range(1, THRESHOLDS)):
            events.append((f"{cell} <= {t:g}", lambda o, c=cell, t=t: _cells(o, keys).get(c, math.nan) <= t))
            events.append((f"{cell} >= {t:g}", lambda o, c=cell, t=t: _cells(o, keys).get(c, math.nan) >= t))
    return events


# --- the world: a base and its spelling neighbour ----------------------------------------------------------------

SCHEMA_TOML = """
[privacy]
unit = "people.person_id"
max_groups_per_unit = 2

[tables.people.columns]
person_id = "bigint"
balance = "numeric"
state = { type = "text", domain = ["East", "West"] }
score = { type = "double precision", lower = -5, upper = 5 }
code = "text"
visits = { type = "integer", lower = 0, upper = 10 }

[tables.trips]
unit_column = "person_id"
max_rows_per_unit = 20
[tables.trips.columns]
person_id = "bigint"
kind = { type = "text", domain = ["bus", "car"] }
fare = { type = "double precision", lower = 0, upper = 100 }

[tables.rides]
unit_column = "person_id"
trust_link = true                # riders are units whether or not they are among the people
max_rows_per_unit = 100
[tables.rides.columns]
person_id = "bigint"
line = "text"
fare = { type = "double precision", lower = 0, upper = 50 }

[tables.lines]
public = true                    # the lines, the neighbour's own among them
[tables.lines.columns]
code = { type = "text", unique = true }
"""
PEOPLE = 400
RIDERS = 3000  # the riders of `rides`: units of their own, most not among the people
ADDED = (0, "5.00", "West", -0.02, "a  ", 3)  # the neighbour's person: numbered and stored before everyone


def build_world(admin_url: str, url_for: Callable[[str], str], prefix: str = "dpsql_audit") -> dict[str, str]:
    """Creates the base and the neighbour databases; returns their URLs by side ("base", "neighbour")."""
    urls = {}
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for side, first in (("base", None), ("neighbour", ADDED)):
            name = f"{prefix}_{side}"
            conn.execute(f"DROP DATABASE IF EXISTS {name}")
            conn.execute(f"CREATE DATABASE {name}")
            urls[side] = url_for(name)
            _load(urls[side], first)
    return urls


def _load(url: str, first: tuple | None) -> None:
    """PEOPLE people whose balance is 5.0, score about 0.02 and code 'a' (a bpchar column: equality ignores
    trailing spaces), with up to 5 trips and 5 rides each; the neighbour has `first` before them, with 20 trips at
    the top fare and 3 rides on a line no one else takes."""
    rows = [(i, "5.0", "West" if i % 3 else "East", 0.02 + (i % 3) / 100, "a", i % 11) for i in range(1, PEOPLE + 1)]
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE people (person_id bigint PRIMARY KEY, balance numeric, state text, "
                    "score double precision, code bpchar, visits integer)")
        cur.executemany("INSERT INTO people VALUES (%s, %s::numeric, %s, %s, %s, %s)",
                        ([first] if first else []) + rows)
        # each person's trips (0 to 5, fares up to 30): the neighbour's person takes the cap, 20 at the top fare
        trips = [(i, "bus" if (i + j) % 3 else "car", float((i * 7 + j) % 31)) for i in range(1, PEOPLE + 1)
                 for j in range(i % 6)]
        trips = ([(first[0], "car", 100.0)] * 20 if first else []) + trips
        cur.execute("CREATE TABLE trips (person_id bigint NOT NULL REFERENCES people, kind text, "
                    "fare double precision)")
        cur.executemany("INSERT INTO trips VALUES (%s, %s, %s)", trips)
        # rides (0 to 5 a rider, fares up to 19) on three lines, by RIDERS riders: enough for the race to resolve
        # the data, so that its τ bounds partition selection; the neighbour's person rides 3 times on a line of its
        # own at the top fare
        rides = [(i, f"l{(i + j) % 3}", float((i + j) % 20)) for i in range(1, RIDERS + 1) for j in range(i % 6)]
        rides = ([(first[0], "x", 50.0)] * 3 if first else []) + rides
        cur.execute("CREATE TABLE rides (person_id bigint NOT NULL, line text, fare double precision)")
        cur.executemany("INSERT INTO rides VALUES (%s, %s, %s)", rides)
        cur.execute("CREATE TABLE lines (code text PRIMARY KEY)")
        cur.execute("INSERT INTO lines VALUES ('l0'), ('l1'), ('l2'), ('x')")
        cur.execute("ANALYZE")


def write_schema(folder: Path) -> Path:
    path = folder / "audit.toml"
    path.write_text(SCHEMA_TOML)
    return path


# --- doors: one fresh release per call, as the client receives it ------------------------------------------------

_analysts = itertools.count()
PASSWORD = "audit pass"


def new_analyst(engine: Any, password: bool = False) -> str:
    from dpsql.server.auth import scram_verifier

    name = f"audited_{next(_analysts)}"
    engine.ledger.add_analyst(name, 100.0, 1e-3)
    if password:
        engine.ledger.set_verifier(name, scram_verifier(PASSWORD, iterations=4096))
    return name


def engine_door(engines: dict[str, Any], ask: Callable[[Any, str], Output]) -> Callable[[str], Output]:
    """Draws through the engine (the DB-API and the CLI send its answer on): `ask(engine, analyst)`."""
    return lambda side: ask(engines[side], new_analyst(engines[side]))


def query(sql: str, epsilon: float = 1.0, rows_per_unit: str | None = None) -> Callable[[Any, str], Output]:
    from dpsql.session import Options

    options = Options(rows_per_unit=rows_per_unit) if rows_per_unit else None
    return lambda engine, analyst: as_text(engine.query(sql, analyst=analyst, epsilon=epsilon, options=options).rows)


@contextlib.contextmanager
def served(urls: dict[str, str], schema: str) -> Iterator[tuple[dict[str, Any], dict[str, int]]]:
    """`dpsql serve` on each side's database (a thread's event loop): the engines and ports, by side."""
    from dpsql.config import Settings
    from dpsql.server import build_server

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    servers = {side: build_server(Settings(database=url, schema=schema, listen="127.0.0.1:0"))
               for side, url in urls.items()}
    try:
        for _, server in servers.values():
            asyncio.run_coroutine_threadsafe(server.start(), loop).result()
        yield ({side: engine for side, (engine, _) in servers.items()},
               {side: server.port for side, (_, server) in servers.items()})
    finally:
        for engine, server in servers.values():
            asyncio.run_coroutine_threadsafe(server.close(), loop).result()
            server.gateway.close()
            engine.close()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


WIRE_TYPES = ("int2", "int4", "int8", "float4", "float8", "numeric", "bool", "date", "timestamp", "timestamptz")


def wire_door(engines: dict[str, Any], ports: dict[str, int], sql: str,
              epsilon: float = 1.0) -> Callable[[str], Output]:
    """Draws through `dpsql serve`'s wire port with psycopg, each as a new analyst logging in; every value is
    read as the text on the wire (psql shows it so), not parsed (a float would hide 5.00 as 5.0)."""
    from psycopg.types.string import TextLoader

    def draw(side: str) -> Output:
        analyst = new_analyst(engines[side], password=True)
        dsn = f"host=127.0.0.1 port={ports[side]} user={analyst} password='{PASSWORD}' dbname=audit sslmode=disable"
        with psycopg.connect(dsn, autocommit=True) as conn:
            for name in WIRE_TYPES:
                conn.adapters.register_loader(name, TextLoader)
            conn.execute(f"SET dpsql.epsilon = {epsilon}")
            return as_text(conn.execute(sql).fetchall())
    return draw


def release(kind: str) -> Callable[[Any, str], Output]:
    """A release's output as rows: synthetic cells, a tree's JSON (one exact key), a density's values by point."""
    from dpsql.releases import decision_tree, density
    from dpsql.releases.synth import synthesize

    def ask(engine: Any, analyst: str) -> Output:
        if kind == "synth":
            out = synthesize(engine, analyst, "people", ["state", "visits"], 1.0, method="perturb")
            return as_text([(json.dumps(index), count) for index, count in out["cells"]])
        if kind == "tree":
            tree = decision_tree(engine, analyst, "people", "state", ["visits"], 1.0, depth=1)["tree"]
            return as_text(_leaves(tree, ""))
        out = density(engine, analyst, "people", "score", 1.0, 1e-6, points=8)
        return as_text(list(zip(out["points"], out["density"], strict=True)))
    return ask


def _leaves(node: dict, path: str) -> list[tuple]:
    """A tree as rows (path of split values, predicted label, label, noisy count): the structure exact, the counts
    noisy."""
    if "leaf" in node:
        return [(path, node["predict"], label, count) for label, count in sorted(node["leaf"].items())]
    return [row for value, child in sorted(node["children"].items())
            for row in _leaves(child, f"{path}/{node['split']}={value}")]


def bounds_effect(sql: str, epsilon: float = 1.0) -> Callable[[Any, str], Output]:
    def ask(engine: Any, analyst: str) -> Output:
        out = engine.bounds_effect(analyst, engine.prepare(sql), epsilon).output
        return as_text([(c["label"], c["units"]) for c in out["counts"]])
    return ask


@dataclass(frozen=True)
class QueryClass:
    name: str
    ask: Callable[[Any, str], Output]
    keys: int  # leading exact columns of each row
    epsilon: float = 1.0  # claimed
    delta: float = 0.0
    fast: bool = False  # in CI's set


DELTA = 1e-6  # Settings' default δ of partition selection
QUERY_CLASSES = [
    QueryClass("count (discrete Laplace)", query("SELECT COUNT(*) FROM people"), 0, fast=True),
    QueryClass("sum and avg over clamped values", query("SELECT SUM(visits), AVG(score) FROM people"), 0, fast=True),
    QueryClass("float sum on its grid", query("SELECT SUM(score) FROM people"), 0),
    QueryClass("declared domain", query("SELECT state, COUNT(*) FROM people GROUP BY state"), 1, fast=True),
    QueryClass("partition selection", query("SELECT visits, COUNT(*) FROM people GROUP BY visits"), 1, delta=DELTA),
    QueryClass("keys alone by partition selection (a filter's list)", query("SELECT DISTINCT visits FROM people"), 1,
               delta=DELTA),
    QueryClass("bool_or and bool_and read off noisy counts",
               query("SELECT bool_or(fare > 50), bool_and(fare <= 50) FROM trips"), 0),
    QueryClass("numeric key spelled by one row", query("SELECT balance, COUNT(*) FROM people GROUP BY balance"), 1,
               delta=DELTA, fast=True),
    QueryClass("-0 key", query("SELECT round(score * 10) / 10 AS s, COUNT(*) FROM people GROUP BY 1"), 1,
               delta=DELTA),
    QueryClass("bpchar key", query("SELECT code, COUNT(*) FROM people GROUP BY code"), 1, delta=DELTA),
    QueryClass("HAVING over noisy counts",
               query("SELECT visits, COUNT(*) FROM people GROUP BY visits HAVING COUNT(*) > 36"), 1, delta=DELTA,
               fast=True),
    QueryClass("ORDER BY noisy value LIMIT", query("SELECT state, COUNT(*) FROM people GROUP BY state "
                                                    "ORDER BY 2 DESC LIMIT 1"), 1),
    QueryClass("negative counts clamped, rounded",
               query("SELECT GREATEST(ROUND(COUNT(*) / 2.0), 0) FROM people WHERE score > 4"), 0, fast=True),
    QueryClass("top-k (exponential mechanism)",
               query("SELECT visits, COUNT(*), AVG(score) FROM people GROUP BY visits ORDER BY COUNT(*) DESC LIMIT 2"),
               1, delta=DELTA),
    QueryClass("top-k of counts that select themselves (the released counts ordered and cut)",
               query("SELECT visits, COUNT(*) FROM people GROUP BY visits ORDER BY COUNT(*) DESC LIMIT 2"), 1,
               delta=DELTA),
    QueryClass("median (exponential mechanism)",
               query("SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY visits) FROM people"), 0, fast=True),
    QueryClass("MAX (exponential mechanism)", query("SELECT MAX(visits) FROM people"), 0),
    QueryClass("mode (exponential mechanism)", query("SELECT mode() WITHIN GROUP (ORDER BY state) FROM people"), 0),
    QueryClass("synthetic table (perturb)", release("synth"), 1),
    QueryClass("decision tree", release("tree"), 3),
    QueryClass("density (Gaussian process)", release("density"), 1, delta=1e-6),
    QueryClass("bounds' effect estimate", bounds_effect("SELECT SUM(visits) FROM people"), 1),
    QueryClass("bounds chosen from the data (a race for the sum's totals, one for the counts' rows)",
               query("SELECT kind, COUNT(*), AVG(fare) FROM trips GROUP BY kind", rows_per_unit="auto"), 1,
               fast=True),
    QueryClass("a per-unit table's sums bounded by a race over the units' values (spend per person)",
               query("SELECT AVG(spent) FROM (SELECT person_id, SUM(fare) AS spent FROM trips GROUP BY person_id "
                     "HAVING COUNT(*) > 1) t", rows_per_unit="auto"), 0),
    QueryClass("distinct values of the rows each unit keeps (COUNT(DISTINCT) of a column that is not the unit)",
               query("SELECT kind, COUNT(DISTINCT fare) FROM trips GROUP BY kind", rows_per_unit="auto"), 1),
    QueryClass("a median over several rows per unit, at the race's τ itself",
               query("SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY fare) FROM trips", rows_per_unit="auto"), 0),
    QueryClass("a median beside a count by kind (its histogram keeps 8 rows, the count the race's)",
               query("SELECT kind, COUNT(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY fare) FROM trips "
                     "GROUP BY kind", rows_per_unit="auto"), 1),
    QueryClass("the rows of keys a subquery did not release (NOT IN its released keys: two parts)",
               query("SELECT COUNT(*) FROM trips WHERE kind NOT IN (SELECT kind FROM trips GROUP BY kind "
                     "HAVING COUNT(*) > 340)"), 0),
    QueryClass("a sum of a unit's groups' counts (raced up to the unit's rows, not its groups' k each)",
               query("SELECT SUM(n) FROM (SELECT person_id, kind, COUNT(*) AS n FROM trips GROUP BY person_id, "
                     "kind) t", rows_per_unit="auto"), 0),
    QueryClass("partition selection over each unit's kept rows, weighed (the race's k rows)",
               query("SELECT line, COUNT(*) FROM rides GROUP BY line", rows_per_unit="auto"), 1, delta=DELTA),
    QueryClass("a public table's values as keys (every line released, the neighbour's own too)",
               query("SELECT l.code, COUNT(r.person_id) FROM lines l LEFT JOIN rides r ON r.line = l.code "
                     "GROUP BY l.code", rows_per_unit="auto"), 1),
    QueryClass("groups within a unit: a subquery by the unit and a key, a row per group outside",
               query("SELECT AVG(n), COUNT(*) FROM (SELECT person_id, kind, COUNT(*) AS n FROM trips "
                     "GROUP BY person_id, kind) t", rows_per_unit="auto"), 0),
    QueryClass("a per-unit subquery joined to the unit's row (joined inside it)",
               query("SELECT p.state, COUNT(*), AVG(t.spent) FROM people p JOIN (SELECT person_id, SUM(fare) AS spent "
                     "FROM trips GROUP BY person_id) t ON t.person_id = p.person_id GROUP BY p.state"), 1),
    QueryClass("every unit's row left joined to a per-unit subquery (its values NULL where it has none)",
               query("SELECT AVG(COALESCE(t.n, 0)) FROM people p LEFT JOIN (SELECT person_id, COUNT(*) AS n "
                     "FROM trips GROUP BY person_id) t ON t.person_id = p.person_id"), 0),
    QueryClass("a condition as a key (false and true released)",
               query("SELECT fare > 50 AS dear, COUNT(*) FROM trips GROUP BY 1"), 1),
    QueryClass("the same beside an average (the weighed answer: each set of units aggregated apart)",
               query("SELECT line, COUNT(*), AVG(fare) FROM rides GROUP BY line", rows_per_unit="auto"), 1,
               delta=DELTA),
    QueryClass("a sum of released counts (those shown as 0 read at their noisy value)",
               query("SELECT SUM(n), AVG(n) FROM (SELECT kind, COUNT(*) AS n FROM trips WHERE fare > 28 "
                     "GROUP BY kind) t"), 0),
    QueryClass("a standard deviation of released counts (their noise variance taken off)",
               query("SELECT stddev(n), var_pop(n) FROM (SELECT kind, COUNT(*) AS n FROM trips WHERE fare > 28 "
                     "GROUP BY kind) t"), 0),
    QueryClass("the people beside a sum (the race over the units' totals)",
               query("SELECT kind, SUM(fare), COUNT(DISTINCT person_id) FROM trips GROUP BY kind",
                     rows_per_unit="auto"), 1),
    QueryClass("the people who meet a condition (COUNT(DISTINCT unit) FILTER: 1 a group each)",
               query("SELECT kind, COUNT(DISTINCT person_id) FILTER (WHERE fare > 10) FROM trips GROUP BY kind"), 1),
    QueryClass("a subquery by unit and key regrouped by the key (one grouped query)",
               query("SELECT kind, COUNT(*), AVG(n) FROM (SELECT person_id, kind, COUNT(*) AS n FROM trips "
                     "GROUP BY 1, 2) t GROUP BY kind"), 1),
    QueryClass("a standard deviation (the race over the units' totals of squares)",
               query("SELECT stddev(fare), AVG(fare) FROM trips", rows_per_unit="auto"), 0),
    QueryClass("people in two sets (INTERSECT of the unit's column: a subquery by unit with HAVING)",
               query("SELECT COUNT(*) FROM (SELECT person_id FROM trips WHERE fare > 20 INTERSECT SELECT person_id "
                     "FROM trips WHERE kind = 'bus') t"), 0),
    QueryClass("keys of the unit's own row beside an outer join (each unit in one group, stop 68)",
               query("SELECT p.state, COUNT(DISTINCT p.person_id), COUNT(t.person_id) FROM people p LEFT JOIN trips t "
                     "ON t.person_id = p.person_id GROUP BY p.state", rows_per_unit="auto"), 1),
    QueryClass("keys of a unit's row left-joined on the unit alone (Metabase's join to people, stop 68)",
               query("SELECT p.state, COUNT(DISTINCT t.person_id) FROM trips t LEFT JOIN people p "
                     "ON t.person_id = p.person_id GROUP BY p.state", rows_per_unit="auto"), 1),
    QueryClass("an average raced over totals beside a median from its own histogram (stop 68)",
               query("SELECT AVG(fare), percentile_cont(0.5) WITHIN GROUP (ORDER BY fare) FROM trips",
                     rows_per_unit="auto"), 0),
    QueryClass("two grouped answers full-joined after noise (stop 68)",
               query("SELECT kind, a.n, b.n FROM (SELECT kind, COUNT(*) AS n FROM trips WHERE fare > 28 GROUP BY kind) "
                     "a FULL JOIN (SELECT kind, COUNT(*) AS n FROM trips WHERE fare <= 28 GROUP BY kind) b "
                     "USING (kind)"), 1),
    QueryClass("a per-unit subquery joined to the unit's several rows: a segment's count and sum (stop 69)",
               query("SELECT CASE WHEN t.n >= 3 THEN 'many' ELSE 'few' END, COUNT(*), SUM(r.fare) FROM trips r "
                     "JOIN (SELECT person_id, COUNT(*) AS n FROM trips GROUP BY person_id HAVING SUM(fare) > 10) t "
                     "ON t.person_id = r.person_id GROUP BY 1", rows_per_unit="auto"), 1),
    QueryClass("declared values present per group, from units per (key, value) (stop 69)",
               query("SELECT p.state, COUNT(DISTINCT t.kind) FROM trips t JOIN people p USING (person_id) "
                     "GROUP BY 1"), 1, delta=DELTA),
    QueryClass("each unit's first rows by ROW_NUMBER() and a previous value by LAG, from a windowed source (ties "
               "broken by the row, stop 70)",
               query("SELECT kind, COUNT(*), SUM(prev) FROM (SELECT kind, ROW_NUMBER() OVER (PARTITION BY person_id "
                     "ORDER BY fare) AS rn, LAG(fare) OVER (PARTITION BY person_id ORDER BY kind) AS prev "
                     "FROM trips) t WHERE rn <= 2 GROUP BY 1"), 1),
    QueryClass("each unit's latest row by DISTINCT ON (one row a unit, stop 70)",
               query("SELECT kind, COUNT(*), SUM(fare) FROM (SELECT DISTINCT ON (person_id) * FROM trips ORDER BY "
                     "person_id, kind DESC) t GROUP BY 1"), 1),
    QueryClass("each unit's first rows joined to its one row, the WHERE split around the window (stop 71)",
               query("SELECT state, COUNT(*), SUM(fare) FROM (SELECT t.fare, p.state, ROW_NUMBER() OVER (PARTITION "
                     "BY t.person_id ORDER BY t.fare DESC) AS rn FROM trips t JOIN people p ON p.person_id = "
                     "t.person_id WHERE t.fare > 5 AND p.balance > 0) x WHERE rn <= 2 GROUP BY 1"), 1),
    QueryClass("declared values present, each unit counted once for one of its rows (stop 71)",
               query("SELECT COUNT(DISTINCT kind) FROM trips WHERE fare > 1"), 0),
    QueryClass("distinct values counted at a bound raced on the values found (stop 72)",
               query("SELECT COUNT(DISTINCT fare) FROM trips WHERE fare > 2", rows_per_unit="auto"), 0),
    QueryClass("a rollup's total labelled by COALESCE of its left-out key (stop 72)",
               query("SELECT COALESCE(kind, 'all') AS k, COUNT(*) FROM trips GROUP BY ROLLUP (kind)"), 1),
    QueryClass("a count of distinct values asked apart from the other aggregates, over their released keys "
               "(stop 73)", query("SELECT kind, COUNT(*), COUNT(DISTINCT fare) FROM trips GROUP BY kind",
                                  rows_per_unit="auto"), 1),
    QueryClass("a count of distinct values asked apart from an ungrouped sum, the answers joined (stop 73)",
               query("SELECT SUM(fare), COUNT(DISTINCT fare) FROM trips", rows_per_unit="auto"), 0),
    QueryClass("declared values present asked apart from a count, over its released keys (stop 73)",
               query("SELECT fare > 10 AS high, COUNT(*), COUNT(DISTINCT kind) FROM trips GROUP BY 1",
                     rows_per_unit="auto"), 1),
    QueryClass("a count of distinct units of an outer join's NULL-filled side: the units it matched (stop 74)",
               query("SELECT p.state, COUNT(DISTINCT t.person_id) FROM people p LEFT JOIN trips t ON "
                     "t.person_id = p.person_id AND t.fare > 20 GROUP BY 1"), 1),
    QueryClass("a person's groups by kind, at most as many as the kinds declared (stop 74)",
               query("SELECT n, COUNT(*) FROM (SELECT person_id, kind, COUNT(*) AS n FROM trips GROUP BY 1, 2) t "
                     "GROUP BY 1"), 1),
    QueryClass("a list of keys LEFT JOINed to a grouped query to fill its gaps, the neighbour's own line listed "
               "(stop 75)",
               query("SELECT c.k, COALESCE(t.n, 0) AS n FROM (VALUES ('l0'), ('x')) c(k) LEFT JOIN (SELECT line AS k, "
                     "COUNT(*) AS n FROM rides GROUP BY 1) t ON t.k = c.k"), 1),
    QueryClass("bins of trunc(fare, -1), a CASE of ceil and floor whose keys are its branches' (stop 75)",
               query("SELECT trunc(fare, -1) AS tens, COUNT(*) FROM trips GROUP BY 1"), 1),
    # the neighbour's rows are stored first, so every other row sits elsewhere: with a known seed PostgreSQL's
    # coins (a hash of the seed and where a row is stored) would sample other rows on each side; over the secret
    # seed each query draws, the other rows' sample has one law on both
    QueryClass("a row sample (TABLESAMPLE BERNOULLI under a secret seed, every other row stored elsewhere)",
               query("SELECT kind, COUNT(*), SUM(fare) FROM trips TABLESAMPLE BERNOULLI (50) GROUP BY kind"), 1),
]
