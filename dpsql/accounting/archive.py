"""The ledger leaving the database: an export of its history for auditors, and a backup that restores it whole.

An export holds every charge (of removed analysts too) and every budget change: who, when, what, how much, and how
each charge ended. A backup holds every table of the `dpsql` schema, the keyed-hash seed among the settings: with
it, anyone who also reads the database can recompute which rows the rewrite keeps, so the file is written for its
owner alone and says so. Restoring goes into an empty ledger only, so that no spending is ever overwritten.
"""

from __future__ import annotations

import csv
import datetime
import io
import json
import os
from pathlib import Path
from typing import Any

from psycopg import sql
from psycopg.types.json import Jsonb

from dpsql.accounting.ledger import Ledger
from dpsql.errors import InvalidParameter

EXPORT_FIELDS = ("at", "analyst", "kind", "outcome", "epsilon", "delta", "query", "by")
BACKUP_FORMAT = "dpsql ledger backup 1"
BACKUP_WARNING = ("this file holds the ledger's secret keyed-hash seed and analysts' password verifiers: keep it as "
                  "secret as the database's own password")
TABLES = ("analysts", "charges", "answers", "settings", "budget_changes")  # in the order they restore
SERIALS = ("charges", "budget_changes")


def export(ledger: Ledger, fmt: str = "jsonl") -> str:
    """Every charge and budget change, oldest first, as JSON lines or CSV. A budget change carries the totals it
    set as ε and δ, and its action as its outcome."""
    records = [{"at": at, "analyst": analyst, "kind": "charge", "outcome": status, "epsilon": epsilon,
                "delta": delta, "query": text, "by": None}
               for analyst, at, epsilon, delta, text, status in ledger.charges()]
    records += [{"at": at, "analyst": analyst, "kind": "budget", "outcome": action, "epsilon": epsilon,
                 "delta": delta, "query": None, "by": by}
                for analyst, at, by, action, epsilon, delta in ledger.budget_changes()]
    records.sort(key=lambda r: r["at"])
    for record in records:
        record["at"] = record["at"].isoformat()
    if fmt == "jsonl":
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    out = io.StringIO()
    writer = csv.DictWriter(out, EXPORT_FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
    return out.getvalue()


def backup(ledger: Ledger, path: str | Path) -> dict[str, int]:
    """Every table of the ledger, read in one snapshot, written to `path` readable by its owner only. Returns the
    rows per table."""
    document: dict[str, Any] = {"format": BACKUP_FORMAT, "warning": BACKUP_WARNING,
                                "taken_at": datetime.datetime.now(datetime.UTC).isoformat(), "tables": {}}
    with ledger.transaction() as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        for table in TABLES:
            cur = conn.execute(sql.SQL("SELECT * FROM dpsql.{}").format(sql.Identifier(table)))
            document["tables"][table] = {"columns": [d.name for d in cur.description],
                                         "rows": [list(map(_plain, row)) for row in cur.fetchall()]}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        os.fchmod(out.fileno(), 0o600)  # an existing file keeps its mode otherwise
        json.dump(document, out, ensure_ascii=False)
    return {table: len(content["rows"]) for table, content in document["tables"].items()}


def restore(ledger: Ledger, path: str | Path) -> dict[str, int]:
    """The backup at `path` into this ledger, which must hold no analyst, charge or answer yet (its settings, the
    keyed-hash seed among them, are replaced by the backup's). One transaction: all of it or nothing."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidParameter(f"cannot read the backup {path}: {exc}",
                               "name a file `dpsql ledger backup` wrote") from None
    if not isinstance(document, dict) or document.get("format") != BACKUP_FORMAT:
        raise InvalidParameter(f"{path} is not a dpsql ledger backup", "name a file `dpsql ledger backup` wrote")
    with ledger.transaction() as conn:
        conn.execute("LOCK TABLE dpsql.analysts, dpsql.charges, dpsql.answers, dpsql.settings, dpsql.budget_changes")
        held = conn.execute("SELECT (SELECT COUNT(*) FROM dpsql.analysts) + (SELECT COUNT(*) FROM dpsql.charges) "
                            "+ (SELECT COUNT(*) FROM dpsql.answers)").fetchone()[0]
        if held:
            raise InvalidParameter("the ledger is not empty: a restore would overwrite its analysts and spending",
                                   "restore into a new ledger (--ledger URL of an empty database)")
        conn.execute("DELETE FROM dpsql.settings")
        for table in TABLES:
            content = document["tables"][table]
            statement = sql.SQL("INSERT INTO dpsql.{} ({}) VALUES ({})").format(
                sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, content["columns"])),
                sql.SQL(", ").join(sql.Placeholder() * len(content["columns"])))
            with conn.cursor() as cur:
                cur.executemany(statement, [[_stored(v) for v in row] for row in content["rows"]])
        for table in SERIALS:
            conn.execute(sql.SQL("SELECT setval(pg_get_serial_sequence({}, 'id'), COALESCE(MAX(id), 0) + 1, false) "
                                 "FROM dpsql.{}").format(sql.Literal(f"dpsql.{table}"), sql.Identifier(table)))
    return {table: len(document["tables"][table]["rows"]) for table in TABLES}


def _plain(value: Any) -> Any:
    """A value as JSON holds it: times as ISO text (PostgreSQL reads them back), answers as their JSON."""
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, dict | list):
        return {"json": value}
    return value


def _stored(value: Any) -> Any:
    return Jsonb(value["json"]) if isinstance(value, dict) and set(value) == {"json"} else value


__all__ = ["backup", "export", "restore"]
