"""How long the machine made its tasks wait during a window: the kernel's pressure stall
information (/proc/pressure, Linux 4.20 and later), read at the start and the end.

A latency tail on a small shared machine comes from waiting, and these say for which
resource: ``io_stall_ms``, the time during which every runnable task waited for the disk
at once ("full"; a WAL flush that stalls holds up every commit behind it), and
``cpu_wait_pct``, the share of the window in which some task was ready but had no CPU
("some"). Where the kernel does not report them, the figures are left out.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bench import cpu

ROOT = Path("/proc/pressure")


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


def _total_s(path: Path, kind: str) -> float:
    """A pressure total in seconds; a file that cannot be read as one is an OSError, which
    the meter takes as "no figure" (as for a process that is gone)."""
    try:
        return stalled_us(path.read_text(), kind) / 1e6
    except ValueError as exc:
        raise OSError(str(exc)) from exc


class Stalls:
    """The totals read by a ``cpu.Meter`` at ``start()``; ``stop()`` gives the window's
    figures, or none unless both totals were read at both ends."""

    def __init__(self, clock: Callable[[], float], root: Path = ROOT) -> None:
        readers = {
            "io_full": lambda: _total_s(root / "io", "full"),
            "cpu_some": lambda: _total_s(root / "cpu", "some"),
        }
        self._meter = cpu.Meter(readers, clock)

    def start(self) -> None:
        self._meter.start()

    def stop(self) -> dict[str, float]:
        """``io_stall_ms`` and ``cpu_wait_pct`` over the window; empty when unknown."""
        window = self._meter.stop()
        if set(window.cpu_s) != {"io_full", "cpu_some"}:
            return {}
        return {
            "io_stall_ms": 1000 * window.cpu_s["io_full"],
            "cpu_wait_pct": 100 * window.cores()["cpu_some"],
        }
