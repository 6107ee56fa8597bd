"""Regular expressions (`x ~ 'pattern'`, `~*`, `SIMILAR TO`) that every backend compiles the same way.

PostgreSQL compiles a pattern when a row first reaches it, so an invalid pattern fails only where some row
does: its error would tell whether any row passes the query's other conditions. dpsql therefore answers a
pattern only after it has checked, before anything runs, that the pattern is one PostgreSQL compiles: a subset
of regular-expression syntax that PostgreSQL's, DuckDB's (RE2) and Spark's (Java) engines read alike:

- literal characters, and a backslash before a character that is not a letter or digit (that character);
- `\\d`, `\\w`, `\\s` and their capitals; `.`, `^`, `$`, `|`;
- groups `( … )` and `(?: … )`, and a leading `(?i)` (how `~*` is spelled for every backend);
- bracket expressions `[…]` and `[^…]` of characters, escaped characters, `\\d`, `\\w`, `\\s` and ranges
  `a-z` between two letters or two digits in order;
- quantifiers `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}` (m ≤ n ≤ 255, PostgreSQL's limit), each optionally lazy
  (`?` after it), after something they can repeat; a counted quantifier is not applied to a group that holds
  another (the work to match would multiply).

Anything else (POSIX classes such as `[[:alpha:]]`, back-references, PostgreSQL's own escapes such as `\\y`,
a stray `{`) is refused with what to write instead; a pattern over MAX_PATTERN characters too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlglot import exp

from dpsql.errors import UnsupportedQuery
from dpsql.sql.query import to_sql

MAX_PATTERN = 200  # characters
MAX_REPEAT = 255  # PostgreSQL's largest repetition count
CLASS_ESCAPES = set("dDwWsS")
CASE_INSENSITIVE = "(?i)"
HINT = "write it with literal characters, ., [a-z], \\d, \\w, \\s, groups ( ), | and the quantifiers * + ? {m,n}"


@dataclass
class _Reader:
    pattern: str
    at: int = 0
    written: str = ""  # how the analyst wrote the pattern, where it is a translation (SIMILAR TO)

    def peek(self, ahead: int = 0) -> str:
        index = self.at + ahead
        return self.pattern[index] if index < len(self.pattern) else ""

    def take(self) -> str:
        char = self.peek()
        self.at += 1
        return char

    def refuse(self, what: str) -> UnsupportedQuery:
        written = self.written or f"the regular expression '{self.pattern}'"
        return UnsupportedQuery(f"{written} {what}", HINT)


def check_regex(pattern: str, written: str = "") -> None:
    """Refuse `pattern` unless it lies in the subset every backend compiles alike (module docstring); `written`
    names it as the analyst wrote it where it is a translation ("the SIMILAR TO pattern '(('")."""
    if len(pattern) > MAX_PATTERN:
        raise UnsupportedQuery(f"the regular expression is {len(pattern)} characters long, over dpsql's "
                               f"{MAX_PATTERN}", "shorten it, or combine shorter conditions with AND and OR")
    reader = _Reader(pattern, len(CASE_INSENSITIVE) if pattern.startswith(CASE_INSENSITIVE) else 0, written)
    _alternatives(reader, depth=0)
    if reader.peek():  # only a ')' stops the top level early
        raise reader.refuse(f"has an unmatched ')' at position {reader.at + 1}")


def _alternatives(reader: _Reader, depth: int) -> bool:
    """Branches separated by '|', up to a ')' or the end; whether any holds a counted quantifier."""
    counted = False
    while True:
        counted |= _branch(reader, depth)
        if reader.peek() != "|":
            return counted
        reader.take()


def _branch(reader: _Reader, depth: int) -> bool:
    counted, repeatable = False, False  # whether the last item is something a quantifier may follow
    while reader.peek() and reader.peek() not in "|)":
        char = reader.peek()
        if char in "*+?{":
            if not repeatable:
                raise reader.refuse(f"has a quantifier {char!r} with nothing to repeat at position {reader.at + 1}")
            counted |= _quantifier(reader, inner_counted=repeatable == "counted group")
            repeatable = False
            continue
        repeatable = True
        if char == "(":
            reader.take()
            if reader.peek() == "?":
                if reader.pattern[reader.at:reader.at + 2] != "?:":
                    raise reader.refuse(f"has a group option at position {reader.at + 1}; only (?: ) and a "
                                        "leading (?i) are read alike by every backend")
                reader.at += 2
            inner = _alternatives(reader, depth + 1)
            if reader.take() != ")":
                raise reader.refuse("has an unmatched '('")
            counted |= inner
            repeatable = "counted group" if inner else True
        elif char == "[":
            _bracket(reader)
        elif char == "\\":
            _escape(reader, in_bracket=False)
        elif char == "}":
            raise reader.refuse(f"has a stray '}}' at position {reader.at + 1}")
        else:
            reader.take()
            repeatable = char not in "^$"
    return counted


def _quantifier(reader: _Reader, inner_counted: bool) -> bool:
    """A quantifier after an atom, optionally lazy; whether it is counted ({m,n})."""
    counted = reader.take() == "{"
    if counted:
        start = reader.at
        while reader.peek() and reader.peek() != "}":
            reader.take()
        if reader.take() != "}":
            raise reader.refuse("has a '{' without its '}'")
        low, comma, high = reader.pattern[start:reader.at - 1].partition(",")
        if not low.isdigit() or (high and not high.isdigit()):
            raise reader.refuse(f"has a repetition {{{reader.pattern[start:reader.at - 1]}}} that is not {{m}}, "
                                "{m,} or {m,n}")
        bounds = [int(low), int(high) if high else int(low)]
        if bounds[0] > bounds[1] or bounds[1] > MAX_REPEAT:
            raise reader.refuse(f"repeats {{{reader.pattern[start:reader.at - 1]}}}: counts must be in order and "
                                f"at most {MAX_REPEAT}")
        if inner_counted:
            raise reader.refuse("repeats a group that holds a counted repetition {m,n} with another")
    if reader.peek() == "?":
        reader.take()
    return counted


def _bracket(reader: _Reader) -> None:
    reader.take()
    if reader.peek() == "^":
        reader.take()
    items = 0
    while reader.peek() != "]":
        if not reader.peek():
            raise reader.refuse("has an unmatched '['")
        if reader.peek() == "[":
            raise reader.refuse("has a '[' inside a bracket expression (POSIX classes such as [[:alpha:]] are "
                                "read differently by each backend)")
        if reader.peek() == "\\":
            _escape(reader, in_bracket=True)
        else:
            first = reader.take()
            if reader.peek() == "-" and reader.peek(1) not in ("]", ""):
                reader.take()
                last = reader.take()
                if not (first.isascii() and last.isascii() and first.isalnum() and last.isalnum()
                        and first.isdigit() == last.isdigit() and first <= last):
                    raise reader.refuse(f"has a range {first}-{last}: ranges run between two letters or two "
                                        "digits, in order")
        items += 1
    reader.take()
    if not items:
        raise reader.refuse("has an empty bracket expression")


def _escape(reader: _Reader, in_bracket: bool) -> None:
    reader.take()
    char = reader.take()
    if not char:
        raise reader.refuse("ends with a backslash")
    if char.isascii() and char.isalnum() and (char not in CLASS_ESCAPES or (in_bracket and char.isupper())):
        raise reader.refuse(f"has the escape \\{char}, which the backends read differently; "
                            "\\d, \\w and \\s are read alike")


def like_regex(pattern: str, ignore_case: bool = False) -> re.Pattern:
    """PostgreSQL's LIKE pattern as a regular expression: % any text, _ one character, a backslash makes the next
    character itself."""
    parts, escaped = [], False
    for char in pattern:
        if escaped:
            parts.append(re.escape(char))
            escaped = False
        elif char == "\\":
            escaped = True
        else:
            parts.append(".*" if char == "%" else "." if char == "_" else re.escape(char))
    return re.compile("".join(parts), re.DOTALL | (re.IGNORECASE if ignore_case else 0))


def similar_to_regex(pattern: str) -> str:
    """PostgreSQL's own translation of a SIMILAR TO pattern (with its default escape, backslash) into the
    regular expression it matches the whole value against: `%` any text, `_` any character, `.` itself; the
    other regular-expression characters, and bracket expressions, as they are."""
    out, escaped, in_bracket = [], False, False
    for char in pattern:
        if escaped:
            out.append(char if char.isalnum() else "\\" + char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif in_bracket or char in "[]":  # a bracket expression is copied as it is
            out.append(char)
            in_bracket = (in_bracket or char == "[") and char != "]"
        elif char == "%":
            out.append(".*")
        elif char == "_":
            out.append(".")
        elif char in ".^$":
            out.append("\\" + char)
        else:
            out.append(char)
    if escaped:
        raise UnsupportedQuery(f"the SIMILAR TO pattern '{pattern}' ends with its escape character \\",
                               "escape it (\\\\) or remove it")
    return f"^(?:{''.join(out)})$"


def patterns_as_regex(tree: exp.Select) -> exp.Select:
    """One spelling of pattern matches: `x ~* 'p'` as `x ~ '(?i)p'` and `x SIMILAR TO 'p'` as `x ~ '^(?:…)$'`
    (PostgreSQL's own translation, `similar_to_regex`), which every backend then reads alike; the pattern is
    checked by the analysis (`check_regex`)."""
    for node in list(tree.find_all(exp.RegexpILike, exp.SimilarTo)):
        pattern = node.expression
        if node.args.get("escape") is not None:
            raise UnsupportedQuery("SIMILAR TO … ESCAPE is not supported", "use the default escape, \\")
        if not (isinstance(pattern, exp.Literal) and pattern.is_string):
            if isinstance(pattern, exp.Null):
                node.replace(exp.RegexpLike(this=node.this, expression=pattern))
                continue
            raise UnsupportedQuery(f"patterns must be string constants, not {to_sql(pattern)}",
                                   "write the pattern as a string constant: x ~ '^ab'")
        text = CASE_INSENSITIVE + pattern.this if isinstance(node, exp.RegexpILike) \
            else similar_to_regex(pattern.this)
        if isinstance(node, exp.SimilarTo):  # refused here, in the analyst's words, not in the translation's
            check_regex(text, f"the SIMILAR TO pattern '{pattern.this}' (read as '{text}')")
        node.replace(exp.RegexpLike(this=node.this, expression=exp.Literal.string(text)))
    return tree
