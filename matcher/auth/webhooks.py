"""Plain JSON webhooks: the senders that do not speak CloudEvents.

A producer with a ``webhook`` table in the producers file sends ordinary webhooks (an
OpenAI-style batch callback, GitHub, Stripe, anything built on Svix). The HTTP ingress
forwards such a request to the events topic unchanged: the body bytes as the value, the
scheme's signature headers, and ``matcher_webhook: <producer>`` naming the producer. The
gate then verifies the record with the scheme's own rules and maps the signed body to a
completion event with the producer's mapping. Nothing unsigned carries meaning: a mapping
may read the body, and only those headers the scheme's signature covers.

Schemes (the signed bytes, and how freshness is bounded):

- ``standard-webhooks``: ``webhook-id``, ``webhook-timestamp``, ``webhook-signature``
  (``v1,`` HMAC-SHA256, ``v1a,`` Ed25519); signed ``{id}.{timestamp}.{body}``; the
  timestamp within the tolerance of the arrival.
- ``github``: ``x-hub-signature-256: sha256=<hex HMAC-SHA256 of the body>``. GitHub signs
  no timestamp and no header (``X-GitHub-Delivery`` and ``X-GitHub-Event`` are unsigned),
  so the event id must come from the body, and a replay is a duplicate of the first
  delivery for as long as the inbox remembers it.
- ``stripe``: ``stripe-signature: t=<unix seconds>,v1=<hex HMAC-SHA256>``; signed
  ``{t}.{body}``; ``t`` within the tolerance of the arrival.

Mapping templates: literal text with ``{/json/pointer}`` (RFC 6901, into the body) and
``{header:<name>}`` placeholders; ``{{`` and ``}}`` are literal braces. A placeholder must
find a string or an integer; anything else makes the record ``unmappable``. ``time`` is an
RFC 3339 date-time, or Unix seconds (an integer, or a string of 1-12 digits: Stripe's
``created``, OpenAI's ``created_at``); the two cannot be confused, an RFC 3339 time always
has a ``-``.

Drop rules: a signed delivery that a producer's rule recognises (``field`` is a body
pointer or a signed header; ``in``, ``not_in`` or ``present`` says which values) is
acknowledged and not forwarded: GitHub's ``workflow_run`` also delivers ``requested`` and
``in_progress``, which no wait needs, and a hook's ``ping`` (built in for github). A rule
drops only what it positively recognises: a field that is absent matches ``present =
false`` and nothing else, so a body a rule cannot read goes on to the mapping.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from matcher.auth.signatures import hmac_sha256
from matcher.auth.times import parse_time

Scheme = Literal["standard-webhooks", "github", "stripe"]
SCHEMES: tuple[Scheme, ...] = ("standard-webhooks", "github", "stripe")

WEBHOOK_HEADER = b"matcher_webhook"
GITHUB_SIGNATURE = b"x-hub-signature-256"
STRIPE_SIGNATURE = b"stripe-signature"
STANDARD_HEADERS = (b"webhook-id", b"webhook-timestamp", b"webhook-signature")

# The headers each scheme needs, and those its signature covers (the only ones a mapping
# may read).
REQUIRED_HEADERS: dict[Scheme, tuple[bytes, ...]] = {
    "standard-webhooks": STANDARD_HEADERS,
    "github": (GITHUB_SIGNATURE,),
    "stripe": (STRIPE_SIGNATURE,),
}
SIGNED_HEADERS: dict[Scheme, frozenset[str]] = {
    "standard-webhooks": frozenset({"webhook-id", "webhook-timestamp"}),
    "github": frozenset(),
    "stripe": frozenset(),
}
# The event id when the mapping gives none: what the sender itself calls the message id.
DEFAULT_ID: dict[Scheme, str | None] = {
    "standard-webhooks": "{header:webhook-id}",
    "github": None,
    "stripe": "{/id}",
}
MAPPED = ("id", "type", "tenant", "correlationid", "jobid", "time")

_UNIX_SECONDS = re.compile(rb"[0-9]{1,12}")
_UNIX_SECONDS_TEXT = re.compile(r"[1-9][0-9]{9,11}")
_LAST_SECOND = 253402300799  # 9999-12-31T23:59:59Z
_RFC3339_ALPHABET = frozenset("0123456789-:.+TtZz")
_HEX_SHA256 = re.compile(rb"[0-9a-fA-F]{64}")


class TemplateError(ValueError):
    pass


class Unmappable(ValueError):
    pass


@dataclass(frozen=True)
class Pointer:
    tokens: tuple[str, ...]
    text: str


@dataclass(frozen=True)
class HeaderRef:
    name: str


Part = str | Pointer | HeaderRef


@dataclass(frozen=True)
class Template:
    parts: tuple[Part, ...]
    text: str

    def render(self, body: Any, headers: Mapping[bytes, bytes]) -> str:
        out: list[str] = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, Pointer):
                out.append(_scalar(_resolve(body, part), part.text))
            else:
                raw = headers.get(part.name.encode())
                if raw is None:
                    raise Unmappable(f"the header {part.name} is missing")
                out.append(raw.decode("utf-8", "strict"))
        return "".join(out)


def parse_template(text: str) -> Template:
    """``text`` as a template (see the module docstring); TemplateError says what is wrong."""
    parts: list[Part] = []
    literal: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in "{}" and text.startswith(ch * 2, i):
            literal.append(ch)
            i += 2
            continue
        if ch == "}":
            raise TemplateError(f"a lone '}}' at {i}: write '}}}}' for a literal brace")
        if ch != "{":
            literal.append(ch)
            i += 1
            continue
        end = text.find("}", i)
        if end < 0:
            raise TemplateError(f"the placeholder at {i} is not closed")
        if literal:
            parts.append("".join(literal))
            literal = []
        parts.append(_placeholder(text[i + 1 : end]))
        i = end + 1
    if literal:
        parts.append("".join(literal))
    return Template(tuple(parts), text)


def _placeholder(inner: str) -> Pointer | HeaderRef:
    if inner.startswith("/"):
        tokens = tuple(t.replace("~1", "/").replace("~0", "~") for t in inner[1:].split("/"))
        if re.search(r"~(?![01])", inner):
            raise TemplateError(f"{{{inner}}}: '~' in a JSON pointer is written ~0 (and '/' ~1)")
        return Pointer(tokens, inner)
    if inner.startswith("header:"):
        name = inner.removeprefix("header:")
        if not re.fullmatch(r"[a-z0-9-]{1,64}", name):
            raise TemplateError(f"{{{inner}}}: header names are lowercase, e.g. webhook-id")
        return HeaderRef(name)
    raise TemplateError(
        f"{{{inner}}}: a placeholder is a JSON pointer ({{/data/id}}) or {{header:<name>}}"
    )


def _resolve(document: Any, pointer: Pointer) -> Any:
    node = document
    for token in pointer.tokens:
        if isinstance(node, dict):
            if token not in node:
                raise Unmappable(f"the body has nothing at {pointer.text}")
            node = node[token]
        elif isinstance(node, list) and re.fullmatch(r"0|[1-9][0-9]{0,8}", token):
            index = int(token)
            if index >= len(node):
                raise Unmappable(f"the body has nothing at {pointer.text}")
            node = node[index]
        else:
            raise Unmappable(f"the body has nothing at {pointer.text}")
    return node


def _scalar(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return _refuse(where, value)


def _refuse(where: str, value: Any) -> str:
    kind = "null" if value is None else type(value).__name__.replace("dict", "object")
    raise Unmappable(f"the body at {where} is {kind.replace('list', 'array')}, not a string")


def unix_seconds_time(value: str) -> str | None:
    """``value`` as an RFC 3339 time when it is Unix seconds, else None.

    Unix seconds are 10 to 12 digits without a leading zero: from 2001-09-09 to the year
    9999. Fewer digits are refused rather than read as a time in the 1970s: a year
    ("2024") or a compact date ("20251207") is far likelier than a job that ended then."""
    if not _UNIX_SECONDS_TEXT.fullmatch(value):
        return None
    seconds = int(value)
    if seconds > _LAST_SECOND:
        raise Unmappable(f"time: {value} Unix seconds is past the year 9999")
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def mapped_time(value: str) -> str:
    """A mapped ``time``: RFC 3339 as it is, Unix seconds written as RFC 3339; anything
    else is Unmappable, saying which forms are read."""
    converted = unix_seconds_time(value)
    if converted is not None:
        return converted
    if parse_time(value) is None:
        shown = "digits" if value.isdigit() else "a string"
        raise Unmappable(
            f"time: the value ({shown} of {len(value)} characters) is neither an RFC 3339 "
            "date-time with an offset nor Unix seconds (10 to 12 digits, from 2001)"
        )
    return value


def check_time_template(template: Template) -> None:
    """Refuse at load a ``time`` template that can never give a valid time: literal text
    outside RFC 3339's alphabet, or a literal that is no time at all."""
    literal = "".join(p for p in template.parts if isinstance(p, str))
    if len(template.parts) == 1 and isinstance(template.parts[0], str):
        try:
            mapped_time(literal)
        except Unmappable as exc:
            raise TemplateError(str(exc).removeprefix("time: ")) from None
        return
    stray = sorted(set(literal) - _RFC3339_ALPHABET)
    if stray:
        raise TemplateError(
            f"{''.join(stray)!r} cannot appear in an RFC 3339 time; the template can never "
            'make one (Unix seconds: the placeholder alone, e.g. "{/created}")'
        )


@dataclass(frozen=True)
class WebhookMapping:
    """How a producer's body becomes an event's attributes (compiled templates)."""

    fields: dict[str, Template]

    def apply(self, body: Any, headers: Mapping[bytes, bytes]) -> dict[str, str]:
        """The attributes, each non-empty; Unmappable says which one could not be made."""
        attributes: dict[str, str] = {}
        for name, template in self.fields.items():
            try:
                value = template.render(body, headers)
            except Unmappable as exc:
                raise Unmappable(f"{name}: {exc}") from None
            except UnicodeDecodeError:
                raise Unmappable(f"{name}: a header it reads is not UTF-8") from None
            if not value:
                raise Unmappable(f"{name} is empty")
            if name == "time":
                value = mapped_time(value)
            attributes[name] = value
        return attributes


@dataclass(frozen=True)
class DropRule:
    """Acknowledge and drop a signed delivery whose ``field`` (a body pointer or a signed
    header) has a value in ``values`` (``negate``: a value not in them); ``values`` None:
    whether the field is present at all is what counts (``negate``: absent)."""

    name: str
    field: Pointer | HeaderRef
    values: frozenset[str] | None
    negate: bool

    def matches(self, body: Any, headers: Mapping[bytes, bytes]) -> bool:
        present, text = _field_value(self.field, body, headers)
        if self.values is None:
            return present != self.negate
        if text is None:
            return False  # absent, or not a string or an integer: not recognised
        return (text in self.values) != self.negate


# GitHub's ping, sent when a hook is created (and by "Redeliver" on it): its body alone has
# zen and hook_id at the top.
GITHUB_PING = DropRule("ping", Pointer(("zen",), "/zen"), None, False)
BUILT_IN_DROPS: dict[Scheme, tuple[DropRule, ...]] = {
    "standard-webhooks": (),
    "github": (GITHUB_PING,),
    "stripe": (),
}


def _field_value(
    field: Pointer | HeaderRef, body: Any, headers: Mapping[bytes, bytes]
) -> tuple[bool, str | None]:
    """Whether the field is present, and its value as text when it is a string or an
    integer (written out)."""
    if isinstance(field, HeaderRef):
        raw = headers.get(field.name.encode())
        return raw is not None, None if raw is None else raw.decode("utf-8", "replace")
    try:
        value = _resolve(body, field)
    except Unmappable:
        return False, None
    if isinstance(value, int) and not isinstance(value, bool):
        return True, str(value)
    return True, value if isinstance(value, str) else None


def compile_drop_rule(
    scheme: Scheme,
    name: str,
    field: str,
    values: list[str] | None,
    negate: bool,
) -> DropRule:
    """One rule; ValueError says what is wrong with it."""
    try:
        parsed = _placeholder(field)
    except TemplateError as exc:
        raise ValueError(f"drop {name!r}: field {exc}") from None
    if isinstance(parsed, HeaderRef) and parsed.name not in SIGNED_HEADERS[scheme]:
        raise ValueError(
            f"drop {name!r}: {scheme} does not sign the header {parsed.name}; a rule may "
            "read the body and signed headers only"
        )
    return DropRule(name, parsed, None if values is None else frozenset(values), negate)


def dropped_by(
    rules: tuple[DropRule, ...], body: Any, headers: Mapping[bytes, bytes]
) -> str | None:
    """The name of the first rule that drops this (verified) delivery, or None."""
    return next((rule.name for rule in rules if rule.matches(body, headers)), None)


def compile_mapping(scheme: Scheme, given: Mapping[str, str | None]) -> WebhookMapping:
    """The mapping of a producer of ``scheme``; ValueError lists what is wrong with it."""
    templates = dict(given)
    if templates.get("id") is None:
        default = DEFAULT_ID[scheme]
        if default is None:
            raise ValueError(
                f"mapping.id is required for {scheme}: its delivery header is unsigned, so "
                'the id must come from the body (e.g. "{/workflow_run/id}-'
                '{/workflow_run/run_attempt}")'
            )
        templates["id"] = default
    compiled: dict[str, Template] = {}
    for name in MAPPED:
        text = templates.get(name)
        if text is None:
            continue
        try:
            template = parse_template(text)
        except TemplateError as exc:
            raise ValueError(f"mapping.{name}: {exc}") from None
        for part in template.parts:
            if isinstance(part, HeaderRef) and part.name not in SIGNED_HEADERS[scheme]:
                raise ValueError(
                    f"mapping.{name}: {scheme} does not sign the header {part.name}, so it "
                    "cannot carry meaning; take the value from the body"
                )
        if name == "time":
            try:
                check_time_template(template)
            except TemplateError as exc:
                raise ValueError(f"mapping.time: {exc}") from None
        compiled[name] = template
    return WebhookMapping(compiled)


def github_signature_ok(header: bytes, body: bytes, secrets: tuple[bytes, ...]) -> bool:
    """``sha256=<hex>`` over ``body`` with one of ``secrets`` (constant-time)."""
    prefix, _, digest = header.partition(b"=")
    if prefix != b"sha256" or not _HEX_SHA256.fullmatch(digest):
        return False
    offered = bytes.fromhex(digest.decode("ascii"))
    return any(hmac.compare_digest(hmac_sha256(secret, body), offered) for secret in secrets)


class BadStripeHeader(ValueError):
    pass


def stripe_parts(header: bytes, limit: int) -> tuple[bytes, list[bytes]]:
    """The timestamp and the v1 signatures of a ``stripe-signature`` header.

    One ``t`` exactly (a second one would be a second reading); v1 entries up to ``limit``;
    other schemes (v0) ignored, as Stripe's own libraries do.
    """
    timestamp: bytes | None = None
    v1: list[bytes] = []
    for item in header.split(b","):
        name, sep, value = item.partition(b"=")
        if not sep:
            raise BadStripeHeader("stripe-signature entries are name=value")
        if name == b"t":
            if timestamp is not None:
                raise BadStripeHeader("stripe-signature names t twice")
            if not _UNIX_SECONDS.fullmatch(value):
                raise BadStripeHeader("stripe-signature t must be Unix seconds (1-12 digits)")
            timestamp = value
        elif name == b"v1":
            if len(v1) == limit:
                raise BadStripeHeader(f"more than {limit} v1 signatures")
            v1.append(value)
    if timestamp is None:
        raise BadStripeHeader("stripe-signature has no t")
    return timestamp, v1


def stripe_signature_ok(
    timestamp: bytes, offered: list[bytes], body: bytes, secrets: tuple[bytes, ...]
) -> bool:
    message = timestamp + b"." + body
    wanted = [bytes.fromhex(v.decode("ascii")) for v in offered if _HEX_SHA256.fullmatch(v)]
    for secret in secrets:
        expected = hmac_sha256(secret, message)
        if any(hmac.compare_digest(expected, w) for w in wanted):
            return True
    return False
