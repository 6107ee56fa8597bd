"""The `dpsql` command line: query, explain, budget, analyst, schema check, demo."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

from dpsql.accounting.budget import describe_budget
from dpsql.config import Settings, load_settings
from dpsql.errors import BackendUnavailable, BudgetExhausted, ConfigError, Error, SchemaError, UnknownAnalyst
from dpsql.output import FORMATS, budget_rows, cost_line, render_answer, render_rows
from dpsql.schema import MECHANISMS
from dpsql.session import HISTOGRAMS, ROWS_PER_UNIT, Options

DEMO_ANALYST = "demo"


# Exit codes, documented in the README: a script can tell what went wrong without reading stderr.
EXIT_OK, EXIT_FAILED, EXIT_CONNECTION, EXIT_BUDGET, EXIT_CONFIG = 0, 1, 2, 3, 4
EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 64, 70, 130


def exit_code(error: Error) -> int:
    """The exit code of a dpsql error: connection (like psql), budget, configuration, else a failed query."""
    if isinstance(error, BackendUnavailable):
        return EXIT_CONNECTION
    if isinstance(error, BudgetExhausted):
        return EXIT_BUDGET
    if isinstance(error, ConfigError | SchemaError | UnknownAnalyst):
        return EXIT_CONFIG
    return EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        getattr(args, "usage_of", parser).print_help(sys.stderr)
        return EXIT_USAGE
    if args.run is not _serve:  # the command reports its own errors; libraries' warnings would repeat them
        logging.basicConfig(stream=sys.stderr, level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.run(args) or EXIT_OK
    except Error as exc:
        print(f"error: {exc.message} [{exc.code}]", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return exit_code(exc)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:  # a dpsql bug: one line, and the traceback when asked for
        if os.environ.get("DPSQL_DEBUG"):
            traceback.print_exc()
        print(f"error: internal error in dpsql: {type(exc).__name__}: {exc}", file=sys.stderr)
        print("hint: this is a dpsql bug; run again with DPSQL_DEBUG=1 for the traceback and please report it",
              file=sys.stderr)
        return EXIT_INTERNAL


class _Parser(argparse.ArgumentParser):
    """argparse, exiting with EXIT_USAGE on a bad command line (its own 2 is psql's code for no connection)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument("--database", help="postgresql:// URL, or spark://local[N] or sc://HOST:PORT for Apache "
                                           "Spark (or DPSQL_DATABASE)")
    common.add_argument("--ledger", help="postgresql:// URL of the ledger when it is not the database (required for "
                                         "Spark; or DPSQL_LEDGER)")
    common.add_argument("--schema", help="privacy schema TOML file (or DPSQL_SCHEMA)")
    common.add_argument("--analyst", help="whose budget to spend (or DPSQL_ANALYST)")
    common.add_argument("--config", help="config file with a [dpsql] table (or DPSQL_CONFIG, ./dpsql.toml)")

    printing = _Parser(add_help=False)
    printing.add_argument("--format", choices=FORMATS, default="table",
                          help="table (psql-like, the default), csv or json (for scripts: costs go to stderr)")

    parser = _Parser(prog="dpsql", description="Differentially private SQL for PostgreSQL.",
                     epilog="exit codes: 0 ok, 1 query refused or failed, 2 cannot connect, 3 budget exhausted, "
                            "4 configuration, 64 bad command line, 70 internal error")
    parser.add_argument("--version", action="version", version=f"dpsql {_version()}")
    sub = parser.add_subparsers(metavar="COMMAND")

    options = _Parser(add_help=False)
    options.add_argument("sql")
    options.add_argument("--epsilon", type=float, help="ε for this query (default from config: 1.0)")
    options.add_argument("--mechanism", choices=MECHANISMS, help="noise on counts and sums (default: the schema's)")
    options.add_argument("--histogram", choices=HISTOGRAMS, help="release of ordered bins (default: plain)")
    options.add_argument("--bounds-epsilon", type=float, metavar="EPSILON",
                         help="also estimate, at this ε more, how many units the declared bounds cut or clamp")
    options.add_argument("--rows-per-unit", choices=ROWS_PER_UNIT,
                         help="auto: choose each query's rows per unit from the data (R2T), below the declared bound")

    query = sub.add_parser("query", parents=[common, options, printing],
                           help="answer a SQL query with noise, spending budget")
    query.add_argument("--precision", choices=("noise", "full"), default="noise",
                       help="a table shows noisy numbers to the digits their 95%% interval allows (noise, the "
                            "default) or in full; csv and json always carry full precision")
    query.set_defaults(run=_query)

    explain = sub.add_parser("explain", parents=[common, options],
                             help="show sensitivity, cost and rewritten SQL; runs nothing")
    explain.set_defaults(run=_explain)

    budget = sub.add_parser("budget", parents=[common, printing],
                            help="the analyst's budget: spent and left (without --analyst: every analyst's)")
    budget.add_argument("--group-size", type=int, help="also the guarantee for groups of this many units "
                                                       "(default: the privacy schema's group_size)")
    budget.set_defaults(run=_budget)

    ingest = sub.add_parser("ingest", parents=[common],
                            help="load a CSV or Parquet file of locally randomized reports into a declared table")
    ingest.add_argument("table", help="a table of the privacy schema (created with its declared columns if missing)")
    ingest.add_argument("file", help="CSV with a header line naming the columns, or .parquet")
    ingest.set_defaults(run=_ingest)

    releasing = _Parser(add_help=False)  # what every release takes: its ε and a picture
    releasing.add_argument("--epsilon", type=float, required=True, help="ε of the whole release, charged once")
    releasing.add_argument("--plot", metavar="FILE", help="also draw it (PNG or SVG, matplotlib)")

    density = sub.add_parser("density", parents=[common, releasing],
                             help="a DP kernel density estimate of a bounded column (Gaussian-process mechanism)")
    density.add_argument("column", help="TABLE.COLUMN, a numeric column with declared bounds")
    density.add_argument("--delta", type=float, required=True, help="the δ of the (ε, δ) charged (e.g. 1e-6)")
    density.add_argument("--bandwidth", type=float, help="the kernel's h (default: 1/20 of the declared range)")
    density.add_argument("--points", type=int, default=64, help="grid points the density is released on")
    density.add_argument("--format", choices=("table", "json"), default="table")
    density.set_defaults(run=_density)

    tree = sub.add_parser("tree", parents=[common, releasing],
                          help="a DP decision tree classifier (exponential mechanism)")
    tree.add_argument("table")
    tree.add_argument("--label", required=True, help="the column to predict (declared domain or boolean)")
    tree.add_argument("--features", required=True, help="comma-separated columns with domains or numeric bounds")
    tree.add_argument("--depth", type=int, default=3)
    tree.add_argument("--bins", type=int, default=4, help="equal cells of each numeric feature's range")
    tree.add_argument("--format", choices=("text", "json"), default="text")
    tree.set_defaults(run=_tree)

    synth = sub.add_parser("synth", parents=[common, releasing],
                           help="a DP synthetic version of a table (the noisy full table or MWEM)")
    synth.add_argument("table")
    synth.add_argument("--columns", required=True, help="comma-separated columns with domains or numeric bounds")
    synth.add_argument("--rounds", type=int, help="MWEM rounds (default: twice the columns, at most the "
                                                 "1- and 2-way marginals)")
    synth.add_argument("--bins", type=int, default=4, help="equal cells of each numeric column's range")
    synth.add_argument("--method", choices=("auto", "mwem", "perturb"), default="auto",
                       help="perturb: the noisy full table; mwem; auto: the one expected to answer 2-way marginals "
                            "better (from declared sizes only)")
    synth.add_argument("--out", required=True, help="a table to create in the database, or FILE.csv")
    synth.add_argument("--replace", action="store_true", help="replace the --out table if it exists")
    synth.add_argument("--format", choices=("table", "json"), default="table")
    synth.set_defaults(run=_synth)

    schema = sub.add_parser("schema", help="privacy schema tools")
    schema.set_defaults(usage_of=schema)
    schema_sub = schema.add_subparsers(metavar="ACTION")
    check = schema_sub.add_parser("check", help="validate a privacy schema file (and, with --database, check it "
                                  "against the database's catalog and data)")
    check.add_argument("file")
    check.add_argument("--database", help="postgresql:// URL: check tables, columns, types and foreign keys, then "
                                          "show (to you, the owner) data outside the declared domains and bounds")
    check.set_defaults(run=_schema_check)
    draft = schema_sub.add_parser("draft", help="print a privacy schema drafted from a database's catalog")
    draft.add_argument("database", metavar="URL", help="postgresql:// URL of the database to describe")
    draft.add_argument("--unit", metavar="TABLE.KEY", help="the privacy unit's key (default: the key that most "
                                                           "tables reach through foreign keys)")
    draft.set_defaults(run=_schema_draft)

    analyst = sub.add_parser("analyst", help="manage analysts and their budgets")
    analyst.set_defaults(usage_of=analyst)
    analyst_sub = analyst.add_subparsers(metavar="ACTION")
    add = analyst_sub.add_parser("add", parents=[common, printing], help="create an analyst with a budget")
    add.add_argument("name")
    add.add_argument("--epsilon", type=float, required=True)
    add.add_argument("--delta", type=float, default=1e-5)
    add.set_defaults(run=_analyst_add)
    grant = analyst_sub.add_parser("grant", parents=[common, printing], help="top up an analyst's budget")
    grant.add_argument("name")
    grant.add_argument("--epsilon", type=float, required=True)
    grant.add_argument("--delta", type=float, default=0.0)
    grant.set_defaults(run=_analyst_grant)
    setting = analyst_sub.add_parser("set", parents=[common, printing],
                                     help="set an analyst's budget (raise or lower; never below what is spent)")
    setting.add_argument("name")
    setting.add_argument("--epsilon", type=float, required=True)
    setting.add_argument("--delta", type=float, help="the δ total (default: unchanged)")
    setting.set_defaults(run=_analyst_set)
    listing = analyst_sub.add_parser("list", parents=[common, printing], help="list analysts and budgets")
    listing.set_defaults(run=_analyst_list)
    remove = analyst_sub.add_parser("remove", parents=[common],
                                    help="disable an analyst (no more logins or queries; its charges stay)")
    remove.add_argument("name")
    remove.set_defaults(run=_analyst_remove)
    passwd = analyst_sub.add_parser("passwd", parents=[common],
                                    help="set an analyst's password for `dpsql serve` (prompted, or one line on stdin)")
    passwd.add_argument("name")
    passwd.add_argument("--md5", action="store_true", help="store an md5 verifier (for clients without SCRAM)")
    passwd.set_defaults(run=_analyst_passwd)

    ledger = sub.add_parser("ledger", help="the privacy ledger")
    ledger.set_defaults(usage_of=ledger)
    ledger_sub = ledger.add_subparsers(metavar="ACTION")
    report = ledger_sub.add_parser("report", parents=[common], help="what each analyst spent, when, on which "
                                   "queries, and what is left: an HTML page with plots, or JSON")
    report.add_argument("--format", choices=("html", "json"), default="html")
    report.add_argument("--out", help="file to write (default: dpsql-ledger-report.html; JSON goes to stdout)")
    report.set_defaults(run=_ledger_report)
    export = ledger_sub.add_parser("export", parents=[common], help="every charge and budget change (removed "
                                   "analysts' too), oldest first, as JSON lines or CSV")
    export.add_argument("--format", choices=("jsonl", "csv"), default="jsonl")
    export.add_argument("--out", help="file to write (default: stdout)")
    export.set_defaults(run=_ledger_export)
    backup = ledger_sub.add_parser("backup", parents=[common], help="write the whole ledger to FILE (owner-only: "
                                   "it holds the secret keyed-hash seed)")
    backup.add_argument("file")
    backup.set_defaults(run=_ledger_backup)
    restore = ledger_sub.add_parser("restore", parents=[common], help="restore a backup into an empty ledger")
    restore.add_argument("file")
    restore.set_defaults(run=_ledger_restore)

    serve = sub.add_parser("serve", parents=[common], help="serve the PostgreSQL wire protocol on a TCP port")
    serve.add_argument("--backend", help="postgresql:// URL of the database, or spark://local[N] / sc://HOST:PORT "
                                         "with --ledger postgresql://... (same as --database)")
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
    demo.add_argument("--stop", metavar="DIR", help="stop the embedded PostgreSQL that `--keep` left running in DIR")
    demo.add_argument("--backend", choices=("postgresql", "spark"), default="postgresql",
                      help="spark: answer from Parquet copies on a local Spark session (pip install 'dpsql[spark]', "
                           "Java 17); the ledger stays in the embedded PostgreSQL")
    demo.set_defaults(run=_demo)
    return parser


def _settings(args: argparse.Namespace, **extra: Any) -> Settings:
    return load_settings(args.config, database=args.database, schema=args.schema, analyst=args.analyst,
                         ledger=getattr(args, "ledger", None), **extra)


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
        answer = engine.query(args.sql, analyst=analyst, options=_query_options(args))
    finally:
        engine.close()
    print(render_answer(answer, args.format, args.precision))
    if args.format != "table":
        print(cost_line(answer), file=sys.stderr)
    return 0


def _query_options(args: argparse.Namespace) -> Options:
    return Options(bounds_epsilon=args.bounds_epsilon, rows_per_unit=args.rows_per_unit)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("dpsql")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _explain(args: argparse.Namespace) -> int:
    from dpsql.explain import explain_statement
    settings = _settings(args, epsilon=args.epsilon, mechanism=args.mechanism, histogram=args.histogram)
    engine = _engine(settings)
    try:
        print(explain_statement(*engine.prepare_parts(args.sql, options=_query_options(args))))
    finally:
        engine.close()
    return 0


def _release(args: argparse.Namespace, make) -> dict:
    """Run a release (density, tree) for the configured analyst, closing the engine after."""
    settings = _settings(args)
    analyst = _require_analyst(settings)
    engine = _engine(settings)
    try:
        return make(engine, analyst)
    finally:
        engine.close()


def _density(args: argparse.Namespace) -> int:
    import json

    from dpsql.releases import density, plot_density
    table, _, column = args.column.partition(".")
    if not column:
        _parser().error("density takes TABLE.COLUMN")
    output = _release(args, lambda engine, analyst: density(engine, analyst, table, column, args.epsilon, args.delta,
                                                            args.bandwidth, args.points))
    if args.plot:
        plot_density(output, args.plot)
    if args.format == "json":
        print(json.dumps(output, indent=1))
        return 0
    rows = [(round(x, 6), round(y, 8), round(lo, 8), round(hi, 8)) for x, y, lo, hi in
            zip(output["points"], output["density"], output["low"], output["high"], strict=True)]
    print(render_rows([args.column, "density", "ci_low", "ci_high"], rows, "table"))
    print(f"pointwise 95% band ±{output['halfwidth']:.4g}; no (ε, δ) mechanism could promise under "
          f"±{output['lower_bound']:.4g} at one point ({output['halfwidth'] / output['lower_bound']:.2g}×)")
    print(_spent(output))
    return 0


def _tree(args: argparse.Namespace) -> int:
    import json

    from dpsql.releases import decision_tree, plot_tree
    from dpsql.releases.tree import render_tree
    features = args.features.split(",")
    output = _release(args, lambda engine, analyst: decision_tree(engine, analyst, args.table, args.label, features,
                                                                  args.epsilon, args.depth, args.bins))
    if args.plot:
        plot_tree(output, args.plot)
    print(json.dumps(output, indent=1) if args.format == "json" else render_tree(output))
    if args.format != "json":
        print(_spent(output))
    return 0


def _synth(args: argparse.Namespace) -> int:
    import json

    from dpsql.releases.synth import plot_marginals, publish, synthesize
    output = _release(args, lambda engine, analyst: synthesize(engine, analyst, args.table, args.columns.split(","),
                                                               args.epsilon, args.rounds, args.bins, args.method))
    declaration = publish(output, _settings(args).database, args.out, args.replace)
    if args.plot:
        plot_marginals(output, args.plot)
    if args.format == "json":
        print(json.dumps(output, indent=1))
        return 0
    how = (f"MWEM, {output['rounds']} rounds; measured: {'; '.join(' × '.join(m) for m in output['measured'])}"
           if output["method"] == "mwem" else "the noisy full table, projected onto counts")
    print(f"{output['rows']} synthetic rows of {', '.join(output['columns'])} written to {args.out} ({how})")
    if declaration:
        print("Declare it in the privacy schema as released data; dpsql then answers its queries exactly, free:")
        print(declaration)
    print(_spent(output))
    return 0


def _spent(output: dict) -> str:
    if output["cached"]:
        return "released before: the same output again, at no cost"
    return f"spent ε = {output['epsilon_spent']:g}, δ = {output.get('delta_spent', 0.0):g} (the whole release)"


def _ingest(args: argparse.Namespace) -> int:
    from dpsql.demo import progress_bar
    from dpsql.ingest import ingest
    from dpsql.schema import load_schema
    settings = _settings(args)
    if not settings.database or not settings.schema:
        raise ConfigError("ingest needs a database and a privacy schema", "pass --database URL and --schema FILE")
    loaded = ingest(settings.database, load_schema(settings.schema), args.table, args.file,
                    progress_bar if sys.stderr.isatty() else None)
    print(f"loaded {loaded} rows into {args.table.lower()}; every local column's values were checked as reports")
    return 0


def _budget(args: argparse.Namespace) -> int:
    from dpsql.schema import load_schema
    settings = _settings(args)
    with _ledger(settings) as ledger:
        group_size = args.group_size or (load_schema(settings.schema).group_size if settings.schema else 1)
        if not settings.analyst:  # the data owner's view of the ledger, as `dpsql analyst list` shows it
            _print_budgets(ledger.analysts(), args.format)
            return 0
        budget = ledger.budget(settings.analyst)
        print(render_rows(*budget_rows([budget], settings.epsilon, group_size), args.format))
        if args.format == "table":
            print(describe_budget(budget, settings.epsilon, group_size))
    return 0


@contextlib.contextmanager
def _ledger(settings: Settings):
    from dpsql.accounting import Ledger
    from dpsql.errors import ConfigError
    if not (settings.ledger or settings.database):
        raise ConfigError("no database given", "pass --database URL or set DPSQL_DATABASE")
    ledger = Ledger(settings.ledger or settings.database)
    try:
        yield ledger
    finally:
        ledger.close()


def _print_budgets(budgets, fmt: str) -> None:
    print(render_rows(*budget_rows(budgets), fmt))


def _ledger_report(args: argparse.Namespace) -> int:
    import json

    from dpsql.report import ledger_report, render_html
    with _ledger(_settings(args)) as ledger:
        report = ledger_report(ledger, args.analyst)
    if args.format == "json":
        text = json.dumps(report, indent=1, ensure_ascii=False, default=str)
        if args.out is None:
            print(text)
            return 0
    else:
        from dpsql.report import PLOTS_NEED, can_plot
        text = render_html(report)
        if not can_plot():
            print(f"note: the report has no plots; {PLOTS_NEED}", file=sys.stderr)
    out = args.out or "dpsql-ledger-report.html"
    with open(out, "w", encoding="utf-8") as file:
        file.write(text)
    print(f"wrote {out}: {len(report['analysts'])} analyst(s), "
          f"{sum(len(a['charges']) for a in report['analysts'])} charge(s)")
    return 0


def _analyst_add(args: argparse.Namespace) -> int:
    with _ledger(_settings(args)) as ledger:
        _print_budgets([ledger.add_analyst(args.name, args.epsilon, args.delta, by=_who())], args.format)
    return 0


def _analyst_grant(args: argparse.Namespace) -> int:
    with _ledger(_settings(args)) as ledger:
        _print_budgets([ledger.grant(args.name, args.epsilon, args.delta, by=_who())], args.format)
    return 0


def _analyst_set(args: argparse.Namespace) -> int:
    with _ledger(_settings(args)) as ledger:
        _print_budgets([ledger.set_budget(args.name, args.epsilon, args.delta, by=_who())], args.format)
    return 0


def _who() -> str:
    """Who changes a budget, for the ledger's history: the operating-system user running the command."""
    import getpass
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _analyst_list(args: argparse.Namespace) -> int:
    with _ledger(_settings(args)) as ledger:
        _print_budgets(ledger.analysts(), args.format)
    return 0


def _analyst_remove(args: argparse.Namespace) -> int:
    with _ledger(_settings(args)) as ledger:
        ledger.remove(args.name, by=_who())
    print(f"removed analyst {args.name}: no more logins or queries; its charges stay in the ledger "
          "(`dpsql ledger export`)")
    return 0


def _ledger_export(args: argparse.Namespace) -> int:
    from dpsql.accounting.archive import export
    with _ledger(_settings(args)) as ledger:
        text = export(ledger, args.format)
    if args.out is None:
        print(text, end="")
    else:
        Path(args.out).write_text(text, encoding="utf-8")
        print(f"wrote {text.count(chr(10)) - (args.format == 'csv')} records to {args.out}")
    return 0


def _ledger_backup(args: argparse.Namespace) -> int:
    from dpsql.accounting.archive import BACKUP_WARNING, backup
    with _ledger(_settings(args)) as ledger:
        counts = backup(ledger, args.file)
    print(f"wrote the ledger to {args.file} ({_counted(counts)}), readable by you only: {BACKUP_WARNING}")
    return 0


def _ledger_restore(args: argparse.Namespace) -> int:
    from dpsql.accounting.archive import restore
    with _ledger(_settings(args)) as ledger:
        counts = restore(ledger, args.file)
    print(f"restored the ledger from {args.file} ({_counted(counts)})")
    return 0


def _counted(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {table.replace('_', ' ')}" for table, n in counts.items())


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
        rows = f"{table.max_rows_per_unit} row{'s' * (table.max_rows_per_unit != 1)}"
        kind = "public" if table.public else f"private, at most {rows} per unit"
        if table.parent is not None:
            kind += f", reaching the unit through {table.parent}"
        print(f"  {table.name} ({kind})")
        for column in table.columns.values():
            facts = [column.type]
            if column.bounded:
                facts.append(column.describe_bounds())
            if column.domain:
                facts.append(f"domain of {len(column.domain)} values")
            if column.unique:
                facts.append("unique")
            if column.max_frequency:
                facts.append(f"max frequency {column.max_frequency}")
            print(f"    {column.name}: {', '.join(facts)}")
    if args.database:
        _check_against_database(schema, args.database)
    return 0


def _check_against_database(schema, url: str) -> None:
    """The schema against the catalog (SchemaError on a mismatch), then the owner's view of the data."""
    import psycopg

    from dpsql.backends import PostgresBackend
    from dpsql.owner import data_report
    from dpsql.schema.catalog import require_catalog
    backend = PostgresBackend(url, max_connections=1)
    try:
        require_catalog(schema, backend.catalog())
    finally:
        backend.close()
    print(f"{url}: every declared table and column exists with a compatible type, and every private table reaches "
          "the unit through a foreign key.")
    with psycopg.connect(url) as conn:
        conn.read_only = True
        found = data_report(conn, schema)
    print("The data against the schema (exact counts read with your access, for you only: not a release):")
    for line in found or ["every value is inside its domain and bounds, and no unit is above its table's cap"]:
        print(f"  - {line}")


def _schema_draft(args: argparse.Namespace) -> int:
    import psycopg

    from dpsql.backends import PostgresBackend
    from dpsql.owner import draft
    backend = PostgresBackend(args.database, max_connections=1)
    try:
        catalog = backend.catalog()
    finally:
        backend.close()
    with psycopg.connect(args.database) as conn:
        conn.read_only = True
        print(draft(conn, catalog, args.unit), end="")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from importlib.resources import files

    from dpsql.demo import DEMO_QUERIES, load_demo_data, progress_bar
    from dpsql.embedded import EmbeddedPostgres
    from dpsql.engine import Engine

    if args.stop:
        EmbeddedPostgres.stop_kept(args.stop)
        print(f"stopped the embedded PostgreSQL in {args.stop} (its files stay; delete the directory to remove them)")
        return 0
    schema_path = str(files("dpsql") / "schemas" / "demo.toml")
    server = EmbeddedPostgres(args.data_dir, keep=args.keep)
    print("Starting an embedded PostgreSQL ...", file=sys.stderr)
    url = server.start()
    try:
        started = time.monotonic()
        counts = load_demo_data(url, people=args.people, progress=progress_bar)
        print(f"Loaded {counts['people']:,} people, {counts['visits']:,} visits, {counts['prescriptions']:,} "
              f"prescriptions and {counts['states']} states in {time.monotonic() - started:.1f} s.\n")
        settings = load_settings(None, database=url, schema=schema_path)
        if args.backend == "spark":
            settings = _spark_demo_settings(url, schema_path, Path(server.data_dir))
        engine = Engine(settings)
        try:
            with contextlib.suppress(Error):  # the analyst may remain from an earlier run with --keep
                engine.ledger.add_analyst(DEMO_ANALYST, 10.0, 1e-4)
            for title, sql in DEMO_QUERIES:
                print(f"-- {title}\n{sql}")
                try:
                    print(render_answer(engine.query(sql, analyst=DEMO_ANALYST, epsilon=0.5), "table"))
                except Error as exc:
                    if args.backend != "spark":
                        raise
                    print(f"not on Spark: {exc}")  # e.g. a parent link, whose key Spark cannot verify
                print()
        finally:
            engine.close()
        if args.serve:
            _demo_serve(url, schema_path, args.listen, args.keep)
        elif args.keep:
            print("Connect from Python (a PEP 249 module):\n")
            print("    import dpsql")
            print(f'    conn = dpsql.connect(database="{url}",\n'
                  f'                         schema="{schema_path}", analyst="{DEMO_ANALYST}")')
            print('    cur = conn.cursor(); cur.execute("SELECT AVG(age) FROM people"); print(cur.fetchall())')
        else:
            print("The embedded PostgreSQL stops now. To query the demo data yourself, run `dpsql demo --serve` "
                  "(psql, BI tools) or `dpsql demo --keep` (Python).")
        if args.keep:
            print(f"\nThe embedded PostgreSQL keeps running with its data in {server.data_dir}.\n"
                  f"Stop it with:  dpsql demo --stop {server.data_dir}")
    finally:
        server.stop()
    return 0


def _spark_demo_settings(url: str, schema_path: str, data_dir: Path) -> Settings:
    """The demo's tables as Parquet beside the embedded PostgreSQL's files, and a schema that points at them."""
    from dpsql.demo import export_parquet, spark_schema_text

    print("Writing the demo tables as Parquet for Spark ...", file=sys.stderr)
    paths = export_parquet(url, data_dir / "parquet")
    schema = data_dir / "demo_spark.toml"
    schema.write_text(spark_schema_text(Path(schema_path).read_text(encoding="utf-8"), paths), encoding="utf-8")
    print("Starting a local Spark session ...", file=sys.stderr)
    return load_settings(None, database="spark://local[2]", ledger=url, schema=str(schema))


def _demo_serve(url: str, schema_path: str, listen: str, keep: bool) -> None:
    """`dpsql demo --serve`: give the demo analyst a password and serve the demo database until Ctrl-C."""
    import secrets

    from dpsql.server import serve
    from dpsql.server.auth import scram_verifier
    password = secrets.token_urlsafe(9)
    host = listen.rpartition(":")[0] or "127.0.0.1"
    settings = load_settings(None, database=url, schema=schema_path, metrics_listen=f"{host}:0")
    with _ledger(settings) as ledger:
        ledger.set_verifier(DEMO_ANALYST, scram_verifier(password))

    def ready(server) -> None:
        print(f"dpsql serve is listening on {server.listen.host}:{server.port}. Connect with:\n\n"
              f'    psql "postgresql://{DEMO_ANALYST}:{password}@{server.listen.host}:{server.port}/demo"\n\n'
              "and try:  SELECT sex, COUNT(*), AVG(income) FROM people GROUP BY sex;\n"
              "          SET dpsql.epsilon = 0.1;  SHOW dpsql.budget;\n"
              f"Prometheus metrics: http://{server.listen.host}:{server.metrics_port}/metrics\n"
              "Press Ctrl-C to stop the server" + ("." if keep else " and the embedded PostgreSQL."), flush=True)

    serve(settings, listen, ready)


if __name__ == "__main__":
    sys.exit(main())
