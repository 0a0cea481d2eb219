"""The deadline sweeper: waiting waits past their deadline, or whose heartbeat came due,
are timed out, in batches."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psycopg
from psycopg_pool import AsyncConnectionPool

from matcher.config import Settings
from matcher.daemon.periodic import every
from matcher.faults import crash_point
from matcher.metrics import HEARTBEATS_MISSED, TIMEOUTS
from matcher.store.waits import time_out_due

log = logging.getLogger("matcher.sweeper")


async def sweep_once(pool: AsyncConnectionPool, limit: int) -> int:
    """Time out up to ``limit`` due waits in one transaction; return how many."""
    async with pool.connection() as conn, conn.transaction():
        by_deadline, by_heartbeat = await time_out_due(conn, limit)
        crash_point("sweeper.in_transaction")
    if by_heartbeat:
        HEARTBEATS_MISSED.inc(by_heartbeat)
    return by_deadline + by_heartbeat


class Sweeper:
    def __init__(
        self,
        settings: Settings,
        pool: AsyncConnectionPool,
        stop: asyncio.Event,
        on_resolved: Callable[[], None],
    ) -> None:
        self._settings = settings
        self._pool = pool
        self._stop = stop
        self._on_resolved = on_resolved
        self.timed_out = 0

    async def run(self) -> None:
        await every(
            self._settings.sweep_interval_s,
            self._stop,
            self._sweep,
            expected=(psycopg.Error,),
            log=log,
        )
        log.info("sweeper stopped", extra={"timed_out": self.timed_out})

    async def _sweep(self) -> None:
        """Every wait due now, a batch at a time."""
        limit = self._settings.sweep_batch_max
        while (count := await sweep_once(self._pool, limit)) > 0:
            self.timed_out += count
            TIMEOUTS.inc(count)
            self._on_resolved()
            if count < limit:
                return
