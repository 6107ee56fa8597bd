"""`dpsql explain`: what a query would cost and why, without running it or spending anything."""

from __future__ import annotations

from sqlglot import exp

from dpsql.accounting import group_guarantee
from dpsql.local.estimates import LocalQuery
from dpsql.mechanisms.histograms import STRUCTURE_PAYS
from dpsql.postprocess import INTERVALS_COVER, lower_bounds
from dpsql.prepared import Prepared
from dpsql.releases.published import PublishedQuery
from dpsql.sql.compose import Composition
from dpsql.sql.query import in_analyst_words


def explain_statement(composition: Composition | None, parts: list[Prepared]) -> str:
    """`explain_text` of a statement: of its one query, or part by part for a UNION or GROUPING SETS."""
    if composition is None:
        return explain_text(parts[0])
    epsilon = sum(p.cost.epsilon for p in parts if p.calibration is not None)
    delta = sum(p.cost.delta for p in parts if p.calibration is not None)
    split = (f"answered part by part, each with 1/{len(parts)} of ε; the statement costs the sum of its parts"
             if len(parts) > 1 else "one query, then post-processing of its answer (no further cost)")
    lines = [f"Statement: {composition.description}, {split}: ε = {epsilon:.6g}, δ = {delta:.3g}"
             + ("; rows released twice are returned once" if composition.distinct else "")
             + ("; ORDER BY / LIMIT act on the released rows" if composition.order or composition.limit is not None
                else "")]
    listed = ", ".join(str(part + 1) for part, _ in composition.key_lists)
    for number, (sql, part) in enumerate(zip(composition.parts, parts, strict=True), start=1):
        lines.append(f"Part {number} of {len(parts)}: {sql}")
        if listed and number == len(parts):  # prepared for a stand-in list: the price holds, the plan is a sketch
            lines.append(f"  (shown for an empty list of keys: run, it keeps the keys part {listed} releases, which "
                         "set its groups and, for a count of distinct values, how many pairs its race may find)")
        lines += [f"  {line}" for line in explain_text(part).splitlines()]
    return "\n".join(lines)


def explain_text(prepared: Prepared) -> str:
    private = prepared.already_private
    if isinstance(private, PublishedQuery):
        return "\n".join(["Plan: released data", *(f"  {n}" for n in private.notes), "Cost: ε = 0, δ = 0", "SQL:",
                          f"  {private.statement.sql}"])
    if private is not None:
        return _explain_local(private)
    plan, cost = prepared.plan, prepared.calibration
    lines = ["Plan:"]
    lines += [f"  {note}" for note in plan.notes]
    if plan.aggregates:
        lines.append(f"Noise ({cost.mechanism.capitalize()}, per group; {INTERVALS_COVER}):")
    for measure in plan.measures:
        mechanism = cost.mechanisms[measure.name]
        if cost.mechanism == "gaussian":
            lines.append(f"  {measure.label}: L2 sensitivity {measure.l2_sensitivity:.6g}, ρ {mechanism.rho:.6g}, "
                         f"σ {mechanism.scale:.6g}, 95% ± {mechanism.ci_halfwidth():.6g}")
        else:
            lines.append(f"  {measure.label}: sensitivity {measure.sensitivity:g}, ε {mechanism.epsilon:.6g}, "
                         f"scale {mechanism.scale:.6g}, 95% ± {mechanism.ci_halfwidth():.6g}")
    for name, chooser in cost.choosers.items():
        agg = plan.aggregate[name]
        lines.append(f"Exponential mechanism for {agg.sql}: {agg.score}-score sensitivity {chooser.sensitivity:g}, "
                     f"ε {chooser.epsilon:.6g}" + (" (monotone)" if chooser.monotone else ""))
    if cost.top_k is not None:
        lines.append(f"Top-{plan.top_k.k} selection: {plan.top_k.k} rounds of the exponential mechanism, ε "
                     f"{cost.top_k.epsilon:.6g} each, count sensitivity {cost.top_k.sensitivity:g}"
                     + (" (monotone)" if cost.top_k.monotone else ""))
    elif plan.top_k is not None:
        lines.append(f"Top-{plan.top_k.k} selection: the noisy counts, which select their own groups, ordered and cut "
                     f"to the first {plan.top_k.k} (post-processing: free)")
    if cost.histogram == "noisefirst":
        lines.append("Histogram: NoiseFirst merges adjacent noisy bins where that lowers the estimated error (free)")
    elif cost.structure is not None:
        st = cost.structure
        lines.append(f"Histogram: ε {st.total.epsilon:.6g} for a noisy total; where a mean bin's square is within "
                     f"1/{STRUCTURE_PAYS} of plain bins' noise variance ({st.fallback.variance:.6g}), StructureFirst "
                     f"into {st.buckets} buckets (ε {st.max_count.epsilon:.6g} for the count clamp, "
                     f"{st.structure_epsilon:.6g} for the boundaries, {st.totals.epsilon:.6g} for bucket totals of "
                     f"scale {st.totals.scale:.6g}); elsewhere plain bins at ε {st.fallback.epsilon:.6g} merged by "
                     "NoiseFirst (StructureFirst would lose there: benchmarks/results/selection.md)")
    if cost.selection is not None:
        sel, counted = cost.selection, plan.selection_counts
        lines.append(f"Partition selection: ε {cost.selection_epsilon:.6g}, δ {cost.cost.approx_delta:.3g}, "
                     f"keep a group when its noisy count of "
                     f"{'units (the released count itself, with all of ε)' if cost.selected_by else counted} "
                     f"reaches {sel.threshold if cost.selected_by else plan.selection_threshold(sel.threshold)}"
                     + (f" (min_frequency = {sel.min_units}: a group of fewer units is released with probability "
                        f"at most δ)" if sel.min_units > 1 else ""))
    lines.append("Output columns:")
    aggregates = plan.aggregate
    measures = {m.name: m for m in plan.measures}
    histograms = plan.histogram
    for output in plan.outputs:
        used = [aggregates[c.name] for c in output.expr.find_all(exp.Column) if c.name in aggregates]
        if not used:
            lines.append(f"  {output.name} ({output.type_name}): exact (a group key or a constant)")
            continue
        parts = []
        for agg in used:
            if agg.chosen:
                parts.append(f"{agg.sql} chosen from {histograms[agg.measures[0]].label}")
                continue
            sources = [f"{measures[m].label} (sensitivity {measures[m].sensitivity:g}, "
                       f"scale {cost.mechanisms[m].scale:.6g})" for m in agg.measures]
            least, _ = lower_bounds(agg, plan, cost)
            best = ""
            if least:  # a bare COUNT or SUM: its interval comes from its one mechanism
                achieved = cost.mechanisms[agg.measures[0]].ci_halfwidth()
                best = (f"; 95% ± {achieved:.6g}, where no mechanism with its ε and δ could promise under "
                        f"±{least:.6g} for one group ({achieved / least:.2g}×)")
            parts.append(f"{agg.sql} from {', '.join(sources)}{best}")
        lines.append(f"  {output.name} ({output.type_name}): {'; '.join(parts)}")
    total = prepared.cost  # the answer's mechanisms, and the race where rows per unit are chosen from the data
    lines.append(f"Cost: ε = {total.epsilon:.6g}, δ = {total.delta:.3g} (zCDP: ρ = {total.rho:.6g}"
                 + (f" beside δ = {total.approx_delta:.3g})" if total.approx_delta else ")"))
    races = [(prepared.race, "each unit's total of the sum" if prepared.race_totals else "rows per unit",
              "sum" if prepared.race_totals else "count"),
             (prepared.rows_race, "rows per unit (the counts beside the sum, the groups a unit reaches)", "count")]
    for race, bounded, truncated in races:
        if race is None:
            continue
        lines.append(f"Bound on {bounded} (dpsql.rows_per_unit = auto): R2T's race over τ = "
                     f"{', '.join(map(str, race.taus))}, ε = {race.epsilon:.6g} of the cost, each truncated "
                     f"{truncated} at its share with sensitivity τ; the answer keeps "
                     f"{_times_chosen(race.margin_for(prepared.plan.cells))} (twice that where the race "
                     "resolves the data coarsely), and its noise above is for the declared bound (the chosen one is "
                     "smaller)")
    bounds = prepared.rewritten.bounds if prepared.rewritten is not None else None
    if bounds is not None and prepared.options.bounds_epsilon:
        lines.append(f"Bounds' effect (dpsql.bounds_epsilon): ε = {prepared.options.bounds_epsilon:.6g} more, once, "
                     "for "
                     f"noisy counts of the units {'; '.join(bounds.labels[1:])}, beside the units read (sensitivity "
                     f"{len(bounds.labels)}: one unit moves each count by at most 1)")
    elif bounds is not None:
        lines.append("Bounds' effect: not estimated; SET dpsql.bounds_epsilon = 0.05 (say) counts, at that ε more, the "
                     "units the bounds cut or clamp")
    if prepared.group_size > 1:
        group_epsilon, group_delta = group_guarantee(total.epsilon, total.delta, prepared.group_size)
        lines.append(f"Group privacy: for a group of up to {prepared.group_size} units (group_size), this answer is "
                     f"({group_epsilon:.6g}, {group_delta:.3g})-DP: (kε, k·e^((k−1)ε)·δ)")
    lines = in_analyst_words("\n".join(lines), prepared.query.tree).split("\n")  # (one walk of the tree; the SQL
    # below keeps dpsql's names)
    if not plan.aggregates:
        lines.append("Rewritten SQL: none (the answer is the declared domain; PostgreSQL is not asked)")
        return "\n".join(lines)
    lines.append("Rewritten SQL:")
    lines.append(f"  {prepared.rewritten.sql}")
    for name, sql in prepared.rewritten.histograms.items():
        lines.append(f"  {histograms[name].label}: {sql}")
    if bounds is not None and prepared.options.bounds_epsilon:
        lines.append(f"  bounds' effect: {bounds.statement.sql}")
    if prepared.race is not None:
        values = "sums, then counts" if prepared.rows_race is not None else "counts"
        lines.append(f"  the race's truncated {values} (first): {prepared.race_sql}")
    return "\n".join(lines)


def _explain_local(local: LocalQuery) -> str:
    lines = ["Plan: estimates from locally randomized reports"]
    lines += [f"  {note}" for note in local.notes]
    lines.append("Output columns:")
    for output in local.outputs:
        what = ("an unbiased estimate with its 95% interval (exact variance)" if output.noisy
                else "exact (a public key, or the number of rows of a public table)")
        lines.append(f"  {output.name} ({output.type_name}): {what}")
    lines.append("Cost: ε = 0, δ = 0 (nothing is charged: each report was randomized before collection)")
    lines.append("SQL (counts of reports):")
    lines.append(f"  {local.statement.sql}")
    return "\n".join(lines)


def _times_chosen(margin: int) -> str:
    """A race's margin as explain says it."""
    return "the chosen τ" if margin == 1 else f"{margin} times the chosen τ"
