"""The `dpsql` command line: its parser and exit codes; the commands are in this package's modules (`queries`,
`admin`, `owner`, `demo`; `common` for what they share)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from dpsql.cli import admin, owner, queries
from dpsql.cli import demo as demos
from dpsql.cli.common import (
    EXIT_BUDGET,
    EXIT_CONFIG,
    EXIT_CONNECTION,
    EXIT_FAILED,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    version,
)
from dpsql.errors import BackendUnavailable, BudgetExhausted, ConfigError, Error, SchemaError, UnknownAnalyst
from dpsql.output import FORMATS
from dpsql.schema import MECHANISMS
from dpsql.session import HISTOGRAMS, ROWS_PER_UNIT


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
    if args.run is not queries.serve:  # the command reports its own errors; libraries' warnings would repeat them
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
    parser.add_argument("--version", action="version", version=f"dpsql {version()}")
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
    query.set_defaults(run=queries.query)

    explain = sub.add_parser("explain", parents=[common, options],
                             help="show sensitivity, cost and rewritten SQL; runs nothing")
    explain.set_defaults(run=queries.explain)

    budget = sub.add_parser("budget", parents=[common, printing],
                            help="the analyst's budget: spent and left (without --analyst: every analyst's)")
    budget.add_argument("--group-size", type=int, help="also the guarantee for groups of this many units "
                                                       "(default: the privacy schema's group_size)")
    budget.set_defaults(run=admin.budget)

    ingest = sub.add_parser("ingest", parents=[common],
                            help="load a CSV or Parquet file of locally randomized reports into a declared table")
    ingest.add_argument("table", help="a table of the privacy schema (created with its declared columns if missing)")
    ingest.add_argument("file", help="CSV with a header line naming the columns, or .parquet")
    ingest.set_defaults(run=queries.ingest)

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
    density.set_defaults(run=queries.density)

    tree = sub.add_parser("tree", parents=[common, releasing],
                          help="a DP decision tree classifier (exponential mechanism)")
    tree.add_argument("table")
    tree.add_argument("--label", required=True, help="the column to predict (declared domain or boolean)")
    tree.add_argument("--features", required=True, help="comma-separated columns with domains or numeric bounds")
    tree.add_argument("--depth", type=int, default=3)
    tree.add_argument("--bins", type=int, default=4, help="equal cells of each numeric feature's range")
    tree.add_argument("--format", choices=("text", "json"), default="text")
    tree.set_defaults(run=queries.tree)

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
    synth.set_defaults(run=queries.synth)

    schema = sub.add_parser("schema", help="privacy schema tools")
    schema.set_defaults(usage_of=schema)
    schema_sub = schema.add_subparsers(metavar="ACTION")
    check = schema_sub.add_parser("check", help="validate a privacy schema file (and, with --database, check it "
                                  "against the database's catalog and data)")
    check.add_argument("file")
    check.add_argument("--database", help="postgresql:// URL: check tables, columns, types and foreign keys, then "
                                          "show (to you, the owner) data outside the declared domains and bounds")
    check.set_defaults(run=owner.schema_check)
    draft = schema_sub.add_parser("draft", help="print a privacy schema drafted from a database's catalog")
    draft.add_argument("database", metavar="URL", help="postgresql:// URL of the database to describe")
    draft.add_argument("--unit", metavar="TABLE.KEY", help="the privacy unit's key (default: the key that most "
                                                           "tables reach through foreign keys)")
    draft.set_defaults(run=owner.schema_draft)

    analyst = sub.add_parser("analyst", help="manage analysts and their budgets")
    analyst.set_defaults(usage_of=analyst)
    analyst_sub = analyst.add_subparsers(metavar="ACTION")
    add = analyst_sub.add_parser("add", parents=[common, printing], help="create an analyst with a budget")
    add.add_argument("name")
    add.add_argument("--epsilon", type=float, required=True)
    add.add_argument("--delta", type=float, default=1e-5)
    add.set_defaults(run=admin.analyst_add)
    grant = analyst_sub.add_parser("grant", parents=[common, printing], help="top up an analyst's budget")
    grant.add_argument("name")
    grant.add_argument("--epsilon", type=float, required=True)
    grant.add_argument("--delta", type=float, default=0.0)
    grant.set_defaults(run=admin.analyst_grant)
    setting = analyst_sub.add_parser("set", parents=[common, printing],
                                     help="set an analyst's budget (raise or lower; never below what is spent)")
    setting.add_argument("name")
    setting.add_argument("--epsilon", type=float, required=True)
    setting.add_argument("--delta", type=float, help="the δ total (default: unchanged)")
    setting.set_defaults(run=admin.analyst_set)
    listing = analyst_sub.add_parser("list", parents=[common, printing], help="list analysts and budgets")
    listing.set_defaults(run=admin.analyst_list)
    remove = analyst_sub.add_parser("remove", parents=[common],
                                    help="disable an analyst (no more logins or queries; its charges stay)")
    remove.add_argument("name")
    remove.set_defaults(run=admin.analyst_remove)
    passwd = analyst_sub.add_parser("passwd", parents=[common],
                                    help="set an analyst's password for `dpsql serve` (prompted, or one line on stdin)")
    passwd.add_argument("name")
    passwd.add_argument("--md5", action="store_true", help="store an md5 verifier (for clients without SCRAM)")
    passwd.set_defaults(run=admin.analyst_passwd)

    ledger = sub.add_parser("ledger", help="the privacy ledger")
    ledger.set_defaults(usage_of=ledger)
    ledger_sub = ledger.add_subparsers(metavar="ACTION")
    report = ledger_sub.add_parser("report", parents=[common], help="what each analyst spent, when, on which "
                                   "queries, and what is left: an HTML page with plots, or JSON")
    report.add_argument("--format", choices=("html", "json"), default="html")
    report.add_argument("--out", help="file to write (default: dpsql-ledger-report.html; JSON goes to stdout)")
    report.set_defaults(run=admin.ledger_report)
    export = ledger_sub.add_parser("export", parents=[common], help="every charge and budget change (removed "
                                   "analysts' too), oldest first, as JSON lines or CSV")
    export.add_argument("--format", choices=("jsonl", "csv"), default="jsonl")
    export.add_argument("--out", help="file to write (default: stdout)")
    export.set_defaults(run=admin.ledger_export)
    backup = ledger_sub.add_parser("backup", parents=[common], help="write the whole ledger to FILE (owner-only: "
                                   "it holds the secret keyed-hash seed)")
    backup.add_argument("file")
    backup.set_defaults(run=admin.ledger_backup)
    restore = ledger_sub.add_parser("restore", parents=[common], help="restore a backup into an empty ledger")
    restore.add_argument("file")
    restore.set_defaults(run=admin.ledger_restore)

    serve = sub.add_parser("serve", parents=[common], help="serve the PostgreSQL wire protocol on a TCP port")
    serve.add_argument("--backend", help="postgresql:// URL of the database, or spark://local[N] / sc://HOST:PORT "
                                         "with --ledger postgresql://... (same as --database)")
    serve.add_argument("--listen", help="HOST:PORT to listen on (default 127.0.0.1:6543)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                       help="dpsql's log on stderr: logins, failed logins, failed statements and answers at info "
                            "(never query text or values); default info")
    serve.set_defaults(run=queries.serve)

    demo = sub.add_parser("demo", help="start an embedded PostgreSQL, load demo data, run DP queries")
    demo.add_argument("--people", type=int, default=100_000, help="people to generate (default 100000)")
    demo.add_argument("--keep", action="store_true", help="leave the embedded PostgreSQL running afterwards")
    demo.add_argument("--data-dir", help="where the embedded PostgreSQL keeps its files")
    demo.add_argument("--serve", action="store_true", help="then run `dpsql serve` on it until Ctrl-C")
    demo.add_argument("--listen", default="127.0.0.1:6543", help="HOST:PORT for --serve (default 127.0.0.1:6543)")
    demo.add_argument("--stop", metavar="DIR", help="stop the embedded PostgreSQL that `--keep` left running in DIR")
    demo.add_argument("--backend", choices=("postgresql", "spark", "duckdb"), default="postgresql",
                      help="spark: answer from Parquet copies on a local Spark session (pip install 'dpsql[spark]', "
                           "Java 17); duckdb: from a DuckDB file with the demo's keys (pip install 'dpsql[duckdb]'); "
                           "the ledger stays in the embedded PostgreSQL")
    demo.set_defaults(run=demos.demo)
    return parser
