"""The data owner's commands over the ledger: budgets, analysts, the report, export, backup and restore."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dpsql.accounting.budget import describe_budget
from dpsql.cli.common import ledger_of, settings_of
from dpsql.output import budget_rows, render_rows


def budget(args: argparse.Namespace) -> int:
    from dpsql.schema import load_schema
    settings = settings_of(args)
    with ledger_of(settings) as ledger:
        group_size = args.group_size or (load_schema(settings.schema).group_size if settings.schema else 1)
        if not settings.analyst:  # the data owner's view of the ledger, as `dpsql analyst list` shows it
            _print_budgets(ledger.analysts(), args.format)
            return 0
        budget = ledger.budget(settings.analyst)
        print(render_rows(*budget_rows([budget], settings.epsilon, group_size), args.format))
        if args.format == "table":
            print(describe_budget(budget, settings.epsilon, group_size))
    return 0


def _print_budgets(budgets, fmt: str) -> None:
    print(render_rows(*budget_rows(budgets), fmt))


def ledger_report(args: argparse.Namespace) -> int:
    import json

    from dpsql.report import ledger_report, render_html
    with ledger_of(settings_of(args)) as ledger:
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


def analyst_add(args: argparse.Namespace) -> int:
    with ledger_of(settings_of(args)) as ledger:
        _print_budgets([ledger.add_analyst(args.name, args.epsilon, args.delta, by=_who())], args.format)
    return 0


def analyst_grant(args: argparse.Namespace) -> int:
    with ledger_of(settings_of(args)) as ledger:
        _print_budgets([ledger.grant(args.name, args.epsilon, args.delta, by=_who())], args.format)
    return 0


def analyst_set(args: argparse.Namespace) -> int:
    with ledger_of(settings_of(args)) as ledger:
        _print_budgets([ledger.set_budget(args.name, args.epsilon, args.delta, by=_who())], args.format)
    return 0


def _who() -> str:
    """Who changes a budget, for the ledger's history: the operating-system user running the command."""
    import getpass
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def analyst_list(args: argparse.Namespace) -> int:
    with ledger_of(settings_of(args)) as ledger:
        _print_budgets(ledger.analysts(), args.format)
    return 0


def analyst_remove(args: argparse.Namespace) -> int:
    with ledger_of(settings_of(args)) as ledger:
        ledger.remove(args.name, by=_who())
    print(f"removed analyst {args.name}: no more logins or queries; its charges stay in the ledger "
          "(`dpsql ledger export`)")
    return 0


def ledger_export(args: argparse.Namespace) -> int:
    from dpsql.accounting.archive import export
    with ledger_of(settings_of(args)) as ledger:
        text = export(ledger, args.format)
    if args.out is None:
        print(text, end="")
    else:
        Path(args.out).write_text(text, encoding="utf-8")
        print(f"wrote {text.count(chr(10)) - (args.format == 'csv')} records to {args.out}")
    return 0


def ledger_backup(args: argparse.Namespace) -> int:
    from dpsql.accounting.archive import BACKUP_WARNING, backup
    with ledger_of(settings_of(args)) as ledger:
        counts = backup(ledger, args.file)
    print(f"wrote the ledger to {args.file} ({_counted(counts)}), readable by you only: {BACKUP_WARNING}")
    return 0


def ledger_restore(args: argparse.Namespace) -> int:
    from dpsql.accounting.archive import restore
    with ledger_of(settings_of(args)) as ledger:
        counts = restore(ledger, args.file)
    print(f"restored the ledger from {args.file} ({_counted(counts)})")
    return 0


def _counted(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {table.replace('_', ' ')}" for table, n in counts.items())


def analyst_passwd(args: argparse.Namespace) -> int:
    from dpsql.server.auth import md5_verifier, scram_verifier
    password = _read_new_password(args.name)
    verifier = md5_verifier(args.name, password) if args.md5 else scram_verifier(password)
    with ledger_of(settings_of(args)) as ledger:
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
