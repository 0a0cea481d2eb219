"""The resume worker: the worker side of exactly-once (invariant 11).

    from matcher.sdk.worker import ResumeWorker, Retry, run_worker

    async def handle(tx, resume):              # tx: the transaction that advanced the run
        await tx.execute("UPDATE my_runs SET step = step + 1 WHERE id = %s", [resume.run_id])
        # External side effects here are at least once: key them by resume.resolution_id.

    run_worker(handle)                         # or: matcher worker --handler my.module:handle

For each resume, in one Postgres transaction: verify it, advance the run, call the
handler with that transaction, commit. The run's advance and the handler's writes commit
together or not at all; a crash before the commit leaves the resume to be handled again,
a crash after it leaves nothing to redo.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable

from matcher.config import WorkerSettings
from matcher.domain.resume import ResumeData
from matcher.sdk.worker.handler import AsyncHandler, Handler, Retry, SyncHandler
from matcher.sdk.worker.worker import ResumeWorker


async def serve(
    handler: Handler,
    settings: WorkerSettings,
    accept: Callable[[ResumeData], bool] | None = None,
) -> None:
    """Run a worker until SIGTERM or SIGINT (then shut down as the worker does)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await ResumeWorker(handler, settings, accept).run(stop)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
                loop.remove_signal_handler(sig)


def run_worker(
    handler: Handler,
    settings: WorkerSettings | None = None,
    accept: Callable[[ResumeData], bool] | None = None,
) -> None:
    """``serve`` in an event loop of its own; settings from MATCHER_* when not given."""
    asyncio.run(serve(handler, settings or WorkerSettings(), accept))


__all__ = [
    "AsyncHandler",
    "Handler",
    "ResumeWorker",
    "Retry",
    "SyncHandler",
    "run_worker",
    "serve",
]
