"""Console sessions, server-side: a row per signed-in session (see migration 0018)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

from matcher.store.sql import query

AsyncConn = psycopg.AsyncConnection[Any]


async def open_session(conn: AsyncConn, session_id: bytes, expires_at: datetime) -> None:
    await conn.execute(
        query("console_sessions", "open_session"), {"id": session_id, "expires_at": expires_at}
    )


async def session_open(conn: AsyncConn, session_id: bytes) -> bool:
    cursor = await conn.execute(query("console_sessions", "session_open"), {"id": session_id})
    row = await cursor.fetchone()
    return bool(row and row[0])


async def close_session(conn: AsyncConn, session_id: bytes) -> None:
    await conn.execute(query("console_sessions", "close_session"), {"id": session_id})
