"""What a quarantine row keeps of a hostile record, so that writing it cannot fail.

Everything in a rejected record is attacker-chosen: header names and values (any bytes),
attribute text (NUL, lone surrogates, control characters), a value of any size. The row
keeps what an operator needs and a replay can use, within limits:

- the value whole up to ``MATCHER_QUARANTINE_KEEP_BYTES`` (so a replay sees the same
  bytes), otherwise a prefix, with the size and SHA-256 of the whole and ``raw_truncated``
  set (such a row cannot be replayed; the digest still identifies the record): a writer
  without a key cannot make the quarantine grow faster than that per record;
- headers as JSON, each name and value as text when it is UTF-8 without NUL, else base64;
  at most ``QuarantineLimits.headers`` of them and ``QuarantineLimits.header_bytes`` in all;
- the attributes read despite the failure (producer, event_id, tenant, type,
  correlation_id) exactly as read, bounded in length, or NULL when Postgres text cannot
  hold them (NUL, lone surrogates): an escaped stand-in would read like the characters
  of the escape sent as they are, and the record's own bytes (value, headers) say
  exactly what was sent;
- the detail, our own text (a value it cites is quoted as Python does), with NUL and
  lone surrogates escaped should any remain, bounded in length.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Any

from matcher.domain.events import summary_storable
from matcher.domain.records import Header

MAX_TEXT = 512
MAX_DETAIL = 1000


@dataclass(frozen=True)
class QuarantineLimits:
    value_bytes: int = 64 * 1024  # a value up to this is kept whole (replayable)
    prefix_bytes: int = 4096  # what is kept of a larger one
    header_bytes: int = 16 * 1024
    headers: int = 64


def storable_text(text: str | None, limit: int = MAX_TEXT) -> str | None:
    """``text`` as Postgres can store it: NUL and lone surrogates escaped, bounded."""
    if text is None:
        return None
    safe = text[:limit].encode("utf-8", "backslashreplace").decode("utf-8")
    return safe.replace("\x00", "\\x00")


def summary_text(text: str | None, limit: int = MAX_TEXT) -> str | None:
    """An attribute read from a rejected record as it was (bounded), or None when
    Postgres text cannot hold it as it was: never an escaped stand-in for it."""
    if text is None or not summary_storable(text[:limit]):
        return None
    return text[:limit]


def _field(raw: bytes, text_key: str, binary_key: str) -> dict[str, str]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and "\x00" not in text:
        return {text_key: text}
    return {binary_key: base64.b64encode(raw).decode()}


def headers_to_json(
    headers: tuple[Header, ...], limits: QuarantineLimits
) -> tuple[list[dict[str, Any]], bool]:
    """The headers as JSON (lossless within the limits), and whether any were cut."""
    out: list[dict[str, Any]] = []
    budget = limits.header_bytes
    for name, value in headers[: limits.headers]:
        size = len(name) + len(value or b"")
        if size > budget:
            return out, True
        budget -= size
        entry: dict[str, Any] = _field(name, "name", "name_base64")
        entry.update({"value": None} if value is None else _field(value, "value", "base64"))
        out.append(entry)
    return out, len(headers) > limits.headers


def headers_from_json(stored: list[dict[str, Any]]) -> tuple[Header, ...]:
    """The headers as they were received (the inverse of ``headers_to_json``)."""

    def part(entry: dict[str, Any], text_key: str, binary_key: str) -> bytes | None:
        if binary_key in entry:
            return base64.b64decode(entry[binary_key])
        text = entry.get(text_key)
        return None if text is None else str(text).encode()

    return tuple(
        (part(entry, "name", "name_base64") or b"", part(entry, "value", "base64"))
        for entry in stored
    )


@dataclass(frozen=True)
class KeptRecord:
    """What a quarantine row keeps of a record."""

    key: bytes | None
    value: bytes | None
    headers: list[dict[str, Any]]
    size: int | None
    sha256: bytes | None
    truncated: bool


def kept_of(
    key: bytes | None, headers: tuple[Header, ...], value: bytes | None, limits: QuarantineLimits
) -> KeptRecord:
    stored_headers, headers_cut = headers_to_json(headers, limits)
    value_cut = value is not None and len(value) > limits.value_bytes
    key_cut = key is not None and len(key) > limits.header_bytes
    return KeptRecord(
        key=key[: limits.header_bytes] if key is not None else None,
        value=value[: limits.prefix_bytes] if value_cut and value is not None else value,
        headers=stored_headers,
        size=None if value is None else len(value),
        sha256=None if value is None else hashlib.sha256(value).digest(),
        truncated=value_cut or headers_cut or key_cut,
    )
