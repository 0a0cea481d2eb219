"""Agent runs parked on deferred tool calls (``matcher.agent_runs``), for the agent
framework integrations. Every call runs in the caller's transaction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from matcher.store.sql import query
from matcher.store.worker_api import AsyncConn


@dataclass(frozen=True)
class AgentRun:
    history: Any
    pending: dict[str, str]  # tool call id -> wait id
    results: dict[str, Any]  # tool call id -> resume (as JSON)
    output: Any
    state: str


async def park(
    conn: AsyncConn, tenant: str, conversation: str, history: Any, pending: dict[str, str]
) -> None:
    """Store the run's history and the calls it now waits for (results start empty)."""
    await conn.execute(
        query("agent_runs", "park"),
        {"tenant": tenant, "conversation": conversation, "history": Jsonb(history),
         "pending": Jsonb(pending)},
    )  # fmt: skip


async def get(conn: AsyncConn, tenant: str, conversation: str) -> AgentRun | None:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            query("agent_runs", "get"), {"tenant": tenant, "conversation": conversation}
        )
        row = await cur.fetchone()
    return None if row is None else AgentRun(**row)


async def add_result(
    conn: AsyncConn, tenant: str, conversation: str, call: str, result: Any
) -> None:
    await conn.execute(
        query("agent_runs", "add_result"),
        {"tenant": tenant, "conversation": conversation, "call": call, "result": Jsonb(result)},
    )


async def finish(
    conn: AsyncConn, tenant: str, conversation: str, history: Any, output: Any
) -> None:
    await conn.execute(
        query("agent_runs", "finish"),
        {"tenant": tenant, "conversation": conversation, "history": Jsonb(history),
         "output": Jsonb(output)},
    )  # fmt: skip
