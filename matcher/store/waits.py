"""Waits and runs: register, cancel, look up, advance. Sync and async, same SQL.

Every function runs on the caller's connection and inside the caller's transaction when
there is one, so a worker can store its wait together with its own state, atomically.
"""

from __future__ import annotations

import json
import uuid
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import dict_row, tuple_row

from matcher.domain.resume import ResumeData
from matcher.domain.waits import Wait, WaitSpec
from matcher.store.sql import query

Conn = psycopg.Connection[Any]  # any row factory: the SDK sets its own where it reads
AsyncConn = psycopg.AsyncConnection[Any]


def _spec_params(spec: WaitSpec) -> dict[str, Any]:
    if spec.deadline is not None and spec.deadline.tzinfo is None:
        raise ValueError("deadline must be timezone-aware")
    params = spec.model_dump()
    params["id"] = spec.id or uuid.uuid4()
    return params


def wait_from_row(row: dict[str, Any]) -> Wait:
    return Wait.model_validate(row)


def register_wait(conn: Conn, spec: WaitSpec) -> Wait:
    """Store a wait, in the caller's transaction (or its own, on an autocommit connection).

    It takes no lock and works the same at every isolation level: once the transaction
    commits, the daemon matches the wait against events already stored (an event that
    came first resolves it then, within milliseconds), and ingest against events to come.
    The wait is returned as stored: ``waiting``. Nothing here can hold up the daemon, however
    long the caller's transaction stays open.
    """
    params = _spec_params(spec)
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(query("waits", "register_wait"), params).fetchone()
    assert row is not None
    return wait_from_row(row)


async def register_wait_async(conn: AsyncConn, spec: WaitSpec) -> Wait:
    """``register_wait`` for asyncio workers."""
    params = _spec_params(spec)
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query("waits", "register_wait"), params)
        row = await cur.fetchone()
    assert row is not None
    return wait_from_row(row)


def cancel_wait(conn: Conn, wait_id: UUID | str) -> bool:
    """Cancel a waiting wait; True if this call cancelled it (False: already resolved)."""
    with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(query("resolve", "cancel_wait"), {"wait_id": wait_id}).fetchone()
    return bool(row and row[0])


async def time_out_due(conn: AsyncConn, limit: int) -> int:
    """Time out up to ``limit`` waits past their deadline (the sweeper; in the caller's
    transaction); return how many."""
    cur = await conn.execute(query("resolve", "sweep_deadlines"), {"limit": limit})
    row = await cur.fetchone()
    return int(row[0]) if row and row[0] else 0


def get_wait(conn: Conn, wait_id: UUID | str) -> Wait | None:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(query("waits", "get_wait"), {"wait_id": wait_id}).fetchone()
    return wait_from_row(row) if row else None


def list_waits(
    conn: Conn,
    *,
    tenant: str | None = None,
    state: str | None = None,
    run_id: str | None = None,
    correlation_id: str | None = None,
    external_job_id: str | None = None,
    limit: int = 100,
) -> list[Wait]:
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            query("views", "waits"),
            {
                "tenant": tenant,
                "state": state,
                "run_id": run_id,
                "correlation_id": correlation_id,
                "external_job_id": external_job_id,
                "limit": limit,
                "offset": 0,
            },
        ).fetchall()
    return [wait_from_row(row) for row in rows]


class UnverifiedResume(ValueError):
    """A resume that matcher did not commit: forged, altered, or addressed to another run.

    Raised by ``verify_resume`` and ``advance``; the run is left as it was. Log it and drop
    the message: it is either an attack or a bug, and retrying cannot make it true.
    """


def _advance_params(resume: ResumeData) -> dict[str, Any]:
    return {
        "tenant": resume.tenant,
        "run_id": resume.run_id,
        "position": resume.position,
        "resolution_id": resume.resolution_id,
    }


def _verify_params(resume: ResumeData) -> dict[str, Any]:
    return {"wait_id": resume.wait_id, "resolution_id": resume.resolution_id}


def _check_committed(row: tuple[Any, ...] | None, resume: ResumeData) -> None:
    """Raise unless ``resume`` is exactly the resume matcher committed for its resolution."""
    if row is None:
        raise UnverifiedResume(
            f"matcher committed no resolution {resume.resolution_id} for wait {resume.wait_id}"
        )
    message, event_gone, published_sha256 = row
    if event_gone:
        # The message cannot be rebuilt; the digest of the one published still identifies it.
        if published_sha256 is not None and resume.message_sha256 == bytes(published_sha256):
            return
        raise UnverifiedResume(
            f"resolution {resume.resolution_id} cannot be checked: its event is no longer "
            "stored (older than the inbox's dedupe window) and the resume was not read from "
            "the published message by parse_resume"
        )
    # Read with the standard JSON parser, whatever loaders the caller's connection has.
    committed = ResumeData.model_validate(json.loads(message)["data"])
    # Compared as JSON, so that true and 1, or 1 and 1.0, are not taken for each other.
    if committed.model_dump_json() != resume.model_dump_json():
        differ = [
            name
            for name in ResumeData.model_fields
            if getattr(committed, name) != getattr(resume, name)
        ] or ["the event's data"]
        raise UnverifiedResume(
            f"resume {resume.resolution_id} differs from what matcher committed: "
            + ", ".join(differ)
        )


def verify_resume(conn: Conn, resume: ResumeData) -> None:
    """Raise ``UnverifiedResume`` unless matcher committed exactly this resume.

    For projects that advance their own run table: call it, in the same transaction,
    before the conditional update that ``advance`` does on ``matcher.runs``.
    """
    # A cursor of its own: the caller's connection may have any row factory.
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(query("waits", "committed_resume"), _verify_params(resume)).fetchone()
    _check_committed(row, resume)


def advance(conn: Conn, resume: ResumeData) -> bool:
    """Move the run past the resume's position; True only for the call that did it.

    The resume is first checked against what matcher committed (``verify_resume``): one
    that matcher did not publish raises ``UnverifiedResume`` and changes nothing, whoever
    could write to the resume topic. A duplicate of a genuine resume (the relay publishes
    at least once) returns False and changes nothing, so a worker that continues the run
    only when this returns True continues it exactly once. Uses ``matcher.runs``; projects
    with their own run table call ``verify_resume`` and apply the same conditional update
    there instead.
    """
    with conn.transaction():
        verify_resume(conn, resume)
        row = conn.execute(query("waits", "advance_run"), _advance_params(resume)).fetchone()
    return row is not None


async def verify_resume_async(conn: AsyncConn, resume: ResumeData) -> None:
    """``verify_resume`` for asyncio workers."""
    async with conn.cursor(row_factory=tuple_row) as cur:
        await cur.execute(query("waits", "committed_resume"), _verify_params(resume))
        row = await cur.fetchone()
    _check_committed(row, resume)


async def advance_async(conn: AsyncConn, resume: ResumeData) -> bool:
    """``advance`` for asyncio workers."""
    async with conn.transaction():
        await verify_resume_async(conn, resume)
        cur = await conn.execute(query("waits", "advance_run"), _advance_params(resume))
        row = await cur.fetchone()
    return row is not None
