"""Upkeep of the inbox and the quarantine: expiry, day partitions, retention.

The inbox is partitioned by day of arrival. A day is dropped whole once all of it is
older than retention + purge window (the dedupe window), so purging the events leaves no
dead rows for vacuum. Their ids (matcher.event_ids, one row per event across all days,
which keeps (producer, event id) unique) are deleted first, in bounded batches: that
narrow table is the one vacuum works on. Days are also created ahead of need. The
janitor loop (matcher.daemon.janitor) calls these; ingest calls ``ensure_days`` when it
meets a missing day.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

from matcher.store.sql import query

log = logging.getLogger("matcher.janitor")

# How far ahead days are created: ingest must never meet a missing day, even when every
# janitor has been down for a while.
DAYS_AHEAD = timedelta(days=3)

AsyncConn = psycopg.AsyncConnection[Any]


async def ensure_days(conn: AsyncConn) -> int:
    """Create the inbox's days from today to DAYS_AHEAD; return how many were missing."""
    async with conn.transaction():
        cur = await conn.execute(query("maintenance", "ensure_partitions"), {"ahead": DAYS_AHEAD})
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def _in_batches(conn: AsyncConn, name: str, params: dict[str, Any]) -> int:
    """Run the statement ``name`` until it touches fewer rows than its limit."""
    total = 0
    while True:
        async with conn.transaction():
            cur = await conn.execute(query("maintenance", name), params)
            count = cur.rowcount
        total += count
        if count < params["limit"]:
            return total


async def expire_pending(conn: AsyncConn, retention: timedelta, limit: int = 5000) -> int:
    """Pending events past ``retention`` stop being candidates for new waits."""
    return await _in_batches(conn, "expire_pending", {"retention": retention, "limit": limit})


async def purge_quarantine(conn: AsyncConn, retention: timedelta, limit: int = 5000) -> int:
    """Quarantined records older than ``retention`` are deleted, oldest first."""
    return await _in_batches(conn, "purge_quarantine", {"retention": retention, "limit": limit})


async def purge_refusals(conn: AsyncConn, retention: timedelta, limit: int = 5000) -> int:
    """The ingress's refusal records older than ``retention`` are deleted, oldest first."""
    return await _in_batches(conn, "purge_refusals", {"retention": retention, "limit": limit})


async def drop_expired_days(url: str, keep: timedelta) -> int:
    """Drop the days wholly older than ``keep``; return the rows they held.

    Its own autocommit connection: DETACH ... CONCURRENTLY cannot run in a transaction.
    One janitor at a time (a session lock); a day an unpublished resume still reads is kept.
    """
    purged = 0
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(query("maintenance", "try_maintenance_lock"))
        locked = await cur.fetchone()
        if not (locked and locked[0]):
            return 0  # another daemon's janitor is at it
        try:
            cur = await conn.execute(query("maintenance", "expired_days"), {"keep": keep})
            for name, detach_pending, starts, ends in await cur.fetchall():
                purged += await _drop_day(conn, name, detach_pending, starts, ends)
        finally:
            await conn.execute(query("maintenance", "release_maintenance_lock"))
    return purged


async def _drop_day(
    conn: AsyncConn, name: str, detach_pending: bool, starts: Any, ends: Any
) -> int:
    cur = await conn.execute(
        query("maintenance", "day_still_needed"), {"starts": starts, "ends": ends}
    )
    needed = await cur.fetchone()
    if needed and needed[0]:
        log.warning(
            "inbox day kept past the window: an unpublished resume needs it",
            extra={"partition": name},
        )
        return 0
    day = sql.Identifier("matcher", name)
    cur = await conn.execute(sql.SQL(query("maintenance", "count_day")).format(day=day))
    counted = await cur.fetchone()
    await _forget_day_ids(conn, day, starts, ends)
    detach = "finish_detach_day" if detach_pending else "detach_day"
    await conn.execute(sql.SQL(query("maintenance", detach)).format(day=day))
    await conn.execute(sql.SQL(query("maintenance", "drop_day")).format(day=day))
    log.info("inbox day dropped", extra={"partition": name})
    return int(counted[0]) if counted else 0


async def _forget_day_ids(
    conn: AsyncConn, day: sql.Identifier, starts: Any, ends: Any, limit: int = 5000
) -> int:
    """Delete the day's rows of matcher.event_ids, ``limit`` at a time (each batch its own
    transaction, so the delete never holds many locks or one long snapshot); return how
    many were deleted.

    Done while the day is still attached: a janitor interrupted here finds the day again
    next time and carries on (deleting is idempotent). The keyset starts below every
    pair: the gate refuses an empty source or id.
    """
    statement = sql.SQL(query("maintenance", "forget_day_ids")).format(day=day)
    after = ("", "")
    forgotten = 0
    while True:
        cur = await conn.execute(
            statement,
            {
                "after_producer": after[0],
                "after_event_id": after[1],
                "limit": limit,
                "starts": starts,
                "ends": ends,
            },
        )
        row = await cur.fetchone()
        if row is None:
            return forgotten
        after = (row[0], row[1])
        forgotten += int(row[3])
        if row[2] < limit:
            return forgotten
