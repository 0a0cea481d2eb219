"""The ingest loop: Kafka batch in, one Postgres transaction, then the batch's offsets.

Order is everything here (invariant 1): an offset is committed only after the batch it
covers is committed to Postgres. A crash anywhere re-reads the batch, and the inbox key
(producer, event id) turns the re-read into duplicates that change nothing.

The consumer's start, stop and position look-ups are bounded in time, like its commits
(matcher.kafka.commits) and fetches (matcher.kafka.fetch): a broker that does not answer
fails the loop or skips a measurement, it does not hold the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import psycopg
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError
from psycopg_pool import AsyncConnectionPool

from matcher import metrics
from matcher.auth.gate import judge
from matcher.auth.policy import Policy
from matcher.auth.registry import Registry
from matcher.auth.registry_watch import RegistryHolder
from matcher.config import Settings
from matcher.daemon.faults import crash_point
from matcher.domain.events import Rejection, seen_attributes
from matcher.domain.quarantine import QuarantineLimits
from matcher.domain.records import IngestRecord
from matcher.kafka import codecs
from matcher.kafka.binding import raw_record
from matcher.kafka.commits import OffsetCommitter
from matcher.kafka.dead_letters import DeadLetters
from matcher.kafka.deadlines import start_consumer, stop_consumer
from matcher.kafka.fetch import Batch, SafeFetcher
from matcher.kafka.fetch_wait import FlowFetchWait
from matcher.logs import describe_error
from matcher.metrics import EVENTS_RECEIVED, EVENTS_REJECTED
from matcher.store.ingest import BatchResult, conflicting_duplicates, store_batch
from matcher.store.maintenance import ensure_days

log = logging.getLogger("matcher.ingest")

# The longest the consumer's start or stop may take, and a lag measurement's look-up.
CALL_TIMEOUT_S = 30.0
LAG_LOOKUP_TIMEOUT_S = 2.0
# A batch whose keys and values add up to no more than this is judged on the event loop
# (a few milliseconds at most); a larger one in a worker thread.
INLINE_JUDGE_BYTES = 64 * 1024
# How long past its timeout a fetch made while a batch is paced may take before it is cut
# off (a busy machine's lateness; see Ingest._paced).
PACED_FETCH_GRACE_S = 0.1

# Worth retrying the same batch: the database or the network, not the data.
_TRANSIENT = (
    psycopg.OperationalError,
    psycopg.errors.SerializationFailure,
    psycopg.errors.DeadlockDetected,
    psycopg.errors.LockNotAvailable,
)
# The data itself was refused: find the record by splitting the batch, quarantine it.
_DATA_REFUSED = (psycopg.DataError, psycopg.IntegrityError)


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


def _payload_bytes(batch: Batch) -> int:
    return sum(
        len(m.value or b"") + len(m.key or b"") for messages in batch.values() for m in messages
    )


def to_ingest_records(batch: Batch, registry: Registry, policy: Policy) -> list[IngestRecord]:
    read_at = datetime.now(UTC)
    records: list[IngestRecord] = []
    for tp, messages in batch.items():
        for m in messages:
            raw = raw_record(m, read_at)
            verdict = (
                judge(raw, registry, policy)
                if m.undecodable is None
                else Rejection("undecodable", m.undecodable)
            )
            records.append(
                IngestRecord(
                    topic=tp.topic,
                    partition=tp.partition,
                    offset=m.offset,
                    key=raw.key,
                    value=raw.value,
                    headers=raw.headers,
                    parsed=verdict,
                    arrived_at=raw.arrived_at,
                )
            )
    return records


def pacing_wait(last_began: float | None, now: float, interval_s: float) -> float:
    """How long a batch waits before its transaction begins: until ``interval_s`` after
    the one before began, or not at all if there was none. (A full batch does not wait
    either: the pacing stops taking records, and waiting, once the batch is full.)"""
    if last_began is None:
        return 0.0
    return min(interval_s, max(0.0, last_began + interval_s - now))


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
        self._registry = registry or RegistryHolder(
            settings.producers_file,
            settings.producers_reload_interval_s,
            metrics.REGISTRY_RELOADS,
            metrics.REGISTRY_RELOAD_FAILING,
        )
        self._policy = settings.policy()
        self._limits = QuarantineLimits(
            value_bytes=settings.quarantine_keep_bytes,
            header_bytes=settings.max_header_bytes,
            headers=settings.max_headers,
        )
        self._dead_letters = (
            None
            if settings.dead_letter_topic is None
            else DeadLetters(settings, settings.dead_letter_topic, self._limits)
        )
        self.joined = False
        self._pool = pool
        self._stop = stop
        self._on_resolved = on_resolved
        self._batch_lock = asyncio.Lock()
        self._batch_began: float | None = None  # on the event loop's clock
        self._fetch_wait = FlowFetchWait(None, 0)  # the consumer's, once run() makes it
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
        self._fetch_wait = FlowFetchWait(consumer, s.ingest_fetch_wait_ms)
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
                batch = await self._fetch(fetcher, s.ingest_poll_timeout_ms, s.ingest_batch_max)
                records = await self._judged(batch)
                if in_flight is not None:
                    await in_flight
                    in_flight = None
                    # What arrived while the batch before was stored joins this batch
                    # instead of waiting for the next: at low rates batches are small,
                    # and an event would otherwise wait out two store cycles, not one.
                    await self._top_up(fetcher, batch, records)
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
            self._fetch_wait.close()
            # Leaves the group at once, so the partitions move without a session timeout.
            await stop_consumer(consumer, CALL_TIMEOUT_S)
            metrics.ASSIGNED_PARTITIONS.set(0)
            metrics.CONSUMER_LAG.clear()
            letters_stop.set()
            if letters is not None:
                await letters
            log.info("ingest stopped")

    async def _judged(self, batch: Batch) -> list[IngestRecord]:
        """The gate's verdicts on ``batch``. A small batch is judged here; a large one in
        a worker thread, so that the event loop (the group heartbeat, the relay, the
        admin probes) stays responsive however costly a batch is to read. The thread
        costs a hand-over each way, most of a small batch's judging time."""
        if not batch:
            return []
        registry = self._registry.current
        if _payload_bytes(batch) <= INLINE_JUDGE_BYTES:
            return to_ingest_records(batch, registry, self._policy)
        return await asyncio.to_thread(to_ingest_records, batch, registry, self._policy)

    async def _fetch(
        self, fetcher: SafeFetcher, timeout_ms: int, max_records: int, bound_s: float | None = None
    ) -> Batch:
        """``getmany``, telling the fetch wait how many records came; given ``bound_s``,
        nothing (the call cancelled, which hands nothing over) if it is not back by then."""
        bound = asyncio.timeout(bound_s)  # None: no bound
        try:
            async with bound:
                batch = await fetcher.getmany(timeout_ms=timeout_ms, max_records=max_records)
        except TimeoutError:
            if not bound.expired():  # the fetcher's own, not the bound's
                raise
            batch = {}
        self._fetch_wait.note(sum(map(len, batch.values())), asyncio.get_running_loop().time())
        return batch

    async def _top_up(
        self,
        fetcher: SafeFetcher,
        batch: Batch,
        records: list[IngestRecord],
        wait_ms: int = 0,
        bound_s: float | None = None,
    ) -> None:
        """Add to ``batch`` (and its ``records``) what is fetched, up to the batch size:
        what is already there, or the first records within ``wait_ms`` (and, given
        ``bound_s``, nothing if the fetch is not back within it)."""
        room = self._settings.ingest_batch_max - len(records)
        if room <= 0:
            return
        more = await self._fetch(fetcher, wait_ms, room, bound_s)
        if not more:
            return
        records.extend(await self._judged(more))
        for tp, messages in more.items():
            batch.setdefault(tp, []).extend(messages)

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
            await self._paced(fetcher, batch, records)
        except BaseException:
            self._batch_lock.release()
            raise
        return asyncio.create_task(self._handle_locked(committer, batch, records))

    async def _paced(self, fetcher: SafeFetcher, batch: Batch, records: list[IngestRecord]) -> None:
        """Hold ``batch`` until ``ingest_batch_interval_ms`` after the batch before it
        began, taking what arrives meanwhile. At 500 events/s a cycle takes about 1.5 ms,
        so without it nearly every event is a transaction (and a relay batch) of its
        own: CPU spent on cycles' fixed costs rather than on events.

        The wait is spent fetching, not sleeping: the client fetches a partition again
        only once what it holds of it has been taken, so a batch topped up once, at the
        end, would hold at most one fetch of each partition.

        Each fetch is bounded: once a rebalance has begun, aiokafka's ``getmany`` waits
        for the next assignment however short its timeout, and the revocation that
        must come first waits for the batch lock this batch holds. Cut off, the fetch
        hands nothing over and the batch goes as it is."""
        loop = asyncio.get_running_loop()
        s = self._settings
        wait = pacing_wait(self._batch_began, loop.time(), s.ingest_batch_interval_ms / 1000)
        deadline = loop.time() + wait
        # A full batch (a backlog) goes at once.
        while (left := deadline - loop.time()) > 0 and len(records) < s.ingest_batch_max:
            await self._top_up(
                fetcher, batch, records, wait_ms=max(1, round(left * 1000)),
                bound_s=left + PACED_FETCH_GRACE_S,
            )  # fmt: skip
        self._batch_began = loop.time()

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
        with metrics.BATCH_SECONDS.time():
            result = await self._store(records)
        crash_point("ingest.after_db_commit")
        if result.matched:
            self._on_resolved()
        if result.duplicates:
            await self._report_conflicts(records)
        self._count(result)  # after the conflicts: a test reads these counts as "all done"
        if self._dead_letters is not None:
            self._dead_letters.offer(result.rejected)
        # Committed in the background, in order: the next batch need not wait for it.
        committer.submit(
            {tp: messages[-1].offset + 1 for tp, messages in batch.items() if messages}
        )

    async def _report_conflicts(self, records: list[IngestRecord]) -> None:
        """Log and count the duplicates that said something else than the stored event
        (a producer reusing an id loses an event; this is where its operator hears of it).
        Only batches with duplicates pay for the look-up; it cannot hold the batch up:
        failing, it is logged and the batch goes on (it is stored already)."""
        try:
            async with self._pool.connection() as conn:
                conflicting = await conflicting_duplicates(conn, records)
        except psycopg.Error as exc:
            log.warning("could not compare duplicates with the stored events", extra={"error": exc})
            return
        metrics.CONFLICTING_DUPLICATES.inc(len(conflicting))
        for record in conflicting:
            assert not isinstance(record.parsed, Rejection)
            log.warning(
                "duplicate id with other content; dropped (CloudEvents identity is source + id)",
                extra={
                    "producer": record.parsed.source,
                    "event_id": record.parsed.id,
                    "partition": record.partition,
                    "offset": record.offset,
                },
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

    def _count(self, result: BatchResult) -> None:
        metrics.MATCHES.inc(result.matched)
        metrics.LATE_EVENTS.inc(result.late)
        EVENTS_RECEIVED.labels("accepted").inc(result.accepted)
        EVENTS_RECEIVED.labels("duplicate").inc(result.duplicates)
        EVENTS_RECEIVED.labels("rejected").inc(result.quarantined)
        for record in result.rejected:
            assert isinstance(record.parsed, Rejection)
            EVENTS_REJECTED.labels(record.parsed.reason).inc()
            log.info(
                "event quarantined",
                extra={
                    "reason": record.parsed.reason,
                    "partition": record.partition,
                    "offset": record.offset,
                    **record.parsed.seen,
                },
            )

    async def _store(self, records: list[IngestRecord]) -> BatchResult:
        """Store the records, retrying what is transient and isolating refused data."""
        delay = 0.05
        while True:
            try:
                async with self._pool.connection() as conn:
                    return await store_batch(
                        conn,
                        records,
                        lambda: crash_point("ingest.in_transaction"),
                        self._limits,
                    )
            except psycopg.errors.ProgramLimitExceeded as exc:
                # An OperationalError, but about the data (an index entry too large, say):
                # retrying would fail for ever.
                return await self._isolate(records, exc)
            except _TRANSIENT as exc:
                log.warning("batch failed, retrying", extra={"error": exc, "retry_in_s": delay})
            except psycopg.errors.CheckViolation as exc:
                if exc.diag.constraint_name is not None:
                    return await self._isolate(records, exc)  # a real CHECK refused data
                # No constraint named: the inbox has no day for now() (every janitor has
                # been down for days). Not the data's fault: create the days and retry.
                log.error("the inbox has no partition for today; creating it")
                try:
                    async with self._pool.connection() as conn:
                        await ensure_days(conn)
                except psycopg.Error as error:
                    log.warning("creating inbox days failed", extra={"error": error})
            except _DATA_REFUSED as exc:
                return await self._isolate(records, exc)
            except psycopg.Error as exc:
                log.error(
                    "batch failed unexpectedly, retrying",
                    extra={"error": exc, "retry_in_s": delay},
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def _isolate(self, records: list[IngestRecord], exc: Exception) -> BatchResult:
        """Split a refused batch until the refused records are alone; quarantine those."""
        if len(records) == 1:
            record = records[0]
            log.warning(
                "record refused by the database; quarantined",
                extra={"partition": record.partition, "offset": record.offset, "error": exc},
            )
            # Quarantined with what the gate read of it, so explain names the refusal; the
            # database's words without the values they quote (describe_error).
            why = f"refused by the database: {describe_error(exc)}"[:500]
            seen = {} if isinstance(record.parsed, Rejection) else seen_attributes(record.parsed)
            refused = dataclasses.replace(record, parsed=Rejection("malformed", why, seen))
            return await self._store([refused])
        middle = len(records) // 2
        return await self._store(records[:middle]) + await self._store(records[middle:])
