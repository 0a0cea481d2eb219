"""Did a latency window keep up with its rate? Its drift says.

A p99 can be high for two reasons that call for different answers: a tail (most events
resume promptly, a few wait out a stall) or a backlog (the machine cannot do the offered
rate, every event waits for the ones before, and the wait grows for as long as the window
lasts, so the figure measures the window's length as much as matcher). On a machine
running 2.5 times slower than usual a 2,000/s window read p99 500 ms with its p50 rising
from 273 to 883 ms across windows: saturation, not a tail, which the percentiles alone do
not tell apart. The drift does: how much later the last fifth of the window's events (in
the order they were sent) resumed than its first fifth, median against median. It stays
near 0 while the daemon keeps up, whatever the tail, and is the backlog built up through
the window when it does not; it is negative when a window began behind (a backlog built
in its warm-up second, or before) and caught up, and its p99 is then that backlog's.
"""

from __future__ import annotations

import statistics

# A drift below this is noise (a window's first and last fifths differ by a few
# milliseconds when nothing is wrong).
BEHIND_MIN_DRIFT_MS = 20.0


def drift_ms(latencies_s: list[float]) -> float:
    """The median latency of the last fifth of ``latencies_s`` (seconds, in the order the
    events were sent) minus that of the first fifth, in milliseconds; 0 for no events."""
    if not latencies_s:
        return 0.0
    fifth = max(1, len(latencies_s) // 5)
    first = statistics.median(latencies_s[:fifth])
    last = statistics.median(latencies_s[-fifth:])
    return 1000 * (last - first)


def _beyond_noise(drift: float, p50_ms: float) -> bool:
    # Over the noise floor and over a tenth of the p50. Not over the p50 itself: a window
    # that starts behind (its warm-up second already built a backlog) has a high p50 from
    # its first event on, and a steady window has no drift at any p50.
    return abs(drift) > max(BEHIND_MIN_DRIFT_MS, p50_ms / 10)


def fell_behind(drift: float, p50_ms: float) -> bool:
    """Whether a window with this drift and p50 (both ms) fell behind its rate: its last
    events waited clearly longer than its first."""
    return drift > 0 and _beyond_noise(drift, p50_ms)


def caught_up(drift: float, p50_ms: float) -> bool:
    """Whether a window began behind and caught up: its first events waited clearly longer
    than its last (a backlog from before or at its start, which its p99 then measures)."""
    return drift < 0 and _beyond_noise(drift, p50_ms)


# Each way a window can miss its rate: what it did, which fifth of its events waited
# longer than which, and what its p99 then measures.
_WAYS = (
    ("fell behind the rate", "last", "first",
     "the machine did not keep up with the offered rate in them, so their p99 measures a"
     " growing backlog, not a tail"),
    ("began behind and caught up", "first", "last",
     "their p99 measures a backlog from the window's start (after its warm-up second),"
     " not a tail"),
)  # fmt: skip


def behind_notes(rate: int, drifts: list[float], p50s: list[float]) -> list[str]:
    """Lines for the results' notes: the windows at ``rate`` that fell behind, and those
    that began behind and caught up; none when every window kept up."""
    windows = list(zip(drifts, p50s, strict=True))
    behind = [d for d, p in windows if fell_behind(d, p)]
    catching = [-d for d, p in windows if caught_up(d, p)]
    return [
        f"latency at {rate}/s: {len(later)} of {len(drifts)} windows {what} (their {slow}"
        f" fifth of events resumed {', '.join(f'{d:.0f}' for d in later)} ms later than"
        f" their {fast} fifth): {meaning}"
        for later, (what, slow, fast, meaning) in zip((behind, catching), _WAYS, strict=True)
        if later
    ]
