"""The benchmark's stall figures: the kernel's totals read right, the window's share
worked out from them, and nothing made up where the kernel reports none."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench import pressure

IO = (
    "some avg10=1.87 avg60=3.94 avg300=3.81 total={some}\n"
    "full avg10=1.31 avg60=2.85 avg300=2.83 total={full}\n"
)
CPU = (
    "some avg10=10.69 avg60=16.70 avg300=13.58 total={some}\n"
    "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
)


# /proc/stat of a two-CPU machine: user nice system idle iowait irq softirq steal ...
STAT = (
    "cpu  3150074 3534 972581 5263407 141173 0 96117 {steal} 0 0\n"
    "cpu0 1575037 1767 486290 2631703 70586 0 48058 {half} 0 0\n"
    "cpu1 1575037 1767 486291 2631704 70587 0 48059 {half} 0 0\n"
    "intr 1 2 3\nctxt 99\n"
)


def _write(root: Path, io_full: int, cpu_some: int, steal: int = 0) -> None:
    (root / "io").write_text(IO.format(some=io_full * 2, full=io_full))
    (root / "cpu").write_text(CPU.format(some=cpu_some))
    (root / "stat").write_text(STAT.format(steal=steal, half=steal // 2))


def test_the_total_of_the_asked_line_is_read() -> None:
    text = IO.format(some=1164535217, full=799700111)
    assert pressure.stalled_us(text, "some") == 1164535217
    assert pressure.stalled_us(text, "full") == 799700111


def test_a_file_without_the_line_is_refused() -> None:
    with pytest.raises(ValueError, match="no 'full' total"):
        pressure.stalled_us("some avg10=0.00 total=5\n", "full")


def test_a_window_gives_the_stall_in_ms_and_the_cpu_wait_as_a_share(tmp_path: Path) -> None:
    now = iter([10.0, 12.0])  # a two-second window
    _write(tmp_path, io_full=1_000_000, cpu_some=5_000_000)
    stalls = pressure.Stalls(lambda: next(now), tmp_path, tmp_path / "stat")
    stalls.start()
    _write(tmp_path, io_full=1_250_000, cpu_some=5_500_000)  # +250 ms and +0.5 s
    figures = stalls.stop()
    assert figures["io_stall_ms"] == pytest.approx(250.0)
    assert figures["cpu_wait_pct"] == pytest.approx(25.0)
    assert figures["cpu_steal_pct"] == pytest.approx(0.0)


def test_the_steal_is_a_share_of_all_the_machines_cpus() -> None:
    text = STAT.format(steal=32031, half=16015)
    assert pressure.stolen_per_cpu_s(text, 100) == pytest.approx(32031 / 100 / 2)
    with pytest.raises(ValueError, match="no steal time"):
        pressure.stolen_per_cpu_s("cpu  1 2 3 4\ncpu0 1 2 3 4\n", 100)  # an old kernel's
    with pytest.raises(ValueError, match="no steal time"):
        pressure.stolen_per_cpu_s("intr 1 2\n", 100)


def test_a_window_with_steal_reports_it(tmp_path: Path) -> None:
    ticks = os.sysconf("SC_CLK_TCK")
    now = iter([0.0, 4.0])  # four seconds of two CPUs: 8 CPU-seconds
    _write(tmp_path, io_full=0, cpu_some=0, steal=1000)
    stalls = pressure.Stalls(lambda: next(now), tmp_path, tmp_path / "stat")
    stalls.start()
    _write(tmp_path, io_full=0, cpu_some=0, steal=1000 + 2 * ticks)  # 2 CPU-seconds stolen
    assert stalls.stop()["cpu_steal_pct"] == pytest.approx(25.0)


def test_no_figures_where_the_kernel_reports_none(tmp_path: Path) -> None:
    stalls = pressure.Stalls(lambda: 0.0, tmp_path / "absent", tmp_path / "absent" / "stat")
    stalls.start()
    assert stalls.stop() == {}


def test_no_figures_when_the_files_vanish_during_the_window(tmp_path: Path) -> None:
    _write(tmp_path, io_full=1, cpu_some=1)
    stalls = pressure.Stalls(lambda: 0.0, tmp_path, tmp_path / "stat")
    stalls.start()
    (tmp_path / "io").unlink()
    (tmp_path / "stat").unlink()
    assert stalls.stop() == {}
