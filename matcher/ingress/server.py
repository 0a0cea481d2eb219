"""Runs the ingress: uvicorn with internet-facing bounds, the Kafka forwarder, and the
producers-file watch; SIGTERM drains in-flight requests, then stops.

QuarantineLimits: open connections (``MATCHER_INGRESS_MAX_CONNECTIONS``; past it a new connection
evicts the one waiting longest on its client, see ``_BoundedProtocol``), requests judged
and forwarded at once (``MATCHER_INGRESS_MAX_CONCURRENCY``, in the app, taken only once a
body is complete), header bytes (h11's incomplete-event bound while they arrive, and the
app's check of what was parsed), and time: a request's headers must be complete within
``MATCHER_INGRESS_READ_TIMEOUT_S`` of its first byte (else the connection is closed:
uvicorn itself waits for ever), its body within as long again and at no less than
``MATCHER_INGRESS_MIN_BODY_RATE_BPS`` (408).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import socket
from collections.abc import Generator
from typing import Any, ClassVar

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from matcher.auth.registry_watch import RegistryHolder
from matcher.config import IngressSettings
from matcher.ingress.app import IngressState, create_app
from matcher.ingress.forwarder import Forwarder
from matcher.ingress.metrics import (
    CONNECTIONS_EVICTED,
    REGISTRY_RELOAD_FAILING,
    REGISTRY_RELOADS,
    REQUESTS,
    UNKNOWN_PRODUCER,
)

log = logging.getLogger("matcher.ingress")


_OVERLOADED = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"retry-after: 1\r\nconnection: close\r\ncontent-length: 23\r\n\r\n"
    b'{"reason":"overloaded"}'
)


class _BoundedProtocol(H11Protocol):
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
    live: ClassVar[set[_BoundedProtocol]] = set()
    waiting: ClassVar[dict[_BoundedProtocol, None]] = {}

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._arm()
        self.live.add(self)
        self._wait_on_client()
        self._over_bound = len(self.live) > self.max_connections and not self._evict_one()

    def _evict_one(self) -> bool:
        victim = next((c for c in self.waiting if c is not self), None)
        if victim is None:
            return False  # every other connection is busy
        del self.waiting[victim]
        self.live.discard(victim)
        victim.transport.close()
        CONNECTIONS_EVICTED.inc()
        return True

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
        self.waiting.pop(self, None)
        self.live.discard(self)
        super().connection_lost(exc)


def _protocol(header_timeout_s: float, max_connections: int) -> type[H11Protocol]:
    return type(
        "IngressH11Protocol",
        (_BoundedProtocol,),
        {
            "header_timeout_s": header_timeout_s,
            "max_connections": max_connections,
            "live": set(),
            "waiting": {},
        },
    )


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # ``run`` owns SIGTERM and SIGINT: it drains, then stops the forwarder


def _uvicorn_config(settings: IngressSettings, app: Any) -> uvicorn.Config:
    host, port = settings.ingress_host_port()
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=_protocol(settings.ingress_read_timeout_s, settings.ingress_max_connections),
        log_config=None,
        access_log=False,  # the app logs refusals; nothing of a request's body, ever
        lifespan="off",
        server_header=False,
        date_header=True,
        # The bound is kept by _BoundedProtocol (eviction, then 503): uvicorn's own count
        # keeps an evicted connection until its close completes, and would refuse others.
        limit_concurrency=None,
        timeout_keep_alive=5,
        timeout_graceful_shutdown=math.ceil(settings.ingress_drain_timeout_s),
        h11_max_incomplete_event_size=settings.max_header_bytes,
    )


async def run(settings: IngressSettings, ready: asyncio.Event | None = None) -> None:
    """Serve until SIGTERM/SIGINT (or until ``ready``'s owner cancels); then drain."""
    holder = RegistryHolder(
        settings.producers_file,
        settings.producers_reload_interval_s,
        REGISTRY_RELOADS,
        REGISTRY_RELOAD_FAILING,
    )
    holder.load_initial()
    stop, stopping = asyncio.Event(), asyncio.Event()
    forwarder = Forwarder(settings)
    state = IngressState(
        settings=settings,
        registry=lambda: holder.current,
        send=forwarder.send,
        kafka_reachable=forwarder.reachable,
        stopping=stopping,
    )
    server = _Server(_uvicorn_config(settings, create_app(state)))
    listener = _listen(settings)  # bound here, so a busy port is an OSError for the caller
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(ValueError, RuntimeError):  # not the main thread
            loop.add_signal_handler(sig, stopping.set)
    background = [
        asyncio.create_task(forwarder.run(stop), name="ingress-kafka"),
        asyncio.create_task(holder.watch(stop), name="ingress-registry"),
    ]
    serving = asyncio.create_task(server.serve(sockets=[listener]), name="ingress-serve")
    try:
        await _announce(server, serving, listener, ready)
        waiter = asyncio.create_task(stopping.wait())
        await asyncio.wait({serving, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        log.info(
            "draining in-flight requests", extra={"timeout_s": settings.ingress_drain_timeout_s}
        )
        server.should_exit = True  # stop accepting; in-flight requests finish (bounded)
        await serving
    finally:
        stopping.set()
        stop.set()
        await asyncio.gather(*background, return_exceptions=True)
        await forwarder.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError, RuntimeError):
                loop.remove_signal_handler(sig)
    log.info("ingress stopped")


def _listen(settings: IngressSettings) -> socket.socket:
    host, port = settings.ingress_host_port()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=1024)


async def _announce(
    server: uvicorn.Server,
    serving: asyncio.Task[None],
    listener: socket.socket,
    ready: asyncio.Event | None,
) -> None:
    # uvicorn exposes its start as a flag only.
    while not server.started and not serving.done():  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    if serving.done():
        serving.result()
        raise OSError("the ingress stopped before it was serving")
    host, port = listener.getsockname()[:2]
    address = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    log.info("ingress listening", extra={"address": address})
    if ready is not None:
        ready.set()
