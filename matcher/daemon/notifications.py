"""Postgres NOTIFY as wake-ups for the loops: one listening connection, reconnected on loss.

A notification only says "look now"; every loop also polls on its own interval, so a
notification lost while reconnecting costs latency, never correctness.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

import psycopg

from matcher.store import session

log = logging.getLogger("matcher.notifications")


async def listen(url: str, wake: Mapping[str, Callable[[], None]]) -> None:
    """Call ``wake[channel]()`` for each NOTIFY on ``channel``, until cancelled."""
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                await session.listen(conn, wake)
                for nudge in wake.values():
                    nudge()  # anything committed while nobody listened
                async for note in conn.notifies():
                    woken = wake.get(note.channel)
                    if woken is not None:
                        woken()
        except psycopg.Error as exc:
            log.warning(
                "notification listener lost its connection; reconnecting",
                extra={"error": exc},
            )
            await asyncio.sleep(1.0)
