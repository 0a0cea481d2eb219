"""Waits and runs: register, cancel, look up, advance. Sync and async, same SQL.

Every function runs on the caller's connection and inside the caller's transaction when
there is one, so a worker can store its wait together with its own state, atomically.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from psycopg.rows import dict_row

from matcher.domain.resume import ResumeData
from matcher.domain.waits import Wait, WaitSpec
from matcher.store.sql import query
from matcher.store.worker_api import (
    AsyncConn,
    Conn,
    UnverifiedResume,
    advance_call,
    call,
    call_async,
    cancel_wait_call,
    committed_resume_call,
    get_wait_call,
    issue_callback_call,
    register_wait_call,
    verify_resume_call,
)

# A listing is for reading, not for paging through the whole table.
MAX_LISTED = 10_000

__all__ = ["AsyncConn", "Conn", "UnverifiedResume"]


def wait_from_row(row: dict[str, Any]) -> Wait:
    return Wait.model_validate(row)


def register_wait(conn: Conn, spec: WaitSpec) -> Wait:
    """Store a wait, in the caller's transaction (or its own, on an autocommit connection),
    through ``matcher.register_wait_v1``.

    It takes no lock and works the same at every isolation level: once the transaction
    commits, the daemon matches the wait against events already stored (an event that
    came first resolves it then, within milliseconds), and ingest against events to come.
    The wait is returned as stored: ``waiting``. Nothing here can hold up the daemon, however
    long the caller's transaction stays open.
    """
    return call(conn, register_wait_call(spec))


async def register_wait_async(conn: AsyncConn, spec: WaitSpec) -> Wait:
    """``register_wait`` for asyncio workers."""
    return await call_async(conn, register_wait_call(spec))


def issue_callback(conn: Conn, wait_id: UUID | str) -> str:
    """A callback token for a waiting wait (``matcher.issue_callback_v1``), in the caller's
    transaction: call it right after ``register_wait``, and keep the token with the run's
    state (only its SHA-256 is stored: it cannot be read back). POSTing JSON to
    ``callback_url(ingress_base, token)`` completes exactly this wait. Calling it again
    replaces the token (the old URL answers 404). ``LookupError``: no such wait;
    ``ValueError``: the wait is no longer waiting."""
    return call(conn, issue_callback_call(wait_id))


async def issue_callback_async(conn: AsyncConn, wait_id: UUID | str) -> str:
    """``issue_callback`` for asyncio workers."""
    return await call_async(conn, issue_callback_call(wait_id))


def cancel_wait(conn: Conn, wait_id: UUID | str) -> bool:
    """Cancel a waiting wait; True if this call cancelled it (False: already resolved)."""
    return call(conn, cancel_wait_call(wait_id))


async def cancel_wait_async(conn: AsyncConn, wait_id: UUID | str) -> bool:
    """``cancel_wait`` for asyncio workers."""
    return await call_async(conn, cancel_wait_call(wait_id))


async def time_out_due(conn: AsyncConn, limit: int) -> tuple[int, int]:
    """Time out up to ``limit`` waits past their deadline or whose heartbeat came due (the
    sweeper; in the caller's transaction); return how many of each."""
    cur = await conn.execute(query("resolve", "sweep_deadlines"), {"limit": limit})
    row = await cur.fetchone()
    if row is None:
        return 0, 0
    return int(row[0] or 0), int(row[1] or 0)


def get_wait(conn: Conn, wait_id: UUID | str) -> Wait | None:
    """The wait in its state now (``matcher.get_wait_v1``); None when there is none."""
    return call(conn, get_wait_call(wait_id))


async def get_wait_async(conn: AsyncConn, wait_id: UUID | str) -> Wait | None:
    """``get_wait`` for asyncio workers."""
    return await call_async(conn, get_wait_call(wait_id))


def _wait_filters(
    tenant: str | None,
    state: str | None,
    run_id: str | None,
    correlation_id: str | None,
    external_job_id: str | None,
    limit: int,
) -> dict[str, Any]:
    if not 1 <= limit <= MAX_LISTED:
        raise ValueError(f"limit must be between 1 and {MAX_LISTED}")
    return {
        "tenant": tenant,
        "state": state,
        "run_id": run_id,
        "correlation_id": correlation_id,
        "external_job_id": external_job_id,
        "limit": limit,
        "offset": 0,
    }


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
    """Waits that match every filter given, newest first (an operator's listing: a worker
    keeps the ids ``register_wait`` answered and reads them with ``get_wait``)."""
    params = _wait_filters(tenant, state, run_id, correlation_id, external_job_id, limit)
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(query("views", "waits"), params).fetchall()
    return [wait_from_row(row) for row in rows]


async def list_waits_async(
    conn: AsyncConn,
    *,
    tenant: str | None = None,
    state: str | None = None,
    run_id: str | None = None,
    correlation_id: str | None = None,
    external_job_id: str | None = None,
    limit: int = 100,
) -> list[Wait]:
    """``list_waits`` for asyncio workers."""
    params = _wait_filters(tenant, state, run_id, correlation_id, external_job_id, limit)
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query("views", "waits"), params)
        rows = await cur.fetchall()
    return [wait_from_row(row) for row in rows]


def verify_resume(conn: Conn, resume: ResumeData) -> None:
    """Raise ``UnverifiedResume`` unless matcher committed exactly this resume (its message,
    byte for byte: ``matcher.verify_resume_v1``).

    For projects that advance their own run table: call it, in the same transaction,
    before the conditional update that ``advance`` does on ``matcher.runs``.
    """
    call(conn, verify_resume_call(resume))


def advance(conn: Conn, resume: ResumeData) -> bool:
    """Move the run past the resume's position; True only for the call that did it
    (``matcher.advance_v1``), in the caller's transaction.

    The resume is first checked against what matcher committed: one that matcher did not
    publish raises ``UnverifiedResume`` and changes nothing, whoever could write to the
    resume topic. A duplicate of a genuine resume (the relay publishes at least once)
    returns False and changes nothing. Call it in the transaction that also writes the
    run's next step, so that both commit together or neither does (the resume worker,
    ``matcher.sdk.worker``, does exactly that). Uses ``matcher.runs``; projects with their
    own run table call ``verify_resume`` and apply the same conditional update there.
    """
    return call(conn, advance_call(resume)) == "advanced"


async def verify_resume_async(conn: AsyncConn, resume: ResumeData) -> None:
    """``verify_resume`` for asyncio workers."""
    await call_async(conn, verify_resume_call(resume))


async def advance_async(conn: AsyncConn, resume: ResumeData) -> bool:
    """``advance`` for asyncio workers."""
    return await call_async(conn, advance_call(resume)) == "advanced"


def committed_resume(
    conn: Conn, wait_id: UUID | str, resolution_id: UUID | str | None = None
) -> ResumeData | None:
    """The resume matcher committed for a wait (its latest resolution, or the one named),
    read from the database alone: for a worker whose offsets or topic are gone. None when
    there is none (or its event has left the inbox, past the dedupe window)."""
    return call(conn, committed_resume_call(wait_id, resolution_id))


async def committed_resume_async(
    conn: AsyncConn, wait_id: UUID | str, resolution_id: UUID | str | None = None
) -> ResumeData | None:
    """``committed_resume`` for asyncio workers."""
    return await call_async(conn, committed_resume_call(wait_id, resolution_id))
