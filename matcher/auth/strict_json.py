"""JSON read the one way every later reader will agree with, or refused.

Event bytes are signed; what matcher stores and republishes is what it parsed. Where
parsers differ (a key given twice, UTF-16 input, ``NaN``, a lone surrogate escape) the
bytes have no single meaning, so they are refused rather than read one of the ways. The
same goes for what Postgres' ``jsonb`` cannot hold (NUL in a string, non-finite numbers),
for a number whose decimal value is not that of the double it parses to (more digits than a
double holds, or too small for one: what is stored and resumed would be another number
than the one signed), and for nesting past a bound, which would otherwise cost recursion
in every reader after us (Python's own limit is an exception in the middle of a batch, not
a rejection).
"""

from __future__ import annotations

import json
import math
import re
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


# What the text of JSON that is not storable must contain somewhere (a superset: strings
# may hold look-alikes, and then the value is walked): a \\u escape (NUL and lone
# surrogates come only from escapes; raw control characters are refused by the parser),
# a number long or large enough to overflow to infinity. Each is looked for on its own,
# the substring in C first: one pattern of the three alternatives tried each of them at
# every character (7.8 µs on a typical event of 180 bytes, against 3.1 this way, a
# twentieth of the gate's time per event). tests/unit/test_strict_json.py holds these
# checks to that one pattern.
_BIG_EXPONENT = re.compile(r"[0-9][eE]\+?[0-9]{3}")
_LONG_DIGITS_MIN = 300
_LONG_DIGITS = re.compile(f"[0-9]{{{_LONG_DIGITS_MIN}}}")


def _exact_float(text: str) -> float:
    """The double ``text`` parses to, when its decimal value is that double's (as written
    back, the shortest repr: what jsonb stores and the resume carries); otherwise refused,
    since the number signed and the number stored would differ (1.00000000000000000001
    would be 1.0, 1e-400 would be 0). Integers never come here: Python and jsonb hold them
    exactly at any size."""
    value = float(text)
    # Most numbers are written as the shortest repr already (every JSON serializer
    # writes doubles so): one comparison of strings, no Decimal.
    if repr(value) == text or not math.isfinite(value):  # non-finite: refused by the walk
        return value
    try:
        same = Decimal(repr(value)) == Decimal(text)
    except ArithmeticError:  # an exponent past even Decimal's range (1e-99999999999999999999)
        same = False
    if not same:
        why = "too small for a double" if value == 0 else "more precision than a double"
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise JsonRefused(f"the number {shown} cannot be stored exactly ({why})")
    return value


# One decoder for every call: json.loads with these options would build one each time.
_DECODER = json.JSONDecoder(
    object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constants, parse_float=_exact_float
)


def _may_be_unstorable(text: str, max_depth: int) -> bool:
    """False when ``text`` certainly parsed to a storable value within ``max_depth``: the
    walk of every value (the bulk of the cost) is then not needed."""
    return (
        text.count("[") + text.count("{") >= max_depth
        or "\\u" in text
        or _BIG_EXPONENT.search(text) is not None
        or (len(text) >= _LONG_DIGITS_MIN and _LONG_DIGITS.search(text) is not None)
    )


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
