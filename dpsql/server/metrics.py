"""What an operator sees of `dpsql serve`: counters in Prometheus' text format, and one log line per event.

Counters: connections (open, accepted, refused past the limit), logins by result, statements by route,
errors by SQLSTATE, answers by whether they came from the cache. At each scrape the ledger adds every
analyst's ε spent and left, and the process its resident memory, threads and live Python objects (memory that
a burst of clients leaves resident shows as RSS above a baseline while the live objects are back at theirs).
Nothing here holds a query's text or values: the log lines name the analyst, the route and the outcome only.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import Counter
from collections.abc import Callable

from dpsql.accounting import Budget


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, tuple[tuple[str, str], ...]]] = Counter()
        self.open_connections = 0

    def count(self, name: str, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._counts[key] += 1

    def connection(self, opened: bool) -> None:
        with self._lock:
            self.open_connections += 1 if opened else -1

    def render(self, budgets: Callable[[], list[Budget]]) -> str:
        """The exposition text; `budgets` reads the ledger (skipped, with a note, when it is out of reach)."""
        with self._lock:
            counts = sorted(self._counts.items())
            lines = ["# TYPE dpsql_open_connections gauge", f"dpsql_open_connections {self.open_connections}",
                     *_process_gauges()]
        typed = set()
        for (name, labels), value in counts:
            if name not in typed:
                lines.append(f"# TYPE dpsql_{name} counter")
                typed.add(name)
            lines.append(f"dpsql_{name}{_labels(labels)} {value}")
        try:
            analysts = budgets()
        except Exception:  # noqa: BLE001 - the counters above are still worth serving
            lines.append("# the ledger is out of reach: no budgets in this scrape")
            analysts = []
        for kind in ("spent", "left"):
            lines.append(f"# TYPE dpsql_epsilon_{kind} gauge")
            for budget in analysts:
                value = budget.epsilon_spent if kind == "spent" else budget.epsilon_left
                lines.append(f"dpsql_epsilon_{kind}{_labels((('analyst', budget.analyst),))} {value:.6g}")
        return "\n".join(lines) + "\n"


def _process_gauges() -> list[str]:
    """Resident memory (Prometheus' standard name), threads, and the blocks CPython has allocated."""
    lines = []
    try:
        with open("/proc/self/statm") as statm:
            resident = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        lines += ["# TYPE process_resident_memory_bytes gauge", f"process_resident_memory_bytes {resident}"]
    except (OSError, ValueError):  # not Linux
        pass
    return lines + ["# TYPE dpsql_threads gauge", f"dpsql_threads {threading.active_count()}",
                    "# TYPE dpsql_python_allocated_blocks gauge",
                    f"dpsql_python_allocated_blocks {sys.getallocatedblocks()}"]


def _labels(labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return ""
    escaped = (f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"' for k, v in labels)
    return "{" + ",".join(escaped) + "}"
