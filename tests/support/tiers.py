"""Test tiers: every test is marked by where it lives, and gets that tier's time limit
unless it names its own (``@pytest.mark.timeout``).

- unit: pure decisions, no services (tests/unit, producers/python/tests);
- integration: against real Kafka and Postgres (tests/integration), some also ``smoke``:
  the short subset `make test-quick` runs;
- cluster: a three-broker cluster and a Postgres standby (tests/cluster);
- browser: the console in Chromium (tests/browser);
- tools: helm and promtool (tests/tools);
- bench: the benchmark's own tests (bench/tests).

`make test` runs every tier; `pytest -m unit`, `pytest -m "not cluster"` and the like run
some. No test may hang: past its tier's limit a test fails and the session goes on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_ROOT = Path(__file__).parents[2]
# Where each tier lives, and how long one of its tests may take by default (seconds).
TIERS: dict[str, tuple[tuple[str, ...], float]] = {
    "unit": (("tests/unit", "producers/python/tests"), 20),
    "integration": (("tests/integration",), 300),
    "cluster": (("tests/cluster",), 900),
    "browser": (("tests/browser",), 300),
    "tools": (("tests/tools",), 1200),
    "bench": (("bench/tests",), 900),
}


def tier_of(path: Path) -> str | None:
    relative = path.resolve().relative_to(_ROOT).as_posix()
    for tier, (places, _) in TIERS.items():
        if any(relative.startswith(place + "/") for place in places):
            return tier
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item.path)
        if tier is None:
            continue
        item.add_marker(getattr(pytest.mark, tier))
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TIERS[tier][1]))
