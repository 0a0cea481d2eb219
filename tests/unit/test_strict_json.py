"""The strict reader: one number rule checked on every number, and a shortcut that skips
the walk of a parsed value only when the text cannot hold what jsonb refuses."""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal, InvalidOperation

import pytest
from hypothesis import given
from hypothesis import strategies as st

from matcher.auth.strict_json import JsonRefused, _may_be_unstorable, loads
from matcher.domain.events import unstorable
from tests.fuzzing.choosers import HypothesisChooser
from tests.fuzzing.numbers import number_text

# Text made of what the shortcut looks at, so that near misses are common.
_PIECES = st.sampled_from(
    ["\\u", "\\", "u", "0", "0000", "d800", "9", "e", "[", "{", "}", "]", '"', "a", " "]
)
_SUSPECT_TEXT = st.lists(_PIECES, max_size=60).map("".join)


@given(text=_SUSPECT_TEXT, max_depth=st.integers(min_value=1, max_value=12))
def test_the_shortcut_never_skips_a_value_the_walk_refuses(text: str, max_depth: int) -> None:
    try:
        value = json.loads(text)
    except ValueError:
        return
    if not _may_be_unstorable(text, max_depth):
        assert unstorable(value, max_depth=max_depth) is None


def _accepted_by_the_rule(text: str) -> bool:
    """The number rule, read with Decimal (independent of the reader under test): finite
    as a double; an integer within that range, or a number whose decimal value is its
    double's."""
    try:
        exact = Decimal(text)
    except InvalidOperation:
        return False
    if abs(exact) > Decimal("1.7976931348623157e308") and not _rounds_down_to_max(exact):
        return False
    if re.fullmatch(r"-?[0-9]+", text):
        return True
    value = float(text)
    return math.isfinite(value) and Decimal(repr(value)) == exact


def _rounds_down_to_max(exact: Decimal) -> bool:
    # Past the largest double, but nearer to it than to 2**1024: it rounds down to it.
    return abs(exact) < Decimal(2**1024 - 2**970)


@given(st.data())
def test_every_number_is_judged_by_the_one_rule(data: st.DataObject) -> None:
    text = number_text(HypothesisChooser(data))
    if _accepted_by_the_rule(text):
        value = loads(text.encode())
        assert math.isfinite(float(value))
        assert Decimal(repr(value) if isinstance(value, float) else value) == Decimal(text)
    else:
        with pytest.raises(JsonRefused) as refused:
            loads(text.encode())
        assert refused.value.reason == "malformed"


_OTHERS = ['"id-3e456"', '"\\u00e9"', "[[[1]]]", '"' + "7" * 400 + '"']


@pytest.mark.parametrize("other", _OTHERS)
@pytest.mark.parametrize("number", ["2" + "0" * 210 + "e99", "1" + "0" * 320, "1e400", "0.1"])
def test_a_number_is_judged_alike_whatever_else_the_value_holds(number: str, other: str) -> None:
    # Once the reading guessed from the text whether to look at numbers: an id holding
    # "3e456" switched the check on, and the same number was refused or not by chance.
    assert _verdict(f'{{"n": {number}}}'.encode()) == _verdict(
        f'{{"x": {other}, "n": {number}}}'.encode()
    )


@given(st.data(), st.sampled_from(_OTHERS))
def test_any_number_is_judged_alike_whatever_else_the_value_holds(
    data: st.DataObject, other: str
) -> None:
    number = number_text(HypothesisChooser(data))
    alone, beside = f'{{"n": {number}}}'.encode(), f'{{"x": {other}, "n": {number}}}'.encode()
    assert _verdict(alone) == _verdict(beside)


def _verdict(raw: bytes) -> bool:
    try:
        loads(raw)
    except JsonRefused:
        return False
    return True


def test_infinity_written_with_a_short_exponent_is_refused() -> None:
    # 2 and 210 zeros, e99: 2e309, no long exponent nor long run of digits. It once parsed
    # to Infinity, was answered 202, and failed in Postgres.
    with pytest.raises(JsonRefused, match="beyond a double's range") as refused:
        loads(b'{"n": 2' + b"0" * 210 + b"e99}")
    assert refused.value.reason == "malformed"


@pytest.mark.parametrize(
    "number", ["123456789012345678901234567890", "-0", "9007199254740993", "1" + "0" * 308,
               "-" + "9" * 308, str(2**1024 - 2**970 - 1)]
)  # fmt: skip
def test_integers_within_a_doubles_range_are_read_exactly(number: str) -> None:
    assert loads(number.encode()) == int(number)


@pytest.mark.parametrize(
    "number", ["1" + "0" * 309, "-" + "9" * 309, str(2**1024 - 2**970), "1" + "0" * 5000]
)
def test_integers_beyond_a_doubles_range_are_refused_by_one_rule(number: str) -> None:
    # 5,000 digits was once refused by Python's integer-string limit, with its message.
    with pytest.raises(JsonRefused, match=r"\(\d+ digits\) is beyond a double's range"):
        loads(f"[{number}]".encode())


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
