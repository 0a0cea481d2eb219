"""The benchmark's stall figures: the kernel's totals read right, the window's share
worked out from them, and nothing made up where the kernel reports none."""

from __future__ import annotations

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


def _write(root: Path, io_full: int, cpu_some: int) -> None:
    (root / "io").write_text(IO.format(some=io_full * 2, full=io_full))
    (root / "cpu").write_text(CPU.format(some=cpu_some))


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
    stalls = pressure.Stalls(lambda: next(now), tmp_path)
    stalls.start()
    _write(tmp_path, io_full=1_250_000, cpu_some=5_500_000)  # +250 ms and +0.5 s
    figures = stalls.stop()
    assert figures["io_stall_ms"] == pytest.approx(250.0)
    assert figures["cpu_wait_pct"] == pytest.approx(25.0)


def test_no_figures_where_the_kernel_reports_none(tmp_path: Path) -> None:
    stalls = pressure.Stalls(lambda: 0.0, tmp_path / "absent")
    stalls.start()
    assert stalls.stop() == {}


def test_no_figures_when_the_files_vanish_during_the_window(tmp_path: Path) -> None:
    _write(tmp_path, io_full=1, cpu_some=1)
    stalls = pressure.Stalls(lambda: 0.0, tmp_path)
    stalls.start()
    (tmp_path / "io").unlink()
    assert stalls.stop() == {}
