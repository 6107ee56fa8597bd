"""Superset end to end against `dpsql serve`, in headless Chromium (issue 18).

    python benchmarks/superset_e2e.py            # sets up .superset-venv on first use

What it does: starts `dpsql demo --serve` (5,000 people), a fresh Superset (its metadata in SQLite in a temporary
directory, admin/admin), then drives Superset in Chromium (benchmarks/superset/browser.py): login, the database
connection test and the database, dataset sync of `visits` and `people` (Superset introspects their columns
through dpsql), SQL Lab (an answer and a refusal), a bar chart and a table chart built in Explore by drag and drop
and saved (each runs its query through dpsql), and a dashboard with both, refreshed with force. Screenshots and
a summary go to benchmarks/results/superset/, with what Superset sent by route and what dpsql refused (its
/metrics).

Needs Debian's chromium (`apt-get install chromium`) and network access to PyPI for the first setup. Superset
lives in its own virtual environment: its pins (SQLAlchemy 1.4, Flask) do not mix with dpsql's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".superset-venv"
# apache-superset 6.1.0 on PyPI does not declare everything it imports, and fails with Flask-Caching 2.4+
SUPERSET_PACKAGES = ["apache-superset==6.1.0", "psycopg2-binary", "playwright", "rich", "cachetools",
                     "flask-caching<2.4"]
OUT = ROOT / "benchmarks" / "results" / "superset"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def setup_venv() -> Path:
    python = VENV / "bin" / "python"
    if not python.exists():
        print(f"creating {VENV} with {' '.join(SUPERSET_PACKAGES)} (a few minutes) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *SUPERSET_PACKAGES], check=True)
    return python


def start_dpsql(home: Path, metrics_port: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    (home / "dpsql.toml").write_text(f'[dpsql]\nmetrics_listen = "127.0.0.1:{metrics_port}"\n')
    log = open(home / "dpsql.log", "w")  # noqa: SIM115 - open for the life of the process
    process = subprocess.Popen([sys.executable, "-m", "dpsql.cli", "demo", "--people", "5000", "--serve",
                                "--listen", f"127.0.0.1:{port}", "--data-dir", str(home / "pg")],
                               stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT,
                               env={**os.environ, "DPSQL_CONFIG": str(home / "dpsql.toml")})
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        found = re.search(r'psql "(postgresql://[^"]+)"', line)
        if found:
            return process, found.group(1)
        if not line and process.poll() is not None:
            break
    raise SystemExit(f"dpsql demo --serve did not start; see {home / 'dpsql.log'}")


def start_superset(python: Path, home: Path) -> tuple[subprocess.Popen, str]:
    config = home / "superset_config.py"
    config.write_text(f'SECRET_KEY = "dpsql-e2e-{os.urandom(8).hex()}"\n'
                      f'SQLALCHEMY_DATABASE_URI = "sqlite:///{home / "superset.db"}"\n'
                      "WTF_CSRF_ENABLED = False\nTALISMAN_ENABLED = False\n")
    env = {**os.environ, "SUPERSET_CONFIG_PATH": str(config), "FLASK_APP": "superset"}
    superset = str(python.parent / "superset")
    for command in (["db", "upgrade"], ["fab", "create-admin", "--username", "admin", "--firstname", "a",
                                        "--lastname", "b", "--email", "admin@example.org", "--password", "admin"],
                    ["init"]):
        subprocess.run([superset, *command], env=env, cwd=home, check=True, capture_output=True)
    port = free_port()
    log = open(home / "superset.log", "w")  # noqa: SIM115
    process = subprocess.Popen([superset, "run", "-h", "127.0.0.1", "-p", str(port), "--with-threads"], env=env,
                               cwd=home, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return process, url
        except OSError:
            time.sleep(1)
    raise SystemExit(f"Superset did not start; see {home / 'superset.log'}")


def statements(metrics_port: int) -> list[str]:
    """What Superset sent and dpsql refused, from dpsql's /metrics: statements by route, errors by SQLSTATE."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return [f"{m.group(1)}{{{m.group(2)}}} {m.group(3)}" for m in
            re.finditer(r"^dpsql_(statements_total|errors_total)\{([^}]*)\} (\S+)$", text, re.MULTILINE)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = parser.parse_args()
    if not Path(args.chromium).exists():
        raise SystemExit("Chromium is needed: apt-get install chromium (or pass --chromium PATH)")
    python = setup_venv()
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dpsql-superset-") as folder:
        home = Path(folder)
        metrics_port = free_port()
        dpsql, uri = start_dpsql(home, metrics_port)
        superset = None
        try:
            superset, url = start_superset(python, home)
            print(f"dpsql: {uri.split('@')[1]}   Superset: {url}", flush=True)
            done = subprocess.run([str(python), str(ROOT / "benchmarks" / "superset" / "browser.py"), "--superset",
                                   url, "--uri", uri, "--out", str(OUT), "--chromium", args.chromium],
                                  capture_output=True, text=True, timeout=900)
            steps = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
            counted = statements(metrics_port)
        finally:
            for process in (superset, dpsql):
                if process is not None:
                    process.terminate()
                    process.wait(30)
    lines = ["# Superset end to end against dpsql serve", "",
             "`python benchmarks/superset_e2e.py` (Superset 6.1.0, headless Chromium; screenshots beside this file)",
             "", "| step | ok | detail |", "|---|---|---|"]
    lines += [f"| {s['step']} | {'yes' if s['ok'] else '**no**'} | {s['detail'].replace('|', '/')} |" for s in steps]
    lines += ["", "What Superset sent, from dpsql's /metrics (statements by route; errors by SQLSTATE):", "",
              *(f"- `{line}`" for line in counted)]
    if done.returncode != 0:
        lines += ["", "The browser run failed:", "```", done.stderr[-2000:], "```"]
    (OUT / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if done.returncode == 0 and all(s["ok"] for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
