"""The worker API's functions (migration 0019, queries/worker_api.sql), called as a worker
in any language calls them: every call here is one ``SELECT matcher.<function>_v1(...)``
in the caller's transaction (a savepoint of it, so that a refusal leaves the caller's
transaction usable), and the logic lives in Postgres alone.

Each call is described once (``Call``: the block, its parameters, how its one row is
read) and run by ``call`` or ``call_async``, so the sync and async SDKs cannot drift.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar
from uuid import UUID

import psycopg
from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb

from matcher.domain.launches import Launch, LaunchSpec
from matcher.domain.resume import ResumeData, read_resume
from matcher.domain.waits import Wait, WaitSpec
from matcher.store.sql import query

Conn = psycopg.Connection[Any]  # any row factory: every call reads with its own cursor
AsyncConn = psycopg.AsyncConnection[Any]
T = TypeVar("T")

# SQLSTATEs the functions raise on purpose.
UNVERIFIED = "MR001"
NO_DATA = "P0002"
INVALID = "22023"


class UnverifiedResume(ValueError):
    """A resume that matcher did not commit: forged, altered, or addressed to another run.

    Raised by ``verify_resume`` and ``advance``; the run is left as it was. Log it and drop
    the message: it is either an attack or a bug, and retrying cannot make it true.
    """


@dataclass(frozen=True)
class Call(Generic[T]):
    block: str
    params: dict[str, Any]
    read: Callable[[tuple[Any, ...]], T]


def _translated(exc: psycopg.Error) -> Exception | None:
    message = exc.diag.message_primary or str(exc)
    if exc.sqlstate == UNVERIFIED:
        return UnverifiedResume(message.removeprefix("matcher: "))
    if exc.sqlstate == NO_DATA:
        return LookupError(message.removeprefix("matcher: "))
    if exc.sqlstate == INVALID:
        return ValueError(message.removeprefix("matcher: "))
    return None


def call(conn: Conn, made: Call[T]) -> T:
    """Run one call in the caller's transaction (its own on an autocommit connection)."""
    try:
        with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
            row = cur.execute(query("worker_api", made.block), made.params).fetchone()
    except psycopg.Error as exc:
        raise (_translated(exc) or exc) from exc
    assert row is not None
    return made.read(row)


async def call_async(conn: AsyncConn, made: Call[T]) -> T:
    """``call`` for asyncio workers."""
    try:
        async with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
            await cur.execute(query("worker_api", made.block), made.params)
            row = await cur.fetchone()
    except psycopg.Error as exc:
        raise (_translated(exc) or exc) from exc
    assert row is not None
    return made.read(row)


def _aware(moment: datetime | None, what: str) -> datetime | None:
    if moment is not None and moment.tzinfo is None:
        raise ValueError(f"{what} must be timezone-aware")
    return moment


def register_wait_call(spec: WaitSpec) -> Call[Wait]:
    params = spec.model_dump(mode="json", exclude={"deadline", "id"})
    params["deadline"] = _aware(spec.deadline, "deadline")
    params["id"] = spec.id
    params["conditions"] = None if spec.conditions is None else Jsonb(params["conditions"])
    return Call("register_wait", params, lambda row: Wait.model_validate(row[0]))


def record_launch_call(spec: LaunchSpec) -> Call[Launch]:
    params = spec.model_dump()
    params["deadline"] = _aware(spec.deadline, "deadline")
    return Call("record_launch", params, lambda row: Launch.model_validate(row[0]))


def record_job_id_call(launch_id: UUID | str, external_job_id: str) -> Call[bool]:
    params = {"launch_id": launch_id, "external_job_id": external_job_id}
    return Call("record_job_id", params, lambda row: bool(row[0]))


def get_wait_call(wait_id: UUID | str) -> Call[Wait | None]:
    return Call(
        "get_wait",
        {"wait_id": wait_id},
        lambda row: None if row[0] is None else Wait.model_validate(row[0]),
    )


def get_launch_call(launch_id: UUID | str) -> Call[Launch | None]:
    return Call(
        "get_launch",
        {"launch_id": launch_id},
        lambda row: None if row[0] is None else Launch.model_validate(row[0]),
    )


def cancel_wait_call(wait_id: UUID | str) -> Call[bool]:
    return Call("cancel_wait", {"wait_id": wait_id}, lambda row: bool(row[0]))


def issue_callback_call(wait_id: UUID | str) -> Call[str]:
    return Call("issue_callback", {"wait_id": wait_id}, lambda row: str(row[0]))


def committed_resume_call(
    wait_id: UUID | str, resolution_id: UUID | str | None = None
) -> Call[ResumeData | None]:
    params = {"wait_id": wait_id, "resolution_id": resolution_id}
    return Call(
        "committed_resume", params, lambda row: None if row[0] is None else read_resume(row[0])
    )


def message_of(resume: ResumeData) -> str:
    """The message ``resume`` was read from, checked to still say what it said then: the
    functions verify and advance by the message, so one altered after it was read is
    refused here rather than advanced by its original."""
    message = resume.message
    if message is None:
        raise UnverifiedResume(
            f"resume {resume.resolution_id} was not read from a message: read resumes with "
            "parse_resume (or committed_resume)"
        )
    as_read = ResumeData.model_validate(json.loads(message)["data"])
    # Compared as JSON, so that true and 1, or 1 and 1.0, are not taken for each other.
    if as_read.model_dump_json() != resume.model_dump_json():
        raise UnverifiedResume(f"resume {resume.resolution_id} was altered after it was read")
    return message


def verify_resume_call(resume: ResumeData) -> Call[None]:
    return Call("verify_resume", {"message": message_of(resume)}, lambda row: None)


def advance_call(resume: ResumeData) -> Call[str]:
    """'advanced', 'duplicate' or 'behind' (see ``matcher.advance_v1``)."""
    return Call("advance", {"message": message_of(resume)}, lambda row: str(row[0]))


def _answers(rows: list[tuple[Any, ...]], count: int) -> list[str]:
    found = {int(row[0]): str(row[1]) for row in rows}
    return [found.get(i, "duplicate") for i in range(1, count + 1)]


async def advance_each_async(conn: AsyncConn, messages: list[str]) -> list[str]:
    """``advance_v1`` of each message, in one statement in the caller's transaction (no
    savepoint: one refusal, SQLSTATE MR001, fails them all): the answers in order. For the
    resume worker, whose messages are the ones it read itself (no ``message_of`` check)
    and belong to distinct runs."""
    async with conn.cursor(row_factory=tuple_row) as cur:
        # Binary: a text[] sent as text is quoted and escaped by a regex, which for
        # messages full of quotes cost a third of the worker's time.
        await cur.execute(query("worker_api", "advance_each"), {"messages": messages}, binary=True)
        return _answers(await cur.fetchall(), len(messages))


def advance_each(conn: Conn, messages: list[str]) -> list[str]:
    """``advance_each_async`` for sync handlers."""
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(query("worker_api", "advance_each"), {"messages": messages})
        return _answers(cur.fetchall(), len(messages))


def record_failure_call(
    resume: ResumeData, error: str, max_attempts: int
) -> Call[tuple[int, bool]]:
    params = {"message": message_of(resume), "error": error, "max_attempts": max_attempts}
    return Call("record_worker_failure", params, lambda row: (int(row[0]), bool(row[1])))


def retry_parked_call(
    *,
    tenant: str | None = None,
    run_id: str | None = None,
    wait_id: UUID | str | None = None,
    resolution_id: UUID | str | None = None,
) -> Call[int]:
    params = {
        "tenant": tenant,
        "run_id": run_id,
        "wait_id": wait_id,
        "resolution_id": resolution_id,
    }
    return Call("retry_parked", params, lambda row: int(row[0]))


@dataclass(frozen=True)
class Unadvanced:
    """A resolution no worker advanced: its resume, and when it was committed."""

    resume: ResumeData
    committed_at: datetime


def unadvanced_params(
    *,
    tenant: str | None,
    run_prefix: str | None,
    committed_before: datetime,
    committed_after: datetime,
    max_rows: int,
) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "run_prefix": run_prefix,
        "committed_before": _aware(committed_before, "committed_before"),
        "committed_after": _aware(committed_after, "committed_after"),
        "max_rows": max_rows,
    }


def unadvanced(conn: Conn, params: dict[str, Any]) -> list[Unadvanced]:
    with conn.cursor(row_factory=tuple_row) as cur:
        rows = cur.execute(query("worker_api", "unadvanced_resolutions"), params).fetchall()
    return [Unadvanced(read_resume(row[6]), row[5]) for row in rows]


async def unadvanced_async(conn: AsyncConn, params: dict[str, Any]) -> list[Unadvanced]:
    async with conn.cursor(row_factory=tuple_row) as cur:
        await cur.execute(query("worker_api", "unadvanced_resolutions"), params)
        rows = await cur.fetchall()
    return [Unadvanced(read_resume(row[6]), row[5]) for row in rows]
