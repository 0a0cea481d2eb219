"""The fuzz target: one record through the gate, then through the quarantine encoding.

``check_record`` raises ``AssertionError`` (or whatever the code under test raised) on a
finding and returns None otherwise. What it holds:

- the gate answers every record with a ``CompletionEvent`` or a ``Rejection`` (it never
  raises), and a rejection's reason is one of ``REASONS``;
- the quarantine row built from a rejection can be written: every text is UTF-8 without
  NUL or lone surrogates, the headers JSON encodes (and has no ``\\u0000``, which jsonb
  refuses), sizes keep to the limits, and the headers read back as they were received;
- an accepted event has the meaning any other reader gives its bytes: each number in its
  data is the number written (read with ``Decimal``), and in structured mode no envelope key
  is one that a case-folding reader would take for an attribute matcher reads;
- an accepted event is storable: its data is JSON that jsonb holds, its identifiers are
  text Postgres holds, and its time is an instant that Python can still read back (a
  timestamp outside ``datetime``'s range stores, but no reader can load it).

``check_request`` does the same for an HTTP request through the ingress's translation
(``matcher.ingress.requests.to_record``): it answers a ``RawRecord`` or a ``Refusal`` with
a known status, never raises, and the record it makes is then checked as above.

``check_callback`` does it for a callback request (``matcher.ingress.callbacks``): it
answers a ``CallbackRequest`` or a ``Refusal`` with a 4xx status, never raises; what it
accepts asks by the digest of exactly the token sent, carries storable data that another
reader reads as the same value, and the type the query gives.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from matcher.auth.gate import judge
from matcher.auth.policy import Policy
from matcher.auth.registry import Registry, parse_registry
from matcher.domain.callbacks import is_token
from matcher.domain.events import REASONS, CompletionEvent, Rejection, unstorable
from matcher.domain.quarantine import MAX_DETAIL, MAX_TEXT, headers_from_json

# The row exactly as ingest builds it (a private helper: the encoding under test).
from matcher.domain.records import IngestRecord, RawRecord
from matcher.ingress.callbacks import CallbackRequest, to_callback
from matcher.ingress.requests import STATUS, Refusal, to_record
from matcher.store.ingest import DEFAULT_LIMITS, _quarantine_params
from tests.fuzzing.callbacks import CallbackCall, other_reading
from tests.fuzzing.records import ARRIVAL, SCHEMAS, Header, registry_toml
from tests.fuzzing.webhooks import Request, webhook_registry_toml

ARRIVED_AT = datetime.fromtimestamp(ARRIVAL, UTC)
POLICY = Policy()
# storable_text bounds the text before escaping; an escape is at most 6 characters
# (``\udc00``), so this is the most a bounded column can hold.
_ESCAPE_GROWTH = 6
_TEXT_COLUMNS = {
    "detail": MAX_DETAIL,
    "producer": MAX_TEXT,
    "event_id": MAX_TEXT,
    "tenant": MAX_TEXT,
    "type": MAX_TEXT,
    "correlation_id": MAX_TEXT,
}
_SEEN_KEYS = frozenset({"producer", "event_id", "tenant", "type", "correlation_id"})


@cache
def registry() -> Registry:
    """The generator's producers with their keys, and its payload schemas."""
    text = registry_toml() + webhook_registry_toml()
    parsed = parse_registry(text, Path("."), origin="fuzz")
    schemas = {t: Draft202012Validator(s) for t, s in SCHEMAS.items()}
    return replace(parsed, schemas=schemas)


def judge_record(
    key: bytes | None, headers: tuple[Header, ...], value: bytes | None
) -> CompletionEvent | Rejection:
    return judge(RawRecord(key, headers, value, ARRIVED_AT), registry(), POLICY)


def check_record(key: bytes | None, headers: tuple[Header, ...], value: bytes | None) -> None:
    """Run the gate on (key, headers, value) and check what it answers (module docstring)."""
    verdict = judge_record(key, headers, value)
    if isinstance(verdict, CompletionEvent):
        check_accepted(verdict)
        check_one_meaning(headers, value, verdict)
    elif isinstance(verdict, Rejection):
        check_rejection(verdict)
        check_quarantine_row(key, headers, value, verdict)
    else:
        raise AssertionError(f"the gate answered {type(verdict).__name__}: {verdict!r}")


# An HTTP field name (RFC 9110 token), as h11 requires of every request.
_TOKEN = re.compile(rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+")


def to_ingress_record(request: Request) -> RawRecord | Refusal:
    """The ingress's translation of ``request`` (its URL's producer must exist: the app
    answers 404 before translating otherwise)."""
    producer = registry().producers[request.producer]
    return to_record(producer, list(request.headers), request.body, ARRIVED_AT)


def ingress_verdict(request: Request) -> CompletionEvent | Rejection | Refusal:
    """What the ingress answers ``request`` with, as ``matcher.ingress.app`` decides it:
    the translation, the gate, and the URL's producer against the event's source."""
    record = to_ingress_record(request)
    if isinstance(record, Refusal):
        return record
    verdict = judge(record, registry(), POLICY)
    if isinstance(verdict, CompletionEvent) and verdict.source != request.producer:
        return Refusal("ambiguous", "the event's source is not the URL's producer")
    return verdict


def check_request(request: Request) -> None:
    """Translate ``request`` as the ingress does; check the answer, then the record."""
    record = to_ingress_record(request)
    if isinstance(record, Refusal):
        assert record.reason in STATUS, f"a refusal without a status: {record!r}"
        assert isinstance(record.detail, str)
        return
    assert isinstance(record, RawRecord), f"to_record answered {type(record).__name__}"
    tokens = all(_TOKEN.fullmatch(name) for name, _ in request.headers)
    for name, value in record.headers:
        assert isinstance(name, bytes), name
        assert isinstance(value, bytes), (name, value)
        if tokens:  # what an HTTP server lets through: the app names Kafka headers in ASCII
            name.decode("ascii")
    check_record(record.key, record.headers, record.value)
    verdict = judge(record, registry(), POLICY)
    if isinstance(verdict, Rejection):
        assert verdict.reason in STATUS, f"the ingress has no status for {verdict.reason!r}"


def callback_verdict(call: CallbackCall) -> CallbackRequest | Refusal:
    return to_callback(call.token, call.query, list(call.headers), call.body)


def check_callback(call: CallbackCall) -> None:
    """Read ``call`` as the ingress does; check the answer (module docstring)."""
    verdict = callback_verdict(call)
    if isinstance(verdict, Refusal):
        assert verdict.reason in STATUS, f"a refusal without a status: {verdict!r}"
        assert 400 <= verdict.status < 500, f"a malformed request answered {verdict.status}"
        assert isinstance(verdict.detail, str)
        return
    assert isinstance(verdict, CallbackRequest), f"to_callback answered {type(verdict).__name__}"
    assert is_token(call.token), f"accepted a token of another form: {call.token!r}"
    assert verdict.token_sha256 == hashlib.sha256(call.token.encode()).digest()
    assert call.token not in verdict.label, "the label shows the token"
    assert unstorable(verdict.data) is None, unstorable(verdict.data)
    for number in _numbers(verdict.data):
        assert math.isfinite(float(number)), f"accepted a number beyond a double: {number!r}"
    _, event_type, data = other_reading(call)
    assert verdict.event_type == event_type, (verdict.event_type, event_type)
    if event_type is not None:
        _storable(event_type, "the type")
    assert _as_decimals(verdict.data) == data, "the data is not the body another reader reads"
    traced = [v for n, v in call.headers if n == b"traceparent"]
    # One traceparent, however often it is given; none if they differ.
    assert verdict.trace_parent is None or set(traced) == {verdict.trace_parent.encode()}


def callback_reproducer(call: CallbackCall) -> str:
    return f"check_callback({call!r})"


def request_reproducer(request: Request) -> str:
    lines = ["check_request(Request(", f"    producer={request.producer!r},", "    headers=("]
    lines += [f"        ({name!r}, {v!r})," for name, v in request.headers]
    lines += ["    ),", f"    body={request.body!r},", "))"]
    return "\n".join(lines)


def reproducer(key: bytes | None, headers: tuple[Header, ...], value: bytes | None) -> str:
    """The failing input as Python source: paste it into a test to replay it."""
    lines = ["check_record(", f"    key={key!r},", "    headers=("]
    lines += [f"        ({name!r}, {v!r})," for name, v in headers]
    lines += ["    ),", f"    value={value!r},", ")"]
    return "\n".join(lines)


def _storable(text: object, what: str) -> None:
    assert isinstance(text, str), f"{what} is {type(text).__name__}, not text"
    text.encode("utf-8")  # raises on a lone surrogate
    assert "\x00" not in text, f"{what} holds NUL: {text[:200]!r}"


def _numbers(value: Any) -> list[int | float]:
    stack, found = [value], []
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, int | float) and not isinstance(item, bool):
            found.append(item)
    return found


def check_accepted(event: CompletionEvent) -> None:
    assert unstorable(event.data) is None, unstorable(event.data)
    json.dumps(event.data, ensure_ascii=False, allow_nan=False).encode("utf-8")
    for number in _numbers(event.data):  # the number rule: finite as a double, for every reader
        assert math.isfinite(float(number)), f"accepted a number beyond a double: {number!r}"
    for name in ("id", "source", "type", "tenant", "correlationid", "jobid"):
        value = getattr(event, name)
        if value is not None:
            _storable(value, f"the event's {name}")
    if event.time is not None:
        # Postgres stores any instant, but a reader gets it back in UTC; past year 9999 or
        # before year 1 there, Python (psycopg, pydantic) cannot load it.
        try:
            event.time.astimezone(UTC)
        except OverflowError:
            raise AssertionError(
                f"accepted time {event.time.isoformat()} is outside datetime's range in UTC"
            ) from None
    event.model_dump_json()


# The envelope keys matcher reads; another key folding to one is a second reading.
_READ_KEYS = frozenset(
    {"specversion", "id", "source", "type", "tenant", "correlationid", "jobid", "time",
     "datacontenttype", "data", "data_base64"}
)  # fmt: skip


def _as_decimals(value: Any) -> Any:
    """``value`` with each float as the decimal it is written back as (its repr)."""
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, list):
        return [_as_decimals(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_decimals(v) for k, v in value.items()}
    return value


def check_one_meaning(
    headers: tuple[Header, ...], value: bytes | None, event: CompletionEvent
) -> None:
    """An accepted record read by another reader (Decimal numbers, folded keys) says the
    same as matcher's reading of it."""
    if not value:
        return
    content_type = next((v for n, v in headers if n == b"content-type"), None) or b""
    other = json.loads(value, parse_float=Decimal)
    # The media type without its parameters and the whitespace around it, which the gate
    # allows (" application/cloudevents+json" is structured mode too).
    if content_type.split(b";")[0].strip().lower() == b"application/cloudevents+json":
        for key in other:
            folded = key.casefold()
            assert folded == key or folded not in _READ_KEYS, f"envelope key {key!r} accepted"
        other = other.get("data")
    assert _as_decimals(event.data) == other, "a number in the data is not the one written"


def check_rejection(rejection: Rejection) -> None:
    assert rejection.reason in REASONS, f"unknown reason {rejection.reason!r}"
    assert isinstance(rejection.detail, str), rejection
    assert set(rejection.seen) <= _SEEN_KEYS, rejection.seen


def check_quarantine_row(
    key: bytes | None, headers: tuple[Header, ...], value: bytes | None, rejection: Rejection
) -> None:
    record = IngestRecord("t", 0, 0, key, value, headers, rejection, ARRIVED_AT)
    row = {name: column[0] for name, column in _quarantine_params([record], DEFAULT_LIMITS).items()}
    assert row["reason"] == rejection.reason
    for column, limit in _TEXT_COLUMNS.items():
        if row[column] is not None:
            _storable(row[column], column)
            assert len(row[column]) <= limit * _ESCAPE_GROWTH, (column, len(row[column]))
    _check_headers_json(row["headers"].obj, headers)
    _check_sizes(row, key, value)


def _check_headers_json(stored: Any, headers: tuple[Header, ...]) -> None:
    limits = DEFAULT_LIMITS
    text = json.dumps(stored, ensure_ascii=False)
    text.encode("utf-8")  # raises on a lone surrogate, which jsonb refuses
    assert "\\u0000" not in text, "the headers JSON holds \\u0000, which jsonb refuses"
    assert "\\u0000" not in json.dumps(stored), "jsonb refuses \\u0000 however it is sent"
    assert len(stored) <= limits.headers
    back = headers_from_json(stored)
    assert back == headers[: len(back)], "the stored headers do not read back as received"
    assert sum(len(n) + len(v or b"") for n, v in back) <= limits.header_bytes


def _check_sizes(row: dict[str, Any], key: bytes | None, value: bytes | None) -> None:
    limits = DEFAULT_LIMITS
    if key is None:
        assert row["key"] is None
    else:
        assert row["key"] == key[: limits.header_bytes]
    if value is None:
        assert (row["value"], row["size"], row["sha256"]) == (None, None, None)
        return
    assert row["size"] == len(value)
    assert row["sha256"] == hashlib.sha256(value).digest()
    if len(value) <= limits.value_bytes:
        assert row["value"] == value, "a value within the limit must be kept whole"
    else:
        assert row["truncated"], "a value past the limit is kept as a truncated prefix"
        assert row["value"] == value[: limits.prefix_bytes]
