"""Runs as the worker API advances them (``matcher.runs``)."""

from __future__ import annotations

from psycopg.rows import tuple_row

from matcher.store.sql import query
from matcher.store.worker_api import AsyncConn, Conn


def position(conn: Conn, tenant: str, run_id: str) -> int | None:
    """The position a run was advanced to; None when no resume of it was advanced yet."""
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(
            query("runs", "position_of"), {"tenant": tenant, "run_id": run_id}
        ).fetchone()
    return None if row is None else int(row[0])


async def position_async(conn: AsyncConn, tenant: str, run_id: str) -> int | None:
    """``position`` for asyncio callers."""
    async with conn.cursor(row_factory=tuple_row) as cur:
        await cur.execute(query("runs", "position_of"), {"tenant": tenant, "run_id": run_id})
        row = await cur.fetchone()
    return None if row is None else int(row[0])
