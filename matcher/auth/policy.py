"""The gate's rules and bounds, from the settings (``matcher.config.Settings.policy``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from matcher.domain.events import MAX_JSON_DEPTH


@dataclass(frozen=True)
class Policy:
    require_signatures: bool = True
    # How far webhook-timestamp may be from the record's arrival, either way (replay window).
    timestamp_tolerance: timedelta = timedelta(minutes=5)
    max_value_bytes: int = 1024 * 1024
    max_header_bytes: int = 16 * 1024  # the key and every header name and value, together
    max_headers: int = 64
    max_json_depth: int = MAX_JSON_DEPTH
    # Entries of webhook-signature checked per record: each costs a verification per key.
    max_signatures: int = 8
