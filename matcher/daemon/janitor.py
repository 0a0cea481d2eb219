"""The janitor: pending events past the retention expire; days past the window are dropped;
quarantined records past theirs are deleted.

The inbox is partitioned by day of arrival. A day is dropped whole once all of it is
older than retention + purge window (the dedupe window), so purging costs the same at any
volume and leaves no dead rows for vacuum. Days are also created ahead of need.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from matcher.config import Settings
from matcher.store.sql import query

log = logging.getLogger("matcher.janitor")

# How far ahead days are created: ingest must never meet a missing day, even when every
# janitor has been down for a while.
DAYS_AHEAD = timedelta(days=3)


async def ensure_days(conn: psycopg.AsyncConnection[tuple[Any, ...]]) -> int:
    """Create the inbox's days from today to DAYS_AHEAD; return how many were missing."""
    async with conn.transaction():
        cur = await conn.execute(query("janitor", "ensure_partitions"), {"ahead": DAYS_AHEAD})
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def drop_expired_days(settings: Settings) -> int:
    """Drop the days wholly past the dedupe window; return the rows they held."""
    keep = settings.inbox_retention + settings.inbox_purge_after
    url = settings.database_url.get_secret_value()
    purged = 0
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(query("janitor", "try_maintenance_lock"))
        locked = await cur.fetchone()
        if not (locked and locked[0]):
            return 0  # another daemon's janitor is at it
        try:
            cur = await conn.execute(query("janitor", "expired_days"), {"keep": keep})
            for name, detach_pending, starts, ends in await cur.fetchall():
                cur = await conn.execute(
                    query("janitor", "day_still_needed"), {"starts": starts, "ends": ends}
                )
                needed = await cur.fetchone()
                if needed and needed[0]:
                    log.warning(
                        "inbox day kept past the window: an unpublished resume needs it",
                        extra={"partition": name},
                    )
                    continue
                day = sql.Identifier("matcher", name)
                cur = await conn.execute(sql.SQL(query("janitor", "count_day")).format(day=day))
                counted = await cur.fetchone()
                detach = "finish_detach_day" if detach_pending else "detach_day"
                await conn.execute(sql.SQL(query("janitor", detach)).format(day=day))
                await conn.execute(sql.SQL(query("janitor", "drop_day")).format(day=day))
                purged += int(counted[0]) if counted else 0
                log.info("inbox day dropped", extra={"partition": name})
        finally:
            await conn.execute(query("janitor", "release_maintenance_lock"))
    return purged


async def _in_batches(conn: psycopg.AsyncConnection[Any], name: str, params: dict[str, Any]) -> int:
    """Run the janitor statement ``name`` until it touches fewer rows than its limit."""
    total = 0
    while True:
        async with conn.transaction():
            cur = await conn.execute(query("janitor", name), params)
            count = cur.rowcount
        total += count
        if count < params["limit"]:
            return total


async def tidy_once(
    pool: AsyncConnectionPool, settings: Settings, limit: int = 5000
) -> tuple[int, int]:
    """Expire in batches, purge old quarantine rows, create the coming days, drop the
    expired ones: (expired, purged inbox rows)."""
    async with pool.connection() as conn:
        expired = await _in_batches(
            conn, "expire_pending", {"retention": settings.inbox_retention, "limit": limit}
        )
        dropped = await _in_batches(
            conn, "purge_quarantine", {"retention": settings.quarantine_retention, "limit": limit}
        )
        if dropped:
            log.info("quarantine purged", extra={"records": dropped})
        await ensure_days(conn)
    return expired, await drop_expired_days(settings)


class Janitor:
    def __init__(self, settings: Settings, pool: AsyncConnectionPool, stop: asyncio.Event) -> None:
        self._settings = settings
        self._pool = pool
        self._stop = stop

    async def run(self) -> None:
        while not self._stop.is_set():
            try:
                expired, purged = await tidy_once(self._pool, self._settings)
                if expired or purged:
                    log.info("inbox tidied", extra={"expired": expired, "purged": purged})
            except psycopg.Error as exc:
                log.warning("janitor pass failed; retrying later", extra={"error": repr(exc)})
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self._settings.janitor_interval_s)
