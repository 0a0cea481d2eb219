"""One canonical reading of a record: which mode, which attributes, which data.

A record is (key, headers, value) as a transport delivered it. The reading is defined on
exact bytes, and everything that another reader could take differently is refused:

- the headers the gate reads are ``content-type``, ``webhook-id``, ``webhook-timestamp``,
  ``webhook-signature``, every ``ce_<attribute>``, and for forwarded plain webhooks
  ``matcher_webhook``, ``x-hub-signature-256`` and ``stripe-signature``, spelled exactly
  so (lowercase ASCII).
  One that appears twice, or a name that folds to one of them under case, Unicode
  compatibility, spaces or ``-``/``_`` (``CE_TENANT``, ``Ce_type``, ``ce-tenant``,
  ``content-type `` ...), makes the record *ambiguous*: the CloudEvents SDK, for one,
  lowercases names and keeps the last, so such a record means one thing to the signature
  and another to a reader. Other headers are ignored.
- structured mode is exactly ``content-type: application/cloudevents+json``; it carries
  every attribute in the value, so a ``ce_`` header beside it is *ambiguous* as well, and
  so is an envelope key that folds, by the same rule as header names, to a key the gate
  reads (``Tenant``, ``correlationId``, ``ID``), with or without the exact key beside it.
- a record with neither (no ``ce_`` header, another content type, or none) is no
  CloudEvent: *malformed*, decided before any producer is looked up.
- binary mode takes the attributes from ``ce_`` headers (UTF-8, non-empty) and the data
  from the value, which must be JSON (``content-type`` a JSON media type, or absent).
- JSON is read strictly (``matcher.auth.strict_json``).

The reading keeps only the attributes matcher uses and the signature covers (see
``matcher.auth.signatures``); other extension attributes are dropped, never stored.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

from matcher.auth.strict_json import JsonRefused, loads
from matcher.auth.webhooks import GITHUB_SIGNATURE, STRIPE_SIGNATURE, WEBHOOK_HEADER
from matcher.domain.events import Rejection, summary_storable, unstorable
from matcher.domain.records import Header, RawRecord

CONTENT_TYPE = b"content-type"
WEBHOOK_HEADERS = (b"webhook-id", b"webhook-timestamp", b"webhook-signature")
CE_PREFIX = b"ce_"
STRUCTURED_MEDIA_TYPE = "application/cloudevents+json"

# The attributes an event must carry, and those matcher also reads when present.
REQUIRED = ("specversion", "id", "source", "type", "tenant", "correlationid")
OPTIONAL = ("jobid", "time")
_READ = (*REQUIRED, *OPTIONAL)
_READ_HEADERS = tuple((name, b"ce_" + name.encode()) for name in _READ)
# Every key of a structured envelope the reading looks at.
_ENVELOPE_READ = frozenset({*_READ, "datacontenttype", "data", "data_base64"})

# Forwarded plain webhooks (matcher.auth.webhooks) add the producer's name and the
# signature headers of GitHub and Stripe.
_WEBHOOK_RESERVED = (WEBHOOK_HEADER, GITHUB_SIGNATURE, STRIPE_SIGNATURE)
_RESERVED = frozenset({CONTENT_TYPE, *WEBHOOK_HEADERS, *_WEBHOOK_RESERVED})
_RESERVED_FOLDED = frozenset(name.decode().replace("-", "_") for name in _RESERVED)
# CloudEvents attribute names: lowercase ASCII letters and digits.
_ATTRIBUTE_NAME = re.compile(rb"[a-z0-9]{1,64}")
_MEDIA_TYPE = re.compile(r"[a-z0-9][a-z0-9!#$&^_.+-]*/[a-z0-9][a-z0-9!#$&^_.+-]*")


@dataclass(frozen=True)
class View:
    """The one reading of an accepted-so-far record."""

    structured: bool
    reserved: dict[bytes, bytes]  # the headers the gate reads, by exact name
    attributes: dict[str, str]  # the attributes of _READ that are present
    data: Any = None
    datacontenttype: str | None = None


@dataclass
class _Partial:
    """What could be read before a rejection, for operators (``Rejection.seen``); worked
    out only when there is a rejection (the accepted path pays nothing for it)."""

    headers: dict[bytes, bytes] = field(default_factory=dict)  # the exact ones read so far
    attributes: dict[str, Any] = field(default_factory=dict)  # a structured envelope's

    def reject(self, reason: str, detail: str) -> Rejection:
        names = {
            "source": "producer",
            "id": "event_id",
            "tenant": "tenant",
            "type": "type",
            "correlationid": "correlation_id",
        }
        seen: dict[str, str] = {}
        for attr, column in names.items():
            value = self.attributes.get(attr)
            if value is None and b"ce_" + attr.encode() in self.headers:
                value = _header_text(self.headers[b"ce_" + attr.encode()])
            if isinstance(value, str) and value and summary_storable(value):
                seen[column] = value[:512]
        return Rejection(reason, detail, seen)


def _header_text(raw: bytes) -> str | None:
    """A header's value as the text it is, or None: bytes that are not UTF-8 are not
    guessed at (a replacement character would read like one sent)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def folds(name: str) -> set[str]:
    """What lenient readers might take ``name`` for: case (lowered, and uppered then
    lowered, as Java's equalsIgnoreCase does: dotless and dotted I), width, spacing and
    combining marks folded, '-' taken for '_'."""
    compatible = unicodedata.normalize("NFKC", name)
    found = set()
    for text in (compatible.casefold(), compatible.upper().lower()):
        decomposed = unicodedata.normalize("NFKD", text)
        kept = "".join(ch for ch in decomposed if unicodedata.category(ch)[0] not in "CZM")
        found.add(kept.replace("-", "_"))
    return found


def _looks_reserved(name: str) -> bool:
    return any(f in _RESERVED_FOLDED or f.startswith("ce_") for f in folds(name))


def _looks_like_attribute(key: str) -> bool:
    """Whether a structured envelope's key is another spelling of an attribute the gate
    reads: the headers' rule (``folds``), so the two cannot drift apart."""
    return any(f in _ENVELOPE_READ for f in folds(key))


def _show(name: bytes) -> str:
    return repr(name.decode("utf-8", "backslashreplace"))[:80]


# What a header name is to the gate: read (exact), ignored, another spelling of one it
# reads, or not UTF-8. Names repeat from record to record, so the answer is remembered
# (up to a bound: the names are the sender's choice).
_EXACT, _IGNORED, _LOOKALIKE, _NOT_UTF8 = range(4)
_NAME_KINDS: dict[bytes, int] = {}

# The gate's memos (header names, content types, envelope keys) each hold at most this
# many answers, and remember none for a key longer than this: the keys are the sender's
# choice, so neither their number nor their size may grow memory without bound.
_MEMO_ENTRIES_MAX = 4096
_MEMO_KEY_MAX = 128


def _name_kind(name: bytes) -> int:
    kind = _NAME_KINDS.get(name)
    if kind is None:
        if name in _RESERVED or (
            name.startswith(CE_PREFIX) and _ATTRIBUTE_NAME.fullmatch(name, 3) is not None
        ):
            kind = _EXACT
        else:
            try:
                kind = _LOOKALIKE if _looks_reserved(name.decode("utf-8")) else _IGNORED
            except UnicodeDecodeError:
                kind = _NOT_UTF8
        if len(_NAME_KINDS) < _MEMO_ENTRIES_MAX and len(name) <= _MEMO_KEY_MAX:
            _NAME_KINDS[name] = kind
    return kind


def reserved_headers(
    headers: tuple[Header, ...], partial: _Partial
) -> dict[bytes, bytes] | Rejection:
    """The headers the gate reads, by exact name; a rejection when any is ambiguous."""
    found = partial.headers
    for name, value in headers:
        kind = _name_kind(name)
        if kind == _IGNORED:
            continue
        if kind == _NOT_UTF8:
            return partial.reject("malformed", f"the header name {_show(name)} is not UTF-8")
        if kind == _LOOKALIKE:
            return partial.reject(
                "ambiguous",
                f"the header {_show(name)} is another spelling of a header matcher "
                "reads; send it lowercase, exactly as named (e.g. ce_tenant)",
            )
        if name in found:
            return partial.reject("ambiguous", f"the header {_show(name)} appears twice")
        if not value:
            return partial.reject("malformed", f"the header {_show(name)} has no value")
        found[name] = value
    return found


# Content types repeat: remembered, within the memo bounds (a long value is parsed each
# time rather than pinned in memory).
_MEDIA_TYPES: dict[bytes, str | Rejection] = {}


def media_type(raw: bytes) -> str | Rejection:
    """The lowercased media type of a content-type value; its parameters checked."""
    found = _MEDIA_TYPES.get(raw)
    if found is None:
        found = _media_type(raw)
        if len(_MEDIA_TYPES) < _MEMO_ENTRIES_MAX and len(raw) <= _MEMO_KEY_MAX:
            _MEDIA_TYPES[raw] = found
    return found


def _media_type(raw: bytes) -> str | Rejection:
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        return Rejection("malformed", "content-type is not ASCII")
    kind, *params = (part.strip() for part in text.split(";"))
    kind = kind.lower()
    if not _MEDIA_TYPE.fullmatch(kind):
        return Rejection("malformed", f"content-type {text[:100]!r} is not a media type")
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() != "utf-8":
            return Rejection("malformed", f"JSON is UTF-8; content-type says {text[:100]!r}")
    return kind


def is_json_media_type(kind: str) -> bool:
    if kind.startswith("application/cloudevents"):
        return False  # a CloudEvents format, not data
    return kind in ("application/json", "text/json") or (
        kind.startswith("application/") and kind.endswith("+json")
    )


@dataclass(frozen=True)
class Claim:
    """What a record says about itself before anything is verified: its mode, the headers
    the gate reads, and who it claims to be from. Cheap to read (no JSON is walked in
    binary mode, and only the C parser runs in structured mode), so that the signature is
    checked before a sender without a key can cost any real work."""

    structured: bool
    reserved: dict[bytes, bytes]
    media_type: str | None
    source: str
    id: str  # empty for a plain webhook: its id comes from the mapping, once verified
    partial: _Partial = field(compare=False)
    webhook: bool = False  # a forwarded plain webhook (matcher_webhook names the producer)


def claim(record: RawRecord) -> Claim | Rejection:
    """The record's claim (see ``Claim``), or why it makes none that can be checked."""
    partial = _Partial()
    reserved = reserved_headers(record.headers, partial)
    if isinstance(reserved, Rejection):
        return reserved
    content_type = reserved.get(CONTENT_TYPE)
    kind = None if content_type is None else media_type(content_type)
    if isinstance(kind, Rejection):
        return partial.reject(kind.reason, kind.detail)
    if WEBHOOK_HEADER in reserved:
        return _webhook_claim(reserved, kind, partial)
    structured = kind == STRUCTURED_MEDIA_TYPE
    if not structured and kind is not None and kind.startswith("application/cloudevents"):
        return partial.reject(
            "malformed", f"{kind} is not supported: send one event per record, as JSON"
        )
    if not structured and not any(name.startswith(CE_PREFIX) for name in reserved):
        # Before the producer is looked up: a record that is no CloudEvent names none, and
        # saying so reveals nothing about the registry.
        hint = f" (content-type is {kind!r})" if kind else ""
        if kind is not None and is_json_media_type(kind):
            # A structured event under another content type (the CloudEvents SDKs' classic
            # Kafka bindings send application/json): what it claims, for operators to find
            # it by, never trusted.
            _guess_envelope(record.value or b"", partial)
        return partial.reject(
            "malformed",
            "not a CloudEvent: a binary-mode event carries its attributes in ce_ headers, and "
            f"a structured-mode one needs content-type {STRUCTURED_MEDIA_TYPE}{hint}",
        )
    ids = _structured_ids(record, reserved, partial) if structured else _binary_ids(reserved)
    if isinstance(ids, Rejection):
        return partial.reject(ids.reason, ids.detail)
    return Claim(structured, reserved, kind, ids[0], ids[1], partial)


# Deep enough for any envelope's attributes; the refusal is decided already.
_GUESS_MAX_DEPTH = 64
_GUESS_MAX_BYTES = 64 * 1024


def _guess_envelope(value: bytes, partial: _Partial) -> None:
    """A refused record's top-level string attributes, if its value is a JSON object of at
    most ``_GUESS_MAX_BYTES``: the parse of an unsigned value is bounded, as a refusal's
    cost must be."""
    if len(value) > _GUESS_MAX_BYTES:
        return
    try:
        document = loads(value, max_depth=_GUESS_MAX_DEPTH)
    except JsonRefused:
        return
    if isinstance(document, dict):
        for attr in ("source", "id", "type", "tenant", "correlationid"):
            if isinstance(document.get(attr), str):
                partial.attributes[attr] = document[attr]


def _webhook_claim(
    reserved: dict[bytes, bytes], kind: str | None, partial: _Partial
) -> Claim | Rejection:
    mixed = sorted(name.decode() for name in reserved if name.startswith(CE_PREFIX))
    if mixed:
        return partial.reject(
            "ambiguous",
            f"a forwarded webhook is not a CloudEvent; {', '.join(mixed[:5])} beside "
            "matcher_webhook would be a second reading",
        )
    if kind is None or not is_json_media_type(kind):
        return partial.reject("malformed", f"a webhook's body must be JSON, not {kind!r}")
    try:
        producer = reserved[WEBHOOK_HEADER].decode("utf-8")
    except UnicodeDecodeError:
        return partial.reject("malformed", "matcher_webhook must be UTF-8")
    partial.attributes["source"] = producer
    return Claim(False, reserved, kind, producer, "", partial, webhook=True)


def _binary_ids(reserved: dict[bytes, bytes]) -> tuple[str, str] | Rejection:
    try:
        source = reserved.get(b"ce_source", b"").decode("utf-8")
        event_id = reserved.get(b"ce_id", b"").decode("utf-8")
    except UnicodeDecodeError:
        return Rejection("malformed", "ce_source and ce_id must be UTF-8")
    return source, event_id


def _structured_ids(
    record: RawRecord, reserved: dict[bytes, bytes], partial: _Partial
) -> tuple[str, str] | Rejection:
    mixed = sorted(name.decode() for name in reserved if name.startswith(CE_PREFIX))
    if mixed:
        return Rejection(
            "ambiguous",
            f"structured mode carries every attribute in the value; {', '.join(mixed[:5])} "
            "beside it would be a second reading",
        )
    # The C parser only, to find the claimed source and id; the strict reading comes after
    # the signature, and must agree with this one.
    try:
        envelope = json.loads(record.value or b"")
    except (RecursionError, ValueError):
        _read_leniently(record.value or b"", partial)
        try:  # the strict reader says what is wrong
            loads(record.value or b"")
        except JsonRefused as exc:
            return Rejection(exc.reason, f"value: {exc}")
        return Rejection("malformed", "the value is not JSON")
    if not isinstance(envelope, dict):
        return Rejection("malformed", "a structured-mode event must be a JSON object")
    partial.attributes.update(envelope)
    lookalike = _lookalike_key(envelope)
    if lookalike is not None:
        return lookalike
    source, event_id = envelope.get("source", ""), envelope.get("id", "")
    if not (isinstance(source, str) and isinstance(event_id, str)):
        return Rejection("malformed", "the attributes source and id must be strings")
    problem = unstorable([source, event_id])  # a lone surrogate cannot even be encoded
    if problem is not None:
        return Rejection("malformed", f"the attributes source and id must not contain {problem}")
    return source, event_id


def _unread(_text: str) -> None:
    return None


def _read_leniently(value: bytes, partial: _Partial) -> None:
    """What an envelope that cannot be read at all says of itself, numbers left unread (an
    integer past Python's digit limit fails the plain reading): for the rejection's
    ``seen`` only, so that its quarantine row names the correlation id it claimed."""
    try:
        envelope = json.loads(value, parse_int=_unread, parse_float=_unread, parse_constant=_unread)
    except (RecursionError, ValueError):
        return
    if isinstance(envelope, dict):
        partial.attributes.update(envelope)


# Envelope keys repeat from record to record: whether one is a look-alike is remembered,
# as for header names (bounded: the keys are the sender's choice).
_KEY_LOOKALIKE: dict[str, bool] = {}


def _lookalike_key(envelope: dict[str, Any]) -> Rejection | None:
    """A rejection when a key of ``envelope`` is another spelling of one the gate reads
    ("Tenant", "correlationId", "ID"...): a reader that folds case, as Go's encoding/json
    does, would take it for that attribute, and with the exact key beside it read the
    other value. Alone it is refused too: that reader would see an attribute we do not."""
    for key in envelope:
        if key in _ENVELOPE_READ:
            continue
        found = _KEY_LOOKALIKE.get(key)
        if found is None:
            found = _looks_like_attribute(key)
            if len(_KEY_LOOKALIKE) < _MEMO_ENTRIES_MAX and len(key) <= _MEMO_KEY_MAX:
                _KEY_LOOKALIKE[key] = found
        if found:
            return Rejection(
                "ambiguous",
                f"the key {key[:80]!r} is another spelling of an attribute matcher reads; "
                "send each attribute once, lowercase, exactly as named (e.g. tenant)",
            )
    return None


def read_view(
    record: RawRecord, max_json_depth: int, claimed: Claim | None = None
) -> View | Rejection:
    """The canonical reading of ``record`` (strict, whole), or why it has none."""
    found = claim(record) if claimed is None else claimed
    if isinstance(found, Rejection):
        return found
    if found.structured:
        return _structured(record, found.reserved, found.partial, max_json_depth)
    return _binary(record, found.reserved, found.media_type, found.partial, max_json_depth)


def _binary(
    record: RawRecord,
    reserved: dict[bytes, bytes],
    kind: str | None,
    partial: _Partial,
    max_json_depth: int,
) -> View | Rejection:
    if b"ce_datacontenttype" in reserved:
        return partial.reject(
            "ambiguous",
            "binary mode carries the data's type in content-type, not ce_datacontenttype",
        )
    if kind is not None and not is_json_media_type(kind):
        return partial.reject("malformed", f"data must be JSON, not {kind!r}")
    attributes: dict[str, str] = {}
    for name, header in _READ_HEADERS:
        raw = reserved.get(header)
        if raw is None:
            continue
        try:
            attributes[name] = raw.decode("utf-8")
        except UnicodeDecodeError:
            return partial.reject("malformed", f"the header ce_{name} is not UTF-8")
    problem = _missing(attributes)
    if problem is not None:
        return partial.reject("malformed", problem)
    try:
        data = loads(record.value, max_depth=max_json_depth) if record.value else None
    except JsonRefused as exc:
        return partial.reject(exc.reason, f"data: {exc}")
    return View(False, reserved, attributes, data, kind)


def _structured(
    record: RawRecord, reserved: dict[bytes, bytes], partial: _Partial, max_json_depth: int
) -> View | Rejection:
    try:
        envelope = loads(record.value or b"", max_depth=max_json_depth + 1)
    except JsonRefused as exc:
        return partial.reject(exc.reason, f"value: {exc}")
    if not isinstance(envelope, dict):
        return partial.reject("malformed", "a structured-mode event must be a JSON object")
    partial.attributes.update(envelope)
    if "data_base64" in envelope:
        return partial.reject("malformed", "data must be JSON, not data_base64")
    attributes: dict[str, str] = {}
    for name in _READ:
        if name not in envelope:
            continue
        value = envelope[name]
        if not isinstance(value, str):
            return partial.reject("malformed", f"the attribute {name} must be a string")
        attributes[name] = value
    problem = _missing(attributes)
    if problem is not None:
        return partial.reject("malformed", problem)
    declared = envelope.get("datacontenttype")
    if declared is not None:
        kind = (
            media_type(declared.encode("utf-8", "replace")) if isinstance(declared, str) else None
        )
        if not isinstance(kind, str) or not is_json_media_type(kind):
            return partial.reject("malformed", f"data must be JSON, not {str(declared)[:100]!r}")
    return View(True, reserved, attributes, envelope.get("data"), declared)


def _missing(attributes: dict[str, str]) -> str | None:
    absent = [name for name in REQUIRED if not attributes.get(name)]
    if absent:
        return f"required attribute(s) missing or empty: {', '.join(absent)}"
    if attributes["specversion"] != "1.0":
        return f"specversion must be 1.0, not {attributes['specversion'][:20]!r}"
    return None
