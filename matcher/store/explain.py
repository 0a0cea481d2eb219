"""The facts ``explain`` needs, read from Postgres (the Kafka facts come from kafka.lag)."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from matcher.domain.events import QuarantinedRecord, RefusedDelivery, StoredEvent
from matcher.domain.explain import ExplainFacts, OutboxFacts, WorkerFacts
from matcher.domain.waits import Wait
from matcher.store.sql import query


class UnknownRun(LookupError):
    pass


class AmbiguousRun(LookupError):
    def __init__(self, tenants: list[str]) -> None:
        super().__init__(f"run id is used by several tenants ({', '.join(tenants)})")
        self.tenants = tenants


async def gather(
    conn: psycopg.AsyncConnection[Any], run_id: str, tenant: str | None
) -> ExplainFacts:
    """The run's latest wait and everything in Postgres bearing on it, in one read-only
    snapshot (the Kafka facts, partition and lag, are the caller's to add)."""
    async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        await cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        await cur.execute(query("explain", "waits_of_run"), {"run_id": run_id, "tenant": tenant})
        waits = await cur.fetchall()
        if not waits:
            raise UnknownRun(run_id)
        tenants = sorted({w["tenant"] for w in waits})
        if len(tenants) > 1:
            raise AmbiguousRun(tenants)
        wait = Wait.model_validate(waits[0])
        params = {"correlation_id": wait.correlation_id}
        correlations = sorted(
            {wait.correlation_id, *(c.correlation_id for c in wait.conditions or ())}
        )
        await cur.execute(
            query("explain", "events_by_correlation"),
            {"correlation_ids": correlations, "condition": wait.condition},
        )
        found = await cur.fetchall()
        events = [StoredEvent.model_validate(row) for row in found]
        condition_misses = {
            (row["producer"], row["event_id"]) for row in found if row["meets_condition"] is False
        }
        await cur.execute(query("explain", "quarantine_by_correlation"), params)
        quarantined = [QuarantinedRecord.model_validate(row) for row in await cur.fetchall()]
        await cur.execute(
            query("explain", "refusals_by_correlation"),
            {"correlation_ids": correlations, "tenant": wait.tenant},
        )
        refused = [RefusedDelivery.model_validate(row) for row in await cur.fetchall()]
        await cur.execute(query("explain", "outbox_of_wait"), {"wait_id": wait.id})
        row = await cur.fetchone()
        outbox = OutboxFacts(**row) if row else None
        worker = await _worker(cur, wait, outbox)
        await cur.execute(
            query("explain", "rematch_of_key"),
            {"tenant": wait.tenant, "correlation_id": wait.correlation_id},
        )
        now_row = await cur.fetchone()
        assert now_row is not None
    return ExplainFacts(
        now=now_row["now"],
        wait=wait,
        events=events,
        quarantined=quarantined,
        refused=refused,
        outbox=outbox,
        rematch_queued_since=now_row["queued_since"],
        worker=worker,
        condition_misses=condition_misses,
    )


async def _worker(
    cur: psycopg.AsyncCursor[dict[str, Any]], wait: Wait, outbox: OutboxFacts | None
) -> WorkerFacts | None:
    if outbox is None:
        return None
    await cur.execute(
        query("explain", "worker_of_wait"),
        {"tenant": wait.tenant, "run_id": wait.run_id, "resolution_id": outbox.resolution_id},
    )
    row = await cur.fetchone()
    return None if row is None else WorkerFacts(**row)
