"""Recovery from the database alone: the resolutions no worker advanced, and parked
resumes given back to the workers. What a worker needs when its consumer offsets are lost,
the topic's retention expired or the topic was deleted; the resume worker's sweep uses
the same calls."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID

from matcher.store.worker_api import (
    AsyncConn,
    Conn,
    Unadvanced,
    call,
    call_async,
    retry_parked_call,
    unadvanced,
    unadvanced_async,
    unadvanced_params,
)

# The most resolutions one call hands back: a worker pages by ``since``.
MAX_UNADVANCED = 10_000


def _params(
    tenant: str | None,
    run_prefix: str | None,
    older_than: timedelta,
    since: datetime | None,
    limit: int,
) -> dict[str, object]:
    if not 1 <= limit <= MAX_UNADVANCED:
        raise ValueError(f"limit must be between 1 and {MAX_UNADVANCED}")
    if older_than < timedelta(0):
        raise ValueError("older_than must not be negative")
    now = datetime.now(UTC)
    return unadvanced_params(
        tenant=tenant,
        run_prefix=run_prefix,
        committed_before=now - older_than,
        committed_after=since if since is not None else datetime.min.replace(tzinfo=UTC),
        max_rows=limit,
    )


def unadvanced_resolutions(
    conn: Conn,
    *,
    tenant: str | None = None,
    run_prefix: str | None = None,
    older_than: timedelta = timedelta(0),
    since: datetime | None = None,
    limit: int = 1000,
) -> list[Unadvanced]:
    """Resolutions committed more than ``older_than`` ago (and after ``since``) whose run no
    worker advanced past them and that are not parked, oldest first, each with its resume
    as committed (``matcher.unadvanced_resolutions_v1``): hand each to ``advance`` in the
    transaction of the run's next step, as if it had come from the topic."""
    params = _params(tenant, run_prefix, older_than, since, limit)
    return unadvanced(conn, params)


async def unadvanced_resolutions_async(
    conn: AsyncConn,
    *,
    tenant: str | None = None,
    run_prefix: str | None = None,
    older_than: timedelta = timedelta(0),
    since: datetime | None = None,
    limit: int = 1000,
) -> list[Unadvanced]:
    """``unadvanced_resolutions`` for asyncio workers."""
    params = _params(tenant, run_prefix, older_than, since, limit)
    return await unadvanced_async(conn, params)


def retry_parked(
    conn: Conn,
    *,
    tenant: str | None = None,
    run_id: str | None = None,
    wait_id: UUID | str | None = None,
    resolution_id: UUID | str | None = None,
) -> int:
    """Give parked resumes back to the workers (``matcher.retry_parked_v1``): by resolution,
    by wait, or by run (tenant and run id). Their attempts start again and the workers'
    sweeps hand them to the handler; returns how many were parked."""
    made = retry_parked_call(
        tenant=tenant, run_id=run_id, wait_id=wait_id, resolution_id=resolution_id
    )
    return call(conn, made)


async def retry_parked_async(
    conn: AsyncConn,
    *,
    tenant: str | None = None,
    run_id: str | None = None,
    wait_id: UUID | str | None = None,
    resolution_id: UUID | str | None = None,
) -> int:
    """``retry_parked`` for asyncio workers."""
    made = retry_parked_call(
        tenant=tenant, run_id=run_id, wait_id=wait_id, resolution_id=resolution_id
    )
    return await call_async(conn, made)
