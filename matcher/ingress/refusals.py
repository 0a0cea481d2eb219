"""Refused deliveries, recorded in the database (``matcher.refusals``) so that explain, the
admin API and the console can name them: in batches, in the background, never on a
request's path, and at most a bounded rate.

What a record holds is what the gate could read without trusting it (producer, claimed
event id, type, tenant and correlation id), the reason, the detail and the time; never the
body, a header's value or a token. A claim is worked out only for a refusal that will be
recorded, in a worker thread, and only from a body of at most ``CLAIMS_MAX_BODY_BYTES``
(the caller's bound), so a flood of unsigned requests costs a signature check each, and a
bounded parse only within the rate.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from matcher.domain.events import summary_storable
from matcher.ingress.metrics import REFUSALS_UNRECORDED

log = logging.getLogger("matcher.ingress")

# Written to the database at this interval, or as soon as this many wait.
FLUSH_INTERVAL_S = 0.5
FLUSH_ROWS = 200
# Waiting rows past this are not kept (the database is slow or away).
MAX_PENDING = 1000
# Claims are read from a body of at most this size (else the record has none): GitHub's
# workflow_run deliveries, the largest common ones, are 20-30 KB.
CLAIMS_MAX_BODY_BYTES = 64 * 1024

Claims = Callable[[], dict[str, str]]
Write = Callable[[list[dict[str, Any]]], Awaitable[int]]


class RefusalRecorder:
    """A token bucket in front of a bounded queue that a background task writes."""

    def __init__(self, write: Write, per_s: float) -> None:
        self._write = write
        self._per_s = per_s
        self._burst = per_s * 10
        self._tokens = self._burst
        self._refilled = time.monotonic()
        self._pending: list[tuple[dict[str, Any], Claims]] = []
        self._wake = asyncio.Event()

    def offer(
        self, via: str, producer: str, reason: str, detail: str, status: int, claims: Claims
    ) -> bool:
        """Queue one record if the rate allows; False (counted) when it does not. Its
        claims are worked out later, in a worker thread, with the batch."""
        if not self._take_token() or len(self._pending) >= MAX_PENDING:
            REFUSALS_UNRECORDED.inc()
            return False
        entry: dict[str, Any] = {
            "received_at": datetime.now(UTC).isoformat(),
            "via": via,
            "producer": producer,
            "reason": reason,
            "detail": detail,
            "http_status": status,
        }
        self._pending.append((entry, claims))
        if len(self._pending) >= FLUSH_ROWS:
            self._wake.set()
        return True

    def _take_token(self) -> bool:
        now = time.monotonic()
        self._tokens = min(self._burst, self._tokens + (now - self._refilled) * self._per_s)
        self._refilled = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Write what waits, every FLUSH_INTERVAL_S (sooner when FLUSH_ROWS wait), until
        ``stop``; then once more."""
        while not stop.is_set():
            self._wake.clear()
            waiter = asyncio.create_task(self._wake.wait())
            stopper = asyncio.create_task(stop.wait())
            await asyncio.wait({waiter, stopper}, timeout=FLUSH_INTERVAL_S,
                               return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
            waiter.cancel()
            stopper.cancel()
            await self.flush()
        await self.flush()

    async def flush(self) -> None:
        """Write what waits, FLUSH_ROWS at a time; what is not written is counted."""
        taken, self._pending = self._pending, []
        if not taken:
            return
        # Reading claims parses bodies (bounded in size): off the event loop.
        batch = await asyncio.to_thread(_with_claims, taken)
        for start in range(0, len(batch), FLUSH_ROWS):
            chunk = batch[start : start + FLUSH_ROWS]
            try:
                written = await self._write(chunk)
            except Exception as exc:  # the database is away: these records are lost, counted
                written = 0
                log.warning(
                    "refusal records not written", extra={"records": len(chunk), "error": exc}
                )
            if written < len(chunk):
                REFUSALS_UNRECORDED.inc(len(chunk) - written)


def _with_claims(taken: list[tuple[dict[str, Any], Claims]]) -> list[dict[str, Any]]:
    batch = []
    for entry, claims in taken:
        try:
            claimed = claims()
        except Exception:  # a claim is a best effort: the record goes without it
            log.debug("no claims read from a refused delivery", exc_info=True)
            claimed = {}
        batch.append(_storable({**entry, **claimed}))
    return batch


def _storable(entry: dict[str, Any]) -> dict[str, Any]:
    """Every text as Postgres can hold it: one unstorable value must not lose a batch."""
    return {
        name: value if not isinstance(value, str) or summary_storable(value) else _cleaned(value)
        for name, value in entry.items()
    }


def _cleaned(text: str) -> str:
    return "".join(ch if summary_storable(ch) else "\ufffd" for ch in text)
