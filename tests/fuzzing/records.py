"""One structure-aware generator of Kafka records (key, headers, value) for the gate.

Random bytes alone almost never get past the gate's first checks, so most inputs start as
a *valid* record, signed by the producer SDK exactly as a producer would sign it (binary
and structured mode, HMAC ``v1`` and Ed25519 ``v1a`` keys, with and without ce_jobid and
ce_time), and are then mutated a field at a time: header names respelled (case, Unicode
look-alikes, invisible characters, spaces, ``-``/``_``), headers duplicated, removed or
added, values replaced by hostile bytes, webhook timestamps and signatures bent, the
value's JSON made deep, duplicated, non-finite or mis-encoded. A plain random-bytes mode
covers what no structure anticipates.

Every decision is drawn from a ``Chooser`` (``tests.fuzzing.choosers``), so the same
generator runs under hypothesis, ``random`` and atheris. Every loop is bounded by drawn
integers, so a chooser whose input has run out (atheris) still ends.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from matcher_producer import CompletionEvent as ProducerEvent
from matcher_producer import KafkaRecord, SigningKey, binary_content, encode, sign_record

from tests.fuzzing.choosers import Chooser
from tests.fuzzing.numbers import number_text

Header = tuple[bytes, bytes | None]
T = TypeVar("T")

# Every record is signed near this instant and judged as if it arrived at it, so runs are
# reproducible and a freshness failure is always one the generator chose.
ARRIVAL = 1767225600  # 2026-01-01T00:00:00Z
SKEW = 250  # within the gate's default tolerance (300 s) either way


@dataclass(frozen=True)
class Record:
    key: bytes | None
    headers: tuple[Header, ...]
    value: bytes | None


# --- producers and their keys ---------------------------------------------------------


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


@dataclass(frozen=True)
class FuzzKey:
    signing: SigningKey
    registry_field: str  # hmac_secret or ed25519_public_key
    registry_value: str


def _hmac_key(key_id: str, secret: bytes) -> FuzzKey:
    text = "whsec_" + _b64(secret)
    return FuzzKey(SigningKey.parse(key_id, text), "hmac_secret", text)


def _ed25519_key(key_id: str, seed: bytes) -> FuzzKey:
    public = Ed25519PrivateKey.from_private_bytes(seed).public_key()
    raw = public.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return FuzzKey(
        SigningKey.parse(key_id, "whsk_" + _b64(seed)), "ed25519_public_key", "whpk_" + _b64(raw)
    )


@dataclass(frozen=True)
class FuzzProducer:
    source: str
    tenants: tuple[str, ...]  # "*": any
    types: tuple[str, ...]
    keys: tuple[FuzzKey, ...]


PRODUCERS = (
    # Narrow permissions: a mutated tenant or type may also be refused by authorisation.
    FuzzProducer(
        "hmac-svc",
        ("acme", "globex"),
        ("job.completed", "job.failed"),
        (_hmac_key("h1", b"fuzz-hmac-secret-32-bytes-long!!"),),
    ),
    # Any tenant, any type: only the signature stands between a mutation and acceptance.
    FuzzProducer("ed-svc", ("*",), ("*",), (_ed25519_key("e1", bytes(range(32))),)),
    # Mid-rotation: two keys of both schemes, records signed by either or both.
    FuzzProducer(
        "rotating-svc",
        ("acme",),
        ("*",),
        (
            _hmac_key("old", b"fuzz-rotation-secret-32-bytes!!!"),
            _ed25519_key("new", bytes(range(32, 64))),
        ),
    ),
)

# The payload schema of one type, so schema validation sees hostile data too.
SCHEMAS: dict[str, dict[str, Any]] = {
    "job.failed": {
        "type": "object",
        "required": ["error"],
        "properties": {"error": {"type": "string", "minLength": 1}},
    }
}


def registry_toml() -> str:
    """The producers file that registers ``PRODUCERS`` (schemas are added separately)."""
    lines: list[str] = []
    for p in PRODUCERS:
        lines += [
            f'[producers."{p.source}"]',
            f"tenants = {json.dumps(list(p.tenants))}",
            f"types = {json.dumps(list(p.types))}",
        ]
        for key in p.keys:
            lines += [
                f'[[producers."{p.source}".keys]]',
                f'id = "{key.signing.id}"',
                f'{key.registry_field} = "{key.registry_value}"',
            ]
    return "\n".join(lines) + "\n"


# --- text and JSON --------------------------------------------------------------------

# Pieces of identifiers: ASCII, punctuation, non-ASCII, look-alikes, invisible characters.
# Never NUL nor a surrogate: a valid record must be storable.
_IDENT_PIECES = (
    "a", "Z", "0", "9", "-", "_", ".", "/", ":", " ", "job", "acme", "é", "ß", "漢字",
    "😀", "\u212a", "\u0131", "\u200b", "\u0301", "\t", "\x7f", '"', "\\", "%",
)  # fmt: skip
_TEXT_PIECES = (*_IDENT_PIECES, "", "\n", "\x01", "\u2028", "\ufeff", "\U0010ffff")
TENANTS = ("acme", "globex", "initech", "ünïcødé", "a" * 512)
TYPES = ("job.completed", "job.failed", "job.cancelled", "x")


def either(c: Chooser, fixed: Sequence[T], drawn: Sequence[Callable[[], T]]) -> T:
    """One of ``fixed``, or one of ``drawn`` made: what a maker draws is drawn only when it
    is chosen, so each choice costs (and shrinks) only its own decisions."""
    i = c.integer(0, len(fixed) + len(drawn) - 1)
    return fixed[i] if i < len(fixed) else drawn[i - len(fixed)]()


def _pieces(c: Chooser, pieces: Sequence[str], most: int) -> str:
    return "".join(c.choice(pieces) for _ in range(c.integer(1, most)))


def ident(c: Chooser) -> str:
    """A valid identifier: 1-512 bytes of UTF-8, not only whitespace, storable."""
    if c.integer(0, 7) == 7:
        return c.choice(("x" * 512, "é" * 256, "id-" + "9" * 400))  # 512 bytes at most
    text = _pieces(c, _IDENT_PIECES, 12)
    return text if text.strip() else "x" + text


def _text(c: Chooser) -> str:
    return _pieces(c, _TEXT_PIECES, 8)


_NUMBERS: tuple[int | float, ...] = (
    0, -1, 1, 2**53 + 1, 2**63, -(2**63) - 1, 10**300, 0.5, -0.0, 1e308, 5e-324, 3.14159,
)  # fmt: skip


def _scalar(c: Chooser) -> Any:
    kind = c.integer(0, 4)
    if kind == 0:
        return c.choice((None, True, False))
    if kind == 1:
        return c.integer(-1000, 1000)
    if kind == 2:
        return c.choice(_NUMBERS)
    return _text(c)


def json_value(c: Chooser, depth: int = 0) -> Any:
    """A JSON value that matcher can store: finite numbers, storable text, shallow."""
    kind = c.integer(0, 3) if depth < 3 else 0
    if kind <= 1:
        return _scalar(c)
    if kind == 2:
        return [json_value(c, depth + 1) for _ in range(c.integer(0, 3))]
    return {_text(c): json_value(c, depth + 1) for _ in range(c.integer(0, 3))}


def _data(c: Chooser, event_type: str) -> Any:
    if event_type == "job.failed":  # what SCHEMAS requires of it
        return {"error": ident(c), "detail": json_value(c, 1)}
    data = json_value(c)
    # Nesting up to the gate's bound (64, counting the outermost list): the deepest data
    # that must still be accepted.
    for _ in range(c.choice((0, 0, 1, 10, 60))):
        data = [data]
    return data


# The edges of datetime's range, with offsets that keep the instant inside it (those that
# move it outside are hostile attributes: see ``_HOSTILE_ATTRIBUTES``).
_EDGE_TIMES = (
    "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59.999999999Z",
    "0001-01-01T00:00:00-01:00",
    "9999-12-31T23:59:59+01:00",
)


_OFFSETS = {"Z": 0, "z": 0, "+00:00": 0, "-00:00": 0, "+01:00": 60, "-23:59": -1439,
            "+14:00": 840, "+00:01": 1}  # fmt: skip


def _time_text(c: Chooser) -> str:
    """A ce_time in the many spellings RFC 3339 allows, always an instant that datetime
    can hold in UTC (year 1 to 9999 there): valid records must be storable."""
    if c.integer(0, 9) == 9:
        return c.choice(_EDGE_TIMES)
    offset = c.choice(tuple(_OFFSETS))
    local = datetime(
        either(c, (2026, 2025, 1970, 1, 9999), [lambda: c.integer(1, 9999)]),
        c.integer(1, 12),
        c.integer(1, 28),
        c.integer(0, 23),
        c.integer(0, 59),
        c.integer(0, 59),
        tzinfo=timezone(timedelta(minutes=_OFFSETS[offset])),
    )
    try:
        local.astimezone(UTC)
    except OverflowError:  # an offset pushed the instant out of range
        local = local.replace(year=2026)
    fraction = c.choice(("", ".5", ".123456", ".123456789"))
    day = f"{local.year:04d}-{local.month:02d}-{local.day:02d}"  # strftime drops the 0s
    return day + c.choice("Tt") + f"{local:%H:%M:%S}{fraction}{offset}"


# --- valid signed records -------------------------------------------------------------


def _producer_event(c: Chooser, producer: FuzzProducer) -> ProducerEvent:
    tenant = c.choice(producer.tenants) if "*" not in producer.tenants else c.choice(TENANTS)
    event_type = c.choice(producer.types) if "*" not in producer.types else c.choice(TYPES)
    return ProducerEvent(
        source=producer.source,
        type=event_type,
        tenant=tenant,
        correlation_id=ident(c),
        data=_data(c, event_type),
        job_id=ident(c) if c.boolean() else None,
        id=ident(c),
        time=datetime.fromtimestamp(ARRIVAL, UTC),
    )


def _dump(c: Chooser, value: Any) -> bytes:
    separators = c.choice(((",", ":"), (", ", ": ")))
    indent = c.choice((None, None, 2))
    return json.dumps(
        value, separators=separators, ensure_ascii=c.boolean(), indent=indent
    ).encode()


_BINARY_CONTENT_TYPES = (
    b"application/json",
    None,
    b"application/json; charset=utf-8",
    b"text/json",
    b"application/vnd.acme.result+json",
    b"Application/JSON",
    b'application/json;charset="UTF-8"',
)
_STRUCTURED_CONTENT_TYPES = (
    b"application/cloudevents+json",
    b"application/cloudevents+json; charset=utf-8",
    b"Application/CloudEvents+JSON",
    b"application/cloudevents+json ;charset=UTF-8",
)


def _set_header(headers: list[tuple[str, bytes]], name: str, value: bytes | None) -> None:
    headers[:] = [h for h in headers if h[0] != name]
    if value is not None:
        headers.append((name, value))


def _binary(c: Chooser, record: KafkaRecord, event: ProducerEvent) -> KafkaRecord:
    headers = list(record.headers)
    _set_header(headers, "ce_time", _time_text(c).encode() if c.integer(0, 3) else None)
    _set_header(headers, "content-type", c.choice(_BINARY_CONTENT_TYPES))
    if c.integer(0, 3) == 0:  # an extension attribute: read past, never signed
        headers.append(("ce_subject", ident(c).encode()))
    value = b"" if event.data is None and c.boolean() else _dump(c, event.data)
    return replace(record, headers=headers, value=value)


def _structured(c: Chooser, record: KafkaRecord) -> KafkaRecord:
    envelope: dict[str, Any] = json.loads(record.value)
    if c.integer(0, 3):
        envelope["time"] = _time_text(c)
    else:
        del envelope["time"]
    envelope["datacontenttype"] = c.choice(
        ("application/json", None, "application/json; charset=utf-8", "text/json")
    )
    if envelope["datacontenttype"] is None:
        del envelope["datacontenttype"]
    if c.integer(0, 3) == 0:
        envelope["subject"] = ident(c)
    items = list(envelope.items())
    shuffle(c, items)
    headers = [("content-type", c.choice(_STRUCTURED_CONTENT_TYPES))]
    return replace(record, headers=headers, value=_dump(c, dict(items)))


def shuffle(c: Chooser, items: list[Any]) -> None:
    """Fisher-Yates with drawn indices (engines shrink towards the original order)."""
    for i in range(len(items) - 1, 0, -1):
        j = i - c.integer(0, i)
        items[i], items[j] = items[j], items[i]


def _zero_sig(version: bytes, size: int) -> bytes:
    return version + b"," + base64.b64encode(b"\0" * size)


_JUNK_SIGNATURES = (
    b"v2,abc",
    _zero_sig(b"v1", 32),
    _zero_sig(b"v1a", 64),
    b"v1,!!!!",
    b"v1a,",
)
_UNRELATED_NAMES = (b"x-trace", b"traceparent", b"x-request-id", b"X-Empty", "ünï".encode())


def _dress(c: Chooser, headers: list[tuple[str, bytes]]) -> list[Header]:
    """Harmless company a real producer's records carry: junk signature entries beside the
    valid one, unrelated headers, any order."""
    out: list[Header] = [(name.encode(), value) for name, value in headers]
    for i, (name, value) in enumerate(out):
        if name == b"webhook-signature" and value is not None:
            entries = [value, *(c.choice(_JUNK_SIGNATURES) for _ in range(c.integer(0, 2)))]
            shuffle(c, entries)
            out[i] = (name, b" ".join(entries))
    for _ in range(c.integer(0, 2)):
        value = either(c, (b"1", b"", None), [lambda: c.raw(16)])
        out.append((c.choice(_UNRELATED_NAMES), value))
    shuffle(c, out)
    return out


def valid_record(c: Chooser) -> Record:
    """A record the gate must accept (the fuzz target and the property test check it)."""
    producer = c.choice(PRODUCERS)
    event = _producer_event(c, producer)
    structured = c.boolean()
    record = encode(event, structured=structured)
    record = _structured(c, record) if structured else _binary(c, record, event)
    keys = [k.signing for k in producer.keys]
    if len(keys) > 1 and c.boolean():  # rotation: signed by one of the keys only
        keys = [c.choice(keys)]
    signed = sign_record(record, event.id, keys, timestamp=ARRIVAL + c.integer(-SKEW, SKEW))
    key = c.choice((signed.key, None, b"", b"k"))
    return Record(key, tuple(_dress(c, signed.headers)), signed.value)


# --- header names: every other spelling -----------------------------------------------

_LOOKALIKES = {
    "k": "\u212a\u0138\u043a",  # Kelvin sign, kra, Cyrillic ka
    "i": "\u0131\u0130\u2170\u0456",  # dotless i, dotted capital I, roman numeral one, Cyrillic
    "s": "\u017f\u0455",  # long s, Cyrillic dze
    "e": "\u212f\u0435",  # script e, Cyrillic ie
    "c": "\u217d\u0441\U0001d41c",  # roman numeral hundred, Cyrillic es, bold c
    "o": "\u043e\u2092",
    "t": "\u1d57",
    "n": "\u207f",
    "-": "\u2010\u2011\u2212\ufe63\uff0d",  # hyphens, minus, small and fullwidth hyphen-minus
    "_": "\uff3f\ufe4d\u2017",
}
_INVISIBLE = ("\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad", "\u034f", "\u0301")
_SPACES = (" ", "\t", "\u00a0", "\u3000", "\n", "\r\n")


def _fullwidth(ch: str) -> str:
    return chr(ord(ch) + 0xFEE0) if "!" <= ch <= "~" else ch


def _flip_cases(c: Chooser, text: str) -> str:
    return "".join(ch.swapcase() if c.boolean() else ch for ch in text)


def _substitute(c: Chooser, text: str, table: Callable[[str], str]) -> str:
    if not text:
        return text
    i = c.integer(0, len(text) - 1)
    return text[:i] + table(text[i]) + text[i + 1 :]


def _lookalike(c: Chooser, ch: str) -> str:
    options = _LOOKALIKES.get(ch.lower(), "") + _fullwidth(ch)
    return c.choice(options)


def _insert(c: Chooser, text: str, pieces: Sequence[str]) -> str:
    i = c.integer(0, len(text))
    return text[:i] + c.choice(pieces) + text[i:]


def _text_respelling(c: Chooser, text: str) -> str:
    how = c.integer(0, 8)
    if how == 0:
        return _flip_cases(c, text)
    if how == 1:
        return c.choice((text.upper(), text.title(), text.capitalize()))
    if how == 2:
        return _substitute(c, text, lambda ch: _lookalike(c, ch))
    if how == 3:
        return _insert(c, text, _INVISIBLE)
    if how == 4:
        space = c.choice(_SPACES)
        return c.choice((space + text, text + space, space + text + space))
    if how == 5:
        return text.translate(str.maketrans("-_", "_-"))
    if how == 6:
        return "".join(_fullwidth(ch) for ch in text)
    if how == 7:
        return _substitute(c, text, lambda ch: ch + c.choice(("\u0301", "\u0307", "\u0338")))
    return _flip_cases(c, _substitute(c, text, lambda ch: _lookalike(c, ch)))


def respell(c: Chooser, name: bytes) -> bytes:
    """Another spelling of a header name: one a lenient reader might take for it, or bytes
    that are not a name at all."""
    how = c.integer(0, 9)
    if how <= 6:
        return _text_respelling(c, name.decode("utf-8", "replace")).encode()
    if how == 7:
        return c.choice((name + b"\xff", b"\xed\xa0\x80" + name, name[:2] + b"\xc0\xaf" + name[2:]))
    if how == 8:
        return name + c.choice((b"\x00", b" ", b"\x00x"))
    return c.raw(24)


# --- header values --------------------------------------------------------------------

_HOSTILE_VALUES: tuple[bytes | None, ...] = (
    b"",
    None,
    b"\xff\xfe",
    b"\xed\xa0\x80",  # a UTF-8-encoded lone surrogate (not UTF-8)
    b"\xed\xb0\x80x",
    b"\xc0\x80",  # overlong NUL
    b"\x00",
    b"a" * 20000,
    b"acme",
    b"globex",
    b"job.failed",
    b"job.completed",
    b"hmac-svc",
    b"ed-svc",
    b"1.0",
    b"1.1",
    "\uff41\uff43\uff4d\uff45".encode(),  # fullwidth "acme"
    b"acme\r\n",
    "\u212acme".encode(),
    b"2026-01-01T00:00:00Z",
)


def other_value(c: Chooser, old: bytes | None) -> bytes | None:
    """A replacement for a header value: empty, absent, not UTF-8, huge, a near miss of
    ``old``, or the value another field has in a valid record."""
    base = old or b""
    how = c.integer(0, 3)
    if how == 0:
        return c.choice(_HOSTILE_VALUES)
    if how == 1:
        return c.raw(48)
    if how == 2:
        return c.choice(
            (base + b"\x00", base + b" ", b" " + base, base.upper(), base.swapcase(), base * 2)
        )
    return _flip_byte(c, base) if base else b"x"


def _flip_byte(c: Chooser, raw: bytes) -> bytes:
    i = c.integer(0, len(raw) - 1)
    return raw[:i] + bytes([raw[i] ^ (1 << c.integer(0, 7))]) + raw[i + 1 :]


def _timestamp(c: Chooser, old: bytes | None) -> bytes:
    ts = old or str(ARRIVAL).encode()
    digits = ts.decode("ascii", "replace")
    number = int(ts) if ts.isdigit() else ARRIVAL
    return c.choice(
        (
            b"9" * 400,
            b"+" + ts,
            b" " + ts,
            ts + b" ",
            ts + b"\n",
            "".join(_fullwidth(d) for d in digits).encode(),
            "".join(chr(0x660 + int(d)) if d.isdigit() else d for d in digits).encode(),
            b"-" + ts,
            b"0" + ts,
            str(number + 1).encode(),
            str(number - 1).encode(),
            str(ARRIVAL + 301).encode(),
            str(ARRIVAL - 301).encode(),
            f"{number:_}".encode(),
            b"1.7e9",
            hex(number).encode(),
            b"",
            b"9" * 12,
            b"9" * 13,
            ts + b".0",
        )
    )


def _signature(c: Chooser, old: bytes | None) -> bytes:
    header = old or b""
    entries = header.split(b" ")
    version, _, encoded = entries[0].partition(b",")
    other_version = b"v1" if version == b"v1a" else b"v1a"
    fixed = (
        b"v1,!!!!",  # bad base64
        version + b"," + encoded.rstrip(b"="),
        version + b"," + encoded.replace(b"+", b"-").replace(b"/", b"_"),
        version + b", " + encoded,
        entries[0] + b"\n",
        _zero_sig(b"v1", 31),  # wrong lengths
        _zero_sig(b"v1a", 63),
        _zero_sig(b"v1a", 32),
        b"v2," + encoded,  # unknown versions
        version.upper() + b"," + encoded,
        other_version + b"," + encoded,
        b",",
        b"v1",
        b",".join(entries),  # other separators
        b"\t".join(entries),
        b"  ".join(entries),
        header + b" ",
        b" " + header,
    )
    drawn: tuple[Callable[[], bytes], ...] = (
        lambda: b" ".join([_zero_sig(b"v1", 32)] * c.choice((8, 9, 100, 300))),
        lambda: b" ".join([_zero_sig(b"v1a", 64)] * 200 + [header]),
        lambda: b" ".join(entries * c.integer(2, 9)),
        lambda: _flip_byte(c, header) if header else b"v1,",
        lambda: c.raw(200),
    )
    return either(c, fixed, drawn)


# --- values ---------------------------------------------------------------------------

# JSON text that parsers disagree on, Postgres cannot store, or that is not JSON at all.
_HOSTILE_JSON = (
    b'"\\udc00"',
    b'"\\ud800x"',
    b'"\\u0000"',
    b'"a\\u0000b"',
    b'"\\ud83d\\ude00"',  # a valid pair: fine
    b"NaN",
    b"-Infinity",
    b"Infinity",
    b"1e400",
    b"-1e400",
    b"1e-400",
    b"1" + b"0" * 5000,
    b"9" * 4300,
    b"-0",
    b"1.0e+2",
    b"1.50",  # exactly a double, written otherwise: fine
    b"1.00000000000000000001",  # more precision than a double: stored as 1.0
    b"3.141592653589793238",
    b"4.9e-324",
    b'"\xed\xa0\x80"',
    b'"\xc0\x80"',
    b'"\x00"',
    b'"\x1f"',
    b"[" * 65 + b"]" * 65,
    b"2" + b"0" * 210 + b"e99",  # Infinity with a two-digit exponent: once accepted
)
_ATTRIBUTE_KEYS = (
    "tenant", "type", "id", "source", "correlationid", "jobid", "time", "specversion", "data",
    "datacontenttype", "data_base64", "x",
)  # fmt: skip


def _splice(c: Chooser, value: bytes, literal: bytes) -> bytes:
    """``literal`` inserted where a container opens: a new member, or a duplicated key."""
    starts = [i for i, b in enumerate(value[:4096]) if b in b"{["]
    if not starts:
        return literal
    at = c.choice(starts)
    if value[at : at + 1] == b"[":
        member = literal + b","
    else:
        member = json.dumps(c.choice(_ATTRIBUTE_KEYS)).encode() + b":" + literal + b","
    return value[: at + 1] + member + value[at + 1 :]


def _reencode(c: Chooser, value: bytes) -> bytes:
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return value
    encoding = c.choice(("utf-16", "utf-16-be", "utf-32", "utf-8-sig", "latin-1", "cp1252"))
    return text.encode(encoding, "replace")


def _nest(c: Chooser, value: bytes) -> bytes:
    n = c.choice((1, 63, 64, 65, 1000, 100000))
    if c.boolean():
        return b"[" * n + value + b"]" * n
    if c.boolean():
        return b'{"a":' * n + value + b"}" * n
    return b"[" * n


def other_record_value(c: Chooser, value: bytes | None) -> bytes | None:
    base = value or b""
    how = c.integer(0, 10)
    if how == 0 and base:
        return _flip_byte(c, base)
    if how == 1:
        return base[: c.integer(0, len(base))]
    if how == 2:
        at = c.integer(0, len(base))
        return base[:at] + c.raw(8) + base[at:]
    if how == 3:
        return _nest(c, base)
    if how == 4:
        return _splice(c, base, c.choice(_HOSTILE_JSON))
    if how == 5:
        return _splice(c, base, json.dumps(json_value(c)).encode())
    if how == 6:
        return _reencode(c, base)
    if how == 7:
        # Padding is valid JSON around valid JSON; a megabyte of it is past the value limit.
        padded = (b" " + base, base + b"\n", base + b"\x00", base + b"x")
        return either(c, padded, [lambda: base + b" " * 2**20])
    if how == 8:
        return either(c, (None, b"", b"null", b"{}", b"[]"), [lambda: c.choice(_HOSTILE_JSON)])
    if how == 9:
        return _splice(c, base, number_text(c).encode())
    return c.raw(256)


# --- mutations ------------------------------------------------------------------------

RESERVED_NAMES = (
    b"content-type", b"webhook-id", b"webhook-timestamp", b"webhook-signature",
    b"ce_specversion", b"ce_id", b"ce_source", b"ce_type", b"ce_tenant", b"ce_correlationid",
    b"ce_jobid", b"ce_time", b"ce_datacontenttype", b"ce_subject", b"ce_dataschema", b"ce_data",
)  # fmt: skip
CONTENT_TYPES: tuple[bytes | None, ...] = (
    None,
    b"application/json",
    b"application/cloudevents+json",
    b"application/cloudevents+json; charset=utf-8",
    b"APPLICATION/CLOUDEVENTS+JSON",
    b'application/CloudEvents+Json ; Charset="UTF-8"',
    b"application/cloudevents+json; charset=latin-1",
    b"application/cloudevents-batch+json",
    b"application/cloudevents",
    b"application/json; charset=utf-16",
    b"text/plain",
    b"application/x-www-form-urlencoded",
    b"",
    b" application/cloudevents+json",
    b"application/cloudevents+json\x00",
    "application/cloudevents\uff0bjson".encode(),
)

Mutation = Callable[[Chooser, Record], Record]


def _with_headers(record: Record, headers: Sequence[Header]) -> Record:
    return replace(record, headers=tuple(headers))


def _index(c: Chooser, record: Record) -> int | None:
    return c.integer(0, len(record.headers) - 1) if record.headers else None


def _rename(c: Chooser, record: Record) -> Record:
    i = _index(c, record)
    if i is None:
        return _add_reserved(c, record)
    headers = list(record.headers)
    name, value = headers[i]
    headers[i] = (respell(c, name), value)
    return _with_headers(record, headers)


def _duplicate(c: Chooser, record: Record) -> Record:
    i = _index(c, record)
    if i is None:
        return _add_reserved(c, record)
    headers = list(record.headers)
    name, value = headers[i]
    copy = (
        respell(c, name) if c.boolean() else name,
        other_value(c, value) if c.boolean() else value,
    )
    headers.insert(either(c, (i, i + 1), [lambda: c.integer(0, len(headers))]), copy)
    return _with_headers(record, headers)


def _remove(c: Chooser, record: Record) -> Record:
    i = _index(c, record)
    if i is None:
        return record
    return _with_headers(record, record.headers[:i] + record.headers[i + 1 :])


def _add_reserved(c: Chooser, record: Record) -> Record:
    """Another header that the gate reads; in a structured record a ce_ header makes mixed
    modes."""
    name = c.choice(RESERVED_NAMES)
    if c.integer(0, 3) == 0:
        name = respell(c, name)
    value = other_value(c, None) if c.boolean() else c.choice((b"acme", b"1.0", b"x", b"globex"))
    headers = list(record.headers)
    headers.insert(c.integer(0, len(headers)), (name, value))
    return _with_headers(record, headers)


def _add_unrelated(c: Chooser, record: Record) -> Record:
    """What the property test counts on being accepted: headers nobody reads."""
    header = (c.choice(_UNRELATED_NAMES), either(c, (b"1", None), [lambda: c.raw(16)]))
    headers = list(record.headers)
    headers.insert(c.integer(0, len(headers)), header)
    return _with_headers(record, headers)


def _replace_named(
    c: Chooser, record: Record, name: bytes, make: Callable[[bytes | None], bytes | None]
) -> Record:
    """The header ``name`` given a new value, added when absent (a None value: removed, or
    kept without a value)."""
    old = next((v for n, v in record.headers if n == name), None)
    new = make(old)
    kept = [h for h in record.headers if h[0] != name]
    if new is not None or c.boolean():
        kept.insert(c.integer(0, len(kept)), (name, new))
    return _with_headers(record, kept)


def _content_type(c: Chooser, record: Record) -> Record:
    return _replace_named(c, record, b"content-type", lambda _: c.choice(CONTENT_TYPES))


def _timestamp_header(c: Chooser, record: Record) -> Record:
    return _replace_named(c, record, b"webhook-timestamp", lambda old: _timestamp(c, old))


def _signature_header(c: Chooser, record: Record) -> Record:
    return _replace_named(c, record, b"webhook-signature", lambda old: _signature(c, old))


def _attribute_value(c: Chooser, record: Record) -> Record:
    """A header the gate reads, given another value (tenant to another allowed tenant...)."""
    name = c.choice(RESERVED_NAMES[:12])
    return _replace_named(c, record, name, lambda old: other_value(c, old))


def _header_value(c: Chooser, record: Record) -> Record:
    i = _index(c, record)
    if i is None:
        return _add_reserved(c, record)
    headers = list(record.headers)
    name, value = headers[i]
    headers[i] = (name, other_value(c, value))
    return _with_headers(record, headers)


def _raw_header(c: Chooser, record: Record) -> Record:
    headers = list(record.headers)
    header = (c.raw(24), c.raw(48) if c.boolean() else None)
    if headers and c.boolean():
        headers[c.integer(0, len(headers) - 1)] = header
    else:
        headers.insert(c.integer(0, len(headers)), header)
    return _with_headers(record, headers)


def _many_headers(c: Chooser, record: Record) -> Record:
    n = c.choice((1, 50, 63, 64, 65, 200))
    big = c.choice((b"v", b"v" * 300, b"v" * 17000))
    extra = [(b"x-%d" % i, big) for i in range(n)]
    return _with_headers(record, [*record.headers, *extra])


def _reorder(c: Chooser, record: Record) -> Record:
    headers = list(record.headers)
    shuffle(c, headers)
    return _with_headers(record, headers)


def _value(c: Chooser, record: Record) -> Record:
    return replace(record, value=other_record_value(c, record.value))


def _key(c: Chooser, record: Record) -> Record:
    key = either(c, (None, b"", b"\x00\xff", b"k" * 17000), [lambda: c.raw(64)])
    return replace(record, key=key)


MUTATIONS: dict[str, Mutation] = {
    "rename": _rename,
    "duplicate": _duplicate,
    "remove": _remove,
    "add_reserved": _add_reserved,
    "add_unrelated": _add_unrelated,
    "content_type": _content_type,
    "timestamp": _timestamp_header,
    "signature": _signature_header,
    "attribute_value": _attribute_value,
    "header_value": _header_value,
    "raw_header": _raw_header,
    "many_headers": _many_headers,
    "reorder": _reorder,
    "value": _value,
    "key": _key,
}
_MUTATION_NAMES = tuple(MUTATIONS)


def mutate(c: Chooser, record: Record) -> tuple[str, Record]:
    """One mutation of ``record``, and its name (for statistics)."""
    name = c.choice(_MUTATION_NAMES)
    return name, MUTATIONS[name](c, record)


# --- random bytes ---------------------------------------------------------------------


def random_record(c: Chooser) -> Record:
    """Bytes with no structure but the record's shape; names sometimes ones the gate reads,
    so the random mode reaches past the first check now and then."""
    headers: list[Header] = []
    for _ in range(c.integer(0, 8)):
        name = c.choice(RESERVED_NAMES) if c.boolean() else c.raw(24)
        headers.append((name, c.raw(64) if c.integer(0, 5) else None))
    key = c.raw(32) if c.boolean() else None
    value = c.raw(512) if c.integer(0, 5) else None
    return Record(key, tuple(headers), value)


# --- signed hostile records -----------------------------------------------------------
#
# A mutation breaks the signature, and the gate checks the registry and the payload schema
# only after it. Signing the mutated record again, as a registered producer with a bug (or
# a stolen key) would, takes hostile content through those checks too.

_HOSTILE_ATTRIBUTES: tuple[Any, ...] = (
    "0001-01-01T00:00:00+01:00",  # an instant before year 1 in UTC
    "9999-12-31T23:59:59-01:00",  # one after year 9999 in UTC
    "2026-02-30T00:00:00Z",
    "2026-01-01T00:00:60Z",
    "\uff12\uff10\uff12\uff16-01-01T00:00:00Z",  # fullwidth digits
    "2026-01-01T00:00:00.1234567890123Z",
    "",
    " ",
    "\u3000",
    "\x00",
    "a\x00",
    "\udc00",
    "x" * 513,
    "1.1",
    "*",
    "globex",
    1,
    None,
    [],
    {"a": 1},
)


def _exact(record: Record, name: bytes) -> bytes | None:
    return next((v for n, v in record.headers if n == name), None)


def _envelope(record: Record) -> dict[str, Any] | None:
    try:
        envelope = json.loads(record.value or b"")
    except (ValueError, RecursionError):
        return None
    return envelope if isinstance(envelope, dict) else None


def _is_structured(record: Record) -> bool:
    content_type = _exact(record, b"content-type") or b""
    return content_type.lower().startswith(b"application/cloudevents")


def _as_header(value: Any) -> bytes | None:
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value)
    return text.encode("utf-8", "surrogatepass")  # a lone surrogate as its (invalid) bytes


def _hostile_attribute(c: Chooser, record: Record) -> Record:
    """One attribute set to text matcher must refuse or store safely, in the record's mode."""
    name = c.choice(("time", "tenant", "type", "id", "correlationid", "jobid", "specversion"))
    hostile = c.choice(_HOSTILE_ATTRIBUTES)
    envelope = _envelope(record) if _is_structured(record) else None
    if envelope is not None:
        envelope[name] = hostile
        return replace(record, value=json.dumps(envelope).encode())
    header = b"ce_" + name.encode()
    kept = [h for h in record.headers if h[0] != header]
    return _with_headers(record, [*kept, (header, _as_header(hostile))])


def _hostile_number(c: Chooser, record: Record) -> Record:
    """The data given a number at an edge of the number rule (``numbers.number_text``),
    written as it is, in the record's mode; the caller signs it again, so only the rule
    stands between it and the inbox."""
    number = number_text(c).encode()
    envelope = _envelope(record) if _is_structured(record) else None
    if envelope is None:
        data = b"[" + number + b"]" if c.boolean() else b'{"n":' + number + b',"m":1}'
        return replace(record, value=data)
    envelope["data"] = {"n": "@number@", "id": ident(c)}
    text = json.dumps(envelope).encode()
    return replace(record, value=text.replace(b'"@number@"', number, 1))


_READ_KEYS = ("tenant", "type", "id", "source", "correlationid", "jobid", "time", "data")


def _lookalike_key(c: Chooser, record: Record) -> Record:
    """A structured envelope given a key that a case-folding reader takes for one matcher
    reads ("Tenant", "correlationId"), beside the exact one or instead of it."""
    envelope = _envelope(record) if _is_structured(record) else None
    if envelope is None:
        return _hostile_attribute(c, record)
    name = c.choice(_READ_KEYS)
    if c.boolean():
        envelope.pop(name, None)
    envelope[_text_respelling(c, name)] = c.choice(_HOSTILE_ATTRIBUTES)
    return replace(record, value=json.dumps(envelope).encode())


def _event_id(record: Record) -> bytes:
    if _is_structured(record):
        envelope = _envelope(record) or {}
        found = envelope.get("id")
        return found.encode("utf-8", "surrogatepass") if isinstance(found, str) else b"x"
    return _exact(record, b"ce_id") or b"x"


def _producer(record: Record) -> FuzzProducer:
    source = (_envelope(record) or {}).get("source") if _is_structured(record) else None
    if source is None:
        source = (_exact(record, b"ce_source") or b"").decode("utf-8", "replace")
    return next((p for p in PRODUCERS if p.source == source), PRODUCERS[0])


def _content(record: Record) -> bytes:
    """What the producer SDK signs for this record (the gate signs the same when the record
    has one reading)."""
    value = record.value or b""
    if _is_structured(record):
        return value
    named = [(n.decode(), v) for n, v in record.headers if v is not None and n.isascii()]
    return binary_content(named, value)


def resign(c: Chooser, record: Record) -> Record:
    """``record`` signed again by its producer's keys, fresh for ``ARRIVAL``."""
    event_id = _event_id(record)
    stamp = str(ARRIVAL + c.integer(-SKEW, SKEW)).encode()
    message = event_id + b"." + stamp + b"." + _content(record)
    signature = " ".join(k.signing.sign(message) for k in _producer(record).keys).encode()
    kept = [h for h in record.headers if not h[0].startswith(b"webhook-")]
    fresh = [(b"webhook-id", event_id), (b"webhook-timestamp", stamp)]
    return _with_headers(record, [*kept, *fresh, (b"webhook-signature", signature)])


def fuzz_record(c: Chooser) -> Record:
    """The generator: mostly a valid record with up to four mutations, then perhaps a
    hostile attribute and a fresh signature; sometimes random bytes. The lowest decisions
    make the common case, which is where engines shrink to."""
    if c.integer(0, 9) == 9:
        return random_record(c)
    record = valid_record(c)
    for _ in range(c.integer(0, 4)):
        record = mutate(c, record)[1]
    signing = c.integer(0, 3)
    if signing == 2:
        record = resign(c, record)
    elif signing == 3:
        hostile = c.choice((_hostile_attribute, _lookalike_key, _hostile_number))
        record = resign(c, hostile(c, record))
    return record
