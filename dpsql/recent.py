"""Bounded memory of recent values: one class for the server's and the engine's caches (split statements, routes,
descriptions, plans, kept answers).

A cache that keeps whatever it last saw lets a client that sends many distinct texts once each (16,000 named
statements from one analyst) evict every entry that others use again, and leaves the client's own entries behind
once it has gone, holding memory that nobody will ask for. With `second_sighting`, a key is kept only when it comes
again while a fixed table of recent keys' hashes (SEEN_SLOTS of them, allocated once) still holds it: a text used
twice pays one more miss, a one-off text is never kept.
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")
SEEN_SLOTS = 4096


class Recent(Generic[K, V]):
    """The `size` most recently used entries, the least recent dropped first; safe across threads."""

    def __init__(self, size: int, second_sighting: bool = False):
        self.size = size
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()
        self._seen = array("q", bytes(8 * SEEN_SLOTS)) if second_sighting else None

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        with self._lock:
            if self._seen is not None and key not in self._entries:
                code = hash(key)
                slot = code % SEEN_SLOTS
                if self._seen[slot] != code:  # first seen (or its slot taken since): remembered, not kept
                    self._seen[slot] = code
                    return
            self._entries[key] = value
            self._entries.move_to_end(key)
            if len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
