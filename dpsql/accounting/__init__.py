"""Privacy budgets, the ledger of charges, and the answer cache, kept in the `dpsql` schema of PostgreSQL.

The ledger is written on dpsql's own autocommit connections, never the analyst's: a charge is committed
before the analysed statement starts, so a failed, cancelled or rolled-back query keeps its charge. A charge
is one conditional UPDATE of the analyst's row, which PostgreSQL serialises with a row lock, so concurrent
queries can never spend more than the budget. Composition is basic: ε and δ add up.
"""

from __future__ import annotations

import json
import math
import secrets
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from dpsql.errors import BudgetExhausted, InvalidParameter, UnknownAnalyst

DDL = """
CREATE SCHEMA IF NOT EXISTS dpsql;
CREATE TABLE IF NOT EXISTS dpsql.analysts (
    name text PRIMARY KEY,
    epsilon_total double precision NOT NULL CHECK (epsilon_total >= 0),
    delta_total double precision NOT NULL CHECK (delta_total >= 0 AND delta_total < 1),
    epsilon_spent double precision NOT NULL DEFAULT 0,
    delta_spent double precision NOT NULL DEFAULT 0,
    password_verifier text,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS dpsql.charges (
    id bigserial PRIMARY KEY,
    analyst text NOT NULL REFERENCES dpsql.analysts(name) ON DELETE CASCADE,
    at timestamptz NOT NULL DEFAULT now(),
    epsilon double precision NOT NULL,
    delta double precision NOT NULL,
    query_key text NOT NULL
);
CREATE TABLE IF NOT EXISTS dpsql.answers (
    analyst text NOT NULL REFERENCES dpsql.analysts(name) ON DELETE CASCADE,
    query_key text NOT NULL,
    answer jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (analyst, query_key)
);
CREATE TABLE IF NOT EXISTS dpsql.settings (
    key text PRIMARY KEY,
    value text NOT NULL
);
"""
TOLERANCE = 1e-9  # relative slack for floating-point sums of ε


@dataclass(frozen=True)
class Budget:
    analyst: str
    epsilon_total: float
    delta_total: float
    epsilon_spent: float
    delta_spent: float

    @property
    def epsilon_left(self) -> float:
        return max(self.epsilon_total - self.epsilon_spent, 0.0)

    @property
    def delta_left(self) -> float:
        return max(self.delta_total - self.delta_spent, 0.0)


def validate_epsilon(epsilon: Any, what: str = "epsilon", allow_zero: bool = False) -> float:
    """A finite, positive ε (or δ), else InvalidParameter."""
    try:
        value = float(epsilon)
    except (TypeError, ValueError):
        raise InvalidParameter(f"{what} must be a number, got {epsilon!r}") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise InvalidParameter(f"{what} must be a finite number {'>=' if allow_zero else '>'} 0, got {epsilon!r}")
    return value


class Ledger:
    def __init__(self, conninfo: str, max_connections: int = 8):
        self._pool = ConnectionPool(conninfo, min_size=1, max_size=max_connections, open=True,
                                    kwargs={"autocommit": True})
        with self._pool.connection() as conn:
            conn.add_notice_handler(lambda notice: None)
            conn.execute("SELECT pg_advisory_lock(712001)")
            try:
                conn.execute(DDL)
            finally:
                conn.execute("SELECT pg_advisory_unlock(712001)")

    def close(self) -> None:
        self._pool.close()

    # --- analysts -------------------------------------------------------------------------------------------

    def add_analyst(self, name: str, epsilon: float, delta: float) -> Budget:
        epsilon = validate_epsilon(epsilon)
        delta = _validate_delta(delta)
        with self._pool.connection() as conn:
            try:
                conn.execute("INSERT INTO dpsql.analysts (name, epsilon_total, delta_total) VALUES (%s, %s, %s)",
                             (name, epsilon, delta))
            except psycopg.errors.UniqueViolation:
                raise InvalidParameter(f'analyst "{name}" already exists',
                                       f"use `dpsql analyst grant {name} --epsilon E` to top up") from None
        return self.budget(name)

    def grant(self, name: str, epsilon: float, delta: float = 0.0) -> Budget:
        epsilon = validate_epsilon(epsilon, allow_zero=True)
        delta = _validate_delta(delta)
        with self._pool.connection() as conn:
            cur = conn.execute("UPDATE dpsql.analysts SET epsilon_total = epsilon_total + %s, "
                               "delta_total = LEAST(delta_total + %s, 0.999999) WHERE name = %s",
                               (epsilon, delta, name))
            if cur.rowcount == 0:
                raise _unknown(name)
        return self.budget(name)

    def remove(self, name: str) -> None:
        with self._pool.connection() as conn:
            if conn.execute("DELETE FROM dpsql.analysts WHERE name = %s", (name,)).rowcount == 0:
                raise _unknown(name)

    def analysts(self) -> list[Budget]:
        with self._pool.connection() as conn:
            rows = conn.execute("SELECT name, epsilon_total, delta_total, epsilon_spent, delta_spent "
                                "FROM dpsql.analysts ORDER BY name").fetchall()
        return [Budget(*row) for row in rows]

    def budget(self, name: str) -> Budget:
        with self._pool.connection() as conn:
            return _budget(conn, name)

    # --- charges and the answer cache ---------------------------------------------------------------------

    def charge(self, name: str, epsilon: float, delta: float, query_key: str) -> Budget:
        """Spend (ε, δ) of the analyst's budget, committed before returning; refuse if it would overspend."""
        with self._pool.connection() as conn:
            # one statement, so one atomic autocommit transaction: spend and record the charge together
            row = conn.execute(
                "WITH spent AS (UPDATE dpsql.analysts SET epsilon_spent = epsilon_spent + %(e)s, "
                "delta_spent = delta_spent + %(d)s WHERE name = %(n)s "
                "AND epsilon_spent + %(e)s <= epsilon_total * (1 + %(tol)s) "
                "AND delta_spent + %(d)s <= delta_total * (1 + %(tol)s) "
                "RETURNING name, epsilon_total, delta_total, epsilon_spent, delta_spent), "
                "logged AS (INSERT INTO dpsql.charges (analyst, epsilon, delta, query_key) "
                "SELECT name, %(e)s, %(d)s, %(k)s FROM spent) "
                "SELECT * FROM spent",
                {"e": epsilon, "d": delta, "n": name, "tol": TOLERANCE, "k": query_key}).fetchone()
            if row is None:
                budget = _budget(conn, name)  # raises UnknownAnalyst
                raise BudgetExhausted(
                    f"privacy budget exhausted: the query costs ε={epsilon:g}, δ={delta:g} but analyst "
                    f'"{name}" has ε={budget.epsilon_left:g}, δ={budget.delta_left:g} left; nothing was run',
                    "ask a smaller ε (SET dpsql.epsilon / --epsilon), or have an administrator run "
                    f"`dpsql analyst grant {name} --epsilon E`")
        return Budget(*row)

    def cached(self, name: str, query_key: str) -> dict | None:
        with self._pool.connection() as conn:
            row = conn.execute("SELECT answer FROM dpsql.answers WHERE analyst = %s AND query_key = %s",
                               (name, query_key)).fetchone()
        return row[0] if row else None

    def store(self, name: str, query_key: str, answer: dict) -> dict:
        """Keep the first answer released for this query; return whichever answer is stored."""
        with self._pool.connection() as conn:
            row = conn.execute("INSERT INTO dpsql.answers (analyst, query_key, answer) VALUES (%s, %s, %s) "
                               "ON CONFLICT DO NOTHING RETURNING answer",
                               (name, query_key, Jsonb(answer, dumps=_dumps))).fetchone()
        return row[0] if row else self.cached(name, query_key)

    def setting(self, key: str, default_factory) -> str:
        """A persistent dpsql setting, created once (e.g. the keyed-hash seed)."""
        with self._pool.connection() as conn:
            conn.execute("INSERT INTO dpsql.settings (key, value) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                         (key, str(default_factory())))
            return conn.execute("SELECT value FROM dpsql.settings WHERE key = %s", (key,)).fetchone()[0]


def _budget(conn: psycopg.Connection, name: str) -> Budget:
    row = conn.execute("SELECT name, epsilon_total, delta_total, epsilon_spent, delta_spent "
                       "FROM dpsql.analysts WHERE name = %s", (name,)).fetchone()
    if row is None:
        raise _unknown(name)
    return Budget(*row)


def new_hash_seed() -> int:
    return secrets.randbits(62)


def _dumps(value: Any) -> str:
    return json.dumps(value, default=str)


def _validate_delta(delta: Any) -> float:
    value = validate_epsilon(delta, "delta", allow_zero=True)
    if value >= 1:
        raise InvalidParameter(f"delta must be below 1, got {delta!r}")
    return value


def _unknown(name: str) -> UnknownAnalyst:
    return UnknownAnalyst(f'no analyst named "{name}"', f"create one with `dpsql analyst add {name} --epsilon E`")
