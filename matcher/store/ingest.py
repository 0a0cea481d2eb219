"""One Postgres transaction per Kafka batch: inbox, matching, outbox, quarantine.

The statements are set-based (arrays in, ``unnest`` in SQL) and pipelined, so a batch of
any size costs two round trips and a commit, not one per event. The decision of what each
event does is ``matcher.domain.matching.decide_batch``; this module only reads the facts
it needs and writes what it decided.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from matcher.domain.events import CompletionEvent, Rejection
from matcher.domain.matching import (
    BatchDecision,
    InboxStatus,
    NewEvent,
    WaitView,
    decide_batch,
)
from matcher.domain.waits import WaitState
from matcher.store.sql import query

log = logging.getLogger("matcher.ingest")


@dataclass(frozen=True)
class IngestRecord:
    """One Kafka record of a batch and what parsing made of it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]]
    parsed: CompletionEvent | Rejection


@dataclass
class BatchResult:
    accepted: int = 0
    duplicates: int = 0
    matched: int = 0
    late: int = 0
    pending: int = 0
    quarantined: int = 0


class ConcurrentInsert(Exception):
    """Fewer rows were stored than decided: another transaction stored one of our events
    between our check and our insert.

    The event-key locks make this impossible; it stays as a guard (the batch is retried,
    and the event is then seen as the duplicate it is) rather than a silent assumption.
    """


def _text(value: str | None) -> str | None:
    # Quarantine must store anything, and Postgres text cannot hold NUL.
    return None if value is None else value.replace("\x00", "\\x00")


def headers_to_json(headers: Sequence[tuple[str, bytes | None]]) -> list[dict[str, str]]:
    """Headers as JSON, losslessly: text when it is UTF-8 without NUL, else base64."""
    out: list[dict[str, str]] = []
    for name, value in headers:
        raw = value or b""
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        entry = {"name": _text(name) or ""}
        if text is not None and "\x00" not in text:
            entry["value"] = text
        else:
            entry["base64"] = base64.b64encode(raw).decode()
        out.append(entry)
    return out


def headers_from_json(stored: list[dict[str, str]]) -> list[tuple[str, bytes]]:
    return [
        (
            h["name"],
            base64.b64decode(h["base64"]) if "base64" in h else h.get("value", "").encode(),
        )
        for h in stored
    ]


def _new_events(records: Sequence[IngestRecord]) -> list[NewEvent]:
    events: list[NewEvent] = []
    for record in records:
        if isinstance(record.parsed, CompletionEvent):
            e = record.parsed
            events.append(NewEvent(e.source, e.id, e.tenant, e.type, e.correlationid, record))
    return events


def _wait_views(rows: list[tuple[Any, ...]]) -> list[WaitView]:
    return [
        WaitView(
            id=row[0],
            tenant=row[1],
            correlation_id=row[2],
            event_types=frozenset(row[3]),
            state=WaitState(row[4]),
            created_at=row[5],
            resolved_at=row[6],
        )
        for row in rows
    ]


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


def _quarantine_params(records: Sequence[IngestRecord]) -> dict[str, list[Any]]:
    columns: dict[str, list[Any]] = {
        name: []
        for name in (
            "topic partition offset key value headers reason detail producer event_id tenant "
            "type correlation_id"
        ).split()
    }
    for record in records:
        rejection = record.parsed
        assert isinstance(rejection, Rejection)
        columns["topic"].append(record.topic)
        columns["partition"].append(record.partition)
        columns["offset"].append(record.offset)
        columns["key"].append(record.key)
        columns["value"].append(record.value)
        columns["headers"].append(Jsonb(headers_to_json(record.headers)))
        columns["reason"].append(rejection.reason)
        columns["detail"].append(_text(rejection.detail))
        for name in ("producer", "event_id", "tenant", "type", "correlation_id"):
            columns[name].append(_text(rejection.seen.get(name)))
    return columns


async def store_batch(
    conn: psycopg.AsyncConnection[tuple[Any, ...]],
    records: Sequence[IngestRecord],
    before_commit: Callable[[], None] | None = None,
) -> BatchResult:
    """Store one batch in one transaction (the caller's connection, not in a transaction).

    ``before_commit`` runs inside the transaction, after every write (a test crash point).
    """
    events = _new_events(records)
    rejected = [r for r in records if isinstance(r.parsed, Rejection)]
    result = BatchResult(quarantined=len(rejected))
    # One pipeline for the whole transaction: BEGIN travels with the reads, so a batch
    # costs two round trips and the commit. (COMMIT cannot join the writes: the counts
    # they return are checked first, and a mismatch must roll back.)
    async with conn.pipeline() as pipeline, conn.transaction():
        if events:
            keys = {
                "tenant": [e.tenant for e in events],
                "correlation_id": [e.correlation_id for e in events],
            }
            ids = {
                "producer": [e.producer for e in events],
                "event_id": [e.event_id for e in events],
            }
            await conn.execute(query("ingest", "lock_keys"), keys | ids)
            stored_cur = await conn.execute(query("ingest", "stored_events"), ids)
            waits_cur = await conn.execute(query("ingest", "waits_for_keys"), keys)
            await pipeline.sync()
            stored = {(row[0], row[1]) for row in await stored_cur.fetchall()}
            waits = _wait_views(await waits_cur.fetchall())
            decision = decide_batch(events, stored, waits)
            result.duplicates = len(decision.duplicates)
            resolutions = decision.resolutions

            insert_cur = None
            if decision.placements:
                insert_cur = await conn.execute(
                    query("ingest", "insert_inbox"), _inbox_params(decision)
                )
            resolve_cur = None
            if resolutions:
                resolve_cur = await conn.execute(
                    query("ingest", "resolve_by_events"),
                    {
                        "wait_id": [p.wait_id for p in resolutions],
                        "producer": [p.event.producer for p in resolutions],
                        "event_id": [p.event.event_id for p in resolutions],
                    },
                )
                await conn.execute(query("ingest", "notify_outbox"))
            if rejected:
                await conn.execute(query("ingest", "quarantine"), _quarantine_params(rejected))
            await pipeline.sync()
            inserted = len(await insert_cur.fetchall()) if insert_cur is not None else 0
            if inserted != len(decision.placements):
                raise ConcurrentInsert(f"expected {len(decision.placements)}, stored {inserted}")
            if resolve_cur is not None:
                row = await resolve_cur.fetchone()
                queued = row[0] if row else 0
                # We hold the waits' row locks and saw them waiting: all must resolve.
                if queued != len(resolutions):
                    raise RuntimeError(
                        f"resolved {queued} of {len(resolutions)} waits under lock: a bug"
                    )
            for placement in decision.placements:
                if placement.status is InboxStatus.CONSUMED:
                    result.matched += 1
                elif placement.status is InboxStatus.LATE:
                    result.late += 1
                else:
                    result.pending += 1
            result.accepted = len(decision.placements)
        elif rejected:
            await conn.execute(query("ingest", "quarantine"), _quarantine_params(rejected))
        if before_commit is not None:
            before_commit()
    return result
