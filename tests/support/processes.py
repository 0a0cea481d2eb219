"""matcher as it runs: the daemon in this process or as a real one (for SIGTERM and
SIGKILL), the ingress as a process, the CLI as a subprocess."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from psycopg_pool import AsyncConnectionPool

from matcher.config import Settings
from matcher.daemon import app as daemon_app
from matcher.daemon.ingest import Ingest
from tests.support.assertions import eventually
from tests.support.services import settings_env


@contextlib.asynccontextmanager
async def running_daemon(settings: Settings) -> AsyncIterator[asyncio.Task[None]]:
    """The daemon in this process, stopped (gracefully) when the block ends."""
    stop = asyncio.Event()
    task = asyncio.create_task(daemon_app.run(settings, stop, handle_signals=False))
    try:
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


@contextlib.asynccontextmanager
async def running_ingest(settings: Settings) -> AsyncIterator[Ingest]:
    """The ingest loop alone in this process (no relay, no sweeper), handed over once its
    consumer holds partitions, and stopped when the block ends."""
    url = settings.database_url.get_secret_value()
    async with AsyncConnectionPool(url, min_size=1, open=False) as pool:
        stop = asyncio.Event()
        ingest = Ingest(settings, pool, stop, on_resolved=lambda: None)
        task = asyncio.create_task(ingest.run())

        def assigned_or_ended() -> bool:
            consumer = ingest.consumer
            return task.done() or (consumer is not None and bool(consumer.assignment()))

        try:
            await eventually(
                assigned_or_ended, timeout=60, interval=0.05, what="partitions assigned"
            )
            if task.done():
                task.result()  # its error, if it failed to start
            yield ingest
            assert not task.done(), "the ingest loop ended by itself"
        finally:
            stop.set()
            await asyncio.wait_for(task, 60)


class DaemonProcess:
    """``matcher run`` as a real process, for SIGTERM and SIGKILL."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "matcher", "run"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            if "matcher ready" in line:
                self._ready.set()

    def wait_ready(self, timeout: float = 60) -> None:
        if not self._ready.wait(timeout):
            self.kill()
            raise AssertionError("daemon not ready; output:\n" + "".join(self.lines))

    def wait_for_output(self, needle: str, timeout: float = 30) -> None:
        """Block until a line containing ``needle`` was printed (or the process ended)."""
        deadline = time.monotonic() + timeout
        while not any(needle in line for line in self.lines):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no {needle!r} in the output:\n" + self.output)
            time.sleep(0.05)

    def admin_url(self, timeout: float = 30) -> str:
        """The admin API's address, as the daemon logged it (it listens on port 0)."""
        self.wait_for_output("admin API listening", timeout)
        found = re.search(r"admin API listening address=(http://\S+)", self.output)
        assert found is not None, self.output
        return found.group(1)

    def wait_exit(self, timeout: float = 60) -> int:
        code = self.process.wait(timeout)
        self._reader.join(5)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return code

    def terminate(self, timeout: float = 60) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.wait_exit(timeout)

    def kill(self) -> None:
        self.process.kill()
        self.wait_exit()

    @property
    def output(self) -> str:
        return "".join(self.lines)


class IngressProcess:
    """``matcher ingress`` on a free port, its log read line by line (JSON)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.lines: list[str] = []
        self.address: str | None = None
        self._listening = threading.Event()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "matcher", "ingress", "--address", "127.0.0.1:0", "--json"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            if '"ingress listening"' in line:
                self.address = json.loads(line)["address"]
                self._listening.set()

    def wait_listening(self, timeout: float = 30) -> str:
        if not self._listening.wait(timeout) or self.address is None:
            self.stop()
            raise AssertionError("the ingress did not listen:\n" + self.output)
        return self.address

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if httpx.get(f"{self.address}/readyz", timeout=5).status_code == 200:
                return
            time.sleep(0.1)
        raise AssertionError("the ingress never became ready:\n" + self.output)

    def stop(self, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait(10)
        self._reader.join(5)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return code

    @property
    def output(self) -> str:
        return "".join(self.lines)


def process_env(settings: Settings, **extra: str) -> dict[str, str]:
    env = settings_env(settings)
    env.update(extra)
    return env


def run_cli(
    settings: Settings, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``matcher ARGS`` as a process with these settings (bounded in time)."""
    return subprocess.run(
        [sys.executable, "-m", "matcher", *args],
        env=process_env(settings),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def installed_tool(script: str) -> str:
    """The path a ``scripts/install-*`` script prints (it installs the tool when it may);
    the test fails with the script's own one-line reason when it cannot."""
    done = subprocess.run(
        [str(Path(__file__).resolve().parents[2] / "scripts" / script)],
        capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.fail(done.stderr.strip().splitlines()[-1], pytrace=False)
    return done.stdout.strip()
