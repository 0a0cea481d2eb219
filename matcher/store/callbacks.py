"""Completing a wait by its callback token (``matcher.complete_callback_v1``): the
ingress's one database call. Every decision is made in Postgres, in one transaction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb

from matcher.store.sql import query
from matcher.store.worker_api import INVALID, AsyncConn

# The wait's row is held by another transaction (a worker cancelling it, the sweeper):
# the function does not wait for it while it holds the key's lock. Try again.
LOCK_NOT_AVAILABLE = "55P03"


class CallbackBusy(Exception):
    """The wait is being changed by another transaction: nothing was stored; try again."""


class CallbackTypeRefused(ValueError):
    """The wait does not accept the event type asked for: nothing was stored."""


@dataclass(frozen=True)
class CallbackAnswer:
    """``status``: unknown, accepted, duplicate, resolved or late (see the migration);
    ``outcome``: the wait's state and resolution now (None for unknown)."""

    status: str
    outcome: dict[str, Any] | None


async def complete_callback(
    conn: AsyncConn,
    token_sha256: bytes,
    data: Any,
    event_type: str | None,
    trace_parent: str | None,
) -> CallbackAnswer:
    """Complete the wait whose token has this digest, in one transaction of its own (the
    function needs READ COMMITTED: the caller's connection must not be in a transaction)."""
    params = {
        "token_sha256": token_sha256,
        "data": Jsonb(data),
        "event_type": event_type,
        "trace_parent": trace_parent,
    }
    try:
        async with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
            await cur.execute(query("callbacks", "complete_callback"), params)
            row = await cur.fetchone()
    except psycopg.Error as exc:
        if exc.sqlstate == LOCK_NOT_AVAILABLE:
            raise CallbackBusy("the wait is held by another transaction") from exc
        if exc.sqlstate == INVALID:
            raise CallbackTypeRefused("the wait does not accept this event type") from exc
        raise
    assert row is not None
    answer: dict[str, Any] = row[0]
    return CallbackAnswer(str(answer["status"]), answer.get("outcome"))
