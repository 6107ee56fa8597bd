"""The ledger: analysts, their budgets and every charge, kept in the `dpsql` schema of PostgreSQL.

The ledger is written on dpsql's own autocommit connections, never the analyst's: a charge is committed
before the analysed statement starts, so a failed, cancelled or rolled-back query keeps its charge. A charge
is written only if the analyst's row is unchanged since it was read and checked (optimistic concurrency), so
concurrent queries can never spend more than the budget.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import psycopg

from dpsql.accounting.answers import AnswerCache
from dpsql.accounting.budget import Budget, Cost, validate_epsilon
from dpsql.backends.postgres import CONNECT_WAIT, checked_pool, pool_health, pooled
from dpsql.errors import BudgetExhausted, InvalidParameter, OperationalError, UnknownAnalyst

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
-- The zCDP account (added after the first release). Charges made before it were pure ε_i answers, some with
-- a partition-selection δ_i: they are δ_i-approximately ε_i²/2-zCDP, so an analyst's earlier spending is
-- carried over as ρ = (Σε)²/2 >= Σε_i²/2 beside Σδ: never less than what was spent.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = 'dpsql'
                   AND table_name = 'analysts' AND column_name = 'rho_spent') THEN
        ALTER TABLE dpsql.analysts ADD COLUMN rho_spent double precision NOT NULL DEFAULT 0,
                                   ADD COLUMN approx_delta_spent double precision NOT NULL DEFAULT 0;
        UPDATE dpsql.analysts SET rho_spent = epsilon_spent * epsilon_spent / 2, approx_delta_spent = delta_spent;
        ALTER TABLE dpsql.charges ADD COLUMN rho double precision NOT NULL DEFAULT 0,
                                  ADD COLUMN approx_delta double precision NOT NULL DEFAULT 0;
        UPDATE dpsql.charges SET rho = epsilon * epsilon / 2, approx_delta = delta;
    END IF;
END $$;
CREATE TABLE IF NOT EXISTS dpsql.answers (
    analyst text NOT NULL REFERENCES dpsql.analysts(name) ON DELETE CASCADE,
    query_key text NOT NULL,
    answer jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (analyst, query_key)
);
CREATE INDEX IF NOT EXISTS charges_by_query ON dpsql.charges (analyst, query_key);
-- A charge is settled once its attempt has released an outcome other than an answer (a failure, a timeout,
-- a cancel). An unsettled charge without a stored answer was cut short by a fault (PostgreSQL or dpsql died
-- under it) and pays for the next attempt at the same query. Charges made before this column were settled.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = 'dpsql'
                   AND table_name = 'charges' AND column_name = 'settled') THEN
        ALTER TABLE dpsql.charges ADD COLUMN settled boolean NOT NULL DEFAULT true;
        ALTER TABLE dpsql.charges ALTER COLUMN settled SET DEFAULT false;
    END IF;
END $$;
-- The query a charge paid for, in its canonical form (for `dpsql ledger report`; older charges have none).
ALTER TABLE dpsql.charges ADD COLUMN IF NOT EXISTS query_text text;
CREATE TABLE IF NOT EXISTS dpsql.settings (
    key text PRIMARY KEY,
    value text NOT NULL
);
-- The ledger is history: a removed analyst is disabled and every charge stays (charges once cascaded away), and
-- every change of a budget is kept with who made it and when.
ALTER TABLE dpsql.analysts ADD COLUMN IF NOT EXISTS removed_at timestamptz;
CREATE TABLE IF NOT EXISTS dpsql.budget_changes (
    id bigserial PRIMARY KEY,
    analyst text NOT NULL REFERENCES dpsql.analysts(name),
    at timestamptz NOT NULL DEFAULT now(),
    by text NOT NULL,
    action text NOT NULL,
    epsilon_total double precision NOT NULL,
    delta_total double precision NOT NULL
);
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = 'dpsql.charges'::regclass AND contype = 'f'
               AND confdeltype = 'c') THEN
        ALTER TABLE dpsql.charges DROP CONSTRAINT charges_analyst_fkey,
            ADD CONSTRAINT charges_analyst_fkey FOREIGN KEY (analyst) REFERENCES dpsql.analysts(name);
    END IF;
END $$;
"""
MAX_CHARGE_ATTEMPTS = 1000  # a charge re-reads the budget after losing a race to a concurrent one
BUDGET_COLUMNS = "name, epsilon_total, delta_total, epsilon_spent, delta_spent, rho_spent, approx_delta_spent"
BUDGETS = f"SELECT {BUDGET_COLUMNS} FROM dpsql.analysts a WHERE removed_at IS NULL"
# whether the query was charged by an attempt that released nothing, and the analyst's budget: one round trip
UNANSWERED_AND_BUDGET = ("SELECT EXISTS (SELECT 1 FROM dpsql.charges c WHERE c.analyst = %(n)s AND c.query_key = %(k)s "
                         "AND NOT c.settled AND NOT EXISTS (SELECT 1 FROM dpsql.answers s WHERE s.analyst = %(n)s "
                         f"AND s.query_key = %(k)s)), {BUDGET_COLUMNS} FROM dpsql.analysts a "
                         "WHERE removed_at IS NULL AND name = %(n)s")
RECORD = ("INSERT INTO dpsql.budget_changes (analyst, by, action, epsilon_total, delta_total) "
          "SELECT name, COALESCE(%(by)s, session_user), %(action)s, epsilon_total, delta_total FROM dpsql.analysts "
          "WHERE name = %(n)s")
# each charge's outcome: an answer was released; an outcome other than an answer (failure, timeout, cancel) was;
# or nothing was (a fault cut the attempt short), and the charge pays for the next attempt at the same query
CHARGE_STATUS = ("CASE WHEN c.settled THEN 'failed' WHEN EXISTS (SELECT 1 FROM dpsql.answers s WHERE "
                 "s.analyst = c.analyst AND s.query_key = c.query_key) THEN 'answered' ELSE 'undelivered' END")

class Ledger:
    def __init__(self, conninfo: str, max_connections: int = 8, connect_wait: float = CONNECT_WAIT):
        self._pool = checked_pool(conninfo, max_connections, wait=connect_wait)
        with pooled(self._pool) as conn:
            conn.add_notice_handler(lambda notice: None)
            conn.execute("SELECT pg_advisory_lock(712001)")
            try:
                conn.execute(DDL)
            finally:
                conn.execute("SELECT pg_advisory_unlock(712001)")
        self.answers = AnswerCache(self._pool)

    def close(self) -> None:
        self._pool.close()

    def health(self) -> str | None:
        """None when the ledger answers now; otherwise why not."""
        return pool_health(self._pool)

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection]:
        """One of the ledger's connections in one transaction (a backup reads the ledger whole, a restore writes
        it)."""
        with pooled(self._pool) as conn, conn.transaction():
            yield conn

    # --- analysts -------------------------------------------------------------------------------------------

    def add_analyst(self, name: str, epsilon: float, delta: float, by: str | None = None) -> Budget:
        """A new analyst with a budget; a removed one comes back with the new totals and everything it spent
        before (removing and adding again never resets spending)."""
        epsilon = validate_epsilon(epsilon)
        delta = _validate_delta(delta)
        with pooled(self._pool) as conn, conn.transaction():
            restored = conn.execute("UPDATE dpsql.analysts SET removed_at = NULL, epsilon_total = %s, "
                                    "delta_total = %s WHERE name = %s AND removed_at IS NOT NULL",
                                    (epsilon, delta, name)).rowcount
            try:
                if not restored:
                    conn.execute("INSERT INTO dpsql.analysts (name, epsilon_total, delta_total) VALUES (%s, %s, %s)",
                                 (name, epsilon, delta))
            except psycopg.errors.UniqueViolation:
                raise InvalidParameter(f'analyst "{name}" already exists',
                                       f"use `dpsql analyst grant {name} --epsilon E` to top up, or "
                                       f"`dpsql analyst set {name} --epsilon E`") from None
            conn.execute(RECORD, {"n": name, "by": by, "action": "restore" if restored else "add"})
        return self.budget(name)

    def grant(self, name: str, epsilon: float, delta: float = 0.0, by: str | None = None) -> Budget:
        epsilon = validate_epsilon(epsilon, allow_zero=True)
        delta = _validate_delta(delta)
        with pooled(self._pool) as conn, conn.transaction():
            cur = conn.execute("UPDATE dpsql.analysts SET epsilon_total = epsilon_total + %s, "
                               "delta_total = LEAST(delta_total + %s, 0.999999) WHERE name = %s "
                               "AND removed_at IS NULL", (epsilon, delta, name))
            if cur.rowcount == 0:
                raise _unknown(name)
            conn.execute(RECORD, {"n": name, "by": by, "action": "grant"})
        return self.budget(name)

    def set_budget(self, name: str, epsilon: float, delta: float | None = None, by: str | None = None) -> Budget:
        """Set the analyst's totals (raise or lower), never below what is already spent. Written only if nothing
        was charged since the check, as a charge is written only if the totals did not change."""
        epsilon = validate_epsilon(epsilon, allow_zero=True)
        with pooled(self._pool) as conn, conn.transaction():
            before = _budget(conn, name)
            delta = before.delta_total if delta is None else _validate_delta(delta)
            after = replace(before, epsilon_total=epsilon, delta_total=delta)
            if not after.within:
                raise InvalidParameter(
                    f'analyst "{name}" has spent ε={before.epsilon_spent:g}, δ={before.delta_spent:g}: a budget '
                    f"of ε={epsilon:g}, δ={delta:g} would be below it", "set a budget at least what is spent")
            written = conn.execute(
                "UPDATE dpsql.analysts SET epsilon_total = %s, delta_total = %s WHERE name = %s AND "
                "epsilon_spent = %s AND delta_spent = %s AND rho_spent = %s AND approx_delta_spent = %s",
                (epsilon, delta, name, before.epsilon_basic, before.delta_basic, before.rho, before.approx_delta))
            if written.rowcount == 0:
                raise OperationalError(f'analyst "{name}" was charged meanwhile; nothing was changed', "run it again")
            conn.execute(RECORD, {"n": name, "by": by, "action": "set"})
        return self.budget(name)

    def remove(self, name: str, by: str | None = None) -> None:
        """Disable the analyst: no more logins or queries; every charge stays in the ledger."""
        with pooled(self._pool) as conn, conn.transaction():
            if conn.execute("UPDATE dpsql.analysts SET removed_at = now(), password_verifier = NULL WHERE name = %s "
                            "AND removed_at IS NULL", (name,)).rowcount == 0:
                raise _unknown(name)
            conn.execute(RECORD, {"n": name, "by": by, "action": "remove"})

    def set_verifier(self, name: str, verifier: str) -> None:
        """Store an analyst's password verifier (SCRAM or md5 form; never the password)."""
        with pooled(self._pool) as conn:
            if conn.execute("UPDATE dpsql.analysts SET password_verifier = %s WHERE name = %s AND removed_at IS NULL",
                            (verifier, name)).rowcount == 0:
                raise _unknown(name)

    def verifier(self, name: str) -> str | None:
        """The analyst's password verifier; None for an unknown analyst or one without a password."""
        with pooled(self._pool) as conn:
            row = conn.execute("SELECT password_verifier FROM dpsql.analysts WHERE name = %s AND removed_at IS NULL",
                               (name,)).fetchone()
        return row[0] if row else None

    def analysts(self) -> list[Budget]:
        with pooled(self._pool) as conn:
            rows = conn.execute(f"{BUDGETS} ORDER BY name").fetchall()
        return [_as_budget(row) for row in rows]

    def budget(self, name: str) -> Budget:
        with pooled(self._pool) as conn:
            return _budget(conn, name)

    # --- charges and settings ---------------------------------------------------------------------

    def charge(self, name: str, cost: Cost, query_key: str, query_text: str | None = None) -> Budget:
        """Spend `cost` of the analyst's budget, committed before returning; refuse if it would overspend.

        The new totals are checked in Python (the zCDP conversion is not SQL) and written by one statement
        that applies only if the analyst's row is still what was read, so two concurrent charges can never
        both pass on the same remaining budget; the loser re-reads and re-checks.

        A query charged before whose attempt released nothing (PostgreSQL or dpsql died under it: the charge is
        neither settled nor answered) is not charged again; the engine holds the query's lock, so this attempt
        is the only one that can deliver it. An attempt that released a failure, a timeout or a cancel is
        settled (`settle`), and asking again is charged again, as before: free retries would let an analyst
        sample a data-dependent outcome (how long the query runs) as often as they like."""
        with pooled(self._pool) as conn:
            row = conn.execute(UNANSWERED_AND_BUDGET, {"n": name, "k": query_key}).fetchone()
            if row is None:
                raise _unknown(name)
            unanswered, before = row[0], _as_budget(row[1:])
            if unanswered:
                return before  # paid already, by an attempt that never delivered its answer
            for attempt in range(MAX_CHARGE_ATTEMPTS):
                if attempt:
                    before = _budget(conn, name)  # another charge came first: read again (raises UnknownAnalyst)
                after = before.plus(cost)
                if not after.within:
                    raise BudgetExhausted(
                        f"privacy budget exhausted: the query costs ε={cost.epsilon:g}, δ={cost.delta:g} but "
                        f'analyst "{name}" has ε={before.epsilon_left:g}, δ={before.delta_left:g} left; nothing '
                        "was run", "ask a smaller ε (SET dpsql.epsilon / --epsilon), or have an administrator run "
                        f"`dpsql analyst grant {name} --epsilon E`")
                written = conn.execute(
                    "WITH spent AS (UPDATE dpsql.analysts SET epsilon_spent = %(e)s, delta_spent = %(d)s, "
                    "rho_spent = %(r)s, approx_delta_spent = %(a)s WHERE name = %(n)s AND epsilon_spent = %(e0)s "
                    "AND delta_spent = %(d0)s AND rho_spent = %(r0)s AND approx_delta_spent = %(a0)s "
                    "AND epsilon_total = %(et)s AND delta_total = %(dt)s RETURNING name), "
                    "logged AS (INSERT INTO dpsql.charges (analyst, epsilon, delta, rho, approx_delta, query_key, "
                    "query_text) SELECT name, %(ce)s, %(cd)s, %(cr)s, %(ca)s, %(k)s, %(t)s FROM spent) "
                    "SELECT name FROM spent",
                    {"e": after.epsilon_basic, "d": after.delta_basic, "r": after.rho, "a": after.approx_delta,
                     "n": name, "e0": before.epsilon_basic, "d0": before.delta_basic, "r0": before.rho,
                     "a0": before.approx_delta, "et": before.epsilon_total, "dt": before.delta_total,
                     "ce": cost.epsilon, "cd": cost.delta, "cr": cost.rho, "ca": cost.approx_delta,
                     "k": query_key, "t": query_text}).fetchone()
                if written is not None:
                    return after
        raise OperationalError(f'could not record a charge for analyst "{name}": too many concurrent charges',
                               "retry the query")

    def charges(self, name: str | None = None) -> list[tuple]:
        """Every charge (of one analyst, or of all, removed ones too), oldest first: (analyst, at, ε, δ, the query's
        canonical text, its status: answered, failed or undelivered)."""
        with pooled(self._pool) as conn:
            return conn.execute(f"SELECT analyst, at, epsilon, delta, query_text, {CHARGE_STATUS} FROM dpsql.charges c "
                                "WHERE %(n)s::text IS NULL OR analyst = %(n)s ORDER BY at, id", {"n": name}).fetchall()

    def budget_changes(self) -> list[tuple]:
        """Every budget change, oldest first: (analyst, at, by, action, ε total, δ total after it)."""
        with pooled(self._pool) as conn:
            return conn.execute("SELECT analyst, at, by, action, epsilon_total, delta_total FROM dpsql.budget_changes "
                                "ORDER BY at, id").fetchall()

    def settle(self, name: str, query_key: str) -> None:
        """The query's charge stands for an attempt that released an outcome (not an answer): a failure, a timeout
        or a cancel."""
        with pooled(self._pool) as conn:
            conn.execute("UPDATE dpsql.charges SET settled = true WHERE analyst = %s AND query_key = %s "
                         "AND NOT settled", (name, query_key))

    def setting(self, key: str, default_factory) -> str:
        """A persistent dpsql setting, created once (e.g. the keyed-hash seed)."""
        with pooled(self._pool) as conn:
            conn.execute("INSERT INTO dpsql.settings (key, value) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                         (key, str(default_factory())))
            return conn.execute("SELECT value FROM dpsql.settings WHERE key = %s", (key,)).fetchone()[0]


def _budget(conn: psycopg.Connection, name: str) -> Budget:
    row = conn.execute(f"{BUDGETS} AND name = %s", (name,)).fetchone()
    if row is None:
        raise _unknown(name)
    return _as_budget(row)


def _as_budget(row: tuple) -> Budget:
    return Budget(*row)


def new_hash_seed() -> int:
    return secrets.randbits(62)


def _validate_delta(delta: Any) -> float:
    value = validate_epsilon(delta, "delta", allow_zero=True)
    if value >= 1:
        raise InvalidParameter(f"delta must be below 1, got {delta!r}")
    return value


def _unknown(name: str) -> UnknownAnalyst:
    return UnknownAnalyst(f'no analyst named "{name}"', f"create one with `dpsql analyst add {name} --epsilon E`")
