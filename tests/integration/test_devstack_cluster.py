"""The devstack's cluster mode against itself: three brokers and a Postgres primary with a
synchronous standby, and the verbs that break them on purpose.

One private cluster (its own directory under the system's temporary directory, the jar
cache shared with the main stack, so nothing downloads twice) serves the whole module;
the tests run in file order, each leaving the cluster whole for the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, NotEnoughReplicasError
from matcher_devstack import kafka
from matcher_devstack.procs import wait_until
from matcher_devstack.stack import Devstack

from tests.support.kafka import within

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@dataclass
class Cluster:
    home: Path
    env: dict[str, str]

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "matcher", "devstack", *args],
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )

    def json(self, *args: str) -> Any:
        done = self.cli(*args, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def status(self) -> dict[str, dict[str, Any]]:
        done = self.cli("status", "--json")
        return {s["name"]: s for s in json.loads(done.stdout)}

    def variables(self) -> dict[str, str]:
        return dict(self.json("env"))

    def broker_port(self, node_id: int) -> int:
        return int(self.status()[f"kafka-{node_id}"]["port"])


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    cache = Devstack().cache  # the main stack's (or MATCHER_DEVSTACK_CACHE's) jars
    # Postgres runs as an unprivileged account when we are root: the directory must be
    # searchable by it (mkdtemp makes it private).
    home = Path(tempfile.mkdtemp(prefix="matcher-devstack-cluster-"))
    home.chmod(0o755)
    env = dict(os.environ, MATCHER_DEVSTACK_DIR=str(home), MATCHER_DEVSTACK_CACHE=str(cache))
    for leaked in ("MATCHER_KAFKA_BOOTSTRAP_SERVERS", "MATCHER_DATABASE_URL"):
        env.pop(leaked, None)
    stack = Cluster(home, env)
    try:
        started = time.monotonic()
        up = stack.cli("up", "--brokers", "3", "--standby", "--json")
        assert up.returncode == 0, up.stderr
        print(f"cluster up in {time.monotonic() - started:.1f}s")
        yield stack
    finally:
        stack.cli("down", "--purge")
        shutil.rmtree(home, ignore_errors=True)


def test_env_status_and_the_remembered_mode(cluster: Cluster) -> None:
    status = cluster.status()
    assert [(s["name"], s["role"], s["running"]) for s in status.values()] == [
        ("kafka-1", "broker", True),
        ("kafka-2", "broker", True),
        ("kafka-3", "broker", True),
        ("kafka-controller", "controller", True),
        ("postgres-1", "primary", True),
        ("postgres-2", "standby", True),
    ]
    assert [status[f"kafka-{n}"]["node_id"] for n in (1, 2, 3)] == [1, 2, 3]
    assert not any(s["paused"] for s in status.values())

    env = cluster.variables()
    brokers = [f"127.0.0.1:{status[f'kafka-{n}']['port']}" for n in (1, 2, 3)]
    assert env["MATCHER_KAFKA_BOOTSTRAP_SERVERS"] == ",".join(brokers)
    pg1, pg2 = status["postgres-1"]["port"], status["postgres-2"]["port"]
    assert env["MATCHER_DATABASE_URL"] == (
        f"postgresql://matcher@127.0.0.1:{pg1},127.0.0.1:{pg2}/matcher"
        "?target_session_attrs=read-write"
    )
    with psycopg.connect(env["MATCHER_DATABASE_URL"]) as conn:
        settings = conn.execute(
            "SELECT current_setting('synchronous_standby_names'),"
            " current_setting('synchronous_commit'), current_setting('wal_log_hints')"
        ).fetchone()
        assert settings == ("pg2", "on", "on")
        replicas = conn.execute(
            "SELECT application_name, state, sync_state FROM pg_stat_replication"
        ).fetchall()
        assert replicas == [("pg2", "streaming", "sync")]

    # A later `up` without options is the same cluster, left running as it is.
    again = cluster.cli("up")
    assert again.returncode == 0, again.stderr
    assert {k: s["pid"] for k, s in cluster.status().items()} == {
        k: s["pid"] for k, s in status.items()
    }

    # Another mode than the data has: refused in one line that says how to start over.
    other = cluster.cli("up", "--brokers", "1")
    assert other.returncode == 2
    assert len(other.stderr.strip().splitlines()) == 1
    assert "`matcher devstack up --fresh --standby`" in other.stderr
    assert "down --purge" in other.stderr


async def _create_topic(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000)
    await within(admin.start())
    try:
        await within(
            admin.create_topics(
                [
                    NewTopic(
                        topic,
                        num_partitions=1,
                        replication_factor=3,
                        topic_configs={"min.insync.replicas": "2"},
                    )
                ]
            )
        )
    finally:
        await within(admin.close())


async def _produce(bootstrap: str, topic: str, *, request_timeout_ms: int) -> None:
    """One acks=all write; raises what the cluster answered."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=False,
        request_timeout_ms=request_timeout_ms,
        retry_backoff_ms=200,
    )
    await asyncio.wait_for(producer.start(), 30)
    try:
        await asyncio.wait_for(producer.send_and_wait(topic, b"x"), request_timeout_ms / 1000 + 10)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(producer.stop(), 10)


def _writes_until(bootstrap: str, topic: str, *, timeout: float) -> None:
    """An acks=all write succeeds within ``timeout`` (the cluster may still be moving
    leaders and shrinking the ISR after a broker died)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            asyncio.run(_produce(bootstrap, topic, request_timeout_ms=15000))
            return
        except (KafkaError, TimeoutError):
            if time.monotonic() > deadline:
                raise


def _refused_until(bootstrap: str, topic: str, *, timeout: float) -> list[str]:
    """An acks=all write is refused with NOT_ENOUGH_REPLICAS within ``timeout``; return
    the other answers seen before (while the cluster noticed the dead brokers)."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            asyncio.run(_produce(bootstrap, topic, request_timeout_ms=4000))
        except NotEnoughReplicasError:
            return seen
        except (KafkaError, TimeoutError) as exc:
            seen.append(type(exc).__name__)
            continue
        seen.append("accepted")
    raise AssertionError(f"never refused with NOT_ENOUGH_REPLICAS; answers: {seen}")


def test_acks_all_survives_one_stopped_broker_and_is_refused_with_two(cluster: Cluster) -> None:
    bootstrap = cluster.variables()["MATCHER_KAFKA_BOOTSTRAP_SERVERS"]
    topic = f"rf3-{uuid.uuid4().hex[:8]}"
    asyncio.run(_create_topic(bootstrap, topic))
    _writes_until(bootstrap, topic, timeout=30)

    stopped = cluster.json("stop-broker", "3")
    assert stopped["was_running"]
    assert stopped["node_id"] == 3
    assert not cluster.status()["kafka-3"]["running"]
    assert cluster.cli("status").returncode == 1  # one is down
    _writes_until(bootstrap, topic, timeout=60)

    cluster.json("stop-broker", "2")
    _refused_until(bootstrap, topic, timeout=60)

    for node_id in (2, 3):
        started = cluster.json("start-broker", str(node_id))
        assert started["node_id"] == node_id
        assert started["port"] == cluster.broker_port(node_id)  # the same port as before
    assert all(cluster.status()[f"kafka-{n}"]["running"] for n in (1, 2, 3))
    _writes_until(bootstrap, topic, timeout=60)


def test_pause_broker_freezes_it_and_always_thaws_it(cluster: Cluster) -> None:
    port = cluster.broker_port(1)
    assert kafka.node_answers(port, 1)

    pausing = subprocess.Popen(
        [sys.executable, "-m", "matcher", "devstack", "pause-broker", "1", "6", "--json"],
        env=cluster.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_until(lambda: cluster.status()["kafka-1"]["paused"], timeout=20)
        assert not kafka.node_answers(port, 1, timeout=2.0)
        out, err = pausing.communicate(timeout=60)
    finally:
        if pausing.poll() is None:
            pausing.kill()
    assert pausing.returncode == 0, err
    assert json.loads(out)["paused_s"] >= 6
    assert not cluster.status()["kafka-1"]["paused"]
    assert wait_until(lambda: kafka.node_answers(port, 1), timeout=30)

    # Ended early by a signal, the pause still thaws the broker.
    pausing = subprocess.Popen(
        [sys.executable, "-m", "matcher", "devstack", "pause-broker", "1", "300"],
        env=cluster.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_until(lambda: cluster.status()["kafka-1"]["paused"], timeout=20)
        pausing.send_signal(signal.SIGTERM)
        pausing.communicate(timeout=30)
    finally:
        if pausing.poll() is None:
            pausing.kill()
    assert pausing.returncode == 130
    assert not cluster.status()["kafka-1"]["paused"]

    # A pause left behind (here: a SIGSTOP from elsewhere) ends with resume-broker.
    pid = cluster.status()["kafka-1"]["pid"]
    os.kill(pid, signal.SIGSTOP)
    assert wait_until(lambda: cluster.status()["kafka-1"]["paused"], timeout=10)
    assert cluster.json("resume-broker", "1")["was_paused"] is True
    assert not cluster.status()["kafka-1"]["paused"]
    assert wait_until(lambda: kafka.node_answers(port, 1), timeout=30)


def _replicas(url: str) -> list[tuple[str, str, str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT application_name, state, sync_state FROM pg_stat_replication"
        ).fetchall()
    return [(str(a), str(b), str(c)) for a, b, c in rows]


def test_failover_promotes_the_standby_and_rejoins_the_old_primary(cluster: Cluster) -> None:
    before = cluster.variables()["MATCHER_DATABASE_URL"]
    with psycopg.connect(before) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS kept (v text)")
        conn.execute("INSERT INTO kept VALUES ('committed before')")

    result = cluster.json("failover")
    assert result["killed"]["node"] == 1
    assert result["killed"]["signal"] == "SIGKILL"
    assert result["promoted"]["node"] == 2
    assert result["rejoined"] is True
    assert 0 < result["promotion_s"] <= result["rejoin_s"]
    print(f"failover: promoted in {result['promotion_s']}s, rejoined in {result['rejoin_s']}s")

    status = cluster.status()
    assert [(s["name"], s["role"], s["running"]) for s in status.values()][-2:] == [
        ("postgres-2", "primary", True),
        ("postgres-1", "standby", True),
    ]
    after = cluster.variables()["MATCHER_DATABASE_URL"]
    pg1, pg2 = status["postgres-1"]["port"], status["postgres-2"]["port"]
    assert after.startswith(f"postgresql://matcher@127.0.0.1:{pg2},127.0.0.1:{pg1}/")

    for url in (after, before):  # read-write finds the primary in either order
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)
            assert conn.execute("SELECT inet_server_port()").fetchone() == (pg2,)
            conn.execute("INSERT INTO kept VALUES ('written after')")
    with psycopg.connect(after) as conn:
        rows = conn.execute("SELECT v FROM kept ORDER BY v").fetchall()
        assert rows == [("committed before",), ("written after",), ("written after",)]
    assert _replicas(after) == [("pg1", "streaming", "sync")]

    # Without the rejoin the old primary stays down, and the output says what brings it.
    left = cluster.cli("failover", "--no-rejoin")
    assert left.returncode == 0, left.stderr
    assert "matcher devstack rejoin" in left.stderr
    status = cluster.status()
    assert (status["postgres-2"]["role"], status["postgres-2"]["running"]) == ("detached", False)
    assert status["postgres-1"]["role"] == "primary"
    assert cluster.cli("status").returncode == 1
    with psycopg.connect(cluster.variables()["MATCHER_DATABASE_URL"]) as conn:
        conn.execute("INSERT INTO kept VALUES ('alone')")  # no standby to wait for

    rejoined = cluster.json("rejoin")
    assert rejoined["was"] == "detached"
    assert rejoined["node"] == 2
    assert _replicas(cluster.variables()["MATCHER_DATABASE_URL"]) == [("pg2", "streaming", "sync")]


def test_down_stops_every_node(cluster: Cluster) -> None:
    assert cluster.cli("down").returncode == 0
    status = cluster.status()
    assert len(status) == 6
    assert not any(s["running"] for s in status.values())
    # The next up brings back the same cluster: the mode is remembered.
    up = cluster.cli("up")
    assert up.returncode == 0, up.stderr
    assert [s["running"] for s in cluster.status().values()] == [True] * 6
    assert cluster.variables()["MATCHER_KAFKA_BOOTSTRAP_SERVERS"].count(",") == 2
