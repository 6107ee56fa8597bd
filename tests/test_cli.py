"""The command line and the DataFrame door as scripts use them: output formats, exit codes, logs."""

from __future__ import annotations

import csv
import io
import json
import socket
import subprocess
import sys

import pytest

import dpsql
from dpsql.cli import main
from tests.conftest import DEMO_SCHEMA


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def common(base_url, engine, analyst) -> list[str]:
    return ["--database", base_url, "--schema", str(DEMO_SCHEMA), "--analyst", analyst]


def test_version(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["--version"])
    assert stopped.value.code == 0
    assert capsys.readouterr().out.startswith("dpsql 0.")


def test_table_is_aligned_like_psql(capsys, common):
    code, out, _ = _run(capsys, "query", "SELECT sex, COUNT(*) AS n FROM people GROUP BY sex ORDER BY sex", *common)
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith(" sex |") and "95% CI" in lines[0]
    assert set(lines[1]) <= {"-", "+"}
    sex, count = lines[2].split("|")[:2]
    assert sex == " F   "  # text left-aligned
    assert count == count.strip().rjust(len(lines[1].split("+")[1]) - 1) + " "  # numbers right-aligned
    assert lines[4] == "(2 rows)" and any(line.startswith("spent ε = ") for line in lines)


def test_csv_and_json_carry_every_accuracy_measure(capsys, common):
    sql = "SELECT sex, COUNT(*) AS n, percentile_cont(0.5) WITHIN GROUP (ORDER BY age) AS median FROM people " \
          "GROUP BY sex ORDER BY sex"
    code, out, err = _run(capsys, "query", sql, "--format", "csv", "--epsilon", "0.3", *common)
    assert code == 0 and "spent ε = 0.3" in err  # the cost goes to stderr, stdout is only the CSV
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0]) == ["sex", "n", "n_ci_low", "n_ci_high", "median", "median_ci_low", "median_ci_high",
                             "median_rank_error"]
    assert [r["sex"] for r in rows] == ["F", "M"]
    assert float(rows[0]["n_ci_low"]) <= int(rows[0]["n"]) <= float(rows[0]["n_ci_high"])
    assert rows[0]["median_ci_low"] == "" and float(rows[0]["median_rank_error"]) > 0

    code, out, err = _run(capsys, "query", sql, "--format", "json", "--epsilon", "0.3", *common)
    document = json.loads(out)
    assert code == 0 and document["cached"] is True and document["epsilon_spent"] == 0  # the same query again
    assert document["columns"][:2] == ["sex", "n"] and document["rows"][1]["sex"] == "M"
    assert document["budget_left"]["epsilon"] > 0 and "cached answer" in err


def test_budget_and_analysts_in_every_format(capsys, common, base_url):
    code, out, _ = _run(capsys, "budget", "--format", "json", *common)
    row = json.loads(out)["rows"][0]
    assert code == 0 and row["epsilon_total"] == 100 and row["account"] in ("basic", "zCDP")
    code, out, _ = _run(capsys, "analyst", "list", "--format", "csv", "--database", base_url)
    assert code == 0 and out.splitlines()[0].startswith("analyst,epsilon_total,epsilon_spent")
    code, out, _ = _run(capsys, "budget", *common)
    assert code == 0 and out.splitlines()[0].split("|")[0].strip() == "analyst" and "(1 row)" in out


def test_budget_without_an_analyst_lists_everyones(capsys, monkeypatch, common, base_url):
    monkeypatch.delenv("DPSQL_ANALYST", raising=False)
    analyst = common[common.index("--analyst") + 1]
    code, out, _ = _run(capsys, "budget", "--format", "json", "--database", base_url)
    names = [row["analyst"] for row in json.loads(out)["rows"]]
    assert code == 0 and analyst in names


def test_exit_codes(capsys, common, base_url, engine):
    assert _run(capsys, "query", "SELECT * FROM people", *common)[0] == 1  # refused
    assert _run(capsys, "query", "SELEC 1", *common)[0] == 1
    engine.ledger.add_analyst("pauper", 0.1, 1e-6)
    pauper = ["--database", base_url, "--schema", str(DEMO_SCHEMA), "--analyst", "pauper"]
    code, _, err = _run(capsys, "query", "SELECT COUNT(*) FROM people", "--epsilon", "1", *pauper)
    assert code == 3 and "[DP006]" in err
    code, _, err = _run(capsys, "budget", "--database", "postgresql://nobody@127.0.0.1:1/x", "--analyst", "a")
    assert code == 2 and "Connection refused" in err and "[DP013]" in err and "Traceback" not in err
    code, _, err = _run(capsys, "query", "SELECT 1", "--database", base_url, "--schema", str(DEMO_SCHEMA))
    assert code == 4 and "--analyst" in err  # configuration
    code, _, err = _run(capsys, "budget", "--database", base_url, "--analyst", "nobody")
    assert code == 4
    code, _, err = _run(capsys, "schema", "check", "missing.toml")
    assert code == 4 and "--schema" not in err and "check the path" in err
    with pytest.raises(SystemExit) as stopped:
        main(["query"])  # a bad command line
    assert stopped.value.code == 64
    assert _run(capsys)[0] == 64 and _run(capsys, "analyst")[0] == 64


def test_serve_on_a_busy_port_says_so(base_url, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "dpsql.cli", "serve", "--database", base_url, "--schema",
                               str(DEMO_SCHEMA), "--listen", f"127.0.0.1:{port}"],
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 4, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "--listen" in done.stderr
    assert "Traceback" not in done.stderr


def test_fetch_df_matches_fetchall_and_accuracy(base_url, engine, analyst):
    conn = dpsql.connect(database=base_url, schema=str(DEMO_SCHEMA), analyst=analyst, epsilon=0.4)
    sql = "SELECT sex, COUNT(*) AS n, AVG(income) AS income FROM people GROUP BY sex ORDER BY sex"
    cur = conn.cursor()
    rows = cur.execute(sql).fetchall()
    accuracy = cur.accuracy
    frame = conn.cursor().execute(sql).fetch_df()  # the same query: the stored answer, free
    assert list(frame.columns) == ["sex", "n", "n_ci_low", "n_ci_high", "income", "income_ci_low",
                                   "income_ci_high"]
    assert [tuple(r) for r in frame[["sex", "n", "income"]].itertuples(index=False)] == rows
    assert list(frame["n_ci_low"]) == [a[1].ci_low for a in accuracy]
    assert list(frame["income_ci_high"]) == [a[2].ci_high for a in accuracy]
    assert frame.attrs["cached"] is True and frame.attrs["epsilon_spent"] == 0
    fresh = dpsql.read_sql("SELECT COUNT(*) FROM visits", conn, epsilon=0.2)
    assert fresh.attrs["epsilon_spent"] == pytest.approx(0.2) and fresh.attrs["budget_left"]["epsilon"] > 0
    cur.execute("SET dpsql.intervals = on")
    partly = cur.execute(sql)
    assert partly.fetchone()[0] == "F"
    rest = partly.fetch_df()  # the rows not fetched yet; interval columns appear once
    assert list(rest["sex"]) == ["M"] and list(rest.columns).count("n_ci_low") == 1
    conn.close()


def test_budget_states_the_guarantee_for_groups(capsys, common):
    code, out, _ = _run(capsys, "budget", "--group-size", "4", "--format", "json", *common)
    row = json.loads(out)["rows"][0]
    assert code == 0 and row["group_4_epsilon"] == pytest.approx(4 * row["epsilon_spent"], abs=1e-5)
    code, out, _ = _run(capsys, "budget", "--group-size", "3", *common)
    assert "for groups of up to 3 units:" in out


def test_explain_states_the_guarantee_for_groups(demo_schema, base_url, engine):
    import dataclasses

    from dpsql.config import Settings
    from dpsql.engine import Engine
    from dpsql.explain import explain_text

    households = Engine(Settings(database=base_url), dataclasses.replace(demo_schema, group_size=4))
    try:
        text = explain_text(households.prepare("SELECT COUNT(*) FROM people", epsilon=0.5))
    finally:
        households.close()
    assert "Group privacy: for a group of up to 4 units (group_size), this answer is (2, 0)-DP" in text
