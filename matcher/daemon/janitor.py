"""The janitor: pending events past the retention expire; old rows are purged."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import psycopg
from psycopg_pool import AsyncConnectionPool

from matcher.config import Settings
from matcher.store.sql import query

log = logging.getLogger("matcher.janitor")


async def tidy_once(
    pool: AsyncConnectionPool, settings: Settings, limit: int = 5000
) -> tuple[int, int]:
    """Expire and purge in batches; return (expired, purged)."""
    expired = purged = 0
    params = {
        "retention": settings.inbox_retention,
        "keep": settings.inbox_retention + settings.inbox_purge_after,
        "purge_after": settings.inbox_purge_after,
        "limit": limit,
    }
    async with pool.connection() as conn:
        for name in ("expire_pending", "purge_inbox"):
            while True:
                async with conn.transaction():
                    cur = await conn.execute(query("janitor", name), params)
                    count = cur.rowcount
                if name == "expire_pending":
                    expired += count
                else:
                    purged += count
                if count < limit:
                    break
    return expired, purged


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
