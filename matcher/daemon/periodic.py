"""The shape every background loop of the daemon shares (the sweeper, the rematch pass,
the janitor, the relay's publishing): a pass, then a pause until its interval elapses, a
nudge wakes it, or the daemon stops. A pass that fails with an error the loop expects
(the database or Kafka away for a moment) is logged and tried again after the pause;
anything else ends the loop, and with it the daemon (``matcher.daemon.app``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable


async def pause(stop: asyncio.Event, seconds: float, wake: asyncio.Event | None = None) -> None:
    """Until ``seconds`` passed, ``wake`` is set (when given), or ``stop`` is."""
    waiters = {asyncio.ensure_future(stop.wait())}
    if wake is not None:
        waiters.add(asyncio.ensure_future(wake.wait()))
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter


async def every(
    interval_s: float,
    stop: asyncio.Event,
    one_pass: Callable[[], Awaitable[None]],
    *,
    expected: tuple[type[Exception], ...],
    log: logging.Logger,
    wake: asyncio.Event | None = None,
) -> None:
    """``one_pass`` until ``stop``, pausing ``interval_s`` (or until ``wake``) between."""
    while not stop.is_set():
        if wake is not None:
            wake.clear()
        try:
            await one_pass()
        except expected as exc:
            log.warning("pass failed; retrying after the pause", extra={"error": exc})
        await pause(stop, interval_s, wake)
