"""Launch intents (worker SDK) and their reconciliation."""

from __future__ import annotations

import inspect
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from psycopg.rows import dict_row, tuple_row

from matcher.domain.launches import Answer, Found, Launch, LaunchSpec, NotFound, Unknown
from matcher.store.locks import hold, hold_async
from matcher.store.sql import query
from matcher.store.waits import cancel_wait
from matcher.store.worker_api import (
    AsyncConn,
    Conn,
    call,
    call_async,
    get_launch_call,
    record_job_id_call,
    record_launch_call,
)

log = logging.getLogger("matcher.launches")

Reconciler = Callable[[Launch], Answer | Awaitable[Answer]]


def record_launch(conn: Conn, spec: LaunchSpec) -> Launch:
    """Record the intent and its wait (``matcher.record_launch_v1``), BEFORE calling the
    external system.

    Give the external system ``launch.idempotency_key`` and ``launch.correlation_id``;
    afterwards, ``record_job_id``. Calling this again with the same idempotency key (a
    retry after a crash) returns the launch recorded the first time and adds nothing. Like
    ``register_wait`` it takes no lock, so the caller's transaction may stay open.
    """
    return call(conn, record_launch_call(spec))


async def record_launch_async(conn: AsyncConn, spec: LaunchSpec) -> Launch:
    """``record_launch`` for asyncio workers."""
    return await call_async(conn, record_launch_call(spec))


def claim_launch(conn: Conn, spec: LaunchSpec) -> tuple[Launch, bool]:
    """``record_launch``, and whether this call recorded it (True) or found it recorded
    before (False): the caller that gets True is the one that calls the external system,
    so that it is called at most once per launch even by concurrent callers. Commits (a
    savepoint inside the caller's transaction): the intent must be stored before the
    call it stands for."""
    with conn.transaction():
        hold(conn, f"matcher.launch:{spec.tenant}\x1f{spec.key()}")
        with conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(
                query("launches", "by_key"), {"tenant": spec.tenant, "key": spec.key()}
            ).fetchone()
        if row is not None:
            return Launch.model_validate(row), False
        return record_launch(conn, spec), True


async def claim_launch_async(conn: AsyncConn, spec: LaunchSpec) -> tuple[Launch, bool]:
    """``claim_launch`` for asyncio workers."""
    async with conn.transaction():
        await hold_async(conn, f"matcher.launch:{spec.tenant}\x1f{spec.key()}")
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(
                query("launches", "by_key"), {"tenant": spec.tenant, "key": spec.key()}
            )
            row = await cur.fetchone()
        if row is not None:
            return Launch.model_validate(row), False
        return await record_launch_async(conn, spec), True


def record_job_id(conn: Conn, launch_id: uuid.UUID | str, external_job_id: str) -> bool:
    """Store the external job id on the intent and its wait. True when this call stored it
    (or the same id was stored before); False when a different id is already recorded;
    ``LookupError`` when there is no such launch."""
    return call(conn, record_job_id_call(launch_id, external_job_id))


async def record_job_id_async(
    conn: AsyncConn, launch_id: uuid.UUID | str, external_job_id: str
) -> bool:
    """``record_job_id`` for asyncio workers."""
    return await call_async(conn, record_job_id_call(launch_id, external_job_id))


def get_launch(conn: Conn, launch_id: uuid.UUID | str) -> Launch | None:
    """The launch in its state now (``matcher.get_launch_v1``); None when there is none."""
    return call(conn, get_launch_call(launch_id))


async def get_launch_async(conn: AsyncConn, launch_id: uuid.UUID | str) -> Launch | None:
    """``get_launch`` for asyncio workers."""
    return await call_async(conn, get_launch_call(launch_id))


def audit_trail(conn: Conn, launch_id: uuid.UUID | str) -> list[dict[str, Any]]:
    """What happened to a launch, oldest first: each state change, with when and why."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("launches", "audit_of"), {"id": launch_id}).fetchall()


async def audit_trail_async(conn: AsyncConn, launch_id: uuid.UUID | str) -> list[dict[str, Any]]:
    """``audit_trail`` for asyncio workers."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query("launches", "audit_of"), {"id": launch_id})
        return await cur.fetchall()


@dataclass(frozen=True)
class Reconciled:
    launch_id: uuid.UUID
    run_id: str
    answer: str  # found, not_found, unknown, error
    external_job_id: str | None = None
    detail: str = ""


async def _ask(reconciler: Reconciler, launch: Launch) -> Answer:
    answer = reconciler(launch)
    if inspect.isawaitable(answer):
        answer = await answer
    if not isinstance(answer, Found | NotFound | Unknown):
        raise TypeError(f"a reconciler answers Found, NotFound or Unknown, not {answer!r}")
    return answer


async def reconcile(
    conn: Conn,
    reconciler: Reconciler,
    *,
    actor: str,
    older_than: timedelta,
    limit: int = 1000,
) -> list[Reconciled]:
    """Ask ``reconciler`` about every intent older than ``older_than`` with no job id.

    Each intent is handled in its own transaction, its row locked so that two concurrent
    reconciliations never both act on it. ``Found`` stores the job id (the wait keeps
    waiting for the job's event); ``NotFound`` marks the launch failed and cancels its
    wait, so a resume (outcome ``cancelled``) tells the run to launch again; ``Unknown``
    and errors leave it for the next pass. Every answer is audited.
    """
    with conn.cursor(row_factory=tuple_row) as found:
        ids = [
            row[0]
            for row in found.execute(
                query("launches", "unsubmitted"), {"older_than": older_than, "limit": limit}
            ).fetchall()
        ]
    results: list[Reconciled] = []
    for launch_id in ids:
        with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(query("launches", "lock_intent"), {"id": launch_id}).fetchone()
            if row is None:
                continue  # submitted meanwhile, or another reconciler holds it
            launch = Launch.model_validate(row)
            try:
                answer = await _ask(reconciler, launch)
            except Exception as exc:  # the reconciler is user code: record, carry on
                log.warning("reconciler failed", extra={"launch_id": str(launch.id), "error": exc})
                cur.execute(query("launches", "reconcile_unknown"), {"id": launch.id})
                detail = f"{type(exc).__name__}: {exc}"[:500]
                cur.execute(
                    query("launches", "audit"),
                    {
                        "id": launch.id,
                        "actor": actor,
                        "answer": "error",
                        "external_job_id": None,
                        "detail": detail,
                    },
                )
                results.append(Reconciled(launch.id, launch.run_id, "error", None, detail))
                continue
            if isinstance(answer, Found):
                cur.execute(
                    query("launches", "reconcile_found"),
                    {"id": launch.id, "external_job_id": answer.external_job_id},
                )
                record = Reconciled(launch.id, launch.run_id, "found", answer.external_job_id)
            elif isinstance(answer, NotFound):
                cur.execute(query("launches", "reconcile_not_found"), {"id": launch.id})
                cancel_wait(conn, launch.wait_id)
                record = Reconciled(launch.id, launch.run_id, "not_found")
            else:
                cur.execute(query("launches", "reconcile_unknown"), {"id": launch.id})
                record = Reconciled(launch.id, launch.run_id, "unknown", None, answer.reason)
            cur.execute(
                query("launches", "audit"),
                {
                    "id": launch.id,
                    "actor": actor,
                    "answer": record.answer,
                    "external_job_id": record.external_job_id,
                    "detail": record.detail or None,
                },
            )
            results.append(record)
    return results
