"""The whole worker flow, end to end: launch an external job durably, let the worker go,
and continue the run exactly once when the job's completion event arrives.

Run it against a running daemon (`make run`) with the same MATCHER_* environment:

    eval "$(matcher devstack env)"; python examples/worker_flow.py

1. Worker A records a launch intent (its wait and a fresh correlation id) in ONE
   transaction, BEFORE calling the external system.
2. It calls the external system with the idempotency key and the correlation id, then
   records the job id it got back. If it died between 1 and 2, `matcher reconcile` would
   find the intent and ask the external system by idempotency key.
3. Worker A goes away. The external system finishes and publishes a signed (or, in local
   development, unsigned) completion event carrying the correlation id.
4. Worker B reads the resume topic, and continues the run only if `advance` says this
   resume moved it (a redelivered resume does not).
"""

from __future__ import annotations

import asyncio
import os
import uuid

import psycopg
from aiokafka import AIOKafkaConsumer
from matcher_producer import CompletionEvent, EventPublisher

from matcher.sdk import LaunchSpec, advance, parse_resume, record_job_id, record_launch

DATABASE_URL = os.environ["MATCHER_DATABASE_URL"]
KAFKA = os.environ["MATCHER_KAFKA_BOOTSTRAP_SERVERS"]
EVENTS_TOPIC = os.environ.get("MATCHER_EVENTS_TOPIC", "matcher.events")
RESUME_TOPIC = os.environ.get("MATCHER_RESUME_TOPIC", "matcher.resumes")


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


async def worker_b(run_id: str) -> None:
    consumer = AIOKafkaConsumer(
        RESUME_TOPIC,
        bootstrap_servers=KAFKA,
        group_id=f"workers-{run_id}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        async for message in consumer:
            resume = parse_resume(message.value)
            if resume.run_id != run_id:
                continue
            with psycopg.connect(DATABASE_URL) as conn:
                moved = advance(conn, resume)
            await consumer.commit()
            if moved:
                event = resume.event
                assert event is not None
                print(
                    f"worker B: run {run_id} continues after {resume.outcome}: event "
                    f"{event.source}/{event.id} (job {event.external_job_id}, data {event.data})"
                )
                return
    finally:
        await consumer.stop()


async def main() -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    await worker_a(run_id)
    await asyncio.wait_for(worker_b(run_id), timeout=60)


if __name__ == "__main__":
    asyncio.run(main())
