"""Is the broker's JIT compiler still at work? A latency window measured while it is
measures the compiler as much as matcher.

A Kafka broker is a JVM, and HotSpot compiles a code path (C1 first, then C2) once it has
run often enough, and again when the shape of the traffic changes. The latency windows
come after the throughput runs, whose large batches take other paths through the broker
than a few events a millisecond, so on a freshly started broker (what `make bench` starts
on a fresh machine) the compiler threads ran at 0.5-0.65 of a core through the first
half-minute of the 500/s windows: the broker read 0.9-1.0 cores there against 0.3 on a
broker that had already run the same windows, the machine's two cores were short of CPU
in 48-63 % of the windows against 34 %, and the p99 read 73-101 ms against 29-45 ms, within
the hour on one machine. A broker that has run for a while, as one serving users has,
does not pay that; so each rate is measured after unrecorded warm-up windows at that
rate, until the compiler threads use less than SETTLED_PCT of a core in one (at most the
plan's number of them), and the results say how many it took.

The compiler threads are found by their names (HotSpot's "C1 CompilerThread0", "C2
CompilerThread1", ..., which Linux keeps to 15 characters) and read thread by thread: a
compiler thread that exits during a window (HotSpot stops the extra ones when compiling
dies down) takes its CPU in the window with it, and one that starts counts from zero, so
a window's reading can only be lower than the truth, never higher, and never negative.
"""

from __future__ import annotations

from collections.abc import Callable

from bench.cpu import listening_pid, named_threads, port_of, threads_ticks, ticks_to_s

# What Linux keeps (15 characters) of HotSpot's compiler threads' names.
COMPILER_THREAD_PREFIXES = ("C1 CompilerThre", "C2 CompilerThre")
# Below this share of one core over a window, the compiler is done with the rate's paths:
# a warm broker's compiler threads read 0-3 % over a 500/s window, with rare bursts near 12.
SETTLED_PCT = 10.0
# An unrecorded window's length. On a fresh broker at 500/s the compiler threads ran at
# 38-60 % of a core through four windows of 3 s and were still at 24 % in the first
# measured one: each window pays its setup (a database, topics, a daemon's start) for
# a few seconds of traffic, so fewer, longer windows warm the broker for less time.
WARM_WINDOW_S = 8.0


def compiler_ticks(pid: int) -> dict[str, int]:
    """The CPU (user + system, in clock ticks) of each compiler thread of process ``pid``,
    by thread id; empty for a process that has none (one that is not a HotSpot JVM)."""
    return threads_ticks(pid, COMPILER_THREAD_PREFIXES)


def broker_jvm(kafka_bootstrap: str) -> int | None:
    """The broker's process id, or None when it is not a process on this machine that
    this user can read, or has no compiler threads (not a HotSpot JVM)."""
    pid = listening_pid(port_of(kafka_bootstrap, 9092))
    try:
        if pid is None or not named_threads(pid, COMPILER_THREAD_PREFIXES):
            return None
    except OSError:
        return None  # gone, or not ours to read
    return pid


class CompilerMeter:
    """The share of one core that a JVM's compiler threads used between ``start()`` and
    ``stop_pct()``, thread by thread (see the module's docstring)."""

    def __init__(self, pid: int, clock: Callable[[], float]) -> None:
        self._pid = pid
        self._clock = clock
        self._started: tuple[float, dict[str, int]] | None = None

    def start(self) -> None:
        try:
            self._started = (self._clock(), compiler_ticks(self._pid))
        except OSError:
            self._started = None  # the broker is gone: no figure for this window

    def stop_pct(self) -> float | None:
        """Per cent of one core over the window; None when the JVM could not be read."""
        if self._started is None:
            return None
        began, before = self._started
        try:
            after = compiler_ticks(self._pid)
        except OSError:
            return None
        ticks = sum(now - before.get(thread, 0) for thread, now in after.items())
        return 100 * ticks_to_s(ticks) / max(self._clock() - began, 1e-9)


def settled(compiler_pct: float) -> bool:
    """Whether a window whose broker compiler threads used ``compiler_pct`` % of one core
    found the broker done compiling the paths of its rate."""
    return compiler_pct < SETTLED_PCT


def warm_up_note(rate: int, shares_pct: list[float], most: int) -> str:
    """The results' note on the warm-up windows before the windows measured at ``rate``,
    given the broker compiler threads' share of a core in each and the most there could
    have been."""
    shares = ", ".join(f"{share:.1f}" for share in shares_pct)
    count = f"{len(shares_pct)} unrecorded warm-up window{'s' if len(shares_pct) != 1 else ''}"
    if shares_pct and settled(shares_pct[-1]):
        outcome = f"settled under {SETTLED_PCT:.0f} % in the last"
    elif len(shares_pct) >= most:
        outcome = (
            f"not yet under {SETTLED_PCT:.0f} % when the warm-up's windows ran out, so the"
            " measured windows still include some of the broker's compiling"
        )
    else:
        outcome = "the broker could not be read after that, so the warm-up stopped there"
    return (
        f"latency at {rate}/s: measured after {count} of {WARM_WINDOW_S:.0f} s at that rate,"
        f" in which the broker's JIT compiler threads used {shares} % of a core; {outcome}"
        " (bench/jit.py)"
    )
