"""One Postgres transaction per Kafka batch: inbox, matching, outbox, quarantine.

The statements are set-based (arrays in, ``unnest`` in SQL) and pipelined, so a batch of
any size costs two round trips and a commit, not one per event. The decision of what each
event does is ``matcher.domain.matching.decide_batch``; this module only reads the facts
it needs and writes what it decided.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from matcher.domain.events import CompletionEvent, Rejection
from matcher.domain.matching import (
    BatchDecision,
    InboxStatus,
    Key,
    NewEvent,
    Placement,
    WaitView,
    decide_batch,
)
from matcher.domain.waits import WaitState
from matcher.store.isolation import read_committed
from matcher.store.quarantine_rows import (
    MAX_DETAIL,
    Bounds,
    Header,
    bounded,
    storable_text,
)
from matcher.store.sql import query

DEFAULT_BOUNDS = Bounds()
AsyncConn = psycopg.AsyncConnection[tuple[Any, ...]]

log = logging.getLogger("matcher.ingest")


@dataclass(frozen=True)
class IngestRecord:
    """One record of a batch, where it was read, and what the gate made of it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    parsed: CompletionEvent | Rejection
    arrived_at: datetime | None = None  # what freshness was judged against


@dataclass
class BatchResult:
    accepted: int = 0
    duplicates: int = 0
    matched: int = 0
    late: int = 0
    pending: int = 0
    quarantined: int = 0
    # The records quarantined, with their rejections (the gate's, or the database's).
    rejected: list[IngestRecord] = field(default_factory=list)

    def __add__(self, other: BatchResult) -> BatchResult:
        return BatchResult(
            *(getattr(self, f.name) + getattr(other, f.name) for f in fields(BatchResult))
        )


class ConcurrentInsert(Exception):
    """Fewer rows were stored than decided: another transaction stored one of our events
    between our check and our insert.

    Claiming the ids first (matcher.event_ids) makes this impossible; it stays as a guard
    (the batch is retried, and the event is then seen as the duplicate it is) rather than
    a silent assumption.
    """


def _new_events(records: Sequence[IngestRecord]) -> list[NewEvent]:
    events: list[NewEvent] = []
    for record in records:
        if isinstance(record.parsed, CompletionEvent):
            e = record.parsed
            events.append(NewEvent(e.source, e.id, e.tenant, e.type, e.correlationid, record))
    return events


def wait_views(rows: list[tuple[Any, ...]]) -> tuple[list[WaitView], set[Key]]:
    """The rows of ``waits_for_keys`` as views, and the keys of the busy ones (locked by
    another transaction: their matching is left to the rematch loop)."""
    views: list[WaitView] = []
    busy: set[Key] = set()
    for row in rows:
        view = WaitView(
            id=row[0],
            tenant=row[1],
            correlation_id=row[2],
            event_types=frozenset(row[3]),
            state=WaitState(row[4]),
            created_at=row[5],
            resolved_at=row[6],
        )
        views.append(view)
        if row[7]:
            busy.add(view.key)
    return views, busy


def key_arrays(keys: Iterable[Key]) -> dict[str, list[str]]:
    pairs = list(keys)
    return {"tenant": [t for t, _ in pairs], "correlation_id": [c for _, c in pairs]}


async def queue_for_rematch(conn: AsyncConn, keys: Iterable[Key], after_s: float = 0.0) -> None:
    """Leave ``keys`` to the rematch loop (it is woken when the caller commits)."""
    params: dict[str, Any] = key_arrays(keys)
    if params["tenant"]:
        await conn.execute(
            query("ingest", "queue_keys"), params | {"after": timedelta(seconds=after_s)}
        )


async def resolve_by_events(
    conn: AsyncConn, resolutions: Sequence[Placement], received_at: Sequence[datetime | None]
) -> Any:
    """Resolve the waits of ``resolutions`` (outbox rows included; the relay is woken at
    commit); the caller checks the count the returned cursor yields, once its pipeline
    has synced."""
    return await conn.execute(
        query("ingest", "resolve_by_events"),
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


def _inbox_params(decision: BatchDecision) -> dict[str, list[Any]]:
    columns: dict[str, list[Any]] = {
        name: []
        for name in (
            "producer event_id tenant type correlation_id external_job_id occurred_at topic "
            "partition offset data status consumed_by late_for"
        ).split()
    }
    for placement in decision.placements:
        record: IngestRecord = placement.event.payload
        event = record.parsed
        assert isinstance(event, CompletionEvent)
        columns["producer"].append(event.source)
        columns["event_id"].append(event.id)
        columns["tenant"].append(event.tenant)
        columns["type"].append(event.type)
        columns["correlation_id"].append(event.correlationid)
        columns["external_job_id"].append(event.jobid)
        columns["occurred_at"].append(event.time)
        columns["topic"].append(record.topic)
        columns["partition"].append(record.partition)
        columns["offset"].append(record.offset)
        columns["data"].append(Jsonb(event.data))
        columns["status"].append(placement.status.value)
        consumed = placement.status is InboxStatus.CONSUMED
        columns["consumed_by"].append(placement.wait_id if consumed else None)
        columns["late_for"].append(None if consumed else placement.wait_id)
    return columns


def _quarantine_params(records: Sequence[IngestRecord], bounds: Bounds) -> dict[str, list[Any]]:
    columns: dict[str, list[Any]] = {
        name: []
        for name in (
            "topic partition offset key value headers reason detail producer event_id tenant "
            "type correlation_id arrived_at size sha256 truncated"
        ).split()
    }
    for record in records:
        rejection = record.parsed
        assert isinstance(rejection, Rejection)
        kept = bounded(record.key, record.headers, record.value, bounds)
        columns["topic"].append(record.topic)
        columns["partition"].append(record.partition)
        columns["offset"].append(record.offset)
        columns["key"].append(kept.key)
        columns["value"].append(kept.value)
        columns["headers"].append(Jsonb(kept.headers))
        columns["reason"].append(rejection.reason)
        columns["detail"].append(storable_text(rejection.detail, MAX_DETAIL))
        for name in ("producer", "event_id", "tenant", "type", "correlation_id"):
            columns[name].append(storable_text(rejection.seen.get(name)))
        columns["arrived_at"].append(record.arrived_at)
        columns["size"].append(kept.size)
        columns["sha256"].append(kept.sha256)
        columns["truncated"].append(kept.truncated)
    return columns


async def store_batch(
    conn: AsyncConn,
    records: Sequence[IngestRecord],
    before_commit: Callable[[], None] | None = None,
    bounds: Bounds = DEFAULT_BOUNDS,
) -> BatchResult:
    """Store one batch in one transaction (the caller's connection, not in a transaction).

    ``before_commit`` runs inside the transaction, after every write (a test crash point).
    """
    await read_committed(conn)
    events = _new_events(records)
    rejected = [r for r in records if isinstance(r.parsed, Rejection)]
    result = BatchResult(quarantined=len(rejected), rejected=rejected)
    # One pipeline for the whole transaction: BEGIN travels with the reads, so a batch
    # costs two round trips and the commit. (COMMIT cannot join the writes: the counts
    # they return are checked first, and a mismatch must roll back.)
    async with conn.pipeline() as pipeline, conn.transaction():
        if events:
            decided = await _decide(conn, pipeline, events)
            await _write(conn, pipeline, decided, rejected, bounds)
            _count(decided, result)
        elif rejected:
            await conn.execute(query("ingest", "quarantine"), _quarantine_params(rejected, bounds))
        if before_commit is not None:
            before_commit()
    return result


@dataclass(frozen=True)
class _Decided:
    decision: BatchDecision
    busy: set[Key]  # keys to queue for the rematch loop (not queued yet)


async def _decide(conn: AsyncConn, pipeline: Any, events: list[NewEvent]) -> _Decided:
    """Lock the batch's keys, read what bears on them, and decide (one round trip)."""
    keys = {
        "tenant": [e.tenant for e in events],
        "correlation_id": [e.correlation_id for e in events],
    }
    ids = {
        "producer": [e.producer for e in events],
        "event_id": [e.event_id for e in events],
    }
    await conn.execute(query("ingest", "lock_wait_keys"), keys)
    claimed_cur = await conn.execute(query("ingest", "claim_event_ids"), ids)
    waits_cur = await conn.execute(query("ingest", "waits_for_keys"), keys)
    queued_cur = await conn.execute(query("ingest", "queued_keys"), keys)
    await pipeline.sync()
    claimed = {(row[0], row[1]) for row in await claimed_cur.fetchall()}
    # Every id of the batch not claimed now was stored before: a duplicate.
    stored = {e.event_key for e in events} - claimed
    waits, busy = wait_views(await waits_cur.fetchall())
    queued = {(row[0], row[1]) for row in await queued_cur.fetchall()}
    decision = decide_batch(events, stored, waits, deferred=busy | queued)
    return _Decided(decision, busy - queued)


async def _write(
    conn: AsyncConn,
    pipeline: Any,
    decided: _Decided,
    rejected: list[IngestRecord],
    bounds: Bounds,
) -> None:
    """Write what was decided and check it (the second round trip)."""
    decision = decided.decision
    insert_cur = None
    if decision.placements:
        insert_cur = await conn.execute(query("ingest", "insert_inbox"), _inbox_params(decision))
    resolutions = decision.resolutions
    resolve_cur = None
    if resolutions:
        resolve_cur = await resolve_by_events(conn, resolutions, [None] * len(resolutions))
    await queue_for_rematch(conn, decided.busy)
    if rejected:
        await conn.execute(query("ingest", "quarantine"), _quarantine_params(rejected, bounds))
    await pipeline.sync()
    inserted = len(await insert_cur.fetchall()) if insert_cur is not None else 0
    if inserted != len(decision.placements):
        raise ConcurrentInsert(f"expected {len(decision.placements)}, stored {inserted}")
    if resolve_cur is not None:
        await check_resolved(resolve_cur, len(resolutions))


def _count(decided: _Decided, result: BatchResult) -> None:
    decision = decided.decision
    result.duplicates = len(decision.duplicates)
    for placement in decision.placements:
        if placement.status is InboxStatus.CONSUMED:
            result.matched += 1
        elif placement.status is InboxStatus.LATE:
            result.late += 1
        else:
            result.pending += 1
    result.accepted = len(decision.placements)
