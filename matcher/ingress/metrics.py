"""The ingress's metrics, in a registry of their own: the ingress is its own process and
exports none of the daemon's. Labels take bounded values only: ``producer`` is a
registered producer's name, ``_unknown``, or ``callback`` (every callback URL, whatever its
token), ``outcome`` a fixed code."""

from __future__ import annotations

import platform

from prometheus_client import (
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
)

from matcher import __version__

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
