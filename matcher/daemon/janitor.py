"""The janitor loop: pending events expire, old quarantine rows go, inbox days are made
ahead and dropped past the dedupe window (matcher.store.maintenance does the work)."""

from __future__ import annotations

import asyncio
import logging

import psycopg
from psycopg_pool import AsyncConnectionPool

from matcher.config import Settings
from matcher.daemon.periodic import every
from matcher.store.maintenance import (
    drop_expired_days,
    ensure_days,
    expire_pending,
    purge_quarantine,
    purge_refusals,
)

log = logging.getLogger("matcher.janitor")


async def tidy_once(
    pool: AsyncConnectionPool, settings: Settings, limit: int = 5000
) -> tuple[int, int]:
    """Expire in batches, purge old quarantine rows, create the coming days, drop the
    expired ones: (expired, purged inbox rows)."""
    async with pool.connection() as conn:
        expired = await expire_pending(conn, settings.inbox_retention, limit)
        dropped = await purge_quarantine(conn, settings.quarantine_retention, limit)
        dropped += await purge_refusals(conn, settings.quarantine_retention, limit)
        if dropped:
            log.info("quarantine and refusal records purged", extra={"records": dropped})
        await ensure_days(conn)
    keep = settings.inbox_retention + settings.inbox_purge_after
    return expired, await drop_expired_days(settings.database_conninfo(), keep)


class Janitor:
    def __init__(self, settings: Settings, pool: AsyncConnectionPool, stop: asyncio.Event) -> None:
        self._settings = settings
        self._pool = pool
        self._stop = stop

    async def run(self) -> None:
        await every(
            self._settings.janitor_interval_s,
            self._stop,
            self._tidy,
            expected=(psycopg.Error,),
            log=log,
        )

    async def _tidy(self) -> None:
        expired, purged = await tidy_once(self._pool, self._settings)
        if expired or purged:
            log.info("inbox tidied", extra={"expired": expired, "purged": purged})
