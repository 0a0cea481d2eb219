"""The ingress's metrics, in a registry of their own: the ingress is its own process and
exports none of the daemon's. Labels take bounded values only: ``producer`` is a
registered producer's name, ``_unknown``, or ``callback`` (every callback URL, whatever its
token), ``outcome`` a fixed code."""

from __future__ import annotations

import platform
from collections.abc import Iterable

from prometheus_client import (
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
)

from matcher import __version__
from matcher.auth.registry import Producer

# No ``*_created`` series: one per counter and histogram (and per label set) would double
# the families scraped for a timestamp nothing here reads.
disable_created_metrics()  # type: ignore[no-untyped-call]  # (untyped upstream)

REGISTRY = CollectorRegistry(auto_describe=True)
REGISTRY.register(PROCESS_COLLECTOR)

UNKNOWN_PRODUCER = "_unknown"

# Every outcome a request can have: "accepted", or the reason it was refused.
OUTCOMES = (
    "accepted",
    # Acknowledged (200) and not forwarded, by a drop rule of the producer's (GitHub's
    # ping, an action the producer does not need): not a refusal.
    "dropped",
    "malformed",
    "unmappable",
    "ambiguous",
    "bad_signature",
    "expired_timestamp",
    "unknown_producer",
    "tenant_not_allowed",
    "type_not_allowed",
    "schema_invalid",
    "too_large",
    "limit_exceeded",
    "unsupported_media_type",
    "timeout",
    "overloaded",
    "kafka_unavailable",
    # Callbacks only (producer "callback"):
    "unknown_callback",
    "callbacks_disabled",
    "duplicate",
    "resolved",
    "late",
    "busy",
    "database_unavailable",
)
# Outcomes no registered producer's webhook can have: a request to an unregistered name
# is counted as _unknown's, the rest are callbacks'.
_NOT_A_PRODUCERS = frozenset(
    {
        "unknown_producer",
        "unknown_callback",
        "callbacks_disabled",
        "duplicate",
        "resolved",
        "late",
        "busy",
        "database_unavailable",
    }
)
PRODUCER_OUTCOMES = tuple(o for o in OUTCOMES if o not in _NOT_A_PRODUCERS)

BUILD_INFO = Info(
    "matcher_build", "The matcher version this process runs (value 1).", registry=REGISTRY
)
BUILD_INFO.info({"version": __version__, "python": platform.python_version()})

REQUESTS = Counter(
    "matcher_ingress_requests_total",
    "Webhook and callback requests, by producer (callback for callback URLs) and outcome "
    "(accepted, or the reason code).",
    ["producer", "outcome"],
    registry=REGISTRY,
)
REQUEST_DURATION = Histogram(
    "matcher_ingress_request_duration_seconds",
    "From a request's arrival to its answer (Kafka's acknowledgement included).",
    ["producer"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
DROPPED = Counter(
    "matcher_ingress_dropped_total",
    "Webhooks acknowledged and not forwarded, by producer and the drop rule that matched "
    "(a rule's name from the producers file; ping for GitHub's built-in one).",
    ["producer", "rule"],
    registry=REGISTRY,
)
REFUSALS_UNRECORDED = Counter(
    "matcher_ingress_refusals_unrecorded_total",
    "Refused deliveries logged but not recorded in the database: past "
    "MATCHER_INGRESS_REFUSAL_RECORDS_PER_S, or the database did not take them.",
    registry=REGISTRY,
)
PRODUCE_ERRORS = Counter(
    "matcher_ingress_kafka_produce_errors_total",
    "Records Kafka did not acknowledge in time or refused (the sender got 503).",
    registry=REGISTRY,
)
CONNECTIONS_EVICTED = Counter(
    "matcher_ingress_connections_evicted_total",
    "Connections closed at the connection bound to make room for a new one: each the "
    "connection that had waited longest on its client (a slow or idle one).",
    registry=REGISTRY,
)
IN_FLIGHT = Gauge(
    "matcher_ingress_in_flight_requests",
    "Webhook requests being handled now.",
    registry=REGISTRY,
)
REGISTRY_RELOADS = Counter(
    "matcher_producer_registry_reloads_total",
    "Reloads of the producers file, by result.",
    ["result"],
    registry=REGISTRY,
)
for _result in ("ok", "failed"):
    REGISTRY_RELOADS.labels(_result)
REGISTRY_RELOAD_FAILING = Gauge(
    "matcher_producer_registry_reload_failing",
    "1 while the producers file on disk cannot be loaded (the last good one is in force).",
    registry=REGISTRY,
)


def initialise_producer_series(producers: Iterable[Producer]) -> None:
    """Every series a registered producer can have, at 0 from the moment it is registered
    (at start and on each reload of the producers file): a rate or a share over a series
    that appears only at its first request misses that request. Bounded: producers times
    outcomes. A producer removed from the file keeps its series (what it counted stays
    readable) until the process restarts.

    So are a plain-webhook producer's drop rules (``DROPPED`` by producer and rule name,
    GitHub's built-in ping among them).
    """
    for producer in producers:
        for outcome in PRODUCER_OUTCOMES:
            REQUESTS.labels(producer.source, outcome)
        for rule in producer.webhook.drop if producer.webhook is not None else ():
            DROPPED.labels(producer.source, rule.name)
