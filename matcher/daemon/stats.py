"""Reads the system-wide gauges from Postgres at a fixed interval, and counts mismatched
events (``matcher_mismatched_events_total``) from the same place.

The counter is read from the database rather than counted where events are stored: the
mismatch test needs the waits of a correlation id in every tenant, which ingest does not
read (it locks and reads the event's own key only). Each tick counts the events that
arrived in a window closed ``MISMATCH_SETTLE_S`` ago and are still pending next to a
near-miss wait, so an event is counted once, about a minute after its arrival; an event
that a wait took within that minute is not counted. Every daemon counts every event (like
the gauges, the counter describes the whole system): aggregate with ``max``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from matcher import metrics
from matcher.store import stats as store_stats

log = logging.getLogger("matcher.stats")

# Longer than any ingest transaction: a window closed this long ago is complete.
MISMATCH_SETTLE_S = 60.0

_GAUGES = {
    "waits_active": metrics.WAITS_ACTIVE,
    "wait_oldest_age": metrics.WAIT_OLDEST_AGE,
    "inbox_pending": metrics.INBOX_PENDING,
    "inbox_oldest_pending_age": metrics.INBOX_OLDEST_PENDING_AGE,
    "mismatches": metrics.MISMATCHES,
    "outbox_pending": metrics.OUTBOX_PENDING,
    "outbox_oldest_age": metrics.OUTBOX_OLDEST_AGE,
    "sweeper_behind": metrics.SWEEPER_BEHIND,
    "quarantined": metrics.QUARANTINED,
    "worker_parked": metrics.WORKER_PARKED,
    "worker_failing": metrics.WORKER_FAILING,
}


class MismatchCounter:
    """Counts mismatched arrivals window by window; the first window starts when the
    counter first asks (events before that are the gauge's, not the counter's)."""

    def __init__(self, settle_s: float = MISMATCH_SETTLE_S) -> None:
        self.settle_s = settle_s
        self.since: datetime | None = None

    async def tick(self, cur: psycopg.AsyncCursor[dict[str, Any]]) -> int:
        edge = await store_stats.settled_edge(cur, self.settle_s)
        if self.since is None:
            self.since = edge
            return 0
        if edge <= self.since:
            return 0
        arrived = await store_stats.mismatched_arrivals(cur, self.since, edge)
        self.since = edge  # only once counted: a failed tick leaves its window to the next
        metrics.MISMATCHED_EVENTS.inc(arrived)
        return arrived


async def refresh(
    pool: AsyncConnectionPool, mismatches: MismatchCounter | None = None
) -> dict[str, float]:
    async with pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        row = await store_stats.gauges(cur)
        values = {name: float(row[name] or 0) for name in _GAUGES}
        for name, gauge in _GAUGES.items():
            gauge.set(values[name])
        if mismatches is not None:
            values["mismatched_arrivals"] = float(await mismatches.tick(cur))
    return values


async def run(pool: AsyncConnectionPool, stop: asyncio.Event, interval: float) -> None:
    mismatches = MismatchCounter()
    while not stop.is_set():
        try:
            await refresh(pool, mismatches)
        except psycopg.Error as exc:
            log.warning("gauges not refreshed", extra={"error": exc})
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
