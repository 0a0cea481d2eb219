"""A broker-side fetch wait that is on only while events flow.

With the consumer's usual settings (``fetch_min_bytes=1``) the broker answers a fetch as
soon as one record is there, so under a steady flow of a few hundred events a second the
client sends a fetch, and the broker answers one, per event: most of the daemon's ingest
CPU at 500/s. Asking the broker to hold each fetch for a few milliseconds (a minimum of
many bytes, a short ``max_wait``) makes one fetch carry a few milliseconds of events
instead. Left on all the time, though, an idle daemon would fetch every few milliseconds
(measured: 0.11 cores of its own and 0.10 of the broker's, against 0.01 each), and at
100 events/s a held fetch would mostly come back late with one event or none (measured,
with the wait on for two waits after any record: p50 2.4 -> 4.5 ms, and more CPU, not
less). Kafka can hold a fetch only for "this many bytes or this long", not "a little
after the first byte", so the wait is switched: on while the last ``WINDOW_WAITS`` waits
brought at least ``WINDOW_WAITS`` records, one per wait on average (where a held fetch
costs less than a fetch per event), off otherwise; the first events after a quiet spell
are fetched at once.

What it leans on beyond aiokafka's public API (pinned below 0.15): the consumer's
``_fetcher`` (created by ``start``) and its ``_fetch_max_wait_ms`` and
``_fetch_min_bytes``, which it reads each time it builds a FetchRequest. A test holds
this to the library by looking at the requests sent. If the fields are not there, the
wait stays off (one warning), and fetching goes on as configured.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

log = logging.getLogger("matcher.fetch")

# Enough bytes that the broker holds a fetch for its whole wait under the flows the wait
# is for (8 ms of 2,000 events/s of 1 KiB is 16 KiB), and no more than it returns at once
# from a backlog anyway (which it then answers at once).
FLOWING_MIN_BYTES = 1 << 16
_FIELDS = ("_fetch_max_wait_ms", "_fetch_min_bytes")


WINDOW_WAITS = 8  # how many waits' worth of records decide whether events flow


def flowing(recent_records: int) -> bool:
    """Whether events flow densely enough for a held fetch: at least ``WINDOW_WAITS``
    records (``recent_records``) came in the last ``WINDOW_WAITS`` waits, one per wait
    on average."""
    return recent_records >= WINDOW_WAITS


class FlowFetchWait:
    """Switches the broker's fetch wait of ``consumer`` on while records come densely (see
    the module's note). ``wait_ms`` 0 leaves the consumer as it is.

    Fetch calls report to ``note``. While the wait is on, a timer on the running loop
    also looks again once a window has passed, so the wait goes off after a quiet
    spell even while nobody fetches (a batch stored through a Postgres outage, say),
    rather than leaving the client fetching every few milliseconds."""

    def __init__(self, consumer: Any, wait_ms: int) -> None:
        self._consumer = consumer
        self._wait_ms = wait_ms
        self._window_s = WINDOW_WAITS * wait_ms / 1000
        self._recent: deque[tuple[float, int]] = deque()  # (when, records) of the window
        self._recent_records = 0
        self._on = False
        self._usual: tuple[int, int] | None = None  # the consumer's own (max wait, min bytes)
        self._timer: asyncio.TimerHandle | None = None

    @property
    def on(self) -> bool:
        return self._on

    def note(self, records: int, now: float) -> None:
        """Tell it a fetch call returned ``records`` records at ``now`` (loop time)."""
        if self._wait_ms <= 0:
            return
        recent = self._recent
        if records:
            recent.append((now, records))
            self._recent_records += records
        while recent and now - recent[0][0] >= self._window_s:
            self._recent_records -= recent.popleft()[1]
        wanted = flowing(self._recent_records)
        if wanted != self._on:
            self._switch(wanted)

    def close(self) -> None:
        """Stop looking again (the consumer is being stopped)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _look_again(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        self.note(0, loop.time())
        if self._on and self._timer is None:
            self._timer = loop.call_later(self._window_s, self._look_again)

    def _switch(self, on: bool) -> None:
        fetcher = getattr(self._consumer, "_fetcher", None)
        if fetcher is None:  # not started yet
            return
        if self._usual is None:
            if not all(hasattr(fetcher, field) for field in _FIELDS):
                log.warning("this aiokafka has no fetch settings to adjust: no fetch wait")
                self._wait_ms = 0
                return
            self._usual = (fetcher._fetch_max_wait_ms, fetcher._fetch_min_bytes)
        wait_ms, min_bytes = (self._wait_ms, FLOWING_MIN_BYTES) if on else self._usual
        fetcher._fetch_max_wait_ms = wait_ms
        fetcher._fetch_min_bytes = min_bytes
        self._on = on
        if not on:
            self.close()
        elif self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # driven by hand, as in the unit tests: by note alone
                return
            self._timer = loop.call_later(self._window_s, self._look_again)
