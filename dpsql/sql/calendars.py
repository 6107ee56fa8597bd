"""An inline list of keys joined to a table (a calendar to fill gaps, a list of values) is the table's rows filtered
to the list.

`SELECT d::date, COUNT(v.visit_id) FROM generate_series(DATE '2024-01-01', DATE '2024-01-31', INTERVAL '1 day') d
LEFT JOIN visits v ON v.day = d::date GROUP BY 1` and `SELECT c.k, COUNT(v.visit_id) FROM (VALUES ('lab'), ('dental'))
AS c(k) LEFT JOIN visits v ON v.category = c.k GROUP BY c.k` group a table's rows by keys that a constant relation
lists, and keep every listed key, empty ones too. That is `SELECT v.day, COUNT(v.visit_id) FROM visits v WHERE v.day
IN (DATE '2024-01-01', …) GROUP BY v.day` with the listed keys released like a declared domain (`analysis.groups`):
every one, with no partition selection, since no other row reaches a group. The relation must list distinct,
non-NULL constants (text, integers, or dates: a generate_series of dates by whole days, weeks, months or years, or of
integers), be the FROM, joined by an inner or LEFT join on one equality of its column with the table's expression;
the rest of the ON reads the table alone and moves to the WHERE, and the WHERE does not read the list. Under a LEFT
join COUNT(*) would count the list's own row where nothing matches: it is refused with a hint to count a column.
A list joined so to a grouped subquery on one of its keys, to fill the groups it lacks (`SELECT m.month,
COALESCE(t.n, 0) FROM generate_series(1, 12) m(month) LEFT JOIN (SELECT EXTRACT(MONTH FROM day)::int AS month,
COUNT(*) AS n FROM visits GROUP BY 1) t ON t.month = m.month`), is the subquery kept to the list (`WHERE <its key> IN
(…)`), each listed key released, and the list's key read as the subquery's; so is a grid of lists CROSS JOINed
(months by categories).
Anything else is left as written (refused).
"""

from __future__ import annotations

import datetime

from sqlglot import exp

from dpsql.errors import UnsupportedQuery
from dpsql.sql.query import MAX_DOMAIN, operands, output_name
from dpsql.sql.shape import inline_ctes
from dpsql.sql.times import interval_step, time_value

MAX_LISTED = MAX_DOMAIN  # a longer list would not be released in full


def key_lists_as_in(tree: exp.Select) -> exp.Select | None:
    """The statement with its inline list of keys as an IN list on the joined table (the module's docstring), or
    None where it has no such list."""
    source = tree.args["from_"].this if tree.args.get("from_") else None
    listed = _listed(source)
    joins = tree.args.get("joins") or []
    if listed is not None:  # (a grouped WITH query joined to the lists: its subquery)
        kept = _groups_kept_to_lists(inline_ctes(tree.copy(), read_once=True))
        if kept is not None:
            return kept
    if listed is None or not joins or tree.args.get("with_"):
        return None
    alias, column, constants = listed
    join = joins[0]
    side = (join.side or "").upper()
    conjuncts = operands(join.args["on"]) if join.args.get("on") is not None else []
    if not _inner_or_left(join) or not conjuncts:
        return None
    matched = [c for c in conjuncts if isinstance(c, exp.EQ) and _pairs(c, alias, column) is not None]
    where = tree.args.get("where")
    if len(matched) != 1 or any(_reads(c, alias) for c in conjuncts if c is not matched[0]) \
            or any(_reads(j, alias) for j in joins[1:]) or (where is not None and _reads(where, alias)):
        return None  # (a WHERE on the list's key would drop listed keys that the IN list would release)
    key, counterpart = _pairs(matched[0], alias, column)
    if side == "LEFT" and any(isinstance(c.this, exp.Star) for c in tree.find_all(exp.Count)):
        raise UnsupportedQuery("COUNT(*) over a LEFT JOIN from a list of keys counts the list's own row where nothing "
                               "matches", f"count a column of the joined table: COUNT({counterpart.sql('postgres')})")
    rest = [c.copy() for c in conjuncts if c is not matched[0]]
    written = tree.copy()
    written.set("from_", exp.From(this=join.this.copy()))
    written.set("joins", [j.copy() for j in joins[1:]] or None)
    for item in written.expressions:  # each output keeps the name PostgreSQL gave it
        if _reads(item, alias) and not isinstance(item, exp.Alias):
            item.replace(exp.alias_(item.copy(), output_name(item)))
    written = _replaced(written, alias, column, key, counterpart)
    if any(c.table == alias for c in written.find_all(exp.Column)):
        return None  # the list read some other way: as written
    where = written.args["where"].this if written.args.get("where") else None
    written.set("where", exp.Where(this=exp.and_(*(c for c in (where, *rest, _in_list(counterpart, constants))
                                                   if c is not None))))
    return written


def _inner_or_left(join: exp.Join) -> bool:
    return (join.side or "").upper() in ("", "LEFT") and (join.kind or "").upper() in ("", "INNER", "OUTER")


def _in_list(key: exp.Expression, constants: list[exp.Expression]) -> exp.In:
    """`key IN (the listed constants)`; a period's start (date_trunc) compared as a date where the list is of dates,
    at midnight, as the key reads it."""
    listed = key.copy()
    if isinstance(listed, exp.TimestampTrunc | exp.DateTrunc) and constants[0].find(exp.Cast):
        listed = exp.cast(listed, exp.DataType.build("date"))
    return exp.In(this=listed, expressions=[c.copy() for c in constants])


def _groups_kept_to_lists(tree: exp.Select) -> exp.Select | None:
    """Lists of keys (CROSS JOINed to one another: a grid) LEFT JOINed to a grouped subquery on its keys, to fill
    the groups it lacks (`SELECT m.month, COALESCE(t.n, 0) FROM generate_series(1, 12) m(month) LEFT JOIN (SELECT
    EXTRACT(MONTH FROM day)::int AS month, COUNT(*) AS n FROM visits GROUP BY 1) t ON t.month = m.month`): the
    subquery kept to the listed keys (`WHERE <its key> IN (…)` for each list), each of which it then releases like a
    declared domain's, and each list's key read as the subquery's. Only an outer query that projects and orders (no
    WHERE, GROUP BY or aggregate of its own); None for anything else."""
    *crossed, join = tree.args.get("joins") or [None]
    lists = [_listed(tree.args["from_"].this), *(_listed(j.this) if _crossed(j) else None for j in crossed)]
    subquery = join.this if join is not None else None
    inner = subquery.this if isinstance(subquery, exp.Subquery) else None
    if any(listed is None for listed in lists) or not isinstance(inner, exp.Select) or not inner.args.get("group") \
            or not _inner_or_left(join) or any(tree.args.get(k) for k in ("where", "group", "having", "distinct",
                                                                          "with_")) \
            or any(e.find(exp.AggFunc, exp.Window) for e in tree.expressions):
        return None
    name = subquery.alias_or_name
    keys = _joined_outputs(join, lists, name)
    outputs = {output_name(e): e.unalias() for e in inner.expressions}
    if keys is None or any(k not in outputs or not _grouped_by(inner, outputs[k], k) for k in keys):
        return None
    kept = inner.copy()
    for (_, _, constants), key in zip(lists, keys, strict=True):
        kept.where(_in_list(outputs[key], constants), copy=False)
    written = tree.copy()
    written.set("from_", None)  # (the outer query's own clauses read the lists' keys; the subquery's do not)
    written.set("joins", None)

    def swap(node: exp.Expression) -> exp.Expression:
        for (alias, column, _), key in zip(lists, keys, strict=True):
            if isinstance(node, exp.Column) and _is_key(node, alias, column):
                return exp.column(key, table=name)
        return node
    written = written.transform(swap)
    if any(_reads(c, alias) for c in written.expressions for alias, _, _ in lists):
        return None
    written.set("from_", exp.From(this=exp.Subquery(this=kept, alias=exp.TableAlias(this=exp.to_identifier(name)))))
    return written


def _crossed(join: exp.Join) -> bool:
    """A CROSS JOIN (or a comma) of one list to the ones before."""
    return not join.args.get("on") and not join.args.get("using") and not join.side \
        and (join.kind or "CROSS").upper() == "CROSS"


def _joined_outputs(join: exp.Join, lists: list[tuple[str, str, list]], name: str) -> list[str] | None:
    """For each list, the subquery's output that the join equates with its key: one conjunct of the ON each (`t.k
    = m.k`, either way round), or one USING column each; None where the join says anything else."""
    using = join.args.get("using") or []
    if using:
        names = [u.name for u in using]
        columns = [column for _, column, _ in lists]
        return columns if sorted(names) == sorted(columns) and len(set(names)) == len(names) else None
    conjuncts = operands(join.args["on"]) if join.args.get("on") is not None else []
    found = []
    for alias, column, _ in lists:
        tied = [other.name for c in conjuncts if isinstance(c, exp.EQ)
                for key, other in ((c.this.unnest(), c.expression.unnest()), (c.expression.unnest(), c.this.unnest()))
                if isinstance(key, exp.Column) and _is_key(key, alias, column) and isinstance(other, exp.Column)
                and other.table == name]
        if len(tied) != 1:
            return None
        found.append(tied[0])
    return found if len(conjuncts) == len(lists) else None


def _grouped_by(select: exp.Select, key: exp.Expression, name: str) -> bool:
    """Whether the grouped `select` groups by `key`, its output `name` (GROUP BY the expression, its position, or
    its name)."""
    position = [output_name(e) for e in select.expressions].index(name) + 1
    for group in select.args["group"].expressions:
        if group == key or isinstance(group, exp.Literal) and group.is_int and int(group.this) == position \
                or isinstance(group, exp.Column) and not group.table and group.name == name:
            return True
    return False


def _listed(source: exp.Expression | None) -> tuple[str, str, list[exp.Expression]] | None:
    """(alias, column, the constants) of a VALUES list or a generate_series in FROM, or None."""
    if isinstance(source, exp.Values):
        table_alias = source.args.get("alias")
        columns = table_alias.columns if table_alias is not None else []
        rows = source.expressions
        if len(columns) != 1 or not rows or len(rows) > MAX_LISTED:
            return None
        constants = [row.expressions[0] if isinstance(row, exp.Tuple) and len(row.expressions) == 1 else None
                     for row in rows]
        if not all(isinstance(c, exp.Literal) for c in constants) or len({c.is_string for c in constants}) != 1 \
                or not all(c.is_string or c.is_int for c in constants):
            return None
        values = [c.this for c in constants]
        if len(set(values)) < len(values):
            return None  # a key listed twice doubles its rows in the join
        return table_alias.name, columns[0].name, [c.copy() for c in constants]
    if isinstance(source, exp.Table) and isinstance(source.this, exp.ExplodingGenerateSeries):
        table_alias = source.args.get("alias")
        if table_alias is None:
            return None
        columns = table_alias.columns
        column = columns[0].name if len(columns) == 1 else table_alias.name if not columns else None
        constants = _series(source.this)
        return None if column is None or constants is None else (table_alias.name, column, constants)
    return None


def _series(series: exp.ExplodingGenerateSeries) -> list[exp.Expression] | None:
    """The values of generate_series(start, stop[, step]) of integers, or of dates by whole days, weeks, months or
    years (each at midnight), as constants; None for anything else, or more than MAX_LISTED values."""
    start, stop, step = series.args.get("start"), series.args.get("end"), series.args.get("step")
    if isinstance(start, exp.Literal) and isinstance(stop, exp.Literal) and start.is_int and stop.is_int:
        by = 1 if step is None else int(step.this) if isinstance(step, exp.Literal) and step.is_int else 0
        numbers = range(int(start.this), int(stop.this) + (1 if by > 0 else -1), by) if by else range(0)
        return [exp.Literal.number(n) for n in numbers] if 0 < len(numbers) <= MAX_LISTED else None
    first, last = _midnight(start), _midnight(stop)
    if isinstance(step, exp.Cast) and step.to.is_type("interval") and isinstance(step.this, exp.Literal):
        step = exp.Interval(this=step.this.copy())  # '1 day'::interval
    by = interval_step(step) if step is not None else None
    if first is None or last is None or by is None or by.seconds or by.months < 0 or by.days < 0 \
            or not (by.months or by.days):
        return None
    dates, moment = [], first
    while moment <= last and len(dates) <= MAX_LISTED:
        dates.append(moment.date())
        moment = by.added_to(moment)  # from the last value, as PostgreSQL steps: Jan 31, Feb 29, Mar 29
    if not dates or len(dates) > MAX_LISTED:
        return None
    return [exp.cast(exp.Literal.string(d.isoformat()), exp.DataType.build("date")) for d in dates]


def _midnight(node: exp.Expression | None) -> datetime.datetime | None:
    """A constant date (DATE '2024-01-01', '2024-01-01'::date), or a timestamp at midnight, as a timestamp."""
    value = time_value(node, None) if node is not None else None
    if type(value) is datetime.date:
        return datetime.datetime.combine(value, datetime.time())
    if isinstance(value, datetime.datetime) and value.tzinfo is None and value.time() == datetime.time():
        return value
    return None


def _pairs(equality: exp.EQ, alias: str, column: str) -> tuple[exp.Expression, exp.Expression] | None:
    """(the list's key as the equality writes it, the table's expression it equals), where one side reads the list's
    column alone (bare, or cast: `d::date`) and the other does not read the list."""
    for key, other in ((equality.this, equality.expression), (equality.expression, equality.this)):
        key, other = key.unnest(), other.unnest()
        bare = key.this if isinstance(key, exp.Cast) else key
        if _is_key(bare, alias, column) and not _reads(other, alias) and other.find(exp.Column):
            return key, other
    return None


def _is_key(node: exp.Expression, alias: str, column: str) -> bool:
    return isinstance(node, exp.Column) and node.name == column and node.table in ("", alias)


def _reads(node: exp.Expression, alias: str) -> bool:
    """Whether `node` reads the list (its alias, or its column unqualified where the alias names it)."""
    return any(c.table == alias or (not c.table and c.name == alias) for c in node.find_all(exp.Column))


def _replaced(tree: exp.Select, alias: str, column: str, key: exp.Expression, counterpart: exp.Expression
              ) -> exp.Select:
    """Each reading of the list's key (as the join wrote it, or bare) as the table's expression it equals; a bare
    name in GROUP BY or ORDER BY that names an output is left to name it (the output now reads the table)."""
    spelled = key.sql("postgres")

    def is_key(node: exp.Expression) -> bool:
        return isinstance(node, exp.Column) and _is_key(node, alias, column) or (
            type(node) is type(key) and node.sql("postgres") == spelled)
    outputs = {output_name(e) for e in tree.expressions if is_key(e.unalias())}

    def swap(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and not node.table and node.name in outputs and (
                isinstance(node.parent, exp.Group | exp.Ordered)):
            return node  # the output of that name is the key
        return counterpart.copy() if is_key(node) else node
    return tree.transform(swap)
