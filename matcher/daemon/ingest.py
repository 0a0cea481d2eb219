"""The ingest loop: Kafka batch in, one Postgres transaction, then the batch's offsets.

Order is everything here (invariant 1): an offset is committed only after the batch it
covers is committed to Postgres. A crash anywhere re-reads the batch, and the inbox key
(producer, event id) turns the re-read into duplicates that change nothing. ``_handle``
says it in four lines: the writer stores the batch, the report tells of it, then the
committer takes its offsets. The way in (fetch, judge, pace) is ``matcher.daemon.intake``.

The consumer's start, stop and position look-ups are bounded in time, like its commits
(matcher.kafka.commits) and fetches (matcher.kafka.fetch): a broker that does not answer
fails the loop or skips a measurement, it does not hold the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError
from psycopg_pool import AsyncConnectionPool

from matcher import metrics, tracing
from matcher.auth.registry_watch import RegistryHolder
from matcher.config import Settings
from matcher.daemon.batch_writer import BatchWriter
from matcher.daemon.ingest_report import IngestReport
from matcher.daemon.intake import Intake
from matcher.domain.quarantine import QuarantineLimits
from matcher.domain.records import IngestRecord
from matcher.domain.trace_context import trace_parent
from matcher.faults import crash_point
from matcher.kafka import codecs
from matcher.kafka.commits import OffsetCommitter
from matcher.kafka.dead_letters import DeadLetters
from matcher.kafka.deadlines import start_consumer, stop_consumer
from matcher.kafka.fetch import Batch, SafeFetcher
from matcher.kafka.fetch_wait import FlowFetchWait
from matcher.store.ingest import BatchResult

log = logging.getLogger("matcher.ingest")

# The longest the consumer's start or stop may take, and a lag measurement's look-up.
CALL_TIMEOUT_S = 30.0
LAG_LOOKUP_TIMEOUT_S = 2.0


class _Revocations(ConsumerRebalanceListener):  # type: ignore[misc]
    """Before partitions go to another member, let the batch in flight finish and its
    offsets be committed."""

    def __init__(self, batch_lock: asyncio.Lock, ingest: Ingest) -> None:
        self._batch_lock = batch_lock
        self._ingest = ingest

    async def on_partitions_revoked(self, revoked: Sequence[TopicPartition]) -> None:
        async with self._batch_lock:
            if self._ingest.committer is not None:
                await self._ingest.committer.flush()
            log.info("partitions revoked", extra={"partitions": _names(revoked)})

    async def on_partitions_assigned(self, assigned: Sequence[TopicPartition]) -> None:
        self._ingest.joined = True
        metrics.ASSIGNED_PARTITIONS.set(len(assigned))
        metrics.CONSUMER_LAG.clear()
        log.info("partitions assigned", extra={"partitions": _names(assigned)})


def _names(partitions: Sequence[TopicPartition]) -> str:
    return ",".join(f"{tp.topic}:{tp.partition}" for tp in sorted(partitions))


class Ingest:
    def __init__(
        self,
        settings: Settings,
        pool: AsyncConnectionPool,
        stop: asyncio.Event,
        on_resolved: Callable[[], None],
        registry: RegistryHolder | None = None,
    ) -> None:
        self._settings = settings
        registry = registry or RegistryHolder(
            settings.producers_file,
            settings.producers_reload_interval_s,
            metrics.REGISTRY_RELOADS,
            metrics.REGISTRY_RELOAD_FAILING,
        )
        limits = QuarantineLimits(
            value_bytes=settings.quarantine_keep_bytes,
            header_bytes=settings.max_header_bytes,
            headers=settings.max_headers,
        )
        self._dead_letters = (
            None
            if settings.dead_letter_topic is None
            else DeadLetters(settings, settings.dead_letter_topic, limits)
        )
        self.intake = Intake(settings, registry)
        self.writer = BatchWriter(pool, limits)
        self._report = IngestReport(pool, self._dead_letters)
        self.joined = False
        self._stop = stop
        self._on_resolved = on_resolved
        self._batch_lock = asyncio.Lock()
        self.consumer: AIOKafkaConsumer | None = None
        self.committer: OffsetCommitter | None = None

    async def run(self) -> None:
        s = self._settings
        codecs.install(s.max_batch_bytes)
        consumer = AIOKafkaConsumer(
            **s.kafka_client_options(),
            group_id=s.consumer_group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            max_poll_records=s.ingest_batch_max,
            max_poll_interval_ms=s.ingest_max_poll_interval_ms,
            session_timeout_ms=s.kafka_session_timeout_ms,
            heartbeat_interval_ms=s.kafka_heartbeat_interval_ms,
        )
        # Every fetch goes through the fetcher, which hands over what the client cannot
        # decode as undecodable records instead of failing (and told of rebalances).
        fetcher = SafeFetcher(consumer)
        self.intake.fetch_wait = FlowFetchWait(consumer, s.ingest_fetch_wait_ms)
        consumer.subscribe(
            [s.events_topic],
            listener=fetcher.rebalance_listener(_Revocations(self._batch_lock, self)),
        )
        self.consumer = consumer
        self.committer = committer = OffsetCommitter(
            consumer, min_interval_s=s.ingest_commit_interval_ms / 1000
        )
        letters_stop = asyncio.Event()
        letters = (
            None
            if self._dead_letters is None
            else asyncio.create_task(self._dead_letters.run(letters_stop), name="dead-letters")
        )
        try:
            await start_consumer(consumer, CALL_TIMEOUT_S)
        except BaseException:
            letters_stop.set()
            if letters is not None:
                await letters
            raise
        # One batch is judged (CPU) while the one before is in Postgres (I/O, in a task):
        # batches are still stored and their offsets committed strictly in order.
        in_flight: asyncio.Task[None] | None = None
        try:
            while not self._stop.is_set():
                batch = await self.intake.fetch(
                    fetcher, s.ingest_poll_timeout_ms, s.ingest_batch_max
                )
                records = await self.intake.judged(batch)
                if in_flight is not None:
                    await in_flight
                    in_flight = None
                    # What arrived while the batch before was stored joins this batch
                    # instead of waiting for the next: at low rates batches are small,
                    # and an event would otherwise wait out two store cycles, not one.
                    await self.intake.top_up(fetcher, batch, records)
                if batch:
                    in_flight = await self._begin(committer, fetcher, batch, records)
                committer.tick()
                await self._measure_lag(consumer, committer)
            if in_flight is not None:
                await in_flight
            await committer.flush()
        finally:
            if in_flight is not None and not in_flight.done():
                in_flight.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await in_flight
            self.intake.fetch_wait.close()
            # Leaves the group at once, so the partitions move without a session timeout.
            await stop_consumer(consumer, CALL_TIMEOUT_S)
            metrics.ASSIGNED_PARTITIONS.set(0)
            metrics.CONSUMER_LAG.clear()
            letters_stop.set()
            if letters is not None:
                await letters
            log.info("ingest stopped")

    async def _begin(
        self,
        committer: OffsetCommitter,
        fetcher: SafeFetcher,
        batch: Batch,
        records: list[IngestRecord],
    ) -> asyncio.Task[None]:
        """Pace ``batch``, then store it in a task of its own. The batch lock is taken
        first, so a revocation waits for this batch (a paced one, topped up during its
        wait, too); the task releases it."""
        await self._batch_lock.acquire()
        try:
            await self.intake.paced(fetcher, batch, records)
        except BaseException:
            self._batch_lock.release()
            raise
        return asyncio.create_task(self._handle_locked(committer, batch, records))

    async def _handle_locked(
        self,
        committer: OffsetCommitter,
        batch: Batch,
        records: list[IngestRecord],
    ) -> None:
        try:
            await self._handle(committer, batch, records)
        finally:
            self._batch_lock.release()

    async def _handle(
        self,
        committer: OffsetCommitter,
        batch: Batch,
        records: list[IngestRecord],
    ) -> None:
        metrics.BATCH_SIZE.observe(len(records))
        began_ns = time.time_ns()
        with metrics.BATCH_SECONDS.time():
            result = await self.writer.store(records)
        crash_point("ingest.after_db_commit")
        if tracing.enabled():
            _trace_batch(records, result, began_ns)
        if result.matched:
            self._on_resolved()
        await self._report.report(records, result)
        # Committed in the background, in order: the next batch need not wait for it.
        committer.submit(
            {tp: messages[-1].offset + 1 for tp, messages in batch.items() if messages}
        )

    def assigned_partitions(self) -> int | None:
        """Partitions held now; None until the consumer has joined its group."""
        if self.consumer is None or not self.joined:
            return None
        return len(self.consumer.assignment())

    async def kafka_reachable(self) -> bool:
        """Whether a broker answers this consumer (a metadata request, bounded in time)."""
        if self.consumer is None:
            return False
        try:
            async with asyncio.timeout(2):
                await self.consumer.topics()
        except (KafkaError, OSError, TimeoutError):
            return False
        return True

    async def _measure_lag(self, consumer: AIOKafkaConsumer, committer: OffsetCommitter) -> None:
        for tp in consumer.assignment():
            end = consumer.highwater(tp)
            if end is None:
                continue  # nothing fetched yet from this partition
            done = committer.committed.get(tp)
            if done is None:
                try:
                    async with asyncio.timeout(LAG_LOOKUP_TIMEOUT_S):
                        done = await consumer.position(tp)
                except (KafkaError, TimeoutError):
                    continue  # measured next time
            metrics.CONSUMER_LAG.labels(str(tp.partition)).set(max(0, end - done))


def _trace_batch(records: Sequence[IngestRecord], result: BatchResult, began_ns: int) -> None:
    """The batch's span (its own trace), linked to the trace of each event that had one."""
    links = [found for found in (tracing.link(trace_parent(r.headers)) for r in records) if found]
    attributes = {
        "matcher.events": len(records), "matcher.accepted": result.accepted,
        "matcher.matched": result.matched, "matcher.duplicates": result.duplicates,
        "matcher.quarantined": result.quarantined,
    }  # fmt: skip
    tracing.record_span("matcher.ingest batch", None, began_ns, time.time_ns(), attributes, links)
