"""Is the broker's JIT compiler still at work? A latency window measured while it is
measures the compiler as much as matcher.

A Kafka broker is a JVM, and HotSpot compiles a code path (C1 first, then C2) once it has
run often enough, and again when the shape of the traffic changes. The latency windows
come after the throughput runs, whose large batches take other paths through the broker
than a few events a millisecond, so on a freshly started broker (what `make bench` starts
on a fresh machine) the compiler threads ran at 0.5-0.65 of a core through the first
half-minute of the 500/s windows: the broker read 0.9-1.0 cores there against 0.3 on a
broker that had already run the same windows, the machine's two cores were short of CPU
in 62 % of the window against 34 %, and the p99 read 73-101 ms against 29-45 ms, within
the hour on one machine. A broker that has run for a while, as one serving users has,
does not pay that; so each rate is measured after unrecorded warm-up windows at that
rate, until the compiler threads use less than SETTLED_PCT of a core in one (at most the
plan's number of them), and the results say how many it took.

The compiler threads are found by their names (HotSpot's "C1 CompilerThread0", "C2
CompilerThread1", ..., which Linux keeps to 15 characters). A compiler thread that exits
during a window (HotSpot starts and stops them with the load) takes its CPU with it, so a
reading can only be lower than the truth, never higher.
"""

from __future__ import annotations

from bench.cpu import Reader, listening_pid, named_threads, port_of, threads_cpu_s

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


def compiler_cpu_s(pid: int) -> float:
    """The CPU (user + system, seconds) of the compiler threads of process ``pid``; 0.0 for
    a process that has none (one that is not a HotSpot JVM)."""
    return threads_cpu_s(pid, COMPILER_THREAD_PREFIXES)


def broker_compiler_reader(kafka_bootstrap: str) -> Reader | None:
    """A reader of the broker's compiler threads' CPU, or None when the broker is not a
    process on this machine or has no compiler threads (not a HotSpot JVM)."""
    pid = listening_pid(port_of(kafka_bootstrap, 9092))
    try:
        if pid is None or not named_threads(pid, COMPILER_THREAD_PREFIXES):
            return None
    except OSError:
        return None  # gone, or not ours to read
    return lambda: compiler_cpu_s(pid)


def settled(compiler_pct: float) -> bool:
    """Whether a window whose broker compiler threads used ``compiler_pct`` % of one core
    found the broker done compiling the paths of its rate."""
    return compiler_pct < SETTLED_PCT


def warm_up_note(rate: int, shares_pct: list[float]) -> str:
    """The results' note on the warm-up windows before the windows measured at ``rate``,
    given the broker compiler threads' share of a core in each."""
    shares = ", ".join(f"{share:.0f}" for share in shares_pct)
    count = f"{len(shares_pct)} unrecorded warm-up window{'s' if len(shares_pct) != 1 else ''}"
    if shares_pct and settled(shares_pct[-1]):
        outcome = f"settled under {SETTLED_PCT:.0f} % in the last"
    else:
        outcome = (
            f"not yet under {SETTLED_PCT:.0f} % when the warm-up's windows ran out, so the"
            " measured windows still include some of the broker's compiling"
        )
    return (
        f"latency at {rate}/s: measured after {count} of {WARM_WINDOW_S:.0f} s at that rate,"
        f" in which the broker's JIT compiler threads used {shares} % of a core; {outcome}"
        " (bench/jit.py)"
    )
