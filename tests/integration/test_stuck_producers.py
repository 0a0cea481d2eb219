"""Producers that cannot deliver: the relay and the dead-letter copy do not get stuck.

The fault: the broker answers every produce request to a refused topic with
NOT_ENOUGH_REPLICAS, what Kafka answers while a partition has fewer in-sync replicas than
its ``min.insync.replicas``. The error is retriable, so aiokafka's idempotent producer
retries the batch for as long as it lasts (``SendProduceReqHandler._can_retry`` never
expires an idempotent batch), every send future stays pending, and ``stop()`` waits for
them for ever (``MessageAccumulator.close`` -> ``flush``).

A one-broker cluster cannot be made to answer so: it caps ``min.insync.replicas`` at the
replication factor (``Partition.effectiveMinIsr``), and sends go through. So the answer is
put where aiokafka's client receives it (``AIOKafkaClient.send``, in the daemon's process);
all of the producer above it (sender, retries, accumulator, ``stop()``) is aiokafka's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import (
    CoordinatorLoadInProgressError,
    KafkaTimeoutError,
    NotEnoughReplicasError,
)
from aiokafka.protocol.produce import ProduceRequest
from aiokafka.protocol.transaction import InitProducerIdRequest

from matcher.config import Settings
from matcher.kafka.deadlines import start_producer, stop_producer
from matcher.kafka.topics import delete_topics, ensure_topics
from tests.support.assertions import check_exactly_once, eventually
from tests.support.db import published, register_waits, scalar
from tests.support.kafka import produce, produce_raw, read_resume_messages
from tests.support.processes import DaemonProcess, process_env
from tests.support.records import event

pytestmark = pytest.mark.timeout(300)

REFUSED_ENV = "MATCHER_TEST_REFUSED_TOPICS"  # a file: the refused topics, one per line
REFUSALS_ENV = "MATCHER_TEST_REFUSALS_LOG"  # a file: a line per refused produce request

# The daemons' bounds in these tests, and how soon SIGTERM must end them: a stop takes at
# most a call (the last publication) and a stop of the producer, well within this.
CALL_TIMEOUT_S = 1.5
STOP_WITHIN_S = 15.0

_serials = itertools.count(1)


def refusing(
    real: Callable[..., Any],
    refused: Callable[[], set[str]] = set,
    *,
    grant_producer_ids: bool = True,
    record: Callable[[int, str], None] | None = None,
) -> Callable[..., Any]:
    """``AIOKafkaClient.send`` (``real``) as a broker refusing every produce request to a
    topic in ``refused()`` with NOT_ENOUGH_REPLICAS (and, unless ``grant_producer_ids``,
    every InitProducerId with COORDINATOR_LOAD_IN_PROGRESS). ``record(client, topic)`` is
    told of each refusal; ``client`` numbers the client that sent it."""

    async def send(self: AIOKafkaClient, node_id: Any, request: Any, **kwargs: Any) -> Any:
        if isinstance(request, InitProducerIdRequest) and not grant_producer_ids:
            await asyncio.sleep(0.005)  # a round trip
            return SimpleNamespace(error_code=CoordinatorLoadInProgressError.errno)
        if isinstance(request, ProduceRequest):
            topics: list[tuple[str, list[tuple[int, bytes]]]] = request._topics
            hit = {name for name, _ in topics} & refused()
            if hit:
                await asyncio.sleep(0.005)
                if record is not None:
                    serial = self.__dict__.setdefault("_test_serial", next(_serials))
                    for name in hit:
                        record(serial, name)
                return _not_enough_replicas(topics)
        return await real(self, node_id, request, **kwargs)

    return send


def _not_enough_replicas(topics: list[tuple[str, list[tuple[int, bytes]]]]) -> Any:
    # A ProduceResponse v8+ as SendProduceReqHandler.handle_response reads it: per
    # partition (partition, error, offset, timestamp, log start offset, record errors,
    # error message).
    code = NotEnoughReplicasError.errno
    return SimpleNamespace(
        API_VERSION=8,
        topics=[
            (name, [(p, code, -1, -1, -1, [], None) for p, _ in parts]) for name, parts in topics
        ],
    )


def child_main() -> None:
    """``matcher run`` whose produce requests to the topics listed in the file named by
    ``$MATCHER_TEST_REFUSED_TOPICS`` are refused (for as long as they are listed); each
    refusal is a line of ``$MATCHER_TEST_REFUSALS_LOG``."""
    listed = Path(os.environ[REFUSED_ENV])
    refusals = Path(os.environ[REFUSALS_ENV])

    def refused() -> set[str]:
        with contextlib.suppress(FileNotFoundError):
            return set(listed.read_text().split())
        return set()

    def record(client: int, topic: str) -> None:
        with refusals.open("a") as out:
            out.write(f"{time.time():.3f} {client} {topic}\n")

    AIOKafkaClient.send = refusing(AIOKafkaClient.send, refused, record=record)
    from matcher.cli import main

    main(["run"])


class RefusingDaemon(DaemonProcess):
    """``matcher run`` as a process (see ``child_main``) whose broker refuses the topics
    listed in ``refused``."""

    def __init__(self, env: dict[str, str], refused: Path, refusals: Path) -> None:
        self.env = {**env, REFUSED_ENV: str(refused), REFUSALS_ENV: str(refusals)}
        self.lines = []
        child = "from tests.integration.test_stuck_producers import child_main; child_main()"
        self.process = subprocess.Popen(
            [sys.executable, "-c", child],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def count(self, needle: str) -> int:
        return sum(needle in line for line in self.lines)

    def stop_promptly(self) -> float:
        """SIGTERM, and the daemon exits 0 within STOP_WITHIN_S (on its own: no loop
        cancelled for outliving the shutdown timeout); returns the seconds it took."""
        started = time.monotonic()
        try:
            code = self.terminate(STOP_WITHIN_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"still running {STOP_WITHIN_S}s after SIGTERM:\n{self.output}"
            ) from None
        took = time.monotonic() - started
        assert code == 0, self.output
        assert "did not stop in time; cancelling" not in self.output, self.output
        return took


@contextlib.contextmanager
def refusing_daemon(
    settings: Settings, refused: Path, refusals: Path, **env: str
) -> Iterator[RefusingDaemon]:
    daemon = RefusingDaemon(
        process_env(settings, MATCHER_SHUTDOWN_TIMEOUT_S="120", **env), refused, refusals
    )
    try:
        daemon.wait_ready()
        yield daemon
    finally:
        if daemon.process.poll() is None:
            daemon.kill()


def most_producers_retrying_at_once(refusals: Path, topic: str) -> int:
    """The most clients that were retrying refused sends to ``topic`` at the same time
    (each from its first refusal to its last)."""
    spans: dict[str, list[float]] = {}
    for line in refusals.read_text().splitlines():
        at, client, name = line.split()
        if name == topic:
            span = spans.setdefault(client, [float(at), float(at)])
            span[1] = float(at)
    edges = sorted([(a, 1) for a, _ in spans.values()] + [(b, -1) for _, b in spans.values()])
    most = current = 0
    for _, step in edges:  # at equal times an end sorts before a start
        current += step
        most = max(most, current)
    return most


def resolved(settings: Settings) -> int:
    return int(scalar(settings, "SELECT count(*) FROM matcher.waits WHERE state <> 'waiting'"))


def aiokafka_tasks() -> list[asyncio.Task[Any]]:
    """Tasks still running aiokafka code (a sender, a metadata synchroniser, a reader)."""
    found = []
    for task in asyncio.all_tasks():
        code = getattr(task.get_coro(), "cr_code", None)
        if task is not asyncio.current_task() and code and "/aiokafka/" in code.co_filename:
            found.append(task)
    return found


@pytest.fixture
async def loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """What reaches the event loop's exception handler during the test (an exception in a
    callback, a task's exception nobody retrieved): an abandoned producer leaves none."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: errors.append(context))
    yield errors
    loop.set_exception_handler(previous)


def _idempotent(settings: Settings, **options: Any) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        **settings.kafka_client_options(), enable_idempotence=True, acks="all", **options
    )


# --- matcher.kafka.deadlines against a broker that refuses -------------------------------


async def test_stop_producer_abandons_sends_the_broker_keeps_refusing(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, loop_errors: list[dict[str, Any]]
) -> None:
    topic = settings.resume_topic
    monkeypatch.setattr(AIOKafkaClient, "send", refusing(AIOKafkaClient.send, lambda: {topic}))
    producer = _idempotent(settings, request_timeout_ms=500)
    await start_producer(producer, 10)
    sent = await producer.send(topic, b"never delivered")
    await asyncio.sleep(1.5)
    assert not sent.done(), "an idempotent batch expired after all (request_timeout_ms=500)"

    started = time.monotonic()
    graceful = await stop_producer(producer, 1.0)
    took = time.monotonic() - started

    assert graceful is False
    assert took < 3.0, f"stop_producer took {took:.1f}s with a bound of 1s"
    assert sent.done()
    assert isinstance(sent.exception(), KafkaTimeoutError)
    await eventually(lambda: not aiokafka_tasks(), timeout=2, what="aiokafka's tasks ended")
    gc.collect()  # an unretrieved future's exception is reported when it is collected
    assert loop_errors == []


async def test_aiokafka_alone_never_stops_such_a_producer(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, loop_errors: list[dict[str, Any]]
) -> None:
    """Why stop_producer exists (aio-libs/aiokafka#1101): ``stop()`` waits for ever, and
    cut short it leaves the producer sending in the background. stop_producer then still
    ends it. (If an aiokafka upgrade fixes this, this test says so.)"""
    topic = settings.resume_topic
    monkeypatch.setattr(AIOKafkaClient, "send", refusing(AIOKafkaClient.send, lambda: {topic}))
    producer = _idempotent(settings, request_timeout_ms=500)
    await start_producer(producer, 10)
    sent = await producer.send(topic, b"never delivered")
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(2):
            await producer.stop()
    await asyncio.sleep(0.5)
    assert producer._sender.sender_task is not None
    assert not producer._sender.sender_task.done(), "the cut-short stop ended the sender"
    assert not sent.done()

    assert await stop_producer(producer, 1.0) is False  # the half-stopped one is abandoned
    assert isinstance(sent.exception(), KafkaTimeoutError)
    await eventually(lambda: not aiokafka_tasks(), timeout=2, what="aiokafka's tasks ended")
    gc.collect()  # an unretrieved future's exception is reported when it is collected
    assert loop_errors == []


async def test_start_producer_gives_up_when_no_producer_id_is_granted(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, loop_errors: list[dict[str, Any]]
) -> None:
    """``start()`` retries InitProducerId for as long as the broker answers with a
    retriable error; start_producer gives up within its bound and closes what it opened
    (the bootstrap had started the metadata task)."""
    monkeypatch.setattr(
        AIOKafkaClient, "send", refusing(AIOKafkaClient.send, grant_producer_ids=False)
    )
    producer = _idempotent(settings)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await start_producer(producer, 1.0)
    took = time.monotonic() - started
    assert took < 3.0, f"start_producer took {took:.1f}s with a bound of 1s"
    await eventually(lambda: not aiokafka_tasks(), timeout=2, what="aiokafka's tasks ended")
    gc.collect()  # an unretrieved future's exception is reported when it is collected
    assert loop_errors == []


# --- the daemon -------------------------------------------------------------------------


async def test_relay_rebuilds_its_producer_and_stops_promptly(
    settings: Settings, tmp_path: Path
) -> None:
    """While every resume is refused, ingest goes on storing and matching, the relay's
    publication times out and its producer is torn down and rebuilt (never two retrying
    at once), and SIGTERM stops the daemon within seconds. Once resumes are accepted again
    every wait's resume is published, exactly once per wait. (Before the relay's Kafka
    calls had bounds, it waited for the first acknowledgement for ever, and SIGTERM did
    not stop it.)"""
    refused, refusals = tmp_path / "refused", tmp_path / "refusals"
    refused.write_text(settings.resume_topic)
    refusals.touch()
    total = 40
    correlations = register_waits(settings, total, prefix="stuck")
    events = [event(correlation=c) for c in correlations]
    options = {"MATCHER_RELAY_CALL_TIMEOUT_S": str(CALL_TIMEOUT_S)}

    with refusing_daemon(settings, refused, refusals, **options) as daemon:
        await produce(settings, events[: total // 2])
        await eventually(lambda: resolved(settings) == total // 2, timeout=30, what="matched")
        await eventually(
            lambda: daemon.count("publishing failed; retrying") >= 3,
            timeout=60,
            what="three publications timed out:\n" + daemon.output,
        )
        await produce(settings, events[total // 2 :])  # ingest is not held up meanwhile
        await eventually(lambda: resolved(settings) == total, timeout=30, what="all matched")
        assert published(settings) == 0
        assert daemon.count("relay producer started") >= 3, daemon.output
        assert daemon.count("did not stop in time; abandoning") >= 2, daemon.output
        assert most_producers_retrying_at_once(refusals, settings.resume_topic) == 1
        daemon.stop_promptly()
    assert published(settings) == 0

    with refusing_daemon(settings, refused, refusals, **options) as daemon:
        await eventually(
            lambda: daemon.count("publishing failed; retrying") >= 1,
            timeout=30,
            what="a publication timed out:\n" + daemon.output,
        )
        refused.write_text("")  # the broker accepts resumes again
        await eventually(lambda: published(settings) == total, timeout=60, what="published")
        daemon.stop_promptly()
    await check_exactly_once(settings, total)


async def test_dead_letter_copy_gives_up_and_stops_promptly(
    settings: Settings, tmp_path: Path
) -> None:
    """While every dead-letter copy is refused, ingest quarantines rejected records and
    matches events without waiting for the copies, each failed copy's producer is torn
    down (never two retrying at once: a producer cut short used to go on retrying in the
    background, one more after every failure), and SIGTERM stops the daemon within
    seconds. Once the topic accepts copies again, a rejected record is copied."""
    letters = f"{settings.events_topic}.dlq"
    await ensure_topics(
        settings.kafka_client_options(), [letters], partitions=settings.topic_partitions
    )
    refused, refusals = tmp_path / "refused", tmp_path / "refusals"
    refused.write_text(letters)
    refusals.touch()
    total, rejected = 20, 4
    correlations = register_waits(settings, total, prefix="stuck")
    events = [event(correlation=c) for c in correlations]
    options = {
        "MATCHER_DEAD_LETTER_TOPIC": letters,
        "MATCHER_DEAD_LETTER_CALL_TIMEOUT_S": str(CALL_TIMEOUT_S / 2),
    }
    try:
        with refusing_daemon(settings, refused, refusals, **options) as daemon:
            chunk = total // rejected
            for n in range(rejected):
                await produce_raw(settings, [(b"junk", [], f"not an event {n}".encode())])
                await produce(settings, events[n * chunk : (n + 1) * chunk])
            await eventually(
                lambda: resolved(settings) == total and published(settings) == total,
                timeout=30,
                what="every event matched and its resume published",
            )
            assert scalar(settings, "SELECT count(*) FROM matcher.quarantine") == rejected
            await eventually(
                lambda: daemon.count("dead-letter copy failed") >= 3,
                timeout=60,
                what="three copies failed:\n" + daemon.output,
            )
            assert most_producers_retrying_at_once(refusals, letters) == 1
            daemon.stop_promptly()

        refused.write_text("")
        with refusing_daemon(settings, refused, refusals, **options) as daemon:
            await produce_raw(settings, [(b"junk", [], b"copied at last")])
            copies = await read_resume_messages(
                settings.model_copy(update={"resume_topic": letters}), at_least=1, timeout=30
            )
            assert b"copied at last" in copies
            daemon.stop_promptly()
    finally:
        with contextlib.suppress(Exception):
            await delete_topics(settings.kafka_client_options(), [letters])
