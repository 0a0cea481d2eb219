"""The resume worker in a test: its settings derived from the test's, with quick sweeps
and backoffs, and the worker running in this process until the block ends."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from matcher.config import Settings, WorkerSettings
from matcher.domain.resume import ResumeData
from matcher.sdk.worker import Handler, ResumeWorker
from tests.support.assertions import eventually
from tests.support.processes import process_env

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


def worker_process(
    settings: Settings,
    handler: str,
    group: str,
    crash_at: str | None,
    cwd: Path,
    **env: str,
) -> subprocess.Popen[bytes]:
    """``matcher worker --handler HANDLER`` as a process of group ``group``, quick to sweep
    and commit, armed to die by SIGKILL at ``crash_at`` (``point@visit``) when given."""
    environ = process_env(
        settings,
        MATCHER_WORKER_GROUP=group,
        MATCHER_WORKER_SWEEP_INTERVAL_S="1",
        MATCHER_WORKER_COMMIT_INTERVAL_MS="100",
        MATCHER_WORKER_BACKOFF_S="0.05",
        **env,
    )
    if crash_at is not None:
        environ["MATCHER_TEST_CRASH_AT"] = crash_at
    return subprocess.Popen(
        [sys.executable, "-m", "matcher", "worker", "--handler", handler],
        env=environ, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


async def killed_at_its_point(
    worker: subprocess.Popen[bytes], finished: Callable[[], bool], limit_s: float = 60
) -> bool:
    """Whether ``worker`` died at its crash point (SIGKILL) before ``finished()``; a worker
    that finished the load first is stopped. Fails past ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while worker.poll() is None and not finished():
        assert time.monotonic() < deadline, "the worker neither crashed nor finished"
        await asyncio.sleep(0.05)  # polling a process: a condition with a deadline
    if worker.poll() is None:
        worker.terminate()
        worker.wait(30)
        return False
    assert worker.returncode == -9, worker.returncode  # killed at the point
    return True
