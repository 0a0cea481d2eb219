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
# thread's CPU leaves /proc with it); it listens on a port and says so. Then, line by line
# on stdin: "end" lets the compiler thread exit, "new" starts a second one that burns
# 0.2 s and stays; each answers "ok" once done. An empty line ends it.
_FAKE_JVM = """
import ctypes, socket, sys, threading, time
libc = ctypes.CDLL(None)
leave = {"C2 CompilerThread0": threading.Event(), "worker": threading.Event(),
         "C2 CompilerThread1": threading.Event()}
def burn(name, seconds, burnt):
    libc.prctl(15, name.encode())  # PR_SET_NAME: the thread's name in /proc
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
    burnt.wait()
    leave[name].wait()
burnt = threading.Barrier(3)
first = threading.Thread(target=burn, args=("C2 CompilerThread0", 0.3, burnt), daemon=True)
first.start()
threading.Thread(target=burn, args=("worker", 0.3, burnt), daemon=True).start()
burnt.wait()
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
print(server.getsockname()[1], flush=True)
for line in sys.stdin:
    if line == "end\\n":
        leave["C2 CompilerThread0"].set()
        first.join()
    elif line == "new\\n":
        burnt = threading.Barrier(2)
        threading.Thread(target=burn, args=("C2 CompilerThread1", 0.2, burnt), daemon=True).start()
        burnt.wait()
    else:
        break
    print("ok", flush=True)
"""


class FakeJvm:
    def __init__(self, process: subprocess.Popen[str], port: int) -> None:
        self.pid, self.port = process.pid, port
        self._process = process

    def tell(self, command: str) -> None:
        assert self._process.stdin is not None
        assert self._process.stdout is not None
        self._process.stdin.write(command + "\n")
        self._process.stdin.flush()
        assert self._process.stdout.readline() == "ok\n"


@pytest.fixture
def fake_jvm() -> Iterator[FakeJvm]:
    with subprocess.Popen(
        [sys.executable, "-c", _FAKE_JVM], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as process:
        assert process.stdout is not None
        assert process.stdin is not None
        yield FakeJvm(process, int(process.stdout.readline()))
        process.stdin.write("\n")
        process.stdin.flush()
        process.wait(timeout=30)


def _compiler_s(pid: int) -> float:
    return cpu.ticks_to_s(sum(jit.compiler_ticks(pid).values()))


@pytest.mark.timeout(60)
def test_only_the_compiler_threads_are_counted(fake_jvm: FakeJvm) -> None:
    assert 0.25 <= _compiler_s(fake_jvm.pid) < 0.45
    assert cpu.process_cpu_s(fake_jvm.pid) >= 0.55  # the other thread's CPU is the process's


@pytest.mark.timeout(60)
def test_the_broker_is_found_through_the_port_it_listens_on(fake_jvm: FakeJvm) -> None:
    assert jit.broker_jvm(f"127.0.0.1:{fake_jvm.port}") == fake_jvm.pid


@pytest.mark.timeout(60)
def test_a_compiler_thread_that_exits_takes_nothing_off_the_window(fake_jvm: FakeJvm) -> None:
    # HotSpot stops its extra compiler threads when compiling dies down: a reading of all
    # the threads alive at each end would subtract the exited thread's whole CPU.
    clock = iter([0.0, 1.0]).__next__
    meter = jit.CompilerMeter(fake_jvm.pid, clock)
    meter.start()
    fake_jvm.tell("end")
    assert meter.stop_pct() == 0.0


@pytest.mark.timeout(60)
def test_a_compiler_thread_that_starts_counts_from_zero(fake_jvm: FakeJvm) -> None:
    clock = iter([0.0, 1.0]).__next__
    meter = jit.CompilerMeter(fake_jvm.pid, clock)
    meter.start()
    fake_jvm.tell("new")  # 0.2 s of CPU in a new compiler thread, over a 1 s window
    share = meter.stop_pct()
    assert share is not None
    assert 15 <= share < 35


def test_a_process_without_compiler_threads_is_no_broker_jvm() -> None:
    with socket.socket() as server:  # this process listens on a port and is no JVM
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = int(server.getsockname()[1])
        assert jit.broker_jvm(f"127.0.0.1:{port}") is None
    assert jit.broker_jvm(f"127.0.0.1:{port}") is None  # nobody listens


def test_settled_below_the_threshold_only() -> None:
    assert jit.settled(0.0)
    assert jit.settled(jit.SETTLED_PCT - 0.1)
    assert not jit.settled(jit.SETTLED_PCT)
    assert not jit.settled(60.0)


def test_the_note_says_how_many_windows_and_whether_the_compiler_settled() -> None:
    settled = jit.warm_up_note(500, [55.2, 21.0, 9.96], most=4)
    assert "latency at 500/s" in settled
    assert "3 unrecorded warm-up windows" in settled
    assert "55.2, 21.0, 10.0 % of a core" in settled
    assert "settled under 10 %" in settled
    busy = jit.warm_up_note(2000, [40.0], most=1)
    assert "1 unrecorded warm-up window of" in busy
    assert "not yet under 10 % when the warm-up's windows ran out" in busy
    lost = jit.warm_up_note(2000, [40.0], most=4)
    assert "could not be read after that" in lost


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
    env = SimpleNamespace(broker_jvm=1 if readable else None)
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
        return {"p50_ms": 1.0, "p99_ms": 2.0, "drift_ms": 0.0, "cpu_cores": {}, "sent": 1,
                "received": 1, "samples_ms": [1.0]}  # fmt: skip

    async def floor(env: object, rate: int, seconds: float) -> dict[str, float]:
        return {"p50": 0.5}

    async def pipe_floor(env: object, rate: int, seconds: float) -> dict[str, Any]:
        return {"p50_ms": 0.5, "p99_ms": 1.0, "cpu_cores": {}}

    async def worker_window(env: object, rate: int, seconds: float) -> dict[str, float]:
        return {"handler_p50_ms": 1.0, "handler_p99_ms": 2.0}

    monkeypatch.setattr(run, "latency", window)
    monkeypatch.setattr(run, "kafka_latency", floor)
    monkeypatch.setattr(run, "pipe_latency", pipe_floor)
    monkeypatch.setattr(run, "worker_latency", worker_window)
    env = SimpleNamespace(broker_jvm=None)
    results = run.Results(plan={}, machine={})
    plan = run.Plan(n=1, naive_n=1, reps=1, rates=[500], latency_s=1, scale=[0], dbos_n=1)
    asyncio.run(run._measure_latency(env, plan, results, {}, lambda _: None))  # type: ignore[arg-type]
    assert measured == [500]  # the measured window only
    assert any("without a warm-up" in note for note in results.notes)
    assert "warm_up_windows_500" not in results.runs
