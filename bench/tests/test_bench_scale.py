"""The scale figures compare runs made side by side: each run with waits stored is paired
with an empty run next to it, in alternating order, and the ratio is the median of the
pairs' ratios, so that a machine drifting during the run does not read as a cost of
stored rows."""

from __future__ import annotations

import pytest

from bench import run


def _plan(scale: list[int]) -> run.Plan:
    return run.Plan(
        n=10, naive_n=1, reps=3, rates=[500], latency_s=1, scale=scale, dbos_n=1, rf3=False,
    )  # fmt: skip


def _figures() -> dict[str, float]:
    return {
        "r_matcher": 100.0, "r_pipe": 100.0, "r_kafka": 100.0, "r_pg": 100.0,
        "r_naive": 1.0, "r_dbos": 1.0, "r_matcher_2_daemons": 100.0,
        "r_matcher_3_daemons": 100.0, "r_worker": 50.0, "r_matcher_fan_in": 50.0,
        "rss_peak_bytes": 1.0,
    }  # fmt: skip


@pytest.mark.parametrize("rows", [100_000, 10_000_000])
def test_each_repetition_runs_empty_and_stored_in_alternating_order(rows: int) -> None:
    orders = [run.scale_order(rows, rep) for rep in range(4)]
    assert orders == [(0, rows), (rows, 0), (0, rows), (rows, 0)]


def test_the_scale_ratio_is_the_median_of_the_pairs_not_of_medians() -> None:
    # A machine slowing down through the run: each stored run was as fast as the empty
    # run beside it (ratio 1.0 or more), though its median is lower than the empty runs'.
    empty = [9000.0, 6000.0, 3000.0]
    stored = [9000.0, 6600.0, 2800.0]
    assert run._median(stored) / run._median(empty) > 1.0
    paired = {"scale_100000_over_0": [s / e for s, e in zip(stored, empty, strict=True)]}
    ratios = run._ratios(_plan([0, 100_000]), _figures(), paired)
    assert ratios["scale_100000_over_0"] == pytest.approx(1.0)
    # The other way round: the ratio of medians would say 1.0, the pairs say 0.5.
    stored = [3000.0, 6000.0, 4500.0]
    empty = [6000.0, 4500.0, 9000.0]
    assert run._median(stored) / run._median(empty) == pytest.approx(4500 / 6000)
    paired = {"scale_100000_over_0": [s / e for s, e in zip(stored, empty, strict=True)]}
    ratios = run._ratios(_plan([0, 100_000]), _figures(), paired)
    assert ratios["scale_100000_over_0"] == pytest.approx(0.5)


def test_every_stored_size_has_its_ratio_and_the_biggest_sets_the_target() -> None:
    plan = _plan([0, 100_000, 1_000_000])
    paired = {"scale_100000_over_0": [0.95, 0.9, 1.0], "scale_1000000_over_0": [0.7, 0.75, 0.6]}
    ratios = run._ratios(plan, _figures(), paired)
    assert ratios["scale_100000_over_0"] == pytest.approx(0.95)
    assert ratios["scale_1000000_over_0"] == pytest.approx(0.7)
    targets = run._targets(plan, _figures(), ratios)
    assert targets["r_matcher with 1,000,000 rows >= 0.8 x empty"] is False


def test_a_plan_without_stored_rows_leaves_the_scale_target_unmet() -> None:
    plan = _plan([0])
    ratios = run._ratios(plan, _figures(), {})
    assert not any(k.startswith("scale_") for k in ratios)
    assert run._targets(plan, _figures(), ratios)["r_matcher with 0 rows >= 0.8 x empty"] is False


def test_the_quick_plan_measures_scale_with_more_events_than_its_throughput_runs() -> None:
    assert run.QUICK.scale_events > run.QUICK.n
    assert run.FULL.scale_events == run.FULL.n
