"""Stores a judged batch: one transaction (``matcher.store.ingest.store_batch``), retried
while the database or the network fails, and split until a record the database itself
refuses is alone, so that it alone is quarantined (with what the gate read of it)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import psycopg
from psycopg_pool import AsyncConnectionPool

from matcher.domain.events import Rejection, seen_attributes
from matcher.domain.quarantine import QuarantineLimits
from matcher.domain.records import IngestRecord
from matcher.faults import crash_point
from matcher.logs import describe_error
from matcher.store.ingest import BatchResult, store_batch
from matcher.store.maintenance import ensure_days

log = logging.getLogger("matcher.ingest")

# Worth retrying the same batch: the database or the network, not the data.
_TRANSIENT = (
    psycopg.OperationalError,
    psycopg.errors.SerializationFailure,
    psycopg.errors.DeadlockDetected,
    psycopg.errors.LockNotAvailable,
)

# The data itself was refused: find the record by splitting the batch, quarantine it.
_DATA_REFUSED = (psycopg.DataError, psycopg.IntegrityError)


class BatchWriter:
    def __init__(self, pool: AsyncConnectionPool, limits: QuarantineLimits) -> None:
        self._pool = pool
        self._limits = limits

    async def store(self, records: list[IngestRecord]) -> BatchResult:
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
            return await self.store([refused])
        middle = len(records) // 2
        return await self.store(records[:middle]) + await self.store(records[middle:])
