"""Replay from quarantine: judge a quarantined record again (say, after a key was added)
and, if it now passes, store it like any other event."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from matcher.domain.events import CompletionEvent, Rejection
from matcher.store.ingest import IngestRecord, headers_from_json, store_batch
from matcher.store.sql import query

Judge = Callable[[list[tuple[str, bytes]], bytes | None, bytes | None, datetime], Any]


@dataclass(frozen=True)
class ReplayOutcome:
    id: int
    result: str  # accepted, duplicate, or the reason it is still rejected
    detail: str = ""


async def replay(
    conn: psycopg.AsyncConnection[Any],
    judge: Judge,
    *,
    quarantine_id: int | None = None,
    reason: str | None = None,
) -> list[ReplayOutcome]:
    """Replay one record (by id) or every unreplayed record with ``reason``.

    ``judge(headers, key, value, at)`` is the daemon's gate; ``at`` is when the record
    first arrived, so a replay is judged as the event would have been, had the registry
    been right at the time (a signature's timestamp tolerance included).
    """
    outcomes: list[ReplayOutcome] = []
    async with conn.transaction():
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(
            query("quarantine", "for_replay"), {"id": quarantine_id, "reason": reason}
        )
        for row in await cur.fetchall():
            headers = headers_from_json(row["headers"])
            key = bytes(row["kafka_key"]) if row["kafka_key"] is not None else None
            value = bytes(row["raw_value"]) if row["raw_value"] is not None else None
            verdict = judge(headers, key, value, row["received_at"])
            if isinstance(verdict, Rejection):
                await conn.execute(
                    query("quarantine", "note_rejection"),
                    {"id": row["id"], "reason": verdict.reason, "detail": verdict.detail},
                )
                outcomes.append(ReplayOutcome(row["id"], verdict.reason, verdict.detail))
                continue
            assert isinstance(verdict, CompletionEvent)
            record = IngestRecord(
                row["kafka_topic"],
                row["kafka_partition"],
                row["kafka_offset"],
                key,
                value,
                headers,
                verdict,
            )
            stored = await store_batch(conn, [record])
            result = "accepted" if stored.accepted else "duplicate"
            await conn.execute(
                query("quarantine", "mark_replayed"), {"id": row["id"], "result": result}
            )
            outcomes.append(ReplayOutcome(row["id"], result))
    return outcomes
