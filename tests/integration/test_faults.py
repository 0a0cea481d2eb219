"""Faults under load on the shared stack: connections killed under the daemon, and a batch
that outlives the consumer's poll interval and session."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import psycopg

from matcher.config import Settings
from tests.support.assertions import check_exactly_once, env_flag, eventually
from tests.support.db import all_published, register_waits, scalar
from tests.support.kafka import produce
from tests.support.processes import DaemonProcess, process_env
from tests.support.records import event


def _stored_at_least(settings: Settings, count: int) -> Callable[[], bool]:
    return lambda: int(scalar(settings, "SELECT count(*) FROM matcher.inbox") or 0) >= count


def _resolved(settings: Settings) -> int:
    return int(scalar(settings, "SELECT count(*) FROM matcher.resolutions") or 0)


async def test_terminated_connections_are_survived(settings: Settings) -> None:
    total = env_flag("MATCHER_TEST_LOAD_EVENTS", 1500)
    correlations = register_waits(settings, total)
    events = [event(correlation=c) for c in correlations]
    daemon = DaemonProcess(process_env(settings))
    daemon.wait_ready()
    killed = 0

    async def produce_slowly() -> None:
        for start in range(0, total, 50):
            await produce(settings, events[start : start + 50])
            await asyncio.sleep(0.05)

    try:
        producing = asyncio.create_task(produce_slowly())
        url = settings.database_url.get_secret_value()
        # pg_terminate_backend on every daemon connection, four times, each once another
        # fifth of the events is stored: mid-work on a fast machine and a slow one alike.
        for fifth in range(1, 5):
            await eventually(
                _stored_at_least(settings, fifth * total // 5),
                timeout=120,
                what=f"{fifth}/5 of the events stored",
            )
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                ).fetchone()
                killed += row[0] if row else 0
        await producing
        await eventually(lambda: all_published(settings, total), timeout=120)
        # Throughput recovered: a fresh burst after the last kill is handled promptly.
        more = register_waits(settings, 200)
        await produce(settings, [event(correlation=c) for c in more])
        await eventually(lambda: all_published(settings, total + 200), timeout=30)
    finally:
        assert daemon.terminate() == 0, daemon.output
    assert killed >= 4, "the daemon had no connections to kill?"
    assert daemon.process.returncode == 0
    await check_exactly_once(settings, total + 200)


async def test_a_batch_outliving_the_poll_interval_is_evicted_not_doubled(
    settings: Settings,
) -> None:
    total = 300
    correlations = register_waits(settings, total)
    env = process_env(
        settings,
        MATCHER_INGEST_MAX_POLL_INTERVAL_MS="1500",
        # The second batch stalls the whole process for 5 s inside its transaction:
        # longer than the poll interval and the session (3 s).
        MATCHER_TEST_STALL_AT="ingest.in_transaction@2:5",
        MATCHER_INGEST_BATCH_MAX="50",
    )
    daemon = DaemonProcess(env)
    daemon.wait_ready()
    try:
        await produce(settings, [event(correlation=c) for c in correlations])
        await eventually(lambda: all_published(settings, total), timeout=90)
        assert "test stall at ingest.in_transaction" in daemon.output
    finally:
        assert daemon.terminate() == 0, daemon.output
    await check_exactly_once(settings, total)
    # No endless loop: the group settled, and each record was stored once.
    assert scalar(settings, "SELECT count(*) FROM matcher.inbox") == total
