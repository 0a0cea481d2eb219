"""The benchmark's drift: a window that keeps up reads about 0 whatever its tail, one that
falls behind reads its backlog, and only the second is called behind."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from bench import drift


def test_a_steady_window_has_no_drift_even_with_a_tail() -> None:
    rng = random.Random(7)
    # 10 s at 500/s: 12-16 ms each, and one stall of 400 ms hitting 40 events near the end.
    latencies = [rng.uniform(0.012, 0.016) for _ in range(5000)]
    latencies[4500:4540] = [0.4] * 40
    d = drift.drift_ms(latencies)
    assert abs(d) < 2
    assert not drift.fell_behind(d, p50_ms=14)


def test_a_growing_backlog_is_its_drift() -> None:
    # Latency growing linearly from 50 ms to 1,050 ms over the window: the medians of the
    # fifths sit at a tenth and at nine tenths of the way.
    n = 10_000
    latencies = [0.05 + i / (n - 1) for i in range(n)]
    d = drift.drift_ms(latencies)
    assert 790 < d < 810
    assert drift.fell_behind(d, p50_ms=550)


def test_slow_growth_is_caught_and_noise_is_not() -> None:
    assert drift.fell_behind(drift=56, p50_ms=65)  # 30 -> 100 ms across the window
    # Measured on a slow machine: at 2,000/s a window that began behind (p50 1,659 ms,
    # drift 745) and one that fell behind within it (414, 259); at 500/s two that kept up.
    assert drift.fell_behind(drift=745, p50_ms=1659)
    assert drift.fell_behind(drift=259, p50_ms=414)
    assert not drift.fell_behind(drift=6.6, p50_ms=23)
    assert not drift.fell_behind(drift=19, p50_ms=10)  # under the noise floor
    assert not drift.fell_behind(drift=30, p50_ms=400)  # a steady window's wobble


def test_no_events_no_drift() -> None:
    assert drift.drift_ms([]) == 0.0
    assert drift.drift_ms([0.01]) == 0.0


@given(st.lists(st.floats(min_value=0, max_value=10), min_size=1, max_size=200))
def test_a_constant_shift_does_not_move_the_drift(latencies: list[float]) -> None:
    # The drift compares the window with itself: a fixed extra delay on every event (a
    # slower network, say) is not falling behind.
    shifted = [x + 0.25 for x in latencies]
    assert abs(drift.drift_ms(shifted) - drift.drift_ms(latencies)) < 1e-6


@given(st.lists(st.floats(min_value=0, max_value=10), min_size=2, max_size=200))
def test_reversing_the_window_negates_the_drift(latencies: list[float]) -> None:
    assert abs(drift.drift_ms(latencies[::-1]) + drift.drift_ms(latencies)) < 1e-6


def test_the_notes_name_the_windows_behind_and_only_them() -> None:
    assert drift.behind_notes(500, [1.0, -2.0, 6.6], [13.0, 12.0, 23.0]) == []
    notes = drift.behind_notes(2000, [610.0, 3.0, 402.0], [214.0, 30.0, 250.0])
    assert len(notes) == 1
    assert notes[0].startswith("latency at 2000/s: 2 of 3 windows fell behind")
    assert "610, 402 ms" in notes[0]


def test_a_window_that_began_behind_and_caught_up_is_named_too() -> None:
    # A quick run on a slow machine: at 2,000/s its 5 s windows began behind and caught
    # up (drift -315 and -225 at p50 1,019 and 1,052 ms) or fell behind (370 at 880); at
    # 500/s one of three caught up (-38 at p50 25).
    assert drift.caught_up(-38.0, 25.2)
    assert not drift.caught_up(-10.1, 38.3)
    assert not drift.fell_behind(-315.1, 1018.6)
    notes = drift.behind_notes(2000, [-315.1, 369.9, -224.8], [1018.6, 880.1, 1051.5])
    assert len(notes) == 2
    assert "1 of 3 windows fell behind" in notes[0]
    assert "370 ms" in notes[0]
    assert "2 of 3 windows began behind and caught up" in notes[1]
    assert "315, 225 ms" in notes[1]
