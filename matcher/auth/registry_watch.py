"""Keeps the producer registry current: reload on SIGHUP or when the file changes.

A broken file never replaces a good registry: the error is logged, the last good one stays
in force until the file is fixed, and ``matcher_producer_registry_reload_failing`` is 1
meanwhile (the MatcherProducerRegistryReloadFailing alert).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from pathlib import Path

from prometheus_client import Counter, Gauge

from matcher.auth.registry import Registry, RegistryError, load_registry

log = logging.getLogger("matcher.registry")


def _reason(exc: Exception) -> str:
    return str(exc) if isinstance(exc, RegistryError) else f"{type(exc).__name__}: {exc}"


class RegistryHolder:
    """The registry in force (``current``), from ``path`` (None: the empty registry),
    looked at every ``interval_s``; each process passes the metrics it exports, and
    ``on_load``, called with each registry put in force (at start and on each reload)."""

    def __init__(
        self,
        path: Path | None,
        interval_s: float,
        reloads: Counter,
        failing: Gauge,
        on_load: Callable[[Registry], None] | None = None,
    ) -> None:
        self._reloads, self._failing = reloads, failing
        self._on_load = on_load
        self._interval_s = interval_s
        self._path = path
        self._stamp: tuple[float, int] | None = None
        self.current = Registry()

    def load_initial(self) -> None:
        """Load at start; a broken file here stops the daemon (RegistryError)."""
        if self._path is None:
            return
        self._stamp = self._file_stamp()
        self.current = load_registry(self._path)
        self._put_in_force(self.current)
        log.info(
            "producer registry loaded",
            extra={"file": str(self._path), "producers": len(self.current.producers)},
        )

    def _put_in_force(self, registry: Registry) -> None:
        if self._on_load is not None:
            self._on_load(registry)

    def _file_stamp(self) -> tuple[float, int] | None:
        assert self._path is not None
        try:
            stat = self._path.stat()
        except OSError:
            return None
        return (stat.st_mtime, stat.st_size)

    def reload(self, why: str) -> bool:
        if self._path is None:
            return False
        self._stamp = self._file_stamp()
        try:
            registry = load_registry(self._path)
        except Exception as exc:
            # Not only RegistryError: whatever a file's content provokes must leave the last
            # good registry in force, not end the watch (and with it the process, or, in the
            # ingress, every later reload and the SIGHUP handler).
            self._reloads.labels("failed").inc()
            self._failing.set(1)
            log.error(
                "producer registry not reloaded; the last good one stays in force",
                extra={"file": str(self._path), "why": why, "error": _reason(exc)},
                exc_info=not isinstance(exc, RegistryError),  # unforeseen: show where
            )
            return False
        self.current = registry
        self._put_in_force(registry)
        self._reloads.labels("ok").inc()
        self._failing.set(0)
        log.info(
            "producer registry reloaded",
            extra={"file": str(self._path), "why": why, "producers": len(registry.producers)},
        )
        return True

    async def watch(self, stop: asyncio.Event) -> None:
        if self._path is None:
            await stop.wait()  # nothing to watch; a loop that returns would stop the daemon
            return
        loop = asyncio.get_running_loop()
        hup = asyncio.Event()
        with contextlib.suppress(ValueError, RuntimeError):  # not the main thread: no SIGHUP
            loop.add_signal_handler(signal.SIGHUP, hup.set)
        try:
            while not stop.is_set():
                waiters = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(hup.wait())}
                _, pending = await asyncio.wait(
                    waiters,
                    timeout=self._interval_s,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                for waiter in pending:
                    waiter.cancel()
                if stop.is_set():
                    break
                if hup.is_set():
                    hup.clear()
                    self.reload("SIGHUP")
                elif self._file_stamp() != self._stamp:
                    self.reload("file changed")
        finally:
            with contextlib.suppress(ValueError, RuntimeError):
                loop.remove_signal_handler(signal.SIGHUP)
