"""What the peers' modules share: the payload every system is given, free ports, the peer
servers' processes (started, waited for by condition, stopped however the run ends), their
CPU time (read by bench.cpu), and latency percentiles.

A peer module runs as its own process (``python -m bench.<peer>_peer``) and prints one JSON
object as its last line: ``{"runs": {name: [values]}, "figures": {...}, "notes": [...]}``.
bench.run takes medians of the runs, as for its own figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.cpu import process_cpu_s

# The payload of every event, for matcher and its peers alike.
PAYLOAD: dict[str, Any] = {
    "status": "succeeded",
    "rows": 1200,
    "output": "s3://bucket/out/" + "x" * 120,
}
# Requests (signals, resolutions, starts) in flight at once from the load generator.
CONCURRENCY = 64


class PeerUnavailable(Exception):
    """The peer cannot run here (binary missing, server not up); the message says why."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A server process of a peer, its output in a log file (read back for the notes)."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log: Path,
        stop_signal: signal.Signals = signal.SIGTERM,
        **kwargs: Any,
    ) -> None:
        self.name = name
        self.log = log
        self.stop_signal = stop_signal
        self._log_file = log.open("wb")
        self.process = subprocess.Popen(
            list(argv), stdout=self._log_file, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, **kwargs,
        )  # fmt: skip

    def tail(self, lines: int = 5) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])

    def check_alive(self) -> None:
        code = self.process.poll()
        if code is not None:
            raise PeerUnavailable(f"{self.name} exited {code}: {self.tail()}")

    def cpu(self) -> float:
        return process_cpu_s(self.process.pid)

    def stop(self, timeout: float = 30.0) -> None:
        if self.process.poll() is None:
            self.process.send_signal(self.stop_signal)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout)
        self._log_file.close()


@contextlib.contextmanager
def running(server: Server) -> Iterator[Server]:
    try:
        yield server
    finally:
        server.stop()


async def wait_for(
    what: str,
    ready: Callable[[], Awaitable[bool]],
    within_s: float,
    alive: Callable[[], None] = lambda: None,
    interval: float = 0.1,
) -> None:
    """Poll ``ready`` until it is true; PeerUnavailable after ``within_s`` seconds or as
    soon as ``alive`` raises (the server died)."""
    deadline = time.monotonic() + within_s
    last: BaseException | None = None
    while time.monotonic() < deadline:
        alive()
        try:
            if await ready():
                return
        except Exception as exc:  # not up yet: connection refused, 503, ...
            last = exc
        await asyncio.sleep(interval)
    raise PeerUnavailable(f"{what} not ready within {within_s:.0f}s (last: {last!r})")


async def few_at_a_time(count: int, call: Callable[[int], Awaitable[Any]]) -> list[Any]:
    """``call(i)`` for every i < count, CONCURRENCY at a time; the results in order."""
    limit = asyncio.Semaphore(CONCURRENCY)

    async def one(i: int) -> Any:
        async with limit:
            return await call(i)

    return list(await asyncio.gather(*(one(i) for i in range(count))))


async def paced(
    count: int, rate: int, call: Callable[[int], Awaitable[Any]]
) -> tuple[list[float], float]:
    """``call(i)`` due at ``rate`` per second (open loop, at most CONCURRENCY*4 in flight).
    Returns the wall-clock time each call was due at, which latency is counted from (a
    peer too slow for the rate holds the sender back, and that wait is latency too), and
    the rate the calls were actually started at."""
    limit = asyncio.Semaphore(CONCURRENCY * 4)
    tasks = []

    async def one(i: int) -> None:
        try:
            await call(i)
        finally:
            limit.release()

    wall, started = time.time(), time.perf_counter()
    for i in range(count):
        due = started + i / rate
        now = time.perf_counter()
        if due > now:
            await asyncio.sleep(due - now)
        await limit.acquire()
        tasks.append(asyncio.create_task(one(i)))
    elapsed = time.perf_counter() - started
    achieved = (count - 1) / elapsed if count > 1 and elapsed > 0 else float(rate)
    await asyncio.gather(*tasks)
    return [wall + i / rate for i in range(count)], achieved


def percentiles(latencies_s: list[float]) -> dict[str, float]:
    ordered = sorted(latencies_s)

    def pct(p: float) -> float:
        return 1000 * ordered[min(len(ordered) - 1, int(p * len(ordered)))]

    return {"p50_ms": pct(0.50), "p95_ms": pct(0.95), "p99_ms": pct(0.99)}


def emit(out: dict[str, Any]) -> None:
    print(json.dumps(out), flush=True)


Measure = Callable[[argparse.Namespace], Coroutine[Any, Any, dict[str, Any]]]


def parse(doc: str | None, argv: list[str] | None = None) -> argparse.Namespace:
    """A peer process's arguments (bench/run.py passes them)."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--rates", default="500,2000")
    parser.add_argument("--latency-s", type=float, default=1.0)
    parser.add_argument("--latency-reps", type=int, default=1)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args(argv)
    args.rates = [int(r) for r in args.rates.split(",") if r]
    return args


def peer_main(measure: Measure, doc: str | None) -> None:
    """Run a peer's ``measure`` and print its results; a peer that cannot run says why."""
    args = parse(doc)
    try:
        out: dict[str, Any] = asyncio.run(measure(args))
    except PeerUnavailable as exc:
        out = {"runs": {}, "figures": {}, "unavailable": str(exc)}
    emit(out)
