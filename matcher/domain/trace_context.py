"""The W3C trace context an event arrived with: transport metadata kept beside the event
(like its Kafka offset) and put on its resume, so that one trace runs from the producer to
the worker that continues the run.

It is never authority. Nothing decides by it and no signature covers it; the gate keeps
only signed attributes of the event, and this is not one. A trace parent that is
malformed, or given twice with different values, is not kept (the event is not refused
for it). What a forger of this header can do is file the run's spans under another trace.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# The record headers that carry it: OpenTelemetry's Kafka convention, and the CloudEvents
# Kafka binding of the distributed-tracing extension.
HEADERS = (b"traceparent", b"ce_traceparent")
# Version 00 (https://www.w3.org/TR/trace-context/#traceparent-header): lowercase hex.
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16


def valid(text: str) -> bool:
    """Whether ``text`` is a version-00 traceparent with a trace id and a span id."""
    found = _TRACEPARENT.fullmatch(text)
    return found is not None and found[1] != _ZERO_TRACE and found[2] != _ZERO_SPAN


def trace_parent(headers: Iterable[tuple[bytes, bytes | None]]) -> str | None:
    """The record's traceparent: the one value its headers give (under either name), or
    None when there is none, it is malformed, or two headers disagree."""
    found: str | None = None
    for name, value in headers:
        if name not in HEADERS:
            continue
        if value is None:
            return None
        try:
            text = value.decode("ascii")
        except UnicodeDecodeError:
            return None
        if not valid(text) or (found is not None and found != text):
            return None
        found = text
    return found
