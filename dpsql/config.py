"""dpsql settings: explicit arguments, then environment variables, then a config file, then defaults.

The config file is TOML with a [dpsql] table (keys as in `Settings`); it is read from --config, from
$DPSQL_CONFIG, or from ./dpsql.toml. Environment variables: DPSQL_DATABASE, DPSQL_SCHEMA, DPSQL_ANALYST,
DPSQL_EPSILON.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from dpsql.errors import ConfigError

ENVIRONMENT = {"database": "DPSQL_DATABASE", "schema": "DPSQL_SCHEMA", "analyst": "DPSQL_ANALYST",
               "epsilon": "DPSQL_EPSILON", "ledger": "DPSQL_LEDGER"}


@dataclass(frozen=True)
class Settings:
    database: str | None = None  # postgresql:// URL of the database holding the private data, or spark://local[N]
    #                               or sc://host:port for Apache Spark
    ledger: str | None = None  # postgresql:// URL of the ledger (budgets, charges, answers); default: database
    schema: str | None = None  # path of the privacy schema (TOML)
    analyst: str | None = None  # whose budget queries spend
    epsilon: float = 1.0  # ε of one query unless the session or the query says otherwise
    mechanism: str | None = None  # laplace | gaussian; None: as the privacy schema says
    histogram: str | None = None  # plain | noisefirst | structurefirst, for histograms over ordered buckets
    max_epsilon: float = 10.0  # no single query may ask for more
    delta: float = 1e-6  # δ of one query that needs DP partition selection
    # part of a query's ε spent on partition selection, when it needs it; None: an equal share beside each
    # statistic the query releases, from a half (one statistic) down to a quarter (three or more)
    selection_share: float | None = None
    statement_timeout_ms: int = 30_000
    connect_timeout_s: float = 10.0  # wait for a working PostgreSQL connection this long, then fail (08006, no charge)
    max_groups_per_unit: int | None = None  # overrides the schema's bound when set
    latency_floor_ms: int = 0  # a fresh answer (or its failure) is returned no sooner than this after the query
    #                            arrived, so that its timing says less about the data (0: off)
    # `dpsql serve`
    listen: str = "127.0.0.1:6543"  # HOST:PORT of the wire-protocol port
    auth: str = "scram-sha-256"  # scram-sha-256 | md5 | password (cleartext, only with TLS)
    tls_cert: str | None = None  # PEM certificate; with tls_key, clients may (and with auth=password must) use TLS
    tls_key: str | None = None
    max_client_connections: int = 64  # past it, logins get 53300; each client may hold one shadow session, so
    #                                    this plus dpsql's 16 pooled connections fits PostgreSQL's default 100
    max_analyst_connections: int = 16  # one analyst's logins past it get 53300, so the rest stay for the others
    max_prepared_statements: int = 1000  # named prepared statements per connection; past it, Parse gets 53400
    idle_session_timeout_s: float = 1800.0  # close a client silent this long outside a transaction (0: never)
    idle_in_transaction_session_timeout_s: float = 0.0  # the same inside a BEGIN block (0: never)
    metrics_listen: str | None = None  # HOST:PORT for Prometheus' scrapes of /metrics (None: off)
    shadow_database: str | None = None  # postgresql:// URL of the data-free catalog copy; default: created


def load_settings(config: str | Path | None = None, **explicit: Any) -> Settings:
    """Settings from the sources above; `explicit` values that are None are ignored."""
    values: dict[str, Any] = {}
    path = config or os.environ.get("DPSQL_CONFIG") or ("dpsql.toml" if Path("dpsql.toml").exists() else None)
    if path:
        try:
            raw = tomllib.loads(Path(path).read_text(encoding="utf-8")).get("dpsql", {})
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from None
        known = {f.name for f in fields(Settings)}
        unknown = set(raw) - known
        if unknown:
            raise ConfigError(f"config file {path} has unknown keys: {', '.join(sorted(unknown))}",
                              "known keys: " + ", ".join(sorted(known)))
        values.update(raw)
    for key, variable in ENVIRONMENT.items():
        if os.environ.get(variable):
            values[key] = os.environ[variable]
    values.update({k: v for k, v in explicit.items() if v is not None})
    settings = Settings()
    try:
        typed = {f.name: _convert(values[f.name], f.type) for f in fields(Settings) if f.name in values}
    except ValueError as exc:
        raise ConfigError(f"invalid setting: {exc}") from None
    return replace(settings, **typed)


def _convert(value: Any, type_name: Any) -> Any:
    text = str(type_name)
    if value is None:
        return None
    if text.startswith("float"):
        return float(value)
    if text.startswith("int"):
        return int(value)
    return str(value)
