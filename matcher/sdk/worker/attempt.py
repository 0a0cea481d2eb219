"""Attempts at resumes: in one transaction, advance each run (which verifies its resume)
and, for each resume that advanced its run, call the handler with that same transaction;
then commit. Whatever the handler writes commits with the advance, or neither does
(invariant 11): a crash before the commit leaves the resumes to be handled again, a
crash after it leaves nothing to redo.

Several resumes (of distinct runs) may share one transaction, a batch: its commit and
round trips are paid once. A batch that fails in any way (a handler raises, asks for a
retry, times out; a refusal) is rolled back whole and each of its resumes attempted
again alone, so that every outcome is a single resume's, as if there had been no batch.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, cast

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from matcher import tracing
from matcher.domain.resume import ResumeData
from matcher.faults import crash_point
from matcher.logs import describe_error
from matcher.sdk.worker.handler import AsyncHandler, Handler, Retry, SyncHandler
from matcher.store.worker_api import UNVERIFIED, UnverifiedResume, advance_each, advance_each_async


class Kind(StrEnum):
    ADVANCED = "advanced"  # this attempt advanced the run and the handler's writes committed
    DUPLICATE = "duplicate"  # the run is past this resume already: nothing to do
    NOT_READY = "not_ready"  # Retry, or an earlier resume of the run is not advanced yet
    TRANSIENT = "transient"  # the database is away: try again, nothing counted
    FAILED = "failed"  # the handler failed: counted, and parked past the attempts
    UNVERIFIED = "unverified"  # not a resume matcher committed: dropped


@dataclass(frozen=True)
class Attempt:
    kind: Kind
    retry_after: float = 0.0
    detail: str = ""


class _Undo(Exception):
    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


_BEHIND = "an earlier resume of this run is not advanced yet"


def _outcome(exc: BaseException) -> Attempt:
    """What an attempt that raised ``exc`` comes to."""
    if isinstance(exc, _Undo):
        if exc.status == "duplicate":
            return Attempt(Kind.DUPLICATE)
        return Attempt(Kind.NOT_READY, 1.0, _BEHIND)
    if isinstance(exc, Retry):
        return Attempt(Kind.NOT_READY, exc.after, exc.reason)
    if isinstance(exc, UnverifiedResume):
        return Attempt(Kind.UNVERIFIED, detail=str(exc))
    if isinstance(exc, psycopg.Error) and exc.sqlstate == UNVERIFIED:
        return Attempt(Kind.UNVERIFIED, detail=exc.diag.message_primary or "")
    if isinstance(exc, psycopg.OperationalError | PoolTimeout):
        return Attempt(Kind.TRANSIENT, detail=describe_error(exc))
    if isinstance(exc, TimeoutError):
        return Attempt(Kind.FAILED, detail="the handler did not finish within its timeout")
    return Attempt(Kind.FAILED, detail=describe_error(exc))


def is_async(handler: Handler) -> bool:
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 (an object with an async __call__)
    )


# Beyond the handlers' own time, the most an attempt's transaction may take (a connection,
# the advance, the commit): a database that stops answering fails the attempt, which is
# then tried again, rather than holding the run for ever.
DATABASE_BOUND_S = 30.0

# How long each call of the handler took (seconds): what the batch size is tuned by.
Timed = Callable[[float], None]


def _message(resume: ResumeData) -> str:
    if resume.message is None:  # the worker reads every resume from its message
        raise UnverifiedResume(f"resume {resume.resolution_id} has no message")
    return resume.message


def _answer(status: str) -> Attempt:
    if status == "advanced":
        return Attempt(Kind.ADVANCED)
    if status == "duplicate":
        return Attempt(Kind.DUPLICATE)
    return Attempt(Kind.NOT_READY, 1.0, _BEHIND)


def _span(resume: ResumeData) -> AbstractContextManager[Any]:
    """The handling's span, a child of the event's (no span at all when tracing is off)."""
    if not tracing.enabled():
        return nullcontext()
    attributes = {
        "matcher.run_id": resume.run_id, "matcher.tenant": resume.tenant,
        "matcher.wait_id": str(resume.wait_id), "matcher.resolution_id": str(resume.resolution_id),
        "matcher.outcome": str(resume.outcome),
    }  # fmt: skip
    return tracing.span("matcher.resume handle", resume.traceparent, attributes)


async def _handle_async(
    handler: AsyncHandler, conn: Any, resume: ResumeData, timeout_s: float, timed: Timed
) -> None:
    began = time.monotonic()
    with _span(resume):
        async with asyncio.timeout(timeout_s):
            await handler(conn, resume)
    timed(time.monotonic() - began)
    crash_point("worker.in_handler")


def _handle_sync(handler: SyncHandler, conn: Any, resume: ResumeData, timed: Timed) -> None:
    began = time.monotonic()
    with _span(resume):
        handler(conn, resume)
    timed(time.monotonic() - began)
    crash_point("worker.in_handler")


async def _one_async(
    pool: AsyncConnectionPool, handler: AsyncHandler, resume: ResumeData, timeout_s: float,
    timed: Timed,
) -> Attempt:  # fmt: skip
    try:
        async with (
            asyncio.timeout(timeout_s + DATABASE_BOUND_S),
            pool.connection() as conn,
            conn.transaction(),
        ):
            crash_point("worker.before_advance")
            [status] = await advance_each_async(conn, [_message(resume)])
            if status != "advanced":
                raise _Undo(status)
            await _handle_async(handler, conn, resume, timeout_s, timed)
    except Exception as exc:  # the handler is user code: every failure is an outcome
        return _outcome(exc)
    crash_point("worker.after_commit")
    return Attempt(Kind.ADVANCED)


async def attempt_async(
    pool: AsyncConnectionPool,
    handler: AsyncHandler,
    resumes: list[ResumeData],
    timeout_s: float,
    timed: Timed,
) -> list[Attempt]:
    """Each resume's attempt, in one transaction when they are several (the handler
    called for each that advanced its run), alone when that fails."""
    if len(resumes) == 1:
        return [await _one_async(pool, handler, resumes[0], timeout_s, timed)]
    try:
        async with (
            asyncio.timeout(timeout_s * len(resumes) + DATABASE_BOUND_S),
            pool.connection() as conn,
            conn.transaction(),
        ):
            crash_point("worker.before_advance")
            statuses = await advance_each_async(conn, [_message(r) for r in resumes])
            for resume, status in zip(resumes, statuses, strict=True):
                if status == "advanced":
                    await _handle_async(handler, conn, resume, timeout_s, timed)
    except Exception:  # one resume's outcome: found by attempting each alone
        return [await _one_async(pool, handler, r, timeout_s, timed) for r in resumes]
    crash_point("worker.after_commit")
    return [_answer(status) for status in statuses]


def _one_sync(
    pool: ConnectionPool, handler: SyncHandler, resume: ResumeData, timed: Timed
) -> Attempt:
    try:
        with pool.connection() as conn, conn.transaction():
            crash_point("worker.before_advance")
            [status] = advance_each(conn, [_message(resume)])
            if status != "advanced":
                raise _Undo(status)
            _handle_sync(handler, conn, resume, timed)
    except Exception as exc:  # the handler is user code: every failure is an outcome
        return _outcome(exc)
    crash_point("worker.after_commit")
    return Attempt(Kind.ADVANCED)


def attempt_sync(
    pool: ConnectionPool, handler: SyncHandler, resumes: list[ResumeData], timed: Timed
) -> list[Attempt]:
    """``attempt_async`` for a sync handler, run in a worker thread (not interrupted)."""
    if len(resumes) == 1:
        return [_one_sync(pool, handler, resumes[0], timed)]
    try:
        with pool.connection() as conn, conn.transaction():
            crash_point("worker.before_advance")
            statuses = advance_each(conn, [_message(r) for r in resumes])
            for resume, status in zip(resumes, statuses, strict=True):
                if status == "advanced":
                    _handle_sync(handler, conn, resume, timed)
    except Exception:  # one resume's outcome: found by attempting each alone
        return [_one_sync(pool, handler, r, timed) for r in resumes]
    crash_point("worker.after_commit")
    return [_answer(status) for status in statuses]


def as_async(handler: Handler) -> AsyncHandler:
    return cast(AsyncHandler, handler)


def as_sync(handler: Handler) -> SyncHandler:
    return cast(SyncHandler, handler)
