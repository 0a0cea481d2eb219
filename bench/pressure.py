"""How long the machine made its tasks wait during a window: the kernel's pressure stall
information (/proc/pressure, Linux 4.20 and later), read at the start and the end.

A latency tail on a small shared machine comes from waiting, and these say for which
resource: ``io_stall_ms``, the time during which every runnable task waited for the disk
at once ("full"; a WAL flush that stalls holds up every commit behind it), and
``cpu_wait_pct``, the share of the window in which some task was ready but had no CPU
("some"). Where the kernel does not report them, the figures are left out. Beside them,
from /proc/stat, ``cpu_steal_pct``: the share of the machine's CPU time (all its cores)
that the hypervisor gave to others while this machine's virtual CPUs wanted it, which a virtual
machine's tail can come from and no process's own CPU time shows.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from bench import cpu

ROOT = Path("/proc/pressure")
STAT = Path("/proc/stat")


def stalled_us(text: str, kind: str) -> int:
    """The ``total=`` (microseconds) of the ``kind`` line ("some" or "full") of a
    /proc/pressure file's ``text``."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == kind:
            for field in fields[1:]:
                name, _, value = field.partition("=")
                if name == "total":
                    return int(value)
    raise ValueError(f"no {kind!r} total in {text!r}")


def stolen_per_cpu_s(text: str, ticks_per_s: int) -> float:
    """The steal time of the ``cpu`` line of a /proc/stat ``text`` (its eighth value, in
    ticks), in seconds per CPU (the ``cpuN`` lines counted)."""
    lines = [line.split() for line in text.splitlines()]
    totals = [fields for fields in lines if fields and fields[0] == "cpu"]
    cpus = sum(
        1 for fields in lines if fields and fields[0][3:].isdigit() and fields[0][:3] == "cpu"
    )
    if len(totals) != 1 or len(totals[0]) < 9 or cpus == 0:
        raise ValueError(f"no steal time in {text[:200]!r}")
    return int(totals[0][8]) / ticks_per_s / cpus


def _stolen_s(path: Path) -> float:
    try:
        return stolen_per_cpu_s(path.read_text(), os.sysconf("SC_CLK_TCK"))
    except ValueError as exc:
        raise OSError(str(exc)) from exc


def _total_s(path: Path, kind: str) -> float:
    """A pressure total in seconds; a file that cannot be read as one is an OSError, which
    the meter takes as "no figure" (as for a process that is gone)."""
    try:
        return stalled_us(path.read_text(), kind) / 1e6
    except ValueError as exc:
        raise OSError(str(exc)) from exc


class Stalls:
    """The totals read by a ``cpu.Meter`` at ``start()``; ``stop()`` gives the window's
    figures: the two stall figures where both pressure totals were read at both ends, the
    steal where /proc/stat was."""

    def __init__(self, clock: Callable[[], float], root: Path = ROOT, stat: Path = STAT) -> None:
        readers = {
            "io_full": lambda: _total_s(root / "io", "full"),
            "cpu_some": lambda: _total_s(root / "cpu", "some"),
            "stolen": lambda: _stolen_s(stat),
        }
        self._meter = cpu.Meter(readers, clock)

    def start(self) -> None:
        self._meter.start()

    def stop(self) -> dict[str, float]:
        """``io_stall_ms``, ``cpu_wait_pct`` and ``cpu_steal_pct`` over the window, each
        left out when unknown."""
        window = self._meter.stop()
        share = window.cores()
        figures = {}
        if {"io_full", "cpu_some"} <= set(window.cpu_s):
            figures["io_stall_ms"] = 1000 * window.cpu_s["io_full"]
            figures["cpu_wait_pct"] = 100 * share["cpu_some"]
        if "stolen" in share:
            figures["cpu_steal_pct"] = 100 * share["stolen"]
        return figures
