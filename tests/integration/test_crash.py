"""Hard crashes at named points, and SIGTERM under load: nothing lost, nothing doubled.

Each crash is a real SIGKILL of a real ``matcher run`` process (see matcher.daemon.faults).
After a restart every run must advance exactly once through ``advance``, and the resume
the next worker reads must name the event that resolved the wait.
"""

from __future__ import annotations

import asyncio
import functools
import signal
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from matcher.config import Settings
from matcher.domain.events import CompletionEvent
from matcher.domain.waits import WaitSpec
from matcher.sdk import advance, register_wait
from tests.helpers import (
    DaemonProcess,
    env_flag,
    event,
    eventually,
    process_env,
    produce,
    read_resumes,
    rows,
    scalar,
)

CRASH_POINTS = [
    "ingest.in_transaction",
    "ingest.after_db_commit",
    "relay.before_publish",
    "relay.after_publish",
    "sweeper.in_transaction",
]


def _register(settings: Settings, count: int, *, deadline_s: float | None = None) -> list[str]:
    correlations = [f"crash-{uuid.uuid4().hex[:10]}" for _ in range(count)]
    deadline = datetime.now(UTC) + timedelta(seconds=deadline_s) if deadline_s else None
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        for n, correlation in enumerate(correlations):
            register_wait(
                conn,
                WaitSpec(
                    tenant="acme",
                    run_id=f"run-{correlation}",
                    position=n % 3,
                    event_types=["job.completed"],
                    correlation_id=correlation,
                    deadline=deadline,
                ),
            )
    return correlations


def _all_settled(settings: Settings, total: int) -> bool:
    published = scalar(
        settings, "SELECT count(*) FROM matcher.outbox WHERE published_at IS NOT NULL"
    )
    return bool(published == total)


async def _check_exactly_once(settings: Settings, total: int) -> None:
    resumes = await read_resumes(settings, at_least=total)
    waits = {
        str(r["id"]): r
        for r in rows(settings, "SELECT * FROM matcher.waits WHERE state <> 'waiting'")
    }
    assert len(waits) == total
    advanced: dict[str, int] = {}
    with psycopg.connect(settings.database_url.get_secret_value()) as conn:
        for resume in resumes:  # duplicates included: the relay is at-least-once
            wait = waits[str(resume.wait_id)]
            if resume.outcome == "event":
                assert resume.event is not None
                assert (resume.event.source, resume.event.id) == (
                    wait["resolved_by_producer"],
                    wait["resolved_by_event_id"],
                )
            if advance(conn, resume):
                advanced[str(resume.wait_id)] = advanced.get(str(resume.wait_id), 0) + 1
    assert advanced == dict.fromkeys(waits, 1)
    assert scalar(settings, "SELECT count(*) FROM matcher.outbox") == total
    assert scalar(settings, "SELECT count(*) FROM matcher.inbox WHERE status = 'pending'") == 0


@pytest.mark.parametrize("point", CRASH_POINTS)
async def test_crash_at_point_then_recover(settings: Settings, point: str) -> None:
    iterations = env_flag("MATCHER_TEST_CRASH_ITERATIONS", 10)
    total = 0
    for iteration in range(iterations):
        sweeping = point.startswith("sweeper")
        count = 60
        correlations = _register(settings, count, deadline_s=0.5 if sweeping else None)
        total += count
        crashing = DaemonProcess(
            process_env(settings, MATCHER_TEST_CRASH_AT=f"{point}@{1 + iteration % 2}")
        )
        crashing.wait_ready()
        if not sweeping:
            # Two bursts, so the crash can land on the first or the second batch.
            half = count // 2
            await produce(settings, [event(correlation=c) for c in correlations[:half]])
            await asyncio.sleep(0.3)
            await produce(settings, [event(correlation=c) for c in correlations[half:]])
        code = await asyncio.to_thread(crashing.wait_exit, 60)
        assert code == -signal.SIGKILL, crashing.output
        assert f"test crash point {point} reached" in crashing.output

        recovering = DaemonProcess(process_env(settings))
        recovering.wait_ready()
        try:
            await eventually(functools.partial(_all_settled, settings, total), timeout=60)
        finally:
            assert recovering.terminate() == 0, recovering.output
    await _check_exactly_once(settings, total)


async def _produce_paced(
    settings: Settings, events: list[CompletionEvent], *, pause: float
) -> None:
    for start in range(0, len(events), 50):
        await produce(settings, events[start : start + 50])
        await asyncio.sleep(pause)


async def test_sigterm_under_load_loses_and_doubles_nothing(settings: Settings) -> None:
    total = env_flag("MATCHER_TEST_LOAD_EVENTS", 1500)
    correlations = _register(settings, total)
    events = [event(correlation=c) for c in correlations]
    first = DaemonProcess(process_env(settings))
    first.wait_ready()
    # Paced, so the stop lands mid-stream: sent at once, the daemon had stored them all
    # before its graceful stop finished, and the test had nothing left to check.
    producing = asyncio.create_task(_produce_paced(settings, events, pause=0.1))
    await eventually(
        lambda: (scalar(settings, "SELECT count(*) FROM matcher.outbox") or 0) > total // 10,
        timeout=60,
    )
    assert await asyncio.to_thread(first.terminate) == 0, first.output
    await producing
    stored_at_stop = scalar(settings, "SELECT count(*) FROM matcher.inbox")
    assert stored_at_stop < total, "the stop came too late to test anything"

    second = DaemonProcess(process_env(settings))
    second.wait_ready()
    try:
        await eventually(lambda: _all_settled(settings, total), timeout=120)
    finally:
        assert second.terminate() == 0, second.output
    await _check_exactly_once(settings, total)


async def test_members_join_and_leave_the_group_under_load(settings: Settings) -> None:
    """Rebalances mid-batch: a second and third daemon join, one leaves, one is killed."""
    total = env_flag("MATCHER_TEST_LOAD_EVENTS", 1500)
    correlations = _register(settings, total)
    events = [event(correlation=c) for c in correlations]

    def resolved() -> int:
        return int(scalar(settings, "SELECT count(*) FROM matcher.outbox") or 0)

    a = DaemonProcess(process_env(settings))
    a.wait_ready()
    producing = asyncio.create_task(_produce_paced(settings, events, pause=0.05))
    await eventually(lambda: resolved() > total // 8, timeout=60)
    b = DaemonProcess(process_env(settings))
    b.wait_ready()
    await eventually(lambda: resolved() > total // 3, timeout=60)
    assert await asyncio.to_thread(a.terminate) == 0, a.output
    c = DaemonProcess(process_env(settings))
    c.wait_ready()
    await eventually(lambda: resolved() > total // 2, timeout=60)
    b.kill()  # its partitions move once the group notices (session timeout)
    await producing
    try:
        await eventually(lambda: _all_settled(settings, total), timeout=120)
    finally:
        assert await asyncio.to_thread(c.terminate) == 0, c.output
    await _check_exactly_once(settings, total)
