"""Shared test tools: produce events, run the daemon (in-process or as a process), read
resumes, register waits and check exactly-once outcomes, and poll the database with a
deadline instead of sleeping.

Every Kafka client call made here (start, send, flush, commit, stop) is bounded in time
(``KAFKA_CALL_TIMEOUT_S``): aiokafka's idempotent producer never gives up on a batch while
the broker keeps failing it, and its ``stop()`` waits for every pending batch (see
matcher.kafka.deadlines), so an unbounded call could hang a test for ever. Tests that make
their own clients use ``started`` and ``bounded``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from psycopg import sql as pgsql
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from matcher.auth.gate import judge
from matcher.auth.policy import Policy
from matcher.auth.registry import Registry
from matcher.config import Settings
from matcher.daemon import app as daemon_app
from matcher.daemon.ingest import Ingest
from matcher.domain.events import CompletionEvent, Rejection
from matcher.domain.records import IngestRecord, RawRecord
from matcher.domain.resume import ResumeData
from matcher.domain.waits import WaitSpec
from matcher.kafka.deadlines import start_consumer, start_producer, stop_consumer, stop_producer
from matcher.sdk import advance, parse_resume, register_wait
from matcher.store.rematch import rematch_once

T = TypeVar("T")

# The longest one Kafka client call of a test may take: a start, a stop, the
# acknowledgement of what one ``produce`` sent. A healthy local broker answers in
# milliseconds; past this something is wrong, and the test says so instead of hanging.
KAFKA_CALL_TIMEOUT_S = 30.0


async def within(awaitable: Awaitable[T], timeout: float = KAFKA_CALL_TIMEOUT_S) -> T:
    """``await awaitable``, or TimeoutError after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        return await awaitable


@contextlib.asynccontextmanager
async def started(client: Any, timeout: float = KAFKA_CALL_TIMEOUT_S) -> AsyncIterator[Any]:
    """An AIOKafkaProducer or AIOKafkaConsumer, started and (whatever happens) stopped, each
    within ``timeout``: a producer that cannot deliver what it holds is abandoned."""
    producer = isinstance(client, AIOKafkaProducer)
    if producer:
        await start_producer(client, timeout)
    else:
        await start_consumer(client, timeout)
    try:
        yield client
    finally:
        if producer:
            await stop_producer(client, timeout)
        else:
            await stop_consumer(client, timeout)


def to_record(
    event: CompletionEvent, *, structured: bool = False
) -> tuple[bytes, list[tuple[str, bytes]], bytes]:
    """(key, headers, value) of ``event`` in binary or structured mode, encoded by the
    CloudEvents SDK: an implementation independent of the producer SDK's.

    The key is tenant + correlation id, so one wait's events stay in order on one partition.
    """
    attributes: dict[str, Any] = {
        k: v for k, v in event.model_dump(exclude_none=True).items() if k != "data"
    }
    attributes.setdefault("datacontenttype", "application/json")
    attributes["time"] = event.time or datetime.now(UTC)
    message_event = CloudEvent(attributes, event.data)
    if structured:
        message = ce_kafka.to_structured(message_event, JSONFormat(), key_mapper=lambda _: None)
    else:
        message = ce_kafka.to_binary(message_event, JSONFormat(), key_mapper=lambda _: None)
    key = f"{event.tenant}\x1f{event.correlationid}".encode()
    return key, list(message.headers.items()), message.value


def event(
    tenant: str = "acme",
    correlation: str | None = None,
    type_: str = "job.completed",
    *,
    source: str = "billing",
    event_id: str | None = None,
    job_id: str | None = None,
    data: Any = None,
) -> CompletionEvent:
    return CompletionEvent(
        id=event_id or str(uuid.uuid4()),
        source=source,
        type=type_,
        tenant=tenant,
        correlationid=correlation or str(uuid.uuid4()),
        jobid=job_id,
        data=data if data is not None else {"ok": True},
    )


def events_producer(settings: Settings, **options: Any) -> AIOKafkaProducer:
    """A producer to the events topic's cluster, idempotent, to be ``started``."""
    return AIOKafkaProducer(
        **settings.kafka_client_options(),
        enable_idempotence=True,
        acks="all",
        request_timeout_ms=int(KAFKA_CALL_TIMEOUT_S * 1000),
        **options,
    )


async def produce(
    settings: Settings,
    events: Sequence[CompletionEvent],
    *,
    structured: bool = False,
    timeout: float = KAFKA_CALL_TIMEOUT_S,
) -> None:
    """Send ``events`` and wait for every acknowledgement, within ``timeout`` (TimeoutError
    past it: the producer is then abandoned, and its unacknowledged sends may or may not
    have been written)."""
    async with started(events_producer(settings, linger_ms=5), timeout) as producer:
        async with asyncio.timeout(timeout):
            futures = []
            for e in events:
                key, headers, value = to_record(e, structured=structured)
                futures.append(
                    await producer.send(settings.events_topic, value, key=key, headers=headers)
                )
            await asyncio.gather(*futures)


async def produce_raw(
    settings: Settings,
    messages: Sequence[tuple[bytes | None, list[tuple[str, bytes]], bytes]],
    *,
    timeout: float = KAFKA_CALL_TIMEOUT_S,
) -> None:
    """Send (key, headers, value) exactly as given, in order, each within ``timeout``."""
    async with started(events_producer(settings), timeout) as producer:
        for key, headers, value in messages:
            await within(
                producer.send_and_wait(settings.events_topic, value, key=key, headers=headers),
                timeout,
            )


@contextlib.asynccontextmanager
async def running_daemon(settings: Settings) -> AsyncIterator[asyncio.Task[None]]:
    """The daemon in this process, stopped (gracefully) when the block ends."""
    stop = asyncio.Event()
    task = asyncio.create_task(daemon_app.run(settings, stop, handle_signals=False))
    try:
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


@contextlib.asynccontextmanager
async def running_ingest(settings: Settings) -> AsyncIterator[Ingest]:
    """The ingest loop alone in this process (no relay, no sweeper), handed over once its
    consumer holds partitions, and stopped when the block ends."""
    url = settings.database_url.get_secret_value()
    async with AsyncConnectionPool(url, min_size=1, open=False) as pool:
        stop = asyncio.Event()
        ingest = Ingest(settings, pool, stop, on_resolved=lambda: None)
        task = asyncio.create_task(ingest.run())

        def assigned_or_ended() -> bool:
            consumer = ingest.consumer
            return task.done() or (consumer is not None and bool(consumer.assignment()))

        try:
            await eventually(
                assigned_or_ended, timeout=60, interval=0.05, what="partitions assigned"
            )
            if task.done():
                task.result()  # its error, if it failed to start
            yield ingest
            assert not task.done(), "the ingest loop ended by itself"
        finally:
            stop.set()
            await asyncio.wait_for(task, 60)


def inbox_count(settings: Settings) -> int:
    return int(scalar(settings, "SELECT count(*) FROM matcher.inbox"))


class DaemonProcess:
    """``matcher run`` as a real process, for SIGTERM and SIGKILL."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "matcher", "run"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            if "matcher ready" in line:
                self._ready.set()

    def wait_ready(self, timeout: float = 60) -> None:
        if not self._ready.wait(timeout):
            self.kill()
            raise AssertionError("daemon not ready; output:\n" + "".join(self.lines))

    def wait_for_output(self, needle: str, timeout: float = 30) -> None:
        """Block until a line containing ``needle`` was printed (or the process ended)."""
        deadline = time.monotonic() + timeout
        while not any(needle in line for line in self.lines):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no {needle!r} in the output:\n" + self.output)
            time.sleep(0.05)

    def admin_url(self, timeout: float = 30) -> str:
        """The admin API's address, as the daemon logged it (it listens on port 0)."""
        self.wait_for_output("admin API listening", timeout)
        found = re.search(r"admin API listening address=(http://\S+)", self.output)
        assert found is not None, self.output
        return found.group(1)

    def wait_exit(self, timeout: float = 60) -> int:
        code = self.process.wait(timeout)
        self._reader.join(5)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return code

    def terminate(self, timeout: float = 60) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.wait_exit(timeout)

    def kill(self) -> None:
        self.process.kill()
        self.wait_exit()

    @property
    def output(self) -> str:
        return "".join(self.lines)


class IngressProcess:
    """``matcher ingress`` on a free port, its log read line by line (JSON)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.lines: list[str] = []
        self.address: str | None = None
        self._listening = threading.Event()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "matcher", "ingress", "--address", "127.0.0.1:0", "--json"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            if '"ingress listening"' in line:
                self.address = json.loads(line)["address"]
                self._listening.set()

    def wait_listening(self, timeout: float = 30) -> str:
        if not self._listening.wait(timeout) or self.address is None:
            self.stop()
            raise AssertionError("the ingress did not listen:\n" + self.output)
        return self.address

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if httpx.get(f"{self.address}/readyz", timeout=5).status_code == 200:
                return
            time.sleep(0.1)
        raise AssertionError("the ingress never became ready:\n" + self.output)

    def stop(self, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait(10)
        self._reader.join(5)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return code

    @property
    def output(self) -> str:
        return "".join(self.lines)


def process_env(settings: Settings, **extra: str) -> dict[str, str]:
    from tests.conftest import settings_env

    env = settings_env(settings)
    env.update(extra)
    return env


def run_cli(
    settings: Settings, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``matcher ARGS`` as a process with these settings (bounded in time)."""
    return subprocess.run(
        [sys.executable, "-m", "matcher", *args],
        env=process_env(settings),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# A test's own queries are blocking calls, often made from an async test whose daemon
# runs on the same event loop: one that waited for a lock the daemon holds would wait for
# ever (the daemon cannot commit while the loop is blocked), and a signal-based test
# timeout cannot interrupt it. Past these it fails instead.
TEST_QUERY_BOUNDS = "-c lock_timeout=30s -c statement_timeout=120s"


@contextlib.contextmanager
def db(settings: Settings) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    with psycopg.connect(
        settings.database_url.get_secret_value(), autocommit=True, row_factory=dict_row,
        connect_timeout=10, options=TEST_QUERY_BOUNDS,
    ) as conn:  # fmt: skip
        yield conn


class RawHeaderName(str):
    """A header name that is not UTF-8, for producing hostile records: aiokafka's
    pure-Python record batch builder writes a name as ``name.encode("utf-8")``, and this
    str answers that with the raw bytes."""

    raw: bytes

    def __new__(cls, raw: bytes) -> RawHeaderName:
        name = super().__new__(cls, raw.decode("latin-1"))
        name.raw = raw
        return name

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self.raw


UNSIGNED = Policy(require_signatures=False)


def parse_record(
    headers: Sequence[tuple[str | bytes, bytes | None]],
    key: bytes | None,
    value: bytes | None,
    *,
    policy: Policy = UNSIGNED,
    registry: Registry | None = None,
    arrived_at: datetime | None = None,
) -> CompletionEvent | Rejection:
    """The gate's verdict on (key, headers, value): unsigned records allowed by default."""
    return judge(raw(headers, key, value, arrived_at), registry or Registry(), policy)


def raw(
    headers: Sequence[tuple[str | bytes, bytes | None]],
    key: bytes | None,
    value: bytes | None,
    arrived_at: datetime | None = None,
) -> RawRecord:
    names = tuple((n.encode() if isinstance(n, str) else n, v) for n, v in headers)
    return RawRecord(key, names, value, arrived_at or datetime.now(UTC))


def ingest_record(e: CompletionEvent, offset: int, topic: str = "t") -> IngestRecord:
    """``e`` as ingest sees it after parsing: for tests that call ``store_batch`` directly."""
    key, headers, value = to_record(e)
    record = raw(headers, key, value)
    parsed = judge(record, Registry(), UNSIGNED)
    return IngestRecord(topic, 0, offset, key, value, record.headers, parsed, record.arrived_at)


async def rematch_all(settings: Settings) -> int:
    """Run the rematch pass until the queue is empty, as a daemon would (for tests that
    register waits with no daemon running); return how many waits it resolved."""
    url = settings.database_url.get_secret_value()
    matched = 0
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while (result := await rematch_once(conn)).keys:
            matched += result.matched
    return matched


def backdate_events(settings: Settings, column: str, values: list[str], seconds: float) -> None:
    """Move the stored events whose ``column`` is one of ``values`` back in time by
    ``seconds`` (into that day's partition), with their claimed ids in matcher.event_ids,
    which record the same arrival."""
    with db(settings) as conn:
        conn.execute(
            pgsql.SQL(
                "UPDATE matcher.inbox SET received_at = now() - make_interval(secs => %s),"
                " status_at = now() - make_interval(secs => %s) WHERE {} = ANY(%s)"
            ).format(pgsql.Identifier(column)),
            [seconds, seconds, values],
        )
        conn.execute(
            pgsql.SQL(
                "UPDATE matcher.event_ids AS e SET received_at = i.received_at"
                " FROM matcher.inbox AS i WHERE i.{} = ANY(%s)"
                " AND (e.producer, e.event_id) = (i.producer, i.event_id)"
            ).format(pgsql.Identifier(column)),
            [values],
        )


def ensure_inbox_days(settings: Settings, days_back: int) -> None:
    """Create the inbox's day partitions back to ``days_back`` days ago, for tests that
    backdate events (the daemon only creates today's and the coming days)."""
    with db(settings) as conn:
        conn.execute(
            "SELECT matcher.ensure_inbox_partitions(now() - make_interval(days => %s), now())",
            [days_back],
        )


def rows(settings: Settings, sql: str, params: Any = None) -> list[dict[str, Any]]:
    with db(settings) as conn:
        return conn.execute(sql.encode(), params).fetchall()  # test-only ad-hoc SQL


def scalar(settings: Settings, sql: str, params: Any = None) -> Any:
    found = rows(settings, sql, params)
    return next(iter(found[0].values())) if found else None


async def eventually(
    check: Callable[[], bool], *, timeout: float = 30, interval: float = 0.1, what: str = ""
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout}s: {what or check}")
        await asyncio.sleep(interval)


async def read_resume_messages(
    settings: Settings,
    *,
    at_least: int,
    timeout: float = 60,
    settle: float = 0.5,
    keep: Callable[[bytes], bool] = lambda _: True,
) -> list[bytes]:
    """Every resume message on the topic from the beginning, as published (bytes) and
    accepted by ``keep``: at least ``at_least``, then any more that arrive within
    ``settle`` seconds (so duplicates are seen too)."""
    consumer = AIOKafkaConsumer(
        **settings.kafka_client_options(), group_id=None, enable_auto_commit=False
    )
    found: list[bytes] = []
    async with started(consumer):
        partitions = [
            TopicPartition(settings.resume_topic, p) for p in range(settings.topic_partitions)
        ]
        consumer.assign(partitions)
        await within(consumer.seek_to_beginning(*partitions))
        deadline = time.monotonic() + timeout
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            batch = await within(consumer.getmany(timeout_ms=100))
            got = [r.value for records in batch.values() for r in records]
            found.extend(value for value in got if keep(value))
            if got:
                quiet_since = time.monotonic()
            elif len(found) >= at_least and time.monotonic() - quiet_since >= settle:
                break
    if len(found) < at_least:
        raise AssertionError(f"{len(found)} resumes, expected at least {at_least}")
    return found


async def read_resumes(
    settings: Settings, *, at_least: int, timeout: float = 60, settle: float = 0.5
) -> list[ResumeData]:
    """``read_resume_messages``, parsed."""
    messages = await read_resume_messages(
        settings, at_least=at_least, timeout=timeout, settle=settle
    )
    return [parse_resume(m) for m in messages]


def register_waits(
    settings: Settings,
    count: int,
    *,
    deadline_s: float | None = None,
    prefix: str = "crash",
    correlations: Sequence[str] = (),
) -> list[str]:
    """Register ``count`` waits (one run each, positions 0-2) for job.completed, with the
    given correlation ids or new ones; return their correlation ids."""
    correlations = list(correlations) or [f"{prefix}-{uuid.uuid4().hex[:10]}" for _ in range(count)]
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


def published(settings: Settings) -> int:
    """Outbox rows the relay has published."""
    return int(
        scalar(settings, "SELECT count(*) FROM matcher.outbox WHERE published_at IS NOT NULL")
    )


def all_published(settings: Settings, total: int) -> bool:
    return published(settings) == total


async def check_exactly_once(settings: Settings, total: int) -> None:
    """``total`` waits resolved, each resume (duplicates included) advances its run exactly
    once, and a resume resolved by an event names the event that resolved the wait."""
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


async def produce_paced(
    settings: Settings, events: Sequence[CompletionEvent], *, pause: float, chunk: int = 50
) -> None:
    """``events`` in chunks with a pause between them: a load that is still arriving while
    the test does something to the daemon (the pause is the load's pace, not a wait)."""
    for start in range(0, len(events), chunk):
        await produce(settings, events[start : start + chunk])
        await asyncio.sleep(pause)


def outcome_counts(settings: Settings) -> dict[str, int]:
    return {
        r["state"]: r["n"]
        for r in rows(settings, "SELECT state, count(*) AS n FROM matcher.waits GROUP BY state")
    }


def dump(value: Any) -> str:
    return json.dumps(value, default=str, indent=1)


def env_flag(name: str, default: int) -> int:
    """Iteration counts that the long campaign target raises."""
    return int(os.environ.get(name, default))


def installed_tool(script: str) -> str:
    """The path a ``scripts/install-*`` script prints (it installs the tool when it may);
    the test fails with the script's own one-line reason when it cannot."""
    done = subprocess.run(
        [str(Path(__file__).resolve().parents[1] / "scripts" / script)],
        capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.fail(done.stderr.strip().splitlines()[-1], pytrace=False)
    return done.stdout.strip()
