"""The ingress's connections, bounded against clients that hold them without sending
(see ``BoundedProtocol``)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import ClassVar

from uvicorn.protocols.http.h11_impl import H11Protocol

from matcher.ingress.metrics import CONNECTIONS_EVICTED, REQUESTS, UNKNOWN_PRODUCER

_OVERLOADED = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"retry-after: 1\r\nconnection: close\r\ncontent-length: 23\r\n\r\n"
    b'{"reason":"overloaded"}'
)


class BoundedProtocol(H11Protocol):
    """uvicorn's h11 protocol with two defences against clients that hold connections
    without sending (slowloris: headers a byte at a time; slow bodies):

    - a deadline on every request's headers (uvicorn itself waits for ever);
    - at the connection bound, a new connection evicts the connection that has waited
      longest on its client: one still sending its headers or body, or idle between
      requests. A request whose body is complete (being judged or forwarded) is never
      evicted. Legitimate senders finish a request in milliseconds, so the oldest
      waiting connection is an idle or slow one; an attacker who keeps reconnecting only
      evicts its own connections. Past the bound with every connection busy, the new
      one's request gets uvicorn's 503.
    """

    header_timeout_s = 10.0  # set per server by ``_protocol``
    max_connections = 1024
    # The open connections, counted here rather than by uvicorn (whose count keeps an
    # evicted connection until its close completes), and those waiting on their client,
    # the longest-waiting first (both per server).
    live: ClassVar[set[BoundedProtocol]] = set()
    waiting: ClassVar[dict[BoundedProtocol, None]] = {}
    per_address: ClassVar[Counter[str]] = Counter()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._arm()
        self._address = self.client[0] if self.client else ""
        self.live.add(self)
        self.per_address[self._address] += 1
        self._wait_on_client()
        self._over_bound = len(self.live) > self.max_connections and not self._evict_one()

    def _evict_one(self) -> bool:
        holding = {c._address for c in self.waiting if c is not self}
        if not holding:
            return False  # every other connection is busy
        most = max(holding, key=lambda address: self.per_address[address])
        victim = next(c for c in self.waiting if c is not self and c._address == most)
        victim._forget()
        victim.transport.close()
        CONNECTIONS_EVICTED.inc()
        return True

    def _forget(self) -> None:
        if self in self.live:
            self.live.discard(self)
            self.per_address[self._address] -= 1
            if self.per_address[self._address] <= 0:
                del self.per_address[self._address]
        self.waiting.pop(self, None)

    def _wait_on_client(self) -> None:
        self.waiting.pop(self, None)
        self.waiting[self] = None  # the end of the order: the most recent to wait

    def _between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        if self._deadline is None:
            self._deadline = self.loop.call_later(self.header_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        if self._between_requests() and not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._over_bound:  # past the bound with every connection busy: 503, closed
            if not self.transport.is_closing():
                REQUESTS.labels(UNKNOWN_PRODUCER, "overloaded").inc()
                self.transport.write(_OVERLOADED)
                self.transport.close()
            return
        if self._between_requests() and self._deadline is None:
            self._arm()  # the next request's headers have begun
            self._wait_on_client()  # its wait counts from its first byte
        super().data_received(data)
        if not self._between_requests():
            self._disarm()
            if not self.cycle.more_body:
                self.waiting.pop(self, None)  # the request is all here: busy, not waiting

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self._between_requests():
            self._wait_on_client()  # idle between requests

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._forget()
        super().connection_lost(exc)


def bounded_protocol(header_timeout_s: float, max_connections: int) -> type[H11Protocol]:
    """The protocol class for one server: its bounds, and its own tables of connections."""
    return type(
        "IngressH11Protocol",
        (BoundedProtocol,),
        {
            "header_timeout_s": header_timeout_s,
            "max_connections": max_connections,
            "live": set(),
            "waiting": {},
            "per_address": Counter(),
        },
    )
