"""Prometheus metrics. Names follow the conventions: a ``matcher_`` prefix, base units
(seconds), ``_total`` for counters; labels take bounded values only (never an id).

Counters count this process's work. Gauges read from the database (``stats.py``) describe
the whole system, so every daemon reports the same value: aggregate them with ``max``.
"""

from __future__ import annotations

import platform

from prometheus_client import Counter, Gauge, Histogram, Info, disable_created_metrics

from matcher import __version__
from matcher.domain.events import REASONS
from matcher.domain.waits import Outcome

# No ``*_created`` series: prometheus_client would add one per counter and histogram
# (and per label set), doubling the families scraped for a timestamp nothing here reads.
# (Collection reads the switch, so it holds for every metric of this process.)
disable_created_metrics()  # type: ignore[no-untyped-call]  # (untyped upstream)

BUILD_INFO = Info("matcher_build", "The matcher version this process runs (value 1).")
BUILD_INFO.info({"version": __version__, "python": platform.python_version()})

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)

EVENTS_RECEIVED = Counter(
    "matcher_events_received_total",
    "Records read from the events topic, by what became of them.",
    ["result"],  # accepted, duplicate, rejected
)
CONFLICTING_DUPLICATES = Counter(
    "matcher_conflicting_duplicates_total",
    "Duplicates (an id of their source already stored) that said something else than the"
    " stored event: dropped all the same, each logged with where it was read.",
)
EVENTS_REJECTED = Counter(
    "matcher_events_rejected_total", "Records quarantined, by reason code.", ["reason"]
)
# Every reason is present from the start, at 0: a rate over a series that appears only at
# the first rejection would miss that first one.
for _reason in REASONS:
    EVENTS_REJECTED.labels(_reason)
DEAD_LETTERS_DROPPED = Counter(
    "matcher_dead_letters_dropped_total",
    "Rejected records not copied to the dead-letter topic (its queue full, or Kafka failing);"
    " each is still in the quarantine table.",
)
MATCHES = Counter("matcher_matches_total", "Waits resolved by an event.")
LATE_EVENTS = Counter(
    "matcher_late_events_total", "Events that matched a wait already timed out or cancelled."
)
TIMEOUTS = Counter(
    "matcher_timeouts_total",
    "Waits timed out by the deadline sweeper (their deadline passed, or their heartbeat came due).",
)
HEARTBEATS_MISSED = Counter(
    "matcher_heartbeats_missed_total",
    "Waits timed out because no progress event came within their heartbeat interval (counted"
    " in matcher_timeouts_total too).",
)
RESUMES_PUBLISHED = Counter(
    "matcher_resumes_published_total",
    "Resume messages published, by outcome (cancels and early matches included).",
    ["outcome"],  # event, timeout, cancelled
)
for _outcome in Outcome:  # at 0 from the start, as the rejection reasons
    RESUMES_PUBLISHED.labels(_outcome.value)
BATCH_SIZE = Histogram(
    "matcher_ingest_batch_records",
    "Records per ingest batch (one transaction each).",
    buckets=(1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500),
)
BATCH_SECONDS = Histogram(
    "matcher_ingest_transaction_seconds",
    "Duration of one ingest batch's Postgres transaction.",
    buckets=_LATENCY_BUCKETS,
)
EVENT_TO_RESUME = Histogram(
    "matcher_event_to_resume_seconds",
    "From an event's arrival in matcher to its resume being acknowledged by Kafka.",
    buckets=_LATENCY_BUCKETS,
)
WAIT_DURATION = Histogram(
    "matcher_wait_duration_seconds",
    "How long waits waited, from registration to resolution, observed at publication.",
    ["outcome"],
    buckets=(0.1, 1, 10, 60, 300, 900, 3600, 4 * 3600, 24 * 3600, 7 * 24 * 3600),
)
CONSUMER_LAG = Gauge(
    "matcher_consumer_lag_records",
    "Records on this daemon's partitions not yet committed.",
    ["partition"],
)
ASSIGNED_PARTITIONS = Gauge(
    "matcher_consumer_assigned_partitions", "Partitions of the events topic assigned here."
)
REGISTRY_RELOADS = Counter(
    "matcher_producer_registry_reloads_total",
    "Reloads of the producers file, by result.",
    ["result"],  # ok, failed
)
for _result in ("ok", "failed"):
    REGISTRY_RELOADS.labels(_result)
REGISTRY_RELOAD_FAILING = Gauge(
    "matcher_producer_registry_reload_failing",
    "1 while the last reload of the producers file failed (the last good registry stays in "
    "force, so changes to the file are not), else 0.",
)

# From the database, for the whole system.
WAITS_ACTIVE = Gauge("matcher_waits_active", "Waits in state waiting.")
WAIT_OLDEST_AGE = Gauge("matcher_wait_oldest_age_seconds", "Age of the oldest wait still waiting.")
INBOX_PENDING = Gauge("matcher_inbox_pending_events", "Stored events waiting for their wait.")
INBOX_OLDEST_PENDING_AGE = Gauge(
    "matcher_inbox_oldest_pending_age_seconds", "Age of the oldest pending event."
)
MISMATCHES = Gauge(
    "matcher_inbox_mismatched_events",
    "Pending events with a near-miss wait: same correlation id, other tenant or type.",
)
MISMATCHED_EVENTS = Counter(
    "matcher_mismatched_events",
    "Events stored next to a near-miss wait (same correlation id, other tenant or type, "
    "still pending when counted, a minute after arrival), counted from the database for "
    "the whole system: aggregate with max, like the gauges.",
)
WORKER_PARKED = Gauge(
    "matcher_worker_parked_resumes",
    "Resumes the workers' handler gave up on (matcher.worker_failures): their runs wait for "
    "`matcher resumes retry`.",
)
WORKER_FAILING = Gauge(
    "matcher_worker_failing_resumes",
    "Resumes the workers' handler failed on and is still trying.",
)
OUTBOX_PENDING = Gauge("matcher_outbox_pending", "Resolutions whose resume is not yet published.")
OUTBOX_OLDEST_AGE = Gauge(
    "matcher_outbox_oldest_age_seconds", "Age of the oldest unpublished resolution."
)
SWEEPER_BEHIND = Gauge(
    "matcher_sweeper_behind_seconds", "How long ago the earliest overdue deadline passed."
)
QUARANTINED = Gauge("matcher_quarantine_records", "Quarantined records not replayed.")
