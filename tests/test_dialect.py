"""The seam between the rewrite and the engines (`dpsql.sql.dialect`): the rewrite writes dialect nodes, each
backend renders them in its own SQL, and no backend parses SQL text."""

from __future__ import annotations

import ast
from pathlib import Path

from sqlglot import exp

from dpsql.sql import dialect
from dpsql.sql.dialect import Statement

BACKENDS = Path(dialect.__file__).resolve().parent.parent / "backends"


def test_postgresql_spells_each_node_with_its_own_functions():
    statement = Statement.parse(
        "SELECT dpsql_keyed_hash(7, a, b), dpsql_strict_bound(dpsql_strict_bound(x, 0, 'integer', TRUE), 10, "
        "'integer', FALSE), dpsql_row_id(t), CASE WHEN d BETWEEN dpsql_earliest() AND dpsql_latest() THEN d END "
        "FROM dpsql_truncated(events, 7, account_id, 6) AS t")
    sql = statement.sql
    assert "HASHTEXTEXTENDED(CAST(ROW(a, b) AS TEXT), 7)" in sql
    assert "INT8SMALLER(INT8LARGER(x, 0), 10)" in sql
    assert "CAST(t.tableoid AS TEXT) || ':' || CAST(t.ctid AS TEXT)" in sql
    assert "BETWEEN '4000-01-01 BC' AND '294276-12-01'" in sql
    assert "FROM (SELECT * FROM events AS dpsql_t WHERE NOT (dpsql_t.tableoid, dpsql_t.ctid) IN" in sql
    assert "PARTITION BY dpsql_r.account_id" in sql and "dpsql_rank > 6" in sql and ") AS t" in sql
    assert "dpsql_" not in sql.replace("dpsql_t", "").replace("dpsql_r", "").replace("dpsql_x", "").lower()


def test_a_statement_is_rendered_once_per_engine():
    statement, calls = Statement.parse("SELECT dpsql_keyed_hash(1, a) FROM t"), []

    def spell(tree: exp.Expression) -> str:
        calls.append(tree)
        return "rendered"

    assert statement.render("other", spell) == statement.render("other", spell) == "rendered"
    assert len(calls) == 1 and statement.sql == statement.sql
    assert statement.tree.find(exp.Anonymous).name == "dpsql_keyed_hash"  # rendering leaves the tree as written


def test_a_node_at_the_root_is_rendered_too():
    bound = dialect.strict_bound(exp.column("x"), exp.Literal.number(3), "float", larger=True)
    assert dialect.postgres(bound) == "FLOAT8LARGER(x, 3)"


def test_the_rewrite_writes_dialect_nodes_not_postgresql_s_spellings(engine):
    """Queries whose rewrite ranks a unit's rows, clamps a derived count and guards dates: their statements' trees
    hold the dialect nodes, and only PostgreSQL's rendering holds PostgreSQL's functions."""
    names, rendered = set(), ""
    for sql in ("SELECT category, SUM(amount) FROM visits GROUP BY category",
                "SELECT AVG(n) FROM (SELECT person_id, COUNT(*) AS n FROM visits GROUP BY person_id) AS t",
                "SELECT date_trunc('month', day) AS m, COUNT(*) FROM visits GROUP BY 1"):
        statement = engine.prepare(sql).rewritten.statement
        names |= {node.name.lower() for node in statement.tree.find_all(exp.Anonymous)}
        rendered += statement.sql
    assert {dialect.KEYED_HASH, dialect.STRICT_BOUND, dialect.EARLIEST, dialect.LATEST} <= names
    assert not names & {"hashtextextended", "int8larger", "int8smaller"}
    assert "HASHTEXTEXTENDED" in rendered and "INT8SMALLER" in rendered and "4000-01-01 BC" in rendered


def test_no_backend_parses_sql_text():
    """The backends render trees; none calls sqlglot's parser (parse, parse_one, transpile) or builds a tree
    from text (`exp.maybe_parse`, `sqlglot.exp.condition`)."""
    parsers = {"parse", "parse_one", "transpile", "maybe_parse", "condition"}
    for module in sorted(BACKENDS.glob("*.py")):
        tree = ast.parse(module.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sqlglot"):
                assert not {alias.name for alias in node.names} & parsers, module.name
            if isinstance(node, ast.Attribute) and node.attr in parsers:
                assert not (isinstance(node.value, ast.Name) and node.value.id in ("sqlglot", "exp")), module.name


def test_named_locks_make_identical_queries_wait_and_keep_no_name_once_released():
    """Spark's and DuckDB's sessions hold a query's name while they answer it (PostgreSQL's sessions use an
    advisory lock): a second holder of the name waits, and a released name leaves nothing behind."""
    import threading

    from dpsql.backends import NamedLocks

    locks, order = NamedLocks(), []
    locks.acquire("q")
    waiter = threading.Thread(target=lambda: (locks.acquire("q"), order.append("second"), locks.release("q")))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and not order  # waits while the first holds the name
    order.append("first")
    locks.release("q")
    waiter.join(5)
    assert order == ["first", "second"] and not locks._locks
