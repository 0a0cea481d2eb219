"""The strict reader's shortcut: it skips the walk of a parsed value only when the text
cannot hold what jsonb refuses, and its cheaper checks find exactly what the one pattern
they replaced found."""

from __future__ import annotations

import json
import re

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


@given(text=_json_texts(), max_depth=st.integers(min_value=1, max_value=6))
def test_loads_refuses_exactly_what_the_walk_refuses(text: str, max_depth: int) -> None:
    # The shortcut never hides a problem: what the full walk of the parsed value refuses,
    # loads refuses, and what it accepts, loads returns unchanged.
    problem = unstorable(json.loads(text), max_depth=max_depth)
    if problem is None:
        assert loads(text.encode(), max_depth=max_depth) == json.loads(text)
    else:
        with pytest.raises(JsonRefused):
            loads(text.encode(), max_depth=max_depth)
