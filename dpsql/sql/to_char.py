"""PostgreSQL's to_char(timestamp, format) for released dates and times (`to_char(date_trunc('month', day), 'Mon
YYYY')` over a released key is post-processing). The template patterns are PostgreSQL's ("Template Patterns for
Date/Time Formatting"), in its C locale: the longest pattern matches first; MONTH, Month, month and the like set
the case of a name, the numeric patterns take any case; FM drops a field's padding, TH and th add an ordinal
suffix, text in double quotes and a backslash-escaped character are copied, anything else is copied as it is.
Time zone patterns (TZ, OF, TZH, TZM) are refused: a released timestamp carries no zone."""

from __future__ import annotations

import datetime
import functools
import math
from collections.abc import Iterator
from decimal import ROUND_HALF_UP, Decimal
from typing import NamedTuple

from sqlglot import exp
from sqlglot.dialects.postgres import Postgres

from dpsql.errors import UnsupportedQuery

_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")
_DAYS = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_ROMAN = ("I", "II", "III", "IV", "V", "VI", "VII", "VIII", "IX", "X", "XI", "XII")
_NAME_WIDTH = 9  # a full month or day name is blank-padded to the longest (Wednesday, September)
_ZONES = ("tzh", "tzm", "tz", "of")


def _hour12(t: datetime.datetime) -> int:
    return (t.hour + 11) % 12 + 1


def _year_digits(year: int, digits: int) -> tuple[int, int]:
    return year % 10 ** digits, digits


# numeric patterns (matched in any case): the value and its zero-padded width
_NUMBERS = {
    "yyyy": lambda t: (t.year, 4), "yyy": lambda t: _year_digits(t.year, 3), "yy": lambda t: _year_digits(t.year, 2),
    "y": lambda t: _year_digits(t.year, 1),
    "iyyy": lambda t: (t.isocalendar()[0], 4), "iyy": lambda t: _year_digits(t.isocalendar()[0], 3),
    "iy": lambda t: _year_digits(t.isocalendar()[0], 2), "i": lambda t: _year_digits(t.isocalendar()[0], 1),
    "mm": lambda t: (t.month, 2), "ddd": lambda t: (t.timetuple().tm_yday, 3), "dd": lambda t: (t.day, 2),
    "d": lambda t: (t.isoweekday() % 7 + 1, 1), "id": lambda t: (t.isoweekday(), 1),
    "iddd": lambda t: ((t.isocalendar()[1] - 1) * 7 + t.isoweekday(), 3),
    "hh24": lambda t: (t.hour, 2), "hh12": lambda t: (_hour12(t), 2), "hh": lambda t: (_hour12(t), 2),
    "mi": lambda t: (t.minute, 2), "ss": lambda t: (t.second, 2), "ms": lambda t: (t.microsecond // 1000, 3),
    "us": lambda t: (t.microsecond, 6), "sssss": lambda t: (t.hour * 3600 + t.minute * 60 + t.second, 0),
    "ssss": lambda t: (t.hour * 3600 + t.minute * 60 + t.second, 0),
    "ww": lambda t: ((t.timetuple().tm_yday - 1) // 7 + 1, 2), "w": lambda t: ((t.day - 1) // 7 + 1, 1),
    "iw": lambda t: (t.isocalendar()[1], 2), "cc": lambda t: ((t.year + 99) // 100, 2),
    "q": lambda t: ((t.month + 2) // 3, 1),
    "j": lambda t: (t.toordinal() + 1721425, 0),
}
# patterns whose case sets the case of what they print
_WORDS = ("MONTH", "Month", "month", "MON", "Mon", "mon", "DAY", "Day", "day", "DY", "Dy", "dy", "RM", "rm", "A.M.",
          "a.m.", "P.M.", "p.m.", "AM", "am", "PM", "pm", "A.D.", "a.d.", "B.C.", "b.c.", "AD", "ad", "BC", "bc")
_PATTERNS = sorted([*_NUMBERS, "y,yyy", *_WORDS, *_ZONES], key=len, reverse=True)  # y,yyy: the year, a comma


def template_of(node: exp.TimeToStr) -> str:
    """The format of `node` as the analyst wrote it (sqlglot keeps it in strftime's spelling)."""
    return _written(node.args["format"].this)


@functools.lru_cache(maxsize=256)
def _written(strftime: str) -> str:
    """PostgreSQL's spelling of sqlglot's `strftime` format, once per format rather than once per released row."""
    quoted = Postgres().generator().format_time(exp.TimeToStr(this=exp.Null(), format=exp.Literal.string(strftime)))
    return quoted[1:-1].replace("''", "'")


def to_char(value: datetime.date, template: str) -> str:
    """`value` (a date is read as its midnight) formatted as PostgreSQL's to_char formats a timestamp."""
    if not isinstance(value, datetime.datetime):
        value = datetime.datetime(value.year, value.month, value.day)
    out: list[str] = []
    for part in _parts(template):
        if part.kind != "field":  # copied text; a modifier prints nothing
            out.append(part.text if part.kind == "text" else "")
            continue
        text, number = _field(part.text, value, part.fill)
        if number is not None and part.suffix:
            text += _ordinal(number).upper() if part.suffix == "TH" else _ordinal(number)
        out.append(text)
    return "".join(out)


class _Part(NamedTuple):
    kind: str  # "field" (a pattern), "text" (copied) or "modifier" (fx, tm, sp: nothing printed)
    text: str  # the pattern as written, the text copied, or the modifier in lower case
    fill: bool = True  # a field: padded (no FM before it)
    suffix: str = ""  # a numeric field's TH or th


def _parts(template: str) -> Iterator[_Part]:
    """The template read as PostgreSQL reads it, part by part."""
    i, fill = 0, True
    while i < len(template):
        rest = template[i:]
        if rest[:2].lower() == "fm":
            fill, i = False, i + 2
            continue
        if rest[:2].lower() in ("fx", "tm", "sp"):  # exact matching, translation, spelling: nothing in C output
            yield _Part("modifier", rest[:2].lower())
            i += 2
            continue
        if rest[0] == '"':
            end = i + 1
            while end < len(template) and template[end] != '"':
                end += 2 if template[end] == "\\" else 1
            yield _Part("text", template[i + 1:end].replace('\\"', '"'))
            i = end + 1
            continue
        if rest[0] == "\\" and len(rest) > 1:
            yield _Part("text", rest[1])
            i += 2
            continue
        pattern = next((p for p in _PATTERNS if (rest.startswith(p) if p in _WORDS else rest[:len(p)].lower() == p)),
                       None)
        if pattern is None:
            yield _Part("text", rest[0])
            i += 1
            continue
        i += len(pattern)
        numeric = pattern.lower() in _NUMBERS or pattern.lower() == "y,yyy"
        suffix = template[i:i + 2] if numeric and template[i:i + 2] in ("TH", "th") else ""
        i += len(suffix)
        yield _Part("field", pattern, fill, suffix)
        fill = True


# the fields and separators that sqlglot spells alike in strftime (DuckDB) and in Java's patterns (Spark): names,
# FM, TH, ISO fields and letters in quoted text have no faithful spelling there ('Day' became '%uay')
_PORTABLE_FIELDS = ("yyyy", "mm", "dd", "hh24", "mi", "ss")
_PORTABLE_TEXT = set(" -/:.,_")


def portable(template: str) -> bool:
    """Whether an engine that is not PostgreSQL prints `template` as PostgreSQL does (`_PORTABLE_FIELDS`)."""
    return all(part.fill and not part.suffix and part.text.lower() in _PORTABLE_FIELDS if part.kind == "field"
               else part.kind == "text" and set(part.text) <= _PORTABLE_TEXT for part in _parts(template))


# the period each pattern reads (a time truncated to it prints the same): an ISO year or week is its Monday's
_PERIODS = {"year": ("yyyy", "yyy", "yy", "y", "y,yyy", "cc", "ad", "bc", "a.d.", "b.c."),
            "quarter": ("q",), "month": ("mm", "month", "mon", "rm"), "week": ("iyyy", "iyy", "iy", "i", "iw"),
            "day": ("ddd", "dd", "d", "id", "iddd", "day", "dy", "ww", "w", "j"),
            "hour": ("hh24", "hh12", "hh", "am", "pm", "a.m.", "p.m."), "minute": ("mi",)}
_FINER_FIRST = ("minute", "hour", "day", "week", "month", "quarter", "year")


def finest_period(template: str) -> str | None:
    """The shortest period (date_trunc's unit) whose start prints as every time in it does under `template`:
    to_char(t, template) = to_char(date_trunc(unit, t), template). None where a pattern reads seconds or a time
    zone, or names are translated (TM: the database's locale, which Python does not know)."""
    read = set()
    for part in _parts(template):
        if part.kind == "modifier" and part.text == "tm":
            return None
        if part.kind == "field":
            unit = next((u for u, patterns in _PERIODS.items() if part.text.lower() in patterns), None)
            if unit is None:
                return None
            read.add(unit)
    return next((u for u in _FINER_FIRST if u in read), "year")


def _field(pattern: str, t: datetime.datetime, fill: bool) -> tuple[str, int | None]:
    """What `pattern` prints for `t`, and the number it printed (for TH), if it printed one."""
    lower = pattern.lower()
    if lower in _ZONES:
        raise UnsupportedQuery(f"to_char's time zone pattern {pattern} is not answered over released values",
                               "format the time without TZ, OF, TZH or TZM")
    if lower == "y,yyy":
        return f"{t.year // 1000},{t.year % 1000:03d}", t.year
    if lower in _NUMBERS:
        number, width = _NUMBERS[lower](t)
        return (f"{number:0{width}d}" if fill else str(number)), number
    if lower in ("month", "mon", "day", "dy"):
        name = _MONTHS[t.month - 1] if lower.startswith("mon") else _DAYS[t.isoweekday() % 7]
        name = name if lower in ("month", "day") else name[:3]
        name = name.upper() if pattern.isupper() else name.lower() if pattern.islower() else name
        return (name.ljust(_NAME_WIDTH) if fill and lower in ("month", "day") else name), None
    if lower == "rm":
        numeral = _ROMAN[t.month - 1]
        numeral = numeral if pattern == "RM" else numeral.lower()
        return (numeral.ljust(4) if fill else numeral), None
    if lower.replace(".", "") in ("am", "pm"):
        marker = "PM" if t.hour >= 12 else "AM"
        marker = marker if "." not in pattern else f"{marker[0]}.{marker[1]}."
        return (marker if pattern[0].isupper() else marker.lower()), None
    era = "AD" if "." not in pattern else "A.D."  # (released dates are of years 1 and on)
    return (era if pattern[0].isupper() else era.lower()), None


def _ordinal(number: int) -> str:
    if number % 100 in (11, 12, 13):
        return "th"
    return {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")


# Number templates ("Template Patterns for Numeric Formatting"): the patterns computed here, in the C locale (D is
# '.', G is ','); the others are refused by name.
_DOUBLE_DIGITS = 15  # DBL_DIG
_NUMBER_PATTERNS_REFUSED = ("eeee", "mi", "pl", "pr", "rn", "sg", "sp", "th", "b", "c", "e", "l", "s", "v")


def number_to_char(value: int | float | Decimal, template: str) -> str:
    """`value` formatted as PostgreSQL's to_char formats a number: an int as a bigint, a float as a double
    precision (its sign bit kept, rounded as printf rounds), a Decimal as a numeric (rounded half away from zero).
    9 is a digit (a leading zero is blank), 0 a digit always shown, `.` or D the decimal point, `,` or G a group
    separator; FM drops the padding and a fraction's trailing zeros; an integer part wider than the template
    fills every digit with '#'. The one sign, '-' or a blank, comes just before the number's first character."""
    tokens, fill = _number_tokens(template)
    pre = sum(1 for kind, _ in tokens if kind == "digit-int")
    post = sum(1 for kind, _ in tokens if kind == "digit-frac")
    negative, whole, fraction = _rounded(value, post)
    post = len(fraction)  # a double's fifteen digits may leave fewer places than the template has
    overflow = len(whole) > pre
    if overflow:
        whole, fraction = "#" * pre, "#" * len(fraction)
    elif whole == "0" and post:
        whole = ""  # 0.5 is .5 unless a 0 asks for the zero
    integer_zeros = [i for i, (kind, text) in enumerate(t for t in tokens if t[0] == "digit-int") if text == "0"]
    zero_start = integer_zeros[0] if integer_zeros else pre
    if fill and not overflow:
        fraction_zeros = [i for i, (kind, text) in enumerate(t for t in tokens if t[0] == "digit-frac") if text == "0"]
        kept = max(len(fraction.rstrip("0")), fraction_zeros[-1] + 1 if fraction_zeros else 0)
        fraction = fraction[:kept]
        if not whole and not fraction and zero_start == pre:
            whole = "0"  # nothing else would show the zero
    sign = "-" if negative else ("" if fill else " ")
    out, started, digit, decimal = [], False, 0, 0
    for kind, text in tokens:
        if kind == "digit-int":
            shown = whole[digit - (pre - len(whole))] if digit >= pre - len(whole) else "0" if digit >= zero_start \
                else None
            digit += 1
            if shown is None:
                out.append("" if fill else " ")
                continue
            if not started:
                out.append(sign)
                started = True
            out.append(shown)
        elif kind == "point":
            if not (post or overflow):
                continue
            if not started:
                out.append(sign)
                started = True
            out.append(".")
        elif kind == "digit-frac":
            out.append(fraction[decimal] if decimal < len(fraction) else "")
            decimal += 1
        elif kind == "group":
            out.append("," if started else "" if fill else " ")
        else:
            out.append(text)
    return "".join(out)


def _number_tokens(template: str) -> tuple[list[tuple[str, str]], bool]:
    """The template's tokens (kind, text) and whether FM is in it; a pattern not computed here is refused."""
    tokens: list[tuple[str, str]] = []
    fill, point, i = False, False, 0
    while i < len(template):
        rest = template[i:]
        if rest[:2].lower() == "fm":
            fill, i = True, i + 2
            continue
        if rest[0] == '"':
            end = i + 1
            while end < len(template) and template[end] != '"':
                end += 2 if template[end] == "\\" else 1
            tokens.append(("text", template[i + 1:end].replace('\\"', '"')))
            i = end + 1
            continue
        if rest[0] == "\\" and len(rest) > 1:
            tokens.append(("text", rest[1]))
            i += 2
            continue
        refused = next((p for p in _NUMBER_PATTERNS_REFUSED if rest[:len(p)].lower() == p), None)
        if refused is not None:
            raise UnsupportedQuery(f"to_char's number pattern {rest[:len(refused)]} is not computed over noisy values",
                                   "format with FM, 9, 0, '.', ',', D and G, e.g. to_char(SUM(x), 'FM999,999,990.00'),"
                                   " or put a sign or currency in double quotes")
        char = rest[0]
        if char in "90":
            tokens.append(("digit-frac" if point else "digit-int", char))
        elif char in ".Dd":
            if point:
                raise UnsupportedQuery(f"to_char template {template!r} has two decimal points",
                                       "write one '.' or D, e.g. 'FM999,990.00'")
            point = True
            tokens.append(("point", "."))
        elif char in ",Gg":
            if point:
                raise UnsupportedQuery(f"to_char template {template!r} has a group separator after the decimal point",
                                       "separate groups of the integer part only, e.g. 'FM999,990.00'")
            tokens.append(("group", ","))
        else:
            tokens.append(("text", char))
        i += 1
    return tokens, fill


def _rounded(value: int | float | Decimal, post: int) -> tuple[bool, str, str]:
    """Whether the number shows a minus, and its integer and fraction digits rounded to `post` places, as
    PostgreSQL's to_char of a bigint, a double precision or a numeric rounds them."""
    if isinstance(value, Decimal):
        rounded = abs(value).quantize(Decimal(1).scaleb(-post), rounding=ROUND_HALF_UP)
        text, negative = f"{rounded:f}", value < 0 and rounded != 0
    elif isinstance(value, int):
        text, negative = str(abs(value)) + ("." + "0" * post if post else ""), value < 0
    else:
        if not math.isfinite(value):
            return value < 0, "#" * 400, ""
        digits = len(f"{abs(value):.0f}")  # a double holds 15 significant digits: PostgreSQL prints no more
        text, negative = f"{abs(value):.{max(0, min(post, _DOUBLE_DIGITS - digits))}f}", math.copysign(1.0, value) < 0
    whole, _, fraction = text.partition(".")
    return negative, whole, fraction
