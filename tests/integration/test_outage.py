"""Kafka or Postgres goes away under a running daemon: resolutions wait in the outbox,
none is lost, and the daemon publishes them when the service is back. Uses a private stack
of its own, since it stops the services.

Nothing here waits without a deadline: each produce attempt is bounded (and retried: a
duplicate is harmless, the inbox dedupes by event id), every condition is awaited with
``eventually``, the daemon is stopped (or killed) whatever happens, and the module has a
timeout of its own (pytest-timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
import uuid
from collections.abc import Iterator, Sequence

import psycopg
import pytest
from matcher_devstack import kafka as devstack_kafka
from matcher_devstack import postgres as devstack_postgres
from matcher_devstack.stack import Devstack, project_root

from matcher.config import Settings
from matcher.domain.events import CompletionEvent
from matcher.domain.waits import WaitSpec
from matcher.kafka.topics import ensure_topics
from matcher.sdk import cancel_wait, register_wait
from matcher.store.migrate import migrate
from tests.support.assertions import check_exactly_once, eventually
from tests.support.db import all_published, published, register_waits, scalar
from tests.support.kafka import produce, read_resumes
from tests.support.processes import DaemonProcess, process_env
from tests.support.records import event

# A private stack starts in ~20 s; a restart under load takes a minute or two, more on a
# loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# One attempt to produce a chunk (start, send, acknowledgements, stop): past it the attempt
# is abandoned and the chunk produced again. And the longest the whole load may take.
PRODUCE_ATTEMPT_S = 10.0
PRODUCE_DEADLINE_S = 240.0


@pytest.fixture
def private_settings() -> Iterator[tuple[Devstack, Settings]]:
    home = project_root() / ".devstack" / "tests" / uuid.uuid4().hex[:8]
    stack = Devstack(home=home, cache=Devstack().cache)
    try:
        stack.up()
        env = stack.env()
        settings = Settings(
            kafka_bootstrap_servers=env["MATCHER_KAFKA_BOOTSTRAP_SERVERS"],
            database_url=env["MATCHER_DATABASE_URL"],
            relay_poll_interval_s=0.2,
            ingest_poll_timeout_ms=50,
            allow_unsigned=True,
            admin_address="127.0.0.1:0",
        )
        migrate(settings.database_url.get_secret_value())
        asyncio.run(
            ensure_topics(
                settings.kafka_client_options(),
                [settings.events_topic, settings.resume_topic],
                partitions=settings.topic_partitions,
            )
        )
        yield stack, settings
    finally:
        stack.down()
        shutil.rmtree(home, ignore_errors=True)


def _cancel_new_waits(settings: Settings, count: int) -> None:
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        for _ in range(count):
            wait = register_wait(
                conn,
                WaitSpec(
                    tenant="acme",
                    run_id=f"run-{uuid.uuid4().hex[:8]}",
                    position=0,
                    event_types=["job.completed"],
                    correlation_id=uuid.uuid4().hex,
                ),
            )
            assert cancel_wait(conn, wait.id)


@contextlib.contextmanager
def running(settings: Settings) -> Iterator[DaemonProcess]:
    """``matcher run`` as a process, ready; killed when the block ends with it still
    running (a test that stops it says how: ``terminate``)."""
    daemon = DaemonProcess(process_env(settings))
    try:
        daemon.wait_ready()
        yield daemon
    finally:
        if daemon.process.poll() is None:
            daemon.kill()


async def produce_until_acknowledged(
    settings: Settings, events: Sequence[CompletionEvent], *, chunk: int = 50
) -> None:
    """``events`` in chunks, each produced again until Kafka acknowledges it (the broker
    may be away for a while), each attempt bounded; AssertionError past
    PRODUCE_DEADLINE_S."""
    deadline = time.monotonic() + PRODUCE_DEADLINE_S
    for start in range(0, len(events), chunk):
        while True:
            try:
                await produce(settings, events[start : start + chunk], timeout=PRODUCE_ATTEMPT_S)
                break
            except Exception as exc:  # the broker is away, or the attempt took too long
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"events {start}.. not acknowledged within {PRODUCE_DEADLINE_S}s"
                    ) from exc
                await asyncio.sleep(0.5)
        await asyncio.sleep(0.05)


async def test_relay_survives_kafka_outage(private_settings: tuple[Devstack, Settings]) -> None:
    stack, settings = private_settings
    with running(settings) as daemon:
        _cancel_new_waits(settings, 20)
        await eventually(lambda: published(settings) == 20, timeout=30)

        await asyncio.to_thread(devstack_kafka.stop, stack.kafka)
        _cancel_new_waits(settings, 20)
        await asyncio.sleep(5)
        assert published(settings) == 20, "published while the broker was down?"
        assert daemon.process.poll() is None, "the daemon died with the broker:\n" + daemon.output

        await asyncio.to_thread(stack.up)
        await eventually(lambda: published(settings) == 40, timeout=90)
        assert daemon.terminate() == 0, daemon.output
    resumes = await read_resumes(settings, at_least=40)
    assert len({r.resolution_id for r in resumes}) == 40


def _resolved(settings: Settings) -> int:
    return int(scalar(settings, "SELECT count(*) FROM matcher.resolutions") or 0)


async def _restart(stack: Devstack, fault: str) -> None:
    if fault == "kafka":
        await asyncio.to_thread(devstack_kafka.stop, stack.kafka)
    else:
        await asyncio.to_thread(devstack_postgres.stop, stack.postgres)
    await asyncio.sleep(3)
    await asyncio.to_thread(stack.up)


@pytest.mark.parametrize("fault", ["kafka", "postgres"])
async def test_restart_under_load(private_settings: tuple[Devstack, Settings], fault: str) -> None:
    stack, settings = private_settings
    total = 1000
    events = [event(correlation=c) for c in register_waits(settings, total)]
    with running(settings) as daemon:
        producing = asyncio.create_task(produce_until_acknowledged(settings, events))
        try:
            await eventually(lambda: _resolved(settings) > total // 5, timeout=60)
            await _restart(stack, fault)
            # Bounded inside (each attempt, and the whole); this bound is a second one.
            await asyncio.wait_for(producing, PRODUCE_DEADLINE_S + 60)
        finally:
            producing.cancel()
            with contextlib.suppress(BaseException):
                await producing
        await eventually(lambda: all_published(settings, total), timeout=120)
        assert daemon.process.poll() is None, f"the daemon died with {fault}:\n" + daemon.output
        assert daemon.terminate() == 0, daemon.output
    await check_exactly_once(settings, total)
