"""The owner's guide (docs/owner-guide.md), run as an owner would follow it: every shell line of it, in order, on a
clinic database dpsql has never seen, with only the guide's own edits in between."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import psycopg

from dpsql.accounting import Ledger
from tests.conftest import ROOT, database_url
from tests.test_owner import CLINIC_DDL

GUIDE = (ROOT / "docs" / "owner-guide.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"^```(\w*)\n(.*?)^```", GUIDE, flags=re.M | re.S)
GUIDE_DB = "postgresql://owner@db.example.com/clinic"
STANDBY = "postgresql://owner@standby.example.com/clinic_ledger"
PASSWORD = "guide pass"


def _fresh(server, name: str) -> str:
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    return database_url(server, name)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _script(clinic: str, standby: str, port: int) -> str:
    """The guide's shell blocks as one script: its URLs pointed at the test's databases, the server started in
    the background until it listens, and the guide's TOML edits applied to the drafted schema where it shows
    them."""
    (bounds,) = [body for language, body in BLOCKS if language == "toml"]
    lines = ["set -e"]
    for language, body in BLOCKS:
        if language != "sh":
            continue
        for line in body.splitlines():
            line = line.replace(GUIDE_DB, clinic).replace(STANDBY, standby).replace("6543", str(port))
            if line.startswith("dpsql serve"):
                lines += [f"{line} 2> serve.log &", "SERVER=$!",
                          f"for i in $(seq 150); do (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && break; "
                          "sleep 0.2; done"]
                continue
            lines.append(line)
            if line.startswith("dpsql schema draft"):  # the guide's edit: value bounds the owner declares
                lines.append(f"{sys.executable} - <<'EOF'\n{_edit(bounds)}\nEOF")
    lines.append("kill $SERVER; wait $SERVER || true")
    return "\n".join(lines)


def _edit(bounds: str) -> str:
    """Python that replaces each drafted column line of clinic.toml the guide's TOML block declares."""
    return ("import re\nfrom pathlib import Path\npath = Path('clinic.toml')\ntext = path.read_text()\n"
            f"for line in {bounds.strip().splitlines()!r}:\n"
            "    name = line.split(' ')[0]\n"
            "    text, count = re.subn(rf'^{name} = .*$', line, text, count=1, flags=re.M)\n"
            "    assert count == 1, name\n"
            "path.write_text(text)")


def test_the_owner_guide_runs_as_written(server, tmp_path):
    clinic, standby = _fresh(server, "dpsql_guide"), _fresh(server, "dpsql_guide_standby")
    with psycopg.connect(clinic, autocommit=True) as conn:
        conn.execute(CLINIC_DDL)
    port = _free_port()
    bin_dirs = [str(Path(sys.executable).parent)]
    if shutil.which("psql") is None:  # the embedded PostgreSQL's own client, where pgserver ships one
        import pgserver
        bin_dirs.append(str(Path(pgserver.__file__).parent / "pginstall" / "bin"))
    env = {**os.environ, "PATH": os.pathsep.join([*bin_dirs, os.environ["PATH"]]), "PGPASSWORD": PASSWORD}
    for name in ("DPSQL_DATABASE", "DPSQL_SCHEMA", "DPSQL_ANALYST", "DPSQL_LEDGER", "DPSQL_CONFIG"):
        env.pop(name, None)
    done = subprocess.run(["bash", "-c", _script(clinic, standby, port)], cwd=tmp_path, env=env, input=PASSWORD + "\n",
                          capture_output=True, text=True, timeout=300)
    log = (tmp_path / "serve.log").read_text() if (tmp_path / "serve.log").exists() else ""
    assert done.returncode == 0, done.stdout + done.stderr + log
    out = done.stdout
    assert "every declared table and column exists" in out  # the check passed the drafted, edited schema
    assert re.search(r"checkup\s*\|\s*\d+", out) and "surgery" in out and "therapy" in out  # psql's answer
    assert "wrote the ledger to ledger-backup.json" in out and "restored the ledger" in out
    assert "nurse" in (tmp_path / "ledger.csv").read_text() and (tmp_path / "ledger.html").exists()
    assert "stopping on SIGTERM" in log
    restored = Ledger(standby)
    try:
        budget = restored.budget("nurse")
        assert budget.epsilon_total == 8 and budget.epsilon_spent > 0
    finally:
        restored.close()
