"""The rematch pass: queued keys get the look at stored events that registration skipped.

A wait is registered without any lock (see migration 0010): its insert queues its key,
and this pass, in a transaction of its own after the wait committed, takes the key's
advisory lock (ingest's), then matches the key's waiting waits with its pending events
by the rules of ``matcher.domain.matching`` (oldest event first, each event one wait).
Ingest also queues keys whose waits another transaction held locked, and keys where two
or more events of one batch found waiting waits (their order decides which takes which:
see migration 0016). A key whose waits are still held is queued again, a little later;
nothing here waits on a transaction that is not the daemon's own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from matcher.domain.matching import (
    InboxStatus,
    Key,
    NewEvent,
    Placement,
    WaitView,
    decide_batch,
)
from matcher.domain.waits import WaitState
from matcher.store.ingest import AsyncConn
from matcher.store.pipelined import pipelined_transaction
from matcher.store.sql import query

# How soon a key whose waits were held by another transaction is looked at again.
BUSY_RETRY_S = 0.5


@dataclass(frozen=True)
class RematchResult:
    keys: int = 0
    matched: int = 0
    late: int = 0
    busy: int = 0


def wait_views(
    rows: list[tuple[Any, ...]],
) -> tuple[list[WaitView], set[Key], dict[UUID, int]]:
    """The rows of ``waits_for_keys`` as views, the keys of the busy ones (locked by
    another transaction: their matching is left to the rematch loop), and how many more
    conditions each fan-in wait of theirs needs."""
    views: list[WaitView] = []
    busy: set[Key] = set()
    needs: dict[UUID, int] = {}
    for row in rows:
        view = WaitView(
            id=row[0],
            tenant=row[1],
            correlation_id=row[2],
            event_types=frozenset(row[3]),
            state=WaitState(row[4]),
            created_at=row[5],
            resolved_at=row[6],
            progress_types=frozenset(row[8]),
            group_id=row[9],
        )
        views.append(view)
        if row[7]:
            busy.add(view.key)
        elif row[9] is not None and row[10] is not None:
            needs[row[9]] = row[10]
    return views, busy, needs


def key_arrays(keys: Iterable[Key]) -> dict[str, list[str]]:
    pairs = list(keys)
    return {"tenant": [t for t, _ in pairs], "correlation_id": [c for _, c in pairs]}


async def queue_for_rematch(conn: AsyncConn, keys: Iterable[Key], after_s: float = 0.0) -> None:
    """Leave ``keys`` to the rematch loop (it is woken when the caller commits)."""
    params: dict[str, Any] = key_arrays(keys)
    if params["tenant"]:
        await conn.execute(
            query("rematch", "queue_keys"), params | {"after": timedelta(seconds=after_s)}
        )


async def resolve_by_events(
    conn: AsyncConn, resolutions: Sequence[Placement], received_at: Sequence[datetime | None]
) -> Any:
    """Resolve the waits of ``resolutions`` (outbox rows included; the relay is woken at
    commit); the caller checks the count the returned cursor yields, once its pipeline
    has synced."""
    return await conn.execute(
        query("rematch", "resolve_by_events"),
        {
            "wait_id": [p.wait_id for p in resolutions],
            "producer": [p.event.producer for p in resolutions],
            "event_id": [p.event.event_id for p in resolutions],
            "received_at": list(received_at),
        },
    )


async def check_resolved(cur: Any, expected: int) -> None:
    row = await cur.fetchone()
    resolved = row[0] if row else 0
    # The waits were locked by this transaction and seen waiting: all must resolve.
    if resolved != expected:
        raise RuntimeError(f"resolved {resolved} of {expected} waits under lock: a bug")


def _pending(rows: list[tuple[Any, ...]]) -> list[NewEvent]:
    # payload: the event's received_at, the rest of its inbox key
    return [
        NewEvent(r[0], r[1], r[2], r[3], r[4], payload=r[5], refused_by=frozenset(r[6]))
        for r in rows
    ]


async def rematch_once(
    conn: AsyncConn, limit: int = 500, before_commit: Callable[[], None] | None = None
) -> RematchResult:
    """Take up to ``limit`` due keys off the queue and match them, in one transaction.

    ``before_commit`` runs inside the transaction of a pass that found keys, after every
    write was sent (a test crash point)."""
    # Round trips: claim (with BEGIN), read, then the writes if any need checking, and
    # COMMIT: four, three when nothing was resolved or settled, two with no keys.
    async with pipelined_transaction(conn) as pipeline:
        cur = await conn.execute(query("rematch", "claim_keys"), {"limit": limit})
        await pipeline.sync()
        keys: set[Key] = {(row[0], row[1]) for row in await cur.fetchall()}
        if not keys:
            return RematchResult()
        params = key_arrays(sorted(keys))
        await conn.execute(query("rematch", "lock_wait_keys"), params)
        waits_cur = await conn.execute(query("rematch", "waits_for_keys"), params)
        pending_cur = await conn.execute(query("rematch", "pending_for_keys"), params)
        await pipeline.sync()
        waits, busy, needs = wait_views(await waits_cur.fetchall())
        events = _pending(await pending_cur.fetchall())
        # Stored already, so none is a duplicate; busy keys are decided next time.
        decision = decide_batch(events, (), waits, deferred=busy, needs=needs)
        settled = [p for p in decision.placements if p.status is not InboxStatus.PENDING]
        resolutions = decision.resolutions
        resolve_cur = None
        if resolutions:
            resolve_cur = await resolve_by_events(
                conn, resolutions, [p.event.payload for p in resolutions]
            )
        settle_cur = None
        if settled:
            settle_cur = await conn.execute(query("rematch", "settle_pending"), _settle(settled))
        if decision.progress:
            await conn.execute(
                query("rematch", "extend_heartbeats"),
                {
                    "wait_id": [p.wait_id for p in decision.progress],
                    "received_at": [p.event.payload for p in decision.progress],
                },
            )
        await queue_for_rematch(conn, busy, after_s=BUSY_RETRY_S)
        if before_commit is not None:
            before_commit()
        if resolve_cur is None and settle_cur is None:
            return RematchResult(keys=len(keys), busy=len(busy))  # the writes go with COMMIT
        # Their counts are checked before COMMIT, so that a mismatch rolls back.
        await pipeline.sync()
        if resolve_cur is not None:
            await check_resolved(resolve_cur, len(resolutions))
        if settle_cur is not None and len(await settle_cur.fetchall()) != len(settled):
            raise RuntimeError("a pending event changed under its lock: a bug")
    return RematchResult(
        keys=len(keys),
        matched=len(resolutions),
        late=len(settled) - len(resolutions) - len(decision.progress),
        busy=len(busy),
    )


def _settle(placements: list[Placement]) -> dict[str, list[Any]]:
    received: list[datetime] = [p.event.payload for p in placements]
    consumed = [p.status is InboxStatus.CONSUMED for p in placements]
    late = [p.status is InboxStatus.LATE for p in placements]
    return {
        "producer": [p.event.producer for p in placements],
        "event_id": [p.event.event_id for p in placements],
        "received_at": received,
        "status": [p.status.value for p in placements],
        "consumed_by": [
            p.wait_id if c else None for p, c in zip(placements, consumed, strict=True)
        ],
        "late_for": [p.wait_id if x else None for p, x in zip(placements, late, strict=True)],
        "progress_for": [
            p.wait_id if p.status is InboxStatus.PROGRESS else None for p in placements
        ],
    }
