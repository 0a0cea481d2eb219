"""Offset commits off the ingest loop's critical path.

An offset commit is a round trip to the group coordinator, and Kafka 4's coordinator
lingers up to 5 ms (``group.coordinator.append.linger.ms``) to batch its writes. Awaited
after every batch it was the larger half of the ingest loop's cycle at moderate rates, so
every event waited for the commit of the batch before its own.

Here a batch hands its offsets over once Postgres has committed it (invariant 1 is about
that order, and it is kept) and the next batch goes to Postgres at once. One task commits
in the background, one request at a time, always the newest offsets submitted so far:
commits are never reordered (a late, older commit would move a partition back), and a
burst of batches costs one commit, not one each. A crash loses at most the offsets not yet
committed; their records are read again and the inbox key makes them duplicates.

Commits are also spaced out: after one starts, the next waits until ``min_interval_s``
has passed (unless ``flush`` asks for it sooner) and then carries every offset submitted
meanwhile. Each commit is a request to the coordinator and a write to
``__consumer_offsets``, work for the broker on every batch at low rates, where batches
are small (docs/benchmarks/tuning.md has the measurement). A batch after a quiet spell is
committed at once. A crash re-reads at most the records of one interval more,
and the inbox key makes them duplicates.

A commit is bounded in time (``timeout_s``): aiokafka's ``commit`` looks for the group
coordinator, and retries retriable errors, for as long as it takes, so a broker that is
away would otherwise hold every flush (a rebalance, the shutdown) for ever. A commit that
times out is kept for the next attempt like any failed one. The request it may have sent
can still land after that; if it lands after a newer commit it moves the partition back
to offsets that were committed in Postgres all the same, and the next commit moves it
forward again: at worst records are read twice, which the inbox key makes harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError
from aiokafka.structs import OffsetAndMetadata

log = logging.getLogger("matcher.ingest")

COMMIT_TIMEOUT_S = 15.0


class OffsetCommitter:
    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        retry_after_s: float = 1.0,
        *,
        timeout_s: float = COMMIT_TIMEOUT_S,
        min_interval_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._consumer = consumer
        self._pending: dict[TopicPartition, int] = {}
        self._task: asyncio.Task[None] | None = None
        self._retry_after_s = retry_after_s
        self._timeout_s = timeout_s
        self._min_interval_s = min_interval_s
        self._clock = clock
        self._failed_at: float | None = None
        self._last_started: float | None = None  # when the newest commit request began
        self._hurry = asyncio.Event()  # set by flush: the next commit may not wait
        # The newest offset Kafka acknowledged per partition (for the lag gauge).
        self.committed: dict[TopicPartition, int] = {}

    def submit(self, offsets: dict[TopicPartition, int]) -> None:
        """Offsets (next offset to read) of records now stored in Postgres."""
        for tp, offset in offsets.items():
            if offset > self._pending.get(tp, -1):
                self._pending[tp] = offset
        self._start()

    def tick(self) -> None:
        """Called by the ingest loop on every poll, batch or not: offsets whose commit
        failed are tried again (after a pause) even when no newer batch comes to carry
        them, so an idle partition does not keep an old committed offset."""
        if self._failed_at is not None:
            if self._clock() - self._failed_at < self._retry_after_s:
                return
            self._failed_at = None
        self._start()

    def _start(self) -> None:
        if self._pending and (self._task is None or self._task.done()):
            self._task = asyncio.create_task(self._drain(), name="offset-commits")

    async def flush(self) -> None:
        """Return once everything submitted so far was committed, refused, or failed
        once more: before partitions are revoked, and before the consumer leaves."""
        self._hurry.set()
        try:
            self._start()
            while self._task is not None and not self._task.done():
                await asyncio.shield(self._task)
        finally:
            self._hurry.clear()

    async def _spaced(self) -> None:
        """Wait out what is left of the interval since the last commit began (at once
        when flush is waiting)."""
        if self._last_started is None or self._hurry.is_set():
            return
        left = self._last_started + self._min_interval_s - self._clock()
        if left > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._hurry.wait()

    async def _drain(self) -> None:
        while self._pending:
            await self._spaced()
            assigned = self._consumer.assignment()
            offsets = {
                tp: OffsetAndMetadata(offset, "")
                for tp, offset in self._pending.items()
                if tp in assigned
            }
            self._pending = {}
            if not offsets:
                continue
            self._last_started = self._clock()
            try:
                async with asyncio.timeout(self._timeout_s):
                    await self._consumer.commit(offsets)
            except CommitFailedError as exc:
                # The group moved on (rebalance or eviction): the new owner re-reads
                # these records and the inbox key recognises them.
                log.warning(
                    "offset commit refused; the records will be redelivered",
                    extra={"error": str(exc)},
                )
            except (KafkaError, TimeoutError) as exc:
                # Kept for the next attempt (the next batch's, the tick's after a pause,
                # or the flush), unless a newer offset for the partition arrived meanwhile.
                for tp, meta in offsets.items():
                    self._pending.setdefault(tp, meta.offset)
                self._failed_at = self._clock()
                log.warning(
                    "offset commit failed; will retry",
                    extra={"error": exc},
                )
                return
            else:
                self.committed.update({tp: meta.offset for tp, meta in offsets.items()})
