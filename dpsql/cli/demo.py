"""`dpsql demo`: the demo data on an embedded PostgreSQL (or Spark, or DuckDB), its queries, and a kept server."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

from dpsql.cli.common import DEMO_ANALYST, ledger_of
from dpsql.config import Settings, load_settings
from dpsql.errors import Error
from dpsql.output import render_answer


def demo(args: argparse.Namespace) -> int:
    from importlib.resources import files

    from dpsql.demo import DEMO_QUERIES, load_demo_data, progress_bar
    from dpsql.embedded import EmbeddedPostgres
    from dpsql.engine import Engine

    if args.stop:
        EmbeddedPostgres.stop_kept(args.stop)
        print(f"stopped the embedded PostgreSQL in {args.stop} (its files stay; delete the directory to remove them)")
        return 0
    schema_path = str(files("dpsql") / "schemas" / "demo.toml")
    server = EmbeddedPostgres(args.data_dir, keep=args.keep)
    print("Starting an embedded PostgreSQL ...", file=sys.stderr)
    url = server.start()
    try:
        started = time.monotonic()
        counts = load_demo_data(url, people=args.people, progress=progress_bar)
        print(f"Loaded {counts['people']:,} people, {counts['visits']:,} visits, {counts['prescriptions']:,} "
              f"prescriptions and {counts['states']} states in {time.monotonic() - started:.1f} s.\n")
        settings = load_settings(None, database=url, schema=schema_path)
        if args.backend == "spark":
            settings = _spark_demo_settings(url, schema_path, Path(server.data_dir))
        elif args.backend == "duckdb":
            settings = _duckdb_demo_settings(url, schema_path, Path(server.data_dir))
        engine = Engine(settings)
        try:
            with contextlib.suppress(Error):  # the analyst may remain from an earlier run with --keep
                engine.ledger.add_analyst(DEMO_ANALYST, 10.0, 1e-4)
            for title, sql in DEMO_QUERIES:
                print(f"-- {title}\n{sql}")
                try:
                    print(render_answer(engine.query(sql, analyst=DEMO_ANALYST, epsilon=0.5), "table"))
                except Error as exc:
                    if args.backend != "spark":
                        raise
                    print(f"not on Spark: {exc}")  # e.g. a parent link, whose key Spark cannot verify
                print()
        finally:
            engine.close()
        if args.serve:
            _demo_serve(url, schema_path, args.listen, args.keep)
        elif args.keep:
            print("Connect from Python (a PEP 249 module):\n")
            print("    import dpsql")
            print(f'    conn = dpsql.connect(database="{url}",\n'
                  f'                         schema="{schema_path}", analyst="{DEMO_ANALYST}")')
            print('    cur = conn.cursor(); cur.execute("SELECT AVG(age) FROM people"); print(cur.fetchall())')
        else:
            print("The embedded PostgreSQL stops now. To query the demo data yourself, run `dpsql demo --serve` "
                  "(psql, BI tools) or `dpsql demo --keep` (Python).")
        if args.keep:
            print(f"\nThe embedded PostgreSQL keeps running with its data in {server.data_dir}.\n"
                  f"Stop it with:  dpsql demo --stop {server.data_dir}")
    finally:
        server.stop()
    return 0


def _spark_demo_settings(url: str, schema_path: str, data_dir: Path) -> Settings:
    """The demo's tables as Parquet beside the embedded PostgreSQL's files, and a schema that points at them."""
    from dpsql.demo import export_parquet, spark_schema_text

    print("Writing the demo tables as Parquet for Spark ...", file=sys.stderr)
    paths = export_parquet(url, data_dir / "parquet")
    schema = data_dir / "demo_spark.toml"
    schema.write_text(spark_schema_text(Path(schema_path).read_text(encoding="utf-8"), paths), encoding="utf-8")
    print("Starting a local Spark session ...", file=sys.stderr)
    return load_settings(None, database="spark://local[2]", ledger=url, schema=str(schema))


def _duckdb_demo_settings(url: str, schema_path: str, data_dir: Path) -> Settings:
    """The demo's tables in a DuckDB file (with their keys) beside the embedded PostgreSQL's files."""
    from dpsql.demo import duckdb_file

    print("Writing the demo tables to a DuckDB file ...", file=sys.stderr)
    return load_settings(None, database=f"duckdb:///{duckdb_file(url, data_dir)}", ledger=url, schema=schema_path)


def _demo_serve(url: str, schema_path: str, listen: str, keep: bool) -> None:
    """`dpsql demo --serve`: give the demo analyst a password and serve the demo database until Ctrl-C."""
    import secrets

    from dpsql.server import serve
    from dpsql.server.auth import scram_verifier
    password = secrets.token_urlsafe(9)
    host = listen.rpartition(":")[0] or "127.0.0.1"
    settings = load_settings(None, database=url, schema=schema_path, metrics_listen=f"{host}:0")
    with ledger_of(settings) as ledger:
        ledger.set_verifier(DEMO_ANALYST, scram_verifier(password))

    def ready(server) -> None:
        print(f"dpsql serve is listening on {server.listen.host}:{server.port}. Connect with:\n\n"
              f'    psql "postgresql://{DEMO_ANALYST}:{password}@{server.listen.host}:{server.port}/demo"\n\n'
              "and try:  SELECT sex, COUNT(*), AVG(income) FROM people GROUP BY sex;\n"
              "          SET dpsql.epsilon = 0.1;  SHOW dpsql.budget;\n"
              f"Prometheus metrics: http://{server.listen.host}:{server.metrics_port}/metrics\n"
              "Press Ctrl-C to stop the server" + ("." if keep else " and the embedded PostgreSQL."), flush=True)

    serve(settings, listen, ready)
