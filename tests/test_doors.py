"""The DB-API module and the command line, as their users call them."""

from __future__ import annotations

import re

import psycopg
import pytest

import dpsql
from dpsql import errors
from dpsql.cli import main
from tests.conftest import DEMO_SCHEMA


@pytest.fixture
def conn(engine, analyst, base_url):
    connection = dpsql.connect(database=base_url, schema=str(DEMO_SCHEMA), analyst=analyst, epsilon=1.0)
    yield connection
    connection.close()


def test_module_globals():
    assert dpsql.apilevel == "2.0" and dpsql.paramstyle == "pyformat" and dpsql.threadsafety == 1
    assert issubclass(dpsql.ProgrammingError, dpsql.DatabaseError)
    assert issubclass(dpsql.DatabaseError, dpsql.Error)
    assert issubclass(errors.BudgetExhausted, dpsql.OperationalError)
    assert issubclass(errors.UnsupportedQuery, dpsql.NotSupportedError)


def test_execute_fetch_and_description(conn):
    cur = conn.cursor()
    assert cur.description is None and cur.rowcount == -1
    cur.execute("SELECT sex, COUNT(*) AS n, AVG(income) FROM people WHERE age >= %(min_age)s GROUP BY sex",
                {"min_age": 18})
    names = [d[0] for d in cur.description]
    assert names == ["sex", "n", "avg"]
    assert cur.description[0][1] == dpsql.STRING
    assert cur.description[1][1] == dpsql.NUMBER and cur.description[2][1] == dpsql.NUMBER
    assert cur.rowcount == 2
    first = cur.fetchone()
    rest = cur.fetchall()
    assert first[0] == "F" and len(rest) == 1 and cur.fetchone() is None
    assert cur.epsilon_spent == pytest.approx(1.0)
    assert len(cur.accuracy) == 2 and cur.accuracy[0][1].ci_low <= first[1] <= cur.accuracy[0][1].ci_high


def test_positional_parameters_and_iteration(conn):
    cur = conn.cursor()
    cur.execute("SELECT COUNT(*) FROM visits WHERE category = %s AND amount > %s", ("lab", 10.5))
    rows = list(cur)
    assert len(rows) == 1 and isinstance(rows[0][0], int)
    cur.execute("SELECT COUNT(*) FROM visits WHERE category = $1", ["dental"])
    assert cur.fetchmany(5)[0][0] >= 0


def test_errors_are_pep249_classes_with_codes(conn):
    cur = conn.cursor()
    with pytest.raises(dpsql.NotSupportedError) as caught:
        cur.execute("SELECT COUNT(*) FROM people WHERE random() < 0.5")
    assert caught.value.code == "DP002" and caught.value.hint
    with pytest.raises(dpsql.ProgrammingError):
        cur.execute("SELECT income FROM people")
    with pytest.raises(dpsql.DataError):
        cur.execute("SELECT COUNT(*) FROM people WHERE age > %s", (float("nan"),))
    with pytest.raises(dpsql.ProgrammingError):
        cur.fetchall()  # the failed execute left no result
    cur.execute("SELECT COUNT(*) FROM people")  # the connection is still usable
    assert cur.fetchone()[0] > 0


def test_closed_connection(conn):
    cur = conn.cursor()
    conn.close()
    with pytest.raises(dpsql.InterfaceError):
        cur.execute("SELECT COUNT(*) FROM people")


def test_unknown_analyst_fails_at_connect(base_url, engine):
    with pytest.raises(errors.UnknownAnalyst):
        dpsql.connect(database=base_url, schema=str(DEMO_SCHEMA), analyst="nobody")


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_query_explain_budget(capsys, base_url, engine, analyst):
    common = ["--database", base_url, "--schema", str(DEMO_SCHEMA), "--analyst", analyst]
    code, out, _ = _run(capsys, "query", "SELECT COUNT(*) FROM people", "--epsilon", "0.5", *common)
    assert code == 0 and "95% CI" in out and "spent ε = 0.5" in out
    code, out, _ = _run(capsys, "explain", "SELECT category, SUM(amount) FROM visits GROUP BY category", *common)
    assert code == 0 and "sensitivity 10000" in out and "Rewritten SQL" in out and "dpsql_ranked" in out
    code, out, _ = _run(capsys, "budget", *common)
    assert code == 0 and analyst in out and "99.5" in out
    code, out, _ = _run(capsys, "explain", "SELECT category, COUNT(*) FROM visits GROUP BY category",
                        "--mechanism", "gaussian", *common)
    assert code == 0 and "Noise (Gaussian" in out and "L2 sensitivity 10" in out and "ρ" in out
    code, out, _ = _run(capsys, "query", "SELECT age, COUNT(*) FROM people GROUP BY age", "--histogram",
                        "noisefirst", "--epsilon", "0.1", *common)
    assert code == 0 and "spent ε = 0.1" in out


def test_cli_errors_say_what_and_how(capsys, base_url, engine, analyst):
    common = ["--database", base_url, "--schema", str(DEMO_SCHEMA), "--analyst", analyst]
    code, _, err = _run(capsys, "query", "SELECT * FROM people", *common)
    assert code == 1 and "error:" in err and "[DP003]" in err and "hint:" in err


def test_cli_analysts(capsys, base_url, engine):
    code, out, _ = _run(capsys, "analyst", "add", "carol", "--epsilon", "3", "--database", base_url)
    assert code == 0 and "carol" in out
    code, out, _ = _run(capsys, "analyst", "grant", "carol", "--epsilon", "2", "--database", base_url)
    assert code == 0 and "5" in out
    code, out, _ = _run(capsys, "analyst", "list", "--database", base_url)
    assert "carol" in out
    code, _, err = _run(capsys, "analyst", "add", "carol", "--epsilon", "1", "--database", base_url)
    assert code == 1 and "already exists" in err
    code, _, err = _run(capsys, "analyst", "add", "dave", "--epsilon", "nan", "--database", base_url)
    assert code == 1 and "epsilon" in err
    code, out, _ = _run(capsys, "analyst", "remove", "carol", "--database", base_url)
    assert code == 0


def test_cli_schema_check(capsys, tmp_path):
    code, out, _ = _run(capsys, "schema", "check", str(DEMO_SCHEMA))
    assert code == 0 and "people.person_id" in out
    bad = tmp_path / "bad.toml"
    bad.write_text('[privacy]\nunit = "people.person_id"\n[tables.people.columns]\n'
                   'age = { type = "integer", lower = 10, upper = 1 }\n'
                   '[tables.visits]\nmax_rows_per_unit = 0\n[tables.visits.columns]\namount = "money"\n')
    code, _, err = _run(capsys, "schema", "check", str(bad))
    assert code == 4  # configuration
    assert "people.age has lower 10 > upper 1" in err
    assert "[tables.visits] is private but has no unit_column" in err
    assert "visits.amount has type 'money'" in err


def test_session_options_set_show_reset(conn):
    cur = conn.cursor()
    cur.execute("SET dpsql.mechanism = 'gaussian'")
    assert cur.description is None and cur.rowcount == -1
    with pytest.raises(dpsql.ProgrammingError):
        cur.fetchall()
    cur.execute("SHOW dpsql.mechanism")
    assert cur.description[0][0] == "dpsql.mechanism" and cur.fetchall() == [("gaussian",)]
    cur.execute("SET dpsql.epsilon TO 0.25")
    cur.execute("SELECT COUNT(*) FROM visits")
    assert cur.epsilon_spent == pytest.approx(0.25)
    assert "Noise (Gaussian" in conn.explain("SELECT COUNT(*) FROM visits")
    cur.execute("SELECT COUNT(*) FROM visits", mechanism="laplace", epsilon=0.5)  # this query only
    assert cur.epsilon_spent == pytest.approx(0.5)
    cur.execute("RESET dpsql.mechanism")
    cur.execute("SHOW dpsql.mechanism")
    assert cur.fetchone() == ("laplace",)
    cur.execute("SHOW dpsql.budget")
    assert "spent" in cur.fetchone()[0]
    with pytest.raises(dpsql.DataError) as caught:
        cur.execute("SET dpsql.mechanism = 'cauchy'")
    assert "laplace, gaussian" in str(caught.value) and caught.value.sqlstate == "22023"
    with pytest.raises(dpsql.DataError) as caught:
        cur.execute("SET dpsql.nonsense = 1")
    assert "dpsql.histogram" in caught.value.hint
    with pytest.raises(dpsql.InterfaceError):
        cur.execute("SELECT COUNT(*) FROM people", colour="blue")


def test_interval_columns_on_request(conn):
    cur = conn.cursor()
    cur.execute("SHOW dpsql.intervals")
    assert cur.fetchone() == ("off",)
    cur.execute("SET dpsql.intervals = on")
    cur.execute("SELECT sex, COUNT(*) AS n, percentile_cont(0.5) WITHIN GROUP (ORDER BY age) AS mid FROM people "
                "GROUP BY sex")
    assert [d[0] for d in cur.description] == ["sex", "n", "n_ci_low", "n_ci_high", "mid", "mid_ci_low",
                                               "mid_ci_high"]
    for row, accuracy in zip(cur.fetchall(), cur.accuracy, strict=True):
        assert row[2] <= row[1] <= row[3] and (row[2], row[3]) == (accuracy[1].ci_low, accuracy[1].ci_high)
        assert row[5] is None and row[6] is None  # a median reports a rank error, not an interval
    with pytest.raises(dpsql.DataError):
        cur.execute("SET dpsql.intervals = perhaps")


def test_every_door_says_why_groups_may_be_missing_and_how_to_get_them_all(conn, capsys, base_url, analyst,
                                                                           served):
    """Private keys go through partition selection: each door says the (public) threshold and a query that
    releases every group, never how many groups fell below it."""
    sql = "SELECT state, COUNT(*) FROM people GROUP BY state"
    cur = conn.cursor()
    cur.execute(sql)
    (note,) = cur.notes
    assert "groups are released only where a noisy count of their units reaches" in note
    assert "a column with a declared domain instead of people.state" in note
    cur.execute("SELECT sex, COUNT(*) FROM people GROUP BY sex")  # a declared domain: every group, no note
    assert cur.notes == []
    code = main(["query", "SELECT date_trunc('day', day), COUNT(*) FROM visits WHERE category = 'lab' GROUP BY 1",
                 "--database", base_url, "--schema", str(DEMO_SCHEMA), "--analyst", analyst])
    out = capsys.readouterr().out
    assert code == 0 and "Note: groups are released only where" not in out  # the periods are public
    main(["query", "SELECT CAST(day AS text), COUNT(*) FROM visits WHERE category = 'lab' GROUP BY 1", "--database",
          base_url, "--schema", str(DEMO_SCHEMA), "--analyst", analyst])  # text: private (day itself is public)
    out = capsys.readouterr().out
    assert "Note: groups are released only where" in out and "date_trunc('month', visits.day)" in out
    notices = []
    with psycopg.connect(served.dsn(), autocommit=True) as wire:
        wire.add_notice_handler(lambda diagnostic: notices.append(diagnostic.message_primary))
        wire.execute(sql).fetchall()
    assert any(n.startswith("dpsql: groups are released only where") for n in notices), notices


DOOR_STATEMENTS = [
    "SELECT code, name FROM states WHERE region = 'West' ORDER BY code",  # public tables only: exact and free
    "SELECT s.region, COUNT(*) AS n FROM states s GROUP BY s.region ORDER BY s.region",
    "SELECT sex, COUNT(*) AS n FROM people GROUP BY sex ORDER BY sex",  # noisy: the first door's, kept for the rest
    "SELECT age FROM people",  # refused alike
    "SELECT sex, bool_or(age > 30) AS older FROM people GROUP BY sex ORDER BY sex",  # read off a noisy count
    "SELECT COUNT(*) AS n FROM screenings WHERE positive",  # picked from the counts per reported value
    "SELECT * FROM states ORDER BY code LIMIT 3",
    "SELECT region, COUNT(*) AS n FROM survey GROUP BY region ORDER BY region",
    "SELECT smoker, COUNT(*) AS n FROM survey GROUP BY smoker ORDER BY smoker",
    "SELECT COUNT(*) FROM checkins WHERE hour BETWEEN 9 AND 17",
    "WITH a AS (SELECT sex, COUNT(*) AS n FROM people GROUP BY sex), b AS (SELECT sex, AVG(age) AS m FROM people "
    "GROUP BY sex) SELECT a.sex, a.n, b.m FROM a JOIN b ON a.sex = b.sex ORDER BY 1",  # released rows joined
    "SELECT sex, COALESCE(a.n, 0) AS young, CASE WHEN b.n > a.n THEN 'older' ELSE 'younger' END AS more FROM "
    "(SELECT sex, COUNT(*) AS n FROM people WHERE age < 40 GROUP BY sex) a FULL JOIN (SELECT sex, COUNT(*) AS n "
    "FROM people WHERE age >= 40 GROUP BY sex) b USING (sex) ORDER BY 1",  # typed text, bigint, text on the wire
    "SELECT sex, n FROM (SELECT sex, COUNT(*) AS n, RANK() OVER (ORDER BY COUNT(*) DESC) AS r FROM people "
    "GROUP BY sex) t WHERE r = 1",  # a row picked after a window
    "SELECT CASE WHEN t.n >= 3 THEN 'frequent' ELSE 'occasional' END AS segment, COUNT(*) AS visits, "
    "COUNT(DISTINCT v.category) AS kinds FROM visits v JOIN (SELECT person_id, COUNT(*) AS n FROM visits "
    "GROUP BY person_id) t ON t.person_id = v.person_id GROUP BY 1 ORDER BY 1",  # a per-unit subquery joined
    "SELECT p.sex, COUNT(DISTINCT v.category) AS kinds FROM visits v JOIN people p USING (person_id) GROUP BY 1",
    "SELECT category, COUNT(*) AS n FROM (SELECT v.*, ROW_NUMBER() OVER (PARTITION BY person_id ORDER BY day) AS rn "
    "FROM visits v) t WHERE rn = 1 GROUP BY 1 ORDER BY 1",  # each person's first visit: a windowed source
    "SELECT p.sex, COUNT(t.amount) AS n FROM people p LEFT JOIN LATERAL (SELECT amount FROM visits v WHERE "
    "v.person_id = p.person_id ORDER BY day DESC LIMIT 1) t ON true GROUP BY 1 ORDER BY 1",  # their latest, LATERAL
    "SELECT m.month, COALESCE(t.n, 0) AS n FROM generate_series(1, 3) m(month) LEFT JOIN (SELECT EXTRACT(MONTH FROM "
    "day)::int AS month, COUNT(*) AS n FROM visits GROUP BY 1) t ON t.month = m.month ORDER BY 1",  # gaps filled
    "SELECT p.sex, AVG((SELECT COUNT(*) FROM visits v WHERE v.person_id = p.person_id)) AS n FROM people p "
    "GROUP BY 1 ORDER BY 1",  # a correlated subquery, as a join
    "SELECT trunc(age, -1) AS decade, COUNT(*)::text AS n FROM people WHERE age < 30 GROUP BY 1 ORDER BY 1",
    "SELECT COUNT(*) / 0 FROM people",  # PostgreSQL's 22012 at each door, nothing charged
    "SELECT version()",  # what clients ask on connecting: PostgreSQL's own answer, free
    "SELECT EXTRACT(YEAR FROM age(DATE '2024-12-31', DATE '2000-01-01')) AS years",  # constants only
]


def test_the_three_doors_give_the_same_answer_to_the_same_statement(served, capsys):
    """One list of statements through `dpsql serve`, the DB-API and `dpsql query`, for one analyst on one ledger:
    the same rows (a noisy answer is kept and returned to each door alike) or the same refusal."""
    import decimal
    import json

    def wire(sql: str):
        with psycopg.connect(served.dsn(), autocommit=True) as conn:
            try:
                return [tuple(row) for row in conn.execute(sql).fetchall()]
            except psycopg.Error as exc:
                return exc.sqlstate

    def dbapi(sql: str):
        with dpsql.connect(database=served.url, schema=str(DEMO_SCHEMA), analyst="ana") as conn:
            try:
                return [tuple(row) for row in conn.cursor().execute(sql).fetchall()]
            except dpsql.Error as exc:
                return exc.sqlstate

    def cli(sql: str):
        code = main(["query", sql, "--database", served.url, "--schema", str(DEMO_SCHEMA), "--analyst", "ana",
                     "--format", "json"])
        out, err = capsys.readouterr()
        if code != 0:
            found = re.search(r"SQLSTATE (\w{5})|\[(DP\d+)\]", err)
            return found.group(1) or found.group(0)
        return [tuple(row[name] for name in row if not name.endswith(("_ci_low", "_ci_high")))
                for row in json.loads(out)["rows"]]

    refused = {f"[{kind.code}]": kind.sqlstate for kind in vars(errors).values()
               if isinstance(kind, type) and issubclass(kind, errors.Error) and hasattr(kind, "code")}
    def numbers(rows):  # a numeric is a Decimal in Python and a number in JSON
        if isinstance(rows, str):
            return rows
        return [tuple(float(v) if isinstance(v, decimal.Decimal) else v for v in row) for row in rows]

    for sql in DOOR_STATEMENTS:
        answers = [numbers(wire(sql)), numbers(dbapi(sql)), cli(sql)]
        if isinstance(answers[2], str):
            answers[2] = refused.get(answers[2], answers[2])
        assert answers[0] == answers[1] == answers[2], (sql, answers)
    with dpsql.connect(database=served.url, schema=str(DEMO_SCHEMA), analyst="ana") as conn:
        cur = conn.cursor().execute(DOOR_STATEMENTS[0])
        with psycopg.connect(served.url) as direct:
            assert cur.fetchall() == direct.execute(DOOR_STATEMENTS[0]).fetchall() and cur.epsilon_spent == 0


def test_current_database_is_the_database_each_door_was_opened_on(served):
    """Clients ask current_database() on connecting: the DB-API (and `dpsql query`) answer with the database of
    their URL, free, where they refused it; the wire port answers with the name the client connected under."""
    with dpsql.connect(database=served.url, schema=str(DEMO_SCHEMA), analyst="ana") as conn:
        cur = conn.cursor().execute("SELECT current_database()")
        named = psycopg.conninfo.conninfo_to_dict(served.url)["dbname"]
        assert cur.fetchall() == [(named,)] and cur.epsilon_spent == 0
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        assert conn.execute("SELECT current_database()").fetchone()[0] == conn.info.dbname


def test_the_command_line_shows_numbers_to_the_precision_the_noise_allows(capsys, base_url, analyst):
    from dpsql.output import _decimals
    from dpsql.postprocess import Accuracy

    assert _decimals(Accuracy(1.0, 41234.5 - 1234.5, 41234.5 + 1234.5)) == -2  # ±1,234: to the hundred
    assert _decimals(Accuracy(1.0, 0.5 - 0.042, 0.5 + 0.042)) == 3
    base = ["--database", base_url, "--schema", str(DEMO_SCHEMA), "--analyst", analyst]
    sql = "SELECT AVG(income) AS mean, COUNT(*) AS n FROM people"
    assert main(["query", sql, *base]) == 0
    table = capsys.readouterr().out.splitlines()[2]
    assert main(["query", sql, "--precision", "full", *base]) == 0
    full = capsys.readouterr().out.splitlines()[2]
    assert main(["query", sql, "--format", "csv", *base]) == 0
    csv_row = capsys.readouterr().out.splitlines()[1]
    mean, shown = float(csv_row.split(",")[0]), float(table.split("|")[0])
    assert shown != mean and abs(shown - mean) < 100 and float(full.split("|")[0]) == pytest.approx(mean, rel=1e-5)
    assert "." not in table.split("|")[2]  # a count and its interval are whole numbers
