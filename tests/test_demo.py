"""`dpsql demo` as a new user meets it: its output, a kept server and how to stop it, `--serve`."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import psycopg
import pytest

DEMO = [sys.executable, "-m", "dpsql.cli", "demo", "--people", "2000"]


def _table(out: str, title: str) -> list[str]:
    """The lines of the table printed after the demo query titled `title`."""
    block = out.split(f"-- {title}")[1].split("\n\n")[0]
    return block.splitlines()[2:]


def test_demo_output_and_a_kept_server(tmp_path):
    data = tmp_path / "pg"
    done = subprocess.run([*DEMO, "--keep", "--data-dir", str(data)], capture_output=True, text=True, timeout=300)
    try:
        assert done.returncode == 0, done.stderr
        out, err = done.stdout, done.stderr
        assert "Warning" not in err and "\r" not in err  # no library warnings; no redraws into a pipe
        assert "loaded people" in err
        assert re.search(r"Loaded 2,000 people, [\d,]+ visits, [\d,]+ prescriptions and 50 states", out)
        median = _table(out, "Median income")
        assert "±ranks (95%)" in median[0] and "95% CI" not in median[0]  # a rank error is not an interval
        assert re.match(r"\s+[\d.]+ \| ±[\d.]+ ", median[2])
        bands = [line.split("|")[0].strip() for line in _table(out, "People per age band")[2:]]
        assert bands[:bands.index("(6 rows)")] == ["1", "2", "3", "4", "5", "6"]  # age is in [0, 100]: no band 0
        top = _table(out, "States with the most people")
        # counts of people select their own states: the top 5 are the released counts ordered and cut, the keys exact
        assert "95% CI" in top[0] and "count gap" not in top[0]
        assert "dpsql.connect(database=" in out  # the server it names is still running
        url = re.search(r'database="([^"]+)"', out).group(1)
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT COUNT(*) FROM people").fetchone()[0] == 2000
        assert f"dpsql demo --stop {data}" in out
    finally:
        stopped = subprocess.run([*DEMO, "--stop", str(data)], capture_output=True, text=True, timeout=120)
    assert stopped.returncode == 0 and "stopped" in stopped.stdout, stopped.stderr
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=3)


def test_demo_without_keep_points_to_keep_and_serve():
    done = subprocess.run(DEMO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "dpsql.connect(" not in done.stdout  # no snippet for a server about to stop
    assert "dpsql demo --serve" in done.stdout and "dpsql demo --keep" in done.stdout


def test_demo_serve_kept_says_how_to_stop(tmp_path):
    data = tmp_path / "pg"
    process = subprocess.Popen([*DEMO, "--keep", "--serve", "--listen", "127.0.0.1:0", "--data-dir", str(data)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in process.stdout:
            lines.append(line)
            if line.startswith("Press Ctrl-C"):
                break
        printed = "".join(lines)
        assert "Press Ctrl-C to stop the server." in printed, printed + process.stderr.read()
        dsn = re.search(r'psql "([^"]+)"', printed).group(1)
        with psycopg.connect(dsn, sslmode="disable", autocommit=True) as conn:
            assert conn.execute("SELECT COUNT(*) FROM people").fetchone()[0] > 0
        process.send_signal(signal.SIGINT)
        rest, _ = process.communicate(timeout=60)
        assert process.returncode == 0 and f"dpsql demo --stop {data}" in rest
    finally:
        if process.poll() is None:
            process.kill()
        subprocess.run([*DEMO, "--stop", str(data)], capture_output=True, timeout=120)
