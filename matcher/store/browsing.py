"""Reads for browsing what matcher holds (queries/browsing.sql): bounded pages of waits,
events and quarantine, a run's record, the overview, each on an index, as the domain's
models (the operator console, matcher.admin.console, renders them)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

import psycopg
from psycopg.rows import dict_row

from matcher.domain.events import QuarantinedRecord, StoredEvent
from matcher.domain.explain import ExplainFacts
from matcher.domain.launches import Launch
from matcher.domain.waits import Wait
from matcher.store.sql import query

Conn = psycopg.AsyncConnection[Any]

# How many related events and quarantined records the overview reads for its waits.
RELATED_LIMIT = 5000


async def _rows(conn: Conn, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query("browsing", name), params)
        return await cur.fetchall()


async def _one(conn: Conn, module: str, name: str, params: dict[str, Any]) -> dict[str, Any]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query(module, name), params)
        row = await cur.fetchone()
    assert row is not None
    return row


@dataclass
class Overview:
    gauges: dict[str, Any]  # the stats query's figures (matcher.daemon.stats reads the same)
    quarantine_last_hour: dict[str, int]
    facts: list[ExplainFacts]  # of the oldest waiting waits, for their verdicts


async def overview(conn: Conn, waits: int) -> Overview:
    """The figures of the overview, and the facts of the ``waits`` oldest waiting waits,
    read in a handful of statements (not one explain per wait)."""
    gauges = await _one(conn, "stats", "gauges", {})
    now = await clock(conn)
    hour = {r["reason"]: r["records"] for r in await _rows(conn, "quarantine_last_hour", {})}
    return Overview(gauges, hour, await waiting_facts(conn, waits, now))


async def clock(conn: Conn) -> datetime:
    """The database's now (explain judges deadlines by it)."""
    now: datetime = (await _one(conn, "browsing", "clock", {}))["now"]
    return now


async def waiting_facts(conn: Conn, waits: int, now: datetime) -> list[ExplainFacts]:
    """Explain's facts (from Postgres) of the ``waits`` oldest waiting waits."""
    oldest = [Wait.model_validate(r) for r in await _rows(conn, "oldest_waiting", {"limit": waits})]
    return await facts_of_waits(conn, oldest, now)


async def facts_of_waits(conn: Conn, waits: list[Wait], now: datetime) -> list[ExplainFacts]:
    """Explain's facts (from Postgres) of these waiting waits, read in three statements."""
    if not waits:
        return []
    keys = {"correlation_ids": sorted({w.correlation_id for w in waits}), "limit": RELATED_LIMIT}
    events = [
        StoredEvent.model_validate(r) for r in await _rows(conn, "events_of_correlations", keys)
    ]
    quarantined = [
        QuarantinedRecord.model_validate(r)
        for r in await _rows(conn, "quarantine_of_correlations", keys)
    ]
    queued = {
        (r["tenant"], r["correlation_id"]): r["queued_since"]
        for r in await _rows(conn, "queued_keys", keys)
    }
    return [
        ExplainFacts(
            now=now,
            wait=w,
            events=[e for e in events if e.correlation_id == w.correlation_id],
            quarantined=[q for q in quarantined if q.correlation_id == w.correlation_id],
            rematch_queued_since=queued.get((w.tenant, w.correlation_id)),
        )
        for w in waits
    ]


async def worker_failures_of(conn: Conn, waits: list[Wait]) -> dict[UUID, bool]:
    """Of these waits, those whose resume a worker's handler failed on: parked or not."""
    if not waits:
        return {}
    params = {
        "tenants": [w.tenant for w in waits],
        "run_ids": [w.run_id for w in waits],
        "ids": [w.id for w in waits],
    }
    return {
        r["wait_id"]: r["parked"] for r in await _rows(conn, "worker_failures_of_waits", params)
    }


@dataclass(frozen=True)
class WaitQuery:
    tenant: str | None = None
    state: str | None = None
    run_id: str | None = None
    correlation_id: str | None = None
    job_id: str | None = None
    newest: bool = False
    limit: int = 50
    offset: int = 0


class NeedsKey(ValueError):
    """Resolved waits are listed only by a run, correlation or job id (no index by age)."""


async def waits_page(conn: Conn, q: WaitQuery) -> list[Wait]:
    """Up to ``q.limit`` waits (the caller asks one more to know of a next page)."""
    params: dict[str, Any] = {
        "tenant": q.tenant,
        "state": q.state,
        "run_id": q.run_id,
        "correlation_id": q.correlation_id,
        "job_id": q.job_id,
        "newest": q.newest,
        "limit": q.limit,
        "offset": q.offset,
    }
    name: str
    if q.run_id is not None:
        name = "waits_by_run"
    elif q.correlation_id is not None:
        name = "waits_by_correlation"
    elif q.job_id is not None:
        name = "waits_by_job"
    elif q.state == "waiting":
        name = "waiting_newest_first" if q.newest else "waiting_oldest_first"
    else:
        raise NeedsKey("give a run id, correlation id or external job id")
    return [Wait.model_validate(r) for r in await _rows(conn, name, params)]


async def waits_with_worker_failures(
    conn: Conn, *, parked: bool, limit: int, offset: int
) -> list[Wait]:
    """Waits whose resume a worker's handler failed on (parked, or being tried), the most
    recently failed first."""
    params = {"parked": parked, "limit": limit, "offset": offset}
    return [Wait.model_validate(r) for r in await _rows(conn, "waits_with_worker_failures", params)]


async def runs_of_waits(conn: Conn, ids: set[UUID]) -> dict[UUID, dict[str, Any]]:
    """Tenant, run id and position of these waits, by id."""
    if not ids:
        return {}
    return {r["id"]: r for r in await _rows(conn, "waits_by_ids", {"ids": sorted(ids)})}


async def run_waits(conn: Conn, run_id: str, tenant: str | None) -> list[Wait]:
    """The run's waits (the latest 50), in the order the run registered them."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query("explain", "waits_of_run"), {"run_id": run_id, "tenant": tenant})
        rows = await cur.fetchall()
    return [Wait.model_validate(r) for r in reversed(rows)]


@dataclass
class RunRecord:
    progress: dict[str, Any] | None  # matcher.runs, when the worker records it
    launches: list[Launch] = field(default_factory=list)
    audit: dict[UUID, list[dict[str, Any]]] = field(default_factory=dict)
    resume: dict[str, Any] | None = None  # the current wait's outbox row


async def run_record(conn: Conn, tenant: str, run_id: str, wait_id: UUID) -> RunRecord:
    key = {"tenant": tenant, "run_id": run_id}
    progress = await _rows(conn, "run_progress", key)
    launches = [
        Launch.model_validate(r) for r in await _rows(conn, "launches_of_run", key | {"limit": 50})
    ]
    audit: dict[UUID, list[dict[str, Any]]] = {}
    if launches:
        ids = {"ids": [launch.id for launch in launches], "limit": 500}
        for row in await _rows(conn, "audit_of_launches", ids):
            audit.setdefault(row["launch_id"], []).append(row)
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query("explain", "outbox_of_wait"), {"wait_id": wait_id})
        resume = await cur.fetchone()
    return RunRecord(progress[0] if progress else None, launches, audit, resume)


async def events_page(
    conn: Conn, correlation_id: str | None, job_id: str | None, limit: int, offset: int
) -> list[StoredEvent]:
    params = {"correlation_id": correlation_id, "job_id": job_id, "limit": limit, "offset": offset}
    name: Literal["events_by_correlation_page", "events_by_job_page", "events_pending_page"]
    if correlation_id is not None:
        name = "events_by_correlation_page"
    elif job_id is not None:
        name = "events_by_job_page"
    else:
        name = "events_pending_page"
    return [StoredEvent.model_validate(r) for r in await _rows(conn, name, params)]


@dataclass(frozen=True)
class QuarantineRow:
    record: QuarantinedRecord
    headers: list[dict[str, Any]]  # as stored (matcher.domain.quarantine)
    value_preview: bytes | None  # the first 2 KiB of the raw value
    value_size: int | None


@dataclass(frozen=True)
class QuarantineQuery:
    reason: str | None = None
    producer: str | None = None
    correlation_id: str | None = None
    limit: int = 50
    offset: int = 0


async def quarantine_page(conn: Conn, q: QuarantineQuery) -> list[QuarantineRow]:
    params = dataclasses.asdict(q)
    return [
        QuarantineRow(
            QuarantinedRecord.model_validate(r),
            list(r["headers"] or []),
            None if r["value_preview"] is None else bytes(r["value_preview"]),
            r["value_size"],
        )
        for r in await _rows(conn, "quarantine_page", params)
    ]


async def unreplayed_with_reason(conn: Conn, reason: str) -> int:
    return int((await _rows(conn, "unreplayed_with_reason", {"reason": reason}))[0]["records"])
