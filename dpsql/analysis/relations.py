"""Pass: the relation a query reads. Its tables and their declarations, the column = column conditions that
join them, and the EXISTS / IN subqueries of WHERE with their own tables.

Rule: every table read is a declared one, registered under its alias; the join conditions are the
column = column conjuncts of WHERE and ON (the only conditions the later passes rely on for bounds: any
other condition can only drop joined rows); FULL, CROSS and NATURAL joins and USING are refused, and a
subquery in WHERE must be a conjunct of its own, so that it only ever filters the outer rows. A query that
reads no private table is refused: dpsql answers questions about private data.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.analysis import windowed
from dpsql.analysis.scope import Equality, Scope, Semijoin
from dpsql.errors import PrivacyRefusal, UnsupportedQuery
from dpsql.sql import operands, semijoin_selects, windowed_sources


def read(scope: Scope) -> None:
    """Register the query's tables and subqueries in `scope`; set its joins, private aliases, join equalities
    and semijoins."""
    tree = scope.tree
    derived = scope.from_ is not None
    for alias, select in ({} if derived else windowed_sources(tree)).items():
        scope.aliases[alias], scope.windowed[alias] = windowed.read(scope, alias, select)
    joins = [bounded_source(join, scope.read_as, scope.unit_links) for join in tree.args.get("joins") or []]
    for source in [tree.args["from_"].this, *(j.this for j in joins)]:
        if derived:
            break
        if source.alias_or_name in scope.read_as:  # registered by `derived`, or a windowed source
            continue
        if not isinstance(source, exp.Table):
            raise UnsupportedQuery("only tables may appear in FROM and JOIN",
                                   "name the declared tables in FROM and JOIN (\\dt lists them), or a per-unit "
                                   "subquery: FROM (SELECT <the unit's column>, COUNT(*) AS n FROM t GROUP BY 1) s")
        scope.aliases[source.alias_or_name] = scope.schema.tables[source.name]
    private = [a for a, t in scope.aliases.items() if not t.public]
    scope.outer = list(scope.aliases)  # the query's own tables; subqueries' and dpsql's joins come later
    semijoins = _semijoins(scope)
    equalities = _equalities(tree, joins)
    if not private:
        raise PrivacyRefusal("the query reads only public tables",
                             "query public tables directly; dpsql answers questions about private data")
    for node in [tree.args.get("where"), *(j.args.get("on") for j in joins)]:
        if node is not None:
            scope.exprs.check(node)
    scope.joins, scope.private, scope.equalities, scope.semijoins = joins, private, equalities, semijoins


def bounded_source(node: exp.From | exp.Join, bounded: dict[str, exp.Subquery],
                   links: dict[str, exp.Expression] | None = None) -> exp.From | exp.Join:
    """A FROM or JOIN clause, reading the SQL the analysis wrote for its source where it wrote some (a bounded
    per-unit subquery, a windowed source), its ON with the unit link
    `derived` found for it (`derived._link_to_unit`)."""
    subquery, link = bounded.get(node.this.alias_or_name), (links or {}).get(node.this.alias_or_name)
    if subquery is None and link is None:
        return node
    copy = node.copy()
    if subquery is not None:
        copy.set("this", subquery.copy())
    if link is not None:
        copy.set("on", exp.and_(copy.args["on"], link.copy()))
    return copy


def _equalities(tree: exp.Select, joins: list[exp.Join]) -> list[Equality]:
    """Column = column conjuncts of WHERE and of every ON: the join conditions."""
    conditions = [tree.args["where"].this] if tree.args.get("where") else []
    for join in joins:
        if join.side.upper() == "FULL" or join.kind.upper() in ("CROSS", "NATURAL"):
            raise UnsupportedQuery(f"{(join.side or join.kind).upper()} JOIN is not supported",
                                   "use an inner or LEFT/RIGHT join on the declared key")
        if join.args.get("using"):
            raise UnsupportedQuery("JOIN ... USING is not supported", "write JOIN ... ON a.x = b.x")
        if join.args.get("on") is not None:
            conditions.append(join.args["on"])
    return column_equalities(conditions)


def _semijoins(scope: Scope) -> list[Semijoin]:
    """The WHERE clause's EXISTS and IN subqueries, their tables registered under their own aliases."""
    where = scope.tree.args.get("where")
    selects = semijoin_selects(scope.tree)
    if not selects:
        return []
    conjuncts = {id(c) for c in operands(where.this)}
    found = []
    for select in selects:
        condition = select.parent.parent if isinstance(select.parent, exp.Subquery) else select.parent
        top = condition.parent if isinstance(condition.parent, exp.Not) else condition
        while isinstance(top.parent, exp.Paren):
            top = top.parent
        if id(top.unnest()) not in conjuncts:
            raise UnsupportedQuery("EXISTS and IN (SELECT ...) must each be a condition of their own, joined "
                                   "to the rest of WHERE by AND", "move OR-ed subqueries into separate queries")
        aliases = []
        sub_joins = list(select.args.get("joins") or [])
        if select.args.get("from_") is None:
            raise UnsupportedQuery("a subquery in WHERE needs a FROM clause",
                                   "give the subquery a table: WHERE k IN (SELECT k FROM t WHERE ...)")
        for source in [select.args["from_"].this, *(j.this for j in sub_joins)]:
            if not isinstance(source, exp.Table):
                raise UnsupportedQuery("only tables may appear in a subquery's FROM and JOIN",
                                       "name declared tables inside the subquery: WHERE k IN (SELECT k FROM t JOIN u "
                                       "ON ...)")
            alias = source.alias_or_name
            if alias in scope.aliases:
                raise UnsupportedQuery(f'the name "{alias}" is used both outside a subquery and inside it',
                                       "give the subquery's tables aliases of their own, e.g. EXISTS (SELECT 1 "
                                       f"FROM {source.name} {source.name[0]}2 WHERE ...)")
            scope.aliases[alias] = scope.schema.tables[source.name]
            aliases.append(alias)
        if any(j.side or j.kind.upper() not in ("", "INNER") for j in sub_joins):
            raise UnsupportedQuery("a subquery in WHERE may use inner joins only",
                                   "use an inner JOIN inside the subquery, or write the outer join in the main query")
        conditions = [select.args["where"].this] if select.args.get("where") else []
        equalities = column_equalities(conditions + [j.args["on"] for j in sub_joins if j.args.get("on")])
        if isinstance(condition, exp.In):
            value = select.expressions[0].unalias()
            if isinstance(condition.this, exp.Column) and isinstance(value, exp.Column):
                equalities.append((condition.this, value))
        found.append(Semijoin(aliases, equalities))
    return found


def column_equalities(conditions: list[exp.Expression]) -> list[Equality]:
    """The column = column conjuncts of `conditions` between two different tables."""
    pairs = []
    for condition in conditions:
        for conjunct in operands(condition):
            if (isinstance(conjunct, exp.EQ) and isinstance(conjunct.this, exp.Column)
                    and isinstance(conjunct.expression, exp.Column)
                    and conjunct.this.table != conjunct.expression.table):
                pairs.append((conjunct.this, conjunct.expression))
    return pairs
