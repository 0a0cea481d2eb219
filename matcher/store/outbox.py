"""The resume queue, from the relay's side: claim the oldest queued resumes, each with its
message.

Rows are written by ``matcher.resolve_waits`` alone, in the transaction that resolves
their waits; its statement trigger wakes the relay (NOTIFY). The claim deletes them, in a
transaction of the relay's that commits only after Kafka has acknowledged them: the
delete is the mark (migration 0026). A crash or a rollback before the commit leaves them
queued and they are published again (at-least-once; ``advance`` makes the duplicate a
no-op).
"""

from __future__ import annotations

from typing import NamedTuple

import psycopg

from matcher.store.sql import query


class Claimed(NamedTuple):
    """A row of ``claim_unpublished``, in its column order."""

    id: int
    run_id: str
    outcome: str
    waited_s: float
    received_epoch: float | None  # None unless an event resolved the wait
    message: str  # the resume CloudEvent's JSON


ClaimCursor = psycopg.AsyncCursor[Claimed]


async def claim_unpublished(
    cur: ClaimCursor, pipeline: psycopg.AsyncPipeline, limit: int
) -> list[Claimed]:
    """Delete up to ``limit`` queued rows (skipping rows another relay holds), oldest first,
    returning their messages. In a pipelined transaction (matcher.store.pipelined): BEGIN
    travels with the claim, and the COMMIT, sent once Kafka has acknowledged the messages,
    is the mark; a batch costs two round trips.

    Planned at every call, never prepared: the relay's pooled connections live up to an
    hour, and a plan kept from their first claims, made while the tables were near empty,
    would read every wait for each batch once they had grown (planning costs about
    0.1 ms a call)."""
    await cur.execute(query("outbox", "claim_unpublished"), {"limit": limit}, prepare=False)
    await pipeline.sync()
    return await cur.fetchall()
