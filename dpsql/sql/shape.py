"""Shape: after merging, a query is one flat SELECT. It may read FROM one grouped subquery (a per-unit
table, analysed by `analysis.derived`) or a windowed source (a table's rows with windows over each unit's rows,
`analysis.windowed`), and its WHERE may hold EXISTS / IN (SELECT ...) semijoins over plain
SELECTs; anything else nested is refused. `x NOT IN (SELECT c ...)` is read so that NULLs cannot make one unit
flip every row."""

from __future__ import annotations

import itertools
import math

from sqlglot import exp

from dpsql.errors import UnsupportedQuery
from dpsql.schema import PrivacySchema
from dpsql.sql.query import AGGREGATES, output_name, replace_keeping_precedence, signed_literal

# the clauses of a SELECT beyond its one FROM table and WHERE (a windowed source has none of them)
BEYOND_WHERE = ("joins", "group", "having", "distinct", "order", "limit", "offset", "with_", "qualify", "windows")


def filters_as_case(tree: exp.Select) -> exp.Select:
    """`agg(x) FILTER (WHERE c)` is `agg(CASE WHEN c THEN x END)`: the rows c rejects become NULL, which every
    aggregate skips, as FILTER skips them (COUNT(*) counts a constant). The analysis then bounds a CASE it knows."""
    def rewrite(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Filter):
            return node
        aggregate, condition = node.this, node.expression.this
        target = aggregate.expression.expressions[0] if isinstance(aggregate, exp.WithinGroup) else aggregate
        if isinstance(target, exp.Ordered):  # WITHIN GROUP (ORDER BY x): filter the ordered value
            target.set("this", _when(condition, target.this))
            return aggregate
        value = target.this
        if isinstance(value, exp.Distinct):
            value.set("expressions", [_when(condition, e) for e in value.expressions])
        else:
            target.set("this", _when(condition, exp.Literal.number(1) if value is None or isinstance(value, exp.Star)
                                     else value))
        return aggregate
    return tree.transform(rewrite, copy=False)


def empty_grouping_dropped(tree: exp.Select) -> exp.Select:
    """`GROUP BY ()` is the grand total, one group of every row, as no GROUP BY is; beside other keys it adds
    nothing."""
    for group in list(tree.find_all(exp.Group)):
        kept = [k for k in group.expressions if not (isinstance(k, exp.Tuple) and not k.expressions)]
        if len(kept) < len(group.expressions) and not group.args.get("grouping_sets") and not group.args.get(
                "rollup") and not group.args.get("cube"):
            if kept:
                group.set("expressions", kept)
            else:
                group.pop()
    return tree


def order_of_aggregated_sources_dropped(tree: exp.Select) -> exp.Select:
    """The ORDER BY of a subquery in FROM or JOIN without LIMIT or OFFSET, where the query reading it aggregates
    (Metabase orders a saved question it joins, `LEFT JOIN (SELECT person_id, COUNT(*) AS n … GROUP BY person_id
    ORDER BY person_id ASC) AS "Question 1"`): it orders rows that are then grouped or summed, which PostgreSQL
    reads in any order, so it changes nothing."""
    if not any(e.find(*AGGREGATES) for e in tree.expressions) or tree.find(exp.Window):
        return tree
    sources = [tree.args["from_"].this] if tree.args.get("from_") else []
    for source in [*sources, *(join.this for join in tree.args.get("joins") or [])]:
        select = source.this if isinstance(source, exp.Subquery) else None
        if isinstance(select, exp.Select) and select.args.get("order") and not any(
                select.args.get(k) for k in ("limit", "offset", "fetch", "distinct")) \
                and not select.find(exp.Window):
            select.set("order", None)
    return tree


def named_windows_inlined(tree: exp.Select) -> exp.Select:
    """`OVER w … WINDOW w AS (PARTITION BY person_id ORDER BY day)` is `OVER (PARTITION BY person_id ORDER BY day)`:
    each window that names one of its SELECT's WINDOW definitions takes its PARTITION BY and ORDER BY, and its frame
    where the window gives none, as PostgreSQL reads it. A name its SELECT does not define is left (refused)."""
    for select in list(tree.find_all(exp.Select)):
        definitions = {w.name: w for w in select.args.get("windows") or []}
        if not definitions:
            continue
        defined = {id(w) for w in select.args["windows"]}
        for window in select.find_all(exp.Window):
            named = window.args.get("alias")
            definition = definitions.get(named.name) if named is not None and window.find_ancestor(
                exp.Select) is select and id(window) not in defined else None
            if definition is None:
                continue
            for part in ("partition_by", "order", "spec"):
                if definition.args.get(part) and not window.args.get(part):
                    window.set(part, definition.args[part].copy() if isinstance(definition.args[part], exp.Expression)
                               else [e.copy() for e in definition.args[part]])
            window.set("alias", None)
        if not any(w.args.get("alias") is not None for w in select.find_all(exp.Window) if id(w) not in defined):
            select.set("windows", None)
    return tree


def fetch_as_limit(tree: exp.Select) -> exp.Select:
    """`FETCH FIRST n ROWS ONLY` (the standard's spelling, which Tableau and DBeaver send) is `LIMIT n`; with no n it
    is one row. WITH TIES, whose rows depend on ties among released values, is left as written (refused).
    `LIMIT ALL` and `LIMIT NULL` are no limit, as in PostgreSQL."""
    for select in tree.find_all(exp.Select, exp.SetOperation):
        fetch = select.args.get("limit")
        if isinstance(fetch, exp.Limit) and (isinstance(fetch.expression, exp.Null) or (
                isinstance(fetch.expression, exp.Var) and fetch.expression.name.upper() == "ALL")):
            select.set("limit", None)
            continue
        if not isinstance(fetch, exp.Fetch) or (fetch.args.get("limit_options") or exp.LimitOptions()).args.get(
                "with_ties"):
            continue
        count = fetch.args.get("count") or exp.Literal.number(1)
        select.set("limit", exp.Limit(expression=count.copy()))
    return tree


def any_as_in(tree: exp.Select) -> exp.Select:
    """`x = ANY(ARRAY[a, b])` (or a list parameter: `x = ANY(%s)`, or an array's text: `x = ANY('{a,b}')`) as
    `x IN (a, b)`, and `x <> ALL(...)` as `x NOT IN (...)`: PostgreSQL's meaning, NULLs included, in the form the
    analysis reads (a filter on a key narrows its domain); `x LIKE ANY(ARRAY[p, q])` (or ILIKE) as `x LIKE p OR x
    LIKE q`. Arrays of anything else (a subquery, an array of
    arrays) are left as written."""
    def listed(node: exp.Expression) -> list[exp.Expression] | None:
        if isinstance(node, exp.Any):
            inner = node.this
        elif isinstance(node, exp.Anonymous) and node.name.upper() == "ALL" and len(node.expressions) == 1:
            inner = node.expressions[0]
        else:
            return None
        while isinstance(inner, exp.Paren):
            inner = inner.this
        if isinstance(inner, exp.Literal | exp.Cast):
            return _array_text_values(inner)
        return inner.expressions if isinstance(inner, exp.Array | exp.Tuple) and inner.expressions else None

    def rewrite(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Like | exp.ILike) and isinstance(node.expression, exp.Any):
            patterns = listed(node.expression)  # x LIKE ANY (ARRAY[p, q]): x LIKE p OR x LIKE q
            return node if patterns is None else exp.paren(exp.or_(*(
                type(node)(this=node.this.copy(), expression=p.copy(), negate=node.args.get("negate"))
                for p in patterns)))
        found = listed(node.expression) if isinstance(node, exp.EQ | exp.NEQ) else None
        if found is None or isinstance(node, exp.EQ) != isinstance(node.expression, exp.Any):
            return node
        within = exp.In(this=node.this, expressions=[value.copy() for value in found])
        return within if isinstance(node, exp.EQ) else exp.Not(this=within)
    return tree.transform(rewrite, copy=False)


def _array_text_values(node: exp.Literal | exp.Cast) -> list[exp.Expression] | None:
    """The elements of an array written as PostgreSQL's text (`'{lab,"a b",NULL}'`, or cast: `'{1,2}'::int[]`), as
    constants: strings (PostgreSQL reads an untyped array's elements as the compared column's type, as it reads a
    string constant), numbers where the cast says numbers; None for anything else."""
    element_type = None
    if isinstance(node, exp.Cast):
        if not node.to.is_type(exp.DataType.Type.ARRAY) or not node.to.expressions:
            return None
        element_type, node = node.to.expressions[0], node.this
    if not (isinstance(node, exp.Literal) and node.is_string):
        return None
    text = node.this.strip()
    if len(text) < 2 or text[0] != "{" or text[-1] != "}":
        return None
    elements = _array_elements(text[1:-1])
    if not elements:
        return None
    numeric = element_type is not None and element_type.is_type(*exp.DataType.NUMERIC_TYPES)
    values: list[exp.Expression] = []
    for element in elements:
        if element is None:
            values.append(exp.Null())
        elif numeric:
            try:
                float(element)
            except ValueError:
                return None
            values.append(exp.Literal.number(element))
        else:
            values.append(exp.Literal.string(element))
    return values


def _array_elements(body: str) -> list[str | None] | None:
    """The elements of a one-dimensional array's text between its braces: comma-separated, each either
    double-quoted (backslash escapes the next character) or bare (trimmed; NULL in any case is NULL). None for
    nested arrays or text PostgreSQL would not read."""
    elements: list[str | None] = []
    i, n = 0, len(body)
    while i < n:
        while i < n and body[i].isspace():
            i += 1
        if i < n and body[i] == '"':
            i, chars = i + 1, []
            while i < n and body[i] != '"':
                if body[i] == "\\" and i + 1 < n:
                    i += 1
                chars.append(body[i])
                i += 1
            if i >= n:
                return None  # an unclosed quote
            i += 1
            elements.append("".join(chars))
            while i < n and body[i].isspace():
                i += 1
        else:
            start = i
            while i < n and body[i] != ",":
                if body[i] in '{}"\\':
                    return None
                i += 1
            bare = body[start:i].strip()
            if not bare:
                return None
            elements.append(None if bare.upper() == "NULL" else bare)
        if i < n and body[i] != ",":
            return None
        i += 1
        if i == n and body.endswith(","):
            return None  # a trailing comma
    return elements


def percentiles_as_arrays(tree: exp.Select) -> exp.Select:
    """`percentile_cont(ARRAY[0.25, 0.5]) WITHIN GROUP (ORDER BY x)` (PostgreSQL returns an array) as an array of
    one percentile each: `ARRAY[percentile_cont(0.25) WITHIN GROUP (ORDER BY x), ...]`, each its own quantile
    with its share of ε, the array built after noise. Other arrays are left for the refusal rules."""
    def split(node: exp.Expression) -> exp.Expression:
        function = node.this if isinstance(node, exp.WithinGroup) else None
        ranks = function.this if isinstance(function, exp.PercentileCont | exp.PercentileDisc) else None
        if not isinstance(ranks, exp.Array) or not ranks.expressions:
            return node
        return exp.Array(expressions=[
            exp.WithinGroup(this=function.__class__(this=rank.copy()), expression=node.expression.copy())
            for rank in ranks.expressions])
    return tree.transform(split, copy=False)


def is_percentile_array(node: exp.Expression) -> bool:
    """An array of percentiles that `percentiles_as_arrays` made (answered), rather than an ARRAY of values."""
    return isinstance(node, exp.Array) and bool(node.expressions) and all(
        isinstance(e, exp.WithinGroup) for e in node.expressions)


def distinct_as_group_by(tree: exp.Select) -> exp.Select:
    """`SELECT DISTINCT a, b FROM t` without aggregates is `SELECT a, b FROM t GROUP BY a, b` in PostgreSQL, and
    the analysis reads the second (it answers it where the keys' domains are declared); so is a subquery's
    (`people p LEFT JOIN (SELECT DISTINCT person_id FROM visits) t`: one row per unit). DISTINCT ON, and DISTINCT
    over aggregates, groups, windows or *, stay as written (and are refused)."""
    for select in list(tree.find_all(exp.Select)):
        distinct = select.args.get("distinct")
        if (distinct is None or distinct.args.get("on") or select.args.get("group") or select.find(exp.Window)
                or any(e.find(*AGGREGATES) or isinstance(e, exp.Star) for e in select.expressions)):
            continue
        select.set("distinct", None)
        select.group_by(*[e.this.copy() if isinstance(e, exp.Alias) else e.copy() for e in select.expressions],
                        copy=False)
    return tree


def cohort_joins_as_in(tree: exp.Select) -> exp.Select:
    """`… JOIN (SELECT c FROM … GROUP BY c HAVING …) s ON s.c = t.x` with nothing else read from s is
    `… WHERE t.x IN (SELECT c FROM … GROUP BY c HAVING …)`: grouped by c, s holds each value once, so the join
    keeps rows as the semijoin does (and the semijoin rule then judges it)."""
    for join in list(tree.args.get("joins") or []):
        source, on = join.this, join.args.get("on")
        if not (isinstance(source, exp.Subquery) and isinstance(source.this, exp.Select) and _cohort_shape(source.this)
                and isinstance(on, exp.EQ) and not join.side and join.kind in ("", "INNER")
                and not join.args.get("using")):
            continue
        alias = source.alias_or_name
        ours = [side for side in (on.this, on.expression) if isinstance(side, exp.Column) and side.table == alias]
        others = [side for side in (on.this, on.expression) if side not in ours]
        returned = output_name(source.this.expressions[0])
        read = [c for c in tree.find_all(exp.Column) if c.table == alias and c.find_ancestor(exp.Join) is not join]
        if len(ours) != 1 or ours[0].name != returned or len(others) != 1 or read or others[0].find(exp.Column) is None:
            continue
        join.pop()
        tree.where(exp.In(this=others[0].copy(), query=exp.Subquery(this=source.this.copy())), copy=False)
    return tree


def concat_as_pipes(tree: exp.Select) -> exp.Select:
    """`concat(a, '-', b)` is `COALESCE(a::text, '') || '-' || COALESCE(b::text, '')` in PostgreSQL (concat reads
    NULL as empty text, where || would give NULL): one spelling, which the allowlist and the analysis know."""
    def spelled(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Concat) or not node.expressions:
            return node
        parts = [part if isinstance(part, exp.Literal) and part.is_string else
                 exp.Coalesce(this=exp.cast(part, "text"), expressions=[exp.Literal.string("")])
                 for part in node.expressions]
        joined = parts[0]
        for part in parts[1:]:
            joined = exp.DPipe(this=joined, expression=part, safe=True)
        return exp.Paren(this=joined) if len(parts) > 1 else joined
    return _function_respelled(tree, exp.Concat, "concat", spelled)


def format_as_concat(tree: exp.Select) -> exp.Select:
    """`format('%s visits', category)`, a constant format of plain `%s` (and `%%`) only, as `concat('', category,
    ' visits')`: format's %s reads a value as text and NULL as empty text, as concat does (`concat_as_pipes` then
    spells it). Other formats (%I, %L, widths, positions) are left as written: refused."""
    def spelled(node: exp.Expression) -> exp.Expression:
        text = node.this if isinstance(node, exp.Format) else None
        if not (isinstance(text, exp.Literal) and text.is_string):
            return node
        pieces = text.this.replace("%%", "\x00").split("%s")
        values = node.expressions
        if len(pieces) != len(values) + 1 or any("%" in piece for piece in pieces):
            return node
        parts: list[exp.Expression] = []
        for piece, value in itertools.zip_longest(pieces, values):
            parts.append(exp.Literal.string(piece.replace("\x00", "%")))
            if value is not None:
                parts.append(value.copy())
        return exp.Concat(expressions=parts)
    return _function_respelled(tree, exp.Format, "format", spelled)


def _function_respelled(tree: exp.Select, function: type[exp.Expression], name: str, spelled) -> exp.Select:
    """`tree` with `spelled` applied to every node; an output that is the function keeps the column name
    PostgreSQL gives it, the function's `name`."""
    if not tree.find(function):
        return tree
    for output in tree.expressions:
        if isinstance(output, function):
            output.replace(exp.alias_(output.copy(), name))
    return tree.transform(spelled, copy=False)


def logs_as_ln(tree: exp.Select) -> exp.Select:
    """log(x) and log10(x) (PostgreSQL's base-10 logarithms; sqlglot reads both as log(10, x)) and log(b, x) of a
    constant base, as ln(x) / ln(b) with ln(b) a constant: one logarithm, guarded and bounded where ln is, that
    every backend computes alike (Spark's log(x) is the natural one)."""
    def spelled(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Log):
            return node
        base, value = (node.this, node.expression) if node.expression is not None else (exp.Literal.number(10),
                                                                                          node.this)
        number = float(base.this) if isinstance(base, exp.Literal) and not base.is_string else None
        if number is None or number <= 0 or number == 1:
            return node  # refused as it stands: a base dpsql cannot fold
        return exp.Div(this=exp.Ln(this=value), expression=exp.Literal.number(repr(math.log(number))))
    return _function_respelled(tree, exp.Log, "log", spelled)


def trunc_as_floor_or_ceil(tree: exp.Select) -> exp.Select:
    """trunc(x), toward zero (Tableau's month, CAST(TRUNC(EXTRACT(MONTH FROM day)) AS INTEGER)), as CASE WHEN x < 0
    THEN ceil(x) ELSE floor(x) END: of PostgreSQL's type for x as trunc's is, NULL for NULL, NaN for NaN (which
    sorts above every number), and bounded where floor and ceil are. trunc(x, n) of a whole-number constant n (of
    a numeric, as x is cast to one: `trunc(AVG(age), 1)`, `trunc(age, -1)`) so too at n digits, x scaled by 10^n
    before and after (divided by 10^-n where n < 0, so that the factor is a whole number); any other n is left
    to be refused."""
    def spelled(node: exp.Expression) -> exp.Expression:
        digits = node.args.get("decimals") if isinstance(node, exp.Trunc) else None
        if not isinstance(node, exp.Trunc) or digits is not None and _whole_constant(digits) is None:
            return node
        n = 0 if digits is None else _whole_constant(digits)
        factor = exp.Literal.number(10 ** abs(n))

        def scaled(value: exp.Expression) -> exp.Expression:
            return value if n == 0 else exp.Mul(this=exp.Paren(this=value), expression=factor.copy()) if n > 0 \
                else exp.Div(this=exp.Paren(this=value), expression=factor.copy())

        def back(value: exp.Expression) -> exp.Expression:
            return value if n == 0 else exp.Div(this=value, expression=factor.copy()) if n > 0 \
                else exp.Mul(this=value, expression=factor.copy())
        # PostgreSQL's trunc(x, n) is of a numeric (x is cast to one, and the result is one)
        value = node.this if digits is None else exp.cast(node.this.copy(), exp.DataType.build("numeric"))
        negative = exp.LT(this=value.copy(), expression=exp.Literal.number(0))
        return exp.Paren(this=exp.Case(ifs=[exp.If(this=negative, true=back(exp.Ceil(this=scaled(value.copy()))))],
                                       default=back(exp.Floor(this=scaled(value.copy())))))
    return _function_respelled(tree, exp.Trunc, "trunc", spelled)


def _whole_constant(node: exp.Expression) -> int | None:
    """A whole-number constant's value (`1`, `-3`), else None."""
    found = signed_literal(node)
    if found is None or found[0].is_string or not found[0].this.isdigit():
        return None
    return found[1] * int(found[0].this)


def left_as_substring(tree: exp.Select) -> exp.Select:
    """`left(s, n)` for a whole-number constant n >= 0 is `substring(s, 1, n)` in PostgreSQL: one spelling, which
    the analysis checks (a negative n drops characters from the end: left as written, and refused)."""
    def spelled(node: exp.Expression) -> exp.Expression:
        count = node.expression if isinstance(node, exp.Left) else None
        if not (isinstance(count, exp.Literal) and not count.is_string and count.this.isdigit()):
            return node
        return exp.Substring(this=node.this, start=exp.Literal.number(1), length=count)
    return _function_respelled(tree, exp.Left, "left", spelled)


def date_function_as_cast(tree: exp.Select) -> exp.Select:
    """`date(x)`, PostgreSQL's type name called as a function (`date(now())`, `date(created_at)`), is the cast
    `CAST(x AS DATE)`: one spelling, which the analysis checks as every cast."""
    def spelled(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Date) or any(node.args.get(k) for k in node.args if k != "this"):
            return node
        return exp.Cast(this=node.this, to=exp.DataType.build("DATE"))
    return _function_respelled(tree, exp.Date, "date", spelled)


def extremes_of_truncations(tree: exp.Select) -> exp.Select:
    """In a subquery, `MIN(date_trunc('month', day))` is `date_trunc('month', MIN(day))` (also under a cast to
    date, and for MAX): truncation never reorders times, so a person's first month is their first day's, which
    a per-unit subquery computes (a cohort: `SELECT first_month, COUNT(*) FROM (SELECT person_id,
    MIN(date_trunc('month', day)) AS first_month ... GROUP BY person_id) t GROUP BY 1`). The column keeps the
    aggregate's name. (At the top, the extreme is a chosen value, which post-processing does not truncate.)"""
    def moved(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Min | exp.Max) or node.args.get("expressions") or node.parent_select is tree:
            return node
        cast = node.this if isinstance(node.this, exp.Cast) and node.this.to.is_type("date") else None
        truncated = cast.this if cast is not None else node.this
        if not isinstance(truncated, exp.TimestampTrunc | exp.DateTrunc):
            return node
        inner = truncated.copy()
        inner.set("this", type(node)(this=truncated.this.copy()))
        result = exp.Cast(this=inner, to=cast.to.copy()) if cast is not None else inner
        return exp.alias_(result, output_name(node)) if isinstance(node.parent, exp.Select) \
            and node in node.parent.expressions else result
    if not tree.find(exp.Min, exp.Max):
        return tree
    return tree.transform(moved, copy=False)


def approx_distinct_as_count(tree: exp.Select) -> exp.Select:
    """`approx_count_distinct(c)` (Spark's, BigQuery's, Snowflake's spelling, which BI tools send) is
    `COUNT(DISTINCT c)`: a noisy answer is approximate already, and an exact distinct count costs nothing more.
    The column keeps the function's name."""
    if not tree.find(exp.ApproxDistinct):
        return tree
    for output in tree.expressions:
        if isinstance(output, exp.ApproxDistinct):
            output.replace(exp.alias_(output.copy(), "approx_count_distinct"))
    return tree.transform(lambda node: exp.Count(this=exp.Distinct(expressions=[node.this.copy()]))
                          if isinstance(node, exp.ApproxDistinct) else node, copy=False)


def count_of_a_tables_rows(tree: exp.Select) -> exp.Select:
    """`COUNT(v.*)` counts the rows where v's whole row is not NULL: every row where v is joined inner or is the
    preserved side (`COUNT(*)`), and where v is the side an outer join NULL-extends, the rows it matched, which are
    those where a column its ON condition equates to another table's, or its USING names, is not NULL
    (`COUNT(v.person_id)`). Left as written (and refused) where no such column is found."""
    for count in [c for c in tree.find_all(exp.Count) if isinstance(c.this, exp.Column)
                  and isinstance(c.this.this, exp.Star) and c.this.table]:
        select = count.find_ancestor(exp.Select)
        alias = count.this.table
        joins = list(select.args.get("joins") or [])
        extended = [j for i, j in enumerate(joins) if j.side.upper() == "LEFT" and j.this.alias_or_name == alias
                    or j.side.upper() == "RIGHT" and alias in _names_before(select, i)]
        if not extended:
            count.set("this", exp.Star())
            continue
        on, using = extended[0].args.get("on"), extended[0].args.get("using") or []
        keys = [exp.column(name.name, table=alias) for name in using]
        keys += [side for eq in (on.find_all(exp.EQ) if on is not None else ()) for side, other in (
            (eq.this, eq.expression), (eq.expression, eq.this)) if isinstance(side, exp.Column) and side.table == alias
                and isinstance(other, exp.Column) and other.table not in ("", alias)]
        if keys:
            count.set("this", keys[0].copy())
    return tree


def _names_before(select: exp.Select, join: int) -> set[str]:
    """The names of the tables `select` reads in FROM and in its joins before the `join`-th."""
    sources = [select.args["from_"].this, *(j.this for j in select.args["joins"][:join])]
    return {s.alias_or_name for s in sources}


REGRESSIONS = {exp.RegrCount: "regr_count", exp.RegrAvgx: "regr_avgx", exp.RegrAvgy: "regr_avgy",
               exp.RegrSxx: "regr_sxx", exp.RegrSyy: "regr_syy", exp.RegrSxy: "regr_sxy", exp.RegrR2: "regr_r2"}


def regressions_as_moments(tree: exp.Select) -> exp.Select:
    """PostgreSQL's other regression aggregates of (y, x), over the rows where both are not NULL, written with the
    aggregates the analysis finishes from noisy sums: regr_count is that COUNT, regr_avgx and regr_avgy the AVGs,
    regr_sxx and regr_syy var_pop times the count, regr_sxy covar_pop times the count, regr_r2 corr squared, each
    a double precision. The column keeps the function's name."""
    if not tree.find(*REGRESSIONS):
        return tree
    for output in tree.expressions:
        if type(output) in REGRESSIONS:
            output.replace(exp.alias_(output.copy(), REGRESSIONS[type(output)]))

    def written(node: exp.Expression) -> exp.Expression:
        if type(node) not in REGRESSIONS or isinstance(node, exp.RegrCount):
            return moments(node)
        return exp.cast(moments(node), "double")  # PostgreSQL's regressions are of doubles, whatever they read

    def moments(node: exp.Expression) -> exp.Expression:
        if type(node) not in REGRESSIONS:
            return node
        y, x = node.this, node.expression
        both = exp.and_(exp.Not(this=exp.Is(this=y.copy(), expression=exp.Null())),
                        exp.Not(this=exp.Is(this=x.copy(), expression=exp.Null())))
        count = exp.Count(this=_when(both, exp.Literal.number(1)))
        if isinstance(node, exp.RegrCount):
            return count
        if isinstance(node, exp.RegrAvgx | exp.RegrAvgy):
            return exp.Avg(this=_when(both, (x if isinstance(node, exp.RegrAvgx) else y).copy()))
        if isinstance(node, exp.RegrR2):
            return exp.Paren(this=exp.Mul(this=exp.Corr(this=y.copy(), expression=x.copy()),
                                          expression=exp.Corr(this=y.copy(), expression=x.copy())))
        spread = exp.CovarPop(this=y.copy(), expression=x.copy()) if isinstance(node, exp.RegrSxy) else \
            exp.VariancePop(this=_when(both, (x if isinstance(node, exp.RegrSxx) else y).copy()))
        return exp.Paren(this=exp.Mul(this=spread, expression=count))
    return tree.transform(written, copy=False)


def count_of_distinct_rows(tree: exp.Select) -> exp.Select:
    """`SELECT COUNT(*) FROM (SELECT DISTINCT c FROM … WHERE …) t` is answered as `SELECT COUNT(DISTINCT c) FROM …
    WHERE …`: the same number except that the subquery would return a NULL as one more row, which COUNT(DISTINCT)
    skips (at most 1 apart, and never for a key such as the unit's column). Anything else is left as written."""
    inner = _source_select(tree)
    outputs = tree.expressions
    if (inner is None or tree.args.get("with_") or len(outputs) != 1
            or not isinstance(outputs[0].unalias(), exp.Count) or not isinstance(outputs[0].unalias().this, exp.Star)
            or any(tree.args.get(k) for k in ("joins", "where", "group", "having", "order", "limit", "offset"))):
        return tree
    distinct = inner.args.get("distinct")
    if (distinct is None or distinct.args.get("on") or len(inner.expressions) != 1
            or any(inner.args.get(k) for k in ("group", "having", "order", "limit", "offset", "with_"))
            or inner.expressions[0].find(*AGGREGATES, exp.Window)):
        return tree
    value = inner.expressions[0].unalias()
    counted = inner.copy()
    counted.set("distinct", None)
    counted.set("expressions", [exp.alias_(exp.Count(this=exp.Distinct(expressions=[value.copy()])),
                                           output_name(outputs[0]))])
    return counted


def having_of_source_as_where(tree: exp.Select) -> exp.Select:
    """`SELECT AVG(n) FROM (SELECT u, COUNT(*) AS n FROM t GROUP BY u HAVING SUM(x) > 100) s` is `SELECT AVG(n) FROM
    (SELECT u, COUNT(*) AS n, SUM(x) AS dpsql_having_1 FROM t GROUP BY u) s WHERE s.dpsql_having_1 > 100`: the same
    groups, kept by a filter outside, where the analysis reads a grouped subquery as a table of one row per group.
    A subquery joined to other tables keeps its groups the same way, by the ON of the join that reads it (where that
    join NULL-extends it, a group the HAVING drops reads as one the subquery never had). Only under
    an outer query that aggregates (one that does not is post-processing of released rows:
    `projection_over_aggregates`). Anything else is left as written."""
    if not any(_aggregates_rows(e) for e in tree.expressions):
        return tree
    written, tree = tree, tree.copy()
    for alias, inner in derived_sources(tree).items():
        if (inner.args.get("having") is None or inner.find(exp.Window)
                or any(inner.args.get(k) for k in ("order", "limit", "offset", "distinct"))):
            continue
        place = _filter_place(tree, alias)
        condition = _having_outside(inner, alias)
        if place is None or condition is None:
            return written
        inner.set("having", None)
        if place is tree:
            tree.where(condition, copy=False)
        else:
            place.set("on", exp.and_(place.args["on"], condition))
    return tree


def _filter_place(tree: exp.Select, alias: str) -> exp.Select | exp.Join | None:
    """Where a filter of the source `alias`'s rows keeps exactly the joined rows its own rows would: the ON of the
    join that reads it (FROM: the first join), unless that join preserves its rows; else, under an inner join
    without ON (USING) that nothing later NULL-extends, the WHERE. None where neither holds."""
    joins = tree.args.get("joins") or []
    if not joins:
        return tree
    index = next((i for i, join in enumerate(joins) if join.this.alias_or_name == alias), 0)
    join, in_from = joins[index], joins[index].this.alias_or_name != alias
    side = (join.side or "").upper()
    if side == "FULL" or side == ("LEFT" if in_from else "RIGHT"):
        return None
    if join.args.get("on") is not None:
        return join
    nulled_later = any((later.side or "").upper() in ("RIGHT", "FULL") for later in joins[index + 1:])
    return tree if not side and not nulled_later else None


def _having_outside(inner: exp.Select, alias: str) -> exp.Expression | None:
    """`inner`'s HAVING over outputs it selects for it (its aggregates and keys, under names of dpsql's own
    where it does not select them already), read through `alias`; None where it reads another column."""
    for output in inner.expressions:  # an output the condition reads by name is named (COUNT(*) as count)
        if not isinstance(output, exp.Alias | exp.Column):
            output.replace(exp.alias_(output.copy(), output_name(output)))
    named = {output.unalias().sql(): output_name(output) for output in inner.expressions}
    keys = {key.sql() for key in inner.args["group"].expressions}
    taken = set(named.values())

    def outside(node: exp.Expression) -> exp.Expression:
        is_key = isinstance(node, exp.Column) and node.sql() in keys and node.find_ancestor(*AGGREGATES) is None
        if not (isinstance(node, tuple(AGGREGATES)) or is_key):
            return node
        name = named.get(node.sql())
        if name is None:
            name = next(f"dpsql_having_{i}" for i in range(1, len(taken) + 2) if f"dpsql_having_{i}" not in taken)
            taken.add(name)
            named[node.sql()] = name
            inner.append("expressions", exp.alias_(node.copy(), name))
        return exp.column(name, table=alias)

    condition = inner.args["having"].this.transform(outside)
    if any(c.table != alias for c in condition.find_all(exp.Column)):
        return None  # a column neither grouped by nor aggregated: PostgreSQL refuses it
    return condition


def shadowing_names_renamed(tree: exp.Select) -> exp.Select:
    """A subquery in WHERE that reads a table under a name the outer query or an earlier subquery uses too (`FROM
    visits WHERE person_id IN (SELECT person_id FROM visits WHERE ...)`, two `EXISTS (SELECT 1 FROM visits v ...)`)
    reads it under a name of its own: inside the subquery that name means the subquery's table (PostgreSQL's
    scoping), and the analysis reads one table per name."""
    outer = {source.alias_or_name for source in tables_read(tree)}
    taken = {t.alias_or_name for t in tree.find_all(exp.Table)}
    for select in semijoin_selects(tree):
        for source in tables_read(select):
            old = source.alias_or_name
            if old not in outer:
                continue
            new = next(f"{old}_{i}" for i in range(2, len(taken) + 3) if f"{old}_{i}" not in taken)
            taken.add(new)
            for column in list(select.find_all(exp.Column)):
                if column.table == old and _binding_select(column, old) is select:
                    column.set("table", exp.to_identifier(new))
            source.set("alias", exp.TableAlias(this=exp.to_identifier(new)))
        outer |= {source.alias_or_name for source in tables_read(select)}
    return tree


def tables_read(select: exp.Select) -> list[exp.Table]:
    """The tables `select` reads in FROM and JOIN (not its subqueries')."""
    sources = [select.args["from_"].this] if select.args.get("from_") else []
    sources += [join.this for join in select.args.get("joins") or []]
    return [s for s in sources if isinstance(s, exp.Table)]


def _binding_select(column: exp.Column, name: str) -> exp.Select | None:
    """The innermost SELECT around `column` that reads a table named `name`: the one it refers to."""
    select = column.find_ancestor(exp.Select)
    while select is not None and not any(s.alias_or_name == name for s in tables_read(select)):
        select = select.find_ancestor(exp.Select)
    return select


def _when(condition: exp.Expression, value: exp.Expression) -> exp.Case:
    return exp.Case(ifs=[exp.If(this=condition.copy(), true=value)])


def is_windowed_source(select: exp.Select) -> bool:
    """The shape `unit_windows_as_sources` writes: one table's columns and named windows over it, and a WHERE, read
    in FROM or JOIN: a windowed source, which the analysis reads as that table with more columns
    (`analysis.windowed`)."""
    source = select.args["from_"].this if select.args.get("from_") else None
    return isinstance(source, exp.Table) and isinstance(select.parent, exp.Subquery) and bool(select.parent.alias) \
        and isinstance(select.parent.parent, exp.From | exp.Join) \
        and not any(select.args.get(k) for k in BEYOND_WHERE) \
        and any(isinstance(item.unalias(), exp.Window) for item in select.expressions) \
        and all(isinstance(item.unalias(), exp.Column) and item.alias_or_name == item.unalias().name
                or isinstance(item, exp.Alias) and isinstance(item.this, exp.Window) for item in select.expressions)


def windowed_sources(tree: exp.Select) -> dict[str, exp.Select]:
    """The windowed sources `tree` reads in FROM and JOIN, by their aliases."""
    sources = [tree.args["from_"].this] if tree.args.get("from_") else []
    sources += [join.this for join in tree.args.get("joins") or []]
    return {s.alias_or_name: s.this for s in sources if isinstance(s, exp.Subquery) and isinstance(s.this, exp.Select)
            and is_windowed_source(s.this)}


def require_flat(tree: exp.Select) -> None:
    """After merging, the only subqueries left may be semijoins in WHERE: EXISTS (SELECT ...) and
    x IN (SELECT ...), possibly under NOT, over plain SELECTs without nesting, grouping or aggregates."""
    semijoins = semijoin_selects(tree)
    allowed = {id(s) for s in semijoins} | {id(s.parent) for s in semijoins if isinstance(s.parent, exp.Subquery)}
    derived_selects = [d for d in [derived_select(tree), *joined_derived_selects(tree).values()] if d is not None]
    for windowed in [w for select in [tree, *derived_selects] for w in windowed_sources(select).values()]:
        if any(select is not windowed for select in windowed.find_all(exp.Select)):
            raise UnsupportedQuery("a window over each unit's rows may not read subqueries",
                                   "filter its rows with conditions on their own columns")
        allowed |= {id(windowed), id(windowed.parent)}
    for derived in derived_selects:
        allowed |= {id(derived), id(derived.parent), id(tree.args.get("with_"))}
        if any(isinstance(n, exp.Select | exp.Subquery | exp.CTE) for n in derived.walk()
               if n is not derived and id(n) not in allowed):
            raise UnsupportedQuery("a per-unit subquery may not hold subqueries of its own",
                                   "move the inner subquery's condition into the outer query, or join its table inside")
    for node in tree.walk():
        if node is tree or id(node) in allowed:
            continue
        if isinstance(node, exp.Select | exp.Subquery | exp.CTE):
            raise UnsupportedQuery("this subquery cannot be merged into the outer query "
                                   "(aggregating, grouped or nested subqueries are not supported yet)",
                                   "write the query as one SELECT over joined tables, or as EXISTS / IN "
                                   "(SELECT ...) in WHERE")
    for select in semijoins:
        if _cohort(select):
            continue
        if any(select.args.get(k) for k in ("group", "having", "order", "limit", "offset", "with_")) \
                or select.find(*AGGREGATES):
            raise UnsupportedQuery("an EXISTS or IN subquery may not aggregate, group, order or limit, except "
                                   "to pick units by their own rows",
                                   "filter its rows with WHERE, or group by the column it returns: person_id IN "
                                   "(SELECT person_id FROM t GROUP BY person_id HAVING COUNT(*) > 5)")


def _cohort(select: exp.Select) -> bool:
    """`x IN (SELECT c FROM … GROUP BY c HAVING …)`: the c whose own rows pass HAVING. Each group is the rows
    of one value of c, and the semijoin rule (analysis/semijoins) ties c to the outer row's unit, so the
    condition still reads that unit's rows alone."""
    return isinstance(select.parent, exp.Subquery) and isinstance(select.parent.parent, exp.In) \
        and _cohort_shape(select)


def _cohort_shape(select: exp.Select) -> bool:
    """SELECT c FROM … GROUP BY c [HAVING …], with nothing that reads other groups."""
    group = select.args.get("group")
    if group is None:
        return False
    returned = [e.unalias() for e in select.expressions]
    return (len(returned) == 1 and len(group.expressions) == 1 and returned[0] == group.expressions[0]
            and not returned[0].find(*AGGREGATES) and not select.find(exp.Window)
            and not any(select.args.get(k) for k in ("order", "limit", "offset", "with_", "distinct")))


def drop_nulls_under_not_in(tree: exp.Select) -> None:
    """`x NOT IN (SELECT c ...)` depends on the subquery as a whole wherever NULLs meet it, so one unit could flip
    every row: it is NULL for every x once one c is NULL, and for a NULL x it is TRUE when the subquery is empty
    and NULL otherwise. dpsql reads it as `x IS NOT NULL AND x NOT IN (the subquery's non-NULL values)`, which
    differs from PostgreSQL only when the subquery yields a NULL or nothing at all. Over a plain subquery it is
    then written `NOT EXISTS (SELECT 1 … WHERE c = x)`, the same rows: PostgreSQL runs NOT IN as a hashed
    subplan only where the subquery's values fit in work_mem, else it reads them again for every outer row
    (people who never visited, 100,000 people: over 11 minutes; a hash anti-join: well under a second)."""
    for select in semijoin_selects(tree):
        in_node = select.parent.parent if isinstance(select.parent, exp.Subquery) else None
        if not isinstance(in_node, exp.In) or not isinstance(_unparenthesised_parent(in_node), exp.Not):
            continue
        value = select.expressions[0].unalias() if len(select.expressions) == 1 else None
        if value is None:
            raise UnsupportedQuery("an IN subquery must select exactly one value",
                                   "select one column: WHERE k IN (SELECT k FROM t WHERE ...)")
        select.where(exp.Not(this=exp.Is(this=value.copy(), expression=exp.Null())), copy=False)
        # a separate conjunct of the outer WHERE (a NOT IN not joined by AND is refused by the analysis)
        tree.where(exp.Not(this=exp.Is(this=in_node.this.copy(), expression=exp.Null())), copy=False)
        if _plain(select):  # with both sides NOT NULL, the anti-join PostgreSQL hashes whatever the work_mem
            select.where(exp.EQ(this=value.copy(), expression=in_node.this.copy()), copy=False)
            select.set("expressions", [exp.Literal.number(1)])
            in_node.replace(exp.Exists(this=select.copy()))


def _plain(select: exp.Select) -> bool:
    """A SELECT of rows alone: no grouping, aggregate, window, DISTINCT, order or limit."""
    return (not any(select.args.get(k) for k in ("group", "having", "distinct", "order", "limit", "offset", "with_"))
            and not any(e.find(*AGGREGATES, exp.Window) for e in select.expressions))


def _unparenthesised_parent(node: exp.Expression) -> exp.Expression | None:
    parent = node.parent
    while isinstance(parent, exp.Paren):
        parent = parent.parent
    return parent


def derived_select(tree: exp.Select) -> exp.Select | None:
    """The grouped SELECT that `tree` reads FROM, as a subquery or a WITH query (None if it reads tables)."""
    source = _source_select(tree)
    return source if source is not None and source.args.get("group") else None


def derived_sources(tree: exp.Select) -> dict[str, exp.Select]:
    """The grouped SELECTs `tree` reads, by their aliases: the one it reads FROM alone, or those it joins."""
    joined = joined_derived_selects(tree)
    inner = derived_select(tree)
    return joined if joined or inner is None else {tree.args["from_"].this.alias_or_name: inner}


def joined_derived_selects(tree: exp.Select) -> dict[str, exp.Select]:
    """The grouped SELECTs that `tree` joins to other sources (`FROM visits v JOIN (SELECT person_id, SUM(amount)
    AS total FROM visits GROUP BY person_id) t ON …`), as subqueries or WITH queries read once, by their aliases:
    the one in FROM too where it has joins."""
    joins = tree.args.get("joins") or []
    sources = [join.this for join in joins] + ([tree.args["from_"].this] if joins and tree.args.get("from_") else [])
    found = {}
    for source in sources:
        select = _read_select(tree, source)
        if select is not None and select.args.get("group"):
            found[source.alias_or_name] = select
    return found


def _read_select(tree: exp.Select, source: exp.Expression) -> exp.Select | None:
    """The SELECT that the source `source` reads: a subquery's, or a WITH query's read there alone."""
    if isinstance(source, exp.Subquery) and isinstance(source.this, exp.Select):
        return source.this
    if isinstance(source, exp.Table) and not source.db and tree.args.get("with_"):
        ctes = [c for c in tree.args["with_"].expressions if c.alias_or_name == source.name]
        readers = [t for t in tree.find_all(exp.Table) if not t.db and t.name == source.name]
        if len(ctes) == 1 and len(readers) == 1 and isinstance(ctes[0].this, exp.Select):
            return ctes[0].this
    return None


def _source_select(tree: exp.Select) -> exp.Select | None:
    """The SELECT that `tree` reads FROM alone, as a subquery or its one WITH query (None if it reads tables)."""
    source = tree.args["from_"].this if tree.args.get("from_") else None
    if isinstance(source, exp.Subquery) and isinstance(source.this, exp.Select):
        return source.this
    if isinstance(source, exp.Table) and not source.db and tree.args.get("with_"):
        ctes = tree.args["with_"].expressions
        if len(ctes) == 1 and ctes[0].alias_or_name == source.name and isinstance(ctes[0].this, exp.Select):
            return ctes[0].this
    return None


def inline_ctes(tree: exp.Select, read_once: bool = False) -> exp.Select:
    """A WITH query as a subquery at each place it is read, so that each merges into the outer query or is read as
    a subquery is: one read more than once (`FROM r r1 JOIN r r2`) where it aggregates nothing (sqlglot merges a
    WITH query read once only), and, in a chain of WITH queries, one read once (`WITH a AS (… GROUP BY person_id),
    b AS (SELECT n, COUNT(*) FROM a GROUP BY n) SELECT * FROM b`), as PostgreSQL itself inlines it. The last is
    taken first, so that the queries it reads are then read outside any WITH query. With `read_once`, every WITH
    query read once is inlined (a caller that reads the subquery itself, not sqlglot's merge)."""
    with_ = tree.args.get("with_")
    if with_ is None or with_.args.get("recursive"):
        return tree
    chained = len(with_.expressions) > 1
    for cte in reversed(list(with_.expressions)):
        readers = [t for t in tree.find_all(exp.Table) if not t.db and t.name == cte.alias_or_name]
        if not isinstance(cte.this, exp.Select) or any(t.find_ancestor(exp.CTE) is not None for t in readers) \
                or sum(c.alias_or_name == cte.alias_or_name for c in tree.find_all(exp.CTE)) > 1:
            continue  # read inside a WITH query still, or its name is another WITH query's too
        if not (len(readers) > 1 and not cte.this.find(*AGGREGATES) or len(readers) == 1 and (chained or read_once)):
            continue
        for table in readers:
            table.replace(exp.Subquery(this=cte.this.copy(), alias=exp.TableAlias(
                this=exp.to_identifier(table.alias_or_name))))
        cte.pop()
    if not with_.expressions:
        tree.set("with_", None)
    return tree


TOTALS = (exp.Sum, exp.Count, exp.Avg, exp.Min, exp.Max)  # the totals a window over released rows computes
ONE_READ = ("joins", "where", "group", "having", "distinct", "order", "limit", "offset", "with_")
READS = (exp.From, exp.Join, exp.Lateral, exp.In, exp.Exists, exp.CTE, exp.Subquery)  # where a subquery is read as rows


def totals_as_windows(tree: exp.Select) -> exp.Select:
    """A total of the rows a query reads from a WITH query, taken over those same rows, as a window over them
    (`SUM(n) OVER ()`, which dpsql computes over the released rows): a scalar subquery `(SELECT SUM(n) FROM a)`
    in a query FROM a, and a WITH query of totals `b AS (SELECT SUM(n) AS t FROM a)` joined to a without a
    condition (`FROM a, b`, `CROSS JOIN b`, `JOIN b ON TRUE`), the way analysts write a share of the total. Only
    where the query neither filters nor groups a's rows, so that the window reads every row the total reads."""
    with_ = tree.args.get("with_")
    source = tree.args["from_"].this if tree.args.get("from_") else None
    if with_ is None or with_.args.get("recursive") or not isinstance(source, exp.Table) or source.db \
            or any(tree.args.get(k) for k in ("where", "group", "having", "distinct")) \
            or any(a.find_ancestor(exp.Select) is tree for a in tree.find_all(*AGGREGATES)):
        return tree
    ctes = {cte.alias_or_name: cte.this for cte in with_.expressions if isinstance(cte.this, exp.Select)}
    name, alias = source.name, source.alias_or_name
    if name not in ctes:
        return tree
    found = tree.copy()
    totals: dict[str, dict[str, exp.Expression]] = {}  # a joined WITH query of totals: its outputs
    for join in found.args.get("joins") or []:
        joined, on = join.this, join.args.get("on")
        if not (isinstance(joined, exp.Table) and not joined.db and _totals_of(ctes.get(joined.name), name)
                and join.args.get("kind") in (None, "CROSS") and not join.args.get("side")
                and not join.args.get("using") and (on is None or on == exp.true())):
            return tree
        totals[joined.alias_or_name] = {output_name(e): e.unalias() for e in ctes[joined.name].expressions}
    own, changed = {output_name(e) for e in ctes[name].expressions}, bool(totals)
    for column in [c for c in found.find_all(exp.Column) if c.find_ancestor(exp.Select) is found]:
        owner = column.table or next((t for t, outputs in totals.items() if column.name in outputs
                                      and column.name not in own), None)
        if owner in totals:
            if column.name not in totals[owner]:
                return tree
            column.replace(_over_all(totals[owner][column.name], alias))
    for subquery in [s for s in found.find_all(exp.Subquery) if s.find_ancestor(exp.Select) is found]:
        select = subquery.this
        if not isinstance(subquery.parent, READS) and _totals_of(select, name) and len(select.expressions) == 1:
            subquery.replace(_over_all(select.expressions[0].unalias(), alias))
            changed = True
    if not changed:
        return tree
    found.set("joins", None)
    for cte in list(found.args["with_"].expressions):  # a WITH query of totals no longer read
        if cte.alias_or_name in {t for t in ctes if t != name} and not any(
                t.name == cte.alias_or_name for t in found.find_all(exp.Table)):
            cte.pop()
    return found


def _totals_of(select: exp.Expression | None, source: str) -> bool:
    """Whether `select` is one row of totals over every row of the WITH query `source`: SELECT SUM(x) [AS t], …
    FROM source, and nothing else."""
    table = select.args["from_"].this if isinstance(select, exp.Select) and select.args.get("from_") else None
    return (isinstance(table, exp.Table) and not table.db and table.name == source
            and not any(select.args.get(k) for k in ONE_READ)
            and all(isinstance(e.unalias(), TOTALS) and not e.find(exp.Distinct, exp.Window)
                    for e in select.expressions))


def constant_subqueries_inlined(tree: exp.Select) -> exp.Select:
    """A scalar subquery that reads no table, `(SELECT DATE_TRUNC('day', CURRENT_TIMESTAMP AT TIME ZONE 'UTC') +
    (-6 || ' day')::INTERVAL)` (Looker's relative dates), as its one value: PostgreSQL computes either once."""
    for subquery in list(tree.find_all(exp.Subquery)):
        select = subquery.this
        while isinstance(select, exp.Subquery):  # ((SELECT …)): sqlglot reads the doubled parentheses as two
            select = select.this
        if isinstance(select, exp.Select) and subquery.parent is not None and not isinstance(subquery.parent, READS) \
                and len(select.expressions) == 1 and not any(select.args.get(k) for k in ("from_", *ONE_READ)) \
                and not select.find(exp.Table, *AGGREGATES, exp.Window, exp.Star):
            value = select.expressions[0].unalias().copy()
            if isinstance(value, exp.Binary | exp.Unary):  # an operator keeps its own precedence where it goes
                replace_keeping_precedence(subquery, value)
            else:
                subquery.replace(value)
    return tree


def one_row_ctes_inlined(tree: exp.Select) -> exp.Select:
    """A scalar subquery that reads a WITH query of one aggregate row (`WITH t AS (SELECT COUNT(*) AS total FROM
    visits) … (SELECT total FROM t)`) as that query's own aggregate (`(SELECT COUNT(*) FROM visits)`), which is
    answered as a scalar subquery is; the WITH query goes where nothing else reads it."""
    with_ = tree.args.get("with_")
    if with_ is None or with_.args.get("recursive"):
        return tree
    ctes = {cte.alias_or_name: cte.this for cte in with_.expressions if _one_aggregate_row(cte.this)}
    if not ctes:
        return tree
    tree = _one_row_joins_as_subqueries(tree.copy(), ctes)
    for subquery in list(tree.find_all(exp.Subquery)):
        select = subquery.this
        table = select.args["from_"].this if isinstance(select, exp.Select) and select.args.get("from_") else None
        if isinstance(subquery.parent, READS) or not isinstance(table, exp.Table) or table.db \
                or table.name not in ctes or len(select.expressions) != 1 or any(select.args.get(k) for k in ONE_READ):
            continue
        items = {output_name(e): e.unalias() for e in ctes[table.name].expressions}
        value = select.expressions[0].unalias().copy()
        if not all(c.name in items and c.table in ("", table.alias_or_name) for c in value.find_all(exp.Column)):
            continue
        for column in list(value.find_all(exp.Column)):
            if column is value:
                value = items[column.name].copy()
            else:
                column.replace(items[column.name].copy())
        subquery.set("this", ctes[table.name].copy().select(value, append=False))
    for cte in list(tree.args["with_"].expressions):
        if cte.alias_or_name in ctes and not any(t.name == cte.alias_or_name for t in tree.find_all(exp.Table)):
            cte.pop()
    if not tree.args["with_"].expressions:
        tree.set("with_", None)
    return tree


ONE_ROW_READS = (exp.Max, exp.Min, exp.Avg, exp.AnyValue)  # of one value repeated on every row: that value


def _one_row_joins_as_subqueries(tree: exp.Select, ctes: dict[str, exp.Select]) -> exp.Select:
    """`FROM visits v, t` (or `CROSS JOIN t`, `JOIN t ON true`) where t is a WITH query of one aggregate row: every
    row of visits meets t's one row, so t's columns are constants there. Each read of one, `t.total` or
    `MAX(t.total)` (MIN, AVG, ANY_VALUE: of one value repeated), becomes `(SELECT total FROM t)` and t leaves the
    FROM (also `GROUP BY t.total`, a constant). Left as written where t is read any other way (`SUM(t.total)`
    counts the rows)."""
    joins = tree.args.get("joins") or []
    for join in list(joins):
        table = join.this
        on = join.args.get("on")
        if not (isinstance(table, exp.Table) and not table.db and table.name in ctes and not join.side
                and (join.kind or "").upper() in ("", "CROSS", "INNER") and not join.args.get("using")
                and (on is None or isinstance(on, exp.Boolean) and on.this is True)):
            continue
        alias = table.alias_or_name
        reads = [c for c in tree.find_all(exp.Column) if c.table == alias]
        outputs = {output_name(e) for e in ctes[table.name].expressions}
        if not all(c.name in outputs and (isinstance(c.parent, ONE_ROW_READS) and c.parent.this is c
                                          or not c.find_ancestor(*AGGREGATES)) for c in reads):
            continue
        group = tree.args.get("group")
        for key in list(group.expressions) if group else []:
            if isinstance(key, exp.Column) and key.table == alias:
                key.pop()
        if group is not None and not group.expressions:
            tree.set("group", None)
        for column in [c for c in tree.find_all(exp.Column) if c.table == alias]:
            value = exp.Subquery(this=exp.select(exp.column(column.name)).from_(table.name))
            read = column.parent if isinstance(column.parent, ONE_ROW_READS) else column
            replace_keeping_precedence(read, value)
        join.pop()
    if not tree.args.get("joins"):
        tree.set("joins", None)
    return tree


def _one_aggregate_row(select: exp.Expression) -> bool:
    """Whether `select` is one row of aggregates: no GROUP BY, every output an aggregate, nothing to cut rows."""
    return (isinstance(select, exp.Select) and bool(select.expressions)
            and not any(select.args.get(k) for k in ("group", "having", "distinct", "order", "limit", "offset",
                                                       "with_"))
            and all(e.find(*AGGREGATES) and not e.find(exp.Window) for e in select.expressions))


def _over_all(total: exp.Expression, alias: str) -> exp.Window:
    """`total` as a window over every row the query reads, its columns read from `alias`."""
    total = total.copy()
    for column in total.find_all(exp.Column):
        column.set("table", exp.to_identifier(alias))
    return exp.Window(this=total, over="OVER")


def projection_over_aggregates(tree: exp.Select, schema: PrivacySchema) -> exp.Select:
    """`SELECT f(c) FROM (SELECT k, COUNT(*) AS c FROM … GROUP BY k) t WHERE g(c) ORDER BY h(c) LIMIT n` (or the
    same over a WITH query) is the inner query with its released values post-processed: `SELECT f(COUNT(*)) …
    GROUP BY k HAVING g(COUNT(*)) ORDER BY h(COUNT(*)) LIMIT n`. A window of the outer query (`rank() OVER (ORDER
    BY c DESC)`, `SUM(c) OVER (ORDER BY k)`) runs over the released rows after HAVING, as it ran over t's rows after
    WHERE. The inner query's ORDER BY orders the rows where the outer query does not (Metabase reads a saved
    question as `SELECT … FROM (… ORDER BY k) source LIMIT 1048575`, relying on PostgreSQL keeping that order); its
    LIMIT and OFFSET are kept where nothing outside comes between them and the rows (no WHERE, ORDER BY, OFFSET or
    window outside). Anything else is left as written."""
    inner = _source_select(tree)
    if (inner is None or tree.args.get("joins") or tree.args.get("group") or tree.args.get("having")
            or tree.args.get("distinct") or any(_aggregates_rows(e) for e in tree.expressions)
            or not any(e.find(*AGGREGATES) for e in inner.expressions) or inner.find(exp.Window)
            or any(inner.args.get(k) for k in ("distinct", "with_"))
            or (inner.args.get("limit") or inner.args.get("offset"))
            and (any(tree.args.get(k) for k in ("where", "order", "offset")) or tree.find(exp.Window))):
        return tree
    alias = tree.args["from_"].this.alias_or_name
    defined = {output_name(e): (e.this if isinstance(e, exp.Alias) else e) for e in inner.expressions}
    inner_order = _order_as_expressions(inner, defined)

    def inlined(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and node.name in defined and node.table in ("", alias):
            value = defined[node.name].copy()
            return value if isinstance(value, exp.Func | exp.Column | exp.Literal | exp.Paren) else exp.Paren(
                this=value)
        return node

    outputs = []
    for e in tree.expressions:  # `*` and `t.*` are the inner query's outputs, where they stand
        if isinstance(e, exp.Star) or isinstance(e, exp.Column) and isinstance(e.this, exp.Star) \
                and e.table in ("", alias):
            outputs += [o.copy() for o in inner.expressions]
        else:
            outputs.append(exp.alias_(e.this if isinstance(e, exp.Alias) else e, output_name(e)).transform(inlined))
    merged = inner.copy()
    merged.set("expressions", outputs)
    merged.set("order", inner_order)
    merged.set("group", _group_as_expressions(inner, defined, schema))
    if tree.args.get("where"):
        condition = tree.args["where"].this.transform(inlined)
        having = merged.args.get("having")
        merged.set("having", exp.Having(this=exp.and_(having.this, condition) if having else condition))
    for key in ("order", "offset"):
        if tree.args.get(key):
            merged.set(key, tree.args[key].transform(inlined))
    if tree.args.get("limit"):
        limit = _tighter_limit(merged.args.get("limit"), tree.args["limit"].transform(inlined))
        if limit is None:
            return tree  # LIMITs that are not both constants: left as written
        merged.set("limit", limit)
    return merged


def _order_as_expressions(select: exp.Select, defined: dict[str, exp.Expression]) -> exp.Order | None:
    """`select`'s ORDER BY with its positions (ORDER BY 2) and output names written out as the expressions they
    stand for, so that it means the same under another SELECT list."""
    order = select.args.get("order")
    if order is None:
        return None
    values = list(defined.values())

    def written_out(ordered: exp.Ordered) -> exp.Ordered:
        key = ordered.this
        if isinstance(key, exp.Literal) and not key.is_string and key.this.isdigit() \
                and 1 <= int(key.this) <= len(values):
            key = values[int(key.this) - 1]
        elif isinstance(key, exp.Column) and not key.table and key.name in defined:
            key = defined[key.name]
        return ordered.__class__(**{**ordered.args, "this": key.copy()})
    return exp.Order(expressions=[written_out(o) for o in order.expressions])


def _group_as_expressions(select: exp.Select, defined: dict[str, exp.Expression],
                          schema: PrivacySchema) -> exp.Group | None:
    """`select`'s GROUP BY with its positions (GROUP BY 1) and output names written out as the expressions they
    stand for, so that it means the same under another SELECT list. A name that is also a column of a table it
    reads stays the column (PostgreSQL reads a GROUP BY name as an input column first)."""
    if select.args.get("group") is None:
        return None
    group = select.args["group"].copy()
    values = list(defined.values())
    columns = {c for t in select.find_all(exp.Table) if t.name in schema.tables for c in schema.tables[t.name].columns}

    def written_out(key: exp.Expression) -> exp.Expression:
        if isinstance(key, exp.Literal) and not key.is_string and key.this.isdigit() \
                and 1 <= int(key.this) <= len(values):
            return values[int(key.this) - 1].copy()
        if isinstance(key, exp.Column) and not key.table and key.name in defined and key.name not in columns:
            return defined[key.name].copy()
        return key
    group.set("expressions", [written_out(k) for k in group.expressions])
    return group


def _tighter_limit(inner: exp.Limit | None, outer: exp.Limit) -> exp.Limit | None:
    """The LIMIT of a query under another LIMIT: the outer one alone, or the smaller of two constants; None for
    two that are not both constants."""
    def count(limit: exp.Limit) -> int | None:
        value = limit.expression
        return int(value.this) if isinstance(value, exp.Literal) and value.this.isdigit() else None
    if inner is None:
        return outer
    if count(inner) is None or count(outer) is None:
        return None
    return inner if count(inner) <= count(outer) else outer


def _aggregates_rows(node: exp.Expression) -> bool:
    """Whether `node` aggregates rows: an aggregate outside any window (`SUM(c) OVER (...)` runs over rows)."""
    return any(found.find_ancestor(exp.Window) is None for found in node.find_all(*AGGREGATES))


def semijoin_selects(tree: exp.Select) -> list[exp.Select]:
    """The SELECTs of the EXISTS / IN (SELECT ...) conditions in `tree`'s WHERE clause."""
    where = tree.args.get("where")
    if where is None:
        return []
    found = []
    for node in where.walk():
        if node.find_ancestor(exp.Select) is not tree:  # one level only: not a subquery's own subqueries
            continue
        if isinstance(node, exp.Exists) and isinstance(node.this, exp.Select):
            found.append(node.this)
        elif isinstance(node, exp.In) and isinstance(node.args.get("query"), exp.Subquery) \
                and isinstance(node.args["query"].this, exp.Select):
            found.append(node.args["query"].this)
    return found
