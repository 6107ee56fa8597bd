"""The README's examples, run as a new user would paste them, so that they cannot drift from what dpsql does.

Every fenced shell, Python and TOML block is either run here or listed in NOT_RUN with the reason."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from dpsql.config import load_settings
from dpsql.schema import parse_schema
from tests.conftest import ROOT, SHIPPED_SCHEMA, copy_database

README = (ROOT / "README.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"^```(\w*)\n(.*?)^```", README, flags=re.M | re.S)
NOT_RUN = {  # the first line of each block that is not run, and why
    "python3 -m venv .venv && . .venv/bin/activate && pip install . && dpsql demo": "CI installs and runs the demo",
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test]' && python -m pytest -q -n 2":
        "this is the test command itself",
    "dpsql analyst add alice --epsilon 5 --delta 1e-5": "a production deployment (tests/test_server.py serves)",
}
README_URL = "postgresql://user@host/db"


def _blocks(language: str) -> list[str]:
    return [body for lang, body in BLOCKS if lang == language and body.splitlines()[0] not in NOT_RUN]


def test_every_block_is_run_or_excused():
    runnable = {"sh", "python", "toml", ""}
    assert {lang for lang, _ in BLOCKS} <= runnable
    listed = {body.splitlines()[0] for lang, body in BLOCKS if lang in ("sh", "python")}
    assert set(NOT_RUN) <= listed, "NOT_RUN names a block the README no longer has"


@pytest.fixture(scope="module")
def fresh_database(server, template) -> str:
    return copy_database(server, template, "dpsql_readme")


def _as_here(text: str, url: str) -> str:
    """The README's text pointing at the test database and the repository's schema."""
    return text.replace(README_URL, url).replace("schemas/demo.toml", str(SHIPPED_SCHEMA))


def test_command_line_examples(fresh_database, tmp_path):
    (block,) = [b for b in _blocks("sh") if b.startswith("export DPSQL_DATABASE")]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    script = "set -e\n" + _as_here(block, fresh_database)
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "(5 rows)" in done.stdout and "removed analyst alice" in done.stdout
    assert (tmp_path / "by_sex.csv").read_text().startswith("sex,avg,avg_ci_low,avg_ci_high\n")
    assert "alice" in (tmp_path / "ledger.html").read_text()


def test_python_examples(fresh_database, engine):
    from dpsql.accounting import Ledger

    ledger = Ledger(fresh_database)
    try:
        with contextlib.suppress(Exception):  # back if the command line's examples removed her, with her spending
            ledger.add_analyst("alice", 5.0, 1e-5)
        ledger.set_budget("alice", ledger.budget("alice").epsilon_spent + 5.0)
    finally:
        ledger.close()
    code = "\n".join(_as_here(block, fresh_database) for block in _blocks("python"))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md", "exec"), {})  # noqa: S102 - the README's own examples
    assert "Rewritten SQL" in printed.getvalue() and "ε spent" in printed.getvalue()


def test_toml_examples(tmp_path):
    for block in _blocks("toml"):
        document = tomllib.loads(block)
        if "privacy" in document:  # a privacy schema
            assert parse_schema(document).tables
            continue
        if "tables" in document:  # tables to add to the demo schema, or settings of its tables
            demo = tomllib.loads(SHIPPED_SCHEMA.read_text(encoding="utf-8"))
            tables = {name: {**demo["tables"].get(name, {}), **table} for name, table in document["tables"].items()}
            assert parse_schema({**demo, "tables": {**demo["tables"], **tables}}).tables
            continue
        config = tmp_path / "dpsql.toml"  # a config file, or the settings of its [dpsql] table
        config.write_text(block if "dpsql" in document else "[dpsql]\n" + block, encoding="utf-8")
        assert load_settings(config).max_client_connections > 0
