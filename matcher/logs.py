"""Logging setup: readable text for people, one JSON object per line for machines.

Context (tenant, run, wait and event ids) travels in ``extra=``; both formats print it.

No log line carries event data. The one way data could slip in is an error that quotes
it: Postgres' messages quote the value they refused (``invalid input syntax for type
integer: "..."``), and their detail and context quote the row (``Token "Infinity" is
invalid``, ``JSON data, line 1: {"n": ...``). So an exception is never logged as its
``repr``: both formats render every exception, passed in ``extra=`` or as the record's
``exc_info``, through ``describe_error``, which gives a database error's class, SQLSTATE,
the schema's names (constraint, table, column) and its primary message with every quoted
value withheld, and never its detail, hint or context.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {
        k: describe_error(v) if isinstance(v, BaseException) else v
        for k, v in record.__dict__.items()
        if k not in _STANDARD
    }


# A quoted value in a Postgres message: its style guide quotes every value it cites
# ("...", a quote inside doubled), and puts the rest in the detail and context.
_QUOTED = re.compile(r'"(?:[^"]|"")*"', re.DOTALL)
_DIAG_NAMES = ("schema_name", "table_name", "column_name", "datatype_name", "constraint_name")


def describe_error(exc: BaseException) -> str:
    """``exc`` as a log line may show it (see the module docstring): a database error
    without any value it quotes; any other exception as ``Class: message``."""
    # psycopg's errors, known by their module: this module stays below the store (the
    # domain layer imports it), so it does not import the driver.
    if type(exc).__module__.partition(".")[0] != "psycopg":
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    diag = getattr(exc, "diag", None)
    sqlstate = getattr(exc, "sqlstate", None)
    primary = diag.message_primary if diag is not None and sqlstate else str(exc).split("\n")[0]
    parts = [type(exc).__name__]
    if sqlstate:
        parts.append(f"[{sqlstate}]")
    parts.append(_QUOTED.sub('"(withheld)"', primary or ""))
    names = [
        f"{n.removesuffix('_name')}={getattr(diag, n)}"
        for n in _DIAG_NAMES
        if diag is not None and getattr(diag, n)
    ]
    return " ".join([*parts, *(f"({name})" for name in names)]).strip()


def describe_traceback(
    kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
) -> str:
    """A traceback whose exception lines are ``describe_error``'s, for each exception of
    the chain (a database error's text never reaches the log through its traceback)."""
    if exc is None:
        return "".join(traceback.format_exception(kind, exc, tb))
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        cause = current.__cause__
        current = (
            cause if cause is not None or current.__suppress_context__ else current.__context__
        )
    blocks = []
    for item in reversed(chain):
        frames = "".join(traceback.format_tb(item.__traceback__))
        blocks.append(f"Traceback (most recent call last):\n{frames}{describe_error(item)}")
    return "\n\nwhile handling that, or caused by it:\n\n".join(blocks)


class JsonFormatter(logging.Formatter):
    def formatException(self, ei: Any) -> str:
        return describe_traceback(*ei)

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

    def formatException(self, ei: Any) -> str:
        return describe_traceback(*ei)

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


# aiokafka's logger for its consumer group, and how it says the group's coordinator is
# not known yet (the error's class name is in the message).
COORDINATOR_LOGGER = "aiokafka.consumer.group_coordinator"
_COORDINATOR_FAILED = "Group Coordinator Request failed"
_NOT_AVAILABLE = "CoordinatorNotAvailable"  # GroupCoordinatorNotAvailableError, Kafka's code 15


class CoordinatorStartFilter(logging.Filter):
    """aiokafka logs "Group Coordinator Request failed: GroupCoordinatorNotAvailableError"
    at ERROR on each retry while a new broker creates its offsets topic: on a cluster's
    first start, seconds of ERRORs that need no one. For ``grace_s`` from the first one,
    the first is told once at INFO, saying why, and the others are dropped; past it (the
    coordinator still not there: an offsets topic that cannot be created, a broker down)
    every one is an ERROR again, as is any other failure of the request."""

    def __init__(self, grace_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self._grace_s, self._clock = grace_s, clock
        self._first: float | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or not isinstance(record.msg, str):
            return True
        if not record.msg.startswith(_COORDINATOR_FAILED):
            return True
        if _NOT_AVAILABLE not in record.getMessage():
            return True
        now = self._clock()
        if self._first is None:
            self._first = now
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg = (
                "the consumer group's coordinator is not available yet (a new broker creating"
                " its offsets topic, or the coordinator moving); retrying for up to %.0f s"
                " before this is an error"
            )
            record.args = (self._grace_s,)
            return True
        return now - self._first >= self._grace_s


def quiet_coordinator_start() -> None:
    """Install ``CoordinatorStartFilter`` on aiokafka's group logger (once per process)."""
    logger = logging.getLogger(COORDINATOR_LOGGER)
    if not any(isinstance(f, CoordinatorStartFilter) for f in logger.filters):
        logger.addFilter(CoordinatorStartFilter())


def configure(level: str = "INFO", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # aiokafka logs every reconnect at ERROR; its state reaches us through exceptions.
    logging.getLogger("aiokafka").setLevel(max(logging.WARNING, root.level))
    quiet_coordinator_start()
    # uvicorn's own start-up chatter; matcher logs the admin address itself.
    logging.getLogger("uvicorn.error").setLevel(max(logging.WARNING, root.level))
