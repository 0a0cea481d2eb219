"""The resume worker in a test: its settings derived from the test's, with quick sweeps
and backoffs, and the worker running in this process until the block ends."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from matcher.config import Settings, WorkerSettings
from matcher.domain.resume import ResumeData
from matcher.sdk.worker import Handler, ResumeWorker
from tests.support.assertions import eventually

QUICK: dict[str, Any] = {
    "worker_backoff_s": 0.05,
    "worker_backoff_max_s": 0.5,
    "worker_sweep_interval_s": 0.5,
    "worker_commit_interval_ms": 100,
    "worker_shutdown_timeout_s": 10,
    "kafka_session_timeout_ms": 3000,
    "kafka_heartbeat_interval_ms": 500,
}


def worker_settings(settings: Settings, **overrides: Any) -> WorkerSettings:
    """The worker's settings for this test's services and topics, a group of its own."""
    return WorkerSettings(
        kafka_bootstrap_servers=settings.kafka_bootstrap_servers,
        database_url=settings.database_url,
        resume_topic=settings.resume_topic,
        worker_group=f"{settings.consumer_group}.worker.{uuid.uuid4().hex[:6]}",
        **(QUICK | overrides),
    )


@contextlib.asynccontextmanager
async def running_worker(
    settings: WorkerSettings,
    handler: Handler,
    accept: Callable[[ResumeData], bool] | None = None,
) -> AsyncIterator[ResumeWorker]:
    """A worker in this process, handed over once it holds partitions, stopped after."""
    worker = ResumeWorker(handler, settings, accept)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        await eventually(
            lambda: worker.assigned.is_set() or task.done(), timeout=60, what="partitions"
        )
        if task.done():
            task.result()
        yield worker
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
