"""The strict reader's shortcut: it skips the walk of a parsed value only when the text
cannot hold what jsonb refuses, and its cheaper checks find exactly what the one pattern
they replaced found."""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from matcher.auth.strict_json import JsonRefused, _may_be_unstorable, loads
from matcher.domain.events import MAX_JSON_DEPTH, unstorable

# The pattern the checks replaced: the reference they are held to.
_ONE_PATTERN = re.compile(r"\\u|[0-9][eE]\+?[0-9]{3}|[0-9]{300}")

# Text made of what the checks look at, so that near misses are common.
_PIECES = st.sampled_from(
    ["\\u", "\\", "u", "0", "9", "e", "E", "+", "-", ".", "[", "{", "}", "]", '"', "a", " "]
)
_SUSPECT_TEXT = st.lists(_PIECES, max_size=60).map("".join)
_LONG_NUMBERS = st.integers(min_value=290, max_value=310).map(lambda n: "1" * n)


def _reference(text: str, max_depth: int) -> bool:
    return text.count("[") + text.count("{") >= max_depth or _ONE_PATTERN.search(text) is not None


@given(text=_SUSPECT_TEXT, max_depth=st.integers(min_value=1, max_value=12))
def test_the_checks_agree_with_the_one_pattern(text: str, max_depth: int) -> None:
    assert _may_be_unstorable(text, max_depth) == _reference(text, max_depth)


@given(prefix=_SUSPECT_TEXT, digits=_LONG_NUMBERS, suffix=_SUSPECT_TEXT)
def test_the_checks_agree_on_long_runs_of_digits(prefix: str, digits: str, suffix: str) -> None:
    text = prefix + digits + suffix
    assert _may_be_unstorable(text, MAX_JSON_DEPTH) == _reference(text, MAX_JSON_DEPTH)


_NUMBERS = st.sampled_from(
    ["1e999", "-1E+400", "1e308", "1.5", "0", "1" * 305 + ".5", "1" * 305, "2e-999", "7"]
)
_STRINGS = st.sampled_from(['"a"', '"\\u0000"', '"\\ud800"', '"\\u00e9"', '"\\\\u0000"'])


def _json_texts() -> st.SearchStrategy[str]:
    leaves = _NUMBERS | _STRINGS | st.just("null")
    return st.recursive(
        leaves,
        lambda inner: (
            st.lists(inner, max_size=3).map(lambda xs: "[" + ",".join(xs) + "]")
            | st.lists(inner, max_size=3).map(
                lambda xs: "{" + ",".join(f'"k{i}":{x}' for i, x in enumerate(xs)) + "}"
            )
        ),
        max_leaves=8,
    )


def _inexact(text: str) -> bool:
    """Whether ``text`` holds a number whose decimal value is not its double's (a reading
    by Decimal, independent of the one under test)."""
    found: list[bool] = []

    def check(number: str) -> float:
        value = float(number)
        if math.isfinite(value):
            found.append(Decimal(repr(value)) != Decimal(number))
        return value

    json.loads(text, parse_float=check)
    return any(found)


@given(text=_json_texts(), max_depth=st.integers(min_value=1, max_value=6))
def test_loads_refuses_exactly_what_the_walk_refuses(text: str, max_depth: int) -> None:
    # The shortcut never hides a problem: what the full walk of the parsed value refuses,
    # or a number that is not exactly a double, loads refuses, and what it accepts, loads
    # returns unchanged.
    problem = unstorable(json.loads(text), max_depth=max_depth)
    if problem is None and not _inexact(text):
        assert loads(text.encode(), max_depth=max_depth) == json.loads(text)
    else:
        with pytest.raises(JsonRefused):
            loads(text.encode(), max_depth=max_depth)


# Numbers written as serializers write doubles, or with more digits that change nothing.
_EXACT_NUMBERS = ["1.00", "0.1", "1e2", "1E+2", "1.0e+2", "-0.0", "5e-324", "1e308", "2.5e-1",
                  "0.30000000000000004", "1." + "0" * 400, "0e-400", "-1.5E-3"]  # fmt: skip
# Numbers whose double is another number: the value stored and resumed would not be the
# value signed.
_INEXACT_NUMBERS = ["1.00000000000000000001", "3.141592653589793238", "1e-400", "4.9e-324",
                    "0.3000000000000000444", "-2e-999", "1e-99999999999999999999",
                    "9007199254740993.0", "1" * 305 + ".5"]  # fmt: skip


@pytest.mark.parametrize("number", _EXACT_NUMBERS)
def test_a_number_that_is_exactly_a_double_is_read(number: str) -> None:
    assert loads(f'{{"n": {number}}}'.encode()) == {"n": float(number)}


@pytest.mark.parametrize("number", _INEXACT_NUMBERS)
@pytest.mark.parametrize("where", ["{}", '{{"a": [1, {}]}}', "[{}]"])
def test_a_number_that_is_not_exactly_a_double_is_refused(number: str, where: str) -> None:
    with pytest.raises(JsonRefused, match="cannot be stored exactly") as refused:
        loads(where.format(number).encode())
    assert refused.value.reason == "malformed"
    assert number[:40] in str(refused.value)


@pytest.mark.parametrize(
    "number", ["123456789012345678901234567890", "-0", "9007199254740993", "1" + "0" * 4000]
)
def test_integers_of_any_size_are_read_exactly(number: str) -> None:
    assert loads(number.encode()) == int(number)
