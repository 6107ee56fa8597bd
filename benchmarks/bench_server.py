"""Wire-protocol benchmark: what `dpsql serve` adds on top of the DB-API path, and how many answers it serves.

    python benchmarks/bench_server.py --people 100000 --runs 2000 --seconds 5

It loads the demo dataset into an embedded PostgreSQL, starts `dpsql serve` in its own process, and measures
with psycopg 3 as the client:

- added latency: one query through the port (simple protocol, and the extended protocol with a parameter)
  against the same query through `dpsql.connect` in this process, timed interleaved so machine noise hits
  both alike; cached answers (the engine's part is a small lookup) and fresh ones (computed and charged);
- plain relay: `SELECT 1` through the port (answered by the shadow database) against the same query sent
  straight to PostgreSQL;
- throughput: cached answers per second with 1, 8 and 32 clients, each a separate process with its own
  connection, looping over a few queries for a fixed time.

Reported figures are medians; the table goes to stdout and to benchmarks/results/server.md.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import secrets
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg

import dpsql
from dpsql.accounting import Ledger
from dpsql.demo import load_demo_data, progress_bar
from dpsql.embedded import EmbeddedPostgres
from dpsql.server.auth import scram_verifier

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "schemas" / "demo.toml"
ANALYST = "bench"
QUERIES = ["SELECT COUNT(*) FROM people", "SELECT sex, AVG(income) FROM people GROUP BY sex",
           "SELECT category, COUNT(*) FROM visits GROUP BY category", "SELECT SUM(amount) FROM visits"]
PARAMETERISED = "SELECT COUNT(*) FROM people WHERE age > %s"
FRESH = "SELECT COUNT(*), AVG(income) FROM people WHERE age > %s AND income"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _latencies(port_dsn: str, url: str, runs: int) -> list[tuple[str, float, float]]:
    """(label, median ms through the port, median ms of the baseline) for each comparison."""
    local = dpsql.connect(database=url, schema=str(SCHEMA), analyst=ANALYST)
    cursor = local.cursor()
    with psycopg.connect(port_dsn, autocommit=True) as port, psycopg.connect(url, autocommit=True) as direct:
        pairs = {
            "cached DP answer, simple protocol": (
                lambda: port.execute(QUERIES[1], prepare=False).fetchall(),
                lambda: cursor.execute(QUERIES[1]).fetchall()),
            "cached DP answer, extended protocol ($1)": (
                lambda: port.execute(PARAMETERISED, (40,), prepare=False).fetchall(),
                lambda: cursor.execute(PARAMETERISED, (40,)).fetchall()),
            "SELECT 1 (relay) vs direct PostgreSQL": (
                lambda: port.execute("SELECT 1").fetchall(),
                lambda: direct.execute("SELECT 1").fetchall()),
        }
        fresh = iter(range(10**9))  # a new parameter each run: the answer is computed and charged, not cached
        pairs["fresh DP answer (charged), extended protocol"] = (
            lambda: port.execute(FRESH + " >= 0", (next(fresh),), prepare=False).fetchall(),
            lambda: cursor.execute(FRESH + " >= 1", (next(fresh),)).fetchall())
        results = []
        for label, (through_port, baseline) in pairs.items():
            through_port(), baseline()  # warm both (and put the answer in the cache)
            port_times, base_times = [], []
            for _ in range(runs if "cached" in label or "SELECT 1" in label else min(runs, 300)):
                port_times.append(_timed(through_port))
                base_times.append(_timed(baseline))
            results.append((label, _median_ms(port_times), _median_ms(base_times)))
    local.close()
    return results


def _client(dsn: str, seconds: float, start_at: float, counts) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for sql in QUERIES:
            conn.execute(sql).fetchall()
        while time.time() < start_at:
            time.sleep(0.001)
        done, deadline = 0, start_at + seconds
        while time.time() < deadline:
            conn.execute(QUERIES[done % len(QUERIES)]).fetchall()
            done += 1
    counts.put(done)


def _throughput(dsn: str, clients: int, seconds: float) -> float:
    counts = multiprocessing.Queue()
    start_at = time.time() + 1.0 + clients * 0.05
    workers = [multiprocessing.Process(target=_client, args=(dsn, seconds, start_at, counts))
               for _ in range(clients)]
    for worker in workers:
        worker.start()
    total = sum(counts.get() for _ in workers)
    for worker in workers:
        worker.join()
    return total / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--people", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=2000, help="timed queries per latency comparison")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each throughput run")
    parser.add_argument("--repeats", type=int, default=3, help="throughput runs per client count (median)")
    args = parser.parse_args()

    server = EmbeddedPostgres()
    url = server.start()
    process = None
    try:
        load_demo_data(url, people=args.people, progress=progress_bar)
        password = secrets.token_urlsafe(12)
        ledger = Ledger(url)
        ledger.add_analyst(ANALYST, 1e6, 1e-3)
        ledger.set_verifier(ANALYST, scram_verifier(password))
        ledger.close()
        port = _free_port()
        env = {**os.environ, "DPSQL_DATABASE": url, "DPSQL_SCHEMA": str(SCHEMA)}
        process = subprocess.Popen([sys.executable, "-m", "dpsql.cli", "serve", "--listen", f"127.0.0.1:{port}"],
                                   env=env, stderr=subprocess.PIPE, text=True)
        print(process.stderr.readline().strip(), file=sys.stderr)
        dsn = f"host=127.0.0.1 port={port} user={ANALYST} password={password} dbname=demo sslmode=disable"

        latencies = _latencies(dsn, url, args.runs)
        throughput = {n: statistics.median(_throughput(dsn, n, args.seconds) for _ in range(args.repeats))
                      for n in (1, 8, 32)}
    finally:
        if process is not None:
            process.terminate()
            process.wait(10)
        server.stop()

    lines = [f"## dpsql serve: {args.people:,} people, {os.cpu_count()} cores, psycopg 3 client", "",
             f"Latency (median of {args.runs} interleaved runs; 300 for fresh answers):", "",
             "| query | through the port (ms) | baseline (ms) | added (ms) |", "|---|---:|---:|---:|"]
    lines += [f"| {label} | {port_ms:.3f} | {base_ms:.3f} | {port_ms - base_ms:+.3f} |"
              for label, port_ms, base_ms in latencies]
    lines += ["", "Baselines: the DB-API path (`dpsql.connect` in the client's process) for DP answers; psycopg "
              "straight to PostgreSQL (Unix socket) for SELECT 1.", "",
              f"Throughput (cached DP answers per second, median of {args.repeats} runs of {args.seconds:g} s):", "",
              "| clients | answers/s |", "|---:|---:|"]
    lines += [f"| {n} | {rate:,.0f} |" for n, rate in throughput.items()]
    report = "\n".join(lines)
    print(report)
    out = ROOT / "benchmarks" / "results" / "server.md"
    out.write_text(report + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
