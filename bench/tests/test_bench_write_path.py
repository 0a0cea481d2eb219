"""What Postgres writes and spends per event (bench/write_path.py): a phase's records and
positions over its events, the medians of the repetitions per phase, the issue's targets
on them, and their table in the report."""

from __future__ import annotations

import statistics

import pytest

from bench import write_path
from bench.report import _markdown
from bench.write_path import Reading, Records


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def test_a_phases_writes_and_time_are_divided_by_its_events() -> None:
    before = Reading(wal_lsn=80_000, server_ms=2.0)
    after = Reading(wal_lsn=80_000 + 4000 * 1750, server_ms=2.0 + 4000 * 0.2)
    records = Records(count=4000 * 12, size=4000 * 1700, fpi_size=4000 * 100)
    figures = write_path.per_event(before, after, records, 4000)
    assert figures == pytest.approx(
        {
            "wal_records_per_event": 12.0,
            "wal_bytes_per_event": 1700.0,
            "wal_lsn_bytes_per_event": 1750.0,
            "wal_fpi_bytes_per_event": 100.0,
            "server_us_per_event": 200.0,  # milliseconds in, microseconds per event out
        }
    )


def test_what_could_not_be_read_is_left_out() -> None:
    before = Reading(0, server_ms=None)
    after = Reading(1100, server_ms=5.0)
    figures = write_path.per_event(before, after, None, 10)
    assert figures == {"wal_lsn_bytes_per_event": 110.0}


def test_the_servers_time_is_left_out_when_entries_were_evicted_meanwhile() -> None:
    before = Reading(0, server_ms=1.0, evictions=2)
    evicted = Reading(1100, server_ms=5.0, evictions=3)
    assert "server_us_per_event" not in write_path.per_event(before, evicted, None, 10)
    kept = Reading(1100, server_ms=5.0, evictions=2)
    figures = write_path.per_event(before, kept, None, 10)
    assert figures["server_us_per_event"] == pytest.approx(400.0)


def test_a_phase_without_events_is_refused() -> None:
    reading = Reading(0, None)
    with pytest.raises(ValueError, match="0 events"):
        write_path.per_event(reading, reading, None, 0)


def test_each_phase_is_the_median_of_its_repetitions() -> None:
    runs: dict[str, list[float]] = {"r_matcher": [1.0]}
    for records in (22.0, 24.0, 23.0):
        write_path.record(
            runs, "matcher", {"wal_records_per_event": records, "wal_bytes_per_event": 2700.0}
        )
    write_path.record(runs, "pipe", {"wal_records_per_event": 7.0})
    assert runs["write_path_matcher_wal_records_per_event"] == [22.0, 24.0, 23.0]
    summary = write_path.summary(runs, _median)
    assert summary["matcher"]["wal_records_per_event"] == 23.0
    assert summary["matcher"]["wal_bytes_per_event"] == 2700.0
    assert summary["matcher"]["server_us_per_event"] is None  # not measured
    assert summary["pipe"] == {
        name: (7.0 if name == "wal_records_per_event" else None) for name in write_path.FIGURES
    }


def _measured(records: float | None, size: float | None) -> dict[str, dict[str, float | None]]:
    matcher = dict.fromkeys(write_path.FIGURES, None)
    matcher |= {"wal_records_per_event": records, "wal_bytes_per_event": size}
    return {"matcher": matcher, "pipe": dict.fromkeys(write_path.FIGURES, None)}


def test_the_targets_are_the_issues() -> None:
    met = write_path.targets(_measured(12.0, 1700.0), matcher_over_pipe=0.8)
    assert met == {
        "WAL records per matched event <= 12": True,
        "WAL bytes per matched event <= 1,700": True,
        "r_matcher >= 0.8 x r_pipe": True,
    }
    missed = write_path.targets(_measured(22.9, 2736.0), matcher_over_pipe=0.75)
    assert list(missed.values()) == [False, False, False]


def test_a_target_not_measured_is_unmet() -> None:
    met = write_path.targets(_measured(None, None), matcher_over_pipe=None)
    assert list(met.values()) == [False, False, False]


def test_the_report_shows_both_phases_and_the_targets() -> None:
    runs: dict[str, list[float]] = {}
    for records, us in ((22.0, 210.0), (23.0, 214.0), (24.0, 230.0)):
        write_path.record(
            runs, "matcher", {"wal_records_per_event": records, "server_us_per_event": us}
        )
        write_path.record(runs, "pipe", {"wal_records_per_event": 7.1})
    measured = write_path.summary(runs, _median)
    results = {
        "figures": {
            **dict.fromkeys(("r_kafka", "r_pg", "r_pipe", "r_naive", "r_matcher", "r_dbos"), 1.0),
            "rss_peak_bytes": 2**20,
        },
        "ratios": {},
        "targets": {},
        "runs": runs,
        "write_path": measured,
        "write_path_targets": write_path.targets(measured, 0.75),
    }
    text = _markdown(results)
    assert "| WAL records per event | 23.0 (22.0 to 24.0 over 3 reps) | 7.1 (7.1 to 7.1" in text
    assert "| Postgres' time per event (top-level statements) | 214.0 (" in text
    assert "| of which full-page images | not measured | not measured |" in text
    assert "| WAL records per matched event <= 12 | NO |" in text
