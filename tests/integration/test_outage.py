"""Kafka goes away under a running daemon: resolutions wait in the outbox, none is lost,
and the daemon publishes them when the broker is back. Uses a private stack of its own,
since it stops the broker."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from matcher.config import Settings
from matcher.devstack import kafka as devstack_kafka
from matcher.devstack.stack import Devstack, project_root
from matcher.domain.waits import WaitSpec
from matcher.kafka.topics import ensure_topics
from matcher.sdk import cancel_wait, register_wait
from matcher.store.migrate import migrate
from tests.helpers import DaemonProcess, eventually, process_env, read_resumes, scalar

pytestmark = pytest.mark.slow


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


def _published(settings: Settings) -> int:
    return int(
        scalar(settings, "SELECT count(*) FROM matcher.outbox WHERE published_at IS NOT NULL")
    )


async def test_relay_survives_kafka_outage(private_settings: tuple[Devstack, Settings]) -> None:
    stack, settings = private_settings
    daemon = DaemonProcess(process_env(settings))
    daemon.wait_ready()
    try:
        _cancel_new_waits(settings, 20)
        await eventually(lambda: _published(settings) == 20, timeout=30)

        devstack_kafka.stop(stack.kafka)
        _cancel_new_waits(settings, 20)
        await asyncio.sleep(5)
        assert _published(settings) == 20, "published while the broker was down?"
        assert daemon.process.poll() is None, "the daemon died with the broker:\n" + daemon.output

        await asyncio.to_thread(stack.up)
        await eventually(lambda: _published(settings) == 40, timeout=90)
    finally:
        code = daemon.terminate()
    assert code == 0, daemon.output
    resumes = await read_resumes(settings, at_least=40)
    assert len({r.resolution_id for r in resumes}) == 40


async def _under_load(stack: Devstack, settings: Settings, total: int, fault: str) -> DaemonProcess:
    from tests.helpers import all_published as _all_settled
    from tests.helpers import event, produce
    from tests.helpers import register_waits as _register

    correlations = _register(settings, total)
    events = [event(correlation=c) for c in correlations]
    daemon = DaemonProcess(process_env(settings))
    daemon.wait_ready()

    async def produce_with_retries() -> None:
        for start in range(0, total, 50):
            while True:
                try:
                    await produce(settings, events[start : start + 50])
                    break
                except Exception:  # the broker is down for a while: the producer retries
                    await asyncio.sleep(0.5)
            await asyncio.sleep(0.05)

    producing = asyncio.create_task(produce_with_retries())
    await eventually(
        lambda: (scalar(settings, "SELECT count(*) FROM matcher.outbox") or 0) > total // 5,
        timeout=60,
    )
    if fault == "kafka":
        await asyncio.to_thread(devstack_kafka.stop, stack.kafka)
        await asyncio.sleep(3)
        await asyncio.to_thread(stack.up)
    else:
        from matcher.devstack import postgres as devstack_postgres

        await asyncio.to_thread(devstack_postgres.stop, stack.postgres)
        await asyncio.sleep(3)
        await asyncio.to_thread(stack.up)
    await producing
    await eventually(lambda: _all_settled(settings, total), timeout=120)
    return daemon


@pytest.mark.parametrize("fault", ["kafka", "postgres"])
async def test_restart_under_load(private_settings: tuple[Devstack, Settings], fault: str) -> None:
    from tests.helpers import check_exactly_once as _check_exactly_once

    stack, settings = private_settings
    total = 1000
    daemon = await _under_load(stack, settings, total, fault)
    assert daemon.process.poll() is None, f"the daemon died with {fault}:\n" + daemon.output
    assert daemon.terminate() == 0, daemon.output
    await _check_exactly_once(settings, total)
