"""Log lines cannot be forged by what they report: every value is escaped."""

from __future__ import annotations

import json
import logging

import pytest

from matcher.logs import JsonFormatter, TextFormatter, escape

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
    ],
)
def test_escape_shows_every_control_character(text: str, shown: str | None) -> None:
    escaped = escape(text)
    assert escaped == (text if shown is None else shown)
    assert escaped.isprintable()
    escaped.encode("utf-8")  # writable to a strict UTF-8 stream
