"""Runs the ingress: uvicorn with internet-facing bounds, the Kafka forwarder, the
producers-file watch, and (with a database URL) the callbacks' database pool; SIGTERM
drains in-flight requests, then stops.

Bounds: open connections (``MATCHER_INGRESS_MAX_CONNECTIONS``; past it a new connection
evicts one waiting on its client, see ``matcher.ingress.connections``), requests judged
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
from typing import Any

import uvicorn

from matcher.auth.registry_watch import RegistryHolder
from matcher.config import IngressSettings
from matcher.ingress.app import IngressState, create_app
from matcher.ingress.connections import bounded_protocol
from matcher.ingress.database import IngressDatabase
from matcher.ingress.forwarder import Forwarder
from matcher.ingress.metrics import (
    REGISTRY_RELOAD_FAILING,
    REGISTRY_RELOADS,
    initialise_producer_series,
)
from matcher.ingress.refusals import RefusalRecorder

log = logging.getLogger("matcher.ingress")


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
        http=bounded_protocol(settings.ingress_read_timeout_s, settings.ingress_max_connections),
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
        on_load=lambda registry: initialise_producer_series(registry.producers.values()),
    )
    holder.load_initial()
    stop, stopping = asyncio.Event(), asyncio.Event()
    forwarder = Forwarder(settings)
    conninfo = settings.database_conninfo()
    database = None if conninfo is None else IngressDatabase(settings, conninfo)
    refusals = None
    if database is not None and settings.ingress_refusal_records_per_s > 0:
        refusals = RefusalRecorder(database.record_refusals, settings.ingress_refusal_records_per_s)
    state = IngressState(
        settings=settings,
        registry=lambda: holder.current,
        send=forwarder.send,
        kafka_reachable=forwarder.reachable,
        stopping=stopping,
        complete_callback=None if database is None else database.complete,
        refusals=refusals,
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
    if database is not None:
        await database.open()  # in the background: webhooks do not wait for the database
    if refusals is not None:
        background.append(asyncio.create_task(refusals.run(stop), name="ingress-refusals"))
    log.info(
        "callback URLs served, refusals recorded"
        if database
        else "callback URLs off and refusals only logged: no MATCHER_DATABASE_URL"
    )
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
        if database is not None:
            await database.close()
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
