"""What the integrations' waits share: a deadline given as one or the other, a launch
whose job is started at most once, and wait ids derived from their runs (so that a node or
tool run again finds the wait it registered)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from matcher.domain.launches import Answer, Found, Launch, LaunchSpec, NotFound
from matcher.store.launches import (
    claim_launch,
    claim_launch_async,
    record_job_id,
    record_job_id_async,
)

Submit = Callable[[Launch], str | None]
AsyncSubmit = Callable[[Launch], Awaitable[str | None]]
Lookup = Callable[[Launch], Answer]
AsyncLookup = Callable[[Launch], Awaitable[Answer]]

_WAIT_IDS = uuid.UUID("0b8f7c52-5c1e-4d8e-9a53-6f1f3b1f2a10")


def deadline_of(deadline: datetime | None, timeout: timedelta | None) -> datetime | None:
    if deadline is not None and timeout is not None:
        raise ValueError("give a deadline or a timeout, not both")
    return datetime.now(UTC) + timeout if timeout is not None else deadline


def wait_id_of(tenant: str, run_id: str) -> uuid.UUID:
    return uuid.uuid5(_WAIT_IDS, f"{tenant}\x1f{run_id}")


def _unsubmitted(launch: Launch) -> bool:
    return launch.external_job_id is None and launch.state == "intent"


def launch_once(conn: Any, spec: LaunchSpec, submit: Submit, lookup: Lookup | None) -> Launch:
    """Record the launch (committed) and start its job at most once: only the call that
    recorded it submits. A launch found recorded without a job id (the process died around
    ``submit``) is not submitted again; ``lookup``, when given, is asked (``Found``: its
    job id is stored; ``NotFound``: ``submit`` is called)."""
    launch, created = claim_launch(conn, spec)
    if _unsubmitted(launch):
        answer = None if created or lookup is None else lookup(launch)
        if created or isinstance(answer, NotFound):
            job_id = submit(launch)
            if job_id is not None:
                record_job_id(conn, launch.id, job_id)
        elif isinstance(answer, Found):
            record_job_id(conn, launch.id, answer.external_job_id)
    return launch


async def launch_once_async(
    conn: Any, spec: LaunchSpec, submit: AsyncSubmit, lookup: AsyncLookup | None
) -> Launch:
    """``launch_once`` for asyncio callers."""
    launch, created = await claim_launch_async(conn, spec)
    if _unsubmitted(launch):
        answer = None if created or lookup is None else await lookup(launch)
        if created or isinstance(answer, NotFound):
            job_id = await submit(launch)
            if job_id is not None:
                await record_job_id_async(conn, launch.id, job_id)
        elif isinstance(answer, Found):
            await record_job_id_async(conn, launch.id, answer.external_job_id)
    return launch
