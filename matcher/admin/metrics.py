"""Prometheus metrics. Names follow the conventions: a ``matcher_`` prefix, base units,
``_total`` for counters; labels only take bounded values (never ids)."""

from __future__ import annotations

from prometheus_client import Counter

EVENTS_RECEIVED = Counter(
    "matcher_events_received_total",
    "Kafka records read from the events topic, by what became of them.",
    ["result"],  # accepted, duplicate, rejected
)
EVENTS_REJECTED = Counter(
    "matcher_events_rejected_total",
    "Records quarantined, by reason code.",
    ["reason"],
)
