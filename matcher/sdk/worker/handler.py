"""What a worker's handler is, and how it asks to be called again."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from matcher.domain.resume import ResumeData

AsyncHandler = Callable[[psycopg.AsyncConnection[Any], ResumeData], Awaitable[None]]
SyncHandler = Callable[[psycopg.Connection[Any], ResumeData], None]
Handler = AsyncHandler | SyncHandler


class Retry(Exception):
    """Raised by a handler when its run is not ready for this resume yet (a fast job's
    resume can arrive before the worker that launched it has written the state it waits
    in): the transaction rolls back, the advance with it, and the resume is handed to the
    handler again after ``after`` seconds. Only this run waits; the others go on. A run
    not ready for longer than MATCHER_WORKER_NOT_READY_LIMIT_S has its resume parked."""

    def __init__(self, after: float = 1.0, reason: str = "not ready") -> None:
        super().__init__(reason)
        self.after = max(0.0, after)
        self.reason = reason
