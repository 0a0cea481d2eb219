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


def _reading(root: Path) -> dict[str, int] | None:
    try:
        return {
            "io_full": stalled_us((root / "io").read_text(), "full"),
            "cpu_some": stalled_us((root / "cpu").read_text(), "some"),
        }
    except (OSError, ValueError):
        return None


class Stalls:
    """Reads the totals at ``start()``; ``stop()`` gives the figures for the window."""

    def __init__(self, clock: Callable[[], float], root: Path = ROOT) -> None:
        self._clock = clock
        self._root = root
        self._started: tuple[float, dict[str, int]] | None = None

    def start(self) -> None:
        reading = _reading(self._root)
        self._started = None if reading is None else (self._clock(), reading)

    def stop(self) -> dict[str, float]:
        """``io_stall_ms`` and ``cpu_wait_pct`` over the window; empty when unknown."""
        after = _reading(self._root)
        if self._started is None or after is None:
            return {}
        began, before = self._started
        wall_us = max(self._clock() - began, 1e-9) * 1e6
        return {
            "io_stall_ms": (after["io_full"] - before["io_full"]) / 1000,
            "cpu_wait_pct": 100 * (after["cpu_some"] - before["cpu_some"]) / wall_us,
        }
