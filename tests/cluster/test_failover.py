"""The guarantees on a real cluster: three Kafka brokers (replication factor 3,
``min.insync.replicas`` 2) and a Postgres primary with a synchronous standby, under load,
while the distributed parts fail the way distributed parts do.

One round: two daemons, thousands of waits (some registered after their event, some with
deadlines racing their event), signed events arriving all along, and webhooks posted to a
``matcher ingress`` in front of the cluster (each retried until its 202); meanwhile, one
after another, the broker leading most partitions is killed (and restarted), the broker
that coordinates the daemons' group is killed (and restarted), a broker is paused for
20 s, and the Postgres primary is killed and its standby promoted. Then: every wait
resolved exactly once, every acknowledged event and every webhook answered 202 stored
once, every run advanced once through ``advance``, every resume naming the event the wait
consumed. Measured per fault: the time to the first resume of an event sent after the
fault (the observed RTO) and the longest silence of the resume topic after it; also
duplicate resumes.

``MATCHER_TEST_CLUSTER_ROUNDS`` rounds (1 in ``make test``; ``make campaign`` runs more);
``MATCHER_TEST_CLUSTER_REPORT`` names a file the measurements are appended to as JSON lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from matcher_devstack.stack import Devstack
from matcher_producer.event import KafkaRecord
from matcher_producer.signing import SigningKey, sign_record
from psycopg import sql

from matcher.config import Settings
from matcher.kafka.topics import prepare_topics
from matcher.sdk import parse_resume
from matcher.store.migrate import migrate as apply_migrations
from tests.support import webhooks as senders
from tests.support.assertions import check_exactly_once, env_flag
from tests.support.db import register_waits, rows, scalar
from tests.support.kafka import started, to_record
from tests.support.processes import DaemonProcess, IngressProcess, process_env
from tests.support.records import event
from tests.support.services import with_database

pytestmark = pytest.mark.timeout(1800)

ROUNDS = env_flag("MATCHER_TEST_CLUSTER_ROUNDS", 1)
WAITS = env_flag("MATCHER_TEST_CLUSTER_WAITS", 3000)
RATE = env_flag("MATCHER_TEST_CLUSTER_RATE", 30)  # events per second while faults happen
WEBHOOKS = env_flag("MATCHER_TEST_CLUSTER_WEBHOOKS", 300)  # posted at about 5/s
PAUSE_S = 20


@dataclass
class Cluster:
    env: dict[str, str]
    bootstrap: str
    database_url: str

    def devstack(self, *args: str, timeout: float = 300) -> dict[str, Any] | list[Any]:
        done = subprocess.run(
            [sys.executable, "-m", "matcher", "devstack", *args, "--json"],
            env=self.env, capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise AssertionError(f"devstack {shlex.join(args)}: {done.stderr.strip()}")
        result: dict[str, Any] | list[Any] = json.loads(done.stdout) if done.stdout.strip() else {}
        return result


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    # Its own directory, searchable by the account Postgres runs as when we are root
    # (pytest's temporary directories are private); the main stack's jar cache.
    home = Path(tempfile.mkdtemp(prefix="matcher-failover-"))
    home.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MATCHER_")}
    env.update(MATCHER_DEVSTACK_DIR=str(home), MATCHER_DEVSTACK_CACHE=str(Devstack().cache))
    stack = Cluster(env, "", "")
    try:
        stack.devstack("up", "--brokers", "3", "--standby", timeout=600)
        found = stack.devstack("env")
        assert isinstance(found, dict)
        stack.bootstrap = found["MATCHER_KAFKA_BOOTSTRAP_SERVERS"]
        stack.database_url = found["MATCHER_DATABASE_URL"]
        yield stack
    finally:
        with contextlib.suppress(Exception):
            stack.devstack("down", "--purge", timeout=180)
        shutil.rmtree(home, ignore_errors=True)


# The daemons authenticate every record: the load's CloudEvents (producer "billing") and
# the webhooks the ingress forwards (producer "openai", Standard Webhooks).
PRODUCERS = (
    senders.PRODUCERS_TOML
    + f"""
[producers."billing"]
tenants = ["acme"]
types = ["job.completed"]
[[producers."billing".keys]]
id = "k1"
hmac_secret = "{senders.STANDARD_SECRET}"
"""
)
KEY = SigningKey.parse("k1", senders.STANDARD_SECRET)


def _round_settings(stack: Cluster) -> Settings:
    suffix = uuid.uuid4().hex[:8]
    producers = Path(tempfile.mkdtemp(prefix="matcher-failover-producers-")) / "producers.toml"
    producers.write_text(PRODUCERS)
    database = f"round_{suffix}"
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    settings = Settings(
        kafka_bootstrap_servers=stack.bootstrap,
        database_url=with_database(stack.database_url, database),
        events_topic=f"cluster.{suffix}.events",
        resume_topic=f"cluster.{suffix}.resumes",
        consumer_group=f"cluster.{suffix}",
        producers_file=producers,
        allow_unsigned=False,
        ingest_poll_timeout_ms=50,
        relay_poll_interval_s=0.2,
        sweep_interval_s=0.1,
        shutdown_timeout_s=20,
        stats_interval_s=0.5,
        admin_address="127.0.0.1:0",
        kafka_session_timeout_ms=6000,
        kafka_heartbeat_interval_ms=1000,
    )
    apply_migrations(settings.database_url.get_secret_value())
    asyncio.run(prepare_topics(settings))
    return settings


@dataclass
class Load:
    """Events sent at a steady rate for the round's waits; what Kafka acknowledged."""

    settings: Settings
    pending: list[str]
    sent_at: dict[str, float] = field(default_factory=dict)  # correlation -> ack time
    acked: set[str] = field(default_factory=set)  # event ids Kafka acknowledged
    failures: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)
    progress: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def sent(self, correlations: list[str]) -> None:
        """Until Kafka acknowledged an event for each of ``correlations``."""
        async with self.progress:
            await self.progress.wait_for(lambda: all(c in self.sent_at for c in correlations))

    async def run(self) -> None:
        producer = AIOKafkaProducer(
            **self.settings.kafka_client_options(), enable_idempotence=True, acks="all",
            request_timeout_ms=30_000, linger_ms=5,
        )  # fmt: skip
        async with started(producer, 60):
            while self.pending:
                chunk = self.pending[: max(1, RATE // 4)]
                if self.done.is_set():
                    chunk = self.pending[:200]  # the faults are over: the rest at once
                await self._send(producer, chunk)
                if not self.done.is_set():
                    await asyncio.sleep(0.25)  # the load's pace, not a wait for anything

    async def _send(self, producer: AIOKafkaProducer, correlations: list[str]) -> None:
        events = [event(correlation=c, event_id=f"e-{c}") for c in correlations]
        try:
            async with asyncio.timeout(60):
                futures = []
                for e in events:
                    key, headers, value = to_record(e)
                    signed = sign_record(KafkaRecord(key, headers, value), e.id, [KEY])
                    headers = signed.headers
                    futures.append(
                        await producer.send(
                            self.settings.events_topic, value, key=key, headers=headers
                        )
                    )
                await asyncio.gather(*futures)
        except Exception:  # not acknowledged: sent again (a duplicate downstream at worst)
            self.failures += 1
            return
        now = time.monotonic()
        for e in events:
            self.acked.add(e.id)
            self.sent_at.setdefault(e.correlationid, now)
        del self.pending[: len(correlations)]
        async with self.progress:
            self.progress.notify_all()


@dataclass
class WebhookLoad:
    """Webhooks posted to an ingress in front of the cluster all along, each retried (same
    message id: a duplicate downstream at worst) until it gets its 202."""

    address: str
    pending: list[str]  # batch ids: the correlation ids of their waits
    accepted: set[str] = field(default_factory=set)  # message ids answered 202
    refused: dict[int, int] = field(default_factory=dict)  # status -> count
    done: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        async with httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as client:
            while self.pending:
                batch = self.pending[0]
                body = senders.body_bytes(senders.openai_batch(batch))
                headers = senders.standard_request(body, f"msg-{batch}")
                status = await self._post(client, headers, body)
                if status == 202:
                    self.accepted.add(f"msg-{batch}")
                    self.pending.pop(0)
                else:
                    self.refused[status] = self.refused.get(status, 0) + 1
                if not self.done.is_set() or status != 202:
                    await asyncio.sleep(0.2)  # the load's pace, and a 503's Retry-After

    async def _post(self, client: httpx.AsyncClient, headers: senders.Headers, body: bytes) -> int:
        try:
            response = await client.post(
                f"{self.address}/v1/webhooks/openai",
                content=body,
                headers=[(n.decode(), v.decode()) for n, v in headers],
            )
        except httpx.HTTPError:
            return 0
        return response.status_code


@dataclass
class ResumeWatch:
    """Every resume as a worker would see it, and when."""

    settings: Settings
    arrivals: list[tuple[float, str]] = field(default_factory=list)  # (time, run id)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        consumer = AIOKafkaConsumer(
            self.settings.resume_topic, **self.settings.kafka_client_options(),
            group_id=None, auto_offset_reset="earliest", enable_auto_commit=False,
        )  # fmt: skip
        async with started(consumer, 60):
            while not self.stop.is_set():
                with contextlib.suppress(Exception):  # a broker away: read on
                    batch = await asyncio.wait_for(consumer.getmany(timeout_ms=200), 30)
                    now = time.monotonic()
                    for records in batch.values():
                        for record in records:
                            self.arrivals.append((now, parse_resume(record.value).run_id))


@dataclass
class Fault:
    name: str
    at: float  # when the fault struck (the kill, the pause), from the command's report
    ended: float  # when the command returned (the broker gone, the pause over, rejoined)
    window_end: float = 0.0  # the next fault's start (or the round's end)


def _measure(fault: Fault, load: Load, watch: ResumeWatch) -> dict[str, Any]:
    """The observed RTO (the first resume of an event sent after the fault struck) and
    the longest silence of the resume topic from the fault to the next one."""
    sent_after = {c for c, t in load.sent_at.items() if t >= fault.at}
    firsts = [t for t, run in watch.arrivals if t >= fault.at and run[4:] in sent_after]
    seen = sorted(t for t, _ in watch.arrivals if fault.at <= t <= fault.window_end)
    gaps = [b - a for a, b in zip([fault.at, *seen], seen, strict=False)]
    return {
        "fault": fault.name,
        "fault_duration_s": round(fault.ended - fault.at, 2),
        "rto_s": round(min(firsts) - fault.at, 2) if firsts else None,
        "longest_resume_gap_s": round(max(gaps), 2) if gaps else None,
    }


async def _topology(settings: Settings) -> tuple[dict[int, int], int, bool]:
    """Partitions led per broker (both topics), the group's coordinator, and whether every
    partition has its three replicas in sync."""
    admin = AIOKafkaAdminClient(**settings.kafka_client_options())
    async with started(admin, 60):
        topics = await asyncio.wait_for(
            admin.describe_topics([settings.events_topic, settings.resume_topic]), 30
        )
        coordinator = await asyncio.wait_for(admin.find_coordinator(settings.consumer_group), 30)
    leaders: dict[int, int] = {}
    whole = True
    for topic in topics:
        for partition in topic["partitions"]:
            leaders[partition["leader"]] = leaders.get(partition["leader"], 0) + 1
            whole = whole and len(partition["isr"]) == 3
    return leaders, coordinator, whole


async def _healthy(settings: Settings, timeout: float = 180) -> tuple[dict[int, int], int]:
    """Until every partition has its replicas in sync again (a fault on a cluster that
    has not healed from the last one would be two faults at once)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            leaders, coordinator, whole = await _topology(settings)
            if whole:
                return leaders, coordinator
        assert time.monotonic() < deadline, "the cluster did not heal"
        await asyncio.sleep(0.5)


async def _wait_resumed_since(watch: ResumeWatch, since: float, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not any(t > since for t, _ in watch.arrivals):
        assert time.monotonic() < deadline, "no resume after the fault"
        await asyncio.sleep(0.1)


async def _strike(stack: Cluster, name: str, leaders: dict[int, int], coordinator: int) -> Fault:
    busiest = max(leaders, key=lambda n: leaders[n])
    args = {
        "kill-partition-leader": ("stop-broker", str(busiest)),
        "kill-coordinator": ("stop-broker", str(coordinator)),
        "pause-broker": ("pause-broker", str(busiest), str(PAUSE_S)),
        "pg-failover": ("failover",),
    }[name]
    report = await asyncio.to_thread(stack.devstack, *args, timeout=600)
    ended = time.monotonic()
    assert isinstance(report, dict)
    took = {"stop-broker": "seconds", "pause-broker": "paused_s", "failover": "rejoin_s"}
    return Fault(name, ended - float(report[took[args[0]]]), ended)


async def _faults(stack: Cluster, settings: Settings, watch: ResumeWatch) -> list[Fault]:
    done: list[Fault] = []
    await _wait_resumed_since(watch, 0)
    for name in ("kill-partition-leader", "kill-coordinator", "pause-broker", "pg-failover"):
        leaders, coordinator = await _healthy(settings)
        if done:
            done[-1].window_end = time.monotonic()
        fault = await _strike(stack, name, leaders, coordinator)
        await _wait_resumed_since(watch, fault.ended)
        if name in ("kill-partition-leader", "kill-coordinator"):
            node = (
                max(leaders, key=lambda n: leaders[n]) if name.endswith("leader") else coordinator
            )
            await asyncio.to_thread(stack.devstack, "start-broker", str(node))
        done.append(fault)
    return done


@contextlib.asynccontextmanager
async def _daemons(settings: Settings, count: int) -> AsyncIterator[list[DaemonProcess]]:
    daemons = [DaemonProcess(process_env(settings)) for _ in range(count)]
    try:
        for daemon in daemons:
            await asyncio.to_thread(daemon.wait_ready, 120)
        yield daemons
    finally:
        for n, daemon in enumerate(daemons):
            if daemon.process.poll() is None:
                code = await asyncio.to_thread(daemon.terminate, 90)
                assert code == 0, daemon.output[-5000:]
            logs = os.environ.get("MATCHER_TEST_CLUSTER_LOGS")  # a directory, to study a run
            if logs:
                (Path(logs) / f"daemon-{n}.log").write_text(daemon.output)


async def _one_round(stack: Cluster) -> dict[str, Any]:
    settings = await asyncio.to_thread(_round_settings, stack)
    early = max(1, WAITS // 10)
    racing = max(1, WAITS // 10)
    ordinary = register_waits(settings, WAITS - early - racing, prefix="c")
    # Deadlines about when their events come: a timeout races each of them.
    racy = register_waits(settings, racing, prefix="r", deadline_s=WAITS / RATE / 2)
    early_ones = [f"early-{uuid.uuid4().hex[:10]}" for _ in range(early)]
    order = [*early_ones, *ordinary[: len(ordinary) // 2], *racy, *ordinary[len(ordinary) // 2 :]]
    batches = await asyncio.to_thread(_register_batches, settings, WEBHOOKS)
    load = Load(settings, order)
    watch = ResumeWatch(settings)
    async with _daemons(settings, 2), _ingress(settings) as address:
        hooks = WebhookLoad(address, batches)
        watching = asyncio.create_task(watch.run())
        loading = asyncio.create_task(load.run())
        posting = asyncio.create_task(hooks.run())
        await load.sent(early_ones)
        # Their events came first; the waits now meet them in the inbox.
        await asyncio.to_thread(_register_early, settings, early_ones)
        faults = await _faults(stack, settings, watch)
        faults[-1].window_end = time.monotonic() + 30
        load.done.set()
        hooks.done.set()
        await asyncio.wait_for(loading, 600)
        await asyncio.wait_for(posting, 600)
        await _until_resolved(settings, WAITS + WEBHOOKS)
        watch.stop.set()
        await asyncio.wait_for(watching, 60)
    await check_exactly_once(settings, WAITS + WEBHOOKS)
    stored = {
        (r["producer"], r["event_id"])
        for r in rows(settings, "SELECT producer, event_id FROM matcher.inbox")
    }
    acknowledged = {("billing", e) for e in load.acked} | {("openai", m) for m in hooks.accepted}
    lost = acknowledged - stored
    runs = [run for _, run in watch.arrivals]
    report = {
        "waits": WAITS + WEBHOOKS,
        "events_acknowledged": len(load.acked),
        "webhooks_acknowledged": len(hooks.accepted),
        "webhooks_refused_by_status": hooks.refused,
        "events_stored": len(stored),
        "lost_acknowledged_events": len(lost),
        "duplicate_resumes": len(runs) - len(set(runs)),
        "producer_retries": load.failures,
        "faults": [_measure(f, load, watch) for f in faults],
    }
    assert not lost, report
    return report


def _register_batches(settings: Settings, count: int) -> list[str]:
    from matcher.domain.waits import WaitSpec
    from matcher.sdk import register_wait

    batches = [f"batch_{uuid.uuid4().hex[:10]}" for _ in range(count)]
    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        for batch in batches:
            register_wait(
                conn,
                WaitSpec(tenant="acme", run_id=f"run-{batch}", position=0,
                         event_types=["batch.completed"], correlation_id=batch),
            )  # fmt: skip
    return batches


@contextlib.asynccontextmanager
async def _ingress(settings: Settings) -> AsyncIterator[str]:
    env = process_env(settings, MATCHER_ALLOW_UNSIGNED="false")
    env["MATCHER_PRODUCERS_FILE"] = str(settings.producers_file)
    env.pop("MATCHER_DATABASE_URL")
    ingress = IngressProcess(env)
    try:
        address = await asyncio.to_thread(ingress.wait_listening)
        await asyncio.to_thread(ingress.wait_ready)
        yield address
    finally:
        code = await asyncio.to_thread(ingress.stop)
        assert code == 0, ingress.output[-5000:]


def _register_early(settings: Settings, correlations: list[str]) -> None:
    from matcher.domain.waits import WaitSpec
    from matcher.sdk import register_wait

    with psycopg.connect(settings.database_url.get_secret_value(), autocommit=True) as conn:
        for n, correlation in enumerate(correlations):
            register_wait(
                conn,
                WaitSpec(tenant="acme", run_id=f"run-{correlation}", position=n % 3,
                         event_types=["job.completed"], correlation_id=correlation),
            )  # fmt: skip


async def _until_resolved(settings: Settings, total: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while (
        int(scalar(settings, "SELECT count(*) FROM matcher.resolutions WHERE published") or 0)
        < total
    ):
        assert time.monotonic() < deadline, "not every wait was resolved and published"
        await asyncio.sleep(0.2)


def test_guarantees_hold_through_broker_and_database_failures(cluster: Cluster) -> None:
    reports = []
    for _ in range(ROUNDS):
        report = asyncio.run(_one_round(cluster))
        reports.append(report)
        target = os.environ.get("MATCHER_TEST_CLUSTER_REPORT")
        if target:
            with Path(target).open("a") as out:
                out.write(json.dumps(report) + "\n")
        print(json.dumps(report, indent=1))  # the measurements, seen with -s
    for report in reports:
        assert all(f["rto_s"] is not None for f in report["faults"]), report
