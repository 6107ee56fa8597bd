"""A connection's prepared statements (kept so that a thousand of them give their memory back when it closes) and
its portals."""

from __future__ import annotations

import pickle
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

from dpsql.server.codec import Column
from dpsql.server.host import Outcome
from dpsql.server.statements import Statement, single_statement

MALLOC_SIZE = 513  # CPython serves larger blocks from malloc, not from its small-object arenas


@dataclass
class Prepared:
    """A prepared statement: its text, split again when it runs (a connection may hold a thousand, and their tokens
    would weigh most of them; recent texts are split from the cache), its parameter types and result columns."""

    sql: str
    param_types: list[int]
    columns: list[Column] | None

    @property
    def statement(self) -> Statement:
        return single_statement(self.sql)


class PreparedStatements(MutableMapping[str, Prepared]):
    """A connection's prepared statements by name, each kept as one pickled block of at least MALLOC_SIZE bytes
    under its name padded to as many: CPython's small-object allocator never gives back an arena (1 MB) while any
    block in it lives, so a thousand statements kept as objects, or even just their names as small strings, left
    the server's memory above its baseline after the connection closed (benchmarks/results/held_resources.md);
    blocks this size come from malloc, which returns them. A statement is unpickled when it runs (microseconds
    against a statement's milliseconds)."""

    def __init__(self) -> None:
        self._blocks: dict[bytes, bytes] = {}

    def __getitem__(self, name: str) -> Prepared:
        return pickle.loads(self._blocks[_key(name)])

    def __setitem__(self, name: str, prepared: Prepared) -> None:
        block = pickle.dumps(prepared, pickle.HIGHEST_PROTOCOL)
        self._blocks[_key(name)] = block.ljust(MALLOC_SIZE, b"\0")  # pickle ignores what follows its STOP

    def __delitem__(self, name: str) -> None:
        del self._blocks[_key(name)]

    def __iter__(self) -> Iterator[str]:
        return (key.rstrip(b"\0").decode() for key in self._blocks)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and _key(name) in self._blocks

    def __len__(self) -> int:
        return len(self._blocks)


def _key(name: str) -> bytes:
    """The name as a block of at least MALLOC_SIZE bytes, for the same reason as the statement (names are
    NUL-terminated in the protocol, so the padding cannot be part of one)."""
    return name.encode().ljust(MALLOC_SIZE, b"\0")


@dataclass
class Portal:
    """A prepared statement bound to its parameters, and how far its rows have been read."""

    prepared: Prepared
    params: list[Any]
    formats: list[int]
    outcome: Outcome | None = None
    position: int = 0
    hold: bool = False  # a cursor declared WITH HOLD outlives its transaction
