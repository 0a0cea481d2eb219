"""Log lines cannot be forged by what they report: every value is escaped."""

from __future__ import annotations

import ast
import json
import logging
import re
import subprocess
import sys
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from matcher.logs import (
    FORMAT_CHARACTERS,
    CoordinatorStartFilter,
    JsonFormatter,
    TextFormatter,
    escape,
    quoted,
)

HOSTILE = 'billing\nFORGED level=ERROR msg="x"\r\x1b[2J\u2028 end'


def _record(**extra: object) -> logging.LogRecord:
    return logging.makeLogRecord(
        {"msg": "event %s", "args": (HOSTILE,), "levelname": "INFO", "name": "t", **extra}
    )


def test_text_lines_stay_one_line_and_fields_stay_fields() -> None:
    line = TextFormatter().format(_record(producer=HOSTILE, offset=7))
    for control in ("\n", "\r", "\x1b", "\u2028"):
        assert control not in line
    # The hostile value is one quoted field: the fields after it are still there as fields.
    assert line.endswith(" offset=7")
    assert 'producer="billing\\nFORGED level=ERROR msg=\\"x\\"\\r\\x1b[2J\\u2028 end"' in line


@pytest.mark.parametrize("value", ["plain", "a b", 'q"', "back\\slash", "", "k=v"])
def test_text_fields_read_back_as_logfmt(value: str) -> None:
    line = TextFormatter().format(_record(field=value))
    rendered = line.rsplit(" field=", 1)[1]
    if rendered.startswith('"'):
        rendered = json.loads(rendered)  # the quoting is JSON's for these characters
    assert rendered == value


def test_json_lines_are_json() -> None:
    line = JsonFormatter().format(_record(producer=HOSTILE))
    assert "\n" not in line
    assert json.loads(line)["producer"] == HOSTILE


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("\x1b[2J", "\\x1b[2J"),  # ESC: erase the screen
        ("\x1b]0;PWNED\x07", "\\x1b]0;PWNED\\x07"),  # OSC: set the window title
        ("a\nb\tc\rd", "a\\nb\\tc\\rd"),  # a cell or a line cannot be broken
        ("\x7f\x9b31m", "\\x7f\\x9b31m"),  # DEL, and CSI in its one-byte C1 form
        ("\u202eevil\u2066", "\\u202eevil\\u2066"),  # bidi override and isolate
        ("\udcff\udcfe", "\\udcff\\udcfe"),  # an argument that was not UTF-8
        ("[red]x[/red] [link=https://e.example]y[/link]", None),  # markup is just text
        ("acme/run-7 café ünïcode", None),  # printable text is left alone
        ("ac\u200bme\u200e\u061c\ufeff\xad", "ac\\u200bme\\u200e\\u061c\\ufeff\\xad"),  # invisible
        ("\\x1b[2J", "\\\\x1b[2J"),  # a literal backslash cannot pass for an escape
        ("C:\\tmp\\", "C:\\\\tmp\\\\"),
    ],
)
def test_escape_shows_every_control_character(text: str, shown: str | None) -> None:
    escaped = escape(text)
    assert escaped == (text if shown is None else shown)
    assert escaped.isprintable()
    escaped.encode("utf-8")  # writable to a strict UTF-8 stream


@given(st.text(alphabet=st.characters(codec=None)))
def test_escape_reads_back_so_no_two_texts_show_alike(text: str) -> None:
    escaped = escape(text)
    # No control, lone surrogate or line/paragraph separator left (unassigned code points
    # are not "printable" to Python, but a terminal does not act on them).
    # Nor a format character: invisible, some steer bidi text (LRM, RLM, ALM, isolates).
    assert not [c for c in escaped if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")]
    # Python reads the escapes back: escaping is one-to-one, whatever the text holds.
    assert escaped.encode("latin-1", "backslashreplace").decode("unicode_escape") == text


def test_a_stored_escape_and_the_byte_it_names_show_differently() -> None:
    assert escape("\x1b") != escape("\\x1b")
    line = TextFormatter().format(_record(a="\x1b", b="\\x1b"))
    assert 'a="\\x1b"' in line
    assert 'b="\\\\x1b"' in line


def test_a_traceback_is_a_field_of_the_one_line() -> None:
    try:
        raise ValueError(HOSTILE)
    except ValueError:
        record = _record(exc_info=sys.exc_info(), stack_info="Stack (most recent call last):\nx")
    line = TextFormatter().format(record)
    for control in ("\n", "\r", "\x1b", "\u2028"):
        assert control not in line
    assert ' exc="Traceback (most recent call last):\\n' in line
    assert "ValueError: billing\\nFORGED level=ERROR" in line
    assert line.endswith(' stack="Stack (most recent call last):\\nx"')


def test_the_format_characters_are_unicodes() -> None:
    listed = {
        c for c in map(chr, range(sys.maxunicode + 1)) if re.fullmatch(f"[{FORMAT_CHARACTERS}]", c)
    }
    category = {c for c in map(chr, range(sys.maxunicode + 1)) if unicodedata.category(c) == "Cf"}
    if unicodedata.unidata_version == "14.0.0":  # Python 3.11's
        assert listed == category
    else:  # a later Python may know more: the list must then grow (escape() would miss them)
        assert category <= listed, sorted(f"U+{ord(c):04X}" for c in category - listed)


def test_a_record_without_an_exception_has_no_exc_field() -> None:
    line = TextFormatter().format(_record(exc_info=(None, None, None)))
    assert "exc=" not in line
    rebuilt = TextFormatter().format(_record(exc_text="Traceback (most recent call last):\nE"))
    assert rebuilt.endswith(' exc="Traceback (most recent call last):\\nE"')


def _read_quoted(shown: str) -> str:
    """What an operator reads from a quoted, escaped value: escape() undone, then the
    value between the quotes (a literal when it was given as one)."""
    text = shown.encode("latin-1", "backslashreplace").decode("unicode_escape")
    quote = text[0]
    inner = text[1:-1]
    if quote in inner:
        value = ast.literal_eval(text)
        assert isinstance(value, str)
        return value
    return inner


@given(st.text(alphabet=st.characters(codec=None)))
def test_a_quoted_value_reads_back_as_itself(text: str) -> None:
    shown = escape(quoted(text))
    assert shown[0] == shown[-1]
    assert shown[0] in "'\""
    # The value ends where its quotes close: no value can show a forged end and more text.
    assert _read_quoted(shown) == text


def test_a_value_with_both_quotes_cannot_end_early() -> None:
    shown = escape(quoted("x\", not 'acme"))
    assert shown == "'x\", not \\\\'acme'"  # repr's backslash, shown doubled
    assert _read_quoted(shown) == "x\", not 'acme"


def _coordinator_record(error: str) -> logging.LogRecord:
    return logging.LogRecord(
        "aiokafka.consumer.group_coordinator", logging.ERROR, "group_coordinator.py", 566,
        "Group Coordinator Request failed: %s", (error,), None,
    )  # fmt: skip


def test_a_coordinator_not_yet_available_is_said_once_at_info_then_an_error_past_grace() -> None:
    now = [0.0]
    quiet = CoordinatorStartFilter(grace_s=60, clock=lambda: now[0])
    not_available = "[Error 15] GroupCoordinatorNotAvailableError"
    first = _coordinator_record(not_available)
    assert quiet.filter(first)
    assert (first.levelno, first.levelname) == (logging.INFO, "INFO")
    assert "not available yet" in first.getMessage()
    now[0] = 5.0
    assert not quiet.filter(_coordinator_record(not_available))  # the retries: dropped
    other = _coordinator_record("[Error 7] RequestTimedOutError")
    assert quiet.filter(other)
    assert other.levelno == logging.ERROR  # another failure stays an error
    now[0] = 61.0
    late = _coordinator_record(not_available)
    assert quiet.filter(late)
    assert late.levelno == logging.ERROR  # still not there past the grace: a real fault


def test_configure_quiets_the_coordinator_start_once() -> None:
    script = (
        "import logging\n"
        "from matcher.logs import COORDINATOR_LOGGER, CoordinatorStartFilter, configure\n"
        "configure(); configure()\n"
        "filters = logging.getLogger(COORDINATOR_LOGGER).filters\n"
        "print(sum(isinstance(f, CoordinatorStartFilter) for f in filters))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=False
    )
    assert (done.returncode, done.stdout.strip()) == (0, "1"), done.stderr
