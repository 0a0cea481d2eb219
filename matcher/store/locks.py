"""Named locks held for the rest of a transaction: what serialises work that no single
row stands for (the resumes of one LangGraph thread, the first submission of a launch)."""

from __future__ import annotations

from matcher.store.sql import query
from matcher.store.worker_api import AsyncConn, Conn


def hold(conn: Conn, name: str) -> None:
    """Wait for, then hold, the lock called ``name`` until the caller's transaction ends.
    Outside a transaction the lock would end with the statement: call it inside one."""
    conn.execute(query("locks", "hold"), {"name": name})


async def hold_async(conn: AsyncConn, name: str) -> None:
    """``hold`` for asyncio callers."""
    await conn.execute(query("locks", "hold"), {"name": name})
