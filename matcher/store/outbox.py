"""The outbox, from the relay's side: claim the oldest unpublished resolutions (each with
its resume message) and mark them published.

Rows are written by ``matcher.resolve_waits`` alone (migration 0012), in the transaction
that resolves their waits; its statement trigger wakes the relay (NOTIFY). Claim and mark
run in one transaction of the relay's, around the publication: a crash in between leaves
the rows unpublished and they are published again (at-least-once; ``advance`` makes the
duplicate a no-op).
"""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

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
    """Lock up to ``limit`` unpublished rows (skipping rows another relay holds), oldest
    first. In a pipelined transaction (matcher.store.pipelined): BEGIN travels with the
    claim, COMMIT with the mark, so a batch costs two round trips."""
    await cur.execute(query("outbox", "claim_unpublished"), {"limit": limit})
    await pipeline.sync()
    return await cur.fetchall()


async def mark_published(cur: psycopg.AsyncCursor[Any], rows: list[Claimed]) -> None:
    """Mark ``rows`` published, each with the digest of the message as sent (verify_resume
    checks a resume against it once the message can no longer be rebuilt).

    Planned at every call, never prepared: the relay's pooled connections live up to an
    hour, and a plan kept from their first marks, made while the outbox was near empty,
    read the whole outbox for every batch once it had grown (until an ANALYZE; a fifth
    of Postgres' CPU at 2,000 events/s on a new database). Planning costs about 0.08 ms
    a call; that scan cost 0.9 ms a call at 10,000 rows, and grows with the outbox."""
    await cur.execute(
        query("outbox", "mark_published"),
        {
            "ids": [r.id for r in rows],
            "digests": [hashlib.sha256(r.message.encode()).digest() for r in rows],
        },
        prepare=False,
    )
