"""Resumes ready to be attempted, taken together when they are quick: ``worker_concurrency``
executors each take the resumes waiting (one per run: each run's driver hands over one
at a time), as many as fit a batch, and attempt them in one transaction (``attempt``).

A batch is never waited for: an executor takes what is ready when it is free, so at a low
rate every batch holds one resume and its latency is one transaction's. Its size is
bounded by ``worker_batch_max`` and by the handler's own pace: the batch should take
about ``BATCH_TARGET_S`` of handler time, measured as a moving average, so slow handlers
(a model call, an HTTP request) run one per transaction and fast ones share the commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from matcher.domain.resume import ResumeData
from matcher.logs import describe_error
from matcher.sdk.worker import metrics
from matcher.sdk.worker.attempt import Attempt, Kind

# The handler time a batch should hold; and the weight of each new measurement of the
# handler's time in its moving average.
BATCH_TARGET_S = 0.02
SMOOTHING = 0.2

Run = Callable[[list[ResumeData]], Awaitable[list[Attempt]]]


@dataclass
class _Pending:
    resume: ResumeData
    answer: asyncio.Future[Attempt | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Batcher:
    """``attempt(resume)``: the resume's outcome, once an executor has attempted it (alone
    or in a batch); None when the worker stopped before it was attempted."""

    def __init__(self, run: Run, executors: int, batch_max: int, stopping: asyncio.Event) -> None:
        self._run = run
        self._batch_max = batch_max
        self._stopping = stopping
        self._ready: asyncio.Queue[_Pending] = asyncio.Queue()
        self._executors = [
            asyncio.create_task(self._execute(), name=f"worker-executor-{n}")
            for n in range(executors)
        ]
        # Nothing is known of the handler yet: one resume per transaction until it is.
        self._handler_s: float | None = None

    async def attempt(self, resume: ResumeData) -> Attempt | None:
        pending = _Pending(resume)
        self._ready.put_nowait(pending)
        return await pending.answer

    def timed(self, seconds: float) -> None:
        """One call of the handler took ``seconds``."""
        if self._handler_s is None:
            self._handler_s = seconds
        else:
            self._handler_s += SMOOTHING * (seconds - self._handler_s)

    def batch_limit(self) -> int:
        if self._handler_s is None:
            return 1
        fits = int(BATCH_TARGET_S / max(self._handler_s, 1e-6))
        return max(1, min(self._batch_max, fits))

    async def _execute(self) -> None:
        while True:
            batch = [await self._ready.get()]
            limit = self.batch_limit()
            while len(batch) < limit and not self._ready.empty():
                batch.append(self._ready.get_nowait())
            if self._stopping.is_set():  # no attempt starts once the worker stops
                _answer(batch, [None] * len(batch))
                continue
            _answer(batch, await self._attempt([p.resume for p in batch]))

    async def _attempt(self, resumes: list[ResumeData]) -> list[Attempt | None]:
        metrics.BATCH_SIZE.observe(len(resumes))
        metrics.IN_FLIGHT.inc(len(resumes))
        began = time.monotonic()
        try:
            return list(await self._run(resumes))
        except Exception as exc:  # the attempts catch their own: this is the worker's
            return [Attempt(Kind.TRANSIENT, detail=describe_error(exc))] * len(resumes)
        finally:
            took = time.monotonic() - began
            for _ in resumes:
                metrics.HANDLER_SECONDS.observe(took)
            metrics.IN_FLIGHT.dec(len(resumes))

    async def close(self) -> None:
        """Stop the executors (their transactions roll back), and answer None to every
        resume still waiting for one."""
        for task in self._executors:
            task.cancel()
        for task in self._executors:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        while not self._ready.empty():
            pending = self._ready.get_nowait()
            if not pending.answer.done():
                pending.answer.set_result(None)


def _answer(batch: list[_Pending], outcomes: list[Attempt | None]) -> None:
    for pending, outcome in zip(batch, outcomes, strict=True):
        if not pending.answer.done():  # its driver may have been cancelled meanwhile
            pending.answer.set_result(outcome)
