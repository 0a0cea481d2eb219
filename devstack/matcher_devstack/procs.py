"""Process helpers shared by the devstack services: ports, pids, log tails, bounded waits."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path


class DevstackError(Exception):
    """A devstack service could not be brought up or down; the message says why."""


class DevstackUsageError(DevstackError):
    """The request does not fit this stack (another mode, no such broker); the message
    says what to ask instead."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def pid_alive(pid: int, needle: str) -> bool:
    """Whether ``pid`` runs and its command line contains ``needle`` (guards pid reuse)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    if needle.encode() not in cmdline:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # A zombie has exited; it only waits for its parent to reap it.
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def wait_until(
    check: Callable[[], bool],
    *,
    timeout: float,
    interval: float = 0.2,
    abort: Callable[[], str | None] | None = None,
) -> bool:
    """Poll ``check`` until it is true or ``timeout`` passes; ``abort`` may end it early."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return True
        if abort is not None and (reason := abort()) is not None:
            raise DevstackError(reason)
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def terminate(pid: int, needle: str, *, timeout: float) -> None:
    """SIGTERM ``pid``, then SIGKILL it if it outlives ``timeout``."""
    if not pid_alive(pid, needle):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if wait_until(lambda: not pid_alive(pid, needle), timeout=timeout):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(pid, needle), timeout=10)
