"""The analyst's commands: query, explain, the releases (density, tree, synth), ingest, and serve."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace

from dpsql.cli.common import engine_of, require_analyst, settings_of, usage_error
from dpsql.errors import ConfigError
from dpsql.output import cost_line, render_answer, render_rows
from dpsql.session import Options


def query(args: argparse.Namespace) -> int:
    settings = settings_of(args, epsilon=args.epsilon, mechanism=args.mechanism, histogram=args.histogram)
    analyst = require_analyst(settings)
    engine = engine_of(settings)
    try:
        answer = engine.query(args.sql, analyst=analyst, options=_query_options(args))
    finally:
        engine.close()
    print(render_answer(answer, args.format, args.precision))
    if args.format != "table":
        print(cost_line(answer), file=sys.stderr)
    return 0


def _query_options(args: argparse.Namespace) -> Options:
    return Options(bounds_epsilon=args.bounds_epsilon, rows_per_unit=args.rows_per_unit)


def explain(args: argparse.Namespace) -> int:
    from dpsql.explain import explain_statement
    settings = settings_of(args, epsilon=args.epsilon, mechanism=args.mechanism, histogram=args.histogram)
    engine = engine_of(settings)
    try:
        print(explain_statement(*engine.prepare_parts(args.sql, options=_query_options(args))))
    finally:
        engine.close()
    return 0


def _release(args: argparse.Namespace, make) -> dict:
    """Run a release (density, tree) for the configured analyst, closing the engine after."""
    settings = settings_of(args)
    analyst = require_analyst(settings)
    engine = engine_of(settings)
    try:
        return make(engine, analyst)
    finally:
        engine.close()


def density(args: argparse.Namespace) -> int:
    import json

    from dpsql.releases import density, plot_density
    table, _, column = args.column.partition(".")
    if not column:
        usage_error("density takes TABLE.COLUMN")
    output = _release(args, lambda engine, analyst: density(engine, analyst, table, column, args.epsilon, args.delta,
                                                            args.bandwidth, args.points))
    if args.plot:
        plot_density(output, args.plot)
    if args.format == "json":
        print(json.dumps(output, indent=1))
        return 0
    rows = [(round(x, 6), round(y, 8), round(lo, 8), round(hi, 8)) for x, y, lo, hi in
            zip(output["points"], output["density"], output["low"], output["high"], strict=True)]
    print(render_rows([args.column, "density", "ci_low", "ci_high"], rows, "table"))
    print(f"pointwise 95% band ±{output['halfwidth']:.4g}; no (ε, δ) mechanism could promise under "
          f"±{output['lower_bound']:.4g} at one point ({output['halfwidth'] / output['lower_bound']:.2g}×)")
    print(_spent(output))
    return 0


def tree(args: argparse.Namespace) -> int:
    import json

    from dpsql.releases import decision_tree, plot_tree
    from dpsql.releases.tree import render_tree
    features = args.features.split(",")
    output = _release(args, lambda engine, analyst: decision_tree(engine, analyst, args.table, args.label, features,
                                                                  args.epsilon, args.depth, args.bins))
    if args.plot:
        plot_tree(output, args.plot)
    print(json.dumps(output, indent=1) if args.format == "json" else render_tree(output))
    if args.format != "json":
        print(_spent(output))
    return 0


def synth(args: argparse.Namespace) -> int:
    import json

    from dpsql.releases.synth import plot_marginals, publish, synthesize
    output = _release(args, lambda engine, analyst: synthesize(engine, analyst, args.table, args.columns.split(","),
                                                               args.epsilon, args.rounds, args.bins, args.method))
    declaration = publish(output, settings_of(args).database, args.out, args.replace)
    if args.plot:
        plot_marginals(output, args.plot)
    if args.format == "json":
        print(json.dumps(output, indent=1))
        return 0
    how = (f"MWEM, {output['rounds']} rounds; measured: {'; '.join(' × '.join(m) for m in output['measured'])}"
           if output["method"] == "mwem" else "the noisy full table, projected onto counts")
    print(f"{output['rows']} synthetic rows of {', '.join(output['columns'])} written to {args.out} ({how})")
    if declaration:
        print("Declare it in the privacy schema as released data; dpsql then answers its queries exactly, free:")
        print(declaration)
    print(_spent(output))
    return 0


def _spent(output: dict) -> str:
    if output["cached"]:
        return "released before: the same output again, at no cost"
    return f"spent ε = {output['epsilon_spent']:g}, δ = {output.get('delta_spent', 0.0):g} (the whole release)"


def ingest(args: argparse.Namespace) -> int:
    from dpsql.demo import progress_bar
    from dpsql.local.ingest import ingest
    from dpsql.schema import load_schema
    settings = settings_of(args)
    if not settings.database or not settings.schema:
        raise ConfigError("ingest needs a database and a privacy schema", "pass --database URL and --schema FILE")
    loaded = ingest(settings.database, load_schema(settings.schema), args.table, args.file,
                    progress_bar if sys.stderr.isatty() else None)
    print(f"loaded {loaded} rows into {args.table.lower()}; every local column's values were checked as reports")
    return 0


def serve(args: argparse.Namespace) -> int:

    from dpsql.server import serve
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("dpsql").setLevel(args.log_level.upper())
    settings = settings_of(args)
    if args.backend:
        settings = replace(settings, database=args.backend)

    def ready(server) -> None:
        print(f"dpsql serve: listening on {server.listen.host}:{server.port} "
              f"(auth {server.auth_method}{', TLS' if server.tls else ''})", file=sys.stderr, flush=True)

    serve(settings, args.listen, ready)
    return 0
