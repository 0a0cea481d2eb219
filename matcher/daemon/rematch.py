"""The rematch loop: newly registered waits, and keys ingest left busy, meet stored events.

Woken by NOTIFY matcher_match (sent when a wait is inserted and when ingest queues a
key), with ``MATCHER_REMATCH_INTERVAL_S`` as the safety net. See matcher.store.rematch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psycopg
from psycopg_pool import AsyncConnectionPool

from matcher import metrics
from matcher.config import Settings
from matcher.daemon.periodic import every
from matcher.faults import crash_point
from matcher.store.rematch import rematch_once

log = logging.getLogger("matcher.rematch")

_TRANSIENT = (
    psycopg.OperationalError,
    psycopg.errors.SerializationFailure,
    psycopg.errors.DeadlockDetected,
)


class Rematch:
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
        self._wake = asyncio.Event()

    def nudge(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        await every(
            self._settings.rematch_interval_s,
            self._stop,
            self._drain,
            expected=_TRANSIENT,
            log=log,
            wake=self._wake,
        )
        log.info("rematch stopped")

    async def _drain(self) -> None:
        limit = self._settings.rematch_batch_max
        while not self._stop.is_set():
            async with self._pool.connection() as conn:
                result = await rematch_once(
                    conn, limit, lambda: crash_point("rematch.in_transaction")
                )
            if result.matched:
                metrics.MATCHES.inc(result.matched)
                self._on_resolved()
            metrics.LATE_EVENTS.inc(result.late)
            if result.keys < limit:
                return
