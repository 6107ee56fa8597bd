"""What every command shares: its settings, the engine, the analyst, the ledger, the version, the exit codes."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any, NoReturn

from dpsql.config import Settings, load_settings
from dpsql.errors import ConfigError

DEMO_ANALYST = "demo"

# Exit codes, documented in the README: a script can tell what went wrong without reading stderr.
EXIT_OK, EXIT_FAILED, EXIT_CONNECTION, EXIT_BUDGET, EXIT_CONFIG = 0, 1, 2, 3, 4
EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 64, 70, 130


def settings_of(args: argparse.Namespace, **extra: Any) -> Settings:
    return load_settings(args.config, database=args.database, schema=args.schema, analyst=args.analyst,
                         ledger=getattr(args, "ledger", None), **extra)


def engine_of(settings: Settings):
    from dpsql.engine import Engine
    return Engine(settings)


def require_analyst(settings: Settings) -> str:
    if not settings.analyst:
        from dpsql.errors import ConfigError
        raise ConfigError("no analyst given", "pass --analyst NAME or set DPSQL_ANALYST")
    return settings.analyst


@contextlib.contextmanager
def ledger_of(settings: Settings):
    from dpsql.accounting import Ledger
    if not (settings.ledger or settings.database):
        raise ConfigError("no database given", "pass --database URL or set DPSQL_DATABASE")
    ledger = Ledger(settings.ledger or settings.database)
    try:
        yield ledger
    finally:
        ledger.close()


def version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("dpsql")
    except PackageNotFoundError:
        return "unknown (not installed)"


def usage_error(message: str) -> NoReturn:
    """A bad command line, said as argparse says it, with EXIT_USAGE."""
    print(f"dpsql: error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)
