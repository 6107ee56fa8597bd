"""The `dpsql` command line: query, explain, budget, analyst, schema check, demo."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from dpsql.config import Settings, load_settings
from dpsql.errors import Error
from dpsql.postprocess import INTERVALS_COVER, describe_accuracy, format_value
from dpsql.schema import MECHANISMS
from dpsql.session import HISTOGRAMS

DEMO_ANALYST = "demo"


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return args.run(args) or 0
    except Error as exc:
        print(f"error: {exc.message} [{exc.code}]", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--database", help="postgresql:// URL (or DPSQL_DATABASE)")
    common.add_argument("--schema", help="privacy schema TOML file (or DPSQL_SCHEMA)")
    common.add_argument("--analyst", help="whose budget to spend (or DPSQL_ANALYST)")
    common.add_argument("--config", help="config file with a [dpsql] table (or DPSQL_CONFIG, ./dpsql.toml)")

    parser = argparse.ArgumentParser(prog="dpsql", description="Differentially private SQL for PostgreSQL.")
    sub = parser.add_subparsers(metavar="COMMAND")

    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("sql")
    options.add_argument("--epsilon", type=float, help="ε for this query (default from config: 1.0)")
    options.add_argument("--mechanism", choices=MECHANISMS, help="noise on counts and sums (default: the schema's)")
    options.add_argument("--histogram", choices=HISTOGRAMS, help="release of ordered bins (default: plain)")

    query = sub.add_parser("query", parents=[common, options], help="answer a SQL query with noise, spending budget")
    query.set_defaults(run=_query)

    explain = sub.add_parser("explain", parents=[common, options],
                             help="show sensitivity, cost and rewritten SQL; runs nothing")
    explain.set_defaults(run=_explain)

    budget = sub.add_parser("budget", parents=[common], help="the analyst's budget: spent and left")
    budget.set_defaults(run=_budget)

    schema = sub.add_parser("schema", help="privacy schema tools")
    schema_sub = schema.add_subparsers(metavar="ACTION")
    check = schema_sub.add_parser("check", help="validate a privacy schema file")
    check.add_argument("file")
    check.set_defaults(run=_schema_check)

    analyst = sub.add_parser("analyst", help="manage analysts and their budgets")
    analyst_sub = analyst.add_subparsers(metavar="ACTION")
    add = analyst_sub.add_parser("add", parents=[common], help="create an analyst with a budget")
    add.add_argument("name")
    add.add_argument("--epsilon", type=float, required=True)
    add.add_argument("--delta", type=float, default=1e-5)
    add.set_defaults(run=_analyst_add)
    grant = analyst_sub.add_parser("grant", parents=[common], help="top up an analyst's budget")
    grant.add_argument("name")
    grant.add_argument("--epsilon", type=float, required=True)
    grant.add_argument("--delta", type=float, default=0.0)
    grant.set_defaults(run=_analyst_grant)
    listing = analyst_sub.add_parser("list", parents=[common], help="list analysts and budgets")
    listing.set_defaults(run=_analyst_list)
    remove = analyst_sub.add_parser("remove", parents=[common], help="remove an analyst")
    remove.add_argument("name")
    remove.set_defaults(run=_analyst_remove)
    passwd = analyst_sub.add_parser("passwd", parents=[common],
                                    help="set an analyst's password for `dpsql serve` (prompted, or one line on stdin)")
    passwd.add_argument("name")
    passwd.add_argument("--md5", action="store_true", help="store an md5 verifier (for clients without SCRAM)")
    passwd.set_defaults(run=_analyst_passwd)

    serve = sub.add_parser("serve", parents=[common], help="serve the PostgreSQL wire protocol on a TCP port")
    serve.add_argument("--backend", help="postgresql:// URL of the database (same as --database)")
    serve.add_argument("--listen", help="HOST:PORT to listen on (default 127.0.0.1:6543)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                       help="dpsql's log on stderr: logins, failed logins, failed statements and answers at info "
                            "(never query text or values); default info")
    serve.set_defaults(run=_serve)

    demo = sub.add_parser("demo", help="start an embedded PostgreSQL, load demo data, run DP queries")
    demo.add_argument("--people", type=int, default=100_000, help="people to generate (default 100000)")
    demo.add_argument("--keep", action="store_true", help="leave the embedded PostgreSQL running afterwards")
    demo.add_argument("--data-dir", help="where the embedded PostgreSQL keeps its files")
    demo.add_argument("--serve", action="store_true", help="then run `dpsql serve` on it until Ctrl-C")
    demo.add_argument("--listen", default="127.0.0.1:6543", help="HOST:PORT for --serve (default 127.0.0.1:6543)")
    demo.set_defaults(run=_demo)
    return parser


def _settings(args: argparse.Namespace, **extra: Any) -> Settings:
    return load_settings(args.config, database=args.database, schema=args.schema, analyst=args.analyst, **extra)


def _engine(settings: Settings):
    from dpsql.engine import Engine
    return Engine(settings)


def _require_analyst(settings: Settings) -> str:
    if not settings.analyst:
        from dpsql.errors import ConfigError
        raise ConfigError("no analyst given", "pass --analyst NAME or set DPSQL_ANALYST")
    return settings.analyst


def _query(args: argparse.Namespace) -> int:
    settings = _settings(args, epsilon=args.epsilon, mechanism=args.mechanism, histogram=args.histogram)
    analyst = _require_analyst(settings)
    engine = _engine(settings)
    try:
        answer = engine.query(args.sql, analyst=analyst)
    finally:
        engine.close()
    print(format_answer(answer))
    return 0


def format_answer(answer) -> str:
    """The rows as a psql-style table, each noisy column followed by its 95% interval, then the cost."""
    noisy = [any(row[i] is not None for row in answer.accuracy) for i in range(len(answer.names))]
    headers, cells = [], [[] for _ in answer.rows]
    for i, name in enumerate(answer.names):
        headers.append(name)
        for r, row in enumerate(answer.rows):
            cells[r].append(format_value(row[i]))
        if noisy[i]:
            headers.append("95% CI")
            for r, row in enumerate(answer.accuracy):
                acc = row[i]
                cells[r].append(describe_accuracy(acc))
    widths = [max([len(h), *(len(c[i]) for c in cells)]) for i, h in enumerate(headers)]
    lines = [" | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)),
             "-+-".join("-" * w for w in widths)]
    lines += [" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.append(f"({len(answer.rows)} row{'s' if len(answer.rows) != 1 else ''})")
    if any(noisy):
        lines.append(f"95% CI: {INTERVALS_COVER}")
    if answer.cached:
        lines.append("cached answer: no budget spent")
    else:
        lines.append(f"spent ε = {answer.epsilon:.4g}, δ = {answer.delta:.3g}")
    if answer.budget is not None:
        lines.append(f"budget left: ε = {answer.budget.epsilon_left:.4g}, δ = {answer.budget.delta_left:.3g}")
    return "\n".join(lines)


def _explain(args: argparse.Namespace) -> int:
    from dpsql.explain import explain_text
    settings = _settings(args, epsilon=args.epsilon, mechanism=args.mechanism, histogram=args.histogram)
    engine = _engine(settings)
    try:
        print(explain_text(engine.prepare(args.sql)))
    finally:
        engine.close()
    return 0


def _budget(args: argparse.Namespace) -> int:
    settings = _settings(args)
    analyst = _require_analyst(settings)
    with _ledger(settings) as ledger:
        _print_budgets([ledger.budget(analyst)])
    return 0


@contextlib.contextmanager
def _ledger(settings: Settings):
    from dpsql.accounting import Ledger
    from dpsql.errors import ConfigError
    if not settings.database:
        raise ConfigError("no database given", "pass --database URL or set DPSQL_DATABASE")
    ledger = Ledger(settings.database)
    try:
        yield ledger
    finally:
        ledger.close()


def _print_budgets(budgets) -> None:
    print(f"{'analyst':<16} {'ε total':>10} {'ε spent':>10} {'ε left':>10} {'δ total':>10} {'δ spent':>10} "
          f"{'ρ (zCDP)':>10}  account")
    for b in budgets:
        print(f"{b.analyst:<16} {b.epsilon_total:>10.4g} {b.epsilon_spent:>10.4g} {b.epsilon_left:>10.4g} "
              f"{b.delta_total:>10.3g} {b.delta_spent:>10.3g} {b.rho:>10.4g}  "
              f"{'zCDP' if b.zcdp_is_better else 'basic'}")


def _analyst_add(args: argparse.Namespace) -> int:
    with _ledger(_settings(args)) as ledger:
        _print_budgets([ledger.add_analyst(args.name, args.epsilon, args.delta)])
    return 0


def _analyst_grant(args: argparse.Namespace) -> int:
    with _ledger(_settings(args)) as ledger:
        _print_budgets([ledger.grant(args.name, args.epsilon, args.delta)])
    return 0


def _analyst_list(args: argparse.Namespace) -> int:
    with _ledger(_settings(args)) as ledger:
        _print_budgets(ledger.analysts())
    return 0


def _analyst_remove(args: argparse.Namespace) -> int:
    with _ledger(_settings(args)) as ledger:
        ledger.remove(args.name)
    print(f"removed analyst {args.name}")
    return 0


def _analyst_passwd(args: argparse.Namespace) -> int:
    from dpsql.server.auth import md5_verifier, scram_verifier
    password = _read_new_password(args.name)
    verifier = md5_verifier(args.name, password) if args.md5 else scram_verifier(password)
    with _ledger(_settings(args)) as ledger:
        ledger.set_verifier(args.name, verifier)
    print(f"password of analyst {args.name} set ({'md5' if args.md5 else 'SCRAM-SHA-256'} verifier stored)")
    return 0


def _read_new_password(name: str) -> str:
    """A new password from the terminal (asked twice), or the first line of stdin when it is not a terminal."""
    import getpass

    from dpsql.errors import InvalidParameter
    if sys.stdin.isatty():
        password = getpass.getpass(f"New password for {name}: ")
        if getpass.getpass("Again: ") != password:
            raise InvalidParameter("the passwords do not match")
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        raise InvalidParameter("empty password", "type a password, or pipe one line into the command")
    return password


def _serve(args: argparse.Namespace) -> int:
    import logging

    from dpsql.server import serve
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("dpsql").setLevel(args.log_level.upper())
    settings = _settings(args)
    if args.backend:
        settings = replace(settings, database=args.backend)

    def ready(server) -> None:
        print(f"dpsql serve: listening on {server.listen.host}:{server.port} "
              f"(auth {server.auth_method}{', TLS' if server.tls else ''})", file=sys.stderr, flush=True)

    serve(settings, args.listen, ready)
    return 0


def _schema_check(args: argparse.Namespace) -> int:
    from dpsql.schema import load_schema
    schema = load_schema(args.file)
    print(f"{args.file}: valid. Privacy unit: {schema.describe_unit()} ({schema.neighbouring} neighbours), "
          f"at most {schema.max_groups_per_unit} groups per unit.")
    for table in schema.tables.values():
        kind = "public" if table.public else f"private, at most {table.max_rows_per_unit} rows per unit"
        if table.parent is not None:
            kind += f", reaching the unit through {table.parent}"
        print(f"  {table.name} ({kind})")
        for column in table.columns.values():
            facts = [column.type]
            if column.bounded:
                facts.append(f"[{column.lower:g}, {column.upper:g}]")
            if column.domain:
                facts.append(f"domain of {len(column.domain)} values")
            if column.unique:
                facts.append("unique")
            if column.max_frequency:
                facts.append(f"max frequency {column.max_frequency}")
            print(f"    {column.name}: {', '.join(facts)}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from importlib.resources import files

    from dpsql.demo import DEMO_QUERIES, load_demo_data, progress_bar
    from dpsql.embedded import EmbeddedPostgres
    from dpsql.engine import Engine

    schema_path = str(files("dpsql") / "schemas" / "demo.toml")
    server = EmbeddedPostgres(args.data_dir, keep=args.keep)
    print("Starting an embedded PostgreSQL ...", file=sys.stderr)
    url = server.start()
    try:
        started = time.monotonic()
        counts = load_demo_data(url, people=args.people, progress=progress_bar)
        print(f"Loaded {counts['people']:,} people and {counts['visits']:,} visits in "
              f"{time.monotonic() - started:.1f} s.\n")
        engine = Engine(load_settings(None, database=url, schema=schema_path))
        try:
            with contextlib.suppress(Error):  # the analyst may remain from an earlier run with --keep
                engine.ledger.add_analyst(DEMO_ANALYST, 10.0, 1e-4)
            for title, sql in DEMO_QUERIES:
                print(f"-- {title}\n{sql}")
                print(format_answer(engine.query(sql, analyst=DEMO_ANALYST, epsilon=0.5)))
                print()
        finally:
            engine.close()
        if args.serve:
            return _demo_serve(url, schema_path, args.listen)
        print("Connect from Python (a PEP 249 module):\n")
        print("    import dpsql")
        print(f'    conn = dpsql.connect(database="{url}",\n'
              f'                         schema="{schema_path}", analyst="{DEMO_ANALYST}")')
        print('    cur = conn.cursor(); cur.execute("SELECT AVG(age) FROM people"); print(cur.fetchall())')
        if args.keep:
            print(f"\nThe embedded PostgreSQL keeps running with its data in {server.data_dir}.")
        else:
            print("\n(The embedded PostgreSQL stops now; run `dpsql demo --keep` to keep it running.)")
    finally:
        server.stop()
    return 0


def _demo_serve(url: str, schema_path: str, listen: str) -> int:
    """`dpsql demo --serve`: give the demo analyst a password and serve the demo database until Ctrl-C."""
    import secrets

    from dpsql.server import serve
    from dpsql.server.auth import scram_verifier
    password = secrets.token_urlsafe(9)
    settings = load_settings(None, database=url, schema=schema_path)
    with _ledger(settings) as ledger:
        ledger.set_verifier(DEMO_ANALYST, scram_verifier(password))

    def ready(server) -> None:
        print(f"dpsql serve is listening on {server.listen.host}:{server.port}. Connect with:\n\n"
              f'    psql "postgresql://{DEMO_ANALYST}:{password}@{server.listen.host}:{server.port}/demo"\n\n'
              "and try:  SELECT sex, COUNT(*), AVG(income) FROM people GROUP BY sex;\n"
              "          SET dpsql.epsilon = 0.1;  SHOW dpsql.budget;\n"
              "Press Ctrl-C to stop the server and the embedded PostgreSQL.", flush=True)

    serve(settings, listen, ready)
    return 0


if __name__ == "__main__":
    sys.exit(main())
