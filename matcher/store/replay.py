"""Replay from quarantine: judge a quarantined record again (say, after a key was added)
and, if it now passes, store it like any other event."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from matcher.domain.events import CompletionEvent, Rejection
from matcher.domain.quarantine import MAX_DETAIL, headers_from_json, storable_text
from matcher.domain.records import IngestRecord, RawRecord
from matcher.store.ingest import conflicting_duplicates, store_batch
from matcher.store.isolation import read_committed
from matcher.store.sql import query

Judge = Callable[[RawRecord], CompletionEvent | Rejection]


@dataclass(frozen=True)
class ReplayOutcome:
    id: int
    result: str  # accepted, duplicate, not_replayable, or the reason it is still rejected
    detail: str = ""


def _raw(row: dict[str, Any]) -> RawRecord:
    return RawRecord(
        key=bytes(row["kafka_key"]) if row["kafka_key"] is not None else None,
        headers=headers_from_json(row["headers"]),
        value=bytes(row["raw_value"]) if row["raw_value"] is not None else None,
        # Judged against the same arrival as the first time (older rows: when quarantined).
        arrived_at=row["arrived_at"] or row["received_at"],
    )


def _why_not_replayable(row: dict[str, Any]) -> str | None:
    if row["raw_truncated"]:
        return "only a prefix of the record was kept (MATCHER_QUARANTINE_KEEP_BYTES)"
    if row["reason"] == "undecodable":
        return "the Kafka client cannot read this record: no judgement can change that"
    return None


async def _conflict(conn: psycopg.AsyncConnection[Any], record: IngestRecord) -> str:
    """Why a duplicate replayed is not the event stored under its id, or "" (as ingest
    reports it: a producer that reused an id lost this event)."""
    if not await conflicting_duplicates(conn, [record]):
        return ""
    return (
        "another event is stored under this id (its tenant, type, correlation, job or data "
        "differ): dropped, as CloudEvents identity is source + id"
    )


async def replay(
    conn: psycopg.AsyncConnection[Any],
    judge: Judge,
    *,
    quarantine_id: int | None = None,
    reason: str | None = None,
) -> list[ReplayOutcome]:
    """Replay one record (by id) or every unreplayed record with ``reason``.

    ``judge`` is the daemon's gate with the current registry and policy. A record is judged
    against its original arrival, so a signature that was fresh when it arrived still is.
    """
    outcomes: list[ReplayOutcome] = []
    await read_committed(conn)
    async with conn.transaction():
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(
            query("quarantine", "for_replay"), {"id": quarantine_id, "reason": reason}
        )
        for row in await cur.fetchall():
            unreplayable = _why_not_replayable(row)
            if unreplayable is not None:
                outcomes.append(ReplayOutcome(row["id"], "not_replayable", unreplayable))
                continue
            raw = _raw(row)
            verdict = judge(raw)
            if isinstance(verdict, Rejection):
                await conn.execute(
                    query("quarantine", "note_rejection"),
                    {
                        "id": row["id"],
                        "reason": verdict.reason,
                        "detail": storable_text(verdict.detail, MAX_DETAIL),
                    },
                )
                outcomes.append(ReplayOutcome(row["id"], verdict.reason, verdict.detail))
                continue
            record = IngestRecord(
                row["kafka_topic"],
                row["kafka_partition"],
                row["kafka_offset"],
                raw.key,
                raw.value,
                raw.headers,
                verdict,
                raw.arrived_at,
            )
            stored = await store_batch(conn, [record])
            result = "accepted" if stored.accepted else "duplicate"
            await conn.execute(
                query("quarantine", "mark_replayed"), {"id": row["id"], "result": result}
            )
            detail = "" if stored.accepted else await _conflict(conn, record)
            outcomes.append(ReplayOutcome(row["id"], result, detail))
    return outcomes
