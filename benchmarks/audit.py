"""The statistical auditor's long run: every query class of tests/auditor.py, many fresh answers on a database and
on its neighbour, and the ε each must at least spend (a 95% lower bound) beside the ε it claims.

    python benchmarks/audit.py --draws 1000

Prints the table and writes it to benchmarks/results/audit.md; exits 1 if any class spends more than it claims.
`--wire` also runs the numeric-key class through `dpsql serve`'s port (psycopg, one login per draw). CI runs the
fast classes with 80 draws (tests/test_privacy_round3.py).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.auditor lives with the tests

from dpsql.config import Settings  # noqa: E402
from dpsql.embedded import EmbeddedPostgres  # noqa: E402
from dpsql.engine import Engine  # noqa: E402
from dpsql.schema import load_schema  # noqa: E402
from tests import auditor  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "audit.md"


def run_wire(urls: dict[str, str], schema: str, draws: int) -> auditor.Audit:
    with auditor.served(urls, schema) as (engines, ports):
        door = auditor.wire_door(engines, ports, "SELECT balance, COUNT(*) FROM people GROUP BY balance")
        return auditor.audit("numeric key spelled by one row, wire port", door, draws, keys=1, claimed_epsilon=1.0,
                             claimed_delta=auditor.DELTA)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=1000, help="answers per database and class")
    parser.add_argument("--wire", action="store_true", help="also audit through the wire port")
    parser.add_argument("--only", help="run the classes whose name contains this")
    args = parser.parse_args()
    server = EmbeddedPostgres()
    server.start()
    rows, started = [], time.perf_counter()
    try:
        urls = auditor.build_world(server.url, lambda db: server.url.replace("/postgres?", f"/{db}?"))
        schema = str(auditor.write_schema(Path(tempfile.mkdtemp(prefix="dpsql-audit-"))))
        engines = {side: Engine(Settings(database=url), load_schema(schema)) for side, url in urls.items()}
        try:
            for query_class in auditor.QUERY_CLASSES:
                if args.only and args.only not in query_class.name:
                    continue
                began = time.perf_counter()
                result = auditor.audit(query_class.name, auditor.engine_door(engines, query_class.ask), args.draws,
                                       keys=query_class.keys, claimed_epsilon=query_class.epsilon,
                                       claimed_delta=query_class.delta)
                rows.append(result)
                print(f"{result.row()}  ({time.perf_counter() - began:.0f} s)", file=sys.stderr)
        finally:
            for engine in engines.values():
                engine.close()
        if args.wire:
            rows.append(run_wire(urls, schema, args.draws))
            print(rows[-1].row(), file=sys.stderr)
    finally:
        server.stop()
    table = "\n".join([auditor.HEADER, *(r.row() for r in rows)])
    text = (f"# Statistical audit of what leaves the door\n\n`python benchmarks/audit.py --draws {args.draws}"
            f"{' --wire' if args.wire else ''}`: {args.draws} fresh answers per database (the auditor's base of "
            f"{auditor.PEOPLE} people and its neighbour with one more, spelled otherwise), in "
            f"{time.perf_counter() - started:.0f} s. Half the draws choose the event, half measure it; the bound is "
            "ln((p_D(S) − δ)/p_D'(S)) with one-sided Clopper-Pearson ends, at 95% over both directions.\n\n"
            f"{table}\n")
    print(text)
    if not args.only:
        RESULTS.write_text(text)
    return 1 if any(r.violated for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
