"""Soak `dpsql serve`: clients send a mix of statements for a while, and PostgreSQL restarts in the middle.

`dpsql serve` runs as its own process (so that its RSS is its own) in front of an embedded PostgreSQL with the
demo data. Each client has its own analyst and loops over: a cached DP answer, a fresh DP answer (a new
parameter each time, ε = 0.01; one that fails is asked again), a catalog query and a refused one. Halfway
through, PostgreSQL is stopped and started again. Reported: statements per 30 s window, errors by SQLSTATE,
clients dropped, the server's RSS over time, charges against stored answers per analyst, and cached answers
per second afterwards.

    python benchmarks/soak_server.py --minutes 10 --clients 8
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psycopg

from dpsql.accounting import Ledger
from dpsql.demo import load_demo_data
from dpsql.embedded import EmbeddedPostgres
from dpsql.server.auth import scram_verifier

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "soak pass"
WINDOW = 30.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.outcomes: Counter[str] = Counter()
        self.per_window: Counter[int] = Counter()
        self.dropped = 0

    def add(self, outcome: str, started: float) -> None:
        with self.lock:
            self.outcomes[outcome] += 1
            self.per_window[int((time.monotonic() - started) // WINDOW)] += 1


def client(dsn: str, number: int, until: float, started: float, tally: Tally) -> None:
    statements = [
        ("cached", "SELECT sex, COUNT(*) FROM people GROUP BY sex", None),
        ("fresh", "SELECT COUNT(*) FROM visits WHERE amount > %s", "fresh"),
        ("catalog", "SELECT count(*) FROM pg_catalog.pg_class", None),
        ("refused", "SELECT * FROM people", None),
    ]
    fresh = number * 1_000_000
    conn = None
    while time.monotonic() < until:
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                with tally.lock:
                    tally.dropped += 1
            try:
                conn = psycopg.connect(dsn, autocommit=True)
                conn.execute("SET dpsql.epsilon = 0.01")
            except psycopg.OperationalError:
                tally.add("connect failed", started)
                time.sleep(0.5)
                continue
        for kind, sql, param in statements:
            if time.monotonic() >= until:
                break
            try:
                params = (fresh / 1000,) if param == "fresh" else None
                conn.execute(sql, params).fetchall()
                fresh += param == "fresh"  # a failed fresh query is asked again, as a client would retry it
                tally.add(kind, started)
            except psycopg.Error as exc:
                tally.add(f"{kind}: {exc.sqlstate or type(exc).__name__}", started)
                if conn.closed or conn.broken:
                    break
    if conn is not None:
        conn.close()


def cached_rate(dsn: str, clients: int, seconds: float) -> float:
    done = Counter()

    def hammer(i: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                conn.execute("SELECT sex, COUNT(*) FROM people GROUP BY sex").fetchall()
                done[i] += 1

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done.values()) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--people", type=int, default=20_000)
    args = parser.parse_args()

    postgres = EmbeddedPostgres()
    admin = postgres.start()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("CREATE DATABASE soak")
    url = admin.replace("/postgres?", "/soak?")
    load_demo_data(url, people=args.people, seed=5)
    ledger = Ledger(url)
    analysts = [f"soak{i}" for i in range(args.clients)]
    for name in analysts:
        ledger.add_analyst(name, 1e6, 1e-2)
        ledger.set_verifier(name, scram_verifier(PASSWORD))
    ledger.close()

    port = free_port()
    env = {**os.environ, "DPSQL_DATABASE": url, "DPSQL_SCHEMA": str(ROOT / "schemas" / "demo.toml")}
    server = subprocess.Popen([sys.executable, "-m", "dpsql.cli", "serve", "--listen", f"127.0.0.1:{port}"],
                              env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert "listening on" in server.stderr.readline()
        threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()  # drain the log
        dsns = [f"host=127.0.0.1 port={port} user={a} password='{PASSWORD}' dbname=soak sslmode=disable"
                for a in analysts]
        started = time.monotonic()
        until = started + args.minutes * 60
        tally = Tally()
        threads = [threading.Thread(target=client, args=(dsn, i, until, started, tally))
                   for i, dsn in enumerate(dsns)]
        for thread in threads:
            thread.start()
        rss = [(0.0, rss_mb(server.pid))]
        restarted = False
        while any(t.is_alive() for t in threads):
            time.sleep(5)
            elapsed = time.monotonic() - started
            rss.append((elapsed, rss_mb(server.pid)))
            if not restarted and elapsed >= args.minutes * 30:
                print(f"[{elapsed:.0f} s] restarting PostgreSQL", flush=True)
                postgres.halt()
                time.sleep(2)
                postgres.start()
                restarted = True
        for thread in threads:
            thread.join()
        rate = cached_rate(dsns[0], args.clients, 10.0)
        final_rss = rss_mb(server.pid)
    finally:
        server.terminate()
        server.wait(30)

    with psycopg.connect(url) as conn:
        ledger_rows = conn.execute(
            "SELECT a.name, (SELECT count(*) FROM dpsql.charges c WHERE c.analyst = a.name), "
            "(SELECT count(*) FROM dpsql.answers s WHERE s.analyst = a.name) FROM dpsql.analysts a "
            "ORDER BY a.name").fetchall()
    postgres.stop()

    print(f"\n## soak: {args.clients} clients, {args.minutes:g} min, PostgreSQL restarted at "
          f"{args.minutes * 30:.0f} s\n")
    print("| outcome | statements |\n|---|---|")
    for outcome, count in sorted(tally.outcomes.items()):
        print(f"| {outcome} | {count} |")
    print(f"\nclients dropped: {tally.dropped}\n")
    print("| window (s) | statements/s |\n|---|---|")
    for window in sorted(tally.per_window):
        print(f"| {window * WINDOW:.0f}-{(window + 1) * WINDOW:.0f} | {tally.per_window[window] / WINDOW:.1f} |")
    print("\n| t (s) | server RSS (MB) |\n|---|---|")
    for minute in range(int(max(t for t, _ in rss) // 60) + 1):
        t, mb = min(rss, key=lambda sample, m=minute: abs(sample[0] - 60 * m))
        print(f"| {t:.0f} | {mb:.1f} |")
    warm = [mb for t, mb in rss if t >= 60] or [mb for _, mb in rss]
    print(f"\nserver RSS (MB): start {rss[0][1]:.1f}, after warm-up (60 s) {warm[0]:.1f}, end {final_rss:.1f}, "
          f"median after warm-up {statistics.median(warm):.1f}")
    print("\n| analyst | charges | stored answers | charges without an answer |\n|---|---|---|---|")
    for name, charges, answers in ledger_rows:
        print(f"| {name} | {charges} | {answers} | {charges - answers} |")
    print(f"\ncached answers/s with {args.clients} clients after the soak: {rate:.0f}")


if __name__ == "__main__":
    main()
