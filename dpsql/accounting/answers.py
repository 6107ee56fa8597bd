"""The answer cache: an answer released to an analyst is kept (the first one wins, in `dpsql.answers`) and
returned again for the same canonical query, parameters and ε at no cost; asking twice must not average the
noise away. Recent answers are also kept in memory: a stored answer never changes, so that is safe across
processes.
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
from typing import Any

from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from dpsql.backends.postgres import pooled
from dpsql.recent import Recent

MEMO_SIZE = 4096  # answers kept in memory; the dpsql.answers table stays the record


class AnswerCache:
    def __init__(self, pool: ConnectionPool):
        self._pool = pool
        self._memo: Recent[tuple[str, str], dict] = Recent(MEMO_SIZE)  # (analyst, key) -> stored answer

    def get(self, analyst: str, key: str) -> dict | None:
        """The answer already released to `analyst` for `key`, or None."""
        remembered = self._memo.get((analyst, key))
        if remembered is not None:
            return remembered
        with pooled(self._pool) as conn:
            row = conn.execute("SELECT answer FROM dpsql.answers WHERE analyst = %s AND query_key = %s",
                               (analyst, key)).fetchone()
        return None if row is None else self._remember(analyst, key, row[0])

    def keep(self, analyst: str, key: str, answer: dict) -> dict:
        """Keep the first answer released for this query; return whichever answer is stored."""
        with pooled(self._pool) as conn:
            row = conn.execute("INSERT INTO dpsql.answers (analyst, query_key, answer) VALUES (%s, %s, %s) "
                               "ON CONFLICT DO NOTHING RETURNING answer",
                               (analyst, key, Jsonb(answer, dumps=_dumps))).fetchone()
        if row is None:
            return self.get(analyst, key)
        return self._remember(analyst, key, row[0])

    def _remember(self, analyst: str, key: str, stored: dict) -> dict:
        self._memo.put((analyst, key), stored)
        return stored


def encode_value(value: Any) -> Any:
    """A released value in JSON: dates, timestamps and decimals tagged with their type, and so are the floats
    that JSON cannot hold (NaN, ±Infinity) or that PostgreSQL's jsonb would give back as integers (1.0, -0.0)."""
    if isinstance(value, float) and (not math.isfinite(value) or value.is_integer()):
        return {"$float": repr(value)}
    if isinstance(value, datetime.datetime):
        return {"$timestamp": value.isoformat()}
    if isinstance(value, datetime.date):
        return {"$date": value.isoformat()}
    if isinstance(value, decimal.Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, list):  # an array of released values
        return [encode_value(v) for v in value]
    return value


def decode_value(value: Any) -> Any:
    if isinstance(value, list):
        return [decode_value(v) for v in value]
    if isinstance(value, dict):
        (tag, text), = value.items()
        return {"$timestamp": datetime.datetime.fromisoformat, "$date": datetime.date.fromisoformat,
                "$decimal": decimal.Decimal, "$float": float}[tag](text)
    return value


def _dumps(value: Any) -> str:
    return json.dumps(value, default=str, allow_nan=False)  # a NaN left untagged fails here, not in PostgreSQL
