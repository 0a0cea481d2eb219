"""Hard crashes at named points, and SIGTERM under load: nothing lost, nothing doubled.

Each crash is a real SIGKILL of a real ``matcher run`` process (see matcher.faults).
After a restart every run must advance exactly once through ``advance``, and the resume
the next worker reads must name the event that resolved the wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import uuid
from collections.abc import Iterator

import pytest

from matcher.config import Settings
from tests.support.assertions import check_exactly_once, env_flag, eventually
from tests.support.db import all_published, register_waits, scalar
from tests.support.kafka import produce, produce_paced
from tests.support.processes import DaemonProcess, process_env
from tests.support.records import event

CRASH_POINTS = [
    "ingest.in_transaction",
    "ingest.after_db_commit",
    "relay.before_publish",
    "relay.after_publish",
    "sweeper.in_transaction",
    "rematch.in_transaction",
]


# The crashing daemon's group session: the recovering daemon's group can form only once
# the coordinator has given up on the killed member, so each iteration waited out the
# tests' 3 s session (3 of its 5 s). A shorter one is a daemon the coordinator drops
# sooner if its heartbeats stall: a rebalance, which the test survives like any other.
CRASHING_SESSION = {
    "MATCHER_KAFKA_SESSION_TIMEOUT_MS": "1000",  # the devstack broker's least
    "MATCHER_KAFKA_HEARTBEAT_INTERVAL_MS": "250",
}


def _through(settings: Settings, point: str, correlations: list[str]) -> bool:
    """Whether the events of ``correlations`` are past ``point``: stored (ingest), or
    their resumes published (relay)."""
    if point.startswith("ingest"):
        done = scalar(
            settings,
            "SELECT count(*) FROM matcher.inbox WHERE correlation_id = ANY(%s)",
            [correlations],
        )
    else:
        done = scalar(
            settings,
            "SELECT count(*) FROM matcher.resolutions WHERE run_id = ANY(%s) AND published",
            [[f"run-{c}" for c in correlations]],
        )
    return bool(done == len(correlations))


@contextlib.contextmanager
def _reaped(daemon: DaemonProcess) -> Iterator[DaemonProcess]:
    """The daemon, killed if the block leaves it running (a failed assertion, a timeout):
    a failing test leaves no daemon behind, consuming and committing for ever."""
    try:
        yield daemon
    finally:
        if daemon.process.poll() is None:
            daemon.kill()


def _died_or_through(
    daemon: DaemonProcess, settings: Settings, point: str, correlations: list[str]
) -> bool:
    return daemon.process.poll() is not None or _through(settings, point, correlations)


async def _store_early_events(settings: Settings, correlations: list[str]) -> None:
    """Events for waits not yet registered: stored, and pending."""
    await produce(settings, [event(correlation=c) for c in correlations])
    query = "SELECT count(*) FROM matcher.inbox WHERE correlation_id = ANY(%s)"

    def stored() -> bool:
        return bool(scalar(settings, query, [correlations]) == len(correlations))

    await eventually(stored, timeout=60, what="the early events stored")


async def _two_bursts(
    settings: Settings,
    crashing: DaemonProcess,
    point: str,
    arrival: int,
    correlations: list[str],
) -> None:
    """Two bursts (of events, or for the rematch pass of registrations), so the crash
    lands on the first batch (@1) or a later one (@2). For @2 the second burst goes once
    the first is through the point, or once the daemon died already (the first burst
    took two batches): then the second arrival is certain, whatever their timing."""
    half = len(correlations) // 2
    first, second = correlations[:half], correlations[half:]

    async def burst(part: list[str]) -> None:
        if point.startswith("rematch"):
            await asyncio.to_thread(register_waits, settings, len(part), correlations=part)
        else:
            await produce(settings, [event(correlation=c) for c in part])

    await burst(first)
    if arrival == 2:
        await eventually(
            functools.partial(_died_or_through, crashing, settings, point, first),
            timeout=60,
            what=f"the first burst through {point}",
        )
    await burst(second)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("point", CRASH_POINTS)
async def test_crash_at_point_then_recover(settings: Settings, point: str) -> None:
    iterations = env_flag("MATCHER_TEST_CRASH_ITERATIONS", 10)
    total = 0
    for iteration in range(iterations):
        count = 60
        arrival = 1 + iteration % 2
        rematching = point.startswith("rematch")
        # For the rematch pass the events come first (the waits once the daemon runs).
        correlations = (
            [f"early-{uuid.uuid4().hex[:10]}" for _ in range(count)]
            if rematching
            else register_waits(
                settings, count, deadline_s=0.5 if point.startswith("sweeper") else None
            )
        )
        total += count
        crash_at = f"{point}@{arrival}"
        crashing = DaemonProcess(
            process_env(settings, MATCHER_TEST_CRASH_AT=crash_at, **CRASHING_SESSION)
        )
        with _reaped(crashing):
            crashing.wait_ready()
            if rematching:
                await _store_early_events(settings, correlations)
            if not point.startswith("sweeper"):
                await _two_bursts(settings, crashing, point, arrival, correlations)
            code = await asyncio.to_thread(crashing.wait_exit, 60)
        assert code == -signal.SIGKILL, crashing.output
        assert f"test crash point {point} reached" in crashing.output

        with _reaped(DaemonProcess(process_env(settings))) as recovering:
            recovering.wait_ready()
            try:
                await eventually(functools.partial(all_published, settings, total), timeout=60)
            finally:
                assert recovering.terminate() == 0, recovering.output
    await check_exactly_once(settings, total)


async def test_sigterm_under_load_loses_and_doubles_nothing(settings: Settings) -> None:
    total = env_flag("MATCHER_TEST_LOAD_EVENTS", 1500)
    correlations = register_waits(settings, total)
    events = [event(correlation=c) for c in correlations]
    with contextlib.ExitStack() as daemons:
        first = daemons.enter_context(_reaped(DaemonProcess(process_env(settings))))
        first.wait_ready()
        # Paced, so the stop lands mid-stream: sent at once, the daemon had stored them all
        # before its graceful stop finished, and the test had nothing left to check.
        producing = asyncio.create_task(produce_paced(settings, events, pause=0.1))
        await eventually(
            lambda: (
                (scalar(settings, "SELECT count(*) FROM matcher.resolutions") or 0) > total // 10
            ),
            timeout=60,
        )
        assert await asyncio.to_thread(first.terminate) == 0, first.output
        await producing
        stored_at_stop = scalar(settings, "SELECT count(*) FROM matcher.inbox")
        assert stored_at_stop < total, "the stop came too late to test anything"

        second = daemons.enter_context(_reaped(DaemonProcess(process_env(settings))))
        second.wait_ready()
        try:
            await eventually(lambda: all_published(settings, total), timeout=120)
        finally:
            assert second.terminate() == 0, second.output
    await check_exactly_once(settings, total)


async def test_members_join_and_leave_the_group_under_load(settings: Settings) -> None:
    """Rebalances mid-batch: a second and third daemon join, one leaves, one is killed."""
    total = env_flag("MATCHER_TEST_LOAD_EVENTS", 1500)
    correlations = register_waits(settings, total)
    events = [event(correlation=c) for c in correlations]

    def resolved() -> int:
        return int(scalar(settings, "SELECT count(*) FROM matcher.resolutions") or 0)

    with contextlib.ExitStack() as daemons:

        def daemon() -> DaemonProcess:
            started = daemons.enter_context(_reaped(DaemonProcess(process_env(settings))))
            started.wait_ready()
            return started

        a = daemon()
        producing = asyncio.create_task(produce_paced(settings, events, pause=0.05))
        await eventually(lambda: resolved() > total // 8, timeout=60)
        b = daemon()
        await eventually(lambda: resolved() > total // 3, timeout=60)
        assert await asyncio.to_thread(a.terminate) == 0, a.output
        c = daemon()
        await eventually(lambda: resolved() > total // 2, timeout=60)
        b.kill()  # its partitions move once the group notices (session timeout)
        await producing
        try:
            await eventually(lambda: all_published(settings, total), timeout=120)
        finally:
            assert await asyncio.to_thread(c.terminate) == 0, c.output
    await check_exactly_once(settings, total)
