"""Waits and runs: register, cancel, look up, advance. Sync and async, same SQL.

Every function runs on the caller's connection and inside the caller's transaction when
there is one, so a worker can store its wait together with its own state, atomically.
"""

from __future__ import annotations

import uuid
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import dict_row

from matcher.domain.resume import ResumeData
from matcher.domain.waits import Wait, WaitSpec
from matcher.store.sql import query

Conn = psycopg.Connection[tuple[Any, ...]]
AsyncConn = psycopg.AsyncConnection[tuple[Any, ...]]


def _spec_params(spec: WaitSpec) -> dict[str, Any]:
    if spec.deadline is not None and spec.deadline.tzinfo is None:
        raise ValueError("deadline must be timezone-aware")
    params = spec.model_dump()
    params["id"] = spec.id or uuid.uuid4()
    return params


def wait_from_row(row: dict[str, Any]) -> Wait:
    return Wait.model_validate(row)


def register_wait(conn: Conn, spec: WaitSpec) -> Wait:
    """Store a wait; if a matching event is already pending, the wait is resolved at once.

    Runs inside the caller's transaction (or its own, on an autocommit connection). The
    returned wait's ``state`` is ``matched`` when an early event resolved it.
    """
    params = _spec_params(spec)
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query("waits", "lock_key"), params)
        row = cur.execute(query("waits", "register_wait"), params).fetchone()
    assert row is not None
    return wait_from_row(row)


async def register_wait_async(conn: AsyncConn, spec: WaitSpec) -> Wait:
    """``register_wait`` for asyncio workers."""
    params = _spec_params(spec)
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query("waits", "lock_key"), params)
        await cur.execute(query("waits", "register_wait"), params)
        row = await cur.fetchone()
    assert row is not None
    return wait_from_row(row)


def cancel_wait(conn: Conn, wait_id: UUID | str) -> bool:
    """Cancel a waiting wait; True if this call cancelled it (False: already resolved)."""
    with conn.transaction():
        row = conn.execute(query("resolve", "cancel_wait"), {"wait_id": wait_id}).fetchone()
        cancelled = bool(row and row[0])
        if cancelled:
            conn.execute(query("ingest", "notify_outbox"))
    return cancelled


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


def _advance_params(resume: ResumeData) -> dict[str, Any]:
    return {
        "tenant": resume.tenant,
        "run_id": resume.run_id,
        "position": resume.position,
        "resolution_id": resume.resolution_id,
    }


def advance(conn: Conn, resume: ResumeData) -> bool:
    """Move the run past the resume's position; True only for the call that did it.

    A duplicate resume (the relay publishes at least once) returns False and changes
    nothing, so a worker that continues the run only when this returns True continues
    it exactly once. Uses ``matcher.runs``; projects with their own run table can apply
    the same conditional update there instead.
    """
    with conn.transaction():
        row = conn.execute(query("waits", "advance_run"), _advance_params(resume)).fetchone()
    return row is not None


async def advance_async(conn: AsyncConn, resume: ResumeData) -> bool:
    """``advance`` for asyncio workers."""
    async with conn.transaction():
        cur = await conn.execute(query("waits", "advance_run"), _advance_params(resume))
        row = await cur.fetchone()
    return row is not None
