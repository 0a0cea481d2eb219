"""Callback requests (``POST /v1/callbacks/{token}``) for the fuzz target and the property
tests: valid ones, mutated as a sender on the internet could, and random ones.

A request is what the ingress's ``to_callback`` reads: the token as the router gives it
(percent-decoded text of one path segment), the raw query string, the headers (lowercase
names) and the body.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any
from urllib.parse import parse_qs, quote

from tests.fuzzing.choosers import Chooser
from tests.fuzzing.records import ident, json_value
from tests.fuzzing.webhooks import _JSON_TYPES, _noise

Headers = tuple[tuple[bytes, bytes], ...]
TRACEPARENT = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@dataclass(frozen=True)
class CallbackCall:
    token: str
    query: bytes
    headers: Headers
    body: bytes


def token(c: Chooser) -> str:
    """A token of the issued form: 32 bytes, base64url without padding."""
    raw = c.raw(32).ljust(32, b"\x00")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _type_query(c: Chooser) -> bytes:
    kind = c.integer(0, 3)
    if kind == 0:
        return b""
    value = ident(c) if kind == 3 else c.choice(("job.completed", "job.failed", "é.done"))
    return b"type=" + quote(value, safe=c.choice(("", ".", "-_."))).encode()


def valid_callback(c: Chooser) -> CallbackCall:
    """A request the ingress must accept (hand to the database)."""
    headers = [(b"content-type", c.choice(_JSON_TYPES)), *_noise(c)]
    if c.boolean():
        headers.append((b"traceparent", TRACEPARENT))
    body = json.dumps(
        json_value(c), separators=c.choice(((",", ":"), (", ", ": "))), ensure_ascii=c.boolean()
    ).encode()
    return CallbackCall(token(c), _type_query(c), tuple(headers), body)


# --- mutations -----------------------------------------------------------------------

_TOKEN_CHARS = "AZaz09-_+/=.%~ \x00é\U0001f600"


def _token(c: Chooser, call: CallbackCall) -> CallbackCall:
    text = call.token
    how = c.integer(0, 5)
    if how == 0 and text:  # one character changed
        at = c.integer(0, len(text) - 1)
        text = text[:at] + c.choice(_TOKEN_CHARS) + text[at + 1 :]
    elif how == 1:  # shortened
        text = text[: c.integer(0, len(text))]
    elif how == 2:  # lengthened
        text += c.choice(_TOKEN_CHARS) * c.integer(1, 3)
    elif how == 3:  # case swapped
        text = text.swapcase()
    elif how == 4:  # padded as base64 would
        text += "="
    else:
        text = c.raw(48).decode("utf-8", "replace")
    return replace(call, token=text)


_QUERIES = (b"type=job.completed&type=job.failed", b"tenant=globex", b"type", b"type=",
            b"type=%", b"type=%ff", b"type=%00", b"type=a+b", b"Type=job.completed",
            b"type=job.completed&", b"&type=job.completed", b"type=job.completed;x=1",
            b"type=" + b"x" * 600, b"type=%ed%a0%80", "type=é".encode())  # fmt: skip


def _query(c: Chooser, call: CallbackCall) -> CallbackCall:
    return replace(call, query=c.choice(_QUERIES) if c.boolean() else c.raw(24))


_CONTENT_TYPES = (b"text/plain", b"application/cloudevents+json", b"application/x-www-form"
                  b"-urlencoded", b"application/json; charset=latin-1", b"", b"json",
                  b"application/problem+json", b"application/json;;")  # fmt: skip


def _content_type(c: Chooser, call: CallbackCall) -> CallbackCall:
    kept = [h for h in call.headers if h[0] != b"content-type"]
    how = c.integer(0, 2)
    if how == 0:
        return replace(call, headers=tuple(kept))
    given = [h for h in call.headers if h[0] == b"content-type"]
    if how == 1:
        return replace(call, headers=(*call.headers, *given))
    return replace(call, headers=(*kept, (b"content-type", c.choice(_CONTENT_TYPES))))


_BODIES = (b"", b"NaN", b"1e400", b"1.00000000000000000001", b'{"a":1,"a":2}', b"\xef\xbb\xbf{}",
           b'"\\u0000"', b'"\\ud800"', b"[" * 70 + b"]" * 70, b"{} {}", b"tru", b"\xff",
           b"1" * 400, b'{"a": "\x01"}', "{\"é\": 1}".encode("utf-16"))  # fmt: skip


def _body(c: Chooser, call: CallbackCall) -> CallbackCall:
    how = c.integer(0, 2)
    if how == 0:
        return replace(call, body=c.choice(_BODIES))
    if how == 1:
        return replace(call, body=call.body[: c.integer(0, len(call.body))])
    return replace(call, body=c.raw(64))


def _header(c: Chooser, call: CallbackCall) -> CallbackCall:
    """A header matcher does not read for callbacks, or a traceparent of any form."""
    name = c.choice((b"ce-type", b"ce-tenant", b"authorization", b"traceparent", b"x-token"))
    value = c.choice((b"job.failed", b"globex", b"Bearer x", TRACEPARENT, b"00-zz", c.raw(16)))
    return replace(call, headers=(*call.headers, (name, value)))


CALLBACK_MUTATIONS: dict[str, Callable[[Chooser, CallbackCall], CallbackCall]] = {
    "token": _token,
    "query": _query,
    "content_type": _content_type,
    "body": _body,
    "header": _header,
}
_NAMES = tuple(CALLBACK_MUTATIONS)


def mutate_callback(c: Chooser, call: CallbackCall) -> tuple[str, CallbackCall]:
    name = c.choice(_NAMES)
    return name, CALLBACK_MUTATIONS[name](c, call)


def random_callback(c: Chooser) -> CallbackCall:
    headers = tuple((c.choice((b"content-type", c.raw(12))), c.raw(32)) for _ in range(3))
    return CallbackCall(c.raw(48).decode("utf-8", "replace"), c.raw(24), headers, c.raw(128))


def fuzz_callback(c: Chooser) -> CallbackCall:
    """Mostly a valid request with up to four mutations; sometimes random bytes."""
    if c.integer(0, 9) == 9:
        return random_callback(c)
    call = valid_callback(c)
    for _ in range(c.integer(0, 4)):
        call = mutate_callback(c, call)[1]
    return call


def other_reading(call: CallbackCall) -> tuple[str, str | None, Any]:
    """What another reader takes an accepted request to say: the token, the type (the
    query's one value), and the body with numbers as decimals."""
    query = parse_qs(call.query.decode("ascii"), keep_blank_values=True)
    types = query.get("type")
    return (
        call.token,
        None if types is None else types[0],
        json.loads(call.body, parse_float=Decimal),
    )
