"""A safe preview of a quarantined record: bounded, text when it is UTF-8, hex otherwise.
(Escaping is the templates' job: autoescape is on and nothing is marked safe.)"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

PREVIEW_BYTES = 2048
MAX_HEADERS = 64
HEADER_BYTES = 512


@dataclass(frozen=True)
class Shown:
    text: str
    binary: bool  # shown as hex
    cut: bool  # only a prefix is shown


def show(data: bytes | None, size: int | None = None, limit: int = PREVIEW_BYTES) -> Shown:
    if data is None:
        return Shown("(none)", False, False)
    part = data[:limit]
    cut = len(data) > limit or (size is not None and size > len(part))
    try:
        text = part.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(part) - 3:  # not just a character cut at the end
            return Shown(part.hex(" "), True, cut)
        text = part[: exc.start].decode("utf-8")
    if "\x00" in text:
        return Shown(part.hex(" "), True, cut)
    return Shown(text, False, cut)


def _part(entry: dict[str, Any], text_key: str, binary_key: str) -> bytes | None:
    if binary_key in entry:
        try:
            return base64.b64decode(str(entry[binary_key]))
        except (binascii.Error, ValueError):
            return str(entry[binary_key]).encode()
    text = entry.get(text_key)
    return None if text is None else str(text).encode()


def headers(stored: list[Any]) -> list[tuple[Shown, Shown]]:
    """The stored headers (matcher.domain.quarantine) as name and value, bounded."""
    shown: list[tuple[Shown, Shown]] = []
    for entry in stored[:MAX_HEADERS]:
        if not isinstance(entry, dict):
            continue
        name = _part(entry, "name", "name_base64") or b""
        value = _part(entry, "value", "base64")
        shown.append((show(name, limit=HEADER_BYTES), show(value, limit=HEADER_BYTES)))
    return shown
