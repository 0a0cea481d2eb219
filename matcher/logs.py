"""Logging setup: readable text for people, one JSON object per line for machines.

Context (tenant, run, wait and event ids) travels in ``extra=``; both formats print it.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_extras(record),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


# Every format character (Unicode category Cf, as of Unicode 14.0, Python 3.11's; a unit
# test holds it to unicodedata): invisible, and some steer how text reads: the bidi overrides,
# isolates and marks, the zero-width space and joiners, the soft hyphen, the byte-order
# mark. Written out: computing it scans every code point, half a second at each start.
FORMAT_CHARACTERS = (
    "\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e\u200b-\u200f"
    "\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
    "\U00013430-\U00013438\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001"
    "\U000e0020-\U000e007f"
)

# Control characters (a newline above all), the DEL/C1 range terminals act on, the line
# and paragraph separators, the format characters (above), and lone surrogates (from
# undecodable arguments: a strict UTF-8 stream would refuse to write them).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff" + FORMAT_CHARACTERS + "]")
# What escape() rewrites: the above, and the backslash itself, so that a stored literal
# "\x1b" (four characters) shows as "\\x1b" and cannot pass for an escaped ESC byte.
_SHOWN_ESCAPED = re.compile(r"\\|" + _CONTROL.pattern)
# What a web page must not render as it is: the format characters reorder or hide text
# there as on a terminal; line breaks and other controls are the page's to show.
_INVISIBLE = re.compile("[\u2028\u2029" + FORMAT_CHARACTERS + "]")
_NEEDS_QUOTES = re.compile(r'[\s="\\]')


def escaped_character(character: str) -> str:
    """One character as Python writes it escaped: ``\\u202e``, ``\\x1b``."""
    return character.encode("unicode_escape").decode("ascii")


def escape(text: str) -> str:
    """``text`` with every control character shown as an escape, so that a value from a
    record (a source, an id: attacker-chosen) cannot start a line or move the cursor. The
    one escaping of text for a terminal: the log lines and the CLI's tables and lines.
    Reversible (Python's ``unicode_escape`` reads it back), so two texts never give the
    same escaped string (look-alike letters of other scripts are another matter)."""
    return _SHOWN_ESCAPED.sub(lambda match: escaped_character(match.group()), text)


def reveal_invisible(text: str, shown: Callable[[str], str] = escaped_character) -> str:
    """``text`` with its format characters (bidi overrides and marks, zero-width ones)
    replaced by ``shown`` of each (its escape by default): for HTML, which escapes markup
    but lets these act."""
    return _INVISIBLE.sub(lambda match: shown(match.group()), text)


def quoted(value: object) -> str:
    """A value in quotes, for a line that will go through escape(): ``repr`` would escape
    it first, and escape() would then show each of its backslashes doubled.

    The quotes are ones the value does not hold, so it ends where they close. A value
    holding both kinds is given as ``repr`` (its inner quote escaped): with plain quotes
    ``x", not 'acme`` read as a value that ended before ``not``."""
    if not isinstance(value, str):
        return repr(value)
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    return repr(value)


def _field(value: object) -> str:
    # logfmt: a value with spaces, "=", quotes or controls is quoted, so it cannot pose as
    # another field, nor end the line.
    text = str(value)
    if text and not _NEEDS_QUOTES.search(text) and not _CONTROL.search(text):
        return text
    return '"' + escape(text).replace('"', '\\"') + '"'


class TextFormatter(logging.Formatter):
    """One line per record, whatever the record holds: the message and every field are
    escaped (JSON lines are safe by construction)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape(super().formatMessage(record))

    def format(self, record: logging.LogRecord) -> str:
        # Not logging.Formatter.format, which appends a traceback raw on lines of its own:
        # its message is often a value from outside (a file's line, a record's field). Here
        # the traceback and stack are fields too, escaped like the rest, on the one line.
        record.message = record.getMessage()
        record.asctime = self.formatTime(record, self.datefmt)
        line = self.formatMessage(record)
        fields = dict(_extras(record))
        if record.exc_info and record.exc_info[0] is not None:
            fields["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:  # a record rebuilt elsewhere (a socket handler's) keeps this
            fields["exc"] = record.exc_text
        if record.stack_info:
            fields["stack"] = self.formatStack(record.stack_info)
        if fields:
            line += " " + " ".join(f"{k}={_field(v)}" for k, v in fields.items())
        return line


def configure(level: str = "INFO", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # aiokafka logs every reconnect at ERROR; its state reaches us through exceptions.
    logging.getLogger("aiokafka").setLevel(max(logging.WARNING, root.level))
    # uvicorn's own start-up chatter; matcher logs the admin address itself.
    logging.getLogger("uvicorn.error").setLevel(max(logging.WARNING, root.level))
