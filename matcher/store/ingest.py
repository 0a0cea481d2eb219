"""One Postgres transaction per Kafka batch: inbox, matching, outbox, quarantine.

A batch is one call of ``matcher.ingest_events`` (migration 0016), with the batch's
quarantine rows beside it: one implicit transaction, one round trip, whatever the
batch's size. The function decides what each event does by the rules of
``matcher.domain.matching.decide_batch`` (it defers to the rematch loop the keys where
those rules need events taken one at a time); this module only hands it the batch.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb

from matcher.domain.events import CompletionEvent, Rejection
from matcher.domain.quarantine import (
    MAX_DETAIL,
    QuarantineLimits,
    kept_of,
    storable_text,
    summary_text,
)
from matcher.domain.records import IngestRecord
from matcher.domain.trace_context import trace_parent
from matcher.store.pipelined import one_round_trip
from matcher.store.sql import query

DEFAULT_LIMITS = QuarantineLimits()
AsyncConn = psycopg.AsyncConnection[tuple[Any, ...]]

log = logging.getLogger("matcher.ingest")


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


_EVENT_COLUMNS = (
    "producer event_id tenant type correlation_id external_job_id occurred_at topic "
    "partition offset data trace_parent"
).split()


def _event_params(records: Sequence[IngestRecord]) -> dict[str, list[Any]]:
    """The batch's events as the columns of ``ingest_events``, in arrival order."""
    columns: dict[str, list[Any]] = {name: [] for name in _EVENT_COLUMNS}
    for record in records:
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
        columns["trace_parent"].append(trace_parent(record.headers))
    return columns


def _quarantine_params(
    records: Sequence[IngestRecord], limits: QuarantineLimits
) -> dict[str, list[Any]]:
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
        kept = kept_of(record.key, record.headers, record.value, limits)
        columns["topic"].append(record.topic)
        columns["partition"].append(record.partition)
        columns["offset"].append(record.offset)
        columns["key"].append(kept.key)
        columns["value"].append(kept.value)
        columns["headers"].append(Jsonb(kept.headers))
        columns["reason"].append(rejection.reason)
        columns["detail"].append(storable_text(rejection.detail, MAX_DETAIL))
        for name in ("producer", "event_id", "tenant", "type", "correlation_id"):
            columns[name].append(summary_text(rejection.seen.get(name)))
        columns["arrived_at"].append(record.arrived_at)
        columns["size"].append(kept.size)
        columns["sha256"].append(kept.sha256)
        columns["truncated"].append(kept.truncated)
    return columns


async def store_batch(
    conn: AsyncConn,
    records: Sequence[IngestRecord],
    before_commit: Callable[[], None] | None = None,
    limits: QuarantineLimits = DEFAULT_LIMITS,
) -> BatchResult:
    """Store one batch: in one transaction of its own on an idle connection, or in the
    caller's transaction if the connection is in one (a quarantine replay).

    ``before_commit`` runs inside the transaction, after every write was sent (a test
    crash point).
    """
    events = [r for r in records if isinstance(r.parsed, CompletionEvent)]
    rejected = [r for r in records if isinstance(r.parsed, Rejection)]
    result = BatchResult(quarantined=len(rejected), rejected=rejected)
    counts = None
    async with _one_transaction(conn):
        if events:
            counts = await conn.execute(query("ingest", "ingest_events"), _event_params(events))
        if rejected:
            await conn.execute(query("ingest", "quarantine"), _quarantine_params(rejected, limits))
        if before_commit is not None:
            before_commit()
    if counts is not None:
        row = await counts.fetchone()
        assert row is not None
        result.accepted, result.duplicates, result.matched, result.late = row[:4]
        result.pending = result.accepted - result.matched - result.late
    return result


async def conflicting_duplicates(
    conn: AsyncConn, records: Sequence[IngestRecord]
) -> list[IngestRecord]:
    """The events of ``records`` whose (source, id) is stored with another meaning (tenant,
    type, correlation, job or data; not the time): duplicates by CloudEvents' rule, so
    dropped, but each one another event its producer sent under a reused id. Asked after
    the batch committed, so an id earlier in the same batch is compared too."""
    events = [r for r in records if isinstance(r.parsed, CompletionEvent)]
    if not events:
        return []
    params = _event_params(events)
    async with _one_transaction(conn):
        found = await conn.execute(
            query("ingest", "conflicting_duplicates"),
            {name: params[name] for name in _MEANING_COLUMNS},
        )
    return [events[n - 1] for (n,) in await found.fetchall()]


# What an event says, as compared for a conflicting duplicate: not where it was read, nor
# its time (a producer may stamp a retry with the time it sends it).
_MEANING_COLUMNS = "producer event_id tenant type correlation_id external_job_id data".split()


@contextlib.asynccontextmanager
async def _one_transaction(conn: AsyncConn) -> AsyncIterator[None]:
    """The statements of the block in one transaction and one round trip.

    On an idle connection: ``one_round_trip`` (matcher.store.pipelined), so they travel
    together, run in one implicit transaction committed when the block ends, and their
    results come back at once. Each statement was sent when it was queued, so a crash
    inside the block leaves the server mid-transaction, and it rolls back; so does a
    block that raises. In a caller's transaction the statements simply join it."""
    if conn.info.transaction_status is not TransactionStatus.IDLE:
        yield
        return
    async with one_round_trip(conn):
        yield
