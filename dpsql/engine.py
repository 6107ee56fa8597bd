"""One query through every stage. This is the only module that knows the order of the stages:

    check (parse, bind, refuse, qualify) -> analyze -> rewrite -> calibrate -> charge -> execute -> noise
    -> post-process

The charge is committed before the rewritten query runs, and only once a working connection to PostgreSQL is
in hand (if none can be had, nothing is charged). An answer already released to the same analyst for the same
canonical query, parameters and ε is returned from the cache at no cost; identical queries sent at once wait
for each other (an advisory lock, across processes too), so they are charged once.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import astuple, replace
from typing import Any

from sqlglot import exp

from dpsql.accounting import NO_COST, Budget, Cost, Ledger, new_hash_seed, validate_query_privacy
from dpsql.analysis import COUNTS, SQUARED, Plan, analyze
from dpsql.answer import Answer, Released, Statistic
from dpsql.backends import Cancellation, Session, open_backend
from dpsql.cached_answers import answer_key, decode_answer, encode_answer
from dpsql.chosen_bounds import (
    RACE_SHARE,
    bounds_totals,
    chosen_histogram_rows,
    chosen_values_note,
    chosen_values_rows,
    counts_race,
    kept_epsilon,
    lent,
    plan_race,
    race_note,
    raceable,
    values_resolvable,
    visible_cut,
)
from dpsql.combining import check_joined, combine, scalar_values, stand_in_row, stand_ins
from dpsql.config import Settings
from dpsql.errors import (
    BackendError,
    BudgetExhausted,
    ConfigError,
    Error,
    InternalError,
    InvalidParameter,
    QueryCancelled,
    UnsupportedQuery,
)
from dpsql.local.estimates import LOCAL_INTERVALS, LocalQuery, answer_local, debias, plan_local
from dpsql.mechanisms.race import EFFECT_SHARE, FALLBACK_SHARE, RAISE_SHARE
from dpsql.noise import Calibration, add_noise, calibrate, noisy_bounds_effect, released_key
from dpsql.postprocess import (
    chosen_value,
    describe_cap,
    describe_chosen,
    describe_selection,
    describe_units_over,
    evaluate,
    finish,
    window_inputs,
)
from dpsql.prepared import Prepared
from dpsql.recent import Recent
from dpsql.released_rows import aggregate_released, pick_released
from dpsql.releases.published import PublishedQuery, exact_rows, plan_published
from dpsql.rewrite import Rewritten, Statement, answered_by_contributions, contributions, rewrite
from dpsql.schema import PrivacySchema, load_schema
from dpsql.schema.catalog import require_catalog
from dpsql.session import OPTION_NAMES, Options
from dpsql.sql import CheckedQuery, check_query, in_analyst_terms, shown_sql, to_sql
from dpsql.sql.compose import Composition, compose
from dpsql.sql.public_keys import MAX_PUBLIC_KEYS, public_key_statements
from dpsql.sql.times import check_time_zones

log = logging.getLogger("dpsql.engine")
PLAN_CACHE_SIZE = 256
UNINDEXED_WORK_MEM = "64MB"  # hashing a million units fits; the server's 4MB default would spill to disk


def _post_processing_refused(error: UnsupportedQuery, plan: Plan, label: str,
                             expr: exp.Expression) -> UnsupportedQuery:
    """`error`, refusing to compute `expr` (`label`) after noise, in the query's own names. Where the expression
    reads group keys and no aggregate, PostgreSQL can compute it on the rows: grouped by it, or a WHERE for a
    HAVING condition."""
    aggregates, keys = {a.name for a in plan.aggregates}, {k.name for k in plan.group_keys}
    read = {c.name for c in expr.find_all(exp.Column)}
    if read & aggregates or not read & keys:
        return UnsupportedQuery(plan.as_written(error.message), error.hint and plan.as_written(error.hint))
    written = plan.as_written(to_sql(expr))
    instead = f"WHERE {written}" if label == "the HAVING condition" else f"GROUP BY {written}"
    return UnsupportedQuery(f"{written} reads only group keys, and dpsql does not compute it after grouping",
                            f"compute it on the rows: {instead}")


class Engine:
    def __init__(self, settings: Settings, schema: PrivacySchema | None = None):
        if not settings.database:
            raise ConfigError("no database given", "pass --database URL, set DPSQL_DATABASE or database= ")
        if schema is None:
            if not settings.schema:
                raise ConfigError("no privacy schema given", "pass --schema FILE or set DPSQL_SCHEMA")
            schema = load_schema(settings.schema)
        self.settings, self.schema = settings, schema
        self.backend = open_backend(settings.database, schema, settings.statement_timeout_ms,
                                    settings.connect_timeout_s, settings.ledger)
        self.ledger = Ledger(settings.ledger or settings.database, connect_wait=settings.connect_timeout_s)
        catalog = self.backend.catalog()  # None on Spark, which holds no keys
        if catalog is not None:
            require_catalog(schema, catalog)  # an owner's mistake stops here, before any analyst is charged for it
        self._unique = catalog.unique if catalog is not None else frozenset()
        self._unique_sets = catalog.unique_sets if catalog is not None else frozenset()
        self._not_null = catalog.not_null if catalog is not None else frozenset()
        self._time_zone = self.backend.time_zone()
        self._zones: tuple[frozenset[str] | None] | None = None  # read when a query first names a zone
        self._indexed = self.backend.indexed_columns()
        self._hash_seed = int(self.ledger.setting("hash_seed", new_hash_seed))
        self._schema_digest = hashlib.sha256(repr(schema).encode()).hexdigest()
        self._plans: Recent[tuple[str, str], tuple[CheckedQuery, Plan, Rewritten]] = Recent(PLAN_CACHE_SIZE)
        self._variants: Recent[tuple, tuple[CheckedQuery, Any]] = Recent(PLAN_CACHE_SIZE)  # `_remembered`

    def close(self) -> None:
        self.backend.close()
        self.ledger.close()

    def health(self) -> dict[str, str | None]:
        """For the data's backend and the ledger: None when it answers now, or why it cannot (the server's /health)."""
        return {"backend": self.backend.health(), "ledger": self.ledger.health()}

    def prepare(self, sql: str, params: Any = None, epsilon: float | None = None,
                options: Options | None = None, rows_per_unit: int | None = None) -> Prepared:
        """Check, analyse, rewrite and price a query without running or charging anything. `options` are the
        query's and session's; `epsilon` overrides theirs. `rows_per_unit`: at most that many rows of each unit,
        below the declared bound (a statement's part that needs fewer, `Composition.rows_per_unit`)."""
        options = self.options(Options(epsilon=epsilon).over(options or Options()))
        query, plan, rewritten = self._plan(sql, params, options.min_frequency)
        if isinstance(plan, LocalQuery | PublishedQuery):
            return Prepared(query, None, None, None, "", options, self.schema.group_size, plan)
        if rows_per_unit is not None and plan.stability is None and plan.rows_per_unit > rows_per_unit:
            plan, rewritten = self._remembered(query, ("rows", rows_per_unit, options.min_frequency),
                                               lambda: self._analysed(query, options.min_frequency, rows_per_unit,
                                                                      public_keys=plan.public_keys))
        fixed_rows = chosen_values_rows(plan, options)
        if fixed_rows is not None:
            declared = plan.rows_per_unit
            plan, rewritten = self._remembered(query, ("chosen values", options.min_frequency), lambda: self._analysed(
                query, options.min_frequency, fixed_rows, public_keys=plan.public_keys))
            plan = replace(plan, notes=[*plan.notes, chosen_values_note(fixed_rows, declared)])  # a copy: cached
        histogram_rows = chosen_histogram_rows(plan, options)
        if histogram_rows is not None:
            plan, rewritten = self._remembered(query, ("chosen histograms", options.min_frequency),
                                               lambda: self._analysed(query, options.min_frequency,
                                                                      public_keys=plan.public_keys,
                                                                      histogram_rows=histogram_rows))
        totals = self._totals_plan(query, plan, options)
        # the counts beside the sum, and partition selection (the groups a unit reaches), need its rows bounded too:
        # raced in the same pass, at half the race's share
        counted = totals is not None and totals.rows_per_unit > 1 and (
            totals.partition_selection or any(m.kind == "count" for m in totals.measures))
        share = RACE_SHARE / 2 if counted else RACE_SHARE
        race = plan_race(totals or plan, options, share)
        rows_race = counts_race(totals, options.epsilon * share, race.steps) \
            if counted and race is not None else None
        epsilon = options.epsilon - sum(r.epsilon for r in (race, rows_race) if r is not None)
        calibration = calibrate(plan, epsilon, self.settings.delta, self.settings.selection_share,
                                options.mechanism, options.histogram)
        key = answer_key(query.canonical, options.epsilon, options.mechanism, options.histogram, self.settings.delta,
                         self.settings.selection_share, plan.max_groups, self._schema_digest,
                         *([plan.min_units] if plan.min_units > 1 else []),
                         *([options.local_estimate] if plan.local_key else []),
                         *(["rows per unit: auto"] if race is not None or fixed_rows is not None else []),
                         *([f"rows per unit: {rows_per_unit}"] if rows_per_unit is not None else []))
        race_statement, race_answers = None, False
        if race is not None:
            rows_caps = rows_race.taus if rows_race is not None else ()
            race_statement = self._remembered(query, ("race", options.min_frequency, race.taus, totals is not None,
                                                rows_caps, race.counts_units),
                                        lambda: self._checked(contributions(
                                            totals or plan, self._hash_seed, race.taus, totals is not None, rows_caps,
                                            self._in_unit_order(plan), values=not race.counts_units)))
            race_answers = answered_by_contributions(totals or plan, totals is not None)
            # a copy: the plan is cached for every ε and option
            plan = replace(plan, notes=[*plan.notes, race_note(plan, totals, race, rows_race, calibration,
                                                               race_answers, options.epsilon)])
        return Prepared(query, plan, rewritten, calibration, key, options, self.schema.group_size, race=race,
                        race_statement=race_statement, race_totals=totals is not None, race_answers=race_answers,
                        rows_race=rows_race)

    def _plan(self, sql: str, params: Any, min_frequency: int) -> tuple[CheckedQuery, Plan | LocalQuery |
                                                                         PublishedQuery, Rewritten | None]:
        """The ε-independent stages, remembered for recently seen (SQL text, parameters, minimum frequency)."""
        cache_key = (sql, repr(params), min_frequency)
        entry = self._plans.get(cache_key)
        if entry is not None:
            return entry
        query = check_query(sql, self.schema, params)
        try:
            check_time_zones(query.tree, self._time_zone_names)
            private = plan_published(query, self.schema) or plan_local(query, self.schema)
            # released data, or reports randomized on the devices, need no noise; anything else is analysed
            entry = (query, private, None) if private is not None else (query, *self._analysed(query, min_frequency))
        except Error as error:  # named as the analyst wrote it, not as a spelling renamed it
            in_analyst_terms(error, query.tree)
            raise
        if query.fresh:  # the same text is another query a moment later
            return entry
        self._plans.put(cache_key, entry)
        return entry

    def _time_zone_names(self) -> frozenset[str] | None:
        if self._zones is None:
            self._zones = (self.backend.time_zone_names(),)
        return self._zones[0]

    def _analysed(self, query: CheckedQuery, min_frequency: int, rows_cap: int | None = None,
                  total_cap: float | None = None, public_keys: dict[str, tuple] | None = None,
                  histogram_rows: int | None = None) -> tuple[Plan, Rewritten]:
        """The plan and rewrite of `query`; `public_keys` as an earlier plan of it read them (None: read them now,
        before anything is charged)."""
        public_keys = self._public_keys(query) if public_keys is None else public_keys
        plan = analyze(query, self.schema, self._unique, self.settings.max_groups_per_unit, min_frequency,
                       self._not_null, rows_cap, self._time_zone, total_cap, self._unique_sets, public_keys,
                       histogram_rows)
        windows = [part for _, window in plan.windows for part in window_inputs(window)]
        known = {**{k.name: None for k in plan.group_keys}, **{a.name: chosen_value(a, 1.0) for a in plan.aggregates},
                 **{name: 1.0 for name, _ in plan.windows}}
        computed = [*((f"column {o.name}", o.expr) for o in plan.outputs), ("the HAVING condition", plan.having),
                    *(("the ORDER BY", o[0]) for o in plan.order), *(("a window", w) for w in windows)]
        for label, expr in computed:
            if expr is None:
                continue
            try:  # refuse post-processing we cannot compute before anything is spent
                evaluate(expr, known)
            except UnsupportedQuery as error:
                raise _post_processing_refused(error, plan, label, expr) from None
            except TypeError:  # values of types that do not combine (a noisy date less a subquery's date)
                raise UnsupportedQuery(f"{label} cannot be computed from the noisy values it reads: their types do "
                                       "not combine after noise", "select those values themselves and combine "
                                       "them in your tool, e.g. SELECT MAX(day), MIN(day) FROM visits") from None
        rewritten = rewrite(plan, self._hash_seed, self._in_unit_order(plan))
        for statement in [rewritten.statement, *rewritten.histogram_statements.values()]:
            self._checked(statement)
        unit_column = plan.unit_column
        if unit_column is not None and self._indexed is not None and unit_column not in self._indexed:
            # no index to read the units in order: PostgreSQL hashes them, in memory rather than on disk
            plan.notes.append(f"no index leads with {unit_column[0]}.{unit_column[1]}, so PostgreSQL hashes every "
                              f"unit to bound its rows; CREATE INDEX ON {unit_column[0]} ({unit_column[1]}) "
                              "would let it group them in index order, usually faster")
            rewritten = replace(rewritten, work_mem=UNINDEXED_WORK_MEM)
        return plan, rewritten

    def _public_keys(self, query: CheckedQuery) -> dict[str, tuple]:
        """The values public tables hold of the query's keys that are their columns (public data, read exactly
        and free, before anything is charged); a key whose values cannot be read keeps partition selection."""
        statements = public_key_statements(query, self.schema)
        found: dict[str, tuple] = {}
        if not statements:
            return found
        with self.backend.session() as backend:
            for key, select in statements.items():
                try:
                    rows = backend.run(Statement(select))
                except BackendError as exc:
                    log.info("the values of public key %s were not read: %s", key, exc)
                    continue
                if len(rows) <= MAX_PUBLIC_KEYS:
                    found[key] = tuple(released_key([row[0] for row in rows]))
        return found

    def _in_unit_order(self, plan: Plan) -> bool:
        """Whether PostgreSQL can read `plan`'s units in order: an index leads with the unit's column."""
        return self._indexed is not None and plan.unit_column in self._indexed

    def prepare_parts(self, sql: str, params: Any = None, epsilon: float | None = None,
                      options: Options | None = None) -> tuple[Composition | None, list[Prepared]]:
        """`prepare` for each part of a UNION or GROUPING SETS statement (each with its share of ε), or for the
        one query of any other statement (with no composition)."""
        composition = compose(sql, params, self.schema, self._not_null, self._unique)
        if composition is None:
            prepared = self.prepare(sql, params, epsilon, options)
            composition = self._distinct_apart(sql, params, prepared)
            if composition is None:
                return None, [prepared]
        if composition.outer is not None:  # computed once over a stand-in row: what cannot be, is refused unpaid
            share = self.options(Options(epsilon=epsilon).over(options or Options())).epsilon / len(composition.parts)
            prepared, *apart = [self.prepare(part, None, share, options, composition.rows_of(n))
                                for n, part in enumerate(composition.parts)]
            names = [o.name for o in prepared.outputs]
            try:  # the analyst's own WHERE, ORDER BY and LIMIT over a stand-in row: what cannot run fails unpaid
                if not composition.picks:
                    aggregate_released(composition.outer, names, [stand_in_row(prepared.outputs)])
                elif not composition.zero_row:  # (the pick of one reported value, which compose wrote, cannot fail)
                    pick_released(composition.outer, names, [stand_in_row(prepared.outputs)], [(None,) * len(names)])
            except Exception as exc:  # noqa: BLE001 - any failure here would come after the charge
                hint = ("pick rows with comparisons of the subquery's columns and a constant LIMIT, e.g. SELECT k, n "
                        "FROM (SELECT k, COUNT(*) AS n, RANK() OVER (ORDER BY COUNT(*) DESC) AS r FROM t GROUP BY k) s "
                        "WHERE r <= 3 ORDER BY r") if composition.picks else (
                    "aggregate the subquery's columns with COUNT, SUM, AVG, MIN, MAX, variance or stddev, e.g. "
                    "SELECT AVG(n) FROM (SELECT k, COUNT(*) AS n FROM t GROUP BY k) s")
                raise UnsupportedQuery(f"the outer query over the subquery's rows cannot be computed after noise "
                                       f"({type(exc).__name__})", hint) from None
            return composition, [prepared, *apart]
        resolved = self.options(Options(epsilon=epsilon).over(options or Options()))
        numbered = list(enumerate(composition.parts))
        parts: list[Prepared] = []
        for n, part in numbered:  # in order: the scalar subqueries' types give the last part its stand-ins
            parts.append(self.prepare(part, stand_ins(composition, n, parts), resolved.epsilon / len(numbered),
                                      options, composition.rows_of(n)))
        charged = [n for n, prepared in enumerate(parts) if prepared.cost != NO_COST]
        if 0 < len(charged) < len(parts):  # a part that reads no private data (the outer step of scalar
            # subqueries without FROM) costs nothing: the others share the whole ε
            for n in charged:
                parts[n] = self.prepare(composition.parts[n], stand_ins(composition, n, parts),
                                        resolved.epsilon / len(charged), options, composition.rows_of(n))
        if composition.joined_outer is not None:
            try:
                check_joined(composition, parts)
            except Exception as exc:  # noqa: BLE001 - any failure here would come after the charge
                raise UnsupportedQuery(f"the outer query over the joined subqueries' rows cannot be computed after "
                                       f"noise ({type(exc).__name__})", "select, compare and combine their columns "
                                       "with arithmetic, e.g. SELECT a.k, a.n, b.s / a.n FROM a JOIN b ON a.k = b.k"
                                       ) from None
        return composition, parts

    def _distinct_apart(self, sql: str, params: Any, prepared: Prepared) -> Composition | None:
        """The statement's one COUNT(DISTINCT x) asked apart from its other aggregates (`compose`), where one race
        of rows per unit would bound them all and a part of its own, at half the ε, could race the values it
        finds instead (`values_resolvable`), or read a declared domain's values present off a count of units per
        value."""
        plan = prepared.plan
        if prepared.race is None or not plan.distinct_values_beside_others:
            return None
        apart = compose(sql, params, self.schema, self._not_null, distinct_apart=True,
                        keys_selected=plan.partition_selection)
        if apart is None or apart.values_present is None and not values_resolvable(
                plan, prepared.options.epsilon / len(apart.parts) * RACE_SHARE):
            return None  # (a declared domain's values present need no race)
        return apart

    def query(self, sql: str, params: Any = None, *, analyst: str, epsilon: float | None = None,
              options: Options | None = None, cancel: Cancellation | None = None) -> Answer:
        """The noisy answer to `sql`, charged to `analyst` (or from the cache, free). `cancel` lets another
        thread stop the query while PostgreSQL runs it (the charge stands: it was made before). A UNION or
        GROUPING SETS statement is answered part by part, each with its share of ε."""
        try:
            composition, parts = self.prepare_parts(sql, params, epsilon, options)  # refusals before any charge
        except Error:
            raise
        except Exception as exc:  # a dpsql bug, before anything ran or was charged
            raise _internal(exc, "the query did not run and was not charged") from exc
        return self._answer_parts(composition, parts, analyst, cancel).without_interval_noted()

    def _answer_parts(self, composition: Composition | None, parts: list[Prepared], analyst: str,
                      cancel: Cancellation | None) -> Answer:
        if composition is None:
            return self._with_bounds_effect(self._query(parts[0], analyst, cancel), parts[0], analyst)
        unpaid = [p for p in parts if not p.free and self.ledger.answers.get(analyst, p.key) is None]
        cost = sum((p.cost for p in unpaid), NO_COST)
        before = self.ledger.budget(analyst)
        if unpaid and not before.plus(cost).within:  # no part runs if the whole cannot be paid
            raise BudgetExhausted(f"privacy budget exhausted: the {len(parts)} parts cost ε={cost.epsilon:g}, "
                                  f"δ={cost.delta:g} but {before.epsilon_left:g}, {before.delta_left:g} are left; "
                                  "nothing was run", "ask a smaller ε, or send fewer parts")
        if not composition.sequential:
            return combine(composition, parts, [self._query(p, analyst, cancel) for p in parts])
        scalars = [self._query(p, analyst, cancel) for p in parts[:-1]]
        last = self.prepare(composition.parts[-1], scalar_values(composition, scalars), parts[-1].options.epsilon,
                            parts[-1].options, composition.rows_of(len(parts) - 1))
        return combine(composition, parts, [*scalars, self._query(last, analyst, cancel)])

    def _with_bounds_effect(self, answer: Answer, prepared: Prepared, analyst: str) -> Answer:
        """`answer` with the bounds' effect when the query's options ask for it (dpsql.bounds_epsilon)."""
        epsilon = prepared.options.bounds_epsilon
        released = self.bounds_effect(analyst, prepared, epsilon) if epsilon and prepared.plan is not None \
            and prepared.already_private is None else None
        if released is None:
            return answer
        return replace(answer, bounds_effect={**released.output, "cached": released.cached},
                       budget=released.budget or answer.budget)

    def _query(self, prepared: Prepared, analyst: str, cancel: Cancellation | None) -> Answer:
        arrived = time.monotonic()
        if prepared.already_private is not None:
            return self._from_private_data(prepared, analyst, cancel)
        if not prepared.plan.aggregates and not prepared.plan.partition_selection:  # the declared domain of the
            # keys: no data read, nothing to pay
            result = finish(prepared.plan, prepared.calibration, add_noise(prepared.plan, prepared.calibration, [], {}))
            return Answer(result.names, result.types, result.rows, result.accuracy, 0.0, 0.0,
                          budget=self.ledger.budget(analyst), noisy=[False] * len(result.names))
        stored = self.ledger.answers.get(analyst, prepared.key)
        if stored is None:
            with self.backend.session(cancel) as backend:  # a working connection before anything is charged
                backend.hold(f"dpsql answer {analyst} {prepared.key}")  # identical queries run one at a time
                stored = self.ledger.answers.get(analyst, prepared.key)  # and the later ones find this answer
                if stored is None:
                    try:
                        return self._answer(analyst, prepared, backend)
                    finally:
                        _wait_until(arrived + self.settings.latency_floor_ms / 1000)
        return decode_answer(stored, prepared, cached=True, budget=self.ledger.budget(analyst))

    def _from_private_data(self, prepared: Prepared, analyst: str, cancel: Cancellation | None) -> Answer:
        """An answer from data already private: released tables answered exactly, or estimates from locally
        randomized reports. Post-processing, so nothing is charged."""
        query = prepared.already_private
        with self.backend.session(cancel) as backend:
            rows = backend.run(query.statement)
        if isinstance(query, PublishedQuery):
            rows = exact_rows(query, rows)
            return Answer([o.name for o in query.outputs], [o.type_name for o in query.outputs], rows,
                          [(None,) * len(query.outputs)] * len(rows), 0.0, 0.0, budget=self.ledger.budget(analyst),
                          noisy=[False] * len(query.outputs))
        result = answer_local(query, rows, prepared.options.local_estimate == "simplex")
        return Answer(result.names, result.types, result.rows, result.accuracy, 0.0, 0.0,
                      budget=self.ledger.budget(analyst), noisy=[o.noisy for o in query.outputs],
                      intervals_cover=LOCAL_INTERVALS)

    def _answer(self, analyst: str, prepared: Prepared, backend: Session) -> Answer:
        """Charge, run, noise and keep a fresh answer (the charge is committed before the statements run)."""
        charged = prepared.cost
        budget = self.ledger.charge(analyst, charged, prepared.key, shown_sql(prepared.query.canonical))
        rows = None
        if prepared.race is not None:  # the rows per unit chosen from the data, then the answer bounded by them
            (truncated,) = self._run_charged(analyst, prepared.key, backend,
                                             [(prepared.race_statement, prepared.rewritten.work_mem)])
            try:
                prepared, rows = self.bounded_by_race(prepared, truncated[0])
            except Exception as exc:
                raise self._bug_after_charge(analyst, prepared.key, exc, "the query ran") from exc
        cost = prepared.calibration
        work_mem = prepared.rewritten.work_mem
        statements = [prepared.rewritten.statement] if prepared.plan.needs_statistics and rows is None else []
        statements += prepared.rewritten.histogram_statements.values()
        read = self._run_charged(analyst, prepared.key, backend, [(s, work_mem) for s in statements])
        if rows is None:
            rows = read.pop(0) if prepared.plan.needs_statistics else []
        histograms = dict(zip(prepared.rewritten.histogram_statements, read, strict=True))
        try:
            groups = add_noise(prepared.plan, cost, rows, histograms)
            groups = debias(prepared.plan.local_key, prepared.plan.count_measures, cost, groups,
                            prepared.options.local_estimate == "simplex")
            result = finish(prepared.plan, cost, groups)
            selection = describe_selection(prepared.plan, cost)  # at the bound the answer used, kept with it
            answer = Answer(result.names, result.types, result.rows, result.accuracy, charged.epsilon, charged.delta,
                            notes=[note for note in (selection, prepared.bound_note, prepared.plan.caveat) if note])
            encoded = encode_answer(answer)
        except Exception as exc:
            raise self._bug_after_charge(analyst, prepared.key, exc, "the query ran") from exc
        stored = self.ledger.answers.keep(analyst, prepared.key, encoded)
        return decode_answer(stored, prepared, cached=False, budget=budget)

    def _totals_plan(self, query: CheckedQuery, plan: Plan, options: Options) -> Plan | None:
        """With rows per unit chosen from the data, the plan whose race bounds each unit's total of the query's one
        sum instead of its rows (`chosen_bounds.bounds_totals`): analysed with that total unbounded, which shapes an
        AVG as a plain sum over a count. None where the query is not of that kind."""
        sums = [a for a in plan.aggregates if a.kind not in COUNTS and a.score is None]  # COUNT(*), COUNT(x) and
        # COUNT(DISTINCT unit) beside: rows raced too; values chosen from histograms keep their own few rows
        if not raceable(plan, options) or not sums or not all(
                a.kind in ("sum", "avg", *SQUARED) and a.arg_range is not None and a.arg_range.lo >= 0 for a in sums):
            return None
        totals = self._remembered(query, ("totals", options.min_frequency), lambda: analyze(
            query, self.schema, self._unique, self.settings.max_groups_per_unit, options.min_frequency,
            self._not_null, None, self._time_zone, math.inf, self._unique_sets, plan.public_keys))  # the race reads it
        return totals if bounds_totals(totals) else None

    def _checked(self, statement: Statement) -> Statement:
        self.backend.check(statement)  # a statement the backend cannot run is refused before any charge
        return statement

    def _remembered(self, query: CheckedQuery, variant: tuple, make: Callable[[], Any]) -> Any:
        """`make()`: an ε-independent stage of `query` that the race needs on every run (its totals plan, the
        plan at the bound it chose, one of a few caps), remembered for the query object that `_plan` keeps per
        SQL text. The entry holds the query itself, so an id reused by another object never matches."""
        key = (id(query), *variant)
        entry = self._variants.get(key)
        if entry is not None and entry[0] is query:
            return entry[1]
        value = make()
        if not query.fresh:  # the same text is another query a moment later
            self._variants.put(key, (query, value))
        return value

    def bounded_by_race(self, prepared: Prepared, truncated: Sequence[float]) -> tuple[Prepared, list[tuple] | None]:
        """The race's choice from its exact values (`truncated`, one per τ; its noise is drawn here): the query
        prepared at the chosen bound, and the rows of its statistics where they are the race's own value at that
        bound (`race_answers`), else None (its statement runs)."""
        race, rows_race = prepared.race, prepared.rows_race
        truncated, rows_truncated = truncated[:len(race.taus)], truncated[len(race.taus):]
        # beside a race over totals, the counts' race shares the fallback's ε: an AVG's denominator at the
        # declared cap is as noisy as its numerator at the cap
        fallback = lent(prepared.calibration, FALLBACK_SHARE) / (2 if rows_race is not None else 1)
        cells = prepared.plan.cells
        decision = race.decide(truncated, fallback, effect_epsilon=lent(prepared.calibration, EFFECT_SHARE),
                               cells=cells, raise_epsilon=lent(prepared.calibration, RAISE_SHARE),
                               visible_cut=visible_cut(prepared.calibration, cells, race.steps))
        rows = None
        if prepared.race_answers and decision.bound < race.taus[-1]:  # one row: the measure, then the units (unread)
            rows = [(truncated[race.taus.index(decision.bound)], 0)]
        rows_decision = rows_race.decide(rows_truncated, fallback, cells=cells) \
            if rows_race is not None else None
        rows_bound = rows_decision.bound if rows_decision is not None else None
        resolved = all(d.tau is not None for d in (decision, rows_decision) if d is not None)
        spent = decision.spent + (rows_decision.spent if rows_decision is not None else 0.0)
        bounded = self._bounded_at(prepared, decision.bound, spent, rows_bound, resolved)
        if decision.bound >= race.taus[-1] and not decision.raise_epsilon:
            note = describe_cap(race.taus[-1], prepared.race_totals, decision.tau)
        elif decision.over is None:  # nothing counted the units over it (`RaceToTheTop.counts_units`)
            note = describe_chosen(decision.bound, prepared.race_totals)
        else:
            note = describe_units_over(decision.over, prepared.race_totals, chosen_only=not prepared.plan.measures,
                                       raised=decision.bound if decision.raise_epsilon else None)
        return replace(bounded, bound_note=note), rows

    def _bounded_at(self, prepared: Prepared, bound: int, spent: float = 0.0, rows_bound: int | None = None,
                    margin_reached_cap: bool = False) -> Prepared:
        """`prepared` answered with at most `bound` rows per unit, or `bound` as each unit's total of its sum (the
        race's choice): analysed, rewritten and calibrated again at the ε the answer keeps, less `spent` where
        the choice took some of it (`RaceToTheTop.decide`); its cost is unchanged (it was charged). Where a race
        could not resolve the data, its cap is the declared bound and the declared plan stands as prepared.
        `rows_bound`: beside a bound on each unit's total, the rows per unit of the counts
        beside the sum (`Prepared.rows_race`), enforced on the same kept rows.
        `margin_reached_cap`: every race resolved the data, so a bound at a cap is a τ times the margin, not the
        fallback to the declared bound: it is analysed as chosen, with no cap on the groups a unit reaches. The
        declared plan would cap them at max_groups_per_unit and drop the rows of a unit's other groups, a bias no
        interval shows: on the peers' data the race for visits by category picks τ = 32 in some answers (k = 128,
        over the cap of 100), and there the declared plan's counts per category came back 7.5-8.7% low."""
        rows = total = None  # at a race's cap, its declared bound
        # a variance's plain sums at the cap would be noisier than its declared plan's sums centred on the range's
        # midpoint (an age's variance: sums of squares up to 100², against 50² centred)
        squares = prepared.race_totals and any(a.kind in SQUARED for a in prepared.plan.aggregates)
        if bound < prepared.race.taus[-1] or margin_reached_cap and not squares:
            total, rows = (bound, None) if prepared.race_totals else (None, bound)
        if rows_bound is not None and (rows_bound < prepared.rows_race.taus[-1] or margin_reached_cap):
            rows = rows_bound  # the counts beside a sum whose totals are bounded: their own race's rows per unit
        if rows is None and total is None:
            plan, rewritten = prepared.plan, prepared.rewritten
        else:
            histogram_rows = chosen_histogram_rows(prepared.plan, prepared.options)
            plan, rewritten = self._remembered(
                prepared.query, ("bounded", prepared.options.min_frequency, rows, total, histogram_rows),
                lambda: self._analysed(prepared.query, prepared.options.min_frequency, rows, total,
                                       prepared.plan.public_keys, histogram_rows))
        def calibrated(epsilon: float) -> Calibration:
            return calibrate(plan, epsilon, self.settings.delta, self.settings.selection_share,
                             prepared.options.mechanism, prepared.options.histogram)
        calibration = prepared.calibration if not spent and plan is prepared.plan else calibrated(
            kept_epsilon(prepared.calibration.cost, spent, calibrated))
        return replace(prepared, plan=plan, rewritten=rewritten, calibration=calibration, race=None,
                       race_statement=None, rows_race=None)

    def release(self, analyst: str, kind: str, queries: list[str], cost: Cost,
                mechanism: Callable[[list[Statistic]], dict], parameters: dict[str, Any]) -> Released:
        """A multi-query release (a density, a tree, a synthetic table): each query is checked, analysed and
        rewritten as any query is, so its declared bounds are enforced; the whole release is charged once, at
        the `cost` its own mechanisms report; `mechanism` gets the exact rows and returns the released output
        (JSON), which is kept: the same release asked again, with the same `parameters` (every setting of the
        mechanism that changes its output: depth, bandwidth, points, rounds), returns the same output at no cost."""
        if cost.epsilon > self.settings.max_epsilon:
            raise InvalidParameter(f"epsilon {cost.epsilon:g} is above the per-query cap of "
                                   f"{self.settings.max_epsilon:g}", "ask for a smaller epsilon; the cap is the "
                                   "max_epsilon setting")
        # the ε given to prepare only prices the query as if it were asked alone; the release's cost is `cost`
        statistics = [self.prepare(sql, epsilon=min(1.0, self.settings.max_epsilon)) for sql in queries]
        for sql, prepared in zip(queries, statistics, strict=True):
            plan = prepared.plan
            if plan is None or plan.partition_selection or plan.histograms or plan.top_k or plan.local_key \
                    or any(m.kind not in ("count", "sum") for m in plan.measures):
                raise UnsupportedQuery(f"a release reads counts and sums over declared domains; {sql} is not one",
                                       "declare a domain for its keys")
        key = answer_key(kind, [p.query.canonical for p in statistics], astuple(cost), self._schema_digest,
                         sorted(parameters.items()))
        text = f"{kind}: " + "; ".join(shown_sql(p.query.canonical) for p in statistics)
        return self._charged_once(analyst, key, text, cost,
                                  [(p.rewritten.statement, p.rewritten.work_mem) for p in statistics],
                                  lambda rows: mechanism([Statistic(p.plan, r)
                                                          for p, r in zip(statistics, rows, strict=True)]))

    def bounds_effect(self, analyst: str, prepared: Prepared, epsilon: float) -> Released | None:
        """How many of the query's units its declared bounds touch (rows left out, values clamped), as noisy
        counts at `epsilon`, charged once (asked again: the same counts, free); None when no bound can drop or
        move data (nothing is charged)."""
        statement = None if prepared.rewritten is None else prepared.rewritten.bounds
        if statement is None:
            return None
        epsilon = validate_query_privacy(epsilon)
        if epsilon > self.settings.max_epsilon:
            raise InvalidParameter(f"dpsql.bounds_epsilon {epsilon:g} is above the per-query cap of "
                                   f"{self.settings.max_epsilon:g}", "ask for a smaller epsilon")
        self.backend.check(statement.statement)  # as the answer's own statements: refused before any charge
        key = answer_key("bounds", prepared.query.canonical, epsilon, self._schema_digest)
        text = f"bounds effect: {shown_sql(prepared.query.canonical)}"
        return self._charged_once(analyst, key, text, Cost.pure(epsilon),
                                  [(statement.statement, prepared.rewritten.work_mem)],
                                  lambda rows: noisy_bounds_effect(statement.labels, rows[0][0], epsilon))

    def _charged_once(self, analyst: str, key: str, text: str, cost: Cost,
                      statements: list[tuple[Statement, str | None]],
                      mechanism: Callable[[list[list[tuple]]], dict]) -> Released:
        """Runs `statements` and keeps `mechanism`'s output of their rows, charged `cost` once under `key`: asked
        again, the kept output comes back at no cost."""
        arrived = time.monotonic()
        stored = self.ledger.answers.get(analyst, key)
        if stored is not None:
            return Released(stored["release"], self.ledger.budget(analyst), cost, cached=True)
        with self.backend.session() as backend:
            backend.hold(f"dpsql release {analyst} {key}")
            stored = self.ledger.answers.get(analyst, key)
            if stored is not None:
                return Released(stored["release"], self.ledger.budget(analyst), cost, cached=True)
            try:  # as a query's: the outcome (or its failure) no sooner than the latency floor
                budget = self.ledger.charge(analyst, cost, key, text)
                rows = self._run_charged(analyst, key, backend, statements)
                try:
                    output = mechanism(rows)
                except Exception as exc:
                    raise self._bug_after_charge(analyst, key, exc, "the release ran") from exc
                stored = self.ledger.answers.keep(analyst, key, {"release": output})
            finally:
                _wait_until(arrived + self.settings.latency_floor_ms / 1000)
        return Released(stored["release"], budget, cost, cached=False)

    def _bug_after_charge(self, analyst: str, key: str, exc: Exception, what: str) -> InternalError:
        """A dpsql bug after the charge, which may depend on the data: like a failure, its charge is settled (asking
        again pays again), and the analyst gets an internal error."""
        with contextlib.suppress(Error):
            self.ledger.settle(analyst, key)
        return _internal(exc, f"{what} and its charge stands")

    def _run_charged(self, analyst: str, key: str, backend: Session,
                     statements: list[tuple[Statement, str | None]]) -> list[list[tuple]]:
        """The rows of each statement of a charged attempt. A failure, timeout or cancel that reaches the analyst
        settles the charge, so asking again is charged again: whether the statements finish depends on the data,
        and a free retry would let the analyst sample it as often as they like. A fault that broke the connection
        released nothing; the unsettled charge pays for the next attempt."""
        try:
            return [backend.run(sql, work_mem) for sql, work_mem in statements]
        except (BackendError, QueryCancelled):
            if not backend.broken:
                with contextlib.suppress(Error):
                    self.ledger.settle(analyst, key)
            raise

    def budget(self, analyst: str) -> Budget:
        return self.ledger.budget(analyst)

    def options(self, options: Options) -> Options:
        """The query's options with every gap filled: session, then settings, then the privacy schema."""
        configured = Options(self.settings.epsilon, self.settings.mechanism, self.settings.histogram)
        resolved = options.over(configured).over(Options(mechanism=self.schema.mechanism, histogram="plain",
                                                         intervals=False, local_estimate="unbiased",
                                                         rows_per_unit=self.schema.rows_per_unit))
        # the schema's minimum frequency is a floor: a session may ask for more, never for less
        resolved = replace(resolved, min_frequency=max(resolved.min_frequency or 1, self.schema.min_frequency))
        for name in OPTION_NAMES:
            resolved = resolved.with_option(name, getattr(resolved, name))
        validate_query_privacy(resolved.epsilon, self.settings.delta)  # the config file's values too
        if resolved.epsilon > self.settings.max_epsilon:
            raise InvalidParameter(f"epsilon {resolved.epsilon:g} is above the per-query cap of "
                                   f"{self.settings.max_epsilon:g}",
                                   "ask for a smaller epsilon; the cap is the max_epsilon setting")
        return resolved


def _internal(exc: Exception, what: str) -> InternalError:
    log.error("internal error in dpsql", exc_info=exc)
    return InternalError(f"internal error in dpsql ({type(exc).__name__}); {what}",
                         "this is a dpsql bug: the log has the details; please report it")


def _wait_until(deadline: float) -> None:
    """Sleep until `deadline` (time.monotonic()): the latency floor, which hides how long the data took to read
    when the answer came sooner (a longer run still shows)."""
    delay = deadline - time.monotonic()
    if delay > 0:
        time.sleep(delay)


__all__ = ["Engine"]
