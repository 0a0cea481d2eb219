"""The devstack against itself: idempotent up, data kept across down/up, --fresh wipes.

This runs a second, private stack (its own directory and ports; the jar cache is shared)
so that stopping it cannot disturb the stack the other tests use.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from matcher_devstack import kafka
from matcher_devstack.procs import port_in_use
from matcher_devstack.stack import Devstack, project_root

from matcher.kafka.topics import ensure_topics
from tests.support.kafka import started, within

pytestmark = pytest.mark.slow


@pytest.fixture
def private_stack() -> Iterator[Devstack]:
    # Under the project, not /tmp: Postgres runs as an unprivileged account when we are
    # root, and pytest's temporary directories are private to root.
    home = project_root() / ".devstack" / "tests" / uuid.uuid4().hex[:8]
    stack = Devstack(home=home, cache=Devstack().cache)
    try:
        yield stack
    finally:
        stack.down()
        shutil.rmtree(home, ignore_errors=True)


def _cli(stack: Devstack, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, MATCHER_DEVSTACK_DIR=str(stack.home))
    return subprocess.run(
        [sys.executable, "-m", "matcher", "devstack", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


async def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    await ensure_topics({"bootstrap_servers": bootstrap}, [topic], partitions=1)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all")
    async with started(producer):
        for value in values:
            await within(producer.send_and_wait(topic, value))


async def _read_all(bootstrap: str, topic: str, want: int) -> list[bytes]:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
    )
    got: list[bytes] = []
    async with started(consumer):
        deadline = time.monotonic() + 30
        while len(got) < want and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                got.extend(r.value for r in records)
    return got


def test_up_is_idempotent_and_down_up_keeps_data(private_stack: Devstack) -> None:
    ports = private_stack.up()
    pids = [s.pid for s in private_stack.status()]
    assert all(s.running for s in private_stack.status())

    started = time.monotonic()
    assert private_stack.up() == ports
    assert [s.pid for s in private_stack.status()] == pids, "a second up restarted a service"
    assert time.monotonic() - started < 15

    env = private_stack.env()
    bootstrap = env["MATCHER_KAFKA_BOOTSTRAP_SERVERS"]
    asyncio.run(_produce(bootstrap, "kept", [b"one", b"two", b"three"]))
    with psycopg.connect(env["MATCHER_DATABASE_URL"]) as conn:
        conn.execute("CREATE TABLE kept (v text)")
        conn.execute("INSERT INTO kept VALUES ('a'), ('b')")

    private_stack.down()
    assert not any(s.running for s in private_stack.status())
    assert not port_in_use(ports.kafka)
    assert not port_in_use(ports.postgres)

    assert private_stack.up() == ports
    assert asyncio.run(_read_all(bootstrap, "kept", 3)) == [b"one", b"two", b"three"]
    with psycopg.connect(env["MATCHER_DATABASE_URL"]) as conn:
        assert conn.execute("SELECT count(*) FROM kept").fetchone() == (2,)

    private_stack.up(fresh=True)
    env = private_stack.env()
    with psycopg.connect(env["MATCHER_DATABASE_URL"]) as conn:
        found = conn.execute("SELECT to_regclass('public.kept')").fetchone()
        assert found == (None,)


def test_cli_env_and_status(private_stack: Devstack) -> None:
    missing = _cli(private_stack, "env")
    assert missing.returncode == 1
    assert "run `matcher devstack up` first" in missing.stderr

    up = _cli(private_stack, "up")
    assert up.returncode == 0, up.stderr

    env = _cli(private_stack, "env")
    assert env.returncode == 0
    exported = dict(line.removeprefix("export ").split("=", 1) for line in env.stdout.splitlines())
    assert exported == private_stack.env()

    status = _cli(private_stack, "status", "--json")
    assert status.returncode == 0
    assert [s["running"] for s in json.loads(status.stdout)] == [True, True]

    assert _cli(private_stack, "down").returncode == 0
    stopped = _cli(private_stack, "status", "--json")
    assert stopped.returncode == 1
    assert [s["running"] for s in json.loads(stopped.stdout)] == [False, False]


def test_kafka_failure_reports_the_log(private_stack: Devstack) -> None:
    from matcher_devstack.procs import DevstackError

    private_stack.up()
    ports = private_stack.ports()
    assert ports is not None
    private_stack.down()
    # Sabotage the broker's storage: the next start must fail fast and show the log.
    meta = Path(private_stack.kafka.data) / "meta.properties"
    meta.write_text(meta.read_text().replace("node.id=1", "node.id=7"))
    with pytest.raises(DevstackError, match=r"Kafka exited during startup(.|\n)*node"):
        private_stack.up(timeout=60)


def test_storage_format_takes_a_cluster_id_that_starts_with_a_dash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A random cluster id is base64url, so one in 64 starts with "-": passed as a separate
    argument, the storage tool took it for an option and the devstack failed to start."""
    paths = kafka.KafkaPaths(home=tmp_path / "kafka", cache=Devstack().cache)
    paths.home.mkdir()
    kafka.ensure_jars(paths)
    kafka._write_config(paths, port=19092, controller_port=19093)
    monkeypatch.setattr(os, "urandom", lambda n: b"\xfb" + bytes(n - 1))  # "-w..."
    kafka._format_storage(paths)
    assert (paths.data / "meta.properties").read_text().count("cluster.id=-") == 1
