"""The ingress's database, for callback URLs and refusal records only: a small pool, one
call per callback (``matcher.complete_callback_v1``) and one per batch of refusal records
(``matcher.record_refusals_v1``), every call bounded in time.

The pool opens in the background, so the ingress serves webhooks whether or not the
database is up; a callback that finds no connection in time is answered 503.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from psycopg import AsyncConnection, IsolationLevel
from psycopg_pool import AsyncConnectionPool

from matcher.config import IngressSettings
from matcher.ingress.callbacks import CallbackRequest
from matcher.store.callbacks import CallbackAnswer, complete_callback
from matcher.store.refusals import record_refusals

log = logging.getLogger("matcher.ingress")


async def _configure(conn: AsyncConnection) -> None:
    # The function needs READ COMMITTED, whatever the database's default.
    await conn.set_isolation_level(IsolationLevel.READ_COMMITTED)


class IngressDatabase:
    def __init__(self, settings: IngressSettings, conninfo: str) -> None:
        self._timeout_s = settings.ingress_database_timeout_s
        self._pool = AsyncConnectionPool(
            conninfo,
            min_size=1,
            max_size=settings.ingress_db_pool_max_size,
            open=False,
            configure=_configure,
            timeout=settings.ingress_database_timeout_s,
            name="ingress-database",
        )

    async def open(self) -> None:
        await self._pool.open(wait=False)

    async def close(self) -> None:
        await self._pool.close(timeout=5)

    async def complete(self, request: CallbackRequest) -> CallbackAnswer:
        """The database's answer; raises on a connection not found or a call not ended
        within the timeout (``TimeoutError``, psycopg's errors), and as
        ``complete_callback`` does."""
        async with asyncio.timeout(self._timeout_s), self._pool.connection() as conn:
            return await complete_callback(
                conn,
                request.token_sha256,
                request.data,
                request.event_type,
                request.trace_parent,
            )

    async def record_refusals(self, refused: list[dict[str, Any]]) -> int:
        async with asyncio.timeout(self._timeout_s), self._pool.connection() as conn:
            return await record_refusals(conn, refused)
