"""The whole worker flow, end to end: launch an external job durably, let the worker go,
and continue the run exactly once when the job's completion event arrives.

Run it against a running daemon (`make run`) with the same MATCHER_* environment:

    eval "$(matcher devstack env)"; python examples/worker_flow.py

1. Worker A stores the run's state and a launch intent (its wait and a fresh correlation
   id) in ONE transaction, BEFORE calling the external system.
2. It calls the external system with the idempotency key and the correlation id, then
   records the job id it got back. If it died between 1 and 2, `matcher reconcile` would
   find the intent and ask the external system by idempotency key.
3. Worker A goes away. The external system finishes and publishes a signed (or, in local
   development, unsigned) completion event carrying the correlation id.
4. The resume worker calls `continue_run` with the transaction that advances the run: the
   run's next step commits with the advance, once, whatever crashes and redeliveries
   happen. In production that is `matcher worker --handler worker_flow:continue_run`;
   here it runs embedded, only for this run, until the step is committed.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any

import psycopg
from matcher_producer import CompletionEvent, EventPublisher

from matcher.config import WorkerSettings
from matcher.sdk import LaunchSpec, ResumeData, record_job_id, record_launch
from matcher.sdk.worker import ResumeWorker

DATABASE_URL = os.environ["MATCHER_DATABASE_URL"]
KAFKA = os.environ["MATCHER_KAFKA_BOOTSTRAP_SERVERS"]
EVENTS_TOPIC = os.environ.get("MATCHER_EVENTS_TOPIC", "matcher.events")

# The application's own state: where each run is.
APP_TABLE = """
CREATE TABLE IF NOT EXISTS flow_runs (
    run_id text PRIMARY KEY, step text NOT NULL, job_id text, outcome text, rows integer
)
"""


async def external_system_start_job(idempotency_key: str, correlation_id: str) -> str:
    """Stands in for the batch service: it starts a job and, when done, reports it."""
    job_id = f"job-{uuid.uuid5(uuid.NAMESPACE_URL, idempotency_key).hex[:8]}"
    async with EventPublisher(KAFKA, EVENTS_TOPIC, keys=None) as publisher:
        await publisher.publish(
            CompletionEvent(
                source="batch-svc",
                type="job.completed",
                tenant="acme",
                correlation_id=correlation_id,
                job_id=job_id,
                data={"rows": 1200},
            )
        )
    return job_id


async def worker_a(run_id: str) -> None:
    with psycopg.connect(DATABASE_URL) as conn:
        conn.execute(APP_TABLE)
        with conn.transaction():  # the run's state and its launch intent, together
            conn.execute(
                "INSERT INTO flow_runs (run_id, step) VALUES (%s, 'waiting for the job')",
                [run_id],
            )
            launch = record_launch(
                conn,
                LaunchSpec(
                    tenant="acme",
                    run_id=run_id,
                    position=0,
                    event_types=["job.completed", "job.failed"],
                ),
            )
    print(f"worker A: intent {launch.id}, correlation {launch.correlation_id}")
    job_id = await external_system_start_job(launch.idempotency_key, launch.correlation_id)
    with psycopg.connect(DATABASE_URL) as conn:
        record_job_id(conn, launch.id, job_id)
    print(f"worker A: started {job_id}; going away")


async def continue_run(tx: psycopg.AsyncConnection[Any], resume: ResumeData) -> None:
    """The run's next step, in the transaction that advanced the run. Anything done here
    outside ``tx`` (an HTTP call) would be at least once: key it by resume.resolution_id."""
    event = resume.event
    rows = event.data.get("rows") if event is not None and isinstance(event.data, dict) else None
    await tx.execute(
        "UPDATE flow_runs SET step = 'report', job_id = %s, outcome = %s, rows = %s "
        "WHERE run_id = %s",
        [event.external_job_id if event else None, resume.outcome, rows, resume.run_id],
    )


async def _step(run_id: str) -> tuple[Any, ...] | None:
    async with await psycopg.AsyncConnection.connect(DATABASE_URL) as conn:
        cursor = await conn.execute(
            "SELECT step, job_id, outcome, rows FROM flow_runs WHERE run_id = %s", [run_id]
        )
        return await cursor.fetchone()


async def worker_b(run_id: str) -> None:
    settings = WorkerSettings(worker_group=f"worker-flow-{run_id}")  # the rest from MATCHER_*
    stop = asyncio.Event()
    worker = ResumeWorker(continue_run, settings, accept=lambda r: r.run_id == run_id)
    running = asyncio.create_task(worker.run(stop))
    try:
        while (row := await _step(run_id)) is None or row[0] != "report":
            if running.done():
                running.result()  # the worker's error
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        await running
    _, job_id, outcome, rows = row
    print(f"worker B: run {run_id} continues after {outcome}: job {job_id}, {rows} rows")


async def main() -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    await worker_a(run_id)
    await asyncio.wait_for(worker_b(run_id), timeout=60)


if __name__ == "__main__":
    asyncio.run(main())
