"""What a stored batch tells the operator: its counts (metrics), its quarantined records
(a log line each, with the attributes read, never the data), the duplicates that said
something else than the stored event, and the copies for the dead-letter topic."""

from __future__ import annotations

import logging

import psycopg
from psycopg_pool import AsyncConnectionPool

from matcher import metrics
from matcher.domain.events import Rejection
from matcher.domain.records import IngestRecord
from matcher.kafka.dead_letters import DeadLetters
from matcher.metrics import EVENTS_RECEIVED, EVENTS_REJECTED
from matcher.store.ingest import BatchResult, conflicting_duplicates

log = logging.getLogger("matcher.ingest")


class IngestReport:
    def __init__(self, pool: AsyncConnectionPool, dead_letters: DeadLetters | None) -> None:
        self._pool = pool
        self._dead_letters = dead_letters

    async def report(self, records: list[IngestRecord], result: BatchResult) -> None:
        if result.duplicates:
            await self._report_conflicts(records)
        self._count(result)  # after the conflicts: a test reads these counts as "all done"
        if self._dead_letters is not None:
            self._dead_letters.offer(result.rejected)

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
