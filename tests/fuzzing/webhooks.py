"""Forwarded plain webhooks and HTTP requests for the gate, and their mutations.

Two kinds of input beside ``records``' CloudEvents records:

- *webhook records*: what the ingress forwards for a plain-webhook producer (the body
  bytes, the scheme's signature headers, ``matcher_webhook: <producer>``), signed as each
  scheme's sender signs: Standard Webhooks with an HMAC ``v1`` or an Ed25519 ``v1a`` key,
  GitHub's ``x-hub-signature-256``, Stripe's ``stripe-signature``;
- *HTTP requests*: (URL producer, header list, body) as the ASGI server hands them to
  ``matcher.ingress.requests.to_record``, for the webhook producers and for CloudEvents
  producers (binary mode's ``ce-`` headers percent-encoded, structured mode as it is).

Mutations cover what an attacker on the internet controls: the body, each header
(renamed, respelled in case, ``_``/``-`` or width, duplicated, removed, its value
replaced), the producer named in the URL, a ``matcher_webhook`` or ``ce-`` header of its
own, the content type, the percent-encoding of ``ce-`` values. Every decision comes from
a ``Chooser``, as in ``records``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import unquote_to_bytes

from tests.fuzzing.choosers import Chooser
from tests.fuzzing.records import (
    ARRIVAL,
    PRODUCERS,
    SKEW,
    FuzzKey,
    Record,
    _ed25519_key,
    _hmac_key,
    _splice,
    either,
    ident,
    json_value,
    mutate,
    other_record_value,
    other_value,
    resign,
    respell,
    shuffle,
    valid_record,
)

HttpHeaders = tuple[tuple[bytes, bytes], ...]


@dataclass(frozen=True)
class WebhookProducer:
    source: str
    scheme: str
    tenants: tuple[str, ...]
    types: tuple[str, ...]
    keys: tuple[FuzzKey, ...]  # standard-webhooks
    secret: str | None  # github and stripe
    mapping: tuple[tuple[str, str], ...]  # TOML keys and templates


WEBHOOK_PRODUCERS = (
    # An OpenAI-style batch callback: the id is webhook-id (the default), a fixed tenant.
    WebhookProducer(
        "hook-hmac", "standard-webhooks", ("acme",), ("batch.completed", "batch.failed"),
        (_hmac_key("wh1", b"fuzz-webhook-hmac-secret-32-by!!"),), None,
        (("type", "{/type}"), ("correlationid", "{/data/id}"), ("tenant", "acme"),
         ("jobid", "{/data/job}")),
    ),
    # Ed25519 (v1a), any tenant and type from the body, an id from both signed headers.
    WebhookProducer(
        "hook-ed", "standard-webhooks", ("*",), ("*",),
        (_ed25519_key("we1", bytes(range(64, 96))),), None,
        (("id", "{header:webhook-id}@{header:webhook-timestamp}"), ("type", "hook.{/kind}"),
         ("tenant", "{/tenant}"), ("correlationid", "{/refs/0}"), ("time", "{/at}")),
    ),
    WebhookProducer(
        "hook-github", "github", ("acme",), ("github.workflow_run.completed",), (),
        "It's a fuzz secret",
        (("id", "{/workflow_run/id}-{/workflow_run/run_attempt}-{/action}"),
         ("type", "github.workflow_run.{/action}"), ("correlationid", "{/workflow_run/id}"),
         ("jobid", "{/workflow_run/head_sha}"), ("tenant", "acme")),
    ),
    WebhookProducer(
        "hook-stripe", "stripe", ("acme", "globex"),
        ("payment_intent.succeeded", "payment_intent.payment_failed"), (), "whsec_fuzz_7bYf3k",
        (("type", "{/type}"), ("correlationid", "{/data/object/id}"),
         ("tenant", "{/data/object/metadata/tenant}")),
    ),
)  # fmt: skip
WEBHOOK_SOURCES = tuple(p.source for p in WEBHOOK_PRODUCERS)
ALL_SOURCES = (*(p.source for p in PRODUCERS), *WEBHOOK_SOURCES)


def webhook_registry_toml() -> str:
    lines: list[str] = []
    for p in WEBHOOK_PRODUCERS:
        mapping = ", ".join(f"{name} = {json.dumps(text)}" for name, text in p.mapping)
        lines += [
            f'[producers."{p.source}"]',
            f"tenants = {json.dumps(list(p.tenants))}",
            f"types = {json.dumps(list(p.types))}",
            f'webhook.scheme = "{p.scheme}"',
            f"webhook.mapping = {{ {mapping} }}",
        ]
        for key in p.keys:
            lines += [
                f'[[producers."{p.source}".keys]]',
                f'id = "{key.signing.id}"',
                f'{key.registry_field} = "{key.registry_value}"',
            ]
        if p.secret is not None:
            lines += [
                f'[[producers."{p.source}".keys]]',
                'id = "s1"',
                f"secret = {json.dumps(p.secret)}",
            ]
    return "\n".join(lines) + "\n"


# --- bodies ---------------------------------------------------------------------------


def _scalar_id(c: Chooser) -> str | int:
    """What a mapping may read: a string or an integer (huge ones too)."""
    makers: list[Callable[[], str | int]] = [
        lambda: ident(c), lambda: c.integer(0, 2**40), lambda: 10**30 + 7,
    ]  # fmt: skip
    return either(c, (), makers)


def _extras(c: Chooser, document: dict[str, Any]) -> dict[str, Any]:
    """Fields no mapping reads, in any order: the rest of a real sender's payload."""
    for _ in range(c.integer(0, 3)):
        document.setdefault(c.choice(("object", "created", "livemode", "x", "é")), json_value(c))
    items = list(document.items())
    shuffle(c, items)
    return dict(items)


def _time(c: Chooser) -> str:
    return c.choice(("2026-01-01T00:00:00Z", "2025-12-31T23:59:59.5+01:00", "1970-01-01t00:00:00z"))


def _body_document(c: Chooser, p: WebhookProducer) -> dict[str, Any]:
    if p.source == "hook-hmac":
        data = {"id": _scalar_id(c), "job": _scalar_id(c), "more": json_value(c)}
        return {"id": ident(c), "type": c.choice(p.types), "data": data}
    if p.source == "hook-ed":
        refs = [_scalar_id(c) for _ in range(c.integer(1, 3))]
        kind = c.choice(("done", "failed", "x.y", "é"))
        return {"kind": kind, "tenant": c.choice(("acme", "globex", "ünï")), "refs": refs,
                "at": _time(c)}  # fmt: skip
    if p.source == "hook-github":
        run = {"id": c.integer(1, 2**40), "run_attempt": c.integer(1, 9),
               "head_sha": ident(c), "status": "completed"}  # fmt: skip
        return {"action": "completed", "workflow_run": run, "repository": json_value(c)}
    intent = {"id": ident(c), "object": "payment_intent",
              "metadata": {"tenant": c.choice(p.tenants)}}  # fmt: skip
    return {"id": ident(c), "type": c.choice(p.types), "data": {"object": intent}}


def _dump(c: Chooser, document: Any) -> bytes:
    separators = c.choice(((",", ":"), (", ", ": ")))
    return json.dumps(document, separators=separators, ensure_ascii=c.boolean()).encode()


# --- signatures -----------------------------------------------------------------------


def standard_headers(
    p: WebhookProducer, msg_id: bytes, stamp: bytes, body: bytes
) -> list[tuple[bytes, bytes]]:
    message = msg_id + b"." + stamp + b"." + body
    signature = " ".join(k.signing.sign(message) for k in p.keys).encode()
    return [
        (b"webhook-id", msg_id),
        (b"webhook-timestamp", stamp),
        (b"webhook-signature", signature),
    ]


def github_header(p: WebhookProducer, body: bytes) -> tuple[bytes, bytes]:
    assert p.secret is not None
    digest = hmac.new(p.secret.encode(), body, hashlib.sha256).hexdigest().encode()
    return b"x-hub-signature-256", b"sha256=" + digest


def stripe_header(p: WebhookProducer, stamp: bytes, body: bytes) -> tuple[bytes, bytes]:
    assert p.secret is not None
    digest = hmac.new(p.secret.encode(), stamp + b"." + body, hashlib.sha256).hexdigest()
    return b"stripe-signature", b"t=" + stamp + b",v1=" + digest.encode()


def signature_headers(
    c: Chooser, p: WebhookProducer, body: bytes, stamp: bytes | None = None
) -> list[tuple[bytes, bytes]]:
    """The scheme's signature headers for ``body``, fresh for ``ARRIVAL``."""
    stamp = stamp or str(ARRIVAL + c.integer(-SKEW, SKEW)).encode()
    if p.scheme == "standard-webhooks":
        msg_id = ("msg_" + ident(c)).encode()
        return standard_headers(p, msg_id if len(msg_id) <= 480 else b"msg_long", stamp, body)
    if p.scheme == "github":
        return [github_header(p, body)]
    return [stripe_header(p, stamp, body)]


# --- HTTP requests --------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """An HTTP request as ASGI gives it: lowercase header names, the body's bytes."""

    producer: str  # the URL's {producer}
    headers: HttpHeaders
    body: bytes


_JSON_TYPES = (b"application/json", b"application/json; charset=utf-8",
               b"application/json;charset=\"UTF-8\"", b"Application/JSON")  # fmt: skip
_HTTP_NOISE = (
    (b"user-agent", b"GitHub-Hookshot/044aadd"),
    (b"accept", b"*/*"),
    (b"host", b"hooks.example"),
    (b"x-forwarded-for", b"203.0.113.9"),
    (b"x-github-event", b"workflow_run"),
    (b"x-github-delivery", b"72d3162e-cc78-11e3-81ab-4c9367dc0958"),
    (b"content-length", b"100"),
    (b"x-request-id", b"r-1"),
)


def _noise(c: Chooser) -> list[tuple[bytes, bytes]]:
    return [c.choice(_HTTP_NOISE) for _ in range(c.integer(0, 2))]


def valid_webhook_request(c: Chooser) -> Request:
    """A request the ingress and then the gate must accept, of a plain-webhook producer."""
    p = c.choice(WEBHOOK_PRODUCERS)
    body = _dump(c, _extras(c, _body_document(c, p)))
    headers = [(b"content-type", c.choice(_JSON_TYPES)), *signature_headers(c, p, body)]
    headers += _noise(c)
    shuffle(c, headers)
    return Request(p.source, tuple(headers), body)


# The CloudEvents HTTP binding percent-encodes space, '"', '%' and what is not printable
# ASCII; any other byte may be encoded as well.
_MUST_ENCODE = frozenset(b' "%') | frozenset(range(0x00, 0x21)) | frozenset(range(0x7F, 0x100))


def percent_encode(c: Chooser, value: bytes) -> bytes:
    out = bytearray()
    for byte in value:
        if byte in _MUST_ENCODE or c.integer(0, 7) == 0:
            hex_digits = f"{byte:02X}" if c.boolean() else f"{byte:02x}"
            out += b"%" + hex_digits.encode()
        else:
            out.append(byte)
    return bytes(out)


def valid_cloudevents_request(c: Chooser) -> Request:
    """A CloudEvents producer's signed record sent over HTTP (binary or structured mode)."""
    record = valid_record(c)
    if _header(record, b"content-type") is None:  # HTTP needs one, and binary mode signs it
        kept = [h for h in record.headers if h[0] != b"content-type"]
        record = resign(c, replace(record, headers=(*kept, (b"content-type", b"application/json"))))
    source = _cloudevents_source(record)
    headers: list[tuple[bytes, bytes]] = []
    content_type = b"application/json"
    for name, value in record.headers:
        if value is None:
            continue
        if name == b"content-type":
            content_type = value
        elif name.startswith(b"ce_"):
            headers.append((b"ce-" + name[3:], percent_encode(c, value)))
        elif name.startswith(b"webhook-"):
            headers.append((name, value))
    headers += [(b"content-type", content_type), *_noise(c)]
    shuffle(c, headers)
    return Request(source, tuple(headers), record.value or b"")


def _header(record: Record, name: bytes) -> bytes | None:
    return next((v for n, v in record.headers if n == name), None)


def _cloudevents_source(record: Record) -> str:
    found = {n: v for n, v in record.headers if v is not None}.get(b"ce_source")
    if found is None:
        envelope = json.loads(record.value or b"{}")
        return str(envelope["source"])
    return found.decode()


def valid_request(c: Chooser) -> Request:
    return valid_webhook_request(c) if c.integer(0, 3) else valid_cloudevents_request(c)


# --- webhook records (what reaches the daemon's gate from Kafka) ----------------------


def valid_webhook_record(c: Chooser) -> Record:
    """The record the ingress forwards for a valid webhook request, as the gate reads it
    from Kafka: ``matcher_webhook`` first, the copied headers, the body."""
    request = valid_webhook_request(c)
    kept = [(n, v) for n, v in request.headers if n in _FORWARDED]
    headers: list[tuple[bytes, bytes | None]] = [(b"matcher_webhook", request.producer.encode())]
    headers += kept
    key = c.choice((None, b"acme\x1fc", b""))
    return Record(key, tuple(headers), request.body)


_FORWARDED = frozenset(
    {b"content-type", b"webhook-id", b"webhook-timestamp", b"webhook-signature",
     b"x-hub-signature-256", b"stripe-signature", b"x-github-delivery", b"x-github-event"}
)  # fmt: skip


# --- mutations of requests ------------------------------------------------------------

RequestMutation = Callable[[Chooser, Request], Request]

_READ_NAMES = (
    b"content-type", b"webhook-id", b"webhook-timestamp", b"webhook-signature",
    b"x-hub-signature-256", b"stripe-signature", b"matcher_webhook", b"matcher-webhook",
    b"ce-id", b"ce-source", b"ce-tenant", b"ce-type", b"ce-correlationid", b"ce-specversion",
    b"ce-jobid", b"ce-time", b"ce-datacontenttype", b"ce_tenant", b"webhook_signature",
    b"content_type", b"x_hub_signature_256", b"stripe_signature",
)  # fmt: skip
_CONTENT_TYPES = (
    b"application/json", b"text/json", b"application/vnd.x+json", b"application/cloudevents+json",
    b"application/x-www-form-urlencoded", b"text/plain", b"application/json; charset=latin-1",
    b"application/json; charset=utf-16", b"", b"application/json\x00", b" application/json",
    b"application/cloudevents-batch+json", "application/json\uff0b".encode(),
)  # fmt: skip
_PRODUCER_VALUES = (
    *(s.encode() for s in ALL_SOURCES),
    b"HOOK-HMAC", b"hook-hmac\x00", b"hook-hmac/..", b"../hook-hmac", b"hook%2Dhmac",
    "hook\u2010hmac".encode(), b"", b"\xff",
)  # fmt: skip


def _with(request: Request, headers: list[tuple[bytes, bytes]]) -> Request:
    return replace(request, headers=tuple(headers))


def _pick(c: Chooser, request: Request) -> int | None:
    return c.integer(0, len(request.headers) - 1) if request.headers else None


def _http_value(value: bytes | None) -> bytes:
    return b"" if value is None else value


def _rename(c: Chooser, request: Request) -> Request:
    i = _pick(c, request)
    if i is None:
        return _add_read(c, request)
    headers = list(request.headers)
    name, value = headers[i]
    respelt = c.choice(
        (name.replace(b"-", b"_"), name.replace(b"_", b"-"), name.upper(), respell(c, name))
    )
    headers[i] = (respelt, value)
    return _with(request, headers)


def _duplicate(c: Chooser, request: Request) -> Request:
    i = _pick(c, request)
    if i is None:
        return _add_read(c, request)
    headers = list(request.headers)
    name, value = headers[i]
    copy = (name, _http_value(other_value(c, value)) if c.boolean() else value)
    headers.insert(c.integer(0, len(headers)), copy)
    return _with(request, headers)


def _remove(c: Chooser, request: Request) -> Request:
    i = _pick(c, request)
    if i is None:
        return request
    return replace(request, headers=request.headers[:i] + request.headers[i + 1 :])


def _value(c: Chooser, request: Request) -> Request:
    i = _pick(c, request)
    if i is None:
        return _add_read(c, request)
    headers = list(request.headers)
    name, value = headers[i]
    headers[i] = (name, _http_value(other_value(c, value)))
    return _with(request, headers)


def _add_read(c: Chooser, request: Request) -> Request:
    """A header the ingress or the gate reads, under its name or a look-alike, of the
    attacker's choosing (matcher_webhook, ce-tenant, a second signature...)."""
    name = c.choice(_READ_NAMES)
    value = either(
        c, (b"acme", b"globex", b"1.0", b"batch.completed"),
        [lambda: c.choice(_PRODUCER_VALUES), lambda: _http_value(other_value(c, None))],
    )  # fmt: skip
    headers = list(request.headers)
    headers.insert(c.integer(0, len(headers)), (name, value))
    return _with(request, headers)


def _content_type(c: Chooser, request: Request) -> Request:
    kept = [h for h in request.headers if h[0] != b"content-type"]
    if c.integer(0, 4):
        kept.insert(c.integer(0, len(kept)), (b"content-type", c.choice(_CONTENT_TYPES)))
    return _with(request, kept)


def _url_producer(c: Chooser, request: Request) -> Request:
    """The same request posted to another producer's URL."""
    return replace(request, producer=c.choice(ALL_SOURCES))


def _body(c: Chooser, request: Request) -> Request:
    how = c.integer(0, 3)
    if how == 0:
        return replace(request, body=other_record_value(c, request.body) or b"")
    if how == 1:  # the same document written otherwise, or with a field changed
        try:
            document = json.loads(request.body)
        except (ValueError, RecursionError):
            return request
        if isinstance(document, dict) and document and c.boolean():
            field = c.choice(sorted(document))
            document[field] = json_value(c)
        return replace(request, body=json.dumps(document, indent=c.choice((None, 1))).encode())
    if how == 2:  # a key given twice: the second reading a lenient parser would take
        literal = json.dumps(c.choice(("globex", "batch.failed", 1, "x"))).encode()
        return replace(request, body=_splice(c, request.body, literal))
    return replace(request, body=request.body + c.choice((b" ", b"\n", b"\x00", b"{}")))


def _percent(c: Chooser, request: Request) -> Request:
    """A ``ce-`` value written with another percent-encoding: the same value (a harmless
    change), or an escape that is not one."""
    indices = [i for i, (n, _) in enumerate(request.headers) if n.startswith(b"ce-")]
    if not indices:
        return _add_read(c, request)
    i = c.choice(indices)
    headers = list(request.headers)
    name, value = headers[i]
    decoded = _decoded(value)
    new = either(
        c, (value + b"%", value + b"%4", value + b"%zz", value + b"%00", value + b"%ff",
            value.replace(b"%", b"%25")),
        [lambda: percent_encode(c, decoded)],
    )  # fmt: skip
    headers[i] = (name, new)
    return _with(request, headers)


def _decoded(value: bytes) -> bytes:
    return unquote_to_bytes(value)


def _reorder(c: Chooser, request: Request) -> Request:
    headers = list(request.headers)
    shuffle(c, headers)
    return _with(request, headers)


def _stale(c: Chooser, request: Request) -> Request:
    """A webhook re-signed with the right key but a timestamp out of the tolerance (what
    a replay of an old delivery looks like)."""
    p = next((w for w in WEBHOOK_PRODUCERS if w.source == request.producer), None)
    if p is None or p.scheme == "github":
        return _value(c, request)
    stamp = str(ARRIVAL + c.choice((-301, 301, -(10**6), 10**11))).encode()
    kept = [h for h in request.headers if h[0] not in _SIGNATURE_NAMES]
    return _with(request, [*kept, *signature_headers(c, p, request.body, stamp)])


_SIGNATURE_NAMES = frozenset(
    {b"webhook-id", b"webhook-timestamp", b"webhook-signature", b"x-hub-signature-256",
     b"stripe-signature"}
)  # fmt: skip


REQUEST_MUTATIONS: dict[str, RequestMutation] = {
    "rename": _rename,
    "duplicate": _duplicate,
    "remove": _remove,
    "value": _value,
    "add_read": _add_read,
    "content_type": _content_type,
    "url_producer": _url_producer,
    "body": _body,
    "percent": _percent,
    "reorder": _reorder,
    "stale": _stale,
}
_REQUEST_MUTATION_NAMES = tuple(REQUEST_MUTATIONS)


def mutate_request(c: Chooser, request: Request) -> tuple[str, Request]:
    name = c.choice(_REQUEST_MUTATION_NAMES)
    return name, REQUEST_MUTATIONS[name](c, request)


def random_request(c: Chooser) -> Request:
    headers = []
    for _ in range(c.integer(0, 6)):
        name = c.choice(_READ_NAMES) if c.boolean() else c.raw(16)
        headers.append((name, c.raw(48)))
    return Request(c.choice(ALL_SOURCES), tuple(headers), c.raw(256))


def fuzz_request(c: Chooser) -> Request:
    """Mostly a valid request with up to four mutations; sometimes random bytes."""
    if c.integer(0, 9) == 9:
        return random_request(c)
    request = valid_request(c)
    for _ in range(c.integer(0, 4)):
        request = mutate_request(c, request)[1]
    return request


# --- mutations of webhook records (a malicious Kafka producer) ------------------------


def resign_webhook(c: Chooser, record: Record) -> Record:
    """A webhook record whose body was changed, signed again by the producer its
    ``matcher_webhook`` names (a registered sender with a bug, or a stolen key), so that
    hostile bodies reach the mapping."""
    named = next((v for n, v in record.headers if n == b"matcher_webhook"), None)
    p = next((w for w in WEBHOOK_PRODUCERS if w.source.encode() == named), None)
    if p is None:
        return record
    body = record.value or b""
    kept = [h for h in record.headers if h[0] not in _SIGNATURE_NAMES]
    return replace(record, headers=(*kept, *signature_headers(c, p, body)))


def hostile_body(c: Chooser, record: Record) -> Record:
    """A body that a mapping must refuse or read safely: pointers at nothing, at non-scalars,
    at hostile text, deep, duplicated keys; then signed again."""
    try:
        document = json.loads(record.value or b"")
    except (ValueError, RecursionError):
        document = {}
    hostile: Any = c.choice(
        ("", "\x00", "a\x00b", "\ud800", None, True, 1.5, [], {}, 2**64, -(10**40), "x" * 600,
         "\u202egnp.exe", "{/type}", "{header:webhook-id}", "2026-02-30T00:00:00Z")
    )  # fmt: skip
    path = c.choice((("type",), ("data", "id"), ("tenant",), ("kind",), ("at",), ("refs",),
                     ("workflow_run", "id"), ("data", "object", "metadata", "tenant")))  # fmt: skip
    node = document
    for step in path[:-1]:
        if not isinstance(node, dict):
            break
        node = node.setdefault(step, {})
    if isinstance(node, dict):
        node[path[-1]] = hostile
    body = json.dumps(document, ensure_ascii=c.boolean()).encode("utf-8", "surrogatepass")
    return resign_webhook(c, replace(record, value=body))


def as_record(c: Chooser) -> Record:
    """A webhook record for the record-level fuzz target: valid, then mutated by the
    record mutations, perhaps given a hostile body signed again."""
    record = valid_webhook_record(c)
    for _ in range(c.integer(0, 3)):
        record = mutate(c, record)[1]
    how = c.integer(0, 3)
    if how == 2:
        record = resign_webhook(c, record)
    elif how == 3:
        record = hostile_body(c, record)
    return record
