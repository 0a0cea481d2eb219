"""Reads the system-wide gauges from Postgres at a fixed interval."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from matcher import metrics
from matcher.store.sql import query

log = logging.getLogger("matcher.stats")

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
}


async def refresh(pool: AsyncConnectionPool) -> dict[str, float]:
    async with pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query("stats", "gauges"))
        row = await cur.fetchone()
    assert row is not None
    values = {name: float(row[name] or 0) for name in _GAUGES}
    for name, gauge in _GAUGES.items():
        gauge.set(values[name])
    return values


async def run(pool: AsyncConnectionPool, stop: asyncio.Event, interval: float) -> None:
    while not stop.is_set():
        try:
            await refresh(pool)
        except psycopg.Error as exc:
            log.warning("gauges not refreshed", extra={"error": repr(exc)})
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
