"""The golden corpus: every query the tests and the README send, with what dpsql makes of it.

Each entry holds a query's inputs (SQL, parameters, privacy schema, the catalog's unique columns, the
groups-per-unit setting) and the outputs of the stages that decide privacy: the checked query's canonical
form, the plan (units, group bounds, measures with their ranges and sensitivities, histograms, notes), the
rewritten SQL and the calibrated mechanisms with their costs, or the error the query gets. `test_golden.py`
replays every entry and requires the outputs to stay byte-identical: a refactor of the analysis or the
rewrite that changes any of them changes behaviour, and must say so by re-recording.

The corpus is text a reviewer can read, like sqlglot's optimizer fixtures: `tests/golden/<construct>.sql`, one
file per construct (joins, windows, quantiles, refusals, ...), one block per query: the query, then what a
reviewer looks at (its sensitivities, its rewrite, its error), then the full plan and mechanisms as JSON lines
that keep the comparison exact. `tests/golden/schemas.json` holds the privacy schemas the entries name.

Re-record (after a deliberate change, and review the diff of the files):

    python -m tests.golden            # runs the test suite once to collect the queries, then replays them
    python -m tests.golden --refresh  # answers the stored queries anew (after a deliberate change of outputs)

Collecting works by wrapping `check_query` and `analyze` for one pytest run (DPSQL_GOLDEN_RECORD names a
file the wrappers append to); nothing is wrapped in ordinary runs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from sqlglot import exp

ROOT = Path(__file__).resolve().parent.parent
CORPUS = Path(__file__).resolve().parent / "golden"  # <construct>.sql files and schemas.json
RECORD_ENV = "DPSQL_GOLDEN_RECORD"
HASH_SEED = 20261123
EPSILON, DELTA, SELECTION_SHARE = 1.0, 1e-6, 0.5
FUZZ_QUERIES = 1000  # per fuzz world, beyond what the tests send


# --- schemas as JSON (a tagged form of the model's dataclasses, so `replace`d schemas round-trip too) -----------


def encode_schema(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        fields = {f.name: encode_schema(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"$dataclass": type(value).__name__, **fields}
    if isinstance(value, tuple):
        return {"$tuple": [encode_schema(v) for v in value]}
    if isinstance(value, dict):
        return {"$dict": [[k, encode_schema(v)] for k, v in value.items()]}
    if isinstance(value, list):
        return [encode_schema(v) for v in value]
    return value


def decode_schema(value: Any) -> Any:
    import dpsql.schema.model as model

    if isinstance(value, list):
        return [decode_schema(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "$tuple" in value:
        return tuple(decode_schema(v) for v in value["$tuple"])
    if "$dict" in value:
        return {k: decode_schema(v) for k, v in value["$dict"]}
    fields = {k: decode_schema(v) for k, v in value.items() if k != "$dataclass"}
    return getattr(model, value["$dataclass"])(**fields)


def encode_params(params: Any) -> Any:
    """Parameters as JSON, or raise TypeError for values JSON cannot hold exactly."""
    if params is None or isinstance(params, str | int | float | bool):
        return params
    if isinstance(params, list | tuple):
        return {"$list": [encode_params(p) for p in params]}
    if isinstance(params, dict):
        return {"$map": {str(k): encode_params(v) for k, v in params.items()}}
    raise TypeError(type(params).__name__)


def decode_params(value: Any) -> Any:
    if isinstance(value, dict) and "$list" in value:
        return [decode_params(v) for v in value["$list"]]
    if isinstance(value, dict) and "$map" in value:
        return {k: decode_params(v) for k, v in value["$map"].items()}
    return value


# --- replay: one entry's outputs ----------------------------------------------------------------------------------


UNSET_OMITTED = ("caveat",)  # plan fields added after most entries were recorded: written only where set


def plain(value: Any) -> Any:
    """A stage's result as JSON: dataclasses field by field, SQL trees as their SQL, floats by repr."""
    if isinstance(value, exp.Expression):
        return value.sql(dialect="postgres")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = [plain(v) for v in value]
        return sorted(items, key=repr) if isinstance(value, set | frozenset) else items
    if isinstance(value, float):
        return repr(value)
    if value is None or isinstance(value, str | int | bool):
        return value
    return repr(value)


_DECODED: dict[int, tuple[Any, Any]] = {}  # id of an encoded schema -> (it, its schema): the corpus has 24


def _decoded(encoded: Any) -> Any:
    """The schema `encoded` stands for, decoded once per encoded object (as a server loads its schema once)."""
    if id(encoded) not in _DECODED:
        _DECODED[id(encoded)] = encoded, decode_schema(encoded)
    return _DECODED[id(encoded)][1]


def replay(entry: dict) -> dict:
    """What the stages make of one entry's query, or the error they raise."""
    from dpsql.analysis import analyze
    from dpsql.noise import calibrate
    from dpsql.rewrite import rewrite
    from dpsql.sql import check_query

    schema = _decoded(entry["schema"])
    out: dict[str, Any] = {}
    try:
        query = check_query(entry["sql"], schema, decode_params(entry["params"]))
        out["canonical"] = query.canonical
        out["output_names"] = list(query.output_names)
        unique = frozenset(tuple(pair) for pair in entry["unique"])
        not_null = frozenset(tuple(pair) for pair in entry.get("not_null", []))
        plan = analyze(query, schema, unique, entry["max_groups"], not_null=not_null)
        out["plan"] = {k: v for k, v in plain(plan).items() if not (k in UNSET_OMITTED and v is None)}
        rewritten = rewrite(plan, HASH_SEED)
        out["sql"], out["histograms"] = rewritten.sql, rewritten.histograms
        for mechanism in ("laplace", "gaussian"):
            out[mechanism] = plain(calibrate(plan, EPSILON, DELTA, SELECTION_SHARE, mechanism, "plain"))
    except Exception as error:  # every error is behaviour to keep
        out["error"] = f"{type(error).__name__}: {error}"
    return out


# --- collecting the queries of one test run ------------------------------------------------------------------------


def install_recorder(path: str) -> None:
    """Wrap check_query and analyze (in every module that imported them) so that each query checked and each
    analysis run appends its inputs to `path`. Called from conftest before the test modules are imported."""
    import dpsql.analysis
    import dpsql.engine
    import dpsql.sql

    checked: dict[int, tuple] = {}
    original_check, original_analyze = dpsql.sql.check_query, dpsql.analysis.analyze

    def write(record: dict) -> None:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(record, sort_keys=True) + "\n")

    def check_query(sql, schema, params=None):
        try:
            encoded = encode_params(params)
        except TypeError:
            return original_check(sql, schema, params)
        record = {"sql": sql, "params": encoded, "schema": encode_schema(schema), "unique": [], "max_groups": None}
        try:
            query = original_check(sql, schema, params)
        except Exception:
            write(record)
            raise
        if query.fresh:  # now() or current_date was read, or a sample's seed drawn: a replay would differ
            return query
        checked[id(query)] = (query, record)  # the query object is kept, so its id stays its own
        return query

    def analyze(query, schema, unique_columns, max_groups=None, min_frequency=1, not_null=frozenset(), *later,
                **named):
        # (the engine's later arguments, a bound chosen by the race, the time zone, composite keys, are not
        # recorded: the corpus replays each query's analysis at its declared bounds)
        found = checked.get(id(query))
        if found is not None and min_frequency == 1:  # the corpus replays analyses without a minimum frequency
            write({**found[1], "schema": encode_schema(schema), "unique": sorted(map(list, unique_columns)),
                   "max_groups": max_groups, **({"not_null": sorted(map(list, not_null))} if not_null else {})})
        return original_analyze(query, schema, unique_columns, max_groups, min_frequency, not_null, *later, **named)

    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith(("dpsql", "tests")):
            if getattr(module, "check_query", None) is original_check:
                module.check_query = check_query
            if getattr(module, "analyze", None) is original_analyze:
                module.analyze = analyze


def readme_queries() -> list[str]:
    """The SELECT statements the README shows, as written there."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.findall(r'"(SELECT [^"]+)"', text) + re.findall(r"=> (SELECT [^;]+);", text)
    return list(dict.fromkeys(q.replace("%s", "18") for q in found))


def record() -> list[dict]:
    """Run the test suite once with the recorder, add the README's queries, and return the distinct inputs."""
    with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as handle:
        path = handle.name
    env = {**os.environ, RECORD_ENV: path}
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                    "--deselect", "tests/test_golden.py"], cwd=ROOT, env=env, check=True)
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    os.unlink(path)
    records = [json.loads(line) for line in lines]
    from dpsql.schema import load_schema
    from tests.conftest import DEMO_SCHEMA

    demo = encode_schema(load_schema(DEMO_SCHEMA))
    demo_unique = next((r["unique"] for r in records if r["schema"] == demo and r["unique"]), [])
    records += [{"sql": sql, "params": None, "schema": demo, "unique": demo_unique, "max_groups": None}
                for sql in readme_queries()]
    records += fuzz_queries(records)
    distinct: dict[str, dict] = {}
    for item in records:
        distinct.setdefault(json.dumps(item, sort_keys=True), item)
    return list(distinct.values())


def fuzz_queries(records: list[dict], per_world: int = FUZZ_QUERIES) -> list[dict]:
    """More queries from the neighbour fuzzer's grammar, on each fuzz world's schema (with the unique columns its
    database reported in the test run)."""
    import random

    from dpsql.schema import parse_schema
    from tests.fuzzing import WORLDS

    found = []
    for world in WORLDS.values():
        schema = encode_schema(parse_schema(world.schema))
        unique = next(r["unique"] for r in records if r["schema"] == schema and r["unique"])
        rng = random.Random(f"golden {len(found)}")
        found += [{"sql": world.generate(rng), "params": None, "schema": schema, "unique": unique,
                   "max_groups": None} for _ in range(per_world)]
    return found


# --- the corpus as text: one file per construct, one block per query ---------------------------------------------

INPUTS = ("sql", "params", "schema", "unique", "not_null", "max_groups")
CONSTRUCTS = (  # (file, test): the first that holds names an entry's file
    ("refused", lambda sql, out: "error" in out),
    ("windows", lambda sql, out: " OVER (" in sql),
    ("quantiles", lambda sql, out: any(f in sql for f in ("PERCENTILE", "MIN(", "MAX(", "MODE("))),
    ("row_level", lambda sql, out: out["plan"]["stability"] is not None),
    ("joins", lambda sql, out: bool(out["plan"]["joins"])),
    ("semijoins", lambda sql, out: "(SELECT" in (out["plan"]["where"] or "")),
    ("derived_tables", lambda sql, out: "(SELECT" in out["plan"]["from_"]),
    ("dates", lambda sql, out: any(f in sql for f in ("DATE_TRUNC", "EXTRACT", "TO_CHAR", "DATE", "TIMESTAMP"))),
    ("top_k", lambda sql, out: out["plan"]["top_k"] is not None or out["plan"]["limit"] is not None),
    ("having", lambda sql, out: out["plan"]["having"] is not None),
    ("grouped", lambda sql, out: bool(out["plan"]["group_keys"])),
    ("ungrouped", lambda sql, out: True),
)


def construct(entry: dict) -> str:
    """The file an entry belongs in, from what its query is made of."""
    out = entry["expected"]
    sql = (out.get("canonical") or entry["sql"]).upper()
    return next(name for name, test in CONSTRUCTS if test(sql, out))


def block(entry: dict) -> str:
    """One entry as text: the query, what a reviewer reads, then the outputs kept exact (JSON, one line each)."""
    out = entry["expected"]
    lines = [f"-- {' '.join(entry['sql'].split())}",
             "input: " + json.dumps({k: entry[k] for k in INPUTS if k in entry}, sort_keys=True)]
    if "error" in out:
        lines.append("error: " + json.dumps(out["error"]))
    if out.get("plan"):
        lines += [f"sensitivity {m['name']} {m['label']}: L1 {m['sensitivity']}, L2 {m['l2_sensitivity']}, per unit "
                  f"[{m['unit_range'][0]}, {m['unit_range'][1]}]" for m in out["plan"]["measures"]]
        lines += [f"sensitivity {h['name']} {h['label']}: {h['sensitivity']}" for h in out["plan"]["histograms"]]
    if out.get("sql") is not None:
        lines += ["rewrite:", f"  {out['sql']}"]
        lines += [f"histogram {name}:\n  {sql}" for name, sql in sorted(out.get("histograms", {}).items())]
    lines += [f"{key}: {json.dumps(out[key], sort_keys=True)}" for key in sorted(out)
              if key not in ("error", "sql", "histograms")]
    return "\n".join(lines)


def load() -> dict:
    """The corpus: its schemas, and its entries with their expected outputs read back from the text."""
    schemas = json.loads((CORPUS / "schemas.json").read_text(encoding="utf-8"))
    entries = []
    for path in sorted(CORPUS.glob("*.sql")):
        for text in path.read_text(encoding="utf-8").strip().split("\n\n"):
            entries.append({**_inputs(text), "text": text, "file": path.stem})
    return {"schemas": schemas, "entries": entries}


def _inputs(text: str) -> dict:
    line = next(line for line in text.split("\n") if line.startswith("input: "))
    return json.loads(line[len("input: "):])


def save(schemas: dict, entries: list[dict]) -> None:
    """Write the corpus as text (entries with their expected outputs), one file per construct, in a stable order."""
    CORPUS.mkdir(exist_ok=True)
    for old in CORPUS.glob("*.sql"):
        old.unlink()
    (CORPUS / "schemas.json").write_text(json.dumps(schemas, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    files: dict[str, list[str]] = {}
    for entry in entries:
        files.setdefault(construct(entry), []).append(block(entry))
    for name, blocks in files.items():
        (CORPUS / f"{name}.sql").write_text("\n\n".join(blocks) + "\n", encoding="utf-8")


def main() -> None:
    if "--refresh" in sys.argv:  # the same inputs, answered anew: after a deliberate change of the outputs only
        corpus = load()
        by_name, entries = corpus["schemas"], [{k: e[k] for k in INPUTS if k in e} for e in corpus["entries"]]
    else:
        by_name, entries = _collect(record())
    for entry in entries:
        entry["expected"] = replay({**entry, "schema": by_name[entry["schema"]]})
    save(by_name, entries)
    errors = sum("error" in e["expected"] for e in entries)
    print(f"{len(entries)} queries ({errors} refused) over {len(by_name)} schemas -> {CORPUS.relative_to(ROOT)}/")


def _collect(inputs: list[dict]) -> tuple[dict[str, Any], list[dict]]:
    """The recorded inputs with their schemas named s0, s1, ..., in a stable order."""
    schemas: dict[str, Any] = {}
    entries = []
    for item in inputs:
        key = json.dumps(item["schema"], sort_keys=True)
        name = schemas.setdefault(key, f"s{len(schemas)}")
        entries.append({**item, "schema": name})
    entries.sort(key=lambda e: (e["schema"], e["sql"], json.dumps(e, sort_keys=True)))
    return {name: json.loads(key) for key, name in schemas.items()}, entries


if __name__ == "__main__":
    main()
