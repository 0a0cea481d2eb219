"""The outbox relay: resolutions committed in Postgres become resume messages on Kafka.

Delivery is at least once (invariant 9): the transaction that deletes a queued resume
commits only after Kafka acknowledged it (idempotent producer, acks=all), so a crash in
between publishes it again, and the worker SDK's ``advance`` turns the duplicate into a
no-op. The relay wakes on a Postgres NOTIFY sent by every transaction that queues a
resume (and, in this process, a
direct nudge from ingest; see matcher.daemon.notifications), with a slow poll as a safety
net.

Every Kafka call here is bounded in time (``MATCHER_RELAY_CALL_TIMEOUT_S``): the
idempotent producer retries a batch for as long as the broker answers it with a retriable
error, and never expires it, so an unbounded wait for its acknowledgement would hold the
claimed rows (and their transaction) for ever, and its ``stop()`` would never return, not
even on SIGTERM. A publication that takes too long rolls the claim back, the producer is
torn down (see matcher.kafka.deadlines) and a new one publishes the rows again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import psycopg
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.partitioner import DefaultPartitioner
from psycopg.rows import args_row
from psycopg_pool import AsyncConnectionPool

from matcher import metrics, tracing
from matcher.config import Settings
from matcher.daemon.periodic import pause
from matcher.faults import crash_point
from matcher.kafka.deadlines import acknowledged, start_producer, stop_producer
from matcher.store import outbox
from matcher.store.outbox import Claimed
from matcher.store.pipelined import pipelined_transaction

log = logging.getLogger("matcher.relay")


def _observe(rows: list[Claimed]) -> None:
    now = time.time()
    published: dict[str, int] = {}
    for row in rows:
        published[row.outcome] = published.get(row.outcome, 0) + 1
        metrics.WAIT_DURATION.labels(row.outcome).observe(row.waited_s)
        if row.received_epoch is not None:
            metrics.EVENT_TO_RESUME.observe(max(0.0, now - row.received_epoch))
    for outcome, count in published.items():
        metrics.RESUMES_PUBLISHED.labels(outcome).inc(count)


_HEADERS = [("content-type", b"application/cloudevents+json")]
_PARTITIONER = DefaultPartitioner()  # Kafka's Java default: murmur2 of the key


async def send_in_batches(
    producer: AIOKafkaProducer, topic: str, messages: list[tuple[bytes, bytes]]
) -> list[asyncio.Future[Any]]:
    """Hand the (key, value) messages to Kafka a batch per partition rather than a message
    at a time: per-message ``send`` was a sixth of the daemon's CPU. Partitioned as
    ``send`` would, in the order given, so one key's messages keep their order."""
    partitions = sorted(await producer.partitions_for(topic))
    batches: dict[int, Any] = {}
    futures: list[asyncio.Future[Any]] = []
    for key, value in messages:
        partition = int(_PARTITIONER(key, partitions, partitions))
        batch = batches.get(partition)
        if batch is None:
            batch = batches[partition] = producer.create_batch()
        if batch.append(key=key, value=value, timestamp=None, headers=_HEADERS) is None:
            # Full: send it, start the next one for this partition.
            futures.append(await producer.send_batch(batch, topic, partition=partition))
            batch = batches[partition] = producer.create_batch()
            if batch.append(key=key, value=value, timestamp=None, headers=_HEADERS) is None:
                raise ValueError(f"a resume of {len(value)} bytes exceeds the batch size")
    for partition, batch in batches.items():
        futures.append(await producer.send_batch(batch, topic, partition=partition))
    return futures


class Relay:
    def __init__(
        self,
        settings: Settings,
        pool: AsyncConnectionPool,
        stop: asyncio.Event,
        *,
        call_timeout_s: float | None = None,
    ) -> None:
        self._settings = settings
        self._pool = pool
        self._stop = stop
        self._wake = asyncio.Event()
        # The longest one Kafka call may take: a start, a batch's publication (all its
        # acknowledgements), a stop. Past it the producer is rebuilt.
        self._call_timeout_s = (
            settings.relay_call_timeout_s if call_timeout_s is None else call_timeout_s
        )
        # One request's wait for a broker (within a call): a hung broker costs this.
        self._request_timeout_ms = settings.request_timeout_ms(self._call_timeout_s)
        self.published = 0
        self.producers_started = 0  # one more each time a producer is (re)built

    def nudge(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        try:
            delay = 0.1
            while not self._stop.is_set():
                producer = AIOKafkaProducer(
                    **self._settings.kafka_client_options(),
                    enable_idempotence=True,
                    acks="all",
                    linger_ms=self._settings.relay_linger_ms,
                    # Room for a whole relay batch of one partition in one request.
                    max_batch_size=512 * 1024,
                    request_timeout_ms=self._request_timeout_ms,
                )
                try:
                    await start_producer(producer, self._call_timeout_s)
                    self.producers_started += 1
                    log.info("relay producer started", extra={"started": self.producers_started})
                    await self._publish_until_stopped(producer)
                    delay = 0.1
                except (TimeoutError, KafkaError, OSError) as exc:
                    log.warning(
                        "publishing failed; retrying",
                        extra={"error": exc, "retry_in_s": delay},
                    )
                except psycopg.OperationalError as exc:
                    log.warning(
                        "database unavailable; retrying",
                        extra={"error": exc, "retry_in_s": delay},
                    )
                finally:
                    await stop_producer(producer, self._call_timeout_s)
                if not self._stop.is_set():
                    await pause(self._stop, delay)
                    delay = min(delay * 2, 5.0)
        finally:
            log.info("relay stopped", extra={"published": self.published})

    async def _publish_until_stopped(self, producer: AIOKafkaProducer) -> None:
        while True:
            self._wake.clear()
            sent = await self.publish_batch(producer)
            if sent >= self._settings.relay_batch_max:
                continue  # more are likely waiting
            if self._stop.is_set():
                return
            await pause(self._stop, self._settings.relay_poll_interval_s, self._wake)
            if self._stop.is_set():
                # Publish what the final batches resolved before leaving.
                await self.publish_batch(producer)
                return

    async def publish_batch(self, producer: AIOKafkaProducer) -> int:
        topic = self._settings.resume_topic
        # BEGIN travels with the claim, which deletes the rows it returns; the COMMIT,
        # sent once Kafka has acknowledged them, is the mark: two round trips to Postgres
        # per batch (matcher.store.pipelined).
        async with (
            self._pool.connection() as conn,
            pipelined_transaction(conn) as pipeline,
            conn.cursor(row_factory=args_row(Claimed)) as cur,
        ):
            rows = await outbox.claim_unpublished(cur, pipeline, self._settings.relay_batch_max)
            if not rows:
                return 0
            crash_point("relay.before_publish")
            began_ns = time.time_ns()
            # Bounded: a TimeoutError rolls the claim back, and run() rebuilds the producer.
            async with asyncio.timeout(self._call_timeout_s):
                # Keyed by run id, in outbox order, so one run's resumes keep their order.
                # The messages come ready-made from the claim query.
                messages = [(row.run_id.encode(), row.message.encode()) for row in rows]
                sends = await send_in_batches(producer, topic, messages)
                await acknowledged(
                    producer,
                    sends,
                    timeout_s=self._call_timeout_s,
                    refresh_every_s=self._request_timeout_ms / 1000,
                )
            crash_point("relay.after_publish")
        if tracing.enabled():
            _trace_publication(rows, began_ns, topic)
        self.published += len(rows)
        _observe(rows)
        return len(rows)


def _trace_publication(rows: list[Any], began_ns: int, topic: str) -> None:
    """A span per published resume whose event had a trace context: its child."""
    ended_ns = time.time_ns()
    for row in rows:
        traceparent = tracing.message_traceparent(row.message)
        if traceparent is not None:
            tracing.record_span(
                "matcher.resume publish", traceparent, began_ns, ended_ns,
                {"matcher.run_id": row.run_id, "messaging.destination.name": topic},
            )  # fmt: skip
