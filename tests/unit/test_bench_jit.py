"""The benchmark reads a JVM's JIT compiler threads apart from its other threads, and says
how its latency windows were warmed up (bench/jit.py)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from bench import cpu, jit, run

# A process with a thread named as HotSpot names its C2 compiler threads and one named
# otherwise, each burning about 0.3 s of its own CPU and then staying alive (an exited
# thread's CPU leaves /proc with it); it listens on a port, says so, and idles until told
# to exit.
_FAKE_JVM = """
import ctypes, socket, sys, threading, time
libc = ctypes.CDLL(None)
burnt, leave = threading.Barrier(3), threading.Event()
def burn(name):
    libc.prctl(15, name.encode())  # PR_SET_NAME: the thread's name in /proc
    end = time.thread_time() + 0.3
    while time.thread_time() < end:
        pass
    burnt.wait()
    leave.wait()
for name in ("C2 CompilerThread0", "worker"):
    threading.Thread(target=burn, args=(name,), daemon=True).start()
burnt.wait()
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
print(server.getsockname()[1], flush=True)
sys.stdin.readline()
"""


@pytest.fixture
def fake_jvm() -> Iterator[tuple[int, int]]:
    """(pid, port) of a running _FAKE_JVM."""
    with subprocess.Popen(
        [sys.executable, "-c", _FAKE_JVM], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as process:
        assert process.stdout is not None
        assert process.stdin is not None
        port = int(process.stdout.readline())
        yield process.pid, port
        process.stdin.write("\n")
        process.stdin.flush()
        process.wait(timeout=30)


@pytest.mark.timeout(60)
def test_only_the_compiler_threads_are_counted(fake_jvm: tuple[int, int]) -> None:
    pid, _ = fake_jvm
    assert 0.25 <= jit.compiler_cpu_s(pid) < 0.45
    assert cpu.process_cpu_s(pid) >= 0.55  # the other thread's CPU is the process's


@pytest.mark.timeout(60)
def test_the_broker_is_read_through_the_port_it_listens_on(fake_jvm: tuple[int, int]) -> None:
    _, port = fake_jvm
    read = jit.broker_compiler_reader(f"127.0.0.1:{port}")
    assert read is not None
    assert 0.25 <= read() < 0.45


def test_a_process_without_compiler_threads_has_no_reader() -> None:
    # This process listens on a port and is no JVM.
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = int(server.getsockname()[1])
        assert jit.broker_compiler_reader(f"127.0.0.1:{port}") is None
    assert jit.broker_compiler_reader(f"127.0.0.1:{port}") is None  # nobody listens


def test_settled_below_the_threshold_only() -> None:
    assert jit.settled(0.0)
    assert jit.settled(jit.SETTLED_PCT - 0.1)
    assert not jit.settled(jit.SETTLED_PCT)
    assert not jit.settled(60.0)


def test_the_note_says_how_many_windows_and_whether_the_compiler_settled() -> None:
    settled = jit.warm_up_note(500, [55.2, 21.0, 3.4])
    assert "latency at 500/s" in settled
    assert "3 unrecorded warm-up windows" in settled
    assert "55, 21, 3 % of a core" in settled
    assert "settled under 10 %" in settled
    busy = jit.warm_up_note(2000, [40.0])
    assert "1 unrecorded warm-up window of" in busy
    assert "not yet under 10 %" in busy


def _warm_up(
    monkeypatch: pytest.MonkeyPatch, shares: list[float | None], most: int, readable: bool = True
) -> tuple[list[float], int]:
    """Run the benchmark's warm-up against windows whose compiler shares are ``shares``:
    (the shares it kept, how many windows it ran)."""
    windows = iter(shares)
    ran = 0

    async def window(env: object, rate: int, seconds: float) -> dict[str, Any]:
        nonlocal ran
        ran += 1
        assert (rate, seconds) == (500, jit.WARM_WINDOW_S)
        share = next(windows)
        return {} if share is None else {"kafka_jit_pct": share}

    monkeypatch.setattr(run, "latency", window)
    env = SimpleNamespace(broker_compiler=(lambda: 0.0) if readable else None)
    kept = asyncio.run(run._warm_broker(env, 500, most))  # type: ignore[arg-type]
    return kept, ran


def test_the_warm_up_stops_at_the_first_settled_window(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _warm_up(monkeypatch, [51.0, 54.0, 11.0, 5.0, 40.0], most=6) == (
        [51.0, 54.0, 11.0, 5.0],
        4,
    )


def test_the_warm_up_stops_at_its_most_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _warm_up(monkeypatch, [51.0, 54.0, 30.0, 5.0], most=2) == ([51.0, 54.0], 2)


def test_no_warm_up_without_a_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _warm_up(monkeypatch, [51.0], most=4, readable=False) == ([], 0)
    # The broker went out of reach during the warm-up: measure as it is.
    assert _warm_up(monkeypatch, [51.0, None, 3.0], most=4) == ([51.0], 2)


def test_without_a_reading_the_results_say_there_was_no_warm_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    measured: list[int] = []

    async def window(env: object, rate: int, seconds: float) -> dict[str, Any]:
        measured.append(rate)
        return {"p50_ms": 1.0, "drift_ms": 0.0, "cpu_cores": {}, "sent": 1, "received": 1,
                "samples_ms": [1.0]}  # fmt: skip

    async def floor(env: object, rate: int, seconds: float) -> dict[str, float]:
        return {"p50": 0.5}

    monkeypatch.setattr(run, "latency", window)
    monkeypatch.setattr(run, "kafka_latency", floor)
    env = SimpleNamespace(broker_compiler=None)
    results = run.Results(plan={}, machine={})
    plan = run.Plan(n=1, naive_n=1, reps=1, rates=[500], latency_s=1, scale=[0], dbos_n=1)
    asyncio.run(run._measure_latency(env, plan, results, {}, lambda _: None))  # type: ignore[arg-type]
    assert measured == [500]  # the measured window only
    assert any("without a warm-up" in note for note in results.notes)
    assert "latency_500_warm_up_windows" not in results.runs
