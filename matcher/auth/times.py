"""RFC 3339 date-times as CloudEvents and webhook mappings carry them (an offset required)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

_RFC3339 = re.compile(
    r"(\d{4}-\d{2}-\d{2})[Tt](\d{2}:\d{2}:\d{2})(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})"
)


def parse_time(text: str) -> datetime | None:
    """An RFC 3339 date-time (offset required), or None when ``text`` is not one."""
    match = _RFC3339.fullmatch(text)
    if match is None:
        return None
    day, clock, fraction, offset = match.groups()
    micro = (fraction or ".0")[:7].ljust(7, "0")  # datetime holds microseconds
    zone = "+00:00" if offset in ("Z", "z") else offset
    try:
        when = datetime.fromisoformat(f"{day}T{clock}{micro}{zone}")
        when.astimezone(UTC)  # within datetime's range in UTC too (Postgres reads it back)
    except (ValueError, OverflowError):
        return None
    return when
