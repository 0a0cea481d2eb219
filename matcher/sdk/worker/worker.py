"""The resume worker: consumes the resume topic as a consumer group and, for each resume,
advances the run and calls the handler in one Postgres transaction (``attempt``).

- Resumes are keyed by run id, so one run's resumes come in order on one partition; the
  worker keeps that order per run (a queue per run) while other runs go on, at most
  ``worker_concurrency`` handlers at a time.
- A run not ready (the handler raises ``Retry``, or an earlier resume of the run is not
  advanced yet) waits alone and is tried again; a handler that fails is tried again with
  a growing backoff, and parked once its attempts are spent (``matcher.worker_failures``,
  visible to explain and the console; ``matcher resumes retry`` gives it back).
- A message that is not a resume, or one matcher did not commit, is counted, logged
  (never its content) and skipped: nothing blocks a partition.
- Offsets are committed up to the lowest resume of each partition not done yet
  (``PartitionOffsets``): after a crash, what follows it is read again as duplicates.
- A sweep of the database hands the handler the resolutions no worker advanced, so a lost
  offset, an expired retention or a deleted topic never strands a run.
- SIGTERM (``stop``): no more fetches; running handlers get ``worker_shutdown_timeout_s``
  to finish, then are cancelled (their transactions roll back); the offsets of what is
  done are committed; the group is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from matcher import tracing
from matcher.config import WorkerSettings
from matcher.domain.resume import NotAResume, ResumeData, read_resume
from matcher.kafka.deadlines import start_consumer, stop_consumer
from matcher.sdk.worker import metrics
from matcher.sdk.worker.attempt import (
    Attempt,
    Kind,
    as_async,
    as_sync,
    attempt_async,
    attempt_sync,
    is_async,
)
from matcher.sdk.worker.batches import Batcher
from matcher.sdk.worker.handler import Handler
from matcher.sdk.worker.progress import PartitionOffsets
from matcher.store.worker_api import (
    call_async,
    record_failure_call,
    unadvanced_async,
    unadvanced_params,
)

log = logging.getLogger("matcher.worker")

RunKey = tuple[str, str]  # tenant, run id
CALL_TIMEOUT_S = 30.0  # a start, a stop, a commit, a fetch: every Kafka call is bounded
SWEEP_ROWS = 200


@dataclass
class Work:
    """One resume to handle, and where it came from (a partition's offset, or the sweep)."""

    resume: ResumeData
    partition: TopicPartition | None = None
    offset: int | None = None
    not_ready_since: float | None = None  # monotonic

    @property
    def source(self) -> str:
        return "sweep" if self.partition is None else "topic"


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, worker: ResumeWorker) -> None:
        self._worker = worker

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        await self._worker.release(list(revoked))

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        self._worker.assign(list(assigned))


class ResumeWorker:
    """Run ``handler`` once per resume, inside the transaction that advances its run.

    ``handler(tx, resume)``: async (with a psycopg AsyncConnection) or sync (with a
    Connection, run in a thread). ``accept``, when given, is asked of every resume after
    the settings' tenant and run-prefix filters: False skips it (another application's).
    """

    def __init__(
        self,
        handler: Handler,
        settings: WorkerSettings,
        accept: Callable[[ResumeData], bool] | None = None,
    ) -> None:
        self._handler = handler
        self._async = is_async(handler)
        self._settings = settings
        self._accept = accept
        self._batcher: Batcher | None = None
        self._runs: dict[RunKey, deque[Work]] = {}
        self._drivers: set[asyncio.Task[None]] = set()
        self._offsets: dict[TopicPartition, PartitionOffsets] = {}
        self._committed: dict[TopicPartition, int] = {}
        # The attempts running now, by partition: a revocation waits for them.
        self._running: dict[TopicPartition, set[asyncio.Future[None]]] = {}
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()  # a wait ended early: revocation or stop
        self._pool: AsyncConnectionPool | None = None
        self._sync_pool: ConnectionPool | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self.handled = 0  # resumes whose run this worker advanced
        self.assigned = asyncio.Event()  # set once the group has given it partitions

    # --- the loop -------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        tracing.configure_from_env()
        s = self._settings
        url = s.database_url.get_secret_value()
        self._pool = AsyncConnectionPool(
            url, min_size=1, max_size=s.worker_concurrency + 2, open=False,
            kwargs={"autocommit": True},
        )  # fmt: skip
        if not self._async:
            self._sync_pool = ConnectionPool(
                url, min_size=1, max_size=s.worker_concurrency, open=False,
                kwargs={"autocommit": True},
            )  # fmt: skip
            self._sync_pool.open(wait=True, timeout=s.startup_timeout_s)
        await self._pool.open(wait=True, timeout=s.startup_timeout_s)
        consumer = self._consumer = AIOKafkaConsumer(
            **s.kafka_client_options(),
            group_id=s.worker_group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=max(100, s.worker_concurrency * 20),
        )
        consumer.subscribe([s.resume_topic], listener=_Rebalance(self))
        try:
            await start_consumer(consumer, CALL_TIMEOUT_S)
            await self._consume(consumer, stop)
        finally:
            await self._finish(consumer)

    async def _consume(self, consumer: AIOKafkaConsumer, stop: asyncio.Event) -> None:
        s = self._settings
        self._batcher = Batcher(
            self._run_batch, s.worker_concurrency, s.worker_batch_max, self._stopping
        )
        sweep = asyncio.create_task(self._sweep_every(stop), name="worker-sweep")
        committing = asyncio.create_task(self._commit_every(stop), name="worker-commits")
        watching = asyncio.create_task(self._watch(stop), name="worker-stop")
        log.info("resume worker started", extra={"topic": self._settings.resume_topic})
        try:
            while not stop.is_set():
                if self._buffered() >= self._settings.worker_concurrency * 50:
                    await self._pause(0.05)  # backpressure: handlers are behind
                    continue
                async with asyncio.timeout(CALL_TIMEOUT_S):
                    batch = await consumer.getmany(timeout_ms=200)
                for tp, messages in batch.items():
                    for message in messages:
                        self._take(tp, message.offset, message.value)
                self._raise_failed(sweep, committing)
        finally:
            for task in (sweep, committing, watching):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _watch(self, stop: asyncio.Event) -> None:
        """At stop, no run starts another attempt, and waits for a retry end at once."""
        await stop.wait()
        self._stopping.set()
        self._wake.set()

    def _raise_failed(self, *tasks: asyncio.Task[None]) -> None:
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    def _buffered(self) -> int:
        return sum(len(queue) for queue in self._runs.values())

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wake.wait()

    # --- taking resumes ----------------------------------------------------------------

    def _take(self, tp: TopicPartition, offset: int, value: bytes | None) -> None:
        offsets = self._offsets.get(tp)
        if offsets is None:
            return  # revoked while fetched
        offsets.take(offset)
        try:
            resume = read_resume(value or b"")
        except NotAResume as exc:
            metrics.RESUMES.labels("not_a_resume", "topic").inc()
            log.warning(
                "a message of the resume topic is not a resume; skipped",
                extra={"partition": tp.partition, "offset": offset, "why": str(exc)[:200]},
            )
            offsets.done(offset)
            return
        if not self._accepts(resume):
            metrics.RESUMES.labels("filtered", "topic").inc()
            offsets.done(offset)
            return
        self._enqueue(Work(resume, tp, offset))

    def _accepts(self, resume: ResumeData) -> bool:
        s = self._settings
        if s.worker_tenants and resume.tenant not in s.worker_tenants:
            return False
        if s.worker_run_prefix and not resume.run_id.startswith(s.worker_run_prefix):
            return False
        return self._accept is None or self._accept(resume)

    def _enqueue(self, work: Work) -> None:
        key = (work.resume.tenant, work.resume.run_id)
        queue = self._runs.get(key)
        if queue is not None:
            queue.append(work)  # behind the run's earlier resumes: order per run is kept
            return
        self._runs[key] = deque([work])
        driver = asyncio.create_task(self._drive(key), name=f"worker-run-{key[1][:40]}")
        self._drivers.add(driver)
        driver.add_done_callback(self._drivers.discard)

    # --- one run's resumes, in order -----------------------------------------------------

    async def _drive(self, key: RunKey) -> None:
        queue = self._runs[key]
        try:
            while queue and not self._stopping.is_set():
                work = queue[0]
                if work.partition is not None and work.partition not in self._offsets:
                    queue.popleft()  # its partition went to another worker
                    continue
                result = await self._attempt(work)
                if result is None:
                    break  # stopping: left for the next worker, not done
                wait = await self._settle(work, result)
                if wait is None:
                    queue.popleft()
                    self._done(work)
                    continue
                metrics.WAITING.inc()
                try:
                    await self._pause(wait)
                finally:
                    metrics.WAITING.dec()
        finally:
            del self._runs[key]

    async def _attempt(self, work: Work) -> Attempt | None:
        """One attempt, alone or in a batch (``Batcher``); None when the worker stopped
        before it began."""
        assert self._batcher is not None
        tp = work.partition
        running = asyncio.get_running_loop().create_future()
        if tp is not None:
            self._running.setdefault(tp, set()).add(running)
        try:
            return await self._batcher.attempt(work.resume)
        finally:
            running.set_result(None)
            if tp is not None:
                self._running[tp].discard(running)

    async def _run_batch(self, resumes: list[ResumeData]) -> list[Attempt]:
        """What the batcher's executors run: the attempts of a batch, in one transaction."""
        assert self._batcher is not None
        timed = self._batcher.timed
        if self._async:
            assert self._pool is not None
            return await attempt_async(
                self._pool, as_async(self._handler), resumes,
                self._settings.worker_handler_timeout_s, timed,
            )  # fmt: skip
        assert self._sync_pool is not None
        return await asyncio.to_thread(
            attempt_sync, self._sync_pool, as_sync(self._handler), resumes, timed
        )

    async def _settle(self, work: Work, result: Attempt) -> float | None:
        """Count and log ``result``; None when the resume is done with, else how long to
        wait before trying it again."""
        metrics.RESUMES.labels(result.kind.value, work.source).inc()
        resume = work.resume
        where = {"tenant": resume.tenant, "run_id": resume.run_id,
                 "resolution_id": str(resume.resolution_id)}  # fmt: skip
        if result.kind is Kind.ADVANCED:
            self.handled += 1
            return None
        if result.kind is Kind.DUPLICATE:
            return None
        if result.kind is Kind.UNVERIFIED:
            log.warning("a resume matcher did not commit; dropped",
                        extra={**where, "why": result.detail[:300]})  # fmt: skip
            return None
        if result.kind is Kind.TRANSIENT:
            log.warning("the database is unavailable; trying again",
                        extra={**where, "error": result.detail})  # fmt: skip
            return self._settings.worker_backoff_s
        if result.kind is Kind.NOT_READY:
            return await self._not_ready(work, result, where)
        return await self._failed(work, result.detail, self._settings.worker_max_attempts, where)

    async def _not_ready(self, work: Work, result: Attempt, where: dict[str, str]) -> float | None:
        now = time.monotonic()
        if work.not_ready_since is None:
            work.not_ready_since = now
        waited = now - work.not_ready_since
        if waited < self._settings.worker_not_ready_limit_s:
            return result.retry_after
        why = f"not ready for {waited:.0f}s: {result.detail}"
        return await self._failed(work, why, 1, where)

    async def _failed(
        self, work: Work, error: str, max_attempts: int, where: dict[str, str]
    ) -> float | None:
        assert self._pool is not None
        try:
            async with asyncio.timeout(CALL_TIMEOUT_S), self._pool.connection() as conn:
                attempts, parked = await call_async(
                    conn, record_failure_call(work.resume, error, max_attempts)
                )
        except Exception as exc:  # the database is away: nothing recorded, try again later
            log.warning("a handler failure could not be recorded; trying again",
                        extra={**where, "error": exc})  # fmt: skip
            return self._settings.worker_backoff_s
        if parked:
            metrics.RESUMES.labels("parked", work.source).inc()
            log.error("resume parked: its handler kept failing (matcher resumes retry)",
                      extra={**where, "attempts": attempts, "error": error[:300]})  # fmt: skip
            return None
        log.warning("handler failed; trying again",
                    extra={**where, "attempts": attempts, "error": error[:300]})  # fmt: skip
        s = self._settings
        return min(s.worker_backoff_max_s, s.worker_backoff_s * 2.0 ** (attempts - 1))

    def _done(self, work: Work) -> None:
        if work.partition is not None and work.offset is not None:
            offsets = self._offsets.get(work.partition)
            if offsets is not None:
                offsets.done(work.offset)

    # --- offsets, partitions ----------------------------------------------------------------

    def assign(self, assigned: list[TopicPartition]) -> None:
        for tp in assigned:
            self._offsets.setdefault(tp, PartitionOffsets())
        self.assigned.set()
        log.info("partitions assigned", extra={"partitions": _names(assigned)})

    async def release(self, revoked: list[TopicPartition]) -> None:
        """Before partitions go to another member: let their running handlers finish
        (bounded), commit what is done, and forget the rest (the next owner reads it)."""
        running = set().union(*(self._running.get(tp, set()) for tp in revoked))
        if running:
            await asyncio.wait(running, timeout=self._settings.worker_shutdown_timeout_s)
        await self._commit(revoked)
        for tp in revoked:
            self._offsets.pop(tp, None)
            self._committed.pop(tp, None)
        self._wake.set()  # drivers waiting on a revoked resume drop it now
        self._wake.clear()
        log.info("partitions revoked", extra={"partitions": _names(revoked)})

    async def _commit_every(self, stop: asyncio.Event) -> None:
        interval = max(0.05, self._settings.worker_commit_interval_ms / 1000)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await stop.wait()
            await self._commit(list(self._offsets))

    async def _commit(self, partitions: list[TopicPartition]) -> None:
        consumer = self._consumer
        due: dict[TopicPartition, OffsetAndMetadata] = {}
        for tp in partitions:
            offsets = self._offsets.get(tp)
            at = None if offsets is None else offsets.committable()
            if at is not None and self._committed.get(tp) != at:
                due[tp] = OffsetAndMetadata(at, "")
        if consumer is None or not due:
            return
        try:
            async with asyncio.timeout(CALL_TIMEOUT_S):
                await consumer.commit(due)
        except (KafkaError, TimeoutError) as exc:
            log.warning("offsets not committed; trying again", extra={"error": exc})
            return
        for tp, meta in due.items():
            self._committed[tp] = meta.offset

    # --- the database sweep ----------------------------------------------------------------

    async def _sweep_every(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.sweep_once()
            except Exception as exc:  # the database away: the next sweep tries again
                log.warning("the sweep of unadvanced resolutions failed", extra={"error": exc})
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._settings.worker_sweep_interval_s):
                    await stop.wait()

    async def sweep_once(self) -> int:
        """Hand the handler every resolution committed long enough ago that no worker has
        advanced (and that no resume of its run is in hand here); how many."""
        assert self._pool is not None
        s = self._settings
        now = datetime.now(UTC)
        found = 0
        tenants: list[str | None] = [*s.worker_tenants] or [None]
        for tenant in tenants:
            params = unadvanced_params(
                tenant=tenant, run_prefix=s.worker_run_prefix,
                committed_before=now - _seconds(s.worker_sweep_after_s),
                committed_after=now - s.worker_sweep_window, max_rows=SWEEP_ROWS,
            )  # fmt: skip
            async with asyncio.timeout(CALL_TIMEOUT_S), self._pool.connection() as conn:
                rows = await unadvanced_async(conn, params)
            for row in rows:
                resume = row.resume
                if (resume.tenant, resume.run_id) in self._runs or not self._accepts(resume):
                    continue
                found += 1
                metrics.SWEPT.inc()
                self._enqueue(Work(resume))
        return found

    # --- the end ---------------------------------------------------------------------------

    async def _finish(self, consumer: AIOKafkaConsumer) -> None:
        self._stopping.set()
        self._wake.set()
        drivers = set(self._drivers)
        if drivers:
            _, running = await asyncio.wait(
                drivers, timeout=self._settings.worker_shutdown_timeout_s
            )
            for driver in running:
                driver.cancel()  # its transaction rolls back: the resume comes again
            if running:
                await asyncio.wait(running, timeout=5)
        if self._batcher is not None:
            await self._batcher.close()  # attempts still running roll back
        await self._commit(list(self._offsets))
        await stop_consumer(consumer, CALL_TIMEOUT_S)
        if self._pool is not None:
            await self._pool.close()
        if self._sync_pool is not None:
            await asyncio.to_thread(self._sync_pool.close)
        log.info("resume worker stopped", extra={"advanced": self.handled})


def _names(partitions: list[TopicPartition]) -> str:
    return ",".join(f"{tp.topic}:{tp.partition}" for tp in sorted(partitions))


def _seconds(value: float) -> timedelta:
    return timedelta(seconds=value)
