"""Failed authentications, throttled per client address (the console's sign-in, and the
admin token as a bearer header on /v1 and /console).

A token bucket per address: ``burst`` failures at once, then one every ``interval_s``;
past that, the next attempt is answered 429 with Retry-After before the token is even
compared, so guessing runs at that rate at most. Successes cost nothing. The table of
addresses is bounded (the oldest forgotten first): an attacker with many addresses makes
it forget, but the admin token's minimum strength (``matcher.config``) is what makes
guessing hopeless; this only keeps a weak moment from being a fast one. Behind a proxy
the address is the proxy's unless uvicorn trusts it (``FORWARDED_ALLOW_IPS``).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable


class FailureThrottle:
    def __init__(
        self,
        burst: int = 10,
        interval_s: float = 5.0,
        max_clients: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._burst = burst
        self._interval_s = interval_s
        self._max_clients = max_clients
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # level, when

    def _level(self, client: str) -> float:
        level, when = self._buckets.get(client, (float(self._burst), self._clock()))
        return min(float(self._burst), level + (self._clock() - when) / self._interval_s)

    def retry_after(self, client: str) -> float | None:
        """Seconds until ``client`` may try again, or None when it may now."""
        level = self._level(client)
        return None if level >= 1 else (1 - level) * self._interval_s

    def failed(self, client: str) -> None:
        self._buckets[client] = (self._level(client) - 1, self._clock())
        self._buckets.move_to_end(client)
        while len(self._buckets) > self._max_clients:
            self._buckets.popitem(last=False)
