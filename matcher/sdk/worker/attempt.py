"""One attempt at one resume: in one transaction, advance the run (which verifies the
resume) and, when this attempt is the one that advanced it, call the handler with that
same transaction; then commit. Whatever the handler writes commits with the advance, or
neither does (invariant 11): a crash before the commit leaves the resume to be handled
again, a crash after it leaves nothing to redo.
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass
from enum import StrEnum
from typing import cast

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from matcher.domain.resume import ResumeData
from matcher.faults import crash_point
from matcher.logs import describe_error
from matcher.sdk.worker.handler import AsyncHandler, Handler, Retry, SyncHandler
from matcher.store.worker_api import UNVERIFIED, UnverifiedResume, advance_in, advance_in_async


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


async def attempt_async(
    pool: AsyncConnectionPool, handler: AsyncHandler, resume: ResumeData, timeout_s: float
) -> Attempt:
    try:
        async with pool.connection() as conn, conn.transaction():
            crash_point("worker.before_advance")
            status = await advance_in_async(conn, resume)
            if status != "advanced":
                raise _Undo(status)
            async with asyncio.timeout(timeout_s):
                await handler(conn, resume)
            crash_point("worker.in_handler")
    except Exception as exc:  # the handler is user code: every failure is an outcome
        return _outcome(exc)
    crash_point("worker.after_commit")
    return Attempt(Kind.ADVANCED)


def attempt_sync(pool: ConnectionPool, handler: SyncHandler, resume: ResumeData) -> Attempt:
    """``attempt_async`` for a sync handler, run in a worker thread (not interrupted)."""
    try:
        with pool.connection() as conn, conn.transaction():
            crash_point("worker.before_advance")
            status = advance_in(conn, resume)
            if status != "advanced":
                raise _Undo(status)
            handler(conn, resume)
            crash_point("worker.in_handler")
    except Exception as exc:  # the handler is user code: every failure is an outcome
        return _outcome(exc)
    crash_point("worker.after_commit")
    return Attempt(Kind.ADVANCED)


def as_async(handler: Handler) -> AsyncHandler:
    return cast(AsyncHandler, handler)


def as_sync(handler: Handler) -> SyncHandler:
    return cast(SyncHandler, handler)
