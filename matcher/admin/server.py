"""Runs the admin API on the daemon's own event loop (uvicorn, no extra thread)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Generator

import uvicorn

from matcher.admin.http import create_app
from matcher.admin.state import AdminState

log = logging.getLogger("matcher.admin")


class _EmbeddedServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # The daemon owns SIGTERM/SIGINT; uvicorn must not take them over.
        yield


class AdminServer:
    def __init__(self, state: AdminState, host: str, port: int) -> None:
        config = uvicorn.Config(
            create_app(state),
            host=host,
            port=port,
            log_config=None,
            access_log=False,
            lifespan="off",
        )
        self._server = _EmbeddedServer(config)
        self.address: str | None = None

    async def run(self, stop: asyncio.Event) -> None:
        serving = asyncio.create_task(self._server.serve(), name="admin-serve")
        # uvicorn exposes its start as a flag only.
        while not self._server.started and not serving.done():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        if serving.done():
            serving.result()  # raise the bind error, say
            return
        host, port = self._server.servers[0].sockets[0].getsockname()[:2]
        self.address = f"http://{host}:{port}"
        log.info("admin API listening", extra={"address": self.address})
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({serving, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        self._server.should_exit = True
        await serving
