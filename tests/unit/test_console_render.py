"""What the console's templates make of stored text, without a server."""

from __future__ import annotations

import html
import re

import markupsafe
from hypothesis import given
from hypothesis import strategies as st

from matcher.admin.console.render import ENV
from matcher.logs import FORMAT_CHARACTERS

_SHOWN = ENV.from_string("<p>{{ value }}</p>")
_MARK = re.compile(
    r'<span class="revealed" title="[A-Z0-9 -]*">'
    r"(\\x[0-9a-f]{2}|\\u[0-9a-f]{4}|\\U[0-9a-f]{8})</span>"
)


@given(st.text(alphabet=st.characters(codec=None) | st.sampled_from(FORMAT_CHARACTERS)))
def test_text_is_escaped_and_only_marks_are_markup(text: str) -> None:
    shown = _SHOWN.render(value=text)[3:-4]
    # Take out the marks: what is left is the escaped text, with no markup of its own.
    rest = _MARK.sub("", shown)
    assert "<" not in rest
    assert ">" not in rest
    # Put back: each mark was one format character of the text, in place.
    restored = _MARK.sub(lambda m: m.group(1).encode().decode("unicode_escape"), shown)
    assert html.unescape(restored) == text


def test_a_stored_escape_is_not_marked() -> None:
    assert _SHOWN.render(value="\\u200b") == "<p>\\u200b</p>"
    assert _SHOWN.render(value="\u200b") == (
        '<p><span class="revealed" title="ZERO WIDTH SPACE">\\u200b</span></p>'
    )
    # A form field's value, already escaped, keeps the character itself.
    assert _SHOWN.render(value=markupsafe.escape("\u200b")) == "<p>\u200b</p>"


def test_a_title_shows_the_escape_without_markup() -> None:
    # A <title> shows markup as text: there the character is escaped, not marked.
    title = ENV.from_string("<title>Run {{ run_id|unmarked }}</title>")
    assert title.render(run_id="r<\u202e") == "<title>Run r&lt;\\u202e</title>"
