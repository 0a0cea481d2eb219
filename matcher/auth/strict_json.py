"""JSON read the one way every later reader will agree with, or refused.

Event bytes are signed; what matcher stores and republishes is what it parsed. Where
parsers differ (a key given twice, UTF-16 input, ``NaN``, a lone surrogate escape) the
bytes have no single meaning, so they are refused rather than read one of the ways. The
same goes for what Postgres' ``jsonb`` cannot hold (NUL in a string), for a number outside
the one number rule below (beyond a double's range, or a fraction whose decimal value is
not that of its double: what is stored and resumed would be another number than the one
signed), and for nesting past a bound, which would otherwise cost recursion
in every reader after us (Python's own limit is an exception in the middle of a batch, not
a rejection).
"""

from __future__ import annotations

import json
import math
import sys
from decimal import Decimal
from typing import Any

from matcher.domain.events import MAX_JSON_DEPTH, unstorable


class JsonRefused(ValueError):
    """The bytes are not JSON that matcher accepts; ``reason`` is the rejection's code."""

    def __init__(self, message: str, reason: str = "malformed") -> None:
        super().__init__(message)
        self.reason = reason  # malformed, ambiguous or limit_exceeded


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise JsonRefused(f"the key {key[:64]!r} appears twice in one object", "ambiguous")
            seen.add(key)
    return result


def _no_constants(name: str) -> Any:
    raise JsonRefused(f"{name} is not JSON (RFC 8259 has no non-finite numbers)")


# The number rule: every number is checked as it is parsed (the parser's hooks see each
# one), never guessed at from the text around it. A number is accepted when
# - as a double it is finite: every reader (JavaScript's JSON.parse, Go's float64, a
#   double in any SDK) gets a number, never Infinity or an error;
# - it is a fraction or exponent form whose decimal value is exactly its double's (as
#   written back, the shortest repr: what jsonb stores and the resume carries);
# - or it is an integer, kept exactly at every size within that range (Python and jsonb
#   hold integers exactly; a double reader gets the nearest double past 2**53).
# An integer of more digits than the largest double has is refused by its length before
# it is converted, so a long one costs a length check, not Python's quadratic conversion.
_MAX_INTEGER_DIGITS = len(str(int(sys.float_info.max)))  # 309


def _exact_float(text: str) -> float:
    """The double ``text`` parses to, when it is finite and its decimal value is that
    double's; otherwise refused, since the number signed and the number stored would
    differ (1.00000000000000000001 would be 1.0, 1e-400 would be 0, 1e400 Infinity)."""
    value = float(text)
    # Most numbers are written as the shortest repr already (every JSON serializer
    # writes doubles so): one comparison of strings, no Decimal.
    if repr(value) == text:
        return value
    if not math.isfinite(value):
        raise JsonRefused(f"the number {_shown(text)} is beyond a double's range (1.8e308)")
    try:
        same = Decimal(repr(value)) == Decimal(text)
    except ArithmeticError:  # an exponent past even Decimal's range (1e-99999999999999999999)
        same = False
    if not same:
        why = "too small for a double" if value == 0 else "more precision than a double"
        raise JsonRefused(f"the number {_shown(text)} cannot be stored exactly ({why})")
    return value


def _bounded_int(text: str) -> int:
    """The integer ``text`` is, when a double can hold its magnitude (see the rule above)."""
    digits = len(text) - text.startswith("-")
    if digits <= 15:  # the common case: far inside the range, no conversion to check
        return int(text)
    if digits <= _MAX_INTEGER_DIGITS:
        value = int(text)
        try:
            float(value)
        except OverflowError:
            pass
        else:
            return value
    raise JsonRefused(
        f"the integer {_shown(text)} ({digits} digits) is beyond a double's range (1.8e308)"
    )


def _shown(text: str) -> str:
    return text if len(text) <= 40 else text[:40] + "..."


# One decoder for every call: json.loads with these options would build one each time.
_DECODER = json.JSONDecoder(
    object_pairs_hook=_no_duplicate_keys,
    parse_constant=_no_constants,
    parse_float=_exact_float,
    parse_int=_bounded_int,
)


def _may_be_unstorable(text: str, max_depth: int) -> bool:
    """False when ``text`` certainly parsed to a value without NUL or lone surrogates,
    within ``max_depth``: the walk of every value (the bulk of the cost) is then not
    needed. A superset by construction: those characters come only from a \\u escape
    (raw control characters are refused by the parser, and no UTF-8 decodes to a
    surrogate), and a level of nesting needs a bracket. Numbers are not its business:
    the parser's hooks check each one."""
    return text.count("[") + text.count("{") >= max_depth or "\\u" in text


def loads(raw: bytes, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse UTF-8 JSON bytes strictly; raise ``JsonRefused`` with a readable reason."""
    try:
        text = raw.decode("utf-8")  # strict: no BOM sniffing, no UTF-16 (RFC 8259 §8.1)
    except UnicodeDecodeError as exc:
        raise JsonRefused(f"not UTF-8 (at byte {exc.start})") from None
    try:
        value = _DECODER.decode(text)
    except RecursionError:
        raise JsonRefused(f"nesting deeper than {max_depth} levels", "limit_exceeded") from None
    except JsonRefused:
        raise
    except ValueError as exc:  # JSONDecodeError, and integers past Python's digit limit
        raise JsonRefused(" ".join(str(exc).split())[:200]) from None
    problem = (
        unstorable(value, max_depth=max_depth) if _may_be_unstorable(text, max_depth) else None
    )
    if problem is not None:
        raise JsonRefused(
            problem, "limit_exceeded" if problem.startswith("nesting") else "malformed"
        )
    return value
